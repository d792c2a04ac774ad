"""analysis.claims: the intervals (Welch, pooled, family-wise; the pooled one's own test is in test_stats.py), the
margin of "about equal", claims on the change since the start, the verdicts, and the table and Markdown built from a
runs frame."""

from __future__ import annotations

import math
from importlib import resources

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from analysis.claims import (
    CLAIMS,
    RULES,
    Claim,
    _digits,
    bonferroni_level,
    claims_markdown,
    claims_table,
    eval_floor,
    parse_claims,
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


def test_the_margins_and_minimum_effects_are_fixed_numbers_in_claims_yaml():
    """Every "about equal" margin and every minimum effect is a number written in claims.yaml, per metric, for
    each metric a claim of its kind names: no share of an observed gain (the old ``fraction: 0.5`` x GRPO's gain
    gave +-19 points on target sum), and no rule that reads the runs."""
    raw = yaml.safe_load(resources.files("analysis").joinpath("claims.yaml").read_text())
    for section in ("equivalence", "min_effect"):
        assert isinstance(raw[section], dict), section
        for metric, value in raw[section].items():
            assert type(value) in (int, float) and value > 0, (section, metric, value)
    assert RULES.margins == {m: float(v) for m, v in raw["equivalence"].items()}
    assert RULES.min_effects == {m: float(v) for m, v in raw["min_effect"].items()}
    assert {c.metric for c in CLAIMS if c.direction == "similar"} <= set(RULES.margins)
    assert {c.metric for c in CLAIMS if c.direction != "similar"} <= set(RULES.min_effects)
    # the values and their units: 2 points, 1 point, 5 tokens
    assert RULES.margins["eval/accuracy"] == 0.02 and RULES.min_effects["eval/accuracy"] == 0.01
    assert RULES.min_effects["eval/final_trace_tokens"] == 5.0
    # a margin written as anything but a number is refused when the file is read
    for bad in ({"fraction": 0.5, "reference": "grpo", "metric": "eval/accuracy"}, {"eval/accuracy": "half"},
                {"eval/accuracy": -0.02}):
        with pytest.raises(ValueError, match="positive number"):
            parse_claims({**raw, "equivalence": bad})


def test_the_margin_does_not_move_with_grpos_gain():
    """hidden - grpo is +1.5 points [+0.8, +2.2]: GRPO gaining 3 points or 30 leaves the margin at the 2 points of
    claims.yaml, so the verdict is the same ("unresolved": the interval reaches past +2). Under the old rule the
    margin was half of GRPO's gain, 1.5 points or 15, and the same runs read "unresolved" or "holds"."""
    for start in (0.20, -0.07):  # GRPO gains 3 points, or 30
        cells = {"grpo": ("grpo", [0.225, 0.23, 0.235], [start] * 3),
                 "hidden": ("agon", [0.24, 0.245, 0.25], [0.20] * 3)}
        row = claims_table(runs_frame(cells)).set_index("claim").loc["the hidden exchange is about GRPO"]
        assert row["margin"] == 0.02, start
        assert row["ci_low"] > 0 and row["ci_high"] > 0.02 and row["verdict"] == "differs", start
    # inside +-2 points it holds, whatever GRPO gained
    cells["hidden"] = ("agon", [0.23, 0.235, 0.24], [0.20] * 3)
    row = claims_table(runs_frame(cells)).set_index("claim").loc["the hidden exchange is about GRPO"]
    assert -0.02 <= row["ci_low"] and row["ci_high"] <= 0.02 and row["verdict"] == "holds"


def test_a_similar_claim_on_a_metric_without_a_margin_has_none():
    claims = [Claim("a is about b in length", "a", "b", "similar", "before", metric="eval/final_trace_tokens")]
    cells = {"a": ("agon", [0.30, 0.31, 0.32], [0.2] * 3), "b": ("agon", [0.30, 0.31, 0.30], [0.2] * 3)}
    tokens = {"a": [40.0, 41.0, 40.5], "b": [40.0, 40.2, 40.4]}
    table = claims_table(runs_frame(cells, **{"eval/final_trace_tokens": tokens}), claims=claims)
    assert table.iloc[0]["verdict"] == "no margin: none fixed for eval/final_trace_tokens"
    # and a directional claim on a metric without a minimum effect gets no verdict either
    other = [Claim("a beats b in agreement", "a", "b", "greater", "before", metric="eval/agree_AB")]
    agree = {"a": [0.9, 0.91, 0.92], "b": [0.1, 0.11, 0.12]}
    table = claims_table(runs_frame(cells, **{"eval/agree_AB": agree}), claims=other)
    assert table.iloc[0]["verdict"] == "no minimum effect: none fixed for eval/agree_AB"


def test_a_directional_claim_holds_only_beyond_its_minimum_effect():
    """A difference whose whole interval lies on the claimed side of 0 but not beyond the minimum effect does not
    hold: the products grid's -0.06 [-0.12, -0.01] tokens (traces of 54) read "holds" under the old rules."""
    assert verdict("smaller", -0.12, -0.01) == "holds"  # the old rule: beyond 0
    assert verdict("smaller", -0.12, -0.01, min_effect=5.0) == "negligible"
    assert verdict("smaller", -12.0, -6.0, min_effect=5.0) == "holds"
    assert verdict("smaller", -12.0, -4.0, min_effect=5.0) == "unresolved"
    assert verdict("smaller", 6.0, 12.0, min_effect=5.0) == "reversed"
    assert verdict("greater", 0.002, 0.008, min_effect=0.01) == "negligible"
    assert verdict("greater", 0.002, 0.03, min_effect=0.01) == "unresolved"
    assert verdict("greater", 0.011, 0.03, min_effect=0.01) == "holds"
    assert verdict("greater", -0.03, -0.011, min_effect=0.01) == "reversed"
    assert verdict("greater", 0.01, 0.03, min_effect=0.01) == "unresolved"  # closed: it holds the edge
    # through the table: Agon's traces shrink 0.06 tokens more than GRPO's, on seeds that agree to 0.01
    cells = {"agon": ("agon", [0.3] * 3, [0.2] * 3), "grpo": ("grpo", [0.3] * 3, [0.2] * 3)}
    final = {"agon": [54.10, 54.11, 54.12], "grpo": [54.17, 54.16, 54.18]}
    start = {"agon": [54.1] * 3, "grpo": [54.1] * 3}
    claim = [Claim("shorter", "agon", "grpo", "smaller", "before", metric="eval/final_trace_tokens",
                   measure="change")]
    row = claims_table(runs_frame(cells, **{"eval/final_trace_tokens": final,
                                            "eval/final_trace_tokens_at_start": start}), claims=claim).iloc[0]
    assert row["ci_high"] < 0 and row["min_effect"] == 5.0 and row["verdict"] == "negligible"


def test_a_claim_written_after_its_runs_gets_no_verdict():
    """A claim marked ``written: after`` is a description: its interval is shown, its verdict and family-wise
    columns say so, and it is not counted among the claims of the family-wise correction."""
    assert {c.written for c in CLAIMS} == {"before", "after"}
    assert all(c.written == "after" for c in CLAIMS if "=" in c.left)  # the exchange claims came after its runs
    cells = {"a": ("agon", [0.50, 0.51, 0.52], [0.2] * 3), "b": ("agon", [0.20, 0.21, 0.22], [0.2] * 3)}
    claims = [Claim("a beats b (before)", "a", "b", "greater", "before"),
              Claim("a beats b (after)", "a", "b", "greater", "after")]
    table = claims_table(runs_frame(cells), claims=claims).set_index("claim")
    before, after = table.loc["a beats b (before)"], table.loc["a beats b (after)"]
    assert before["verdict"] == "holds" and before["fw_verdict"] == "holds"
    assert after["verdict"] == after["fw_verdict"] == "description (written after its runs)"
    assert after["ci_low"] == before["ci_low"] and math.isnan(after["fw_low"])
    assert list(table["claims"]) == [1, 1] and before["fw_level"] == pytest.approx(0.95)
    md = claims_markdown(claims_table(runs_frame(cells), claims=claims))
    assert "| a beats b (after) | after | a vs b |" in md and "description (written after its runs) | [" in md
    assert "- Written after their runs: 1 claim(s), shown as descriptions" in md
    with pytest.raises(ValueError, match="written must be before or after"):
        parse_claims({**yaml.safe_load(resources.files("analysis").joinpath("claims.yaml").read_text()),
                      "claims": [{"text": "t", "left": "a", "right": "b", "direction": "greater",
                                  "written": "sometime"}]})


def evals_frame(runs: pd.DataFrame, samples: dict[str, list[list[int]]]) -> pd.DataFrame:
    """Final-evaluation rows for ``runs`` (as ``runs_frame`` builds them, given run ids): experiment -> per problem,
    its samples' correctness (the same for every seed of the cell)."""
    rows = []
    for _, run in runs.iterrows():
        for problem, graded in enumerate(samples[run["experiment"]]):
            rows += [{"run_id": run["run_id"], "step": 60, "phase": "final", "stage": "final", "order": "A",
                      "problem_id": f"p{problem}", "sample": i, "correct": bool(c)} for i, c in enumerate(graded)]
    return pd.DataFrame(rows)


def test_eval_floor_by_hand():
    """Two problems x 4 samples: [1, 1, 0, 0] has variance 1/3 (ddof 1), [1, 1, 1, 1] none; the floor is
    sqrt(1/3 / 4) / 2 = .1443. A third problem of one sample adds nothing but counts in G."""
    rows = pd.DataFrame({"problem_id": ["a"] * 4 + ["b"] * 4, "order": "A", "correct": [1, 1, 0, 0, 1, 1, 1, 1]})
    assert eval_floor(rows, "correct") == pytest.approx(math.sqrt(1 / 12) / 2)
    more = pd.concat([rows, pd.DataFrame({"problem_id": ["c"], "order": "A", "correct": [1]})])
    assert eval_floor(more, "correct") == pytest.approx(math.sqrt(1 / 12) / 3)
    # two orders of one problem are two groups (each order is a cascade of its own)
    orders = rows.assign(problem_id="a", order=["A>B"] * 4 + ["B>A"] * 4)
    assert eval_floor(orders, "correct") == pytest.approx(math.sqrt(1 / 12) / 2)
    assert math.isnan(eval_floor(rows.iloc[:0], "correct"))


def test_the_pooled_sd_is_never_below_the_evaluation_floor():
    """Seeds that agree to 0.1 point pool to an SD far under what one run's evaluation varies by (each run graded
    on 4 problems x 4 samples of p = .5): the intervals use the floor, and the notes say so. Without eval rows
    there is no floor, and the seeds' SD stands."""
    cells = {"agon": ("agon", [0.500, 0.501, 0.502], [0.2] * 3), "grpo": ("grpo", [0.480, 0.481, 0.482], [0.2] * 3)}
    runs = runs_frame(cells)
    runs["run_id"] = runs["experiment"] + "/" + runs["seed"].astype(str)
    half = [[1, 1, 0, 0]] * 4
    evals = evals_frame(runs, {"agon": half, "grpo": half})
    floor = math.sqrt(4 * (1 / 3) / 4) / 4  # four groups of variance 1/3 over 4 samples, G = 4
    row = claims_table(runs, evals=evals).iloc[0]
    assert row["seed_sd"] == pytest.approx(0.001) and row["eval_floor"] == pytest.approx(floor)
    assert row["pooled_sd"] == pytest.approx(floor) and row["pooled_sd"] >= row["eval_floor"]
    half_width = stats.t.ppf(0.975, 4) * floor * math.sqrt(2 / 3)
    assert row["ci_high"] - row["difference"] == pytest.approx(half_width)
    assert row["verdict"] == "unresolved"  # +2 points, but one run's evaluation alone varies by 14
    md = claims_markdown(claims_table(runs, evals=evals))
    assert f"(seeds 0.1, df 4; evaluation floor {100 * floor:.1f}, used)" in md
    bare = claims_table(runs).iloc[0]
    assert math.isnan(bare["eval_floor"]) and bare["pooled_sd"] == pytest.approx(0.001)
    assert "no evaluation floor" in claims_markdown(claims_table(runs))
    # seeds that spread more than the floor keep their own SD
    wide = runs_frame({"agon": ("agon", [0.3, 0.5, 0.7], [0.2] * 3), "grpo": ("grpo", [0.3, 0.5, 0.7], [0.2] * 3)})
    wide["run_id"] = runs["run_id"]
    row = claims_table(wide, evals=evals).iloc[0]
    assert row["pooled_sd"] == pytest.approx(0.2) and row["eval_floor"] < row["pooled_sd"]
    assert f"evaluation floor {100 * floor:.1f}, below it)" in claims_markdown(claims_table(wide, evals=evals))
    # one seed per cell: no SD over seeds, so the notes do not call the floor above or below one
    single = runs[runs["seed"] == 0]
    md = claims_markdown(claims_table(single, evals=evals[evals["run_id"].isin(single["run_id"])]))
    assert f"(seeds n/a, df 0; evaluation floor {100 * floor:.1f}, no SD over seeds to compare)" in md


def test_trace_length_is_judged_on_its_change_from_the_start():
    """Agon's traces start 21 tokens longer than GRPO's (the prompt differs) and shorten by 10 while GRPO's grow
    by 0.1: the finals say "reversed" (50 > 38.9), the change says "holds" (beyond the 5 tokens of claims.yaml)."""
    cells = {"agon": ("agon", [0.3] * 3, [0.2] * 3), "grpo": ("grpo", [0.3] * 3, [0.2] * 3)}
    final = {"agon": [50.0, 50.0, 50.0], "grpo": [38.9, 38.9, 38.9]}
    start = {"agon": [60.0, 59.9, 60.1], "grpo": [38.8, 38.9, 38.7]}
    runs = runs_frame(cells, **{"eval/final_trace_tokens": final, "eval/final_trace_tokens_at_start": start})
    on_change = [Claim(TRACE, "agon", "grpo", "smaller", "before", metric="eval/final_trace_tokens",
                       measure="change")]
    row = claims_table(runs, claims=on_change).set_index("claim").loc[TRACE]
    assert row["measure"] == "change" and row["verdict"] == "holds"
    assert (row["left_mean"], row["right_mean"]) == (pytest.approx(-10.0), pytest.approx(0.1))
    assert row["difference"] == pytest.approx(-10.1)
    # judged on finals (what the table did before), the same runs read "reversed"
    on_finals = [Claim("finals", "agon", "grpo", "smaller", "before", metric="eval/final_trace_tokens")]
    assert claims_table(runs, claims=on_finals).iloc[0]["verdict"] == "reversed"
    md = claims_markdown(claims_table(runs, claims=on_change))
    assert f"| {TRACE} | before | agon vs grpo | steps | 3 vs 3 | change -10.0 vs +0.1 tok | -10.1 [" in md
    # claims.yaml's own trace claim chose this measure after its runs: a description there
    assert claims_table(runs).set_index("claim").loc[TRACE, "verdict"] == "description (written after its runs)"


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
    # a claim can hold at 95% and not family-wise: s = sqrt(.0012 / 6) = .014; agon - cooperative = 4.3 points
    # less the 95% half-width (2.8 points) is beyond the 1-point minimum effect, less the 98.3% one (3.8) is not
    assert table.loc["competitive beats cooperative (visible exchange)", "verdict"] == "holds"
    near = {**cells, "cooperative": ("agon", [0.267, 0.287, 0.277], [0.2] * 3)}
    row = claims_table(runs_frame(near)).set_index("claim").loc["competitive beats cooperative (visible exchange)"]
    assert row["ci_low"] > 0.01 > row["fw_low"] > 0
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
    assert table.loc[TRACE, "verdict"] == "description (written after its runs)"
    # cells that did not run (cooperative, hidden, ...) have no row; the trace claim, written after, is not in k
    assert len(table) == 3 and set(table["claims"]) == {2}
    md = claims_markdown(claims_table(runs))
    assert ("| Agon (competitive, visible) beats vanilla GRPO | before | agon vs grpo | steps | 3 vs 3 | 61.0 vs 42.0 "
            "| +19.0 [") in md
    assert " tok | description (written after its runs) |" in md
    assert ("- Multiplicity: 2 claims written before their runs put to this task; the family-wise interval is at "
            "1 - 0.05/2 = 97.5%") in md
    assert "- Minimum effect (analysis/claims.yaml): a directional claim holds only when" in md
    assert "(every experiment but the untrained MoA)" not in md and "(every cell of the grid)" in md
    # no "about equal" claim among them: no margin line
    assert "About equal" not in md
    hidden = pd.DataFrame({"experiment": "hidden", "method": "agon", "seed": [0, 1, 2], "status": "complete",
                           "eval/accuracy": [0.43, 0.44, 0.42], "eval/accuracy_at_start": 0.3})
    md = claims_markdown(claims_table(pd.concat([runs, hidden], ignore_index=True)))
    assert "- Multiplicity: 3 claims written before their runs put to this task" in md
    # the margin as claims.yaml fixes it, not a share of GRPO's gain (12 points here)
    assert "- About equal: within ±2.0 points on eval/accuracy, fixed in analysis/claims.yaml." in md
    assert "gain" not in md


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
    # all six were written after the exchange sweep ran: descriptions, none in a family
    assert len(table) == 6 and set(table["claims"]) == {0}
    # sums of squares .0002 x 3 + .0008 over df 8
    assert table["pooled_sd"].iloc[0] == pytest.approx(math.sqrt(0.0014 / 8)) and table["pooled_cells"].iloc[0] == 4
    row = table.loc["the recap as key/value states beats the recap as text"]
    assert (row["left"], row["right"], row["difference"]) == ("exchange=latent:recap", "exchange=visible",
                                                               pytest.approx(-0.07))
    assert row["verdict"] == "description (written after its runs)" and row["ci_high"] < 0
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

