"""The run's records on resume: what a checkpoint covers stays, what is about to be recomputed goes, and a torn
last line from a crash never reaches a reader."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from agon.records import run_files
from agon.records.recorder import Recorder


def _evaluation(rec: Recorder, step: int, phase: str) -> None:
    """What ``Trainer.evaluate`` writes: eval rows, sample rows, then one metrics row with eval/accuracy."""
    rec.log_eval_rows([{"step": step, "phase": phase, "order": "A>B", "stage": s, "correct": True}
                       for s in ("draft", "final")])
    rec.log_rollouts([{"phase": phase, "draft": "x"}], step)
    rec.log_metrics({"eval/accuracy": 0.5}, step)


def _step(rec: Recorder, step: int) -> None:
    rec.log_metrics({"role/drafter/loss": 0.1, "train/accuracy": 0.5}, step)
    rec.log_rollouts([{"draft": "x"}], step)


def _finished_run(run_dir: Path) -> None:
    """4 steps: an evaluation at the start, one after step 2, and the final one at step 4."""
    rec = Recorder(run_dir)
    _evaluation(rec, 0, "start")
    for step in range(1, 5):
        _step(rec, step)
        if step == 2:
            _evaluation(rec, 2, "train")
    _evaluation(rec, 4, "final")
    rec.close()


def _records(run_dir: Path) -> dict[str, Counter]:
    """Per file, how many rows each (step, what) has."""
    metrics = Counter((r["train/step"], "eval" if "eval/accuracy" in r else "train")
                      for r in run_files.read_jsonl(run_dir / run_files.METRICS))
    evals = Counter((r["step"], r["phase"]) for r in run_files.read_jsonl(run_dir / run_files.EVAL))
    samples = Counter((r["step"], r.get("phase", "train")) for r in run_files.read_jsonl(run_dir / run_files.SAMPLES))
    return {"metrics": metrics, "eval": evals, "samples": samples}


def test_resuming_mid_run_forgets_the_steps_after_the_checkpoint_and_keeps_its_evaluation(tmp_path):
    _finished_run(tmp_path)
    Recorder(tmp_path).resume_from(2)
    assert _records(tmp_path) == {
        "metrics": Counter({(0, "eval"): 1, (1, "train"): 1, (2, "train"): 1, (2, "eval"): 1}),
        "eval": Counter({(0, "start"): 2, (2, "train"): 2}),
        "samples": Counter({(0, "start"): 1, (1, "train"): 1, (2, "train"): 2}),  # step 2: a rollout, an eval sample
    }


def test_resuming_from_the_last_step_forgets_only_the_final_evaluation_which_runs_again(tmp_path):
    _finished_run(tmp_path)
    before = _records(tmp_path)
    rec = Recorder(tmp_path)
    rec.resume_from(4, redone="final")
    after = _records(tmp_path)
    assert after["metrics"] == before["metrics"] - Counter({(4, "eval"): 1})
    assert after["eval"] == before["eval"] - Counter({(4, "final"): 2})
    assert after["samples"] == before["samples"] - Counter({(4, "final"): 1})
    _evaluation(rec, 4, "final")  # the final evaluation again: each record once, as in the uninterrupted run
    rec.close()
    assert _records(tmp_path) == before


def test_an_interim_evaluation_cut_short_is_not_evaluated_and_its_records_are_forgotten_for_the_redo(tmp_path):
    """Killed after the interim evaluation at step 2 wrote its eval and sample rows and before its metrics row:
    resumed from checkpoint 2, it is not done (``evaluated``), its rows go and nothing of step 2's training does; the
    evaluation again leaves each record once."""
    _finished_run(tmp_path)
    whole = _records(tmp_path)
    Recorder(tmp_path).resume_from(2)
    rec = Recorder(tmp_path)
    assert rec.evaluated(2) and not rec.evaluated(1)
    rec.resume_from(1)
    _step(rec, 2)
    rec.log_eval_rows([{"step": 2, "phase": "train", "order": "A>B", "stage": "draft", "correct": True}])
    rec.log_rollouts([{"phase": "train", "draft": "x"}], 2)
    assert not rec.evaluated(2)
    rec.resume_from(2, redone="train")
    assert _records(tmp_path)["samples"] == Counter({(0, "start"): 1, (1, "train"): 1, (2, "train"): 1})
    _evaluation(rec, 2, "train")
    rec.close()
    assert _records(tmp_path) == {name: Counter({k: n for k, n in c.items() if k[0] <= 2})
                                  for name, c in whole.items()}


def test_a_run_extended_past_its_last_step_keeps_that_steps_final_evaluation(tmp_path):
    _finished_run(tmp_path)
    before = _records(tmp_path)
    Recorder(tmp_path).resume_from(4)  # max_steps raised: the evaluation at step 4 stays a record of step 4
    assert _records(tmp_path) == before


def test_starting_over_without_a_checkpoint_forgets_every_record(tmp_path):
    _finished_run(tmp_path)
    Recorder(tmp_path).resume_from(-1)
    assert all(not counts for counts in _records(tmp_path).values())


def test_a_torn_last_line_is_dropped_on_reopen_and_appends_start_on_a_fresh_line(tmp_path):
    rec = Recorder(tmp_path)
    _step(rec, 1)
    rec.close()
    with open(tmp_path / run_files.METRICS, "a") as fh:
        fh.write('{"train/step": 2, "role/drafter/lo')  # killed mid-write
    rec = Recorder(tmp_path)
    _step(rec, 2)
    rec.close()
    lines = (tmp_path / run_files.METRICS).read_text().splitlines()
    assert [r["train/step"] for r in run_files.read_jsonl(tmp_path / run_files.METRICS)] == [1, 2]
    assert len(lines) == 2
