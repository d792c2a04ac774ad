"""analysis.claims: Welch's interval, the verdicts, and the table built from a runs frame."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.claims import SIMILAR_WITHIN, claims_markdown, claims_table, verdict, welch_interval


def test_welch_interval_matches_scipy():
    a, b = np.array([0.50, 0.55, 0.52]), np.array([0.40, 0.47, 0.38, 0.44])
    diff, low, high = welch_interval(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(a.mean() - b.mean())
    assert (low, high) == (pytest.approx(ref.low), pytest.approx(ref.high))
    assert math.isnan(welch_interval(a, b[:1])[1])


def test_verdicts():
    assert verdict("greater", 0.01, 0.2) == "holds" and verdict("greater", -0.2, -0.01) == "reversed"
    assert verdict("greater", -0.01, 0.2) == "unresolved"
    assert verdict("smaller", -300, -10) == "holds" and verdict("smaller", 10, 300) == "reversed"
    assert verdict("similar", -SIMILAR_WITHIN / 2, SIMILAR_WITHIN / 2) == "holds"
    assert verdict("similar", -0.2, 0.2) == "unresolved" and verdict("similar", 0.01, 0.2) == "differs"
    assert verdict("greater", math.nan, math.nan) == "too few seeds"


def test_the_table_names_each_claim_whose_cells_ran():
    rows = [("agon", s, acc, tok) for s, acc, tok in ((0, 0.60, 40), (1, 0.62, 42), (2, 0.61, 41))]
    rows += [("grpo", s, acc, tok) for s, acc, tok in ((0, 0.40, 60), (1, 0.45, 62), (2, 0.41, 61))]
    rows += [("fixed_roles", s, acc, 40) for s, acc in ((0, 0.55), (1, 0.70), (2, 0.62))]
    runs = pd.DataFrame(rows, columns=["experiment", "seed", "eval/accuracy", "eval/final_trace_tokens"])
    runs["status"] = "complete"
    table = claims_table(runs).set_index("claim")
    assert table.loc["Agon (competitive, visible) beats vanilla GRPO", "verdict"] == "holds"
    assert table.loc["alternating roles beat fixed roles", "verdict"] == "unresolved"
    assert table.loc["Agon's final traces are shorter than GRPO's", "verdict"] == "holds"
    # cells that did not run (cooperative, hidden, ...) have no row
    assert len(table) == 3
    md = claims_markdown(claims_table(runs))
    assert "| Agon (competitive, visible) beats vanilla GRPO | agon vs grpo | 3 vs 3 | 61.0 vs 42.0 | +19.0 [" in md
    assert " tok | holds |" in md


def test_an_interval_that_ends_at_zero_holds_zero_and_one_at_the_similar_bound_is_within_it():
    """The interval is closed: one that ends exactly at 0 holds 0, so no direction is shown ("unresolved"), and
    one that reaches exactly SIMILAR_WITHIN on each side is within it ("about equal" holds)."""
    for direction in ("greater", "smaller", "similar"):
        assert verdict(direction, 0.0, 0.2) == "unresolved", direction
        assert verdict(direction, -0.2, 0.0) == "unresolved", direction
    assert verdict("similar", -SIMILAR_WITHIN, SIMILAR_WITHIN) == "holds"
