"""The committed results: docs/results.md's tables are what the packed runs in results/ give today.

A change to the packed files, to the analysis code or to the page that makes them disagree fails here, so the
page cannot drift from the runs it reports. Figures are not compared (their bytes depend on matplotlib's version);
they are drawn from the same tables.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import load_runs
from analysis.claims import claims_markdown, claims_table
from analysis.tables import write_tables

REPO = Path(__file__).resolve().parents[2]
# results/runs/ is where sweeps write on this machine (ignored by git); a *_pilot directory is a pilot's runs
PACKED = sorted(p.name for p in (REPO / "results").iterdir() if p.is_dir() and p.name != "runs") \
    if (REPO / "results").is_dir() else []
TASKS = [name for name in PACKED if not name.endswith("_pilot")]


def test_every_packed_task_has_its_figures_and_a_section_of_the_page():
    assert TASKS == ["arithmetic_hard", "products"] and PACKED == [*TASKS, "target_sum_pilot"]
    page = (REPO / "docs" / "results.md").read_text()
    for task in TASKS:
        for figure in ("accuracy_grid", "claims_forest", "recap_diagnostic", "training_curves"):
            assert f"results/{task}/{figure}.png" in page, (task, figure)
            assert (REPO / "docs" / "results" / task / f"{figure}.png").is_file(), (task, figure)


@pytest.mark.parametrize("task", TASKS)
def test_the_committed_tables_are_what_the_packed_runs_give(task, tmp_path):
    data = load_runs(REPO / "results" / task)
    # every cell of the design, 3 seeds each, each run finished
    assert len(data.runs) == 30 and (data.runs["status"] == "complete").all()
    assert data.runs.groupby("cell").size().eq(3).all() and data.runs["cell"].nunique() == 10
    write_tables(data, tmp_path)
    (tmp_path / "claims.md").write_text(claims_markdown(claims_table(data.runs)))
    committed = REPO / "docs" / "results" / task
    page = (REPO / "docs" / "results.md").read_text()
    for name in ("table.md", "diagnostic.md", "claims.md"):
        assert (tmp_path / name).read_text() == (committed / name).read_text(), f"docs/results/{task}/{name}"
    # the page quotes the tables as drawn: the results table (less its caption) and the claims, row for row
    table_rows = (tmp_path / "table.md").read_text().split("\n\n", 1)[1].strip()
    assert table_rows in page
    assert (tmp_path / "claims.md").read_text().strip() in page



def test_the_target_sum_pilot_table_is_what_its_packed_runs_give():
    """docs/results.md's target-sum pilot: each row of its curve table, recomputed from the packed metrics."""
    data = load_runs(REPO / "results" / "target_sum_pilot")
    method = data.runs.set_index("run_id")["method"]
    points = data.steps.dropna(subset=["eval/accuracy"])
    grpo, agon = ({int(r["train/step"]): r for _, r in points[points["run_id"].map(method) == m].iterrows()}
                  for m in ("grpo", "agon"))
    assert max(grpo) == 800 and max(agon) == 400
    agon_columns = ("eval/accuracy", "eval/solo_acc_A", "eval/solo_acc_B", "eval/conversion_rate",
                    "eval/regression_rate", "eval/agree_AB")
    page = (REPO / "docs" / "results.md").read_text()
    for step, g in sorted(grpo.items()):
        cells = [f"{100 * g['eval/accuracy']:.1f}"]
        if step in agon:
            a = agon[step]
            cells += [f"{100 * a[k]:.1f}" for k in agon_columns] + [f"{a['eval/divergence']:+.3f}"]
        else:
            cells += ["-"] * (len(agon_columns) + 1)
        row = f"| {step} | " + " | ".join(cells) + " |"
        assert row in page, row
