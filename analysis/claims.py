"""The paper's claims, put to a set of runs: each a difference between two cells with its interval and verdict.

A claim (``claims.yaml``, a data file beside the code, which also holds the rules below) names two cells, a metric,
a measure and a direction. A cell is named by its ``experiment`` (the named presets of ``conf/experiment``, which
the results sweeps use: ``agon``) or by axis values (``exchange=latent:recap``; several joined by ``,``), for grids
swept over an axis rather than over presets. Axis values are matched among the runs launched without a preset
only, so that the claims of an axis sweep are never put to the paper's design (where they would change the number
of claims its family-wise interval counts), and they name a cell only where they pick out one: where they match
runs of several cells (two axes swept, ``exchange=visible`` under both rewards) the claim is not put to those
runs. The measure is ``final`` (each run's value after training) or ``change`` (each run's value after
training minus its value at the evaluation before it, ``<metric>_at_start`` in the runs frame): a claim about what
training does to a metric that differs between cells before training is judged on its change.

Intervals, per setting (task and model; claims never mix settings):

    pooled      the verdict's interval: Student's t on the difference of the two cells' means, with the seeds' SD
                pooled over every trained cell of the setting (each cell whose method trains, i.e. all but MoA;
                df = sum of n_i - 1). With 3 seeds a cell's own SD is a poor estimate, and two cells whose
                seeds happen to agree would get a narrow interval. The pool assumes one seed-to-seed noise for
                all trained cells, which three seeds of each cannot tell apart from theirs
    welch       Welch's t on the two cells' own seeds, shown beside it
    family-wise the pooled interval at Bonferroni's level 1 - (1 - level) / k, for the k claims of the setting
                that get an interval, with its own verdict: all k hold together at ``level``

The verdict of an interval:

    holds        it lies on the claimed side of 0
    reversed     it lies on the other side
    unresolved   it holds 0
    for "about equal": holds when it lies within +-margin (even if it excludes 0: a difference smaller than the
                 margin is what "about equal" means); else differs when it excludes 0; else unresolved. The
                 margin is ``equivalence.fraction`` of the RL effect, the reference cell's (GRPO's) mean gain
                 in ``equivalence.metric`` from before training to after; with no such gain: "no margin"
    not testable a change claim where a run of its cells has no value at the start (nothing falls back to finals)
    too few seeds no interval can be formed

Left out on purpose: corrections less conservative than Bonferroni (Holm, false discovery rate): ten claims and
wide intervals, where the simplest rule that a reader can redo by hand is worth more than a little power; and any
test across settings (each task is judged on its own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np
import pandas as pd
import yaml

from agon.methods import METHODS


@dataclass(frozen=True)
class Claim:
    text: str
    # each a cell: an experiment (``agon``) or axis values (``exchange=latent:recap``)
    left: str
    right: str
    # "greater": left > right; "smaller": left < right; "similar": left about equal to right
    direction: str
    metric: str = "eval/accuracy"
    # "final": the value after training; "change": after training minus before
    measure: str = "final"


@dataclass(frozen=True)
class Rules:
    """How claims are judged (``claims.yaml``, which says why)."""

    # the experiment whose gain from training sets the "about equal" margin
    reference: str
    # the metric of that gain (and of the margin)
    margin_metric: str
    # margin = fraction x gain
    fraction: float
    # each claim's interval; the family-wise one is at 1 - (1 - level) / k
    level: float


def load_claims() -> tuple[tuple[Claim, ...], Rules]:
    """The claims and rules of ``claims.yaml`` (installed with the package)."""
    data = yaml.safe_load(resources.files("analysis").joinpath("claims.yaml").read_text())
    eq = data["equivalence"]
    rules = Rules(reference=eq["reference"], margin_metric=eq["metric"], fraction=float(eq["fraction"]),
                  level=float(data["level"]))
    return tuple(Claim(**c) for c in data["claims"]), rules


CLAIMS, RULES = load_claims()


# ---------------------------------------------------------------------------------------------------------------
# intervals


def welch_interval(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): Welch's t interval; nan bounds with fewer than two values on a side."""
    from scipy import stats

    diff = float(a.mean() - b.mean()) if len(a) and len(b) else math.nan
    if len(a) < 2 or len(b) < 2:
        return diff, math.nan, math.nan
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, diff, diff
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return diff, diff - half, diff + half


def pooled_sd(groups: Sequence[np.ndarray]) -> tuple[float, int]:
    """(s, df): the SD pooled over groups, sqrt(sum (n_i - 1) s_i^2 / df) with df = sum (n_i - 1); groups of one
    value add nothing. (nan, 0) when no group has two values."""
    df = sum(len(g) - 1 for g in groups if len(g) >= 2)
    if df == 0:
        return math.nan, 0
    ss = sum(float(((g - g.mean()) ** 2).sum()) for g in groups if len(g) >= 2)
    return math.sqrt(ss / df), df


def pooled_interval(a: np.ndarray, b: np.ndarray, sd: float, df: int, level: float = 0.95
                    ) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): diff +- t_df * sd * sqrt(1/n_a + 1/n_b), with ``sd`` pooled elsewhere (so a
    cell of one seed still gets an interval); nan bounds without a pooled SD or a value on a side."""
    from scipy import stats

    if not len(a) or not len(b):
        return math.nan, math.nan, math.nan
    diff = float(a.mean() - b.mean())
    if df < 1 or math.isnan(sd):
        return diff, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, df)) * sd * math.sqrt(1 / len(a) + 1 / len(b))
    return diff, diff - half, diff + half


def bonferroni_level(level: float, k: int) -> float:
    """The level of each of k intervals that hold together at ``level``: 1 - (1 - level) / k."""
    return 1 - (1 - level) / max(k, 1)


# ---------------------------------------------------------------------------------------------------------------
# verdicts


def verdict(direction: str, low: float, high: float, margin: float = math.nan) -> str:
    """holds, reversed or unresolved; for "similar" holds (within +-margin), differs or unresolved, and
    "no margin" when ``margin`` is nan. Intervals are closed: one that ends at 0 holds 0."""
    if math.isnan(low):
        return "too few seeds"
    if direction == "similar":
        if math.isnan(margin):
            return "no margin"
        if -margin <= low and high <= margin:
            return "holds"
        return "differs" if low > 0 or high < 0 else "unresolved"
    above, below = low > 0, high < 0
    if direction == "smaller":
        above, below = below, above
    return "holds" if above else "reversed" if below else "unresolved"


def rl_effect(done: pd.DataFrame, rules: Rules = RULES) -> tuple[float, str]:
    """(the reference cell's mean gain in ``rules.margin_metric`` over its runs, why not when nan)."""
    start = f"{rules.margin_metric}_at_start"
    ref = done[done["experiment"] == rules.reference] if "experiment" in done else done.iloc[:0]
    if ref.empty or rules.margin_metric not in ref:
        return math.nan, f"no {rules.reference} cell"
    if start not in ref:
        return math.nan, f"{rules.reference} has no value at the start"
    gain = (pd.to_numeric(ref[rules.margin_metric], errors="coerce")
            - pd.to_numeric(ref[start], errors="coerce")).dropna()
    if gain.empty:
        return math.nan, f"{rules.reference} has no value at the start"
    return float(gain.mean()), ""


def margin_of(effect: float, why: str, rules: Rules = RULES) -> tuple[float, str]:
    """(the "about equal" margin, why there is none): ``rules.fraction`` of a positive RL effect."""
    if math.isnan(effect):
        return math.nan, why
    if effect <= 0:
        return math.nan, f"{rules.reference} did not gain"
    return rules.fraction * effect, ""


# ---------------------------------------------------------------------------------------------------------------
# the table


def _trains(method: object) -> bool:
    """Whether a method trains (``agon.methods``); one this process does not know counts as trained."""
    registered = METHODS.get(method)
    return registered.trains if registered is not None else True


def _cell_column(done: pd.DataFrame) -> str:
    """The column that tells cells apart: ``cell_key`` in frames from ``analysis.load``, else the experiment."""
    return "cell_key" if "cell_key" in done else "experiment"


def cell_runs(done: pd.DataFrame, cell: str) -> pd.DataFrame | None:
    """The runs of the cell a claim names: those of an experiment (``agon``), or those launched without one whose
    axes hold the values (``exchange=latent:recap``, pairs joined by ``,``; compared as text). None when no run
    matches, or when axis values match runs of more than one cell (they name no single cell there)."""
    if "=" not in cell:
        rows = done[done["experiment"] == cell] if "experiment" in done else done.iloc[:0]
        return rows if len(rows) else None
    match = done["experiment"].isna() if "experiment" in done else pd.Series(True, index=done.index)
    for pair in cell.split(","):
        axis, value = (part.strip() for part in pair.split("=", 1))
        match &= done[axis].astype(str).eq(value) if axis in done else False
    rows = done[match]
    if rows.empty or rows[_cell_column(rows)].nunique(dropna=False) > 1:
        return None
    return rows


def claim_values(rows: pd.DataFrame, metric: str, measure: str) -> tuple[np.ndarray, int]:
    """(one value per complete run of a cell's ``rows``, how many of them have no value at the start): the final
    value, or with ``measure`` "change" the final minus ``<metric>_at_start``. Runs without a final value are left
    out (the metric does not apply to them)."""
    final = pd.to_numeric(rows[metric], errors="coerce") if metric in rows else pd.Series(math.nan, rows.index)
    if measure == "final":
        return final.dropna().to_numpy(float), 0
    if measure != "change":
        raise ValueError(f"measure {measure!r}: choose 'final' or 'change'")
    start_key = f"{metric}_at_start"
    start = pd.to_numeric(rows[start_key], errors="coerce") if start_key in rows else pd.Series(math.nan, rows.index)
    has_final = final.notna()
    return (final - start)[has_final & start.notna()].to_numpy(float), int((has_final & start.isna()).sum())


def _setting_claims(done: pd.DataFrame, claims: Sequence[Claim], rules: Rules) -> list[dict]:
    """The rows of one setting's claims (see ``claims_table``)."""
    cells = [rows for _, rows in done.groupby(_cell_column(done), sort=False)]
    trained = [rows for rows in cells if _trains(rows["method"].iloc[0] if "method" in rows else None)]
    effect, why = rl_effect(done, rules)
    margin, why = margin_of(effect, why, rules)
    # how the notes name the reference: its method's label (GRPO) where the runs have one
    labels = done.loc[done["experiment"] == rules.reference, "method_label"] if "method_label" in done else []
    reference = str(labels.iloc[0]) if len(labels) else rules.reference
    pools: dict[tuple[str, str], tuple[float, int]] = {}
    rows = []
    for claim in claims:
        if claim.metric not in done:
            continue
        left_rows, right_rows = cell_runs(done, claim.left), cell_runs(done, claim.right)
        if left_rows is None or right_rows is None:
            continue  # a cell did not run (or its axis values name no single cell here)
        (left, miss_l), (right, miss_r) = (claim_values(rows, claim.metric, claim.measure)
                                           for rows in (left_rows, right_rows))
        if (not len(left) and not miss_l) or (not len(right) and not miss_r):
            continue  # the metric does not apply to a cell
        key = (claim.metric, claim.measure)
        if key not in pools:
            pools[key] = pooled_sd([claim_values(rows, *key)[0] for rows in trained])
        sd, df = pools[key]
        row = {"claim": claim.text, "metric": claim.metric, "measure": claim.measure, "direction": claim.direction,
               "left": claim.left, "right": claim.right, "seeds": f"{len(left) + miss_l} vs {len(right) + miss_r}",
               "pooled_sd": sd, "pooled_df": df, "pooled_cells": len(trained),
               "untrained_cells": len(cells) - len(trained), "reference": reference,
               "fraction": rules.fraction, "margin_metric": rules.margin_metric, "rl_effect": effect,
               "margin": margin if claim.metric == rules.margin_metric else math.nan}
        if miss_l or miss_r:
            row["testable"] = f"not testable: {miss_l + miss_r} run(s) have no {claim.metric} at the start"
            row.update(left_mean=math.nan, right_mean=math.nan)
        else:
            row["testable"] = ""
            row.update(left_mean=float(left.mean()), right_mean=float(right.mean()))
        row["_values"] = (left, right)
        if claim.direction == "similar" and math.isnan(row["margin"]):
            row["no_margin"] = (why if claim.metric == rules.margin_metric
                                else f"the margin is in {rules.margin_metric}")
        rows.append(row)
    k = sum(1 for r in rows if not r["testable"])
    fw_level = bonferroni_level(rules.level, k)
    for row in rows:
        left, right = row.pop("_values")
        row.update(claims=k, level=rules.level, fw_level=fw_level)
        if row["testable"]:
            row.update(difference=math.nan, ci_low=math.nan, ci_high=math.nan, welch_low=math.nan,
                       welch_high=math.nan, fw_low=math.nan, fw_high=math.nan,
                       verdict=row["testable"], fw_verdict=row["testable"])
            continue
        diff, low, high = pooled_interval(left, right, row["pooled_sd"], row["pooled_df"], rules.level)
        _, w_low, w_high = welch_interval(left, right, rules.level)
        _, f_low, f_high = pooled_interval(left, right, row["pooled_sd"], row["pooled_df"], fw_level)
        row.update(difference=diff, ci_low=low, ci_high=high, welch_low=w_low, welch_high=w_high,
                   fw_low=f_low, fw_high=f_high)
        for name, (lo, hi) in (("verdict", (low, high)), ("fw_verdict", (f_low, f_high))):
            said = verdict(row["direction"], lo, hi, row["margin"])
            row[name] = f"no margin: {row['no_margin']}" if said == "no margin" else said
    return rows


COLUMNS = ["claim", "metric", "measure", "direction", "left", "right", "seeds", "left_mean", "right_mean",
           "difference", "ci_low", "ci_high", "verdict", "welch_low", "welch_high", "fw_low", "fw_high",
           "fw_verdict", "level", "fw_level", "claims", "pooled_sd", "pooled_df", "pooled_cells", "untrained_cells",
           "reference", "fraction", "margin_metric", "rl_effect", "margin"]


def claims_table(runs: pd.DataFrame, claims: Sequence[Claim] = CLAIMS, rules: Rules = RULES) -> pd.DataFrame:
    """One row per claim whose two cells are both among the complete runs, per setting (``task`` and ``model``,
    when the frame has them; a ``setting`` column names it when there are several).

    Columns: claim, metric, measure, direction, left, right, seeds, left_mean and right_mean (of each cell's values
    under the measure), difference, ci_low/ci_high (pooled interval) and verdict, welch_low/welch_high,
    fw_low/fw_high and fw_verdict (the family-wise interval), level and fw_level, claims (k), pooled_sd, pooled_df
    and pooled_cells, untrained_cells (left out of the pool), reference (its label), fraction, margin_metric,
    rl_effect and margin (nan where there is none, or where the claim's metric is not the margin's).
    """
    done = runs[runs["status"] == "complete"] if "status" in runs else runs
    if done.empty:
        return pd.DataFrame(columns=COLUMNS)
    keys = [k for k in ("task", "model") if k in done]
    groups = done.groupby(keys, dropna=False, sort=False) if keys else [((), done)]
    rows = []
    several = bool(keys) and done[keys].drop_duplicates().shape[0] > 1
    for key, group in groups:
        setting = ", ".join(str(v) for v in (key if isinstance(key, tuple) else (key,)))
        for row in _setting_claims(group, claims, rules):
            row.pop("no_margin", None)
            row.pop("testable", None)
            rows.append({**({"setting": setting} if several else {}), **row})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    table = pd.DataFrame(rows)
    return table[[c for c in ("setting", *COLUMNS) if c in table]]


# ---------------------------------------------------------------------------------------------------------------
# Markdown


def in_tokens(metric: str) -> bool:
    """Lengths are in tokens; every other claim metric is a fraction shown in points."""
    return "tokens" in metric


def _digits(values: Sequence[float], metric: str) -> int:
    """Decimals for one row's numbers: one for points; for tokens as many as a change of a fraction of a token
    needs (two below 10 tokens, none from 1,000), the same for every number of the row."""
    if not in_tokens(metric):
        return 1
    largest = max((abs(v) for v in values if v is not None and not math.isnan(v)), default=0.0)
    return 2 if largest < 10 else 1 if largest < 1000 else 0


def _num(value: float, metric: str, signed: bool = True, digits: int = 1) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    scaled = value if in_tokens(metric) else 100 * value
    return f"{scaled:+,.{digits}f}" if signed else f"{scaled:,.{digits}f}"


def _pct(level: float) -> str:
    return f"{100 * level:.2f}".rstrip("0").rstrip(".") + "%"


def _unit(metric: str) -> str:
    return " tok" if in_tokens(metric) else ""


def _notes(table: pd.DataFrame) -> list[str]:
    """The lines under a setting's table: how the intervals were formed, the multiplicity and the margin."""
    first = table.iloc[0]
    pools = []
    for (metric, measure), rows in table.groupby(["metric", "measure"], sort=False):
        r = rows.iloc[0]
        what = f"{'the change in ' if measure == 'change' else 'final '}{metric}"
        sd = "n/a" if math.isnan(r["pooled_sd"]) else _num(r["pooled_sd"], metric, False, _digits([r["pooled_sd"]],
                                                                                                metric))
        unit = "tokens" if in_tokens(metric) else "points"
        pools.append(f"{sd} {unit} on {what} (df {int(r['pooled_df'])})")
    which = "every experiment but the untrained MoA" if first["untrained_cells"] else "every cell of the grid"
    lines = [f"Intervals: Student's t with the seeds' SD pooled over the {int(first['pooled_cells'])} trained cells "
             f"({which}): {'; '.join(pools)}. Welch's interval, from the two cells' own seeds alone, is shown "
             "beside it.",
             f"Multiplicity: {int(first['claims'])} claims put to this task; the family-wise interval is at "
             f"1 - {1 - first['level']:.2f}/{int(first['claims'])} = {_pct(first['fw_level'])} (Bonferroni), so "
             f"all {int(first['claims'])} hold together at {_pct(first['level'])}."]
    margins = table[table["metric"] == table["margin_metric"]]
    if not margins.empty and (table["direction"] == "similar").any():  # the margin judges "about equal" only
        r = margins.iloc[0]
        gain = f"{r['reference']}'s gain in {r['margin_metric']} from before training to after"
        if math.isnan(r["margin"]):
            effect = "none" if math.isnan(r["rl_effect"]) else f"{100 * r['rl_effect']:+.1f} points"
            lines.append(f"About equal: no margin ({gain}: {effect}).")
        else:
            share = "half" if r["fraction"] == 0.5 else f"{r['fraction']:g} x"
            lines.append(f"About equal: within ±{100 * r['margin']:.1f} points, {share} of {gain} "
                         f"({100 * r['rl_effect']:.1f} points, mean over seeds).")
    return lines


def claims_markdown(table: pd.DataFrame) -> str:
    """The claims as a Markdown table per setting, accuracies in points, lengths in tokens, with the intervals'
    rules, the multiplicity and the margin in lines under it."""
    if table.empty:
        return "(no claim has both of its cells among the runs)\n"
    parts = []
    settings = table.groupby("setting", sort=False) if "setting" in table else [(None, table)]
    for setting, rows in settings:
        fw = _pct(rows.iloc[0]["fw_level"])
        level = _pct(rows.iloc[0]["level"])
        lines = [f"**{setting}**\n"] if setting is not None else []
        lines += [f"| claim | cells | seeds | means | difference [{level} CI, pooled] | verdict | Welch {level} CI | "
                  f"family-wise [{fw} CI] | family-wise verdict |", "|---|---|---|---|---|---|---|---|---|"]
        for _, r in rows.iterrows():
            m, unit = r["metric"], _unit(r["metric"])
            change = r["measure"] == "change"
            numbers = ["left_mean", "right_mean", "difference", "ci_low", "ci_high", "welch_low", "welch_high",
                       "fw_low", "fw_high"]
            digits = _digits([r[c] for c in numbers[2:]] if change else [r[c] for c in numbers], m)

            def num(column: str, signed: bool = True, m: str = m, r: pd.Series = r, digits: int = digits) -> str:
                return _num(r[column], m, signed, digits)

            means = f"{'change ' if change else ''}{num('left_mean', change)} vs {num('right_mean', change)}{unit}"
            lines.append(
                f"| {r['claim']} | {r['left']} vs {r['right']} | {r['seeds']} | {means} | "
                f"{num('difference')} [{num('ci_low')}, {num('ci_high')}]{unit} | {r['verdict']} | "
                f"[{num('welch_low')}, {num('welch_high')}]{unit} | [{num('fw_low')}, {num('fw_high')}]{unit} | "
                f"{r['fw_verdict']} |")
        lines += [""] + [f"- {note}" for note in _notes(rows)]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
