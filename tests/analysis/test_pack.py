"""analysis.pack: a packed sweep loads as the sweep does, smaller, and the recap figure draws from logged rows."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pandas as pd

from agon.records.run_files import METRICS, RUN_LOG, SUMMARY, read_jsonl
from analysis import load_runs
from analysis.figures import make_figures
from analysis.pack import pack, pack_run
from analysis.paired import runs_with_outcomes
from analysis.tables import recap_values, results_table
from tests.analysis.test_analysis import FIXTURES


def test_a_packed_sweep_loads_as_the_sweep_does(tmp_path):
    written = pack(FIXTURES, tmp_path / "packed")
    before, after = load_runs(FIXTURES), load_runs(tmp_path / "packed")
    assert not list((tmp_path / "packed").rglob("samples.jsonl")) and not list((tmp_path / "packed").rglob("*.jsonl"))
    assert written < sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    columns = ["cell", "seed", "status", "eval/accuracy", "eval/conversion_rate"]
    pd.testing.assert_frame_equal(before.runs[columns].reset_index(drop=True),
                                  after.runs[columns].reset_index(drop=True))
    pd.testing.assert_frame_equal(before.steps.reset_index(drop=True), after.steps.reset_index(drop=True))
    # the start and the final evaluations' rows are kept, as they were; the table (its intervals from the final's
    # rows) is the same, and so are the within-run outcomes and their change since the start
    kept = before.evals[before.evals["phase"].isin(["start", "final"])]
    assert set(after.evals["phase"]) == {"start", "final"} and len(after.evals) == len(kept)
    shared = [c for c in kept.columns if c != "run_id"]
    pd.testing.assert_frame_equal(kept[shared].reset_index(drop=True), after.evals[shared].reset_index(drop=True))
    pd.testing.assert_frame_equal(results_table(before), results_table(after))
    outcomes = [runs_with_outcomes(d.runs, d.evals) for d in (before, after)]
    assert outcomes[1]["paired/cascade_minus_solo_change"].notna().any()
    columns = [c for c in outcomes[0].columns if c.startswith("paired/")]
    pd.testing.assert_frame_equal(outcomes[0][columns].reset_index(drop=True),
                                  outcomes[1][columns].reset_index(drop=True))
    # packing twice gives the same bytes (no time stamps in the gzip headers)
    again = tmp_path / "again"
    pack(FIXTURES, again)
    first = sorted((tmp_path / "packed").rglob("*.gz"))
    assert [p.read_bytes() for p in first] == [
        (again / p.relative_to(tmp_path / "packed")).read_bytes() for p in first]


def test_a_packed_run_keeps_its_log_as_it_is(tmp_path):
    """run.log holds each launch's start and what it resumed from: packed byte for byte, beside the summary."""
    run = next(p.parent for p in FIXTURES.rglob(SUMMARY))
    shutil.copytree(run, tmp_path / "run")
    log = "[2026-12-04 19:49:59,367][agon][INFO] [agon] agon\n[2026-12-05 01:04:14,147][agon][INFO] [train] resumed\n"
    (tmp_path / "run" / RUN_LOG).write_text(log)
    pack_run(tmp_path / "run", tmp_path / "packed")
    assert (tmp_path / "packed" / RUN_LOG).read_text() == log and (tmp_path / "packed" / SUMMARY).is_file()


def test_a_packed_run_keeps_its_earliest_start_evaluation_and_its_last_final_one(tmp_path):
    """eval.jsonl of a run extended once and evaluated at the start twice: the packed rows are the first start
    evaluation's (at the smallest step, the first row of each order, stage, problem and sample) and then the final
    evaluation at the last step, in file order; the interim evaluations and the shorter run's final are left out."""
    def rows(phase: str, step: int, correct: bool, problems: str = "pq") -> list[dict]:
        return [{"step": step, "phase": phase, "order": "A>B", "stage": stage, "problem_id": p, "sample": 0,
                 "correct": correct} for p in problems for stage in ("draft", "final")]

    run = tmp_path / "run"
    run.mkdir()
    written = (rows("start", 0, False) + rows("start", 0, True) + rows("train", 50, True) + rows("final", 100, True)
               + rows("train", 150, False) + rows("final", 200, False, "qp"))
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in written))
    (run / METRICS).write_text("")
    pack_run(run, tmp_path / "packed")
    packed = read_jsonl(tmp_path / "packed" / "eval.jsonl")
    assert packed == rows("start", 0, False) + rows("final", 200, False, "qp")
    # a run that stopped before its final evaluation: its start and its last interim one, never the start twice
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows("start", 0, False)
                                            + rows("train", 50, True)))
    pack_run(run, tmp_path / "stopped")
    assert read_jsonl(tmp_path / "stopped" / "eval.jsonl") == rows("start", 0, False) + rows("train", 50, True)
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows("start", 0, False)))
    pack_run(run, tmp_path / "started")
    assert read_jsonl(tmp_path / "started" / "eval.jsonl") == rows("start", 0, False)


def test_the_recap_figure_draws_what_the_runs_logged(tmp_path):
    runs = tmp_path / "sweeps"
    shutil.copytree(FIXTURES, runs)
    # the fixture's grid runs log a diagnostic at steps 0 and 2: B's "correct" accuracy goes from .5 to .9
    logged = 0
    for metrics in runs.rglob(METRICS):
        rows = read_jsonl(metrics)
        if "eval/cascade_acc_AB" not in json.dumps(rows):
            continue
        last = max(r["train/step"] for r in rows)
        for step, value in ((0, 0.5), (last, 0.9)):
            rows.append({"train/step": step, "recap/n_wrong": 4.0, "crossplay/A>B": value, "crossplay/B>A": 0.5,
                         "crossplay/A>A": 0.5, "crossplay/B>B": 0.5,
                         **{f"recap/{who}/{c}": value if c == "correct" else 0.25
                            for who in ("A", "B", "base") for c in ("rival", "correct", "wrong", "none")},
                         # one run also probes the conditions as key/value prefixes, as a latent-exchange run does
                         **({f"latent/{who}/{c}": 0.125 if c == "none" else 0.0625
                             for who in ("A", "B", "base") for c in ("rival", "correct", "wrong", "none")}
                            if logged == 0 else {})})
        metrics.with_name(METRICS + ".gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows)
                                                                     .encode()))
        metrics.unlink()
        logged += 1
    assert logged >= 4
    data = load_runs(runs)
    table = results_table(data)
    row = table[table["cell"] == "competitive · visible"].iloc[0]
    assert list(recap_values(data.steps, row, "correct", "first")) == [0.5, 0.5]  # two seeds
    assert list(recap_values(data.steps, row, "correct", "last")) == [0.9, 0.9]
    assert list(recap_values(data.steps, row, "none", "last")) == [0.25, 0.25]
    names = {p.name for p in make_figures(data, tmp_path / "out")}
    assert {"recap_diagnostic.png", "recap_diagnostic.pdf", "diagnostic.md"} <= names
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "| competitive · visible | 0 | 2 | 25.0 | n/a | n/a | 50.0 | 25.0 | 25.0 |" in text
    assert "| A | 50.0 | 90.0 |" in text  # the cross-play matrix at the last evaluation: A drafts, B answers .9
    # the prefix conditions get their own block, with only the run that logged them (one seed, each step)
    text_block, latent_block = text.split("\n\n| drafter")[0].split("as key/value prefixes")
    assert "| 0 | 1 | 6.2 | n/a | n/a | 6.2 | 6.2 | 12.5 |" in latent_block
    assert latent_block.count("| 1 | 6.2 |") == 2 and "6.2" not in text_block
    # and the figure draws them in a row of their own under the cell's text row, as the run logged them
    from analysis.figures import recap_figure

    fig = recap_figure(data, table)
    labels = [t.get_text().replace("\n", " ") for t in fig.axes[0].get_yticklabels()]
    latent_rows = [y for y, label in enumerate(labels) if label.endswith(" (as key/value states)")]
    assert len(latent_rows) == 1
    latent_row = latent_rows[0]
    assert labels[latent_row] == labels[latent_row - 1] + " (as key/value states)"
    means = [o for o in fig.axes[1].collections if len(o.get_offsets()) == 1]
    assert {(round(x, 2), y) for o in means for x, y in o.get_offsets()} >= {
        (6.25, latent_row + off) for off in np.linspace(-0.27, 0.27, 4)[1:3]}
    # without the diagnostic there is no such figure
    assert "recap_diagnostic.png" not in {p.name for p in make_figures(load_runs(FIXTURES), tmp_path / "plain")}
