"""Runs that resume by themselves (``trainer.resume=auto``): killed with SIGKILL at every edge of a run and started
again with the same command, interrupted sweeps launched again, and sweeps through submitit's local executor; what
the checkpoint keys write.

Every kill is a SIGKILL of a real ``python -m agon.run`` process on the test world, at a point the run itself stops at
(``AGON_TEST_PAUSE_AT``, ``agon.training.trainer.pause_point``), so no test races the run: each waits for a line or a
file, never for a time, and holds on a machine whose cores are busy with other work.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from agon.records import run_files
from agon.core.config import ConfigError
from agon.records.recorder import Recorder
from agon.run import finished_summary, run
from agon.tasks import build_task
from agon.training.trainer import PAUSE_AT, PAUSED, Trainer
from tests.conftest import SMALL_RUN, TEST_WORLD, compose_config

ROOT = Path(__file__).parents[1]
# no checkpoint by the clock (trainer.checkpoint_minutes=0): which checkpoints a run holds when it is killed must not
# depend on how fast the machine is
FAST = TEST_WORLD + ["logger=none", "progress=false", "trainer.prompts_per_step=2", "trainer.num_generations=2",
                     "trainer.max_new_tokens=24", "eval.n_problems=2", "eval.samples=2",
                     "trainer.checkpoint_minutes=0"]
# every kind of record: an evaluation at the start, checkpoints at steps 2 and 4, an interim evaluation at step 3
# after its own checkpoint, the final evaluation at step 4
EDGES = FAST + ["eval.at_start=true", "eval.every=3", "trainer.max_steps=4", "trainer.checkpoint_every=2"]
# deadlines for a run to reach a point or to finish: far beyond what a launch takes (10 s, or minutes when the cores
# are busy with other work), met or missed only when something is broken
REACH_S = FINISH_S = 900


class Launch:
    """One ``python -m agon.run`` in its own process group. Its output goes to a file that the test reads while it
    runs (a pipe that nobody reads would stop the run once full)."""

    def __init__(self, args: list[str], cache: Path, log: Path, env: dict[str, str] | None = None):
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agon.run", *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,
                env={**os.environ, "AGON_CACHE": str(cache), "WANDB_MODE": "disabled", **(env or {})})

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole process group (a sweep's cells, submitit's workers)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def finish(self, timeout: float = FINISH_S, logs: Callable[[], str] = str) -> str:
        """Wait for the run to end by itself; its output. It must exit 0 (``logs``: more to show when it does not)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the run did not end in {timeout:.0f} s: {self.output()[-3000:]}{logs()}")
        assert self.proc.returncode == 0, self.output()[-3000:] + logs()
        return self.output()

    def kill_when(self, ready: Callable[[], Any], timeout: float = REACH_S) -> None:
        """SIGKILL the run as soon as ``ready()`` holds; it must not end before."""
        deadline = time.monotonic() + timeout
        try:
            while not ready():
                assert self.proc.poll() is None, f"the run ended before it could be killed: {self.output()[-3000:]}"
                assert time.monotonic() < deadline, f"the run never got where it is killed: {self.output()[-3000:]}"
                time.sleep(0.05)
        finally:
            self.kill()

    def kill_at(self, point: str) -> None:
        """SIGKILL the run where it stopped at ``point`` (it was launched with ``AGON_TEST_PAUSE_AT=point``)."""
        self.kill_when(lambda: f"{PAUSED} {point}\n" in self.output())


def paused_at(point: str) -> dict[str, str]:
    return {PAUSE_AT: point}


def steps(run_dir: Path) -> list[int]:
    return [r["train/step"] for r in run_files.read_jsonl(run_dir / run_files.METRICS) if "role/drafter/loss" in r]


def adapter_bytes(run_dir: Path) -> dict[str, bytes]:
    return {p.parent.name: p.read_bytes() for p in sorted((run_dir / run_files.ADAPTERS).glob("*/*.safetensors"))}


def records(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every line of the run's JSONL files, in order, less the wall-clock timings (no two runs share them)."""
    return {name: [{k: v for k, v in row.items() if not k.startswith("time/")}
                   for row in run_files.read_jsonl(run_dir / name)]
            for name in (run_files.METRICS, run_files.EVAL, run_files.SAMPLES)}


def counts(run_dir: Path) -> dict[str, Counter]:
    """Per file, how many lines each (step, what) has: a record twice or missing, said in a line."""
    def what(row: dict[str, Any]) -> str:
        return "eval" if "eval/accuracy" in row else row.get("phase", "train")

    return {name: Counter((row.get("train/step", row.get("step")), what(row)) for row in rows)
            for name, rows in records(run_dir).items()}


def summary(run_dir: Path) -> dict[str, Any]:
    """summary.json less the wall-clock timings, the memory a cell started with (measurements, not results), the
    git commit and checkout state (the checkout may change between two launches of one test) and the launches."""
    return {k: v for k, v in run_files.read_json(run_dir / run_files.SUMMARY).items()
            if not k.startswith(("time/", "memory/")) and k not in ("git_commit", "git_dirty", "launches")}


def assert_launches(run_dir: Path, kept: int) -> None:
    """The summary counts ``kept`` launches, each with its code and its seconds, and its total wall time is theirs:
    more than the last launch's alone when an earlier one's work was kept."""
    s = run_files.read_json(run_dir / run_files.SUMMARY)
    launches = s["launches"]
    assert len(launches) == kept
    assert all(launch["wall_s"] > 0 and launch["started"] for launch in launches)
    assert launches[-1]["git_commit"] == s["git_commit"] and launches[-1]["git_dirty"] == s["git_dirty"]
    assert s["time/total_s"] == pytest.approx(sum(launch["wall_s"] for launch in launches))
    assert launches[-1]["wall_s"] <= s["time/launch_s"]
    if kept > 1:
        assert s["time/total_s"] > s["time/launch_s"]


def checkpoints(run_dir: Path) -> list[str]:
    """What checkpoints/ holds, temporary files included."""
    root = run_dir / run_files.CHECKPOINTS
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def phases(run_dir: Path) -> set[str]:
    """The evaluations eval.jsonl holds rows of."""
    return {r["phase"] for r in run_files.read_jsonl(run_dir / run_files.EVAL)}


def latest(run_dir: Path) -> str | None:
    path = run_dir / run_files.CHECKPOINTS / "latest"
    return path.read_text() if path.exists() else None


def assert_consistent(run_dir: Path, max_steps: int) -> None:
    """The summary says what the records hold: the steps, the tokens, the evaluations at the start and the end."""
    metrics, s = run_files.read_jsonl(run_dir / run_files.METRICS), summary(run_dir)
    evaluations = {r["train/step"]: r for r in metrics if "eval/accuracy" in r}
    trained = [r for r in metrics if "role/drafter/loss" in r]
    assert s["train/steps"] == max_steps == trained[-1]["train/step"]
    assert s["train/generated_tokens"] == trained[-1]["train/generated_tokens"] > 0
    assert s["eval/accuracy"] == evaluations[max_steps]["eval/accuracy"]
    assert s["eval/accuracy_at_start"] == evaluations[0]["eval/accuracy"]


@pytest.fixture(scope="module")
def straight(agon_cache, tmp_path_factory) -> Path:
    """``EDGES`` without interruption: what every interrupted run must end as, record for record and bit for bit."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    Launch(EDGES + [f"hydra.run.dir={run_dir}"], agon_cache, run_dir.parent / "out.log").finish()
    assert steps(run_dir) == [1, 2, 3, 4]
    assert checkpoints(run_dir) == ["latest", "step_3", "step_4"]  # keep_checkpoints=2
    assert_consistent(run_dir, 4)
    assert_launches(run_dir, 1)
    return run_dir


@dataclass(frozen=True)
class Edge:
    name: str
    pause: str  # where the first launch is killed (AGON_TEST_PAUSE_AT)
    resumed: str | None  # the checkpoint the second launch resumes from, None when it starts over
    left: Callable[[Path], bool]  # what the kill left that the second launch must not log twice (the premise)


EDGE_CASES = [
    # the evaluation at the start and step 1 logged, step 2 half: no checkpoint, so everything is done again
    Edge("before-the-first-checkpoint", "step:2", None, lambda d: steps(d) == [1, 2] and latest(d) is None),
    # checkpoint 2; step 3 half: step 3 again
    Edge("mid-step", "step:3", "step_2", lambda d: steps(d) == [1, 2, 3] and latest(d) == "step_2"),
    # checkpoint 3, then its interim evaluation's rows written and not its metrics row: the evaluation again, from
    # checkpoint 3, and not step 3
    Edge("during-an-interim-evaluation", "eval:3", "step_3",
         lambda d: steps(d) == [1, 2, 3] and latest(d) == "step_3" and "train" in phases(d)),
    # the interim evaluation at 3 ended, half of step 4 after it: step 4 again, not the evaluation
    Edge("after-an-interim-evaluation", "step:4", "step_3",
         lambda d: steps(d) == [1, 2, 3, 4] and latest(d) == "step_3"),
    # step 4's checkpoint written as far as its adapters: the partial one removed, step 3's used
    Edge("during-a-checkpoint-write", "checkpoint:4", "step_3",
         lambda d: latest(d) == "step_3" and ".tmp-step_4" in checkpoints(d)
         and not (d / run_files.CHECKPOINTS / ".tmp-step_4" / "state.pt").exists()),
    # the final evaluation's rows written and not its metrics row: it runs again, from checkpoint 4
    Edge("during-the-final-evaluation", "eval:4", "step_4",
         lambda d: latest(d) == "step_4" and "final" in phases(d)),
    # everything written: the second launch reuses the summary and runs nothing
    Edge("after-the-summary", "summary:4", None, lambda d: (d / run_files.SUMMARY).exists()),
]


@pytest.mark.parametrize("edge", EDGE_CASES, ids=lambda e: e.name)
def test_a_run_killed_at_each_edge_and_launched_again_ends_with_the_records_of_an_uninterrupted_run_each_once(
        edge, straight, agon_cache, tmp_path):
    run_dir = tmp_path / "run"
    command = EDGES + [f"hydra.run.dir={run_dir}"]
    Launch(command, agon_cache, tmp_path / "killed.log", env=paused_at(edge.pause)).kill_at(edge.pause)
    assert edge.left(run_dir), f"the kill at {edge.pause} did not leave what this case is about"
    kept = (run_dir / run_files.SUMMARY).read_bytes() if edge.pause.startswith("summary") else None
    out = Launch(command, agon_cache, tmp_path / "again.log").finish()
    if edge.resumed:
        assert f"resumed from {edge.resumed}" in out
    else:
        assert "resumed from" not in out
    assert ("[agon] skipped:" in out) is (kept is not None)
    if kept is not None:
        assert (run_dir / run_files.SUMMARY).read_bytes() == kept  # reused, not written again
    # every step, evaluation row, rollout and metrics row once: the uninterrupted run's, line for line
    assert steps(run_dir) == [1, 2, 3, 4]
    assert counts(run_dir) == counts(straight)
    assert records(run_dir) == records(straight)
    assert summary(run_dir) == summary(straight) and adapter_bytes(run_dir) == adapter_bytes(straight)
    assert checkpoints(run_dir) == checkpoints(straight)  # no partial write left, none pruned too many or too few
    assert_consistent(run_dir, 4)
    # a resumed run's time and code are both launches'; one started over, or reused, is one launch's
    assert_launches(run_dir, 2 if edge.resumed else 1)


def test_trainer_resume_never_starts_afresh_leaving_no_summary_or_checkpoint_of_the_run_before_to_resume(
        straight, agon_cache, tmp_path):
    """A finished run trained again with ``trainer.resume=never`` and killed before its first checkpoint: the summary
    and checkpoints of the run before are gone with its records, so the same command with ``resume=auto`` neither
    skips as finished nor resumes the other run's step 4, and ends as the uninterrupted run."""
    run_dir = tmp_path / "run"
    shutil.copytree(straight, run_dir)
    command = EDGES + [f"hydra.run.dir={run_dir}"]
    Launch(command + ["trainer.resume=never"], agon_cache, tmp_path / "killed.log",
           env=paused_at("step:2")).kill_at("step:2")
    assert steps(run_dir) == [1, 2]  # started over
    assert not (run_dir / run_files.SUMMARY).exists() and latest(run_dir) is None
    out = Launch(command, agon_cache, tmp_path / "again.log").finish()
    assert "[agon] skipped" not in out and "resumed from" not in out
    assert records(run_dir) == records(straight) and adapter_bytes(run_dir) == adapter_bytes(straight)
    assert checkpoints(run_dir) == checkpoints(straight)


def cell_dir(sweep: Path, override: str) -> Path:
    """The one cell directory of ``sweep`` whose overrides (``.hydra/overrides.yaml``) include ``override``."""
    found = [p.parents[1] for p in sweep.glob("*/.hydra/overrides.yaml") if override in p.read_text().split()]
    assert len(found) == 1, (override, found)
    return found[0]


def test_an_interrupted_two_cell_sweep_launched_again_runs_only_the_second_cell(agon_cache, tmp_path):
    sweep = tmp_path / "sweep"
    # the cells differ in length so that only the second reaches step 2, where the sweep is killed
    command = ["-m", *FAST, "eval.at_start=false", "trainer.max_steps=1,2", f"hydra.sweep.dir={sweep}"]
    Launch(command, agon_cache, tmp_path / "killed.log", env=paused_at("step:2")).kill_at("step:2")
    first = cell_dir(sweep, "trainer.max_steps=1") / run_files.SUMMARY
    done = first.read_bytes()
    second = cell_dir(sweep, "trainer.max_steps=2")
    assert not (second / run_files.SUMMARY).exists() and steps(second) == [1, 2]
    out = Launch(command, agon_cache, tmp_path / "again.log").finish()
    assert out.count("[agon] skipped:") == 1 and str(first.parent) in out.split("[agon] skipped:")[1].splitlines()[0]
    assert first.read_bytes() == done  # the finished cell was not run again
    assert steps(second) == [1, 2]


@pytest.mark.long
def test_a_sweep_launched_again_with_more_seeds_skips_its_finished_cells(agon_cache, tmp_path):
    """A cell's folder is named by its overrides alone: a grid of two values at seed=0, launched again with
    seed=0,1, finds its two finished cells where it left them (with Hydra's job number in the name, seed=0,1
    renumbers them and trains them again) and ends with exactly four."""
    sweep = tmp_path / "sweep"
    grid = ["-m", *FAST, "eval.at_start=false", "trainer.max_steps=1", "trainer.learning_rate=1e-4,2e-4",
            f"hydra.sweep.dir={sweep}"]
    Launch(grid + ["seed=0"], agon_cache, tmp_path / "first.log").finish()
    finished = {p: p.read_bytes() for p in sweep.glob("*/summary.json")}
    assert len(finished) == 2
    out = Launch(grid + ["seed=0,1"], agon_cache, tmp_path / "again.log").finish()
    assert out.count("[agon] skipped:") == 2, out[-3000:]
    assert all(p.read_bytes() == done for p, done in finished.items())  # not trained again
    cells = sorted(sweep.glob("*/summary.json"))
    assert len(cells) == 4 and len(list(sweep.glob("*/.hydra"))) == 4
    assert {(json.loads(p.read_text())["seed"], json.loads(p.read_text())["config"]["trainer"]["learning_rate"])
            for p in cells} == {(s, lr) for s in (0, 1) for lr in (1e-4, 2e-4)}


def test_a_finished_run_is_reused_an_extended_one_resumes_and_another_config_is_refused(small_cfg, tmp_path):
    first = run(small_cfg)
    run_dir = Path(small_cfg.output_dir)
    assert finished_summary(run_dir, small_cfg) == first
    assert run(small_cfg) == first  # skipped: nothing trained again
    # finished before agon had a key that is now at its off value (an older version's summary): the same run
    written = (run_dir / run_files.SUMMARY).read_bytes()
    saved = json.loads(written)
    del saved["config"]["generation"]["allow_slow"], saved["config"]["reward"]["params"]
    (run_dir / run_files.SUMMARY).write_text(json.dumps(saved))
    assert finished_summary(run_dir, small_cfg) is not None
    (run_dir / run_files.SUMMARY).write_bytes(written)
    other = compose_config(TEST_WORLD + SMALL_RUN + ["logger=none", "reward=cooperative",
                                                      f"output_dir={run_dir}"])
    with pytest.raises(ConfigError, match="another configuration.*reward.name"):
        run(other)
    small_cfg.trainer.max_steps = 3  # a finished run extended: it continues from its last checkpoint
    assert finished_summary(run_dir, small_cfg) is None
    assert run(small_cfg)["train/steps"] == 3 and steps(run_dir) == [1, 2, 3]
    # ... which was written before the final evaluation, so the extended run is the run of 3 steps, bit for bit
    three = copy.deepcopy(small_cfg)
    three.output_dir = str(tmp_path / "three")
    run(three)
    assert adapter_bytes(run_dir) == adapter_bytes(Path(three.output_dir)) and adapter_bytes(run_dir)


def test_a_resumed_run_keeps_its_wandb_run_id(tmp_path, monkeypatch, wandb_service):
    from agon.records.recorder import build_logger

    monkeypatch.setenv("WANDB_INIT_TIMEOUT", str(FINISH_S))  # W&B's service starts slowly on a busy machine
    cfg = compose_config(["logger=wandb", "logger.mode=offline"])
    ids = []
    for _ in range(2):
        logger = build_logger(cfg, tmp_path)
        ids.append(logger.run.id)
        logger.finish(0)
    assert ids[0] == ids[1] == (tmp_path / run_files.WANDB_RUN_ID).read_text()


# -- what the checkpoint keys write ---------------------------------------------------------------------------------


def _trainer(cfg, policies, run_dir: Path, **trainer: Any) -> Trainer:
    for key, value in {"max_new_tokens": 24, **trainer}.items():
        cfg.trainer[key] = value
    return Trainer(cfg, policies, build_task(cfg.task), Recorder(run_dir), run_dir, log=lambda *_: None)


def _train_to(trainer: Trainer, max_steps: int) -> list[str]:
    """Train on to ``max_steps``; the checkpoints then in the run directory."""
    trainer.t.max_steps = max_steps
    trainer.train(progress=False)
    return [p for p in checkpoints(trainer.run_dir) if p != "latest"]


def test_checkpoint_every_writes_every_nth_step_and_keep_checkpoints_prunes_the_oldest_after_the_newest(
        small_cfg, policies, tmp_path):
    trainer = _trainer(small_cfg, policies, tmp_path, checkpoint_every=2, checkpoint_minutes=0, keep_checkpoints=2)
    assert _train_to(trainer, 3) == ["step_2"]  # not steps 1 and 3
    assert _train_to(trainer, 4) == ["step_2", "step_4"]
    assert _train_to(trainer, 6) == ["step_4", "step_6"] and latest(tmp_path) == "step_6"


def test_checkpoint_minutes_checkpoints_when_that_long_passed_and_zero_never_by_the_clock(
        small_cfg, policies, tmp_path):
    never = _trainer(copy.deepcopy(small_cfg), policies, tmp_path / "never", checkpoint_every=0, checkpoint_minutes=0)
    assert _train_to(never, 1) == []
    # a few nanoseconds: due after every step, however fast the machine
    clock = _trainer(small_cfg, policies, tmp_path / "clock", checkpoint_every=0, checkpoint_minutes=1e-9,
                     keep_checkpoints=5)
    assert _train_to(clock, 2) == ["step_1", "step_2"]


def test_a_checkpoint_that_latest_never_named_is_removed_on_resume_and_the_committed_one_loaded(
        small_cfg, policies, tmp_path):
    trainer = _trainer(small_cfg, policies, tmp_path, checkpoint_every=1, keep_checkpoints=1)
    assert _train_to(trainer, 1) == ["step_1"]
    root = tmp_path / run_files.CHECKPOINTS
    # a kill after step 2's checkpoint was renamed into place and before latest named it leaves it there, complete
    shutil.copytree(root / "step_1", root / "step_2")
    resumed = _trainer(small_cfg, policies, tmp_path)
    assert resumed.resume_latest() and resumed.state.step == 1
    assert checkpoints(tmp_path) == ["latest", "step_1"]
