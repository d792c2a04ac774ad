"""The composed config: every group option composes and validates; mistakes fail before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from agon.config import ConfigError, validate
from tests.conftest import CONF, compose_config

GROUPS = ["model", "task", "method", "reward", "exchange", "rotation", "init", "trainer", "eval", "logger", "debug",
          "experiment"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes_and_validates(group, option):
    cfg = compose_config([f"{group}={option}"])
    validate(cfg)


def test_defaults_are_agon_competitive_visible_alternate_divergent():
    cfg = compose_config()
    assert (cfg.method.name, cfg.reward.name, cfg.exchange.mode, cfg.rotation.mode, cfg.init.mode) == (
        "agon", "competitive", "visible", "alternate", "divergent")
    assert cfg.model.name == "tiny" and cfg.task.kind == "arithmetic"


def test_sampling_settings_follow_the_model():
    cfg = compose_config(["model=qwen3_0.6b"])
    assert (cfg.trainer.temperature, cfg.eval.temperature, cfg.trainer.top_k) == (0.6, 0.6, 20)


def test_unknown_key_names_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["trainer.lerning_rate=1e-3"])
    assert "lerning_rate" in str(err.value.__cause__ or err.value)


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["trainer.max_steps=many"])
    cause = err.value.__cause__
    assert isinstance(cause, (ValidationError, ConfigKeyError)) and "trainer.max_steps" in str(cause)


@pytest.mark.parametrize("overrides,key", [
    (["trainer.num_generations=1"], "trainer.num_generations"),
    (["trainer.micro_batch_size=5"], "trainer.micro_batch_size"),
    (["trainer.loss_type=ppo"], "trainer.loss_type"),
    (["trainer.scale_rewards=sometimes"], "trainer.scale_rewards"),
    (["reward.name=adversarial"], "reward.name"),
    (["exchange.mode=shouted"], "exchange.mode"),
    (["trainer.temperature=0"], "trainer.temperature"),
    (["eval.samples=0"], "eval.samples"),
    (["task.challenge_template=no recap here"], "task.challenge_template"),
])
def test_cross_field_mistakes_name_the_full_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose_config(overrides))


def test_bad_config_fails_before_any_model_loads(tmp_path, monkeypatch):
    """run() rejects the config before it touches the model cache (a load would build the world there)."""
    from agon.run import run

    monkeypatch.setenv("AGON_CACHE", str(tmp_path / "cache"))
    cfg = compose_config(["trainer.num_generations=1", f"+output_dir_unused=1"]) if False else compose_config(
        ["trainer.num_generations=1", "logger=none"])
    cfg.output_dir = str(tmp_path / "run")
    with pytest.raises(ConfigError, match="trainer.num_generations"):
        run(cfg)
    assert not (tmp_path / "cache").exists()
    assert not Path(cfg.output_dir).exists()


def test_sweep_file_composes_the_grid():
    from omegaconf import OmegaConf

    sweep = OmegaConf.load(CONF.parent / "sweeps" / "grid_2x2.yaml")
    params = sweep.hydra.sweeper.params
    assert set(params.reward.split(",")) == {"competitive", "cooperative"}
    assert set(params.exchange.split(",")) == {"visible", "hidden"}
