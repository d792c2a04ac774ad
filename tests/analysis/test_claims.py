"""analysis.claims: the intervals (Welch, pooled, family-wise), the margin of "about equal", claims on the change
since the start, the verdicts, and the table and Markdown built from a runs frame."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.claims import (
    CLAIMS,
    RULES,
    Claim,
    _digits,
    bonferroni_level,
    claims_markdown,
    claims_table,
    pooled_interval,
    pooled_sd,
    verdict,
    welch_interval,
)

TRACE = "Agon's traces get shorter than GRPO's (change since the start)"


def runs_frame(cells: dict[str, tuple[str, list[float], list[float]]], **extra: dict[str, list[float]]
               ) -> pd.DataFrame:
    """A runs frame by hand: experiment -> (method, final accuracies, accuracies at start), one run per value;
    ``extra``: more columns, experiment -> values in the same order."""
    rows = []
    for experiment, (method, final, start) in cells.items():
        for seed, (acc, acc0) in enumerate(zip(final, start)):
            row = {"experiment": experiment, "method": method, "seed": seed, "status": "complete",
                   "eval/accuracy": acc, "eval/accuracy_at_start": acc0}
            row.update({column: values[experiment][seed] for column, values in extra.items() if experiment in values})
            rows.append(row)
    return pd.DataFrame(rows)


def test_welch_interval_matches_scipy():
    a, b = np.array([0.50, 0.55, 0.52]), np.array([0.40, 0.47, 0.38, 0.44])
    diff, low, high = welch_interval(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(a.mean() - b.mean())
    assert (low, high) == (pytest.approx(ref.low), pytest.approx(ref.high))
    assert math.isnan(welch_interval(a, b[:1])[1])
    # two seeds a side is the fewest that give an interval
    ref = stats.ttest_ind(a[:2], b[:2], equal_var=False).confidence_interval(0.95)
    assert welch_interval(a[:2], b[:2])[1:] == (pytest.approx(ref.low), pytest.approx(ref.high))


def test_a_length_claims_numbers_get_the_decimals_its_largest_needs():
    """Two decimals below 10 tokens, one below 1,000, none above; a missing number (nan) has no say."""
    tokens = "eval/final_trace_tokens"
    assert [_digits([v], tokens) for v in (5.0, 50.0, 5000.0)] == [2, 1, 0]
    assert _digits([math.nan, 5.0], tokens) == _digits([5.0, math.nan], tokens) == 2
    assert _digits([5000.0], "eval/accuracy") == 1  # points: always one


def test_pooled_interval_by_hand():
    """Three cells: sums of squares .0008 (sd .02), .0018 and .0024 over df 2 + 1 + 2 = 5, so s = sqrt(.005 / 5)
    = .031623; the first two cells: .52 - .43 = .09 +- t(5) 2.570582 x .031623 x sqrt(1/3 + 1/2)."""
    a, b, c = np.array([0.50, 0.52, 0.54]), np.array([0.40, 0.46]), np.array([0.30, 0.30, 0.36])
    sd, df = pooled_sd([a, b, c, np.array([0.9])])  # a cell of one seed adds nothing
    assert (sd, df) == (pytest.approx(math.sqrt(0.001)), 5)
    diff, low, high = pooled_interval(a, b, sd, df)
    half = 2.570582 * math.sqrt(0.001) * math.sqrt(1 / 3 + 1 / 2)
    assert (diff, low, high) == (pytest.approx(0.09), pytest.approx(0.09 - half, abs=1e-6),
                                 pytest.approx(0.09 + half, abs=1e-6))
    # pooled over the two compared cells alone it is Student's equal-variance interval
    ref = stats.ttest_ind(a, b, equal_var=True).confidence_interval(0.95)
    _, low, high = pooled_interval(a, b, *pooled_sd([a, b]))
    assert (low, high) == (pytest.approx(ref.low), pytest.approx(ref.high))
    # a cell of one seed still gets an interval from the others' SD; no pooled SD, no interval
    assert not math.isnan(pooled_interval(a, np.array([0.4]), sd, df)[1])
    assert math.isnan(pooled_interval(a, b, *pooled_sd([np.array([0.5])]))[1])


def test_bonferroni_level():
    assert bonferroni_level(0.95, 10) == pytest.approx(0.995)
    assert bonferroni_level(0.95, 1) == pytest.approx(0.95)
    assert bonferroni_level(0.90, 4) == pytest.approx(0.975)


def test_verdicts():
    assert verdict("greater", 0.01, 0.2) == "holds" and verdict("greater", -0.2, -0.01) == "reversed"
    assert verdict("greater", -0.01, 0.2) == "unresolved"
    assert verdict("smaller", -300, -10) == "holds" and verdict("smaller", 10, 300) == "reversed"
    assert verdict("similar", -0.01, 0.01, margin=0.015) == "holds"
    assert verdict("similar", -0.2, 0.2, margin=0.015) == "unresolved"
    assert verdict("similar", 0.01, 0.2, margin=0.015) == "differs"
    # within the margin it holds even where it excludes 0: smaller than the margin is what "about equal" means
    assert verdict("similar", 0.005, 0.01, margin=0.015) == "holds"
    assert verdict("similar", -0.01, 0.01) == "no margin"  # no margin given: never "holds"
    assert verdict("greater", math.nan, math.nan) == "too few seeds"


def test_an_interval_that_ends_at_zero_holds_zero_and_one_at_the_margin_is_within_it():
    """Intervals are closed: one that ends exactly at 0 holds 0, so no direction is shown ("unresolved"), and one
    that reaches exactly the margin on each side is within it ("about equal" holds)."""
    for direction in ("greater", "smaller", "similar"):
        assert verdict(direction, 0.0, 0.2, margin=0.1) == "unresolved", direction
        assert verdict(direction, -0.2, 0.0, margin=0.1) == "unresolved", direction
    assert verdict("similar", -0.1, 0.1, margin=0.1) == "holds"


def test_about_equal_is_judged_by_half_of_grpos_gain_not_five_points():
    """GRPO gains 3 points (.20 -> .23 on each seed), so the margin is 1.5 points. hidden - grpo is +1.5 points with
    an interval inside +-5 points but not inside +-1.5: not "holds"."""
    assert RULES.reference == "grpo" and RULES.fraction == 0.5 and RULES.margin_metric == "eval/accuracy"
    cells = {"grpo": ("grpo", [0.225, 0.23, 0.235], [0.20] * 3),
             "hidden": ("agon", [0.24, 0.245, 0.25], [0.20] * 3)}
    table = claims_table(runs_frame(cells)).set_index("claim")
    row = table.loc["the hidden exchange is about GRPO"]
    assert row["rl_effect"] == pytest.approx(0.03) and row["margin"] == pytest.approx(0.015)
    assert -0.05 <= row["ci_low"] and row["ci_high"] <= 0.05  # "about equal" by the old rule of 5 points
    assert row["ci_high"] > 0.015 and row["verdict"] != "holds"
    # the same difference with GRPO gaining 10 points: the margin is 5 points and the claim holds
    cells["grpo"] = ("grpo", [0.225, 0.23, 0.235], [0.13] * 3)
    row = claims_table(runs_frame(cells)).set_index("claim").loc["the hidden exchange is about GRPO"]
    assert row["margin"] == pytest.approx(0.05) and row["verdict"] == "holds"


def test_without_a_reference_gain_about_equal_has_no_margin():
    claims = [Claim("a is about b", "a", "b", "similar"), Claim("a beats b", "a", "b", "greater")]
    cells = {"a": ("agon", [0.30, 0.31, 0.32], [0.2] * 3), "b": ("agon", [0.30, 0.31, 0.30], [0.2] * 3)}
    table = claims_table(runs_frame(cells), claims=claims).set_index("claim")
    assert table.loc["a is about b", "verdict"] == "no margin: no grpo cell"
    assert table.loc["a is about b", "fw_verdict"] == "no margin: no grpo cell"
    assert table.loc["a beats b", "verdict"] == "unresolved"  # the margin is for "about equal" only
    cells["grpo"] = ("grpo", [0.20, 0.19, 0.21], [0.21] * 3)  # GRPO lost 1 point
    table = claims_table(runs_frame(cells), claims=claims).set_index("claim")
    assert table.loc["a is about b", "verdict"] == "no margin: grpo did not gain"
    assert "no margin" in claims_markdown(claims_table(runs_frame(cells), claims=claims))
    # runs without a start evaluation (W&B, old runs) give no gain, and the verdict says why
    no_start = runs_frame(cells).drop(columns=["eval/accuracy_at_start"])
    assert claims_table(no_start, claims=claims).iloc[0]["verdict"] == "no margin: grpo has no value at the start"
    # a similar claim on another metric than the margin's has none either (it would be in other units)
    other = [Claim("a is about b in length", "a", "b", "similar", metric="eval/final_trace_tokens")]
    tokens = {"a": [40.0, 41.0, 40.5], "b": [40.0, 40.2, 40.4], "grpo": [30.0, 31.0, 30.0]}
    cells["grpo"] = ("grpo", [0.25, 0.26, 0.27], [0.2] * 3)
    table = claims_table(runs_frame(cells, **{"eval/final_trace_tokens": tokens}), claims=other)
    assert table.iloc[0]["verdict"] == "no margin: the margin is in eval/accuracy"


def test_trace_length_is_judged_on_its_change_from_the_start():
    """Agon's traces start 7 tokens longer than GRPO's (the prompt differs) and shorten by 2 while GRPO's grow by
    0.1: the finals say "reversed" (44 > 38.9), the change says "holds"."""
    cells = {"agon": ("agon", [0.3] * 3, [0.2] * 3), "grpo": ("grpo", [0.3] * 3, [0.2] * 3)}
    final = {"agon": [44.0, 44.0, 44.0], "grpo": [38.9, 38.9, 38.9]}
    start = {"agon": [46.0, 45.9, 46.1], "grpo": [38.8, 38.9, 38.7]}
    runs = runs_frame(cells, **{"eval/final_trace_tokens": final, "eval/final_trace_tokens_at_start": start})
    row = claims_table(runs).set_index("claim").loc[TRACE]
    assert row["measure"] == "change" and row["verdict"] == "holds"
    assert (row["left_mean"], row["right_mean"]) == (pytest.approx(-2.0), pytest.approx(0.1))
    assert row["difference"] == pytest.approx(-2.1)
    # judged on finals (what the table did before), the same runs read "reversed"
    on_finals = [Claim("finals", "agon", "grpo", "smaller", metric="eval/final_trace_tokens")]
    assert claims_table(runs, claims=on_finals).iloc[0]["verdict"] == "reversed"
    md = claims_markdown(claims_table(runs))
    assert f"| {TRACE} | agon vs grpo | 3 vs 3 | change -2.00 vs +0.10 tok | -2.10 [" in md


def test_a_change_claim_without_a_start_value_is_not_testable():
    cells = {"agon": ("agon", [0.3] * 3, [0.2] * 3), "grpo": ("grpo", [0.3] * 3, [0.2] * 3)}
    final = {"agon": [44.0, 43.9, 44.1], "grpo": [38.9, 39.0, 38.8]}
    start = {"agon": [46.0, math.nan, 46.1], "grpo": [38.8, 38.9, 38.7]}
    runs = runs_frame(cells, **{"eval/final_trace_tokens": final, "eval/final_trace_tokens_at_start": start})
    table = claims_table(runs).set_index("claim")
    row = table.loc[TRACE]
    assert row["verdict"] == "not testable: 1 run(s) have no eval/final_trace_tokens at the start"
    assert math.isnan(row["difference"]) and math.isnan(row["ci_low"])  # no silent fall back to the finals
    # it is not counted among the claims put to the task: only agon vs grpo on accuracy is
    assert list(table["claims"]) == [1, 1]
    runs = runs.drop(columns=["eval/final_trace_tokens_at_start"])  # no start values at all (W&B, old runs)
    assert claims_table(runs).set_index("claim").loc[TRACE, "verdict"].startswith("not testable: 6 run(s)")


def test_the_pool_is_every_trained_cell_and_not_moa():
    """The SD is pooled over the trained cells, compared or not (cooperative_hidden is in no claim); MoA, which
    does not train, stays out however its seeds spread."""
    base = {"agon": ("agon", [0.30, 0.32, 0.34], [0.2] * 3), "grpo": ("grpo", [0.28, 0.30, 0.29], [0.2] * 3),
            "moa": ("moa", [0.10, 0.30, 0.50], [0.2] * 3)}
    table = claims_table(runs_frame(base)).set_index("claim")
    # sums of squares .0008 + .0002 over df 4; MoA's .08 would make it sqrt(.081 / 6)
    assert table["pooled_sd"].iloc[0] == pytest.approx(math.sqrt(0.001 / 4))
    assert table["pooled_df"].iloc[0] == 4 and table["pooled_cells"].iloc[0] == 2
    more = {**base, "cooperative_hidden": ("agon", [0.20, 0.26, 0.32], [0.2] * 3)}
    again = claims_table(runs_frame(more)).set_index("claim")
    assert again["pooled_sd"].iloc[0] == pytest.approx(math.sqrt((0.001 + 0.0072) / 6))
    row = again.loc["Agon beats the untrained cascade (MoA)"]
    half = stats.t.ppf(0.975, 6) * math.sqrt(0.0082 / 6) * math.sqrt(2 / 3)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(0.02 - half), pytest.approx(0.02 + half))
    # Welch's interval uses the two cells' own seeds, MoA's wide spread included
    welch = welch_interval(np.array([0.30, 0.32, 0.34]), np.array([0.10, 0.30, 0.50]))
    assert (row["welch_low"], row["welch_high"]) == (pytest.approx(welch[1]), pytest.approx(welch[2]))


def test_the_family_wise_interval_is_at_bonferronis_level_for_the_claims_put_to_the_task():
    cells = {"agon": ("agon", [0.30, 0.32, 0.34], [0.2] * 3), "grpo": ("grpo", [0.20, 0.22, 0.21], [0.2] * 3),
             "cooperative": ("agon", [0.25, 0.27, 0.26], [0.2] * 3), "moa": ("moa", [0.2] * 3, [0.2] * 3)}
    table = claims_table(runs_frame(cells)).set_index("claim")
    # agon vs grpo, agon vs cooperative, agon vs moa: k = 3
    assert list(table["claims"]) == [3, 3, 3] and table["fw_level"].iloc[0] == pytest.approx(1 - 0.05 / 3)
    row = table.loc["Agon (competitive, visible) beats vanilla GRPO"]
    df = row["pooled_df"]
    ratio = (row["fw_high"] - row["fw_low"]) / (row["ci_high"] - row["ci_low"])
    assert ratio == pytest.approx(stats.t.ppf(1 - 0.05 / 6, df) / stats.t.ppf(0.975, df))
    # a claim can hold at 95% and not family-wise: s = sqrt(.0012 / 6) = .014; agon - cooperative = 3.3 points
    # lies between the 95% half-width (2.8 points) and the 98.3% one (3.8)
    assert table.loc["competitive beats cooperative (visible exchange)", "verdict"] == "holds"
    near = {**cells, "cooperative": ("agon", [0.277, 0.297, 0.287], [0.2] * 3)}
    row = claims_table(runs_frame(near)).set_index("claim").loc["competitive beats cooperative (visible exchange)"]
    assert row["ci_low"] > 0 > row["fw_low"]
    assert (row["verdict"], row["fw_verdict"]) == ("holds", "unresolved")


def test_the_table_names_each_claim_whose_cells_ran():
    rows = [("agon", "agon", s, acc, tok) for s, acc, tok in ((0, 0.60, 40), (1, 0.62, 42), (2, 0.61, 41))]
    rows += [("grpo", "grpo", s, acc, tok) for s, acc, tok in ((0, 0.40, 60), (1, 0.45, 62), (2, 0.41, 61))]
    rows += [("fixed_roles", "agon", s, acc, 40) for s, acc in ((0, 0.55), (1, 0.70), (2, 0.62))]
    runs = pd.DataFrame(rows, columns=["experiment", "method", "seed", "eval/accuracy", "eval/final_trace_tokens"])
    runs["status"] = "complete"
    runs["eval/accuracy_at_start"] = 0.3
    runs["eval/final_trace_tokens_at_start"] = [50, 50, 50, 60, 61, 60, 50, 50, 50]
    table = claims_table(runs).set_index("claim")
    assert table.loc["Agon (competitive, visible) beats vanilla GRPO", "verdict"] == "holds"
    assert table.loc["alternating roles beat fixed roles", "verdict"] == "unresolved"
    assert table.loc[TRACE, "verdict"] == "holds"
    # cells that did not run (cooperative, hidden, ...) have no row
    assert len(table) == 3 and set(table["claims"]) == {3}
    md = claims_markdown(claims_table(runs))
    assert "| Agon (competitive, visible) beats vanilla GRPO | agon vs grpo | 3 vs 3 | 61.0 vs 42.0 | +19.0 [" in md
    assert " tok | holds |" in md
    assert "- Multiplicity: 3 claims put to this task; the family-wise interval is at 1 - 0.05/3 = 98.33%" in md
    assert "(every experiment but the untrained MoA)" not in md and "(every cell of the grid)" in md
    # no "about equal" claim among them: no margin line
    assert "About equal" not in md
    hidden = pd.DataFrame({"experiment": "hidden", "method": "agon", "seed": [0, 1, 2], "status": "complete",
                           "eval/accuracy": [0.43, 0.44, 0.42], "eval/accuracy_at_start": 0.3})
    md = claims_markdown(claims_table(pd.concat([runs, hidden], ignore_index=True)))
    assert "- Multiplicity: 4 claims put to this task" in md
    # GRPO gained 12.0 points on average: the margin is 6.0
    assert "- About equal: within ±6.0 points, half of grpo's gain in eval/accuracy" in md
    assert "(12.0 points, mean over seeds)" in md


def test_claims_of_several_settings_are_judged_apart():
    one = runs_frame({"agon": ("agon", [0.30, 0.32, 0.34], [0.2] * 3),
                      "grpo": ("grpo", [0.20, 0.22, 0.21], [0.2] * 3)}).assign(task="a", model="m")
    two = runs_frame({"agon": ("agon", [0.60, 0.62, 0.64], [0.2] * 3),
                      "grpo": ("grpo", [0.70, 0.72, 0.71], [0.2] * 3)}).assign(task="b", model="m")
    table = claims_table(pd.concat([one, two], ignore_index=True))
    assert list(table["setting"]) == ["a, m", "b, m"]
    assert list(table["verdict"]) == ["holds", "reversed"]
    assert "**a, m**" in claims_markdown(table) and "**b, m**" in claims_markdown(table)


def test_every_claim_names_cells_and_a_measure_the_table_knows():
    for claim in CLAIMS:
        assert claim.direction in ("greater", "smaller", "similar") and claim.measure in ("final", "change")
    assert sum(c.direction == "similar" for c in CLAIMS) == 1
    assert next(c for c in CLAIMS if c.metric == "eval/final_trace_tokens").measure == "change"


def exchange_frame(cells: dict[str, list[float]]) -> pd.DataFrame:
    """Runs as analysis.load gives them for a sweep over the exchange: no experiment, a ``cell_key`` per cell;
    ``cells``: exchange -> final accuracies (start .10), or "exchange@rotation" for another rotation."""
    rows = []
    for name, finals in cells.items():
        exchange, _, rotation = name.partition("@")
        rotation = rotation or "alternate"
        for seed, acc in enumerate(finals):
            rows.append({"experiment": None, "method": "agon", "exchange": exchange, "rotation": rotation,
                         "cell_key": f"method=agon|exchange={exchange}|rotation={rotation}", "seed": seed,
                         "status": "complete", "eval/accuracy": acc, "eval/accuracy_at_start": 0.10})
    return pd.DataFrame(rows)


def test_axis_values_name_the_cells_of_a_sweep_over_an_axis():
    """The exchange sweep's runs carry no experiment: its claims name cells by the exchange, and the SD is pooled
    over its cells (cell_key), not over one pool of every run."""
    cells = {"visible": [0.20, 0.21, 0.22], "hidden": [0.18, 0.19, 0.20], "latent:recap": [0.14, 0.16, 0.12],
             "latent:trace": [0.06, 0.07, 0.08]}
    table = claims_table(exchange_frame(cells)).set_index("claim")
    paper = [c.text for c in CLAIMS if "=" not in c.left]
    assert not set(paper) & set(table.index)  # the paper's presets are not among these runs
    assert len(table) == 6 and set(table["claims"]) == {6}
    # sums of squares .0002 x 3 + .0008 over df 8
    assert table["pooled_sd"].iloc[0] == pytest.approx(math.sqrt(0.0014 / 8)) and table["pooled_cells"].iloc[0] == 4
    row = table.loc["the recap as key/value states beats the recap as text"]
    assert (row["left"], row["right"], row["difference"]) == ("exchange=latent:recap", "exchange=visible",
                                                               pytest.approx(-0.07))
    assert row["verdict"] == "reversed"
    change = table.loc["the trace as states gains more than the recap as text (change since the start)"]
    assert change["measure"] == "change" and change["difference"] == pytest.approx(-0.14)


def test_axis_values_that_match_several_cells_name_none():
    """A sweep over two axes (here the exchange and the rotation) has two visible cells: exchange=visible names
    neither, and a claim naming it is not put to those runs, rather than pooling the two cells' runs as one."""
    cells = {"visible": [0.20, 0.21, 0.22], "hidden": [0.18, 0.19, 0.20], "latent:recap": [0.14, 0.16, 0.12]}
    claim = "the visible exchange beats the hidden one (competitive)"
    assert claim in set(claims_table(exchange_frame(cells))["claim"])
    table = claims_table(exchange_frame({**cells, "visible@fixed": [0.30, 0.31, 0.32]}))
    assert claim not in set(table["claim"])
    assert "the recap as key/value states beats the hidden exchange" in set(table["claim"])
    # the other cell still counts in the pool: 4 trained cells
    assert set(table["pooled_cells"]) == {4}


def test_axis_values_are_not_matched_among_runs_of_a_preset():
    """The paper's design launched by preset: agon is competitive and visible, hidden competitive and hidden, one
    cell each. The exchange sweep's claims would pick them out, and add to the number of claims the paper's
    family-wise interval counts; they are not put to runs of a preset."""
    runs = runs_frame({"agon": ("agon", [0.30, 0.32, 0.34], [0.2] * 3),
                       "hidden": ("agon", [0.28, 0.30, 0.29], [0.2] * 3)})
    runs["exchange"] = runs["experiment"].map({"agon": "visible", "hidden": "hidden"})
    runs["cell_key"] = "exchange=" + runs["exchange"]
    assert claims_table(runs).empty  # no paper claim compares agon with hidden alone
    assert len(claims_table(runs.assign(experiment=None))) == 1  # the same runs from a sweep over the exchange

