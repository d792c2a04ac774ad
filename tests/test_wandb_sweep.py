"""What W&B holds for a sweep: a two-cell, two-seed sweep of the test world trained with ``logger=wandb`` offline,
its ``.wandb`` records decoded (``tests/wandb_records.py``); and a resumed run's history, each step once."""

from __future__ import annotations

import pytest

from agon.records.recorder import Recorder
from tests.wandb_records import CELLS, SEEDS, SWEEP_NAME, OfflineRun, shared_sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, agon_cache):
    return shared_sweep(tmp_path_factory)


def test_each_run_is_grouped_by_sweep_and_cell_and_tagged(sweep):
    seen = set()
    for cell in CELLS:
        for seed in SEEDS:
            run = OfflineRun(sweep / f"{cell},seed={seed}").run
            # W&B's grouping by group, then job_type: one line per cell, a band over its seeds
            assert run.run_group == SWEEP_NAME and run.job_type == cell
            assert run.display_name == f"{cell},seed={seed}"
            tags = set(run.tags)
            assert {f"seed={seed}", "model=tiny", "method=agon", "task=arithmetic", cell,
                    "reward=competitive", "rotation=alternate", "init=divergent"} <= tags, tags
            seen.add(run.run_id)
    assert len(seen) == len(CELLS) * len(SEEDS)


def test_per_adapter_curves_follow_one_adapter_under_rotation(sweep):
    for cell in CELLS:
        history = OfflineRun(sweep / f"{cell},seed=0").history
        train = {row["train/step"]: row for row in history if "role/drafter/accuracy" in row}
        assert sorted(train) == [1, 2]
        # step 1: A drafts (step 0 of the rotation), step 2: B drafts
        for step, drafter, challenger in ((1, "A", "B"), (2, "B", "A")):
            row = train[step]
            assert row["train/drafter"] == drafter
            for name in ("accuracy", "reward/mean", "completion_tokens", "entropy", "loss"):
                assert row[f"adapter/{drafter}/drafter/{name}"] == row[f"role/drafter/{name}"]
                assert row[f"adapter/{challenger}/challenger/{name}"] == row[f"role/challenger/{name}"]
            assert not any(k.startswith((f"adapter/{drafter}/challenger/", f"adapter/{challenger}/drafter/"))
                           for k in row)
            assert f"adapter/{drafter}/grad_norm" in row and f"adapter/{challenger}/grad_norm" in row


def test_the_final_adapters_are_an_artifact_and_the_summary_is_there(sweep):
    offline = OfflineRun(sweep / f"{CELLS[0]},seed=0")
    models = [a for a in offline.artifacts if a.type == "model"]
    assert [a.name for a in models] == [f"adapters-{offline.run.run_id}"]
    files = {f.path for f in models[0].manifest.contents}
    assert {"A/adapter_model.safetensors", "B/adapter_model.safetensors"} <= files
    assert offline.summary["eval/accuracy"] is not None and "config" not in offline.summary
    # every evaluation is in the history, not 2 points: start, the interim one at step 1, the final one
    assert offline.steps("eval/accuracy") == [0, 1, 2]


def test_a_resumed_run_sends_each_step_once(tmp_path, monkeypatch, wandb_service):
    """A run killed after step 4 (evaluations at 2 and 4) resumes from its checkpoint at step 2: the recorder drops
    the rows after it and the run logs steps 3 to 6 again. W&B's history (both offline runs of the directory)
    holds each (key, step) once, and the recomputed rows past the kill are there."""
    from tests.test_wandb_logger import _cell_dir, _cfg

    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    from agon.records.recorder import build_logger

    cfg = _cfg("logger=wandb", "logger.table_rows=1")
    run_dir = _cell_dir(tmp_path)

    def play(recorder: Recorder, steps: range) -> None:
        for step in steps:
            recorder.log_metrics({"train/accuracy": step / 10}, step)
            if step % 2 == 0:
                recorder.log_metrics({"eval/accuracy": step / 100}, step)
                recorder.log_rollouts([{"problem_id": f"p{step}"}], step, mirror=True)

    first = Recorder(run_dir, build_logger(cfg, run_dir))
    play(first, range(1, 5))
    first.close(exit_code=1)
    second = Recorder(run_dir, build_logger(cfg, run_dir))
    second.resume_from(2)
    play(second, range(3, 7))
    second.close()
    offline = OfflineRun(run_dir)
    assert len(offline.files) == 2 and len({r.run.run_id for r in offline.records if r.HasField("run")}) == 1
    assert offline.steps("train/accuracy") == [1, 2, 3, 4, 5, 6]
    assert offline.steps("eval/accuracy") == [2, 4, 6]
    assert [s for s in offline.steps("rollouts/step_000006/path")] == [6]
    for key in offline.keys - {"_step", "_runtime", "_timestamp", "train/step"}:
        steps = offline.steps(key)
        assert len(steps) == len(set(steps)), key
