"""Within-run outcomes of a cascade, and arms compared at equal steps and at equal generated tokens.

Per run, from its final evaluation's rows (``eval.jsonl``: one row per order x stage x problem x sample; for a
cascade order ``A>B`` the ``draft`` row is A's draft on the plain prompt, the ``final`` row of the same problem and
sample B's answer after A's recap):

    cascade minus solo   per cascade order and pooled over the orders: the cascade's accuracy (final stage), its
                         drafter's solo accuracy (the draft stage of the same rows) and their paired difference.
                         Both are read from one evaluation of one run, so only evaluation noise is left in it
    conversion by kind   among the wrong drafts, the share whose final answer is right, by the kind of the draft's
                         recap (``recap_kind``: dead end, extendable, wrong numbers, no answer), with the counts;
                         the extendable minus the dead-end rate paired by problem (over the problems that have
                         wrong drafts of both kinds) and as two rates over every problem. Target sum only: the kind
                         is read from the problem's text
    regression           the share of right drafts whose final answer is wrong
    change since start   where the run's rows hold its evaluation before training (phase ``start``, which
                         ``analysis.pack`` keeps beside the final one): cascade minus solo and the paired conversion
                         gap at the start (``<metric>_at_start``) and their change, final minus start
                         (``<metric>_change``). On a base whose untrained cascade already beats its drafts, a final
                         difference above 0 says nothing of training; its change does

Each interval's unit of resampling is the problem: a problem's samples share its difficulty, so they are not
independent draws. A rate r = sum(num) / sum(den) over the rows gets the cluster-robust (linearised) SE
sqrt(P / (P - 1) * sum_p e_p^2), e_p = sum over problem p's rows of (num - r den) / sum(den); for a mean of paired
differences with the same count of rows per problem this is the SD of the per-problem mean differences over
sqrt(P). The interval is Student's t with P - 1 degrees of freedom. The rows are the run's 300 problems of one
evaluation: the interval says how far another draw of problems and samples could move the number, not another seed.
A change since the start pairs the two evaluations by problem: over the problems present in both, each problem's
final number (its mean paired difference; for the gap, its extendable minus dead-end rate) minus its start number,
their mean the change and its SE their SD over sqrt(P), t with P - 1 df. The two evaluations' samples are
independent draws, so the per-problem difference carries both evaluations' noise; where both evaluate the same
problems with the same samples each, the change is exactly the final value minus the start value.

Across the runs of an arm (``arm_outcomes``): the mean over seeds of each per-run number, with Student's t over the
seeds whose SD is never below the largest per-run SE of the arm (the floor rule of ``analysis.claims``: a seed SD
under one run's evaluation SD is luck of three seeds), and never narrower than the widest per-run interval: the runs
of an arm evaluate the same problems, so averaging seeds does not shrink the part of the noise that comes from which
problems were drawn.

Between arms (``budget_table``): each run's held-out accuracy curve (``eval/accuracy`` at every evaluation of
``metrics.jsonl``) read at one x by linear interpolation between its two nearest evaluations, x in training steps
(``train/step``) or in generated tokens (``train/generated_tokens``, cumulative over the run's training steps; 0 at
the evaluation before training; the evaluations' own tokens are not counted): at the largest x every run reaches,
each arm's mean over seeds and each pair of arms' difference, Student's t with the SD pooled over every arm's seeds
(``analysis.stats.pooled_sd``), never below the largest binomial SD sqrt(a (1 - a) / (problems x samples)) of the
evaluations the runs' values are read between. The interim evaluations are smaller than the ones before and after
training (100 x 4 against 300 x 16 in sweeps/results_target_sum.yaml: the first 100 held-out problems, which need
not be as hard as all 300). Where the runs are not all read at evaluations of one size (``one_design_at``; at equal
steps the arms' final evaluations are), each curve is first put on one design (``on_smallest_design``): its larger
points are recomputed from the packed rows on the problems and samples of its smallest evaluation. Otherwise an arm
read at its final point (GRPO at its last step's tokens) would be compared with an arm read between interim points
on other problems (on the study's first seeds the first 100 problems were 2-3 points easier at the start, and at the
end 1 point easier for Agon but 3 harder for GRPO). The interim rows are not packed, so the binomial SD stands in
for their evaluation SD (it is larger: it counts the problems' spread too).

Left out on purpose: a bootstrap over problems (a t interval on 300 clusters is what a reader can redo by hand from
the per-problem means); the change of the per-order differences, the conversion rates and the regression (the
tables show them at the final only); and any reading of the recap's text, which the eval rows do not store
(``recap_kind`` says why the boxed chain is close). The results packed before ``analysis.pack`` kept the start's
rows have no change since the start.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.load import Runs
from analysis.stats import pooled_interval, pooled_sd
from analysis.tables import final_evaluation, headline_rows

# the kinds of a wrong draft's recap, in the order the tables list them
KINDS = ("dead_end", "extendable", "wrong_numbers", "no_answer")
# how ``recap_kind`` reads a boxed chain: numbers joined by + or -
CHAIN = re.compile(r"\d+(?:[+-]\d+)*")
# the pooled scope: both cascade orders together
BOTH = "both"
# the metrics a within-run claim can name (analysis/claims.yaml): each a column of ``runs_with_outcomes`` with its
# ``_se`` and ``_df``
CASCADE_MINUS_SOLO = "paired/cascade_minus_solo"
CONVERSION_GAP = "paired/conversion_gap"
# each metric of a run that has an interval: its column, and the name the tables give it
INTERVAL_METRICS = (CASCADE_MINUS_SOLO, CONVERSION_GAP)
# a metric's value at the evaluation before training and its change since then (final minus start), each with its
# ``_se``, ``_low``, ``_high`` and ``_df``: ``analysis.claims`` reads ``<metric>_change`` for ``measure: change``
AT_START, CHANGE = "_at_start", "_change"


# ---------------------------------------------------------------------------------------------------------------
# statistics


def _t(level: float, df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, df)) if df >= 1 else math.nan


def clustered_rate(num: Sequence[float], den: Sequence[float], cluster: Sequence[Any]
                   ) -> tuple[float, pd.Series]:
    """(r, e): the rate r = sum(num) / sum(den) and its linearised residual per cluster, e_p = sum over the
    cluster's rows of (num - r den) / sum(den), so that the rate's cluster-robust variance is P / (P - 1) sum e_p^2
    (``clustered_se``). ``num``, ``den``, ``cluster``: one value per row. (nan, empty) when sum(den) is 0."""
    frame = pd.DataFrame({"num": np.asarray(num, float), "den": np.asarray(den, float),
                          "cluster": list(cluster)})
    total = frame["den"].sum()
    if not total > 0:
        return math.nan, pd.Series(dtype=float)
    r = frame["num"].sum() / total
    residual = (frame["num"] - r * frame["den"]) / total
    return float(r), residual.groupby(frame["cluster"], sort=False).sum()


def clustered_se(residuals: pd.Series) -> tuple[float, int]:
    """(SE, P): the cluster-robust SE sqrt(P / (P - 1) sum_p e_p^2) of residuals summed per cluster (clusters
    absent from a residual series count 0 there); nan with fewer than two clusters."""
    p = len(residuals)
    if p < 2:
        return math.nan, p
    return float(math.sqrt(p / (p - 1) * float((residuals**2).sum()))), p


def _interval(estimate: float, se: float, df: int, level: float) -> dict[str, float]:
    """The estimate, its SE, Student's t interval with ``df`` degrees of freedom, and the df."""
    half = _t(level, df) * se if not math.isnan(se) else math.nan
    return {"": estimate, "_se": se, "_low": estimate - half, "_high": estimate + half, "_df": float(df)}


def _keyed(name: str, parts: dict[str, float]) -> dict[str, float]:
    return {f"{name}{suffix}": value for suffix, value in parts.items()}


# ---------------------------------------------------------------------------------------------------------------
# one run


def start_evaluation(evals: pd.DataFrame, run_id: Any | None = None) -> pd.DataFrame:
    """The rows of one run's evaluation before training (phase ``start``), both stages, as
    ``analysis.tables.final_evaluation`` reads the final one: of the earliest where there are several (the smallest
    step, and the first row of each order, stage, problem and sample). Empty without any (no ``phase`` column, or
    results packed before ``analysis.pack`` kept them)."""
    rows = evals
    if run_id is not None and "run_id" in rows:
        rows = rows[rows["run_id"] == run_id]
    if rows.empty or "phase" not in rows:
        return rows.iloc[:0]
    rows = rows[rows["phase"] == "start"]
    if "step" in rows and len(rows):
        rows = rows[rows["step"] == rows["step"].min()]
    keys = [k for k in ("order", "stage", "problem_id", "sample") if k in rows]
    return rows[~rows.duplicated(keys, keep="first")] if keys else rows


def cascade_pairs(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per cascade round of a run's evaluation rows (``final_evaluation``): ``order`` (``A>B``: A drafted, B
    answered after A's recap), ``problem_id``, ``sample``, ``draft`` and ``final`` (each correct, bool) and
    ``answer`` (the draft's boxed answer, None without one). Empty without cascade orders (GRPO's runs have one
    order, ``A``, stage ``final``)."""
    columns = ["order", "problem_id", "sample", "draft", "final", "answer"]
    if rows.empty or "order" not in rows:
        return pd.DataFrame(columns=columns)
    cascade = rows[rows["order"].astype(str).str.contains(">", regex=False)]
    keys = ["order", "problem_id", "sample"]
    drafts = cascade[cascade["stage"] == "draft"]
    finals = cascade[cascade["stage"] == "final"]
    if drafts.empty or finals.empty:
        return pd.DataFrame(columns=columns)
    answer = drafts["answer"] if "answer" in drafts else pd.Series(None, drafts.index, dtype=object)
    left = drafts[keys].assign(draft=drafts["correct"].astype(bool).to_numpy(), answer=answer.to_numpy())
    right = finals[keys].assign(final=finals["correct"].astype(bool).to_numpy())
    pairs = left.merge(right, on=keys, how="inner", validate="one_to_one")
    return pairs[columns].reset_index(drop=True)


def recap_kind(question: str, answer: Any) -> str:
    """The kind of the recap a target-sum draft hands on, read from its boxed chain (``answer``, e.g. ``7+3-5+2``)
    and the problem (``7?3?5?2=7``): ``dead_end`` when no last sign finishes the chain's sign prefix (every sign but
    the last) to the target, ``extendable`` when one does (``agon.tasks.target_sum.live``; for a wrong draft, one
    that erred in its last sign alone; a right draft's prefix is always of this kind), ``wrong_numbers`` for a chain
    whose numbers are not the problem's operands in order (its prefix is no prefix of this problem), ``no_answer``
    without a boxed chain.

    Read from the boxed chain, not from the recap the challenger read (the visible text less the box, which the eval
    rows do not store). The two are close: the recap is the chain's steps but the last (``7+3=10;10-5=5``), which is
    what the warm start teaches every draft to write (``agon.tasks.target_sum.completion``), so the prefix stated
    and the prefix boxed differ only where a draft's visible steps disagree with its own box."""
    from agon.tasks.target_sum import live, parse

    if not isinstance(answer, str) or CHAIN.fullmatch(answer.strip()) is None:
        return "no_answer"
    chain = answer.strip()
    operands, target = parse(question)
    if [int(x) for x in re.split(r"[+-]", chain)] != operands:
        return "wrong_numbers"
    signs = [c for c in chain if c in "+-"]
    return "extendable" if live(operands, target, signs[:-1]) else "dead_end"


def cascade_minus_solo(pairs: pd.DataFrame, level: float = 0.95) -> dict[str, float]:
    """Per cascade order of ``pairs`` (``cascade_pairs``) and pooled over them (``both``): ``paired/<scope>/cascade``
    (final-stage accuracy), ``.../solo`` (the drafter's, the draft stage of the same rows), ``.../problems`` and
    ``.../cascade_minus_solo`` with ``_se``, ``_low``, ``_high`` and ``_df`` (its interval, clustered by problem);
    the pooled difference is also ``paired/cascade_minus_solo``, the name a within-run claim uses. Empty without
    pairs."""
    out: dict[str, float] = {}
    if pairs.empty:
        return out
    scopes = [(str(o), pairs[pairs["order"] == o]) for o in sorted(pairs["order"].unique())]
    for scope, rows in [*scopes, (BOTH, pairs)]:
        diff = rows["final"].astype(float) - rows["draft"].astype(float)
        estimate, residuals = clustered_rate(diff, np.ones(len(rows)), rows["problem_id"])
        se, problems = clustered_se(residuals)
        out[f"paired/{scope}/cascade"] = float(rows["final"].mean())
        out[f"paired/{scope}/solo"] = float(rows["draft"].mean())
        out[f"paired/{scope}/problems"] = float(problems)
        out.update(_keyed(f"paired/{scope}/cascade_minus_solo", _interval(estimate, se, problems - 1, level)))
    out.update(_keyed(CASCADE_MINUS_SOLO, {k[len(f"paired/{BOTH}/cascade_minus_solo"):]: v for k, v in out.items()
                                           if k.startswith(f"paired/{BOTH}/cascade_minus_solo")}))
    return out


def problem_differences(pairs: pd.DataFrame) -> pd.Series:
    """Per problem of ``pairs`` (``cascade_pairs``), the mean over its rounds (both orders) of final minus draft:
    the per-problem means whose mean is ``paired/cascade_minus_solo`` where every problem has as many rounds."""
    if pairs.empty:
        return pd.Series(dtype=float)
    diff = pairs["final"].astype(float) - pairs["draft"].astype(float)
    return diff.groupby(pairs["problem_id"]).mean()


def problem_gaps(pairs: pd.DataFrame, kinds: pd.Series | None = None) -> pd.Series:
    """Per problem of a target-sum run's ``pairs`` with wrong drafts of both kinds, extendable minus dead end: the
    share of its wrong extendable drafts whose final is right minus that of its wrong dead ends (the values whose
    mean is ``paired/conversion_gap``). ``kinds``: each pair's ``recap_kind``, where already read."""
    if pairs.empty:
        return pd.Series(dtype=float)
    if kinds is None:
        kinds = pd.Series([recap_kind(q, a) for q, a in zip(pairs["problem_id"], pairs["answer"])],
                          index=pairs.index)
    checked = pairs[~pairs["draft"] & kinds.isin(["extendable", "dead_end"])].assign(kind=kinds)
    rates = checked.groupby(["problem_id", "kind"])["final"].mean().unstack()
    if not {"extendable", "dead_end"} <= set(rates.columns):
        return pd.Series(dtype=float)
    both = rates.dropna()
    return (both["extendable"] - both["dead_end"]).astype(float)


def paired_change(final: pd.Series, start: pd.Series, level: float = 0.95) -> dict[str, float]:
    """Final minus start of a per-problem number (``problem_differences`` or ``problem_gaps`` of each evaluation)
    over the problems present in both: the mean of the per-problem changes, SE their SD over sqrt(P), t with P - 1
    df; keys "", _se, _low, _high, _df and _problems (P). nan with no problem in both."""
    common = final.index.intersection(start.index)
    changes = (final[common] - start[common]).astype(float)
    estimate = float(changes.mean()) if len(changes) else math.nan
    se = float(changes.std(ddof=1) / math.sqrt(len(changes))) if len(changes) >= 2 else math.nan
    return {**_interval(estimate, se, len(changes) - 1, level), "_problems": float(len(changes))}


def change_since_start(final_pairs: pd.DataFrame, start_pairs: pd.DataFrame, target_sum: bool,
                       level: float = 0.95) -> dict[str, float]:
    """A run's within-run metrics at the start and their change since then, from its final and start evaluations'
    ``cascade_pairs``: ``paired/cascade_minus_solo_at_start`` (with ``_se``, ``_low``, ``_high``, ``_df``, as
    ``cascade_minus_solo`` gives it) and ``paired/cascade_minus_solo_change`` (``paired_change`` of the two
    evaluations' ``problem_differences``, with its interval and ``_problems``); with ``target_sum`` the same for
    ``paired/conversion_gap``. Empty when either evaluation has no cascade."""
    out: dict[str, float] = {}
    if final_pairs.empty or start_pairs.empty:
        return out
    start = cascade_minus_solo(start_pairs, level)
    metrics = [(CASCADE_MINUS_SOLO, problem_differences)]
    if target_sum:
        start.update(conversion_by_kind(start_pairs, level))
        metrics.append((CONVERSION_GAP, problem_gaps))
    for metric, per_problem in metrics:
        for suffix in ("", "_se", "_low", "_high", "_df"):
            out[f"{metric}{AT_START}{suffix}"] = start.get(f"{metric}{suffix}", math.nan)
        out.update(_keyed(f"{metric}{CHANGE}", paired_change(per_problem(final_pairs), per_problem(start_pairs),
                                                             level)))
    return out


def conversion_by_kind(pairs: pd.DataFrame, level: float = 0.95) -> dict[str, float]:
    """Over both cascade orders of a target-sum run's ``pairs`` (``cascade_pairs``): ``paired/conversion/<kind>``
    (the share of wrong drafts of that kind whose final answer is right; nan without any) and
    ``paired/wrong_drafts/<kind>`` (their count) per ``KINDS``; ``paired/conversion_gap`` (extendable minus dead end)
    paired by problem: the mean over the problems that have wrong drafts of both kinds of (the problem's
    extendable rate minus its dead-end rate), SE their SD over sqrt(P), with ``_se``, ``_low``, ``_high``, ``_df``
    and ``paired/conversion_gap_problems`` (P); ``paired/conversion_gap_all`` the same difference as two rates over
    every problem, its SE clustered by problem (``clustered_rate``); ``paired/regression`` (the share of right
    drafts whose final is wrong) and ``paired/right_drafts``. The paired gap is the one a claim names: a dead end is
    drafted more often on a hard problem, where any answer converts less, and pairing by problem takes that out."""
    out: dict[str, float] = {}
    if pairs.empty:
        return out
    kinds = pd.Series([recap_kind(q, a) for q, a in zip(pairs["problem_id"], pairs["answer"])], index=pairs.index)
    wrong = ~pairs["draft"]
    for kind in KINDS:
        rows = pairs[wrong & (kinds == kind)]
        out[f"paired/conversion/{kind}"] = float(rows["final"].mean()) if len(rows) else math.nan
        out[f"paired/wrong_drafts/{kind}"] = float(len(rows))
    right = pairs[pairs["draft"]]
    out["paired/regression"] = float((~right["final"]).mean()) if len(right) else math.nan
    out["paired/right_drafts"] = float(len(right))
    # paired by problem: the problems with wrong drafts of both kinds
    checked = pairs[wrong & kinds.isin(["extendable", "dead_end"])].assign(kind=kinds)
    gaps = problem_gaps(pairs, kinds)
    se = float(gaps.std(ddof=1) / math.sqrt(len(gaps))) if len(gaps) >= 2 else math.nan
    estimate = float(gaps.mean()) if len(gaps) else math.nan
    out.update(_keyed(CONVERSION_GAP, _interval(estimate, se, len(gaps) - 1, level)))
    out["paired/conversion_gap_problems"] = float(len(gaps))
    # two rates over every problem: the residuals of the two add, per problem
    ext = checked["kind"] == "extendable"
    r_ext, e_ext = clustered_rate(checked["final"] & ext, ext, checked["problem_id"])
    r_dead, e_dead = clustered_rate(checked["final"] & ~ext, ~ext, checked["problem_id"])
    residuals = e_ext.sub(e_dead, fill_value=0.0) if len(e_ext) and len(e_dead) else pd.Series(dtype=float)
    se_all, problems = clustered_se(residuals)
    out.update(_keyed(f"{CONVERSION_GAP}_all", _interval(r_ext - r_dead, se_all, problems - 1, level)))
    return out


def run_outcomes(rows: pd.DataFrame, target_sum: bool, level: float = 0.95,
                 start: pd.DataFrame | None = None) -> dict[str, float]:
    """Every within-run outcome of one run's final-evaluation rows (``final_evaluation``): ``cascade_minus_solo``,
    and with ``target_sum`` (the kind of a recap is read from a target-sum problem's text) ``conversion_by_kind``;
    with its start evaluation's rows (``start``: ``start_evaluation``) ``change_since_start`` too. Empty for a run
    without cascade rows."""
    pairs = cascade_pairs(rows)
    out = cascade_minus_solo(pairs, level)
    if target_sum:
        out.update(conversion_by_kind(pairs, level))
    if start is not None and not start.empty:
        out.update(change_since_start(pairs, cascade_pairs(start), target_sum, level))
    return out


def is_target_sum(run: Any) -> bool:
    """Whether a runs-frame row is of the target-sum task (its ``task``, the config's task name)."""
    return str(run.get("task", "")) == "target_sum"


def runs_with_outcomes(runs: pd.DataFrame, evals: pd.DataFrame | None, level: float = 0.95) -> pd.DataFrame:
    """``runs`` (a runs frame, ``analysis.load``) with each run's ``run_outcomes`` as columns, the change since the
    start among them where its rows hold a start evaluation (nan where a run has none: no eval rows, no cascade, not
    target sum, no start rows). ``runs`` unchanged without eval rows or a ``run_id``."""
    if evals is None or evals.empty or "run_id" not in runs or "run_id" not in evals:
        return runs
    by_run = dict(tuple(evals.groupby("run_id", sort=False)))
    values = [run_outcomes(final_evaluation(by_run[r["run_id"]]), is_target_sum(r), level,
                           start_evaluation(by_run[r["run_id"]]))
              if r["run_id"] in by_run else {} for _, r in runs.iterrows()]
    extra = pd.DataFrame(values, index=runs.index)
    return pd.concat([runs, extra[[c for c in extra.columns if c not in runs]]], axis=1)


# ---------------------------------------------------------------------------------------------------------------
# the runs of an arm


def arm_interval(values: Sequence[float], ses: Sequence[float], dfs: Sequence[float], level: float = 0.95
                 ) -> dict[str, float]:
    """The mean of an arm's per-run ``values`` (one per seed) and its interval: Student's t over the seeds (df
    n - 1) with the SD raised to the largest per-run SE (``ses``), and the half-width raised to the widest per-run
    interval (each t_df(level) x SE, ``dfs``: the runs share their problems, so averaging seeds does not shrink
    what comes of drawing them). One seed: its own interval. Keys: mean, low, high, seeds, seed_sd, floor (the
    largest per-run SE). nan bounds without a value or an SE."""
    x = np.asarray(values, float)
    keep = ~np.isnan(x)
    x, se, df = x[keep], np.asarray(ses, float)[keep], np.asarray(dfs, float)[keep]
    n = len(x)
    out = {"mean": float(x.mean()) if n else math.nan, "seeds": float(n), "low": math.nan, "high": math.nan,
           "seed_sd": float(x.std(ddof=1)) if n >= 2 else math.nan,
           "floor": float(np.nanmax(se)) if n and not np.isnan(se).all() else math.nan}
    if not n or math.isnan(out["floor"]):
        return out
    widest = max(_t(level, d) * s for s, d in zip(se, df) if not math.isnan(s))
    half = widest
    if n >= 2:
        half = max(half, _t(level, n - 1) * max(out["seed_sd"], out["floor"]) / math.sqrt(n))
    out.update(low=out["mean"] - half, high=out["mean"] + half)
    return out


def arm_outcomes(runs: pd.DataFrame, arm: str = "cell_key", level: float = 0.95) -> pd.DataFrame:
    """One row per arm (``arm``: the column that names it) of ``runs`` (``runs_with_outcomes``, complete runs) and
    metric: ``arm``, ``metric``, and ``arm_interval``'s mean, low, high, seeds, seed_sd and floor, for each metric
    with an interval (``INTERVAL_METRICS``, their values at the start and changes since then, and the per-order
    differences); and the mean over seeds of every other ``paired/`` column (rates, counts: summed counts would
    hide how the seeds differ) with nan bounds. An arm without a metric (GRPO: no cascade) has no row for it."""
    metrics = [c for c in runs.columns if c.startswith("paired/") and not c.endswith(("_se", "_low", "_high", "_df"))]
    rows = []
    for key, group in runs.groupby(arm, sort=False):
        for metric in metrics:
            values = pd.to_numeric(group[metric], errors="coerce")
            if values.isna().all():
                continue
            if f"{metric}_se" in group:
                stats = arm_interval(values, pd.to_numeric(group[f"{metric}_se"], errors="coerce"),
                                     pd.to_numeric(group[f"{metric}_df"], errors="coerce"), level)
            else:
                stats = {"mean": float(values.mean()), "low": math.nan, "high": math.nan,
                         "seeds": float(values.notna().sum()), "seed_sd": float(values.std(ddof=1)),
                         "floor": math.nan}
            rows.append({arm: key, "metric": metric, **stats})
    return pd.DataFrame(rows, columns=[arm, "metric", "mean", "low", "high", "seeds", "seed_sd", "floor"])


# ---------------------------------------------------------------------------------------------------------------
# arms at equal steps and equal generated tokens


X_AXES = {"train/step": "steps", "train/generated_tokens": "generated tokens"}


def eval_curve(steps: pd.DataFrame, x: str, metric: str = "eval/accuracy") -> pd.DataFrame:
    """One run's evaluations from its ``steps`` rows (``analysis.load``'s steps frame, one row per ``train/step``):
    columns ``x`` (``train/step`` or ``train/generated_tokens``; tokens 0 at the evaluation before training, where
    none were generated yet), ``value`` (``metric``), ``n`` (problems x samples of that evaluation, nan where not
    logged), ``problems``, ``samples`` and ``step``, sorted by ``x``."""
    columns = [x, "value", "n", "problems", "samples", "step"]
    rows = steps.dropna(subset=[metric]) if metric in steps else steps.iloc[:0]
    if x not in rows:
        return pd.DataFrame(columns=columns)
    position = pd.to_numeric(rows[x], errors="coerce")
    if x == "train/generated_tokens":
        position = position.where(~(rows["train/step"].eq(0) & position.isna()), 0.0)

    def logged(key: str) -> np.ndarray:
        return (pd.to_numeric(rows[key], errors="coerce") if key in rows else pd.Series(math.nan, rows.index)
                ).to_numpy(float)

    problems, samples = logged("eval/n_problems"), logged("eval/samples")
    curve = pd.DataFrame({x: position.to_numpy(float), "value": pd.to_numeric(rows[metric]).to_numpy(float),
                          "n": problems * samples, "problems": problems, "samples": samples,
                          "step": logged("train/step")}, columns=columns).dropna(subset=[x])
    return curve.sort_values(x, kind="stable").reset_index(drop=True)


def on_smallest_design(curve: pd.DataFrame, rows: pd.DataFrame, run: Any) -> pd.DataFrame:
    """A run's accuracy ``eval_curve`` with every point on the design of its smallest evaluation (module
    docstring): each larger point whose evaluation ``rows`` holds (the run's eval rows; packed results keep the
    start's and the final's) recomputed as the headline accuracy (``analysis.tables.headline_rows``: the mean over
    the headline orders of their final stage) of its first ``problems`` problems, in the order the evaluation played
    them (the held-out order, which every evaluation's first problems follow), and samples 0 to ``samples`` - 1;
    ``n``, ``problems`` and ``samples`` then that design's. A larger point with no rows to recompute from stays as
    logged (``budget_table`` counts those it reads)."""
    sized = curve.dropna(subset=["problems", "samples"])
    if sized.empty:
        return curve
    smallest = sized.loc[sized["n"].idxmin()]
    problems, samples = int(smallest["problems"]), int(smallest["samples"])
    curve = curve.copy()
    for i in curve.index[curve["n"] > problems * samples]:
        evaluation = rows[rows["step"] == curve.at[i, "step"]] if "step" in rows else rows.iloc[:0]
        first = list(dict.fromkeys(evaluation["problem_id"]))[:problems] if len(evaluation) else []
        subset = headline_rows(evaluation[evaluation["problem_id"].isin(first) & (evaluation["sample"] < samples)],
                               run) if first else evaluation
        if len(subset):
            value = float(subset.groupby("order")["correct"].mean().mean())
            curve.loc[i, ["value", "n", "problems", "samples"]] = value, problems * samples, problems, samples
    return curve


def read_curve(curve: pd.DataFrame, x: str, at: float) -> tuple[float, float]:
    """(value, binomial SD) of a run's ``eval_curve`` at ``at``: linear interpolation between the two evaluations
    around it (the one there, where one is); the SD the larger of the two evaluations' sqrt(a (1 - a) / n) (nan
    where their size is not logged). (nan, nan) outside the curve."""
    xs, ys, ns = curve[x].to_numpy(float), curve["value"].to_numpy(float), curve["n"].to_numpy(float)
    if not len(xs) or at < xs[0] or at > xs[-1]:
        return math.nan, math.nan
    value = float(np.interp(at, xs, ys))
    sds = [math.sqrt(ys[i] * (1 - ys[i]) / ns[i]) for i in around(xs, at) if ns[i] > 0]
    return value, max(sds) if sds else math.nan


def around(xs: np.ndarray, at: float) -> list[int]:
    """The indices of the evaluations a curve is read between at ``at`` (the one there, where one is); ``xs``
    sorted, ``at`` within them."""
    hi = int(np.searchsorted(xs, at, side="left"))
    return [hi] if xs[hi] == at else [hi - 1, hi]


def one_design_at(curves: Iterable[pd.DataFrame], x: str, at: float) -> bool:
    """Whether every curve has an evaluation exactly at ``at`` and all of them are of one size (the study's arms at
    their common last step: every run's final evaluation), so that they compare as logged, at full size."""
    sizes = set()
    for c in curves:
        there = c[c[x] == at]
        if there.empty:
            return False
        sizes.add(float(there["n"].iloc[-1]))
    return len(sizes) == 1 and not any(math.isnan(n) for n in sizes)


def common_reach(curves: Iterable[pd.DataFrame], x: str) -> float:
    """The largest ``x`` every curve reaches: the smallest of their last evaluations' ``x``; nan without curves."""
    ends = [float(c[x].iloc[-1]) for c in curves if len(c)]
    return min(ends) if ends else math.nan


def budget_table(steps: pd.DataFrame, runs: pd.DataFrame, arm: str = "cell_key", metric: str = "eval/accuracy",
                 level: float = 0.95, evals: pd.DataFrame | None = None) -> pd.DataFrame:
    """Arms compared at equal steps and at equal generated tokens (module docstring): for each x of ``X_AXES``, at
    ``common_reach`` of the complete ``runs``' curves (``steps``: analysis.load's steps frame; with ``evals``, the
    runs' eval rows, each accuracy curve put on its smallest evaluation's design, ``on_smallest_design``), one row
    per arm (``kind`` "arm": ``left`` the arm, its mean over seeds and ``seeds``) and one per pair of arms in the
    runs' order (``kind`` "difference": ``left`` minus ``right``, its interval ``low``/``high``). Columns: x, at,
    kind, left, right, value, low, high, seeds, pooled_sd, floor, and ``mixed``: the count of the evaluations read
    at that x that stayed on a larger design than their curve's smallest (no rows to recompute them from, as without
    ``evals``). Empty without curves."""
    columns = ["x", "at", "kind", "left", "right", "value", "low", "high", "seeds", "pooled_sd", "floor", "mixed"]
    done = runs[runs["status"] == "complete"] if "status" in runs else runs
    if done.empty or steps.empty or "run_id" not in steps:
        return pd.DataFrame(columns=columns)
    by_run = dict(tuple(steps.groupby("run_id", sort=False)))
    rows_of = dict(tuple(evals.groupby("run_id", sort=False))) if evals is not None and "run_id" in evals else {}
    out = []
    for x in X_AXES:
        curves = {r: eval_curve(by_run[r], x, metric) for r in done["run_id"] if r in by_run}
        curves = {r: c for r, c in curves.items() if len(c)}
        at = common_reach(curves.values(), x)
        if math.isnan(at):
            continue
        mixed = 0
        if metric == "eval/accuracy" and not one_design_at(curves.values(), x, at):
            for r, c in curves.items():  # a curve of one size comes back as it was
                curves[r] = on_smallest_design(c, rows_of.get(r, pd.DataFrame()), done[done["run_id"] == r].iloc[0])
                # points read here that had no rows to put on the smallest design
                ns = curves[r]["n"].to_numpy(float)
                mixed += sum(ns[i] > c["n"].min() for i in around(curves[r][x].to_numpy(float), at))
        read = {r: read_curve(c, x, at) for r, c in curves.items()}
        arms = {key: np.array([read[r][0] for r in group["run_id"] if r in read])
                for key, group in done.groupby(arm, sort=False)}
        arms = {k: v[~np.isnan(v)] for k, v in arms.items() if len(v[~np.isnan(v)])}
        sd, df = pooled_sd(list(arms.values()))
        floors = [s for _, s in read.values() if not math.isnan(s)]
        floor = max(floors) if floors else math.nan
        used = sd if math.isnan(floor) or math.isnan(sd) else max(sd, floor)
        for key, values in arms.items():
            out.append({"x": x, "at": at, "kind": "arm", "left": key, "right": None, "value": float(values.mean()),
                        "low": math.nan, "high": math.nan, "seeds": len(values), "pooled_sd": used, "floor": floor,
                        "mixed": mixed})
        keys = list(arms)
        for i, left in enumerate(keys):
            for right in keys[i + 1:]:
                diff, low, high = pooled_interval(arms[left], arms[right], used, df, level)
                out.append({"x": x, "at": at, "kind": "difference", "left": left, "right": right, "value": diff,
                            "low": low, "high": high, "seeds": f"{len(arms[left])} vs {len(arms[right])}",
                            "pooled_sd": used, "floor": floor, "mixed": mixed})
    return pd.DataFrame(out, columns=columns)


# ---------------------------------------------------------------------------------------------------------------
# tables

NA = "-"
# the per-run and per-arm table's columns: (title, the metric, whether it has an interval)
CASCADE_COLUMNS = (
    ("cascade A>B %", "paired/A>B/cascade", False),
    ("solo A %", "paired/A>B/solo", False),
    ("A>B − solo", "paired/A>B/cascade_minus_solo", True),
    ("cascade B>A %", "paired/B>A/cascade", False),
    ("solo B %", "paired/B>A/solo", False),
    ("B>A − solo", "paired/B>A/cascade_minus_solo", True),
    ("both − solo", CASCADE_MINUS_SOLO, True),
)
KIND_LABELS = {"dead_end": "dead end", "extendable": "extendable", "wrong_numbers": "wrong numbers",
               "no_answer": "no answer"}


def _pts(value: Any, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NA
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def _with_interval(row: Any, metric: str, low: str = "_low", high: str = "_high") -> str:
    value = row.get(metric, math.nan)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NA
    lo, hi = row.get(f"{metric}{low}", math.nan), row.get(f"{metric}{high}", math.nan)
    bounds = "" if lo is None or math.isnan(lo) else f" [{_pts(lo, True)}, {_pts(hi, True)}]"
    return _pts(value, True) + bounds


def _rate_count(row: Any, kind: str) -> str:
    rate, count = row.get(f"paired/conversion/{kind}", math.nan), row.get(f"paired/wrong_drafts/{kind}", math.nan)
    if count is None or (isinstance(count, float) and math.isnan(count)):
        return NA
    return f"{_pts(rate)} ({count:,.0f})" if count else "- (0)"


def _since_start(row: Any, metric: str) -> list[str]:
    """The start value and the change since the start of ``metric``, each with its interval."""
    return [_with_interval(row, f"{metric}{AT_START}"), _with_interval(row, f"{metric}{CHANGE}")]


def _run_cells(row: Any, with_start: bool = False) -> list[str]:
    """One row's cells under ``header(with_start)``."""
    cells = [_with_interval(row, m) if interval else _pts(row.get(m, math.nan)) for _, m, interval in CASCADE_COLUMNS]
    if with_start:
        cells += _since_start(row, CASCADE_MINUS_SOLO)
    cells += [_rate_count(row, k) for k in KINDS]
    problems = row.get("paired/conversion_gap_problems", math.nan)
    gap = _with_interval(row, CONVERSION_GAP)
    cells.append(gap if gap == NA else f"{gap} ({problems:.0f})")
    if with_start:
        cells += _since_start(row, CONVERSION_GAP)
    cells.append(_with_interval(row, f"{CONVERSION_GAP}_all"))
    right = row.get("paired/right_drafts", math.nan)
    cells.append(NA if right is None or math.isnan(right) else f"{_pts(row.get('paired/regression'))} ({right:,.0f})")
    return cells


def header(with_start: bool = False) -> list[str]:
    """The per-run and per-arm tables' titles; ``with_start``: with the start value and the change since the start
    beside the final of cascade minus solo and of the paired conversion gap."""
    start = ["both − solo at start", "both − solo change"] if with_start else []
    gap_start = ["ext − dead at start", "ext − dead change"] if with_start else []
    return ([title for title, _, _ in CASCADE_COLUMNS] + start + [f"conv. {KIND_LABELS[k]} % (n)" for k in KINDS]
            + ["ext − dead, paired (problems)", *gap_start, "ext − dead, all", "regression % (n)"])


HEADER = header()


def has_start(runs: pd.DataFrame) -> bool:
    """Whether some run of a ``runs_with_outcomes`` frame has a change since the start."""
    column = f"{CASCADE_MINUS_SOLO}{CHANGE}"
    return column in runs and bool(pd.to_numeric(runs[column], errors="coerce").notna().any())


def paired_markdown(runs: pd.DataFrame, arms: pd.DataFrame, budget: pd.DataFrame, label: dict[Any, str],
                    arm: str = "cell_key", level: float = 0.95) -> str:
    """Markdown: the within-run outcomes per run (``runs_with_outcomes``) and per arm (``arm_outcomes``), then the
    arms at equal steps and generated tokens (``budget_table``), with the rules under each. ``label``: an arm's
    name in the tables. Differences in signed points with their interval; "-" where a run has no cascade (GRPO) or
    an outcome does not apply (the recap's kind outside target sum)."""
    pct = f"{100 * level:.0f}%"
    start = has_start(runs)
    titles = header(start)
    what = "the final evaluation, and of the evaluation before training" if start else "the final evaluation"
    lines = [f"Within-run outcomes of {what} (points; [{pct} interval, clustered by problem])", "",
             "| arm | seed | " + " | ".join(titles) + " |", "|---" * (2 + len(titles)) + "|"]
    for _, row in runs.iterrows():
        lines.append(f"| {label.get(row[arm], row[arm])} | {row.get('seed', NA)} | "
                     + " | ".join(_run_cells(row, start)) + " |")
    lines += ["", f"Per arm: mean over seeds [{pct} interval over seeds, never below the largest per-run SE nor "
              "narrower than the widest per-run interval]", "",
              "| arm | seeds | " + " | ".join(titles) + " |", "|---" * (2 + len(titles)) + "|"]
    for key, group in arms.groupby(arm, sort=False):
        by_metric = group.set_index("metric")
        row: dict[str, Any] = {}
        for metric, r in by_metric.iterrows():
            row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = r["mean"], r["low"], r["high"]
        seeds = int(by_metric["seeds"].max()) if len(by_metric) else 0
        lines.append(f"| {label.get(key, key)} | {seeds} | " + " | ".join(_run_cells(row, start)) + " |")
    lines += ["", "- Solo: the drafter's own draft in the same rounds (the draft stage); cascade: the answer after "
              "its recap. Conversion: the share of wrong drafts whose final answer is right, by the kind of the "
              "draft's boxed chain's sign prefix (dead end: no last sign reaches the target; extendable: one does; "
              "wrong numbers: not the problem's operands; no answer: no chain), counts in brackets; ext − dead: "
              "paired over the problems with wrong drafts of both kinds, and as two rates over all problems. "
              "Regression: the share of right drafts answered wrong."]
    if start:
        lines += ["- At start: the same at the evaluation before training; change: final minus start, per problem "
                  "over the problems in both evaluations (for ext − dead: with wrong drafts of both kinds in both), "
                  "its interval Student's t on the per-problem changes. \"-\" where a run has no start rows."]
    if not budget.empty:
        lines += ["", f"Arms at equal steps and at equal generated tokens: held-out accuracy (points) read off each "
                  f"run's evaluation curve by linear interpolation [{pct} interval, Student's t, SD pooled over every "
                  "arm's seeds, never below the largest binomial SD of the evaluations read]", "",
                  "| at | arm(s) | seeds | accuracy or difference | pooled SD |", "|---|---|---|---|---|"]
        for _, r in budget.iterrows():
            at = f"{r['at']:,.0f} {X_AXES[r['x']]}"
            if r["kind"] == "arm":
                what, value = label.get(r["left"], r["left"]), _pts(r["value"])
            else:
                what = f"{label.get(r['left'], r['left'])} − {label.get(r['right'], r['right'])}"
                value = _with_interval({"v": r["value"], "v_low": r["low"], "v_high": r["high"]}, "v")
            lines.append(f"| {at} | {what} | {r['seeds']} | {value} | {_pts(r['pooled_sd'])} |")
        mixed = int(budget["mixed"].max()) if "mixed" in budget and budget["mixed"].notna().any() else 0
        design = (f" {mixed} larger evaluation(s) had no rows to recompute them from and stay as logged, so those "
                  "curves mix designs." if mixed else "")
        lines += ["", "- At the largest step and the largest count of generated tokens (cumulative over training; "
                  "the evaluations' own are not counted) that every run reaches. Each run's curve is read on the "
                  "design of its smallest evaluation (the evaluations before and after training recomputed from "
                  "their rows on the interim evaluations' first problems and samples: analysis.paired."
                  "on_smallest_design), unless every run is read at an evaluation of one size (the arms' final "
                  f"evaluations at equal steps), which is read as logged.{design}"]
    return "\n".join(lines) + "\n"


def has_cascade(evals: pd.DataFrame | None) -> bool:
    """Whether any eval row is a cascade's (an order ``X>Y``)."""
    return evals is not None and not evals.empty and "order" in evals and bool(
        evals["order"].astype(str).str.contains(">", regex=False).any())


def write_paired(data: Runs, out_dir: str | Path, level: float = 0.95) -> list[Path]:
    """``paired.md`` (``paired_markdown``), ``paired.csv`` (one row per complete run: its ``run_id``, cell, seed and
    every ``paired/`` column, fractions at full precision; then one per arm and metric: ``arm_outcomes``) and
    ``budget.csv`` (``budget_table``) into ``out_dir``; nothing when no run has a cascade's eval rows."""
    if not has_cascade(data.evals):
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = data.runs[data.runs["status"] == "complete"] if "status" in data.runs else data.runs
    runs = runs_with_outcomes(runs, data.evals, level)
    arms = arm_outcomes(runs, "cell_key", level)
    budget = budget_table(data.steps, runs, "cell_key", level=level, evals=data.evals)
    label = dict(zip(runs["cell_key"], runs["cell"]))
    paths = [out / "paired.md", out / "paired.csv", out / "budget.csv"]
    paths[0].write_text(paired_markdown(runs, arms, budget, label, "cell_key", level))
    per_run = runs[["run_id", "cell", "seed", *[c for c in runs.columns if c.startswith("paired/")]]]
    per_arm = arms.assign(cell=arms["cell_key"].map(label)).drop(columns=["cell_key"])
    pd.concat([per_run.assign(rows="run"), per_arm.assign(rows="arm")], ignore_index=True).to_csv(paths[1],
                                                                                                  index=False)
    budget.assign(left=budget["left"].map(label), right=budget["right"].map(label)).to_csv(paths[2], index=False)
    return paths
