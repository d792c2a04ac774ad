"""Training across processes, as users launch it (``accelerate launch``, gloo on the CPU), on the test world.

- One update of a fixed batch (completions and rewards played once, here), split across two processes, gives the
  gradients and adapters of the one-process update of the whole batch, for every loss type, with the gradient clip
  active (so a clip before the sum over ranks, or a rank-local normaliser, shows).
- Three Agon steps across two processes end with bitwise-identical adapters on both ranks; rank 0 alone writes
  every file, evaluation covers every held-out problem once, and the run resumes from its checkpoint.

The single-process ``Ranks`` (every collective the identity, no process group) is what every other test runs. The
process group itself (its backend on GPUs, its timeout) is tests/test_distributed_backend.py's.
"""

from __future__ import annotations

import copy
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agon.core.distributed import Ranks
from agon.models.policies import build_policies
from agon.records.recorder import Recorder
from agon.core.rewards import compute_rewards
from agon.game.rollout import play
from agon.records.run_files import read_json, read_jsonl
from agon.tasks import build_task
from agon.training.trainer import Trainer
from tests.conftest import SMALL_RUN, TEST_WORLD, compose_config

ROOT = Path(__file__).resolve().parents[1]
LOSS_TYPES = ["grpo", "dr_grpo", "dapo"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """``accelerate launch`` of two CPU processes running ``python -m <args>`` in ``cwd``, as ``make run-ddp``
    does."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), "-m", *args]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


def test_a_single_process_needs_no_launcher(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ranks = Ranks.from_env("auto", timeout_s=60)
    assert ranks == Ranks() and not torch.distributed.is_initialized()  # no process group, no timeout to set
    assert (ranks.rank, ranks.world, ranks.is_main) == (0, 1, True)
    assert ranks.split([1, 2, 3]) == [1, 2, 3] and ranks.gather("x") == ["x"] and ranks.share(5) == 5
    t = torch.ones(3)
    ranks.sum_([t])
    assert torch.equal(t, torch.ones(3))


def test_shares_are_contiguous_and_cover_everything():
    items = list(range(7))
    shares = [Ranks(rank, 3).split(items) for rank in range(3)]
    assert [len(s) for s in shares] == [2, 2, 3] and sum(shares, []) == items


@pytest.fixture
def update_cfg(small_cfg):
    t = small_cfg.trainer
    t.prompts_per_step, t.num_generations, t.max_new_tokens, t.learning_rate = 4, 4, 32, 1e-3
    # far below the raw gradient norm: every update is clipped, after the sum over ranks or wrongly before it
    t.max_grad_norm = 0.005
    return small_cfg


def test_an_update_across_two_processes_equals_the_one_process_update(update_cfg, tiny_base, tmp_path):
    cfg = update_cfg
    _, (model, tokenizer) = tiny_base
    policies = build_policies(cfg, copy.deepcopy(model), tokenizer)
    policies.save_adapters(tmp_path / "start")
    task = build_task(cfg.task)
    trainer = Trainer(cfg, policies, task, Recorder(tmp_path / "run", enabled=False), tmp_path / "run",
                      log=lambda *_: None)
    game = play(policies, task, cfg.model, trainer.next_problems(), drafter="A", challenger="B",
                exchange="visible", group_size=cfg.trainer.num_generations, sampling=trainer.sampling)
    rewards = compute_rewards(game.outcome(), cfg.reward)
    rewards = {"drafter": rewards.drafter, "challenger": rewards.challenger}
    assert all(r.total.std() > 0 for r in rewards.values()), "no reward spread: the update would do nothing"
    lengths = {a.completion.n_tokens for a in game.attempts("drafter")}
    assert len(lengths) > 1, "equal lengths would hide a per-rank token normaliser"
    (tmp_path / "inputs.pkl").write_bytes(pickle.dumps((cfg, game, rewards, LOSS_TYPES)))

    launch(["tests.distributed_update", str(tmp_path)], cwd=tmp_path)

    for loss_type in LOSS_TYPES:
        policies.load_adapters(tmp_path / "start")
        before = {a: policies.lora_state(a) for a in policies.adapters}
        cfg.trainer.loss_type = loss_type
        one = Trainer(cfg, policies, task, Recorder(tmp_path / "run", enabled=False), tmp_path / "run",
                      log=lambda *_: None)
        stats = one.update(game, rewards)
        two = torch.load(tmp_path / f"{loss_type}.pt")
        for adapter in policies.adapters:
            assert stats[f"adapter/{adapter}/grad_norm"] > 2 * cfg.trainer.max_grad_norm  # the clip was active
            after = policies.lora_state(adapter)
            moved = max(float((after[n] - before[adapter][n]).abs().max()) for n in after)
            assert moved > 10 * 1e-5, "the update moved nothing: equality below would prove nothing"
            for name, value in after.items():
                torch.testing.assert_close(two["state"][adapter][name], value, rtol=0, atol=1e-5,
                                           msg=f"{loss_type}: {name}")
        for key in ("role/drafter/loss", "role/challenger/loss", "role/challenger/clip_ratio/low"):
            assert two["stats"][key] == pytest.approx(stats[key], rel=1e-4, abs=1e-7), (loss_type, key)
        for adapter in policies.adapters:
            key = f"adapter/{adapter}/grad_norm"
            assert two["stats"][key] == pytest.approx(stats[key], rel=1e-4), (loss_type, key)


@pytest.mark.long
def test_three_agon_steps_across_two_processes(agon_cache, tmp_path):
    run_dir = tmp_path / "run"
    overrides = TEST_WORLD + SMALL_RUN + [
        "trainer.max_steps=3", "trainer.prompts_per_step=4", "trainer.checkpoint_every=1", "eval.n_problems=5",
        "logger=none", f"output_dir={run_dir}"]
    launch(["agon.run", *overrides], cwd=tmp_path)

    summary = read_json(run_dir / "summary.json")
    assert summary["train/processes"] == 2 and summary["train/steps"] == 3
    first, second = summary["train/adapter_sha256"]
    assert first == second  # bitwise-identical adapters on both ranks
    # ... and they are the adapters rank 0 saved
    cfg = compose_config(overrides)
    from agon.models.loading import load_base

    policies = build_policies(cfg, *load_base(cfg.model, cfg.task, log=lambda *_: None))
    policies.load_adapters(run_dir / "adapters")
    assert policies.digest() == first
    # rank 0 alone wrote: every step once; evaluation split across the ranks and gathered, every problem once
    steps = [r["train/step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "role/drafter/accuracy" in r]
    assert steps == [1, 2, 3]
    final = [r for r in read_jsonl(run_dir / "eval.jsonl") if r["phase"] == "final" and r["stage"] == "final"]
    heldout = [p.id for p in list(build_task(cfg.task).heldout_problems())[:5]]
    for order in ("A>B", "B>A"):
        rows = [r for r in final if r["order"] == order]
        assert [r["problem_id"] for r in rows] == [p for p in heldout for _ in range(cfg.eval.samples)]
    # Hydra's own directory (its log) is one for both ranks: they share rank 0's launch time
    assert len(list(tmp_path.glob("outputs/*/*"))) == 1, list(tmp_path.glob("outputs/*/*"))

    # resumed on two processes from the last checkpoint: one more step, none repeated
    launch(["agon.run", *overrides, "trainer.max_steps=4", "trainer.resume=true", "eval.at_start=false"],
           cwd=tmp_path)
    summary = read_json(run_dir / "summary.json")
    assert summary["train/steps"] == 4 and len(set(summary["train/adapter_sha256"])) == 1
    steps = [r["train/step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "role/drafter/accuracy" in r]
    assert steps == [1, 2, 3, 4]
