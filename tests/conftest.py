"""Shared fixtures: the real config tree composed with Hydra's compose API, and tiny offline models.

Nothing here touches the network. Two model sizes, both Qwen3-architecture and built by ``agon.models.world``:
  ``TINY``        a nearly random 32-wide model (3 warm-start steps) for tests of the world's own mechanics;
  ``TEST_WORLD``  the test world every training test uses: warm-started just far enough that about half of its
                  sampled answers are right and every draft carries a recap, so rewards vary within groups,
                  updates move the adapters, and a wrong wiring changes numbers a test can see.
The test world is built once per test session (about 20 s on two free cores) into a session cache. ``bounded``
fails a ``vllm``-marked test that runs past its marker's ``seconds``.
"""

from __future__ import annotations

import os
import signal
import sys
import subprocess
import random
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import DictConfig, OmegaConf

import agon.training.checks
import agon.core.config
from agon.engines import Sampling
from agon.engines.hf import HFEngine
from agon.models.tokens import Completion

CONF = agon.core.config.CONF_DIR

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# torch threads: two (what the tests were measured with), or the cores' share when pytest-xdist runs the suite in
# several workers (make test: two workers on two cores get one thread each, rather than four threads fighting over
# two cores); the processes the tests launch (agon.run, its workers) inherit the share through OMP_NUM_THREADS
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, min(2, (os.cpu_count() or 1) // WORKERS))
os.environ["OMP_NUM_THREADS"] = str(THREADS)
torch.set_num_threads(THREADS)

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
# 3-operand sums of 1-5: a worked solution has one recap step ("2+3=5") and the space is small enough to learn fast.
# 400 supervised steps stop the base at about 55% held-out accuracy sampled at temperature 1 (71% greedy), so rewards
# spread within groups and RL has room: 40 Agon steps took the cascade from 44% to 61% (seed 0) and 46% to 63%
# (seed 1). 300 steps gave 27% sampled but 35% greedy, too little room for RL to show; 150 gave 7%.
# the test world is one of the shipped bases (bases/worlds.yaml): loaded from the repository, never warm-started
TEST_WORLD = list(yaml.safe_load((Path(__file__).parents[1] / "bases" / "worlds.yaml").read_text())["test"])
SMALL_RUN = [
    "trainer.max_steps=2",
    "trainer.prompts_per_step=2",
    "trainer.num_generations=2",
    "trainer.max_new_tokens=32",
    "eval.n_problems=3",
    "eval.samples=2",
    "progress=false",
]

# agon's schema and resolvers in Hydra's store: every test composes as agon's own app does (agon.run registers
# them on import; a test may compose without importing it)
agon.core.config.register_configs()


class RecordingEngine(HFEngine):
    """hf, keeping each call's prompts, the ``Sampling`` it was handed and the completions it gave."""

    def __init__(self, policies):
        super().__init__(policies)
        self.calls: list[tuple[list[str], Sampling, list[Completion]]] = []

    def sample(self, prompts, adapter, sampling, on_sampled=None, prefixes=None) -> list[Completion]:
        out = super().sample(prompts, adapter, sampling, on_sampled, prefixes)
        self.calls.append((list(prompts), sampling, out))
        return out


@pytest.fixture
def wandb_service():
    """For a test that starts W&B in this process: its service process (``wandb-core``) ended after the test, so
    that a later test of the same pytest worker (the sandbox's leftover checks count this process's children)
    finds no child it did not start."""
    yield
    import wandb

    wandb.teardown()


@pytest.fixture(autouse=True)
def seeded():
    """Every test starts from the same RNG state, so what it samples does not depend on which tests ran before it
    (tools/mutation.py runs one file alone). ``AGON_TEST_SEED`` picks another state, to look for fragile tests."""
    seed = int(os.environ.get("AGON_TEST_SEED", "0"))
    torch.manual_seed(seed)
    random.seed(seed)
    return seed


def base_state(policies) -> dict:
    """A copy of every base (non-LoRA) weight, to check that training never touches them."""
    return {n: p.detach().clone() for n, p in policies.model.named_parameters() if "lora_" not in n}


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    return agon.training.checks.compose_config(overrides or [])


def run_agon(args: list[str], cache: Path, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """``python -m agon.run <args>`` as a user types it, in ``cwd`` (default the repository) with the model cache
    ``cache`` and W&B offline unless ``env`` says otherwise; its output captured, bounded at 10 minutes."""
    root = Path(__file__).parents[1]
    return subprocess.run([sys.executable, "-m", "agon.run", *args], cwd=cwd or root, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(root), "AGON_CACHE": str(cache),
                                            "WANDB_MODE": "offline", **env})


@pytest.fixture(scope="session")
def agon_cache(tmp_path_factory) -> Path:
    """A model cache for this session; ``$AGON_TEST_CACHE`` names one to keep across sessions (tools/mutation.py
    runs the tests once per mutant and builds the test world once). Safe to share: a world's directory is keyed by
    a hash of everything that shapes it."""
    kept = os.environ.get("AGON_TEST_CACHE")
    path = Path(kept) if kept else tmp_path_factory.mktemp("agon-cache")
    path.mkdir(parents=True, exist_ok=True)
    os.environ["AGON_CACHE"] = str(path)
    return path


@pytest.fixture
def small_cfg(agon_cache, tmp_path) -> DictConfig:
    """The default composed config on the test world, shrunk to seconds, writing into tmp_path."""
    cfg = compose_config(TEST_WORLD + SMALL_RUN + ["logger=none"])
    OmegaConf.update(cfg, "output_dir", str(tmp_path / "run"), force_add=True)
    return cfg


@pytest.fixture
def step_cfg(small_cfg):
    """Eight problems x four generations: enough rows that each role's rewards spread within some group (some
    problems are always right or always wrong, so four problems sometimes gave one role no spread at all)."""
    t = small_cfg.trainer
    t.prompts_per_step, t.num_generations, t.max_new_tokens, t.learning_rate = 8, 4, 32, 3e-3
    return small_cfg


@pytest.fixture(scope="session")
def tiny_base(agon_cache):
    """(cfg, (model, tokenizer)) of the test world, loaded through from_pretrained."""
    from agon.models.loading import load_base

    cfg = compose_config(TEST_WORLD)
    return cfg, load_base(cfg.model, cfg.task, log=lambda *_: None)


@pytest.fixture
def policies(tiny_base):
    """Fresh two-adapter Policies over a fresh copy of the tiny base (tests may train it)."""
    import copy

    from agon.models.policies import Policies

    cfg, (model, tokenizer) = tiny_base
    return Policies(copy.deepcopy(model), tokenizer, ["A", "B"], cfg.model.lora)


@pytest.fixture
def bounded(request):
    """Fail a ``vllm``-marked test that runs longer than its marker's ``seconds`` (default 240): a vLLM call can
    hang where a worker wedges."""
    seconds = request.node.get_closest_marker("vllm").kwargs.get("seconds", 240)

    def expire(*_):
        raise TimeoutError(f"{request.node.name} ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
