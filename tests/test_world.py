"""The offline world: tokenizer, the Qwen3-architecture model, save/load round trip, the atomic cache."""

from __future__ import annotations

import threading

import torch
from omegaconf import OmegaConf

from agon import world
from agon.config import ArithmeticTaskConfig
from tests.conftest import TINY, compose_config


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
    stale = tmp_path / f"tiny-{world.world_key(cfg.model, world._arithmetic_cfg(cfg.task))}"
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


def test_a_non_arithmetic_task_reuses_the_default_world():
    """The world is always warm-started on the built-in arithmetic; another task must not key a second one."""
    default = compose_config()
    other = compose_config(["task=reasoning_gym"])
    assert world.world_key(default.model, world._arithmetic_cfg(default.task)) == world.world_key(
        other.model, world._arithmetic_cfg(other.task))
