"""Evaluations that resume in committed chunks: a run SIGKILLed after a chunk of its start, an interim and its final
evaluation, launched again with the same command (or with less engine memory), plays only the chunks not committed
and ends as the uninterrupted run. Apart from ``tests/test_resume.py`` (whose launcher and readers it uses) so that
pytest-xdist's workers share the two files' minutes instead of one worker running both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agon.records import run_files
from tests.test_resume import FAST, Launch, adapter_bytes, paused_at, records, summary


# three chunks of one problem in every evaluation: at the start, an interim one at step 2 (after step 2's
# checkpoint), the final one at step 3
CHUNKED = FAST + ["eval.at_start=true", "eval.every=2", "trainer.max_steps=3", "trainer.checkpoint_every=2",
                  "eval.n_problems=3", "eval.chunk_problems=1"]
# engine calls of one chunk: Agon's two cascade orders, a draft and an answer each, and an answer per self-cascade
CALLS_PER_CHUNK = 6


@pytest.fixture(scope="module")
def straight_chunked(agon_cache, tmp_path_factory) -> Path:
    """``CHUNKED`` without interruption."""
    run_dir = tmp_path_factory.mktemp("straight-chunked") / "run"
    out = Launch(CHUNKED + [f"hydra.run.dir={run_dir}"], agon_cache, run_dir.parent / "out.log").finish()
    for label in ("eval start", "eval step 2", "eval final"):
        assert f"[eval] {label}: 3 of 3 chunks played in {3 * CALLS_PER_CHUNK} engine calls" in out, out[-3000:]
    assert not (run_dir / run_files.EVAL_PARTS).exists()  # gone once the run ended
    return run_dir


# each evaluation once, with one chunk kept or two (the code that counts them is the same for every phase; six cases,
# each phase at both counts, cost a minute of make test for nothing the three do not show)
@pytest.mark.parametrize("point,phase,label,kept", [
    ("eval_chunk_1:0", "start-0", "eval start", 2), ("eval_chunk_0:2", "train-2", "eval step 2", 1),
    ("eval_chunk_1:3", "final-3", "eval final", 2),
])
def test_a_run_killed_during_an_evaluation_plays_only_the_chunks_not_done_and_ends_as_the_uninterrupted_run(
        point, phase, label, kept, straight_chunked, agon_cache, tmp_path):
    """SIGKILL after chunk ``kept - 1`` (of eval.chunk_problems=1 each) of an evaluation is committed: the launch
    again plays the other chunks only
    (counted in engine calls), replays nothing it had logged before the kill beyond what its checkpoint lost, and
    ends with eval.jsonl, metrics.jsonl, samples.jsonl, the summary and the adapters of the uninterrupted run."""
    run_dir = tmp_path / "run"
    command = CHUNKED + [f"hydra.run.dir={run_dir}"]
    Launch(command, agon_cache, tmp_path / "killed.log", env=paused_at(point)).kill_at(point)
    assert len(list((run_dir / run_files.EVAL_PARTS).glob(f"{phase}-*/chunk_*.pt"))) == kept  # the premise
    out = Launch(command, agon_cache, tmp_path / "again.log").finish()
    played = 3 - kept
    assert (f"[eval] {label}: {played} of 3 chunks played in {played * CALLS_PER_CHUNK} engine calls, {kept} kept "
            f"from an interrupted run") in out, out[-3000:]
    # the interim evaluation at step 2 follows step 2's checkpoint: killed there, the run resumes at step 2 and
    # neither trains a step nor evaluates the start again
    if label == "eval step 2":
        assert "resumed from step_2" in out and "eval start" not in out, out[-3000:]
    assert records(run_dir) == records(straight_chunked)
    assert summary(run_dir) == summary(straight_chunked)
    assert adapter_bytes(run_dir) == adapter_bytes(straight_chunked)
    assert not (run_dir / run_files.EVAL_PARTS).exists()


def test_a_relaunch_with_less_engine_memory_keeps_the_committed_chunks(straight_chunked, agon_cache, tmp_path):
    """The natural reaction to an out-of-memory, a lower generation.vllm.gpu_memory_utilization (and a smaller
    max_num_seqs), changes what the engine holds, not what it samples: the launch again keeps the chunk committed
    before the kill (``cascade.RESOURCE_KEYS``) and ends as the uninterrupted run."""
    run_dir = tmp_path / "run"
    command = CHUNKED + [f"hydra.run.dir={run_dir}"]
    Launch(command, agon_cache, tmp_path / "killed.log", env=paused_at("eval_chunk_0:0")).kill_at("eval_chunk_0:0")
    smaller = ["generation.vllm.gpu_memory_utilization=0.2", "generation.vllm.max_num_seqs=8"]
    out = Launch(command + smaller, agon_cache, tmp_path / "again.log").finish()
    assert ("[eval] eval start: 2 of 3 chunks played in 12 engine calls, 1 kept from an interrupted run") in out, \
        out[-3000:]
    assert records(run_dir) == records(straight_chunked)
