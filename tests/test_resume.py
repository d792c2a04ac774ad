"""Runs that resume by themselves (``trainer.resume=auto``): killed with SIGKILL and started again with the same
command, interrupted sweeps launched again, and sweeps through submitit's local executor.

Every run is a real ``python -m agon.run`` process on the test world, killed with SIGKILL (not an exception).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from agon import run_files
from agon.config import ConfigError
from agon.run import finished_summary, run
from tests.conftest import SMALL_RUN, TEST_WORLD, compose_config

ROOT = Path(__file__).parents[1]
FAST = TEST_WORLD + ["logger=none", "progress=false", "trainer.prompts_per_step=2", "trainer.num_generations=2",
                     "trainer.max_new_tokens=24", "eval.n_problems=2", "eval.samples=2", "eval.at_start=false"]


def agon(args: list[str], cache: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agon.run", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "AGON_CACHE": str(cache), "WANDB_MODE": "disabled", **(env or {})})


def finish(proc: subprocess.Popen, timeout: int = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def kill_when(proc: subprocess.Popen, ready, timeout: float = 180) -> None:
    """SIGKILL the run's whole process group as soon as ``ready()`` holds."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()[0][-2000:]}"
        assert time.monotonic() < deadline, "the run never reached the point where it is killed"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def steps(run_dir: Path) -> list[int]:
    return [r["train/step"] for r in run_files.read_jsonl(run_dir / run_files.METRICS) if "role/drafter/loss" in r]


def adapter_bytes(run_dir: Path) -> dict[str, bytes]:
    return {p.parent.name: p.read_bytes() for p in sorted((run_dir / run_files.ADAPTERS).glob("*/*.safetensors"))}


@pytest.fixture(scope="module")
def straight(agon_cache, tmp_path_factory) -> Path:
    """An uninterrupted run of 6 steps: what every interrupted one must end as, bit for bit."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    finish(agon(FAST + ["trainer.max_steps=6", "trainer.checkpoint_every=1", f"output_dir={run_dir}"], agon_cache))
    return run_dir


def test_sigkill_mid_training_then_the_same_command_finishes_as_an_uninterrupted_run(straight, agon_cache, tmp_path):
    run_dir = tmp_path / "run"
    command = FAST + ["trainer.max_steps=6", "trainer.checkpoint_every=1", f"output_dir={run_dir}"]
    latest = run_dir / "checkpoints" / "latest"
    kill_when(agon(command, agon_cache), lambda: latest.exists() and latest.read_text() == "step_3")
    assert not (run_dir / run_files.SUMMARY).exists()
    out = finish(agon(command, agon_cache))
    assert "resumed from step_3" in out
    assert steps(run_dir) == [1, 2, 3, 4, 5, 6]  # each step exactly once
    assert adapter_bytes(run_dir) == adapter_bytes(straight) and adapter_bytes(run_dir)


def test_sigkill_during_a_checkpoint_write_leaves_the_previous_one_and_the_partial_one_is_removed(
        straight, agon_cache, tmp_path):
    run_dir = tmp_path / "run"
    command = FAST + ["trainer.max_steps=6", "trainer.checkpoint_every=1", f"output_dir={run_dir}"]
    partial = run_dir / "checkpoints" / ".tmp-step_4"
    # the write of step 4's checkpoint stops half-way (adapters written, optimizer state not): killed there
    kill_when(agon(command, agon_cache, env={"AGON_TEST_PAUSE_IN_CHECKPOINT": "4"}),
              lambda: partial.is_dir() and any(partial.iterdir()))
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_3"
    assert not (partial / "state.pt").exists()
    out = finish(agon(command, agon_cache))
    assert "resumed from step_3" in out and not partial.exists()
    assert steps(run_dir) == [1, 2, 3, 4, 5, 6]
    assert adapter_bytes(run_dir) == adapter_bytes(straight)


def test_sigkill_before_the_first_checkpoint_then_the_run_starts_over_and_logs_each_record_once(agon_cache, tmp_path):
    run_dir = tmp_path / "run"
    # an evaluation at the start, and no checkpoint until the run ends (checkpoint_minutes is 5)
    command = [o for o in FAST if not o.startswith("eval.at_start")] + [
        "eval.at_start=true", "trainer.max_steps=4", f"output_dir={run_dir}"]
    kill_when(agon(command, agon_cache), lambda: 2 in steps(run_dir))
    assert not (run_dir / "checkpoints" / "latest").exists()
    out = finish(agon(command, agon_cache))
    assert "resumed" not in out
    assert steps(run_dir) == [1, 2, 3, 4]
    evaluations = [r["train/step"] for r in run_files.read_jsonl(run_dir / run_files.METRICS) if "eval/accuracy" in r]
    assert evaluations == [0, 4]
    rows = Counter(r["phase"] for r in run_files.read_jsonl(run_dir / run_files.EVAL))
    assert rows["start"] == rows["final"] > 0  # the start's evaluation once, as large as the final one


def test_an_interrupted_two_cell_sweep_launched_again_runs_only_the_second_cell(agon_cache, tmp_path):
    sweep = tmp_path / "sweep"
    command = ["-m", *FAST, "trainer.max_steps=2", "seed=0,1", f"hydra.sweep.dir={sweep}"]
    first = lambda: next(sweep.glob("0_*/summary.json"), None)  # noqa: E731
    second_started = lambda: first() is not None and next(sweep.glob("1_*/metrics.jsonl"), None)  # noqa: E731
    kill_when(agon(command, agon_cache), second_started)
    done = first().read_bytes()
    assert next(sweep.glob("1_*/summary.json"), None) is None
    out = finish(agon(command, agon_cache))
    assert out.count("[agon] skipped:") == 1 and "0_" in out.split("[agon] skipped:")[1].splitlines()[0]
    assert first().read_bytes() == done  # the finished cell was not run again
    assert steps(next(sweep.glob("1_*"))) == [1, 2]


def test_the_submitit_local_launcher_runs_a_two_cell_sweep(agon_cache, tmp_path):
    sweep = tmp_path / "sweep"
    finish(agon(["-m", "hydra/launcher=local", *FAST, "trainer.max_steps=1", "seed=0,1", f"hydra.sweep.dir={sweep}"],
                agon_cache), timeout=600)
    summaries = sorted(sweep.glob("*/summary.json"))
    assert [p.parent.name[:2] for p in summaries] == ["0_", "1_"]
    assert {json.loads(p.read_text())["seed"] for p in summaries} == {0, 1}
    assert list(sweep.glob(".submitit/*"))  # it really went through submitit


def test_a_finished_run_is_reused_an_extended_one_resumes_and_another_config_is_refused(small_cfg):
    first = run(small_cfg)
    run_dir = Path(small_cfg.output_dir)
    assert finished_summary(run_dir, small_cfg) == first
    assert run(small_cfg) == first  # skipped: nothing trained again
    other = compose_config(TEST_WORLD + SMALL_RUN + ["logger=none", "reward=cooperative",
                                                      f"output_dir={run_dir}"])
    with pytest.raises(ConfigError, match="another configuration.*reward.name"):
        run(other)
    small_cfg.trainer.max_steps = 3  # a finished run extended: it continues from its last checkpoint
    assert finished_summary(run_dir, small_cfg) is None
    assert run(small_cfg)["train/steps"] == 3 and steps(run_dir) == [1, 2, 3]


def test_a_resumed_run_keeps_its_wandb_run_id(tmp_path):
    from agon.recorder import build_logger

    cfg = compose_config(["logger=wandb", "logger.mode=offline"])
    ids = []
    for _ in range(2):
        logger = build_logger(cfg, tmp_path)
        ids.append(logger.run.id)
        logger.finish(0)
    assert ids[0] == ids[1] == (tmp_path / run_files.WANDB_RUN_ID).read_text()
