"""Shared fixtures: the real config tree composed with Hydra's compose API, and tiny offline models.

Nothing here touches the network. Models are Qwen3-architecture and randomly initialised (or warm-started for a
handful of steps), small enough that a whole training step runs in a second or two on a CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

import agon.config  # noqa: F401  (registers the schemas in ConfigStore)

CONF = Path(__file__).resolve().parents[1] / "conf"

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
torch.set_num_threads(2)

# a shape that trains in milliseconds; every fast test uses it
TINY = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=2",
    "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64",
    "model.tiny.warmup_steps=3",
    "model.tiny.warmup_batch_size=4",
    "model.lora.rank=4",
    "model.lora.alpha=8",
]
SMALL_RUN = [
    "trainer.max_steps=2",
    "trainer.prompts_per_step=2",
    "trainer.num_generations=2",
    "trainer.max_new_tokens=12",
    "eval.n_problems=3",
    "eval.samples=2",
    "progress=false",
]


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides or []))


@pytest.fixture(scope="session")
def agon_cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("agon-cache")
    os.environ["AGON_CACHE"] = str(path)
    return path


@pytest.fixture
def small_cfg(agon_cache, tmp_path) -> DictConfig:
    """The default composed config, shrunk to seconds, writing into tmp_path."""
    cfg = compose_config(TINY + SMALL_RUN + ["logger=none"])
    OmegaConf.update(cfg, "output_dir", str(tmp_path / "run"), force_add=True)
    return cfg


@pytest.fixture(scope="session")
def tiny_base(agon_cache):
    """(model, tokenizer) of a tiny warm-started world, loaded through from_pretrained."""
    from agon.policies import load_base

    cfg = compose_config(TINY)
    return cfg, load_base(cfg.model, cfg.task, log=lambda *_: None)


@pytest.fixture
def policies(tiny_base):
    """Fresh two-adapter Policies over a fresh copy of the tiny base (tests may train it)."""
    import copy

    from agon.policies import Policies

    cfg, (model, tokenizer) = tiny_base
    return Policies(copy.deepcopy(model), tokenizer, ["A", "B"], cfg.model.lora)
