"""The offline world: tokenizer, the Qwen3-architecture model, save/load round trip, the atomic cache."""

from __future__ import annotations

import copy
import random
import threading

import pytest
import torch
from omegaconf import OmegaConf

from agon import bases
from agon.models import world
from agon.training.checks import validate
from agon.core.config import ArithmeticTaskConfig, ConfigError
from agon.tasks import build_task
from tests.conftest import TEST_WORLD, TINY, compose_config


def test_tokenizer_round_trips_text_and_keeps_specials_whole():
    tok = world.build_tokenizer()
    text = "<think>93+1=94;94-38=56</think>93+1=94\\boxed{56}"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces[0] == "<think>" and "</think>" in pieces and "\\boxed{" in pieces
    assert tok.apply_chat_template([{"role": "user", "content": "1+2"}], tokenize=False,
                                   add_generation_prompt=True) == "<|im_start|>u1+2<|im_end|><|im_start|>a"


def test_model_round_trips_through_save_and_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = compose_config(TINY)
    tok = world.build_tokenizer()
    model = world.build_model(cfg.model.tiny, len(tok), seed=0).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    assert type(loaded).__name__ == "Qwen3ForCausalLM"
    ids = tok2("<|im_start|>u12+7<|im_end|><|im_start|>a", return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        torch.testing.assert_close(model(**ids).logits, loaded(**ids).logits, rtol=0, atol=0)
    assert tok2.chat_template == tok.chat_template


def test_world_is_built_once_and_concurrent_callers_share_it(tmp_path, monkeypatch):
    monkeypatch.setenv("AGON_CACHE", str(tmp_path))
    cfg = compose_config(TINY)
    builds = []
    real = world.warm_start

    def counting(*args, **kwargs):
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(world, "warm_start", counting)
    results = []
    threads = [threading.Thread(target=lambda: results.append(world.ensure_world(cfg.model, cfg.task,
                                                                                  log=lambda *_: None)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(set(results)) == 1
    final = results[0]
    assert (final / "world.json").exists() and (final / "config.json").exists()
    # nothing half-written is left beside it
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_partial_directory_without_the_marker_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("AGON_CACHE", str(tmp_path))
    cfg = compose_config(TINY)
    stale = tmp_path / f"tiny-{world.world_key(cfg.model, world.world_task_cfg(cfg.task))}"
    stale.mkdir()
    (stale / "config.json").write_text("{half")  # as a killed build might leave it
    leftover = tmp_path / f".{stale.name}.killed"  # a killed build's temporary directory
    leftover.mkdir()
    final = world.ensure_world(cfg.model, cfg.task, log=lambda *_: None)
    assert final == stale and (final / "world.json").exists()
    assert not leftover.exists()


def test_the_key_changes_with_what_shapes_the_model():
    cfg = compose_config(TINY)
    task = OmegaConf.structured(ArithmeticTaskConfig)
    key = world.world_key(cfg.model, task)
    assert key == world.world_key(cfg.model, task)
    assert key != world.world_key(compose_config(TINY + ["model.tiny.warmup_steps=4"]).model, task)
    task2 = OmegaConf.structured(ArithmeticTaskConfig(max_operand=50))
    assert key != world.world_key(cfg.model, task2)
    # the warm start draws from the training split, so its size shapes the model too
    assert key != world.world_key(cfg.model, OmegaConf.structured(ArithmeticTaskConfig(train_size=400)))


def test_which_task_a_world_is_warm_started_on():
    """Arithmetic runs, their hard split, and tasks without an own world share the default world; a reasoning-gym
    dataset with warm_start=own keys a world of its own, one per dataset."""
    def key(*overrides):
        cfg = compose_config(list(overrides))
        return world.world_key(cfg.model, world.world_task_cfg(cfg.task))

    default = key()
    assert key("task.min_terms=6", "task.max_terms=7", "task.warm_start_min_terms=3",
               "task.warm_start_max_terms=5") == default
    assert key("task.min_terms=6", "task.max_terms=7") != default
    assert key("task=reasoning_gym", "task.warm_start=arithmetic") == default
    assert key("task=codecontests") == default
    own = key("task=reasoning_gym", "task.name=products")
    assert own != default and own != key("task=reasoning_gym", "task.name=chain_sum")
    assert own != key("task=reasoning_gym", "task.name=products", "+task.dataset_args.max_digits=3")


def test_a_bad_warm_start_fails_in_the_config_naming_the_key():
    with pytest.raises(ConfigError, match="task.warm_start"):
        validate(compose_config(["task=reasoning_gym", "task.warm_start=mine"]))
    with pytest.raises(ConfigError, match="task.warm_start_min_terms=6"):
        validate(compose_config(["task.warm_start_min_terms=6", "task.warm_start_max_terms=4"]))
    with pytest.raises(ConfigError, match="task.min_terms=1"):
        validate(compose_config(["task.min_terms=1"]))
    validate(compose_config(["experiment=hard_split"]))


def test_a_reasoning_gym_world_warm_starts_on_the_datasets_own_worked_solutions():
    """Stepwise text for products (correct, and wrong in one step when corrupted); every other dataset gets its
    bare answer, so its recap is empty; characters the tokenizer lacks are refused, named."""
    cfg = compose_config(["task=reasoning_gym", "task.name=products", "task.train_size=50", "task.heldout_size=5"])
    task = build_task(cfg.task)
    problem = task.train_problems()[0]
    text = task.worked_solution(problem)
    assert task.verify([problem], [text])[0].correct
    assert task.recap(text) and "\\boxed" not in task.recap(text)
    rng = random.Random(0)
    wrong = [task.worked_solution(problem, rng) for _ in range(20)]
    assert not any(task.verify([problem] * 20, wrong)[i].correct for i in range(20))
    tokenizer = world.build_tokenizer()
    texts = world._warm_start_texts(task, task.train_problems(), 40, random.Random(1), tokenizer)
    assert all(c.endswith(tokenizer.eos_token) and task.verify([problem], [c])[0].format_ok for _, c in texts)

    other = build_task(compose_config(["task=reasoning_gym", "task.name=spell_backward", "task.train_size=20",
                                       "task.heldout_size=2"]).task)
    p = other.train_problems()[0]
    assert other.verify([p], [other.worked_solution(p)])[0].correct and other.recap(other.worked_solution(p)) == ""

    factor = build_task(compose_config(["task=reasoning_gym", "task.name=prime_factorization", "task.train_size=20",
                                        "task.heldout_size=2"]).task)
    with pytest.raises(ValueError, match="printable ASCII"):
        world._check_characters(factor, factor.train_problems(), tokenizer)


@pytest.mark.long
def test_a_reasoning_gym_dataset_gets_a_world_that_solves_some_of_it(agon_cache, tiny_base):
    """task=reasoning_gym on the offline model warm-starts on the dataset's own items: its base drafts some of the
    held-out items right, well above the arithmetic world's base, which never saw this prompt text."""
    from agon.engines import Sampling
    from agon.models.loading import load_base
    from agon.models.policies import build_policies
    from agon.game.rollout import play

    cfg = compose_config(TEST_WORLD[:9] + ["task=reasoning_gym", "task.name=chain_sum", "task.heldout_size=40",
                                           "task.train_size=2000", "+task.dataset_args.min_terms=2",
                                           "+task.dataset_args.max_terms=3", "+task.dataset_args.min_digits=1",
                                           "+task.dataset_args.max_digits=1"])
    validate(cfg)
    key = world.world_key(cfg.model, world.world_task_cfg(cfg.task))
    assert key != world.world_key(cfg.model, world.world_task_cfg(compose_config(TEST_WORLD).task))
    task = build_task(cfg.task)

    def drafts(model, tokenizer):
        game = play(build_policies(cfg, model, tokenizer), task, cfg.model, task.heldout_problems(), drafter=None,
                    challenger=False, exchange="visible", group_size=2, sampling=Sampling(48, 1.0))
        return [r.draft.verdict for r in game.rounds]

    own = drafts(*load_base(cfg.model, cfg.task, log=lambda *_: None))
    assert (agon_cache / f"tiny-{key}" / "world.json").exists()
    model, tokenizer = tiny_base[1]
    arithmetic = drafts(copy.deepcopy(model), tokenizer)  # a copy: the session's base stays free of adapters
    accuracy = {name: sum(v.correct for v in got) / len(got) for name, got in (("own", own), ("arith", arithmetic))}
    # measured: 17.5% against 0% (80 drafts each)
    assert accuracy["own"] > 0.1 and accuracy["own"] > accuracy["arith"] + 0.1, accuracy
    assert sum(v.format_ok for v in own) / len(own) > 0.8


# ---------------------------------------------------------------------------------------------------------------
# the shipped bases (bases/): the same weights on every CPU


def _listed() -> dict[str, list[str]]:
    import yaml

    return yaml.safe_load((world.BASES / "worlds.yaml").read_text())


def test_every_listed_world_is_shipped_and_matches_its_hashes():
    """A change to what shapes a listed world (its config, WORLD_VERSION, the task's keys) changes its key: the
    shipped directory is then missing for it and this fails until `make bases` rebuilds it."""
    import json

    manifest = json.loads((world.BASES / world.MANIFEST).read_text())
    shipped = sorted(p.name for p in world.BASES.iterdir() if p.is_dir())
    keys = {}
    for name, overrides in _listed().items():
        cfg = compose_config(list(overrides))
        keys[name] = f"tiny-{world.world_key(cfg.model, world.world_task_cfg(cfg.task))}"
        assert keys[name] in shipped, f"the shipped base of {name!r} ({keys[name]}) is missing: run make bases"
        assert world.shipped_base(keys[name]) == world.BASES / keys[name]
    assert sorted(manifest) == shipped == sorted(keys.values())
    for name in shipped:
        files = set(manifest[name])
        assert {"model.safetensors", "config.json", "world.json", "tokenizer.json"} <= files, files
        assert (world.BASES / name / "model.safetensors").stat().st_size < 16 << 20


def test_a_shipped_base_loads_without_a_warm_start(monkeypatch, tmp_path):
    monkeypatch.setenv("AGON_CACHE", str(tmp_path))

    def no_warm_start(*args, **kwargs):
        raise AssertionError("the shipped base was warm-started again")

    monkeypatch.setattr(world, "warm_start", no_warm_start)
    cfg = compose_config(TEST_WORLD)
    path = world.ensure_world(cfg.model, cfg.task, log=lambda *_: None)
    assert path.parent == world.BASES and list(tmp_path.iterdir()) == []
    # with the shipped bases turned off, the same world is built into the cache instead
    monkeypatch.setenv(world.SHIPPED_ENV, "0")
    monkeypatch.setattr(world, "warm_start", lambda *a, **k: {})
    assert world.ensure_world(cfg.model, cfg.task, log=lambda *_: None).parent == tmp_path


@pytest.mark.parametrize("tamper", ["flip a byte of the weights", "add a file", "drop the manifest entry"])
def test_a_shipped_base_that_differs_from_its_hash_stops_the_run_naming_the_file(tmp_path, tamper):
    import json
    import shutil

    cfg = compose_config(TEST_WORLD)
    name = f"tiny-{world.world_key(cfg.model, world.world_task_cfg(cfg.task))}"
    shutil.copytree(world.BASES / name, tmp_path / name)
    manifest = json.loads((world.BASES / world.MANIFEST).read_text())
    (tmp_path / world.MANIFEST).write_text(json.dumps({name: manifest[name]}))
    assert world.shipped_base(name, bases=tmp_path) == tmp_path / name
    weights = tmp_path / name / "model.safetensors"
    if tamper == "flip a byte of the weights":
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1
        weights.write_bytes(bytes(data))
        match = "model.safetensors differ"
    elif tamper == "add a file":
        (tmp_path / name / "extra.bin").write_bytes(b"x")
        match = "extra.bin differ"
    else:
        (tmp_path / world.MANIFEST).write_text("{}")
        match = "differ"
    with pytest.raises(world.ShippedBaseMismatch, match=match) as err:
        world.shipped_base(name, bases=tmp_path)
    assert "make bases" in str(err.value) and "git checkout" in str(err.value)


def test_make_bases_ships_the_listed_worlds_and_drops_the_unlisted(tmp_path, monkeypatch):
    import json

    import yaml

    monkeypatch.setattr(world, "BASES", tmp_path)
    (tmp_path / "worlds.yaml").write_text(yaml.safe_dump({"small": TINY, "other": TINY + ["task.max_operand=6"]}))
    keys = bases.ship(log=lambda *_: None)
    manifest = json.loads((tmp_path / world.MANIFEST).read_text())
    assert sorted(manifest) == sorted(keys.values()) and len(set(keys.values())) == 2
    cfg = compose_config(TINY)
    with monkeypatch.context() as patch:
        patch.setattr(world, "warm_start", lambda *a, **k: pytest.fail("shipped, yet warm-started"))
        assert world.ensure_world(cfg.model, cfg.task, log=lambda *_: None) == tmp_path / keys["small"]
    (tmp_path / "worlds.yaml").write_text(yaml.safe_dump({"small": TINY}))
    assert bases.ship([], log=lambda *_: None) == {"small": keys["small"]}  # nothing named: all listed, rebuilt
    assert sorted(json.loads((tmp_path / world.MANIFEST).read_text())) == [keys["small"]]
    assert not (tmp_path / keys["other"]).exists()
    with pytest.raises(ValueError, match="no world named"):
        bases.ship(["nope"], log=lambda *_: None)
