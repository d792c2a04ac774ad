"""The analysis's gates and statistics on inputs that differ where their rules differ: verdicts with a margin and a
minimum effect set apart and intervals exactly at each edge; the evaluation floor over runs whose floors differ
(and over groups of unequal size); intervals of runs whose SEs and degrees of freedom differ; the clustered SE over
problems of unequal size; a change since the start over problems listed in other orders; and the recomputation of
a curve on its smallest design where the problems were played in an order that is not their sorted one, the rows
list samples out of order, and the runs differ in design.

Each expected number is worked out here by hand (plain Python and numpy) from the rule the module's docstring
states, never by calling the function under test again. Where every run shares a floor, every problem has as many
samples, every threshold has one value or the problems' order is the sorted one, a max/min/mean mix-up, a swap of
two thresholds or an index-for-id slip gives the same number; these inputs are built so that each gives another.

Left out on purpose: the Markdown (test_claims.py, test_paired.py), the pilot's packed runs (test_paired.py), and
the gates outside the analysis (tests/test_gates.py).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.claims import RULES, Claim, Rules, claims_table, eval_floor, verdict
from analysis.paired import (
    CASCADE_MINUS_SOLO,
    arm_interval,
    budget_table,
    cascade_minus_solo,
    cascade_pairs,
    eval_curve,
    on_smallest_design,
    paired_change,
    read_curve,
)


def t(df: float, level: float = 0.95) -> float:
    return float(stats.t.ppf(0.5 + level / 2, df))


def hand_floor(groups: list[list[int]]) -> float:
    """sqrt(sum_g s_g^2 / k_g) / G, groups of one sample adding nothing but counting in G."""
    parts = [np.var(g, ddof=1) / len(g) for g in groups if len(g) > 1]
    return math.sqrt(sum(parts)) / len(groups)


# ---------------------------------------------------------------------------------------------------------------
# verdicts: each threshold apart, each edge exactly

E, M = 0.25, 0.5  # a minimum effect and a margin set apart (binary fractions: the edges compare exactly)
EDGES = [
    # greater: beyond +E holds, beyond -E reversed, within +-E negligible; an interval that ends at an edge holds it
    ("greater", 0.25, 1.0, "unresolved"), ("greater", 0.375, 1.0, "holds"),
    ("greater", -1.0, -0.25, "unresolved"), ("greater", -1.0, -0.375, "reversed"),
    ("greater", -0.25, 0.25, "negligible"), ("greater", -0.375, 0.25, "unresolved"),
    ("greater", -0.25, 0.375, "unresolved"), ("greater", 0.375, 0.45, "holds"),
    # smaller: the mirror
    ("smaller", -1.0, -0.25, "unresolved"), ("smaller", -1.0, -0.375, "holds"),
    ("smaller", 0.25, 1.0, "unresolved"), ("smaller", 0.375, 1.0, "reversed"),
    ("smaller", -0.25, 0.25, "negligible"), ("smaller", -0.25, 0.375, "unresolved"),
    # similar: within +-M holds (edges included), else differs where it excludes 0, else unresolved
    ("similar", -0.5, 0.5, "holds"), ("similar", -0.625, 0.5, "unresolved"), ("similar", -0.5, 0.625, "unresolved"),
    ("similar", 0.125, 0.5, "holds"), ("similar", 0.125, 0.625, "differs"), ("similar", -0.625, -0.125, "differs"),
    ("similar", 0.0, 0.625, "unresolved"), ("similar", -0.375, 0.375, "holds"),
]


@pytest.mark.parametrize("direction,low,high,want", EDGES)
def test_each_verdict_reads_its_own_threshold_at_its_edges(direction, low, high, want):
    """The margin (0.5) and the minimum effect (0.25) differ, so a directional verdict read against the margin, or
    "about equal" against the minimum effect, gives another word on at least one row of the table."""
    assert verdict(direction, low, high, margin=M, min_effect=E) == want


@pytest.mark.parametrize("margin,effect,greater,similar", [
    (0.2, 0.05, "holds", "holds"),  # the interval [+5.5, +14.5] points lies beyond 5 and within 20
    (0.05, 0.2, "negligible", "differs"),  # the same interval within 20 (negligible), beyond 5 (differs)
])
def test_the_table_judges_each_claim_by_its_metrics_own_margin_or_minimum_effect(margin, effect, greater, similar):
    """Two claims on the same cells, one directional and one "about equal", under rules whose margin and minimum
    effect are set apart in both orders. The interval is pooled by hand: seeds .50 .52 .54 against .40 .42 .44,
    SD .02 on 4 df, .1 +- t_4 x .02 x sqrt(2/3)."""
    runs = pd.DataFrame([{"experiment": e, "method": "agon", "seed": s, "status": "complete", "eval/accuracy": v}
                         for e, values in (("a", [0.50, 0.52, 0.54]), ("b", [0.40, 0.42, 0.44]))
                         for s, v in enumerate(values)])
    rules = Rules(margins={"eval/accuracy": margin}, min_effects={"eval/accuracy": effect},
                  floor_fields=dict(RULES.floor_fields), level=0.95, reference="b")
    claims = [Claim("a beats b", "a", "b", "greater", "before"), Claim("a is about b", "a", "b", "similar", "before")]
    table = claims_table(runs, claims=claims, rules=rules).set_index("claim")
    half = t(4) * 0.02 * math.sqrt(2 / 3)
    for claim in ("a beats b", "a is about b"):
        assert (table.loc[claim, "ci_low"], table.loc[claim, "ci_high"]) == (pytest.approx(0.1 - half),
                                                                             pytest.approx(0.1 + half))
    assert table.loc["a beats b", "min_effect"] == effect and math.isnan(table.loc["a beats b", "margin"])
    assert table.loc["a is about b", "margin"] == margin and math.isnan(table.loc["a is about b", "min_effect"])
    assert (table.loc["a beats b", "verdict"], table.loc["a is about b", "verdict"]) == (greater, similar)


# ---------------------------------------------------------------------------------------------------------------
# the evaluation floor over runs whose floors differ

# designs of one run's final evaluation: per problem, its samples' correctness; floors .125, 0, .30 and .21
SMALL, NONE, BIG, MEDIUM = [[1, 0, 0, 0]] * 4, [[1, 1], [0, 0, 0]], [[1, 0], [1, 0, 0]], [[1, 0, 1], [0, 0, 1, 1, 1]]
HUGE = [[1, 0]]  # .5: MoA's, which trains nothing and stays out of the pool


def test_the_evaluation_floor_of_groups_of_unequal_size_by_hand():
    """Groups of 2, 3 and 5 samples in two orders, listed interleaved: each group's variance over its own count."""
    groups = {("p1", "A>B"): [1, 0], ("p1", "B>A"): [1, 0, 0], ("p2", "A>B"): [0, 1, 1, 1, 0], ("p2", "B>A"): [1]}
    rows = pd.DataFrame([{"problem_id": p, "order": o, "sample": i, "correct": c}
                         for (p, o), g in groups.items() for i, c in enumerate(g)]).sample(frac=1, random_state=3)
    assert eval_floor(rows, "correct") == pytest.approx(hand_floor(list(groups.values())))


def _runs_and_evals(designs: dict[str, list[list[list[int]]]], finals: dict[str, list[float]]
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    methods = {"agon": "agon", "grpo": "grpo", "moa": "moa"}
    runs, rows = [], []
    for cell, values in finals.items():
        for seed, value in enumerate(values):
            run_id = f"{cell}/{seed}"
            runs.append({"experiment": cell, "method": methods[cell], "seed": seed, "status": "complete",
                         "run_id": run_id, "eval/accuracy": value})
            for p, graded in enumerate(designs[cell][seed]):
                rows += [{"run_id": run_id, "step": 60, "phase": "final", "stage": "final", "order": "A",
                          "problem_id": f"p{p}", "sample": i, "correct": bool(c)} for i, c in enumerate(graded)]
    return pd.DataFrame(runs), pd.DataFrame(rows)


@pytest.mark.parametrize("where", ["left", "right"])
def test_the_pooled_sd_is_raised_to_the_largest_floor_of_the_trained_runs_whose_floors_differ(where):
    """Six trained runs with floors 0 to .30 (the largest in the left cell, or in the right one) and seeds whose
    pooled SD (.158) lies between the smallest floor and the largest: the intervals use the largest floor of a
    trained run, not the smallest, the mean, the first run's, or MoA's (.5, untrained)."""
    big_left = where == "left"
    designs = {"agon": [SMALL, BIG if big_left else MEDIUM, NONE],
               "grpo": [NONE, SMALL, MEDIUM if big_left else BIG],
               "moa": [HUGE, HUGE, HUGE]}
    finals = {"agon": [0.3, 0.5, 0.7], "grpo": [0.2, 0.3, 0.4], "moa": [0.1, 0.1, 0.1]}
    runs, evals = _runs_and_evals(designs, finals)
    claim = [Claim("agon beats grpo", "agon", "grpo", "greater", "before")]
    row = claims_table(runs, claims=claim, evals=evals).iloc[0]
    floors = [hand_floor(d) for cell in ("agon", "grpo") for d in designs[cell]]
    seed_sd = math.sqrt((0.08 + 0.02) / 4)
    assert min(floors) < seed_sd < max(floors) < hand_floor(HUGE)  # the choice matters
    assert len({round(f, 6) for f in floors}) == 4 and max(floors) == pytest.approx(hand_floor(BIG))
    assert row["seed_sd"] == pytest.approx(seed_sd) and row["eval_floor"] == pytest.approx(max(floors))
    assert row["pooled_sd"] == pytest.approx(max(floors)) and row["pooled_df"] == 4
    half = t(4) * max(floors) * math.sqrt(2 / 3)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))


def _within(agon_se: list[float], agon_df: list[float], cooperative_se: list[float]) -> pd.DataFrame:
    """A runs frame with a within-run metric: agon's and cooperative's runs (trained), GRPO's (no cascade)."""
    rows = []
    for cell, values, ses, dfs in (("agon", [0.05, 0.06, 0.055], agon_se, agon_df),
                                   ("cooperative", [0.02, 0.025, 0.03], cooperative_se, [299.0] * 3),
                                   ("grpo", [math.nan] * 3, [math.nan] * 3, [math.nan] * 3)):
        for seed, (value, se, df) in enumerate(zip(values, ses, dfs)):
            rows.append({"experiment": cell, "method": "grpo" if cell == "grpo" else "agon", "seed": seed,
                         "status": "complete", "run_id": f"{cell}/{seed}", "eval/accuracy": 0.3,
                         CASCADE_MINUS_SOLO: value, f"{CASCADE_MINUS_SOLO}_se": se, f"{CASCADE_MINUS_SOLO}_df": df})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("cooperative_top", [0.015, 0.04])
def test_a_within_run_interval_takes_the_largest_se_of_any_pooled_run_and_the_widest_run_of_its_cell(
        cooperative_top):
    """Agon's runs: SEs .010 (2 df), .012 (299 df), .011 (150 df), so its widest run interval (t_2 x .010 = 4.3
    points) is not the run of the largest SE; cooperative's largest SE (1.5 or 4 points) is the floor of the pool
    (the seeds' own SD is .5 point). The half-width is the larger of the widest run's and t_4 x floor / sqrt 3:
    the run's with a floor of 1.5, the pool's with 4."""
    ses, dfs = [0.010, 0.012, 0.011], [2.0, 299.0, 150.0]
    runs = _within(ses, dfs, [0.005, cooperative_top, 0.008])
    claim = [Claim("agon's cascade beats its drafts", "agon", None, "greater", "before", metric=CASCADE_MINUS_SOLO,
                   than=0.0)]
    row = claims_table(runs, claims=claim).iloc[0]
    seed_sd = math.sqrt((2 * 0.005 ** 2 + 2 * 0.005 ** 2) / 4)
    floor = max(ses + [0.005, cooperative_top, 0.008])
    widest = max(t(d) * s for s, d in zip(ses, dfs))
    assert widest == pytest.approx(t(2) * 0.010) and floor == cooperative_top
    pooled = t(4) * max(seed_sd, floor) / math.sqrt(3)
    assert (widest > pooled) == (cooperative_top == 0.015)  # each case puts another part on top
    assert row["eval_floor"] == pytest.approx(floor) and row["pooled_sd"] == pytest.approx(max(seed_sd, floor))
    assert row["ci_high"] - row["difference"] == pytest.approx(max(widest, pooled))
    assert row["difference"] == pytest.approx(0.055)


@pytest.mark.parametrize("top_se", [0.012, 0.03])
def test_an_arms_interval_takes_the_widest_run_and_the_largest_se_where_runs_differ(top_se):
    """Four runs, one without a value (its SE of .5 must not count): SEs .010 (2 df), ``top_se`` (299 df), .011
    (150 df). The floor is the largest SE, the widest run interval t_df x SE at its own df; the half-width the
    larger of it and t_2 x max(seed SD, floor) / sqrt 3."""
    values, ses, dfs = [0.05, math.nan, 0.06, 0.055], [0.010, 0.5, top_se, 0.011], [2, 2, 299, 150]
    out = arm_interval(values, ses, dfs)
    kept = [(v, s, d) for v, s, d in zip(values, ses, dfs) if not math.isnan(v)]
    x = np.array([v for v, _, _ in kept])
    floor = max(s for _, s, _ in kept)
    widest = max(t(d) * s for _, s, d in kept)
    half = max(widest, t(2) * max(x.std(ddof=1), floor) / math.sqrt(3))
    assert out["seeds"] == 3 and out["floor"] == pytest.approx(floor) and out["mean"] == pytest.approx(x.mean())
    assert (out["low"], out["high"]) == (pytest.approx(x.mean() - half), pytest.approx(x.mean() + half))


# ---------------------------------------------------------------------------------------------------------------
# problems of unequal size, listed in other orders


def _rows(rounds: list[tuple[str, str, int, bool, bool]], phase: str = "final", step: int = 100) -> pd.DataFrame:
    """Eval rows as agon.game.cascade writes them: per (order, problem, sample, draft, final) a draft and a final
    row of the cascade order and the drafter's solo row."""
    rows = []
    for order, problem, sample, draft, final in rounds:
        base = {"step": step, "phase": phase, "problem_id": problem, "sample": sample}
        rows += [{**base, "order": order, "stage": "draft", "correct": draft, "answer": None},
                 {**base, "order": order, "stage": "final", "correct": final, "answer": None},
                 {**base, "order": order[0], "stage": "final", "correct": draft, "answer": None}]
    return pd.DataFrame(rows)


def test_the_cascade_minus_solo_interval_is_clustered_by_problems_of_unequal_size():
    """Problems of 5, 2 and 1 rounds (listed z, a, m, interleaved): the estimate is the mean over every round, the
    SE the linearised one, sqrt(P / (P - 1) sum_p e_p^2) with e_p the problem's summed residuals over all rounds,
    which is not the SD of the problem means over sqrt(P) when the sizes differ."""
    diffs = {"z": [1, 1, 0, 1, 0], "a": [0, -1], "m": [1]}
    # (draft, final) of a round whose final minus draft is d; a 0 is a right draft kept or a wrong one left wrong
    rounds_of = {1: (False, True), -1: (True, False), 0: (True, True)}
    rounds = [("A>B", problem, i, *((False, False) if d[i] == 0 and i % 2 else rounds_of[d[i]]))
              for i in range(5) for problem, d in diffs.items() if i < len(d)]
    pairs = cascade_pairs(_rows(rounds))
    assert sorted((pairs["final"].astype(int) - pairs["draft"].astype(int)).tolist()) == sorted(
        sum(diffs.values(), []))
    out = cascade_minus_solo(pairs)
    every = np.array(sum(diffs.values(), []), float)
    r = every.mean()
    e = np.array([np.sum(np.array(d, float) - r) / len(every) for d in diffs.values()])
    se = math.sqrt(3 / 2 * float((e ** 2).sum()))
    means = np.array([np.mean(d) for d in diffs.values()])
    assert se != pytest.approx(means.std(ddof=1) / math.sqrt(3))  # the sizes make the two differ
    assert out[CASCADE_MINUS_SOLO] == pytest.approx(r) and out[f"{CASCADE_MINUS_SOLO}_se"] == pytest.approx(se)
    assert out[f"{CASCADE_MINUS_SOLO}_df"] == 2
    assert out[f"{CASCADE_MINUS_SOLO}_high"] == pytest.approx(r + t(2) * se)


def test_a_change_since_the_start_pairs_problems_by_id_whatever_their_order():
    """The final lists q, p, r; the start r, x, p: the change is over p and r, each final minus its own start."""
    final = pd.Series({"q": 0.5, "p": 0.25, "r": 1.0})
    start = pd.Series({"r": 0.5, "x": 1.0, "p": 0.0})
    changes = np.array([0.25 - 0.0, 1.0 - 0.5])
    out = paired_change(final, start)
    assert out[""] == pytest.approx(changes.mean()) and out["_problems"] == 2
    assert out["_se"] == pytest.approx(changes.std(ddof=1) / math.sqrt(2)) and out["_df"] == 1


# ---------------------------------------------------------------------------------------------------------------
# a curve read between evaluations of other sizes, and put on its smallest design


@pytest.mark.parametrize("sizes", [(40, 4000), (4000, 40)])
def test_a_curve_read_between_two_evaluations_of_unequal_size_takes_the_larger_binomial_sd(sizes):
    curve = pd.DataFrame({"train/step": [0.0, 100.0], "value": [0.5, 0.9], "n": [float(n) for n in sizes]})
    value, sd = read_curve(curve, "train/step", 25.0)
    assert value == pytest.approx(0.6)
    assert sd == pytest.approx(max(math.sqrt(0.5 * 0.5 / sizes[0]), math.sqrt(0.9 * 0.1 / sizes[1])))
    # exactly at an evaluation: that one's alone
    assert read_curve(curve, "train/step", 100.0)[1] == pytest.approx(math.sqrt(0.9 * 0.1 / sizes[1]))


# two runs. g (GRPO: one order, A) played p9, p2, p5 and a (Agon: orders A>B and B>A) p5, p9, p2, neither the sorted
# order; each evaluated 3 problems x 2 samples before and after training and on a smaller design between (g: its
# first 2 problems x 1 sample, a: its first problem x 1 sample). Correctness of each final answer, [sample 0,
# sample 1] per problem in the played order; the rows list sample 1 before sample 0.
PLAYED = {"g": ["p9", "p2", "p5"], "a": ["p5", "p9", "p2"]}
FINALS = {
    ("g", "start"): {"A": [[0, 0], [1, 0], [1, 0]]},
    ("g", "final"): {"A": [[1, 0], [1, 0], [0, 1]]},
    ("a", "start"): {"A>B": [[0, 0], [1, 1], [1, 1]], "B>A": [[1, 0], [1, 1], [1, 1]]},
    ("a", "final"): {"A>B": [[1, 0], [0, 0], [0, 0]], "B>A": [[1, 1], [0, 0], [0, 0]]},
}
DESIGN = {"g": (2, 1), "a": (1, 1)}  # (problems, samples) of each run's interim evaluations
# the logged curves: (step, tokens, accuracy); the start and final accuracies are their 3 x 2 evaluations'
INTERIM = {"g": (50, 1000, 0.6), "a": (50, 3000, 0.7)}
LAST_TOKENS = {"g": 2000, "a": 6000}


def _hand(run: str, phase: str, problems: int, samples: int) -> float:
    """The headline accuracy of the first ``problems`` played problems, samples below ``samples``: per order the
    mean of its final answers, then the mean over orders."""
    return float(np.mean([np.mean([c for p in graded[:problems] for c in p[:samples]])
                          for graded in FINALS[run, phase].values()]))


def _evaluation(run: str, phase: str, step: int) -> pd.DataFrame:
    rows = []
    for order, graded in FINALS[run, phase].items():
        for problem, samples in zip(PLAYED[run], graded):
            for sample in (1, 0):
                draft = {"run_id": run, "step": step, "phase": phase, "problem_id": problem, "sample": sample}
                if ">" in order:  # the cascade's drafts: all right, so that reading them would show
                    rows.append({**draft, "order": order, "stage": "draft", "correct": True})
                rows.append({**draft, "order": order, "stage": "final", "correct": bool(samples[sample])})
    return pd.DataFrame(rows)


def _steps() -> pd.DataFrame:
    rows = []
    for run in PLAYED:
        interim_step, interim_tokens, interim_acc = INTERIM[run]
        problems, samples = DESIGN[run]
        rows += [{"run_id": run, "train/step": 0, "train/generated_tokens": math.nan,
                  "eval/accuracy": _hand(run, "start", 3, 2), "eval/n_problems": 3, "eval/samples": 2},
                 {"run_id": run, "train/step": interim_step, "train/generated_tokens": interim_tokens,
                  "eval/accuracy": interim_acc, "eval/n_problems": problems, "eval/samples": samples},
                 {"run_id": run, "train/step": 100, "train/generated_tokens": LAST_TOKENS[run],
                  "eval/accuracy": _hand(run, "final", 3, 2), "eval/n_problems": 3, "eval/samples": 2}]
    return pd.DataFrame(rows)


def _evals() -> pd.DataFrame:
    return pd.concat([_evaluation(r, p, s) for r in PLAYED for p, s in (("start", 0), ("final", 100))],
                     ignore_index=True)


def test_the_design_and_the_data_make_every_slip_visible():
    """The premise of the next test: for each recomputed point, the first problems as played, the sorted ones and
    the first samples give three different numbers, and none is the logged value."""
    for run in PLAYED:
        problems, samples = DESIGN[run]
        for phase in ("start", "final"):
            right = _hand(run, phase, problems, samples)
            order = np.argsort(PLAYED[run])
            sorted_first = float(np.mean([np.mean([c for p in [graded[i] for i in order][:problems]
                                                    for c in p[:samples]]) for graded in FINALS[run, phase].values()]))
            assert right != sorted_first, (run, phase)
            assert right != _hand(run, phase, problems, samples + 1), (run, phase)
            assert right != _hand(run, phase, 3, 2), (run, phase)


def test_each_curve_is_recomputed_on_its_own_smallest_design_from_the_problems_as_played():
    """Each run's start and final points on its interim design: its first problems in the order its evaluation
    played them (not sorted, not another run's), samples 0 to k - 1 (whatever the rows' order), final stages of the
    headline orders only; then read at equal tokens (2,000: g's last point, between a's start and its interim one)
    and at equal steps (both finals, of one size: as logged)."""
    steps, evals = _steps(), _evals()
    runs = pd.DataFrame({"run_id": ["g", "a"], "cell_key": ["g", "a"], "status": "complete"})
    for run in PLAYED:
        problems, samples = DESIGN[run]
        curve = on_smallest_design(eval_curve(steps[steps["run_id"] == run], "train/step"),
                                   evals[evals["run_id"] == run], runs.set_index("run_id").loc[run])
        by_step = curve.set_index("step")
        assert by_step.loc[0, "value"] == pytest.approx(_hand(run, "start", problems, samples)), run
        assert by_step.loc[100, "value"] == pytest.approx(_hand(run, "final", problems, samples)), run
        assert by_step.loc[50, "value"] == INTERIM[run][2]
        assert set(by_step["n"]) == {problems * samples} and set(by_step["problems"]) == {problems}

    table = budget_table(steps, runs, evals=evals).set_index(["x", "kind", "left"]).sort_index()
    tokens = table.xs(("train/generated_tokens", "arm"))
    g_at = _hand("g", "final", *DESIGN["g"])
    a_start, a_interim = _hand("a", "start", *DESIGN["a"]), INTERIM["a"][2]
    a_at = float(np.interp(2000, [0, 3000], [a_start, a_interim]))
    assert tokens.loc["g", "value"] == pytest.approx(g_at) and tokens.loc["a", "value"] == pytest.approx(a_at)
    sds = [math.sqrt(g_at * (1 - g_at) / 2), math.sqrt(a_start * (1 - a_start) / 1),
           math.sqrt(a_interim * (1 - a_interim) / 1)]
    assert tokens.loc["g", "floor"] == pytest.approx(max(sds)) and tokens.loc["g", "mixed"] == 0
    on_steps = table.xs(("train/step", "arm"))
    assert on_steps.loc["g", "value"] == pytest.approx(_hand("g", "final", 3, 2))
    assert on_steps.loc["a", "value"] == pytest.approx(_hand("a", "final", 3, 2))
