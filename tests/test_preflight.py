"""Checks before any weights load: the hub is probed once, offline runs fail in seconds naming what is missing, and
a prompt plus the completion budget must fit the model's context."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from agon.config import ConfigError
from agon.policies import ModelLoadError
from agon.preflight import check_context, hub_ids, hub_reachable
from tests.conftest import compose_config


def test_an_unreachable_hub_is_detected_without_waiting(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    assert hub_reachable(timeout_s=2.0) is False


def test_only_names_that_are_not_local_come_from_the_hub(tmp_path):
    assert hub_ids(compose_config()) == {}
    assert hub_ids(compose_config(["experiment=paper_deepmath"])) == \
        {"model": "Qwen/Qwen3-0.6B", "dataset": "zwhe99/DeepMath-103K"}
    local = compose_config(["experiment=paper_deepmath", f"model.path={tmp_path}", f"task.source={tmp_path}"])
    assert hub_ids(local) == {}


def test_the_paper_preset_without_hub_or_local_copy_fails_naming_the_model_and_the_override(tmp_path):
    from agon.run import run

    cfg = compose_config(["experiment=paper_deepmath", "logger=none", f"+output_dir={tmp_path}"]) \
        if "output_dir" not in compose_config() else compose_config(
            ["experiment=paper_deepmath", "logger=none", f"output_dir={tmp_path}"])
    with pytest.raises(ModelLoadError, match=r"Qwen/Qwen3-0\.6B.*model\.path=DIR"):
        run(cfg)


def test_a_model_path_that_does_not_exist_is_named(tmp_path):
    from agon.run import run

    cfg = compose_config(["model=qwen3_0.6b", f"model.path={tmp_path / 'nowhere'}", "logger=none",
                          f"output_dir={tmp_path}"])
    with pytest.raises(ModelLoadError, match="model.path="):
        run(cfg)


def test_a_prompt_and_budget_longer_than_the_context_fail_before_the_model_is_built(tmp_path, monkeypatch):
    """Naming both lengths and the keys; the offline world is not even built (its cache stays empty)."""
    from agon.run import run

    monkeypatch.setenv("AGON_CACHE", str(tmp_path / "cache"))
    cfg = compose_config(["logger=none", f"output_dir={tmp_path / 'run'}", "trainer.max_new_tokens=250"])
    with pytest.raises(ConfigError) as err:
        run(cfg)
    message = str(err.value)
    assert "trainer.max_new_tokens=250" in message and "context of 256" in message
    assert "model.tiny.max_position" in message
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_the_check_measures_the_longest_rendered_prompt_of_either_role():
    from agon.tasks import build_task
    from agon.world import build_tokenizer

    cfg = compose_config(["task.heldout_size=20", "task.train_size=200", "eval.n_problems=20"])
    task, tok = build_task(cfg.task), build_tokenizer()
    longest = check_context(cfg, task, tok, context=256)
    problems = list(task.heldout_problems()) + list(task.train_problems())
    challenge = max(len(tok(tok.apply_chat_template([{"role": "user", "content": task.challenge_message(p, "")}],
                                                    tokenize=False, add_generation_prompt=True))["input_ids"])
                    for p in problems)
    assert longest == challenge  # the challenger's prompt is the longer one, and it is the one measured
    with pytest.raises(ConfigError, match="eval.max_new_tokens=250"):
        OmegaConf.update(cfg, "eval.max_new_tokens", 250)
        check_context(cfg, task, tok, context=256)
    hidden = compose_config(["exchange=hidden", "task.heldout_size=20", "task.train_size=200"])
    assert check_context(hidden, build_task(hidden.task), tok, context=256) < longest


def test_an_unreachable_hub_is_probed_once_then_the_run_goes_offline_and_names_the_missing_model(
        tmp_path, monkeypatch, capsys):
    """The path a researcher without network takes: not offline by setting, the probe fails, the process goes
    offline, and a model absent from the (empty) cache is one error naming it."""
    import huggingface_hub.constants

    from agon.preflight import check_sources

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "")  # restored after the test, as is the constant below
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ModelLoadError, match=r"'Qwen/Qwen3-0\.6B' is not in the local cache.*model\.path=DIR"):
        check_sources(compose_config(["experiment=paper_deepmath"]))
    assert "the hub is not reachable" in capsys.readouterr().out
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True  # later loads read the cache without retrying


def test_a_context_error_suggests_only_keys_the_task_has():
    from agon.tasks import build_task
    from agon.world import build_tokenizer

    cfg = compose_config(["task.heldout_size=20", "task.train_size=200", "trainer.max_new_tokens=250"])
    with pytest.raises(ConfigError) as err:
        check_context(cfg, build_task(cfg.task), build_tokenizer(), context=256)
    assert "task.instruction" in str(err.value) and "task.dataset_args" not in str(err.value)
