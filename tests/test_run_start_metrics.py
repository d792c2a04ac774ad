"""Which evaluation a run's start-of-run metrics come from (``eval/accuracy_at_start`` in summary.json).

A run resumed from a checkpoint does not evaluate its start again: it reads the start's metrics back from
metrics.jsonl. Any evaluation row is not the start's: with ``eval.at_start=false`` there is none at step 0, and the
first row with an accuracy is an interim evaluation, whose accuracy a resumed run would report as its start.
"""

from __future__ import annotations

from pathlib import Path

from agon.run import run
from agon.records.run_files import read_jsonl


def _shrink(cfg) -> None:
    t, e = cfg.trainer, cfg.eval
    t.max_steps, t.max_new_tokens, t.checkpoint_every = 2, 8, 1
    e.every, e.n_problems, e.samples = 1, 2, 1


def test_a_resumed_run_reports_the_start_evaluation_or_none_never_an_interim_one(small_cfg):
    """Catches the start metrics read from any evaluation row instead of the one at step 0. A run of 2 steps with
    an evaluation after each and none at the start, then extended to 3 (it resumes from its checkpoint): its start
    accuracy stays None though metrics.jsonl holds evaluations at steps 1 and 2."""
    _shrink(small_cfg)
    small_cfg.eval.at_start = False
    first = run(small_cfg)
    assert first["eval/accuracy_at_start"] is None
    small_cfg.trainer.max_steps = 3
    extended = run(small_cfg)
    assert extended["train/steps"] == 3
    steps = [r["train/step"] for r in read_jsonl(Path(small_cfg.output_dir) / "metrics.jsonl") if "eval/accuracy" in r]
    assert steps[:2] == [1, 2], f"premise: interim evaluations before the resume, got {steps}"
    assert extended["eval/accuracy_at_start"] is None


def test_a_resumed_run_reports_the_evaluation_at_step_0(small_cfg):
    """With an evaluation at the start, the resumed run's start accuracy is the step-0 row's, not a later one's."""
    _shrink(small_cfg)
    small_cfg.eval.at_start = True
    run(small_cfg)
    small_cfg.trainer.max_steps = 3
    extended = run(small_cfg)
    rows = [r for r in read_jsonl(Path(small_cfg.output_dir) / "metrics.jsonl") if "eval/accuracy" in r]
    assert rows[0]["train/step"] == 0
    assert extended["eval/accuracy_at_start"] == rows[0]["eval/accuracy"]
