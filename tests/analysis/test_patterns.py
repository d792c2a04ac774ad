"""Target sum's chance level and per-pattern table (analysis/patterns.py), on problems counted by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.load import Runs
from analysis.patterns import chance_table, pattern_table, solutions, write_patterns

# 7+3-5+2 and 7-3+5-2 reach 7 (two solutions); 1+1+1 alone reaches 3; 2-1-1 alone reaches 0
TWO, PLUS, MINUS = "7?3?5?2=7", "1?1?1=3", "2?1?1=0"


def test_solutions_and_chance_are_counted_over_every_sign_pattern():
    assert solutions(TWO) == (4, ["+-+", "-+-"])
    assert solutions(PLUS) == (3, ["++"]) and solutions(MINUS) == (3, ["--"])
    chance = chance_table([TWO, PLUS, MINUS, PLUS]).set_index("operands")  # a problem counts once
    assert chance.loc[3, "problems"] == 2 and chance.loc[3, "chance"] == pytest.approx(0.25)
    assert chance.loc[4, "chance"] == pytest.approx(2 / 8)
    assert chance.loc["all", "problems"] == 3 and chance.loc["all", "chance"] == pytest.approx(0.25)
    assert list(chance_table([PLUS])["operands"]) == [3]  # one operand count: no "all" row


def rows(run_id: str, orders: dict[str, dict[str, list[int]]]) -> list[dict]:
    """Final-evaluation rows: order -> stage -> correct per problem (PLUS, MINUS, TWO), one sample each."""
    return [{"run_id": run_id, "step": 10, "phase": "final", "order": order, "stage": stage, "problem_id": pid,
             "sample": 0, "correct": c}
            for order, stages in orders.items() for stage, correct in stages.items()
            for pid, c in zip((PLUS, MINUS, TWO), correct)]


def test_each_arm_is_the_mean_of_its_runs_by_the_pattern_of_a_single_solution():
    """Agon's two runs: the cascade right on `++` in 4 of 4 rounds and on `--` in 1 of 4 (its drafts 2 and 0);
    GRPO's run right on `++` only. The two-solution problem is left out."""
    cascade = {"A>B": {"draft": [1, 0, 0], "final": [1, 1, 1]}, "B>A": {"draft": [0, 0, 0], "final": [1, 0, 1]}}
    other = {"A>B": {"draft": [1, 0, 1], "final": [1, 0, 1]}, "B>A": {"draft": [0, 0, 1], "final": [1, 0, 1]}}
    evals = pd.DataFrame(rows("a0", cascade) + rows("a1", other) + rows("g0", {"A": {"final": [1, 0, 0]}}))
    runs = pd.DataFrame({"run_id": ["a0", "a1", "g0"], "cell_key": ["agon", "agon", "grpo"],
                         "cell": ["Agon", "Agon", "GRPO"], "task": "target_sum", "status": "complete"})
    table = pattern_table(runs, evals).set_index("pattern")
    assert list(table.index) == ["++", "--"] and (table["problems"] == 1).all()
    assert (table["chance"] == 0.25).all()
    assert table.loc["++", "agon"] == 1.0 and table.loc["--", "agon"] == pytest.approx((1 / 2 + 0) / 2)
    assert table.loc["++", "agon drafts"] == pytest.approx((1 / 2 + 1 / 2) / 2) and table.loc["--", "agon drafts"] == 0
    assert table.loc["++", "grpo"] == 1.0 and table.loc["--", "grpo"] == 0.0 and "grpo drafts" not in table


def test_make_figures_writes_the_tables_for_target_sum_runs_only(tmp_path):
    evals = pd.DataFrame(rows("g0", {"A": {"final": [1, 0, 0]}}))
    runs = pd.DataFrame({"run_id": ["g0"], "cell_key": ["grpo"], "cell": ["GRPO"], "task": "target_sum",
                         "status": "complete"})
    paths = write_patterns(Runs(runs=runs, steps=pd.DataFrame(), evals=evals), tmp_path)
    page = paths[0].read_text()
    assert "| 3 | 2 | 25.0 |" in page and "| 4 | 1 | 25.0 |" in page  # chance by operand count
    assert "| 3 | `++` | 1 | 25.0 | 100.0 |" in page and "| 3 | `--` | 1 | 25.0 | 0.0 |" in page
    assert list(pd.read_csv(paths[1]).columns) == ["operands", "pattern", "problems", "chance", "GRPO"]
    # one operand count, as in the study (4 operands): its row is not written as a float
    one_count = write_patterns(Runs(runs=runs, steps=pd.DataFrame(), evals=evals[evals["problem_id"] != TWO]),
                               tmp_path / "one")[0].read_text()
    assert "| 3 | 2 | 25.0 |" in one_count and "3.0" not in one_count
    other = Runs(runs=runs.assign(task="arithmetic"), steps=pd.DataFrame(), evals=evals)
    assert write_patterns(other, tmp_path / "none") == [] and not (tmp_path / "none").exists()
