"""The committed results: docs/results.md's tables are what the packed runs in results/ give today.

A change to the packed files, to the analysis code or to the page that makes them disagree fails here, so the
page cannot drift from the runs it reports. Figures are not compared (their bytes depend on matplotlib's version);
they are drawn from the same tables.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import load_runs
from analysis.claims import CLAIMS, claims_markdown, claims_table
from analysis.tables import write_tables

REPO = Path(__file__).resolve().parents[2]
# results/runs/ is where sweeps write on this machine (ignored by git); a *_pilot directory is a pilot's runs
PACKED = sorted(p.name for p in (REPO / "results").iterdir() if p.is_dir() and p.name != "runs") \
    if (REPO / "results").is_dir() else []
TASKS = [name for name in PACKED if not name.endswith("_pilot")]
# each packed grid's cells, 3 seeds each: the paper's design on a task, or the exchange ablation (its claims name
# cells by their exchange, analysis/claims.yaml)
CELLS = {"arithmetic_hard": 10, "products": 10, "exchange": 4}


def test_every_packed_task_has_its_figures_and_a_section_of_the_page():
    assert TASKS == sorted(CELLS) and PACKED == [*TASKS, "target_sum_pilot"]
    page = (REPO / "docs" / "results.md").read_text()
    for task in TASKS:
        for figure in ("accuracy_grid", "claims_forest", "recap_diagnostic", "training_curves"):
            assert f"results/{task}/{figure}.png" in page, (task, figure)
            assert (REPO / "docs" / "results" / task / f"{figure}.png").is_file(), (task, figure)


@pytest.mark.parametrize("task", TASKS)
def test_the_committed_tables_are_what_the_packed_runs_give(task, tmp_path):
    data = load_runs(REPO / "results" / task)
    # every cell of the grid, 3 seeds each, each run finished
    assert len(data.runs) == 3 * CELLS[task] and (data.runs["status"] == "complete").all()
    assert data.runs.groupby("cell").size().eq(3).all() and data.runs["cell"].nunique() == CELLS[task]
    write_tables(data, tmp_path)
    claims = claims_table(data.runs)
    assert not claims.empty
    (tmp_path / "claims.md").write_text(claims_markdown(claims))
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


def test_each_grid_is_judged_on_its_own_claims_and_the_exchange_page_quotes_its_prefix_diagnostic():
    """The paper's claims (cells named by preset) are put to the paper's design and the future-work ones (cells
    named by exchange) to the exchange sweep, never across: axis values are matched among runs launched without a
    preset only. The latent-exchange section quotes the diagnostic's block of prefix conditions as drawn."""
    by_preset = {c.text for c in CLAIMS if "=" not in c.left + c.right}
    for task in TASKS:
        judged = set(claims_table(load_runs(REPO / "results" / task).runs)["claim"])
        assert judged == ({c.text for c in CLAIMS} - by_preset if task == "exchange" else by_preset), task
    page = (REPO / "docs" / "results.md").read_text()
    diagnostic = (REPO / "docs" / "results" / "exchange" / "diagnostic.md").read_text()
    prefix_block = diagnostic.split("as key/value prefixes")[1].split("\n\n")[1].strip()
    assert prefix_block.count("latent:") == 6 and prefix_block in page
    assert diagnostic.split("\n\n")[0].strip() in page  # the text-recap block of the same cells
