"""analysis/ on the committed fixture (tests/analysis/fixtures, written by make_fixture.py).

The fixture's eval.jsonl rows and evaluation metrics are agon.game.cascade.summarise of games built from
make_fixture.SPECS (test_fixtures_are_what_cascade_writes keeps the committed files equal to that). Expected values,
worked out by hand from SPECS (4 problems, 1 sample, headline orders A>B and B>A; conversion and regression pooled
over both orders):

    cell                   seeds  start   acc    delta  conv   regr   tokens  95% CI             paper
    competitive/visible    2      .25     .75    .50    .625   .125   22.5    [0, 1] seeds       .61, 3500
        seed 0: final 4/4 + 3/4 = .875, start 2/8; conv 3/4, regr 0/4, tokens (20+30)/2
        seed 1: final 3/4 + 2/4 = .625, start 2/8; conv 2/4, regr 1/4, tokens (10+30)/2
        two seeds: Student's t, .75 +- 12.71 x .125 (sd .177 / sqrt 2), clipped to [0, 1]
    competitive/hidden     1      .25     .625   .375   .25    0      40      [.5, .875] problems .32
        per-problem (A>B, B>A mean): .5 .5 .5 1 -> low .5 (P(no 1) = .32); high .875 (P(k<=2) = .95 < .975)
        conv: A>B wrong drafts p0,p1 -> finals 0,1; B>A wrong drafts p1,p2 -> 0,0: 1/4. regr: right drafts' finals
        all right: 0/4
    cooperative/visible    1      .125    .75    .625   .5     0      60      [.5, 1] problems    .46
        final 3/4 + 3/4, start 1/4 + 0/4; per-problem .5 1 .5 1 -> [.5, 1] (P(all .5) = P(all 1) = 1/16)
    cooperative/hidden     1      .25     .25    0      0      1/3    30      [0, .5] problems    -
        regr pooled: A>B right draft p3 -> final right (0/1), B>A right drafts p2,p3 -> right, wrong (1/2): 1/3
        (the mean of the two rates would be 1/4); per-problem 0 0 .5 .5 -> [0, .5]
    self-refine            0 (1 incomplete: no summary.json)
    GRPO                   1      .25     .5     .25    -      -      80      [0, 1] problems     .30, 8100
        drafts only: the final answers are A's drafts 1 0 1 0 (start 0 0 1 0); no cascade, so no rates
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from agon.core.methods import METHODS, Evaluation, Method, register_method
from agon.records.run_files import CONFIG, SUMMARY, SWEEP_MARKER
from analysis import cells_table, format_table, load_runs, newest_multirun, results_table, sweep_table
from analysis.figures import BASELINE_COLORS, baseline_colors, cell_style
from analysis.figures import main as figures_main
from analysis.load import RunRecord, cell_sort_key, find_run_dirs, frames, read_run_dir
from analysis.tables import (
    bootstrap_ci,
    final_rows,
    paper_reference,
    runs_markdown,
    t_interval,
    to_latex,
    to_markdown,
)
from tests.analysis import make_fixture

FIXTURES = Path(__file__).parent / "fixtures" / "sweeps"
GRID = FIXTURES / "2026-11-30" / "10-00-00"
BASELINES = FIXTURES / "2026-11-30" / "11-00-00"
CELLS = [
    "competitive · visible",
    "competitive · hidden",
    "cooperative · visible",
    "cooperative · hidden",
    "self-refine",
    "GRPO",
]


@pytest.fixture(scope="module")
def data():
    return load_runs(FIXTURES)


def test_fixtures_are_what_cascade_writes(tmp_path):
    """The committed files are exactly make_fixture's output with today's agon/game/cascade.py (else regenerate them)."""
    root = tmp_path / "2026-11-30"
    make_fixture.main(root)
    committed = FIXTURES / "2026-11-30"
    files = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    for rel in files:
        assert (committed / rel).read_bytes() == (root / rel).read_bytes(), f"{rel}: rerun make_fixture.py"


def test_eval_rows_hold_the_summary(data):
    """What analysis reads per problem (eval.jsonl) and per run (summary.json) agree for every complete run."""
    runs = data.runs[data.runs["status"] == "complete"]
    assert len(runs) == 6
    for _, run in runs.iterrows():
        rows = final_rows(data.evals, run)
        assert set(rows["order"]) == set(run["headline_orders"]) and len(rows) == 4 * len(run["headline_orders"])
        # orders of equal size: the mean over their rows is the mean of their accuracies
        assert rows["correct"].mean() == pytest.approx(run["eval/accuracy"]), run["run_id"]
        assert rows["tokens"].mean() == pytest.approx(run["eval/final_trace_tokens"]), run["run_id"]


def test_finds_run_dirs_under_several_roots():
    dirs = find_run_dirs(FIXTURES)
    assert [d.name for d in dirs] == [
        "0_exchange=visible,reward=competitive,seed=0",
        "1_exchange=visible,reward=competitive,seed=1",
        "2_exchange=hidden,reward=competitive",
        "3_exchange=visible,reward=cooperative",
        "4_exchange=hidden,reward=cooperative",
        "0_method=grpo",
        "1_method=self_refine",
    ]
    assert len(find_run_dirs(GRID)) == 5
    one = GRID / "2_exchange=hidden,reward=competitive"
    assert find_run_dirs(one) == [one]


def test_runs_frame(data):
    runs = data.runs
    assert len(runs) == 7
    assert list(runs["cell"].drop_duplicates()) == CELLS
    assert set(runs["sweep"]) == {"2026-11-30/10-00-00", "2026-11-30/11-00-00"}
    assert runs["status"].value_counts().to_dict() == {"complete": 6, "incomplete": 1}
    grpo = runs[runs["method"] == "grpo"].iloc[0]
    # axes that do not apply to GRPO are "-", so GRPO runs pool whatever their defaults were
    assert (grpo["reward"], grpo["exchange"], grpo["rotation"], grpo["init"]) == ("-", "-", "-", "-")
    assert grpo["headline_orders"] == ["A"]
    assert grpo["eval/accuracy"] == 0.5 and math.isnan(grpo["eval/conversion_rate"])
    # the crashed run's axes come from .hydra/config.yaml
    crashed = runs[runs["status"] == "incomplete"].iloc[0]
    assert (crashed["method"], crashed["run_id"]) == ("self_refine", "2026-11-30/11-00-00/1_method=self_refine")
    seeds = runs[runs["cell"] == "competitive · visible"]
    assert list(seeds["seed"]) == [0, 1] and set(seeds["extra"]) == {""}
    # each adapter alone is its own cascade's drafts; by hand from SPECS (A>B drafts, B>A drafts, finals)
    cells = ["competitive · visible", "cooperative · hidden"]
    columns = ["eval/solo_acc_A", "eval/solo_acc_B", "eval/cascade_acc_AB", "eval/cascade_acc_BA"]
    got = runs[runs["cell"].isin(cells) & (runs["seed"] == 0)].set_index("cell").loc[cells, columns]
    assert got.values.tolist() == [[0.5, 0.5, 1.0, 0.75], [0.25, 0.5, 0.25, 0.25]]
    assert grpo["eval/solo_acc_A"] == 0.5 and math.isnan(grpo["eval/cascade_acc_AB"])  # grpo: A's drafts, no cascade


def test_steps_and_evals_frames(data):
    steps = data.steps
    run = steps[steps["run_id"] == "2026-11-30/10-00-00/0_exchange=visible,reward=competitive,seed=0"]
    # steps 0..4, one row each: step 4's training row and evaluation row are merged
    assert list(run["train/step"]) == [0, 1, 2, 3, 4]
    last = run.iloc[-1]
    assert last["train/accuracy"] == 0.875 and last["eval/accuracy"] == 0.875
    assert math.isnan(run.iloc[0]["train/accuracy"]) and run.iloc[0]["eval/accuracy"] == 0.25
    crashed = steps[steps["cell"] == "self-refine"]
    assert list(crashed["train/step"]) == [1, 2]
    evals = data.evals
    one = evals[evals["run_id"] == run.iloc[0]["run_id"]]
    # per phase: 2 cascade orders x 4 problems x 2 stages + 2 solo orders x 4 problems
    assert len(one) == 2 * (2 * 4 * 2 + 2 * 4)
    assert set(one["order"]) == {"A>B", "B>A", "A", "B"}


def test_single_root_and_single_run():
    grid = load_runs(GRID)
    assert len(grid.runs) == 5 and set(grid.runs["method"]) == {"agon"}
    one = load_runs(GRID / "2_exchange=hidden,reward=competitive")
    assert len(one.runs) == 1
    assert one.runs.iloc[0]["sweep"] == "2026-11-30/10-00-00"
    assert one.runs.iloc[0]["eval/accuracy"] == 0.625
    both = load_runs([GRID, BASELINES, GRID])  # the same run given twice is loaded once
    assert len(both.runs) == 7


def _row(table: pd.DataFrame, cell: str) -> pd.Series:
    return table[table["cell"] == cell].iloc[0]


def test_cells_table_values(data):
    table = cells_table(data.runs)
    assert list(table["cell"]) == CELLS
    expected = {
        # cell: seeds, start, accuracy, delta, conversion, regression, tokens
        "competitive · visible": (2, 0.25, 0.75, 0.5, 0.625, 0.125, 22.5),
        "competitive · hidden": (1, 0.25, 0.625, 0.375, 0.25, 0.0, 40.0),
        "cooperative · visible": (1, 0.125, 0.75, 0.625, 0.5, 0.0, 60.0),
        "cooperative · hidden": (1, 0.25, 0.25, 0.0, 0.0, 1 / 3, 30.0),
        "GRPO": (1, 0.25, 0.5, 0.25, math.nan, math.nan, 80.0),
    }
    columns = [
        "seeds",
        "accuracy_at_start",
        "accuracy",
        "delta",
        "conversion_rate",
        "regression_rate",
        "final_trace_tokens",
    ]
    for cell, values in expected.items():
        row = _row(table, cell)
        for column, value in zip(columns, values):
            if math.isnan(value):
                assert math.isnan(row[column]), (cell, column)
            else:
                assert row[column] == pytest.approx(value), (cell, column)
    crashed = _row(table, "self-refine")
    assert (crashed["seeds"], crashed["incomplete"]) == (0, 1) and math.isnan(crashed["accuracy"])
    assert list(table.columns[:6]) == ["cell", "method", "reward", "exchange", "rotation", "init"]


def test_results_table_intervals_and_paper(data):
    table = results_table(data)
    expected = {
        "competitive · visible": (0.0, 1.0, "seeds", 0.61, 3500.0),
        "competitive · hidden": (0.5, 0.875, "problems", 0.32, math.nan),
        "cooperative · visible": (0.5, 1.0, "problems", 0.46, math.nan),
        "cooperative · hidden": (0.0, 0.5, "problems", math.nan, math.nan),
        "GRPO": (0.0, 1.0, "problems", 0.30, 8100.0),
    }
    for cell, (lo, hi, over, paper, tokens) in expected.items():
        row = _row(table, cell)
        assert (row["accuracy_ci_low"], row["accuracy_ci_high"], row["ci_over"]) == (
            pytest.approx(lo),
            pytest.approx(hi),
            over,
        ), cell
        for column, value in (("paper_accuracy", paper), ("paper_trace_tokens", tokens)):
            assert math.isnan(row[column]) if math.isnan(value) else row[column] == pytest.approx(value), cell
    # the fixture's task is arithmetic: every paper value is marked as from a different model/task
    assert "different model/task" in _row(table, "GRPO")["paper_setting"]


def test_paper_reference_matching():
    base = {
        "method": "agon",
        "reward": "competitive",
        "exchange": "visible",
        "rotation": "alternate",
        "init": "divergent",
        "task": "deepmath_hard",
        "model": "qwen3_0.6b",
    }
    assert paper_reference(base) == (0.61, 3500.0, "same setting")
    assert paper_reference({**base, "rotation": "fixed"})[0] == 0.52
    assert paper_reference({**base, "reward": "paper"})[0] == 0.61
    assert paper_reference({**base, "init": "symmetric"}) is None
    assert paper_reference({**base, "method": "grpo", "model": "qwen3_4b"})[:2] == (0.59, None)
    assert paper_reference({**base, "method": "grpo", "model": "Qwen/Qwen3-14B"})[0] == 0.30
    assert paper_reference({**base, "method": "moa"})[0] == pytest.approx(0.61 / 8)
    assert "different" in paper_reference({**base, "task": "arithmetic"})[2]


def test_t_interval_over_seeds():
    lo, hi = t_interval([0.30, 0.34, 0.32])  # mean .32, sd .02, t(2) = 4.303
    assert (lo, hi) == (pytest.approx(0.32 - 4.303 * 0.02 / 3**0.5, abs=1e-4), pytest.approx(0.32 + 0.0497, abs=1e-4))
    assert t_interval([0.875, 0.625]) == (0.0, 1.0)  # clipped: two seeds this far apart say little
    assert all(math.isnan(v) for v in t_interval([0.5]))


def test_bootstrap_ci():
    assert bootstrap_ci([0.875, 0.625]) == (0.625, 0.875)
    assert bootstrap_ci([0.5, 0.5, 0.5, 1.0]) == (0.5, 0.875)
    assert all(math.isnan(v) for v in bootstrap_ci([0.5]))
    assert bootstrap_ci([0.1, 0.9, 0.4], seed=1) == bootstrap_ci([0.1, 0.9, 0.4], seed=1)


def test_format_table(data):
    text = format_table(cells_table(data.runs))
    lines = text.splitlines()
    assert len(lines) == 2 + len(CELLS)
    assert lines[0].split()[:6] == ["method", "reward", "exchange", "rotation", "init", "seeds"]
    first = lines[2].split()
    # method reward exchange rotation init seeds incomplete start acc delta conv regr tokens
    assert first == [
        "agon",
        "competitive",
        "visible",
        "alternate",
        "divergent",
        "2",
        "0",
        "25.0",
        "75.0",
        "+50.0",
        "62.5",
        "12.5",
        "22.5",
    ]
    assert lines[-1].split() == ["grpo", "-", "-", "-", "-", "1", "0", "25.0", "50.0", "+25.0", "-", "-", "80.0"]
    # the grid alone has no incomplete run, so no "incomplete" column
    assert sweep_table(GRID).splitlines()[2].split() == first[:6] + first[7:]
    assert format_table(cells_table(pd.DataFrame())) == "(no runs)"


def test_markdown_and_latex_mark_paper_values(data):
    table = results_table(data)
    md = to_markdown(table, "caption")
    assert md.startswith("caption\n\n| cell |")
    assert "| competitive · visible | 2 | 0 | 25.0 | 75.0 | +50.0 | 0.0 | 100.0 | seeds |" in md
    assert "61.0*" in md and "3,500*" in md
    tex = to_latex(table, "50% of cells")
    assert r"\begin{tabular}" in tex and r"61.0$^{*}$" in tex and r"50\% of cells" in tex


def test_figures_cli_writes_every_file(tmp_path, capsys):
    out = tmp_path / "figures"
    assert figures_main(["--runs", str(GRID), str(BASELINES), "--out", str(out)]) == 0
    names = ["accuracy_grid", "trace_length", "training_curves", "conversion_regression"]
    for name in names:
        png, pdf = out / f"{name}.png", out / f"{name}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, name
        assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 5_000, name
    csv = pd.read_csv(out / "table.csv")
    assert list(csv["cell"]) == CELLS and csv.loc[0, "accuracy"] == 0.75
    assert "Qwen3-0.6B, DeepMath-hard" in (out / "table.md").read_text()
    assert "not comparable" in (out / "table.tex").read_text()
    printed = capsys.readouterr().out
    # table_full.tex: the appendix table; paired.md, paired.csv, budget.csv: the cascades' within-run outcomes
    assert "7 runs from" in printed and "wrote 17 files" in printed
    assert "| GRPO | 0 | complete | " in (out / "runs.md").read_text()  # each run's commits and hours
    # seed 0 of competitive/visible: A>B drafts 0 1 0 1 all answered right (+50 points); B>A drafts 0 0 1 1, finals
    # 1 0 1 1 (+25); no recap kinds outside target sum
    paired = pd.read_csv(out / "paired.csv")
    run = paired[(paired["rows"] == "run") & (paired["cell"] == CELLS[0]) & (paired["seed"] == 0)].iloc[0]
    assert run["paired/A>B/cascade_minus_solo"] == 0.5 and run["paired/B>A/cascade_minus_solo"] == 0.25
    assert "paired/conversion_gap" not in paired
    assert "| GRPO | 0 | - | - | - |" in (out / "paired.md").read_text()
    assert r"\begin{table*}" in (out / "table_full.tex").read_text()


def test_newest_multirun_and_missing(tmp_path, capsys):
    base = tmp_path / "multirun"
    for root in (GRID, BASELINES):
        shutil.copytree(root, base / "2026-11-30" / root.name)
    old, new = base / "2026-11-30" / "11-00-00", base / "2026-11-30" / "10-00-00"
    os.utime(old / "multirun.yaml", (1_000_000, 1_000_000))
    os.utime(new / "multirun.yaml", (2_000_000, 2_000_000))
    assert newest_multirun(base) == new
    assert figures_main(["--multirun-dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "f")]) == 1
    assert "make sweep" in capsys.readouterr().err


class _FakeRun(SimpleNamespace):
    def scan_history(self):
        return iter(self.history)


class _FakeApi:
    """Stands in for wandb.Api: the W&B source cannot be tested online."""

    def __init__(self, runs):
        self._runs, self.calls = runs, []

    def runs(self, path, filters=None):
        self.calls.append((path, filters))
        return self._runs


def test_wandb_source_builds_the_same_frames():
    summary = {
        "method": "agon",
        "reward": "competitive",
        "exchange": "visible",
        "rotation": "alternate",
        "init": "divergent",
        "task": "arithmetic",
        "model": "tiny",
        "seed": 3,
        "eval/accuracy": 0.7,
        "eval/accuracy_at_start": 0.4,
        "eval/conversion_rate": 0.5,
        "eval/regression_rate": 0.1,
        "eval/final_trace_tokens": 30.0,
        "eval/headline_orders": ["A>B", "B>A"],
        "rollouts/step_000004": {"_type": "table-file"},
    }
    done = _FakeRun(
        id="abc",
        name="exchange=visible,reward=competitive,seed=3",
        group="2026-11-30/10-00-00",
        config={"method": {"name": "agon"}, "seed": 3},
        summary=summary,
        history=[
            {"_step": 0, "train/step": 1, "train/accuracy": 0.5},
            {"_step": 1, "train/step": 1, "eval/accuracy": 0.6},
            {"_step": 2, "train/step": 2, "train/accuracy": 0.7, "rollouts/step_000002": {}},
        ],
    )
    crashed = _FakeRun(
        id="def",
        name="method=grpo",
        group="2026-11-30/10-00-00",
        config={"method": {"name": "grpo"}, "reward": {"name": "competitive"}, "seed": 0},
        summary={"eval/accuracy": 0.9},
        history=[{"_step": 0, "train/step": 1}],
    )
    api = _FakeApi([done, crashed])
    data = load_runs(source="wandb", project="agon", entity="team", filters={"group": "g"}, api=api)
    assert api.calls == [("team/agon", {"group": "g"})]
    runs = data.runs.set_index("run_id")
    assert runs.loc["abc", "cell"] == "competitive · visible" and runs.loc["abc", "status"] == "complete"
    assert runs.loc["abc", "eval/accuracy"] == 0.7 and runs.loc["abc", "sweep"] == "2026-11-30/10-00-00"
    # a run that never wrote its final summary is incomplete, whatever W&B's running summary holds
    assert runs.loc["def", "status"] == "incomplete" and runs.loc["def", "reward"] == "-"
    steps = data.steps[data.steps["run_id"] == "abc"]
    assert list(steps["train/step"]) == [1, 2] and steps.iloc[0]["eval/accuracy"] == 0.6
    assert data.evals.empty
    table = cells_table(data.runs)
    assert _row(table, "competitive · visible")["delta"] == pytest.approx(0.3)


def test_sweep_table_callback_prints_and_writes(tmp_path, capsys, monkeypatch):
    from omegaconf import OmegaConf

    from analysis.callbacks import SweepTable

    sweep = tmp_path / "multirun" / "2026-11-30" / "10-00-00"
    shutil.copytree(GRID, sweep)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    # under several processes every rank runs the callback: only rank 0 prints and writes
    monkeypatch.setenv("RANK", "1")
    SweepTable().on_multirun_end(config)
    assert capsys.readouterr().out == "" and not (sweep / "cells.md").exists()
    monkeypatch.setenv("RANK", "0")
    SweepTable().on_multirun_end(config)
    printed = capsys.readouterr().out
    assert "one row per cell" in printed and printed.count("\nagon ") == 4
    assert (sweep / "cells.md").read_text().count("competitive") == 2
    # a sweep directory with nothing in it warns instead of failing the sweep
    SweepTable().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "empty")}}}))


def test_several_settings_are_labelled_and_matched_to_the_paper(tmp_path):
    run = tmp_path / "multirun" / "2026-12-01" / "08-00-00" / "0_exchange=hidden,task=deepmath_hard"
    shutil.copytree(GRID / "2_exchange=hidden,reward=competitive", run)
    (run.parent / "multirun.yaml").write_text("hydra: {}\n")
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "task": "deepmath_hard", "model": "qwen3_0.6b",
                                                  "model_label": "Qwen3-0.6B"}))
    data = load_runs([GRID, run])
    table = results_table(data)
    assert {"task", "model"} <= set(table.columns)
    deepmath = _row(table, "competitive · hidden (deepmath_hard, Qwen3-0.6B)")
    assert (deepmath["paper_accuracy"], deepmath["paper_setting"]) == (0.32, "same setting")
    line = next(x for x in to_markdown(table).splitlines() if "deepmath_hard" in x)
    assert "| 32.0 |" in line and "*" not in line  # same setting: not starred
    assert "(arithmetic, tiny (offline))" in _row(table, "competitive · hidden (arithmetic, tiny (offline))")["cell"]


def test_extra_overrides_split_cells_unless_every_run_shares_them():
    def record(run_id: str, *overrides: str) -> RunRecord:
        summary = {"method": "agon", "reward": "competitive", "exchange": "visible", "rotation": "alternate",
                   "init": "divergent", "task": "arithmetic", "model": "tiny", "eval/accuracy": 0.5}  # fmt: skip
        return RunRecord(run_id=run_id, summary=summary, overrides=list(overrides))

    runs = frames([
        record("a", "debug=smoke", "seed=0"),
        record("b", "debug=smoke", "seed=1"),
        record("c", "debug=smoke", "trainer.learning_rate=0.001"),
    ]).runs.set_index("run_id")  # fmt: skip
    assert list(runs["extra"]) == ["", "", "trainer.learning_rate=0.001"]
    assert runs.loc["a", "cell_key"] == runs.loc["b", "cell_key"] != runs.loc["c", "cell_key"]
    assert runs.loc["c", "cell"] == "competitive · visible [trainer.learning_rate=0.001]"


def test_a_named_experiment_names_its_cell_only_where_the_axes_do_not():
    """The results sweeps pick cells by experiment=...: agon, cooperative and grpo are told apart by their axes, so
    their labels are the plain ones; grpo_matched shares grpo's axes (its group size differs), so it keeps its name."""
    def record(run_id: str, experiment: str, method: str, reward: str = "competitive") -> RunRecord:
        summary = {"method": method, "reward": reward, "exchange": "visible", "rotation": "alternate",
                   "init": "divergent", "task": "arithmetic", "model": "tiny", "eval/accuracy": 0.5}  # fmt: skip
        return RunRecord(run_id=run_id, summary=summary, overrides=[f"experiment={experiment}", "seed=0"])

    runs = frames([record("a", "agon", "agon"), record("b", "cooperative", "agon", "cooperative"),
                   record("c", "grpo", "grpo"), record("d", "grpo_matched", "grpo")]).runs.set_index("run_id")
    assert runs.loc["a", "cell"] == "competitive · visible" and runs.loc["b", "cell"] == "cooperative · visible"
    assert runs.loc["c", "cell"] == "GRPO" and runs.loc["d", "cell"] == "GRPO [experiment=grpo_matched]"
    assert runs.loc["c", "cell_key"] != runs.loc["d", "cell_key"]


# ---------------------------------------------------------------------------------------------------------------
# methods: what applies, labels, order and colours come from agon.core.methods and summary.json, not from analysis/


def _write_run(run: Path, summary: dict | None, config: dict) -> Path:
    """A run directory written by hand: the Hydra config, and summary.json unless ``summary`` is None."""
    (run / CONFIG).parent.mkdir(parents=True)
    (run / CONFIG).write_text(yaml.safe_dump(config))
    if summary is not None:
        (run / SUMMARY).write_text(json.dumps(summary))
    return run


def _summary(method: str, **values) -> dict:
    axes = {"reward": "competitive", "exchange": "visible", "rotation": "alternate", "init": "divergent"}
    return {"method": method, **axes, "task": "arithmetic", "model": "tiny", "model_label": "tiny (offline)",
            "seed": 0, "eval/accuracy": 0.5, "eval/accuracy_at_start": 0.25, **values}  # fmt: skip


@pytest.fixture
def toy():
    """A baseline registered by a user's script: exchange and init apply to it, reward and rotation do not."""

    @register_method
    class Toy(Method):
        name, label, axes = "toy", "toy", ("exchange", "init")

        def evaluation(self, rotation: str) -> Evaluation:
            return Evaluation([("A", False)], ["A"])

    try:
        yield Toy
    finally:
        del METHODS["toy"]


def test_runs_md_names_each_runs_commits_as_it_recorded_them(tmp_path):
    """A run resumed across two commits (the second launch dirty), one from before launches were recorded (its
    commit read at the finish) and one still training: each row says which commits and when they were read."""
    config = {"method": "agon", "task": {"name": "arithmetic"}, "model": {"name": "tiny"}}
    launches = [{"git_commit": "a" * 40, "git_dirty": False, "started": 0.0, "wall_s": 3600.0},
                {"git_commit": "b" * 40, "git_dirty": True, "started": 9e3, "wall_s": 1800.0}]
    _write_run(tmp_path / "seed=0", _summary("agon", seed=0, launches=launches, git_commit="b" * 40,
                                             **{"train/steps": 60, "time/train_s": 4500.0, "time/total_s": 5400.0}),
               config)
    _write_run(tmp_path / "seed=1", _summary("agon", seed=1, git_commit="c" * 40,
                                             **{"train/steps": 60, "time/train_s": 1800.0, "time/total_s": 900.0}),
               config)
    _write_run(tmp_path / "seed=2", None, {**config, "seed": 2})
    page = runs_markdown(load_runs(tmp_path))
    assert "| 0 | complete | 60 | aaaaaaa, bbbbbbb+dirty | launch | 2 | 1.25 | 1.50 |" in page
    assert "| 1 | complete | 60 | ccccccc | finish | - | 0.50 | 0.25 |" in page
    assert "| 2 | incomplete | - | - | - | - | - | - |" in page


def test_a_registered_method_names_its_cells(tmp_path, toy):
    recorded = {"method_axes": ["exchange", "init"], "method_label": "toy"}
    root = tmp_path / "2026-12-02" / "09-00-00"
    (root / SWEEP_MARKER).parent.mkdir(parents=True)
    (root / SWEEP_MARKER).write_text("hydra: {}\n")
    for i, values in enumerate([
        {"reward": "cooperative", "exchange": "hidden", "rotation": "fixed", "init": "symmetric", "seed": 0},
        {"reward": "competitive", "exchange": "hidden", "rotation": "alternate", "init": "symmetric", "seed": 1},
        {"reward": "cooperative", "exchange": "visible", "rotation": "fixed", "init": "divergent"},
    ]):  # fmt: skip
        _write_run(root / f"{i}_method=toy", _summary("toy", **recorded, **values), {"method": {"name": "toy"}})
    data = load_runs([FIXTURES, root])
    toys = data.runs[data.runs["method"] == "toy"]
    # reward and rotation do not apply: "-", so the two seeds pool although their reward and rotation differ
    assert set(toys["reward"]) == set(toys["rotation"]) == {"-"}
    assert list(toys["exchange"]) == ["visible", "hidden", "hidden"] and list(toys["seed"]) == [0, 0, 1]
    table = cells_table(data.runs)
    # after every registered method's cells; a baseline's label names what is not at its default
    assert list(table["cell"]) == [*CELLS, "toy", "toy · hidden · symmetric init"]
    assert list(table["seeds"])[-2:] == [1, 2]
    # registered baselines keep their colours whatever else is loaded; the toy comes after them
    colors = baseline_colors(table["method"])
    assert colors == {"self_refine": BASELINE_COLORS[0], "grpo": BASELINE_COLORS[1], "moa": BASELINE_COLORS[2],
                      "toy": BASELINE_COLORS[3]}
    assert cell_style(_row(table, "toy"), colors)["color"] == BASELINE_COLORS[3]


def test_an_old_summary_takes_the_registered_method(tmp_path):
    """Runs written before summary.json held method_axes and method_label: the registry says what applies."""
    old = {"method_axes", "method_label"}
    grpo = json.loads((BASELINES / "0_method=grpo" / SUMMARY).read_text())
    assert old <= set(grpo)  # the fixture is new-style: the keys are dropped here
    _write_run(tmp_path / "grpo", {k: v for k, v in grpo.items() if k not in old}, grpo["config"])
    moa = _summary("moa", reward="cooperative", exchange="hidden")
    _write_run(tmp_path / "moa", moa, {"method": {"name": "moa"}})
    runs = load_runs(tmp_path).runs.set_index("method")
    assert tuple(runs.loc["grpo", ["reward", "exchange", "rotation", "init", "cell"]]) == ("-", "-", "-", "-", "GRPO")
    # MoA takes only the exchange: a hidden exchange is its own cell, and the reward is not shown
    assert tuple(runs.loc["moa", ["reward", "exchange", "cell"]]) == ("-", "hidden", "MoA (untrained) · hidden")


def test_an_unknown_method_keeps_every_axis(tmp_path):
    """A method this process never registered: every axis is kept (none pooled), its name is its label, and it
    sorts after the registered methods. What its summary.json recorded still wins."""
    _write_run(tmp_path / "debate", _summary("debate", exchange="hidden"), {"method": {"name": "debate"}})
    panel = _summary("panel", exchange="hidden", method_axes=["reward"], method_label="Panel")
    _write_run(tmp_path / "panel", panel, {"method": {"name": "panel"}})
    # crashed before summary.json: the axes come from the config, every one of them kept
    _write_run(tmp_path / "crashed", None, {"method": {"name": "debate"}, "rotation": {"mode": "fixed"}})
    runs = load_runs([tmp_path, BASELINES]).runs
    assert list(runs["cell"]) == ["self-refine", "GRPO", "debate · hidden", "debate · fixed roles", "Panel"]
    debate = runs[runs["cell"] == "debate · hidden"].iloc[0]
    assert tuple(debate[["reward", "exchange", "rotation", "init"]]) == ("competitive", "hidden", "alternate",
                                                                         "divergent")  # fmt: skip
    panel = runs[runs["method"] == "panel"].iloc[0]
    assert tuple(panel[["reward", "exchange", "rotation", "init"]]) == ("competitive", "-", "-", "-")
    # unknown methods count as baselines: their own colours, outside the 2x2 grid
    colors = baseline_colors(runs["method"])
    assert (colors["debate"], colors["panel"]) == BASELINE_COLORS[3:5]
    # the palette cycles: u3 comes after the 3 registered baselines and u0-u2
    assert baseline_colors([f"u{i}" for i in range(4)])["u3"] == BASELINE_COLORS[6 % len(BASELINE_COLORS)]


def test_several_methods_under_study_name_themselves():
    """Two methods that are not baselines would share labels (``competitive · visible``): each names its method."""

    @register_method
    class Duel(Method):
        name, label, axes, baseline = "duel", "Duel", ("reward", "exchange"), False

    try:
        alone = load_runs(GRID).runs
        assert list(alone["cell"].drop_duplicates()) == CELLS[:4]
        duel = {"method_axes": ["reward", "exchange"], "method_label": "Duel", "rotation": "fixed"}
        records = [RunRecord("duel", summary=_summary("duel", **duel))]
        records += [read_run_dir(d) for d in find_run_dirs(GRID)]
        runs = frames(records).runs
        labels = [f"Agon · {c}" for c in CELLS[:4]] + ["Duel · competitive · visible"]
        assert list(runs["cell"].drop_duplicates()) == labels
        assert runs.iloc[-1]["rotation"] == "-"
    finally:
        del METHODS["duel"]


def test_the_grid_holds_the_method_under_study_at_its_defaults(tmp_path):
    """The 2x2 grid's cooperative/hidden square stays empty: neither an ablation (fixed roles) nor a baseline
    (an unknown method counts as one) fills it."""
    import matplotlib.pyplot as plt

    from analysis.figures import accuracy_figure

    _write_run(tmp_path / "fixed", _summary("agon", reward="cooperative", exchange="hidden", rotation="fixed"), {})
    _write_run(tmp_path / "debate", _summary("debate", reward="cooperative", exchange="hidden"), {})
    _write_run(tmp_path / "agon", _summary("agon", exchange="hidden"), {})
    data = load_runs(tmp_path)
    cells = ["competitive · hidden", "cooperative · hidden · fixed roles", "debate · cooperative · hidden"]
    assert list(data.runs["cell"]) == cells
    fig = accuracy_figure(data, results_table(data))
    # squares row by row: competitive (visible, hidden), cooperative (visible, hidden)
    assert [t.get_text() for t in fig.axes[0].texts] == ["not run", "50.0%\nΔ +25.0 pts\nn=1", "not run", "not run"]
    plt.close(fig)


def test_the_figures_draw_every_cell_with_a_finished_run_and_no_other(data, tmp_path, monkeypatch):
    """make_figures hands each figure the cells to draw. The fixture's cells have one or two finished seeds, except
    self-refine, whose only run crashed: every other cell is drawn, in every figure, and self-refine in none but the
    training curves (whose rows say it is incomplete). The figures' pixels are not compared; what they are given is."""
    from analysis import figures

    drawn: dict[str, list[str]] = {}

    def spy(name: str):
        real = getattr(figures, name)

        def draw(runs, table):
            drawn[name] = list(table["cell"])
            return real(runs, table)

        return draw

    names = ("accuracy_figure", "trace_length_figure", "training_curves_figure", "conversion_figure")
    for name in names:
        monkeypatch.setattr(figures, name, spy(name))
    figures.make_figures(data, tmp_path)
    finished = [c for c in CELLS if c != "self-refine"]
    assert set(drawn) == set(names)
    assert {name: cells for name, cells in drawn.items() if name != "training_curves_figure"} == {
        name: finished for name in names if name != "training_curves_figure"}
    assert drawn["training_curves_figure"] == CELLS


# ---------------------------------------------------------------------------------------------------------------
# values at the start, divergence, and the figures of the claims, colours, recaps and training curves

# per step, how easy the step's batch is (the same seed draws the same problems in every cell): swings far larger
# than any difference between cells
BATCH = [0.0, 0.2, -0.2, 0.15, -0.1, 0.05, 0.1]
# experiment -> (method, its training accuracy above GRPO's on the same batch)
EXPERIMENTS = {"agon": ("agon", 0.02), "hidden": ("agon", 0.01), "grpo": ("grpo", 0.0),
               "grpo_matched": ("grpo", 0.05)}


def _experiment_runs(divergence: bool = False, recap: bool = False) -> list[RunRecord]:
    """Two seeds of agon, hidden, grpo and grpo_matched, as the results sweeps launch them (experiment=...): six
    training steps whose accuracy is GRPO's plus the experiment's offset plus the batch's swing, an evaluation at
    step 0 (traces of 45 tokens) and at step 6 (40 and 41)."""
    records = []
    for experiment, (method, offset) in EXPERIMENTS.items():
        for seed in (0, 1):
            final = {"eval/accuracy": 0.3 + offset + 0.01 * seed, "eval/final_trace_tokens": 40.0 + seed}
            start = {"eval/accuracy": 0.2, "eval/final_trace_tokens": 45.0}
            if divergence and method == "agon":
                final.update({"eval/agree_AB": 0.5, "eval/agree_AA": 0.7, "eval/agree_BB": 0.6 + 0.1 * seed,
                              "eval/divergence": 0.15 + 0.05 * seed})
                start.update({"eval/agree_AB": 0.6, "eval/agree_AA": 0.6, "eval/agree_BB": 0.6,
                              "eval/divergence": 0.0})
            if recap:
                for row, at in ((start, 0.0), (final, 0.1)):
                    row.update({"recap/n_wrong": 10.0, "recap/A/rival": 0.2 + at, "recap/A/correct": 0.5 + at,
                                "recap/A/wrong": 0.3 + at, "recap/A/none": 0.1 + at})
            steps = [{"train/step": t, "train/accuracy": 0.3 + offset + BATCH[t] + 0.01 * seed,
                      "train/final_trace_tokens": 42.0} for t in range(1, 7)]
            summary = _summary(method, **{k: v for k, v in final.items() if not k.startswith("recap/")},
                               experiment=experiment, seed=seed, method_label=METHODS[method].label,
                               exchange="hidden" if experiment == "hidden" else "visible",
                               method_axes=list(METHODS[method].axes))
            summary["eval/accuracy_at_start"] = 0.2
            records.append(RunRecord(run_id=f"{experiment}/{seed}", summary=summary,
                                     overrides=[f"experiment={experiment}", f"seed={seed}"],
                                     metrics=[{"train/step": 0, **start}, *steps, {"train/step": 6, **final}]))
    return records


def test_the_runs_frame_holds_each_eval_metric_at_the_start(data):
    # the fixture's start evaluation: traces of 60 tokens in every run
    complete = data.runs[data.runs["status"] == "complete"]
    assert (complete["eval/final_trace_tokens_at_start"] == 60).all()
    # an untrained run (MoA) evaluates twice at step 0: its start is the first row, not the last (the final)
    twice = [{"train/step": 0, "eval/accuracy": 0.2, "eval/final_trace_tokens": 45.0},
             {"train/step": 0, "eval/accuracy": 0.3, "eval/final_trace_tokens": 46.0}]
    moa = _summary("moa", **{"eval/final_trace_tokens": 46.0})
    # without a start evaluation its one row at step 0 is its final one, which is no start
    once = {**_summary("moa", **{"eval/final_trace_tokens": 46.0}), "eval/accuracy_at_start": None}
    runs = frames([RunRecord("twice", summary=moa, metrics=twice),
                   RunRecord("once", summary=once, metrics=twice[1:])]).runs.set_index("run_id")
    assert runs.loc["twice", "eval/final_trace_tokens_at_start"] == 45.0
    assert math.isnan(runs.loc["once", "eval/final_trace_tokens_at_start"])


def test_divergence_shows_only_when_the_runs_logged_it(data):
    from analysis.figures import divergence_figure

    assert not {"divergence", "agree_AB", "agree_self"} & set(cells_table(data.runs).columns)
    assert "divergence" not in to_markdown(results_table(data))
    assert divergence_figure(data, results_table(data)) is None
    logged = frames(_experiment_runs(divergence=True))
    table = cells_table(logged.runs).set_index("cell")
    # agon: divergence .15 and .20; agree_AB .5; own agreement (.7 + .6) / 2 and (.7 + .7) / 2
    assert table.loc["competitive · visible", "divergence"] == pytest.approx(0.175)
    assert table.loc["competitive · visible", "agree_AB"] == pytest.approx(0.5)
    assert table.loc["competitive · visible", "agree_self"] == pytest.approx(0.675)
    assert math.isnan(table.loc["GRPO", "divergence"])  # one adapter: nothing to agree with
    md = to_markdown(results_table(logged))
    assert "| divergence | agree A·B % | agree self % |" in md and "| +17.5 | 50.0 | 67.5 |" in md
    fig = divergence_figure(logged, results_table(logged))
    assert fig is not None and [t.get_text() for t in fig.legends[0].get_texts()] == [
        "competitive · visible", "competitive · hidden"]


def test_the_forest_plot_has_one_row_per_claim_and_make_figures_writes_it(tmp_path):
    import matplotlib.pyplot as plt

    from analysis.claims import claims_table
    from analysis.figures import claims_forest_figure, make_figures

    data = frames(_experiment_runs())
    claims = claims_table(data.runs)
    assert list(claims["claim"]) == ["Agon (competitive, visible) beats vanilla GRPO",
                                     "Agon beats GRPO at Agon's rollout budget (2N per problem)",
                                     "the hidden exchange is about GRPO",
                                     "Agon's traces get shorter than GRPO's (change since the start)"]
    fig = claims_forest_figure(claims)
    labels = [t.get_text().replace("\n", " ") for ax in fig.axes for t in ax.get_yticklabels()]
    assert labels == list(claims["claim"])
    # accuracy in points and length in tokens: a panel each; the band +-margin on the similar claim's row only
    # (on a "beats" row it would test nothing)
    assert len(fig.axes) == 2 and len(fig.axes[0].collections) == 1
    plt.close(fig)
    paths = make_figures(data, tmp_path)
    assert tmp_path / "claims_forest.png" in paths and (tmp_path / "claims_forest.png").stat().st_size > 10_000
    assert "claims_forest" not in " ".join(p.name for p in make_figures(load_runs(FIXTURES), tmp_path / "f"))


def test_the_two_grpo_cells_have_colours_of_their_own():
    from analysis.figures import accuracy_figure, cell_colors

    data = frames(_experiment_runs())
    table = results_table(data)
    assert list(table["cell"])[-2:] == ["GRPO", "GRPO [experiment=grpo_matched]"]
    colors = cell_colors(data.runs)
    plain, matched = (cell_style(r, colors)["color"] for _, r in table.iloc[-2:].iterrows())
    assert plain == BASELINE_COLORS[1] and matched != plain
    # and so they are drawn: the bars of one figure, in the table's order
    fig = accuracy_figure(data, table)
    bars = [p.get_facecolor() for p in fig.axes[1].patches]
    assert bars[-1] != bars[-2]


def test_training_curves_against_grpo_on_the_same_seed_drop_the_batches_swings():
    """Every step's batch swings all cells' accuracy by up to 20 points; paired with GRPO's curve on the same seed,
    agon's difference is its 2 points at every step, and grpo_matched's its 5."""
    import matplotlib.pyplot as plt

    from analysis.figures import seed_curves, training_curves_figure

    data = frames(_experiment_runs())
    table = results_table(data)
    fig = training_curves_figure(data, table)
    diff_ax = fig.axes[2]  # (a) training accuracy, (b) held-out, (c) minus GRPO, (d) length
    flat = sorted(round(float(np.mean(line.get_ydata())), 6) for line in diff_ax.lines
                  if len(line.get_ydata()) > 2 and np.ptp(line.get_ydata()) < 1e-9)
    assert flat == [1.0, 2.0, 5.0]  # hidden, agon, grpo_matched
    plt.close(fig)
    # each run smoothed: the batch's swing shrinks, and the curves are the seeds' (one column each)
    curves = seed_curves(data.steps, table.set_index("cell").loc["GRPO", "cell_key"], "train/accuracy", 100)
    assert list(curves.columns) == ["0", "1"] and list(curves.index) == [1, 2, 3, 4, 5, 6]
    assert np.ptp(curves["0"]) < np.ptp(np.array(BATCH[1:]) * 100) / 2


def test_the_recap_figure_fits_a_page():
    import matplotlib.pyplot as plt

    from analysis.figures import PAGE_WIDTH, recap_figure

    data = frames(_experiment_runs(recap=True))
    fig = recap_figure(data, results_table(data))
    assert fig.get_size_inches()[0] == PAGE_WIDTH <= 7.5
    # the legend sits outside the panels, and the cells are read at 7 points or more (printed at this size)
    assert fig.legends and all(ax.get_legend() is None for ax in fig.axes)
    assert min(t.get_fontsize() for t in fig.axes[0].get_yticklabels()) >= 7
    assert len(fig.axes[0].get_yticklabels()) == 4
    plt.close(fig)


def test_latent_cells_are_labelled_by_their_span_and_ordered_after_visible_and_hidden():
    """A latent cell's exchange names its span (summary.json's ``latent:recap``; from the config while a run has no
    summary yet), its span override stays out of ``extra``, and the exchange cells come visible, hidden, latent
    recap, latent trace, each with a style of its own."""
    def record(run_id: str, exchange: str | None, *overrides: str, span: str = "recap") -> RunRecord:
        summary = {"method": "agon", "reward": "competitive", "exchange": exchange, "rotation": "alternate",
                   "init": "divergent", "task": "arithmetic", "model": "tiny", "eval/accuracy": 0.5}  # fmt: skip
        config = {"exchange": {"mode": "latent", "span": span}}
        return RunRecord(run_id=run_id, summary=summary if exchange else None, config=config,
                         overrides=list(overrides))

    runs = frames([
        record("t", "latent:trace", "exchange=latent", "exchange.span=trace", "seed=0"),
        record("r", "latent:recap", "exchange=latent", "seed=0"),
        record("h", "hidden", "exchange=hidden", "seed=0"),
        record("v", "visible", "seed=0"),
        # sweeps/grid_exchange.yaml's cells: its own group's option names nothing the exchange does not
        record("swept", "latent:trace", "exchange_cell=latent_trace", "seed=1"),
        record("running", None, "exchange=latent", "exchange.span=trace", "seed=1", span="trace"),
    ]).runs.set_index("run_id")  # fmt: skip
    assert runs.loc["t", "cell"] == "competitive · latent:trace"
    assert runs.loc["r", "cell"] == "competitive · latent:recap"
    assert runs.loc["running", "exchange"] == "latent:trace" and runs.loc["running", "extra"] == ""
    assert runs.loc["swept", "cell_key"] == runs.loc["t", "cell_key"] and runs.loc["swept", "extra"] == ""
    ordered = sorted(["t", "r", "h", "v"], key=lambda i: cell_sort_key(runs.loc[i]))
    assert ordered == ["v", "h", "r", "t"]
    styles = [cell_style(runs.loc[i], baseline_colors(runs.reset_index())) for i in ordered]
    assert len({(s["hatch"], str(s["linestyle"])) for s in styles}) == 4


def test_the_held_out_panel_puts_a_run_on_its_smallest_evaluation_design():
    """Evaluations at steps 0 and 100 of 3 problems x 2 samples and one at 50 of 2 x 1: the panel shows the first
    and last on the 2 x 1 design, recomputed from their rows (the first 2 problems' sample 0), not as logged; a
    run without rows stays as logged."""
    from analysis.figures import eval_points

    steps = pd.DataFrame({"run_id": "r", "cell_key": "agon", "seed": 0, "train/step": [0, 50, 100],
                          "eval/accuracy": [0.5, 0.5, 0.5], "eval/n_problems": [3, 2, 3], "eval/samples": [2, 1, 2]})
    runs = pd.DataFrame({"run_id": ["r"], "cell_key": ["agon"]})
    rows = pd.DataFrame({"run_id": "r", "order": "A", "stage": "final", "step": [0] * 6 + [100] * 6,
                         "problem_id": ["p1", "p1", "p2", "p2", "p3", "p3"] * 2, "sample": [0, 1] * 6,
                         "correct": [1, 0, 0, 0, 1, 1] + [1, 0, 1, 0, 0, 0]})
    points = eval_points(steps, "agon", runs=runs, evals=rows)
    assert list(points.index) == [0, 50, 100]
    assert list(points.iloc[:, 0]) == [pytest.approx(50.0), pytest.approx(50.0), pytest.approx(100.0)]
    assert list(eval_points(steps, "agon").iloc[:, 0]) == [50.0, 50.0, 50.0]
