"""Preemption (``agon.core.preemption``): SIGTERM to a run mid-generation stops it cleanly, exit code 143 and no
traceback, and the same command resumes it playing only what was not committed; a cell of submitit's local executor
(the SLURM path on one machine) is requeued by submitit and ends as the uninterrupted run; under vLLM, SIGTERM during
an interim evaluation leaves no engine process, and the relaunch resumes at that step's checkpoint and samples none
of the evaluation's committed rounds again (marker ``vllm``).

Every SIGTERM goes to the run's whole process group, as SLURM signals a job (the vLLM worker, in a session of its own,
is the trainer's to end). Each test waits for a committed file, never for a time.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from agon.core.preemption import EXIT_CODE
from agon.records import run_files
from tests.conftest import TEST_WORLD
from tests.test_engines import VLLM
from tests.test_resume import FINISH_S, REACH_S, Launch, records, summary
from tests.test_resume_chunks import CHUNKED, straight_chunked  # noqa: F401
from tests.test_streamed import _committed, calls_to_finish

STOPPED = "[agon] SIGTERM: the run stopped, keeping its last checkpoint and every committed evaluation round"


def _chunks(run_dir: Path, phase: str = "start-0") -> int:
    return len(list((run_dir / run_files.EVAL_PARTS).glob(f"{phase}-*/chunk_*.pt")))


def _terminate_when(launch: Launch, ready, target=None) -> None:
    """SIGTERM the run's process group (or ``target()``'s process) once ``ready()`` holds; the run must not end
    before."""
    deadline = time.monotonic() + REACH_S
    while not ready():
        assert launch.proc.poll() is None, f"the run ended before its SIGTERM: {launch.output()[-3000:]}"
        assert time.monotonic() < deadline, f"the run never got where it is stopped: {launch.output()[-3000:]}"
        time.sleep(0.05)
    if target is None:
        os.killpg(launch.proc.pid, signal.SIGTERM)
    else:
        target().send_signal(signal.SIGTERM)


def _stopped(launch: Launch) -> str:
    """The output of a run that SIGTERM stopped: exit code 143, the line that says so, no traceback."""
    try:
        code = launch.proc.wait(timeout=FINISH_S)
    except subprocess.TimeoutExpired:
        launch.kill()
        pytest.fail(f"the run did not stop on SIGTERM: {launch.output()[-3000:]}")
    out = launch.output()
    assert code == EXIT_CODE, out[-3000:]
    assert f"{STOPPED}; the same command resumes it" in out and "Traceback" not in out, out[-3000:]
    return out


def test_sigterm_mid_evaluation_exits_143_and_the_same_command_plays_only_the_chunks_not_committed(
        straight_chunked, agon_cache, tmp_path):
    run_dir = tmp_path / "run"
    command = CHUNKED + [f"hydra.run.dir={run_dir}"]
    launch = Launch(command, agon_cache, tmp_path / "stopped.log")
    _terminate_when(launch, lambda: _chunks(run_dir) >= 1)
    _stopped(launch)
    kept = _chunks(run_dir)
    assert 1 <= kept <= 3 and not (run_dir / run_files.SUMMARY).exists()
    out = Launch(command, agon_cache, tmp_path / "again.log").finish()
    assert f"[eval] eval start: {3 - kept} of 3 chunks played in {(3 - kept) * 6} engine calls, {kept} kept " \
           f"from an interrupted run" in out, out[-3000:]
    assert records(run_dir) == records(straight_chunked) and summary(run_dir) == summary(straight_chunked)


def _children(launch: Launch, marker: str) -> list[psutil.Process]:
    """The run's descendant processes whose command line holds ``marker`` (a vLLM worker, in a session of its own,
    is one: a child, not a group member)."""
    out = []
    for child in psutil.Process(launch.proc.pid).children(recursive=True):
        try:
            if marker in " ".join(child.cmdline()):
                out.append(child)
        except psutil.Error:
            continue
    return out


def _submitit_task(launch: Launch) -> psutil.Process:
    """The process of submitit's local executor that runs the cell (``submitit.core._submit``)."""
    found = _children(launch, "submitit.core._submit")
    assert found, "no submitit task process"
    return found[0]


@pytest.mark.long
def test_a_submitit_cell_sent_sigterm_is_requeued_and_ends_as_the_uninterrupted_run(
        straight_chunked, agon_cache, tmp_path):
    """``hydra/launcher=local``: SIGTERM reaches the cell's process mid-evaluation; agon hands the job to submitit's
    own requeue (the local executor starts the task again, as SLURM would requeue the job), the cell resumes in its
    directory playing only the chunks not committed, and the sweep ends with exit 0 and the uninterrupted run's
    records."""
    sweep = tmp_path / "sweep"
    launch = Launch(["-m", "hydra/launcher=local", *CHUNKED, f"hydra.sweep.dir={sweep}"], agon_cache,
                    tmp_path / "sweep.log")

    def cell() -> Path | None:
        found = [p.parent for p in sweep.glob("*/.hydra")]
        return found[0] if found else None

    _terminate_when(launch, lambda: cell() is not None and _chunks(cell()) >= 1, target=lambda: _submitit_task(launch))
    launch.finish()
    logs = "".join(p.read_text(errors="replace") for p in (sweep / ".submitit").rglob("*_log.*"))
    assert "[agon] preempted: asking submitit to requeue this job" in logs and "Requeued job" in logs, logs[-3000:]
    played = re.search(r"\[eval\] eval start: (\d) of 3 chunks played in \d+ engine calls, (\d) kept", logs)
    assert played and int(played[1]) + int(played[2]) == 3 and int(played[2]) >= 1, logs[-3000:]
    assert records(cell()) == records(straight_chunked)
    # a sweep's cell names its overrides as Hydra's multirun writes them
    assert {k: v for k, v in summary(cell()).items() if k != "overrides"} == \
        {k: v for k, v in summary(straight_chunked).items() if k != "overrides"}


# one Agon step, an interim evaluation of 24 problems x 4 samples x 2 orders after it (192 rounds, long enough to
# be stopped half-way), the final one at step 2
INTERIM = TEST_WORLD + VLLM + [
    "logger=none", "progress=false", "trainer.max_steps=2", "trainer.prompts_per_step=2", "trainer.num_generations=2",
    "trainer.max_new_tokens=48", "eval.n_problems=24", "eval.samples=4", "eval.at_start=false", "eval.every=1",
    "eval.interim_problems=24", "eval.interim_samples=4", "trainer.checkpoint_minutes=0"]
# 2 cascade orders and their 2 self-cascades
ROUNDS = 24 * 4 * 4


def _interim_journal(run_dir: Path) -> Path | None:
    found = list((run_dir / run_files.EVAL_PARTS).glob("train-1-*/rounds_rank0.pkl"))
    return found[0] if found and found[0].stat().st_size > 0 else None


@pytest.mark.vllm(seconds=1500)
def test_sigterm_during_a_vllm_interim_evaluation_leaves_no_engine_and_the_resume_samples_none_of_its_rounds(
        agon_cache, tmp_path, bounded):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    out = Launch(INTERIM + [f"hydra.run.dir={straight}"], agon_cache, tmp_path / "straight.log").finish()
    assert f"[eval] eval step 1: {ROUNDS} of {ROUNDS} rounds played in 2 engine calls" in out, out[-3000:]
    engine = run_files.read_json(straight / run_files.SUMMARY)["engine"]
    assert engine["name"] == "vllm" and engine["placement"] == "worker" and engine["vllm_build"] == "cpu"
    assert re.fullmatch(r"0\.\d+\.\d+.*", engine["vllm"]) and engine["torch"] and engine["python"], engine

    command = INTERIM + [f"hydra.run.dir={stopped}"]
    launch = Launch(command, agon_cache, tmp_path / "stopped.log")
    workers: list[psutil.Process] = []

    def a_third_committed() -> bool:
        workers[:] = workers or _children(launch, "vllm_worker.py")
        journal = _interim_journal(stopped)
        return journal is not None and _committed(journal, tmp_path) >= ROUNDS // 3

    _terminate_when(launch, a_third_committed)
    _stopped(launch)
    assert workers and not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    committed = _committed(_interim_journal(stopped), tmp_path)
    assert ROUNDS // 3 <= committed < ROUNDS  # the premise: stopped during the evaluation
    calls = calls_to_finish(_interim_journal(stopped), tmp_path)

    out = Launch(command, agon_cache, tmp_path / "again.log").finish()
    assert "resumed from step_1" in out, out[-3000:]
    assert (f"[eval] eval step 1: {ROUNDS - committed} of {ROUNDS} rounds played in {calls} engine calls, "
            f"{committed} kept from an interrupted run") in out, out[-3000:]
    print(f"stopped with {committed} of {ROUNDS} rounds committed; the relaunch played {ROUNDS - committed}")
    assert records(stopped) == records(straight)
