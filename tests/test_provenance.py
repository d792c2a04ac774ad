"""Records of provenance: which code each launch of a run ran, when its time started, and how the launches are summed.

A run resumed across launches keeps one record per launch (``TrainState.launches``: the commit and dirty flag read as
the process started, the UTC start, the wall seconds up to its last checkpoint); ``summary.json`` names the last
launch's code and sums every kept launch's seconds; ``runs.md`` lists each distinct commit once, in launch order,
dirty where any launch of it was, and counts the launches kept. Each test below gives the launches *different*
commits, dirty flags and start-up costs, so that taking the first launch for the last, one launch too few or too
many, a dirty flag of one launch for all, or a clock started after the model loaded gives a different number.

The commits are real: a throwaway git repository that ``agon.run.code_version`` reads through ``GIT_DIR`` and
``GIT_WORK_TREE`` (as git itself lets any caller). The first launch is written by the trainer's own
``begin_launch`` and ``save_checkpoint``, started long before its checkpoint (a launch whose model load took an hour
and a half); the second is ``agon.run.run`` resuming it. Left out on purpose: a launch killed by a signal (the
checkpoint it leaves is the same record, and tests/test_resume.py kills real processes) and W&B's copy of the summary
(``WandbLogger.log_summary`` sends summary.json as it is written).
"""

from __future__ import annotations

import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch

# what agon.run imports on its first call, imported here so that the seconds before the run's clock starts are the
# run's own checks, not a first import of these modules
import agon.training.cores  # noqa: F401
import agon.training.estimate  # noqa: F401
import agon.training.preflight  # noqa: F401
from agon.records import run_files
from agon.records.recorder import Recorder
from agon.run import code_version, run
from agon.tasks import build_task
from agon.training.trainer import Trainer
from analysis import load_runs
from analysis.tables import runs_markdown
from tests.conftest import SMALL_RUN, TEST_WORLD, compose_config

# a launch's start-up: its first process started this long before its checkpoint
EARLIER_LAUNCH_S = 5400.0


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-c", "user.name=agon", "-c", "user.email=agon@example.invalid", *args], cwd=repo,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """A git repository of its own that ``code_version`` reads instead of agon's checkout."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    _git(repo, "add", "code.py")
    _git(repo, "commit", "-q", "-m", "first")
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(repo))
    return repo


def test_the_code_a_launch_ran_is_its_checkouts_commit_and_dirty_only_for_changed_tracked_files(checkout, tmp_path,
                                                                                              monkeypatch):
    first = _git(checkout, "rev-parse", "HEAD")
    assert code_version() == {"git_commit": first, "git_dirty": False}
    (checkout / "notes.txt").write_text("untracked\n")  # a file git does not track changes no code that ran
    assert code_version() == {"git_commit": first, "git_dirty": False}
    (checkout / "code.py").write_text("x = 2\n")
    assert code_version() == {"git_commit": first, "git_dirty": True}
    _git(checkout, "commit", "-q", "-am", "second")
    second = _git(checkout, "rev-parse", "HEAD")
    assert second != first and code_version() == {"git_commit": second, "git_dirty": False}
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "nowhere"))  # outside any checkout: unknown, not clean
    assert code_version() == {"git_commit": None, "git_dirty": None}


def _runs_row(tmp_path: Path, launches: list[dict] | None, **summary) -> str:
    """runs.md's row of one finished run whose summary.json holds ``launches`` and ``summary``."""
    run_dir = tmp_path / "seed=0"
    run_files.write_json_atomic(run_dir / run_files.SUMMARY, {"method": "agon", "seed": 0, "launches": launches,
                                                              "train/steps": 4, **summary})
    return runs_markdown(load_runs(run_dir)).splitlines()[-1]


@pytest.mark.parametrize("flags, shown", [
    # one commit in several launches: dirty when any of them was, whichever it was
    ((False, True, False), "+dirty"),
    ((True, False, False), "+dirty"),
    ((False, False, True), "+dirty"),
    ((False, False, False), ""),
    ((None, None, None), ""),  # read outside a checkout: not known to be dirty
])
def test_a_commit_run_by_several_launches_is_dirty_when_any_of_them_was(tmp_path, flags, shown):
    launches = [{"git_commit": "a" * 40, "git_dirty": f, "started": "", "wall_s": 1.0} for f in flags]
    row = _runs_row(tmp_path, launches, **{"time/total_s": 3.0})
    assert f"| aaaaaaa{shown} | launch | 3 |" in row, row


def test_each_commit_is_listed_once_in_launch_order_and_every_kept_launch_is_counted(tmp_path):
    """Four launches over three commits, the later ones first alphabetically, one of them twice with different
    flags, one read outside a checkout: each commit once, in the order the launches ran, and four launches."""
    launches = [{"git_commit": c * 40, "git_dirty": d, "started": "", "wall_s": s}
                for c, d, s in (("c", False, 3600.0), ("a", True, 1800.0), ("c", True, 900.0), ("b", None, 900.0))]
    launches.append({"git_commit": None, "git_dirty": None, "started": "", "wall_s": 0.0})
    row = _runs_row(tmp_path, launches, **{"time/total_s": 7200.0, "time/train_s": 3600.0, "git_commit": "b" * 40})
    assert "| ccccccc+dirty, aaaaaaa+dirty, bbbbbbb, ? | launch | 5 | 1.00 | 2.00 |" in row, row


def test_a_run_from_before_launches_were_recorded_names_its_finish_commit(tmp_path):
    row = _runs_row(tmp_path, None, **{"git_commit": "d" * 40, "git_dirty": True, "time/total_s": 1800.0})
    assert "| ddddddd | finish | - |" in row and row.endswith("| 0.50 |"), row


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def test_a_resumed_run_keeps_each_launchs_code_and_start_and_sums_their_wall_time_from_each_start(
        checkout, policies, tmp_path):
    """Launch 1 (clean commit A, started 1.5 h before its checkpoint) is resumed by launch 2 (commit B, dirty). The
    summary names B as the code, dirty; keeps A's record exactly as its checkpoint saved it; counts B's seconds from
    before its model loaded; and sums the two. runs.md, read back by analysis, says the same."""
    # no step to train (the checkpoint is its last), one problem to evaluate, two rows for the start-up probe
    cfg = compose_config(TEST_WORLD + SMALL_RUN + ["logger=none", "trainer.max_steps=0", "trainer.prompts_per_step=1",
                                                   "eval.n_problems=1", "eval.samples=1", "trainer.max_new_tokens=8"])
    run_dir = tmp_path / "runs" / "run"
    cfg.output_dir = str(run_dir)
    commit_a = _git(checkout, "rev-parse", "HEAD")

    task = build_task(cfg.task)
    try:
        first = Trainer(cfg, policies, task, Recorder(run_dir), run_dir, log=lambda *_: None)
        started_a = time.time() - EARLIER_LAUNCH_S
        first.begin_launch(code_version(), started=started_a)
        checkpoint = first.save_checkpoint()
    finally:
        task.close()
    saved = torch.load(checkpoint / "state.pt", weights_only=False)["state"]["launches"]
    assert len(saved) == 1 and saved[0]["git_commit"] == commit_a and saved[0]["git_dirty"] is False
    assert saved[0]["started"] == _iso(started_a)  # the launch's own start, not the moment it was written
    assert saved[0]["wall_s"] == pytest.approx(EARLIER_LAUNCH_S, abs=30)  # its seconds up to the checkpoint

    (checkout / "code.py").write_text("x = 3\n")
    _git(checkout, "commit", "-q", "-am", "B")
    commit_b = _git(checkout, "rev-parse", "HEAD")
    (checkout / "code.py").write_text("x = 4\n")  # launch 2 runs with uncommitted changes
    called = time.time()
    summary = run(cfg)
    written = (run_dir / run_files.SUMMARY).stat().st_mtime

    launches = summary["launches"]
    assert len(launches) == 2 and launches[0] == saved[0]
    second = launches[1]
    assert (second["git_commit"], second["git_dirty"]) == (commit_b, True)
    assert (summary["git_commit"], summary["git_dirty"]) == (commit_b, True)  # the last launch's, not the first's
    assert _iso(called) <= second["started"] <= _iso(written)
    # the run's wall time is every kept launch's, each from its own start
    assert summary["time/total_s"] == pytest.approx(saved[0]["wall_s"] + second["wall_s"], abs=1e-6)
    # this launch's seconds and its record's come from one clock, started once
    assert summary["time/launch_s"] == pytest.approx(second["wall_s"], abs=0.05)
    # ... started before the model loaded: everything after the config checks up to the summary is counted (the
    # model load is several seconds of it; the checks before the clock starts a small part)
    elapsed = written - called
    assert second["wall_s"] >= elapsed - max(0.5, 0.05 * elapsed), (second["wall_s"], elapsed)
    assert run_files.read_json(run_dir / run_files.SUMMARY)["launches"] == launches  # what analysis reads

    data = load_runs(tmp_path / "runs")
    row = next(line for line in runs_markdown(data).splitlines() if f"{commit_a[:7]}, " in line)
    hours = (saved[0]["wall_s"] + second["wall_s"]) / 3600
    assert f"| {commit_a[:7]}, {commit_b[:7]}+dirty | launch | 2 | 0.00 | {hours:.2f} |" in row, row
