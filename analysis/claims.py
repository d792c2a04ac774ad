"""The paper's claims, put to a set of runs: each a difference between two cells with its interval and verdict.

A claim (``claims.yaml``, a data file beside the code, which also holds the rules below) names two cells, a metric,
a measure, a direction and when it was written (before or after the runs it is put to). A cell is named by its
``experiment`` (the named presets of ``conf/experiment``, which the results sweeps use: ``agon``) or by axis values
(``exchange=latent:recap``; several joined by ``,``), for grids swept over an axis rather than over presets. Axis
values are matched among the runs launched without a preset only, so that the claims of an axis sweep are never put
to the paper's design (where they would change the number of claims its family-wise interval counts), and they name
a cell only where they pick out one: where they match runs of several cells (two axes swept, ``exchange=visible``
under both rewards) the claim is not put to those runs. The measure is ``final`` (each run's value after training)
or ``change`` (each run's value after training minus its value at the evaluation before it, ``<metric>_at_start``
in the runs frame): a claim about what training does to a metric that differs between cells before training is
judged on its change.

A within-run claim (``cell:`` and ``than:`` in place of ``left`` and ``right``) compares one cell's mean over its
runs with a fixed number, on a metric each run measures against itself in one evaluation (``paired/...``, from the
runs' eval rows by ``analysis.paired``: the cascade's accuracy minus its drafters' own, conversion after two kinds
of recap). Its interval is the pooled one below with sqrt(1/n) for sqrt(1/n_a + 1/n_b), its floor each run's own SE
(clustered by problem), and it is never narrower than the widest interval of one of its runs: the runs of a cell
evaluate the same problems, so averaging seeds does not shrink what comes of drawing them. Its ``measure: change``
(one cell against a number, or two cells) is each run's final value minus its value at the evaluation before
training, as for any metric, read from both evaluations' rows paired by problem (``<metric>_change``, with its own
SE from both evaluations: the floor and the run's interval); a run whose rows hold no start evaluation leaves the
claim not testable. A claim with a ``task`` is put to that task's runs alone (claims fixed before one study's runs
are not put to another's).

A claim names what its two cells are matched on (``match``): ``steps`` (the default: each run's value after the
training steps of its study), ``tokens`` (each trained run's held-out accuracy curve read at the largest count of
generated tokens every trained run of the setting reaches, on one evaluation design: ``analysis.paired.budget_table``,
its floor the largest binomial SD of the evaluations read) or ``generations`` (the headline at two generations per
answer, ``analysis.tables.generation_runs``: ``eval/accuracy_two_generations``, a cascade's headline itself and a
one-generation headline's self-cascade on the same drafts; for runs from before the evaluation played it the recap
diagnostic's cross-play at the final evaluation, whose floor is the binomial SD over its answers, since it logs no
rows). Two cells whose numbers at equal generations come from different sources are not compared ("not testable").
Only a two-cell claim on ``eval/accuracy`` is matched on anything but steps.

Intervals, per setting (task and model; claims never mix settings):

    pooled      the verdict's interval: Student's t on the difference of the two cells' means, with the seeds' SD
                pooled over every trained cell of the setting (each cell whose method trains, i.e. all but MoA;
                df = sum of n_i - 1), raised to the evaluation floor where it lies below it. With 3 seeds a cell's
                own SD is a poor estimate, and two cells whose seeds happen to agree would get a narrow interval.
                The pool assumes one seed-to-seed noise for all trained cells, which three seeds of each cannot
                tell apart from theirs
    floor       the largest evaluation-sampling SD among the pooled runs: per run, the SD of its final value over
                its own samples with its problems held fixed, sqrt(sum_g s_g^2 / k_g) / G over the G (problem,
                order) groups of its final evaluation, s_g^2 the unbiased variance of the group's k_g samples (for
                accuracy, p(1 - p) k / (k - 1)). Two evaluations of one model differ by that much, so no SD over
                seeds can be smaller. A change claim takes the final's floor, a lower bound (the results packed
                before analysis.pack kept the start evaluation's rows have none of the start's samples); a
                within-run metric's change takes each run's own SE of its change, from both evaluations. Without
                the eval rows (W&B) there is no floor, and the notes say so
    welch       Welch's t on the two cells' own seeds, shown beside it
    family-wise the pooled interval at Bonferroni's level 1 - (1 - level) / k, for the k claims of the setting
                written before their runs that get an interval, with its own verdict: all k hold together

The verdict of an interval, for a claim written before its runs:

    holds        it lies beyond the metric's minimum effect on the claimed side
    reversed     it lies beyond it on the other side
    negligible   it lies within +-minimum effect: no effect of the stated size either way
    unresolved   anything else (it reaches past the minimum effect on a side, and holds 0 or the effect's edge)
    for "about equal": holds when it lies within +-margin (even if it excludes 0: a difference smaller than the
                 margin is what "about equal" means); else differs when it excludes 0; else unresolved. The
                 margin is a fixed number per metric (``equivalence``); a metric without one: "no margin"
    not testable a change claim where a run of its cells has no value at the start (nothing falls back to finals)
    too few seeds no interval can be formed

A claim written after its runs gets "description (written after its runs)" in place of a verdict: its interval is
shown, and it is not counted in k.

Left out on purpose: corrections less conservative than Bonferroni (Holm, false discovery rate): ten claims and
wide intervals, where the simplest rule that a reader can redo by hand is worth more than a little power; any test
across settings (each task is judged on its own); and margins or minimum effects scaled to an observed gain (a
scale read from the runs being judged moves with them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np
import pandas as pd
import yaml

from agon.core.methods import METHODS
from analysis.load import Runs
from analysis.paired import budget_table, runs_with_outcomes
from analysis.stats import pooled_interval, pooled_sd
from analysis.tables import MAIN, eval_floor, final_rows, generation_runs


@dataclass(frozen=True)
class Claim:
    text: str
    # each a cell: an experiment (``agon``) or axis values (``exchange=latent:recap``); ``right`` None for a
    # within-run claim, which compares ``left`` (``cell:`` in claims.yaml) with the number ``than``
    left: str
    right: str | None
    # "greater": left > right; "smaller": left < right; "similar": left about equal to right
    direction: str
    # "before" or "after" the runs it is put to: only a claim written before them gets a verdict
    written: str
    metric: str = "eval/accuracy"
    # "final": the value after training; "change": after training minus before
    measure: str = "final"
    # a within-run claim's fixed number (its cell's mean is compared with it); None for two cells
    than: float | None = None
    # the task (the runs' ``task``) it is put to alone; None: every setting where its cells ran
    task: str | None = None
    # what the two cells are matched on (``MATCHES``): equal training steps (each cell's headline after its steps),
    # equal generated tokens, or equal generations per answer
    match: str = "steps"


@dataclass(frozen=True)
class Rules:
    """How claims are judged (``claims.yaml``, which says why)."""

    # metric -> the "about equal" margin, in the metric's units (accuracy as a fraction)
    margins: dict[str, float]
    # metric -> the smallest difference a directional claim asserts, in the metric's units
    min_effects: dict[str, float]
    # metric -> the eval.jsonl field whose samples it averages (the evaluation floor's)
    floor_fields: dict[str, str]
    # each claim's interval; the family-wise one is at 1 - (1 - level) / k
    level: float
    # the experiment the figures compare against (claims.yaml's ``reference``)
    reference: str


WRITTEN = ("before", "after")
DESCRIPTION = "description (written after its runs)"
# what a claim's two cells are matched on: ``steps`` (the default: each run's value after the training steps it
# ran, one trainer.max_steps for every cell of a study), ``tokens`` (each run's held-out accuracy curve read at the
# largest count of generated tokens every trained run of the setting reaches, on one evaluation design:
# ``analysis.paired.budget_table``'s reading) or ``generations`` (the headline at two generations per answer,
# ``analysis.tables.generation_runs``: ``eval/accuracy_two_generations``, the recap diagnostic's cross-play for
# runs from before it)
MATCHES = ("steps", "tokens", "generations")
# the column a claim at equal generations reads, and the suffix of one at equal tokens (``<metric>@tokens``)
GENERATIONS = "eval/accuracy_two_generations"
AT_TOKENS = "@tokens"
# the metric a claim matched on tokens or generations may name: the curves and the self-cascades are accuracies
MATCHED_METRIC = "eval/accuracy"


def _numbers(section: dict, name: str) -> dict[str, float]:
    """A section of metric -> number, each a positive number as written (never a rule computed from runs)."""
    out = {}
    for metric, value in (section or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"claims.yaml: {name}[{metric!r}] must be a positive number, not {value!r}")
        out[metric] = float(value)
    return out


def parse_claims(data: dict) -> tuple[tuple[Claim, ...], Rules]:
    """The claims and rules of a parsed ``claims.yaml``; a claim without ``written`` is an error."""
    rules = Rules(margins=_numbers(data["equivalence"], "equivalence"),
                  min_effects=_numbers(data["min_effect"], "min_effect"),
                  floor_fields=dict(data.get("floor") or {}), level=float(data["level"]),
                  reference=str(data["reference"]))
    claims = []
    for raw in data["claims"]:
        raw = dict(raw)
        if "cell" in raw:  # a within-run claim: one cell against ``than``
            raw["left"] = raw.pop("cell")
            raw.setdefault("right", None)
        claim = Claim(**raw)
        if claim.written not in WRITTEN:
            raise ValueError(f"claims.yaml: {claim.text!r}: written must be before or after, not {claim.written!r}")
        if (claim.right is None) == (claim.than is None):
            raise ValueError(f"claims.yaml: {claim.text!r}: name two cells (left, right) or one cell and a number "
                             "(cell, than)")
        if claim.match not in MATCHES:
            raise ValueError(f"claims.yaml: {claim.text!r}: match must be one of {', '.join(MATCHES)}, not "
                             f"{claim.match!r}")
        if claim.match != "steps" and (claim.right is None or claim.metric != MATCHED_METRIC):
            raise ValueError(f"claims.yaml: {claim.text!r}: match {claim.match} compares two cells on "
                             f"{MATCHED_METRIC} (a within-run claim and any other metric are matched on steps)")
        if claim.match == "tokens" and claim.measure != "final":
            raise ValueError(f"claims.yaml: {claim.text!r}: match tokens reads a final value (a curve at a token "
                             "count has no value of its own at the start)")
        claims.append(claim)
    return tuple(claims), rules


def load_claims() -> tuple[tuple[Claim, ...], Rules]:
    """The claims and rules of ``claims.yaml`` (installed with the package)."""
    return parse_claims(yaml.safe_load(resources.files("analysis").joinpath("claims.yaml").read_text()))


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


def bonferroni_level(level: float, k: int) -> float:
    """The level of each of k intervals that hold together at ``level``: 1 - (1 - level) / k."""
    return 1 - (1 - level) / max(k, 1)


def run_floors(runs: pd.DataFrame, evals: pd.DataFrame | None, field: str) -> pd.Series:
    """``eval_floor`` of each run (index as ``runs``); nan for runs without eval rows, and for all without
    ``evals``."""
    if evals is None or evals.empty or not field:
        return pd.Series(math.nan, index=runs.index)
    return pd.Series([eval_floor(final_rows(evals, run), field) for _, run in runs.iterrows()], index=runs.index)


# ---------------------------------------------------------------------------------------------------------------
# verdicts


def verdict(direction: str, low: float, high: float, margin: float = math.nan, min_effect: float = 0.0) -> str:
    """holds, reversed, negligible or unresolved, beyond ``min_effect`` (see the module's docstring); for "similar"
    holds (within +-margin), differs or unresolved, and "no margin" when ``margin`` is nan; "no minimum effect"
    when ``min_effect`` is nan. Intervals are closed: one that ends at the edge holds the edge."""
    if math.isnan(low):
        return "too few seeds"
    if direction == "similar":
        if math.isnan(margin):
            return "no margin"
        if -margin <= low and high <= margin:
            return "holds"
        return "differs" if low > 0 or high < 0 else "unresolved"
    if math.isnan(min_effect):
        return "no minimum effect"
    above, below = low > min_effect, high < -min_effect
    if direction == "smaller":
        above, below = below, above
    if above or below:
        return "holds" if above else "reversed"
    # min_effect 0 has no "negligible" band: an interval within [0, 0] is a point that holds 0
    return "negligible" if min_effect > 0 and -min_effect <= low and high <= min_effect else "unresolved"


# ---------------------------------------------------------------------------------------------------------------
# the table


def _trains(method: object) -> bool:
    """Whether a method trains (``agon.core.methods``); one this process does not know counts as trained."""
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
    value, or with ``measure`` "change" the final minus ``<metric>_at_start``; for a within-run metric whose runs
    give their own change (``<metric>_change``, ``analysis.paired``: final minus start per problem, over the
    problems of both evaluations) that change. Runs without a final value are left out (the metric does not apply
    to them)."""
    final = pd.to_numeric(rows[metric], errors="coerce") if metric in rows else pd.Series(math.nan, rows.index)
    if measure == "final":
        return final.dropna().to_numpy(float), 0
    if measure != "change":
        raise ValueError(f"measure {measure!r}: choose 'final' or 'change'")
    has_final = final.notna()
    if f"{metric}_change" in rows:
        change = pd.to_numeric(rows[f"{metric}_change"], errors="coerce")
        return change[has_final & change.notna()].to_numpy(float), int((has_final & change.isna()).sum())
    start_key = f"{metric}_at_start"
    start = pd.to_numeric(rows[start_key], errors="coerce") if start_key in rows else pd.Series(math.nan, rows.index)
    return (final - start)[has_final & start.notna()].to_numpy(float), int((has_final & start.isna()).sum())


def own_se_column(rows: pd.DataFrame, metric: str, measure: str) -> str | None:
    """The column whose ``_se`` and ``_df`` hold each run's own SE of a within-run ``metric`` under ``measure``:
    ``<metric>_change`` for a change (its SE from both evaluations), else ``metric``; None for a metric without a
    per-run SE (its floor is ``run_floors``)."""
    name = f"{metric}_change" if measure == "change" else metric
    if f"{name}_se" in rows:
        return name
    return metric if f"{metric}_se" in rows else None


def run_floors_of(runs: pd.DataFrame, evals: pd.DataFrame | None, metric: str, rules: Rules,
                  measure: str = "final") -> pd.Series:
    """Each run's evaluation floor on ``metric`` under ``measure``: for a within-run metric (one with a per-run SE,
    ``<metric>_se``, from ``analysis.paired``) that SE (of its change, ``<metric>_change_se``, for a change where
    the runs have it), else ``run_floors`` of the metric's eval field (the final's, for a change too)."""
    name = own_se_column(runs, metric, measure)
    if name is not None:
        values = pd.to_numeric(runs[name], errors="coerce") if name in runs else pd.Series(math.nan, runs.index)
        return pd.to_numeric(runs[f"{name}_se"], errors="coerce").where(values.notna())
    return run_floors(runs, evals, rules.floor_fields.get(metric, ""))


def one_cell_interval(values: np.ndarray, than: float, sd: float, df: int, run_halves: Sequence[float],
                      level: float = 0.95) -> tuple[float, float, float]:
    """(mean(values) - than, low, high) of a within-run claim: diff +- t_df * sd / sqrt(n), with ``sd`` pooled
    elsewhere, and never narrower than the widest of ``run_halves`` (each run's own interval's half-width at
    ``level``: the runs of a cell evaluate the same problems, so averaging seeds does not shrink what comes of
    drawing them). nan bounds without a value, or without a pooled SD and a run's interval."""
    from scipy import stats

    if not len(values):
        return math.nan, math.nan, math.nan
    diff = float(values.mean() - than)
    halves = [h for h in run_halves if not math.isnan(h)]
    half = max(halves) if halves else math.nan
    if df >= 1 and not math.isnan(sd):
        pooled = float(stats.t.ppf(0.5 + level / 2, df)) * sd / math.sqrt(len(values))
        half = pooled if math.isnan(half) else max(half, pooled)
    return diff, diff - half, diff + half


def _run_halves(rows: pd.DataFrame, metric: str, level: float) -> list[float]:
    """Each of a cell's runs' own interval half-width on a within-run ``metric`` at ``level``: t with its
    ``<metric>_df`` times its ``<metric>_se``; none for a metric without them."""
    from scipy import stats

    if f"{metric}_se" not in rows or f"{metric}_df" not in rows:
        return []
    se = pd.to_numeric(rows[f"{metric}_se"], errors="coerce")
    df = pd.to_numeric(rows[f"{metric}_df"], errors="coerce")
    return [float(stats.t.ppf(0.5 + level / 2, d)) * s for s, d in zip(se, df)
            if not math.isnan(s) and not math.isnan(d) and d >= 1]


def _one_sample_t(values: np.ndarray, than: float, level: float) -> tuple[float, float, float]:
    """(mean - than, low, high): Student's t on a cell's own seeds (shown beside a within-run claim where a
    two-cell claim shows Welch's)."""
    from scipy import stats

    diff = float(values.mean() - than) if len(values) else math.nan
    if len(values) < 2:
        return diff, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, len(values) - 1)) * values.std(ddof=1) / math.sqrt(len(values))
    return diff, diff - half, diff + half


def matched_column(claim: Claim) -> str:
    """The runs-frame column a claim's values come from: its metric at equal steps, ``GENERATIONS`` at equal
    generations, ``<metric>@tokens`` at equal tokens (``with_generations`` and ``with_tokens`` add them)."""
    return {"steps": claim.metric, "generations": GENERATIONS}.get(claim.match, claim.metric + AT_TOKENS)


def _empty(frame: pd.DataFrame | None) -> pd.DataFrame:
    return frame if frame is not None else pd.DataFrame()


def with_generations(done: pd.DataFrame, evals: pd.DataFrame | None, steps: pd.DataFrame | None) -> pd.DataFrame:
    """``done`` with each run's headline at two generations per answer in ``GENERATIONS`` (``generation_runs``: the
    main evaluation's number where every run of its cell logged one, else the diagnostic's cross-play), its floor in
    ``<GENERATIONS>_se`` (what ``run_floors_of`` reads) and where it comes from in ``<GENERATIONS>_reading``. A
    cell read from the diagnostic has no start value (its runs logged none at the main evaluation), so a change
    claim on it is not testable."""
    per_run = generation_runs(Runs(done, _empty(steps), _empty(evals)))
    done = done.copy()
    done[GENERATIONS] = per_run["two"]
    done[f"{GENERATIONS}_se"] = per_run["floor"]
    done[f"{GENERATIONS}_reading"] = [f"{r['source']}, {r['design']}" if r["source"] else ""
                                      for _, r in per_run.reindex(done.index).fillna("").iterrows()]
    start = f"{GENERATIONS}_at_start"
    if start in done:
        done[start] = done[start].where(per_run["source"].reindex(done.index) == MAIN)
    return done


def with_tokens(done: pd.DataFrame, evals: pd.DataFrame | None, steps: pd.DataFrame | None,
                metric: str = MATCHED_METRIC) -> pd.DataFrame:
    """``done`` with each trained run's ``metric`` at equal generated tokens in ``<metric>@tokens``: its held-out
    curve read at the largest token count every trained run of ``done`` reaches, each curve on one evaluation
    design (``analysis.paired.budget_table``, one run an arm), its floor (the largest binomial SD of the evaluations
    read, as there) in ``<metric>@tokens_se`` and the count in ``<metric>@tokens_reading``. Untrained runs (MoA,
    whose only evaluation is at 0 tokens) are left out: they would pin every curve at 0. No column without
    ``steps``."""
    if steps is None or steps.empty or "run_id" not in done:
        return done
    trained = done[[_trains(m) for m in done["method"]]] if "method" in done else done
    budget = budget_table(steps, trained, "run_id", metric=metric, evals=evals)
    read = budget[(budget["x"] == "train/generated_tokens") & (budget["kind"] == "arm")]
    if read.empty:
        return done
    column = metric + AT_TOKENS
    done = done.copy()
    done[column] = done["run_id"].map(dict(zip(read["left"], read["value"])))
    done[f"{column}_se"] = float(read["floor"].iloc[0])
    done[f"{column}_reading"] = f"at {read['at'].iloc[0]:,.0f} generated tokens"
    return done


def _reading(rows: pd.DataFrame, column: str) -> str:
    """Where a cell's matched values come from (``<column>_reading``), "" at equal steps."""
    key = f"{column}_reading"
    return ", ".join(sorted({str(r) for r in rows[key] if r})) if key in rows else ""


def _setting_claims(done: pd.DataFrame, claims: Sequence[Claim], rules: Rules,
                    evals: pd.DataFrame | None, steps: pd.DataFrame | None = None) -> list[dict]:
    """The rows of one setting's claims (see ``claims_table``)."""
    task = done["task"].iloc[0] if "task" in done else None
    claims = [c for c in claims if c.task is None or c.task == task]
    if any(c.metric.startswith("paired/") and c.metric not in done for c in claims):
        done = runs_with_outcomes(done, evals)
    if any(c.match == "generations" for c in claims):
        done = with_generations(done, evals, steps)
    if any(c.match == "tokens" for c in claims):
        done = with_tokens(done, evals, steps)
    cells = [rows for _, rows in done.groupby(_cell_column(done), sort=False)]
    trained = [rows for rows in cells if _trains(rows["method"].iloc[0] if "method" in rows else None)]
    pools: dict[tuple[str, str], tuple[float, int, float, float, int]] = {}
    rows = []
    for claim in claims:
        # the column its values come from: the metric itself at equal steps, else its matched reading
        column = matched_column(claim)
        if column not in done:
            continue
        within = claim.right is None
        left_rows = cell_runs(done, claim.left)
        right_rows = None if within else cell_runs(done, claim.right)
        if left_rows is None or (right_rows is None and not within):
            continue  # a cell did not run (or its axis values name no single cell here)
        left, miss_l = claim_values(left_rows, column, claim.measure)
        right, miss_r = (np.array([]), 0) if within else claim_values(right_rows, column, claim.measure)
        if (not len(left) and not miss_l) or (not within and not len(right) and not miss_r):
            continue  # the metric does not apply to a cell
        key = (column, claim.measure)
        if key not in pools:
            values = [claim_values(rows, *key)[0] for rows in trained]
            seed_sd, df = pooled_sd(values)
            # the floor of the runs pooled; a change claim takes its final's (a lower bound), but on a within-run
            # metric each run's own SE of its change
            floors = pd.concat([run_floors_of(rows, evals, column, rules, claim.measure)
                                for rows in trained]) if trained else pd.Series(dtype=float)
            floor = float(floors.max()) if floors.notna().any() else math.nan
            sd = seed_sd if math.isnan(floor) or math.isnan(seed_sd) else max(seed_sd, floor)
            # the trained cells the metric applies to (a within-run metric: those with a cascade)
            applies = sum(1 for rows in trained if column in rows
                          and pd.to_numeric(rows[column], errors="coerce").notna().any())
            pools[key] = (sd, df, seed_sd, floor, applies)
        sd, df, seed_sd, floor, pooled_cells = pools[key]
        readings = [_reading(left_rows, column)] + ([] if within else [_reading(right_rows, column)])
        row = {"claim": claim.text, "written": claim.written, "metric": claim.metric, "measure": claim.measure,
               "match": claim.match, "reading": " vs ".join(dict.fromkeys(readings)) if any(readings) else "",
               "direction": claim.direction, "left": claim.left,
               "right": f"{claim.than:g}" if within else claim.right,
               "seeds": f"{len(left) + miss_l}" if within else f"{len(left) + miss_l} vs {len(right) + miss_r}",
               "pooled_sd": sd, "pooled_df": df, "seed_sd": seed_sd, "eval_floor": floor,
               "pooled_cells": pooled_cells, "untrained_cells": len(cells) - len(trained),
               "margin": rules.margins.get(claim.metric, math.nan) if claim.direction == "similar" else math.nan,
               "min_effect": (rules.min_effects.get(claim.metric, math.nan) if claim.direction != "similar"
                              else math.nan),
               "than": claim.than if within else math.nan}
        sources = {r.split(",")[0] for r in readings}
        if claim.match == "generations" and len(sources) > 1:
            # one cell's runs from before the main evaluation played the self-cascades: its number is read on the
            # diagnostic's own drafts and size, the other's on the main evaluation's; no difference of the two
            row["testable"] = f"not testable: its cells' numbers come from {' and '.join(sorted(sources))}"
            row.update(left_mean=math.nan, right_mean=math.nan)
        elif miss_l or miss_r:
            row["testable"] = f"not testable: {miss_l + miss_r} run(s) have no {column} at the start"
            row.update(left_mean=math.nan, right_mean=math.nan)
        else:
            row["testable"] = ""
            row.update(left_mean=float(left.mean()), right_mean=claim.than if within else float(right.mean()))
        row["_values"] = (left, right, left_rows)
        rows.append(row)
    # only the claims written before their runs are tests: they alone count in k
    k = sum(1 for r in rows if not r["testable"] and r["written"] == "before")
    fw_level = bonferroni_level(rules.level, k)
    for row in rows:
        left, right, left_rows = row.pop("_values")
        row.update(claims=k, level=rules.level, fw_level=fw_level)
        if row["testable"]:
            row.update(difference=math.nan, ci_low=math.nan, ci_high=math.nan, welch_low=math.nan,
                       welch_high=math.nan, fw_low=math.nan, fw_high=math.nan,
                       verdict=row["testable"], fw_verdict=row["testable"])
            continue

        def interval(level: float, left: np.ndarray = left, right: np.ndarray = right,
                     left_rows: pd.DataFrame = left_rows, row: dict = row) -> tuple[float, float, float]:
            if not math.isnan(row["than"]):
                own = own_se_column(left_rows, row["metric"], row["measure"])
                halves = ([] if own is None else
                          _run_halves(left_rows.loc[pd.to_numeric(left_rows[own], errors="coerce").notna()], own,
                                      level))
                return one_cell_interval(left, row["than"], row["pooled_sd"], row["pooled_df"], halves, level)
            return pooled_interval(left, right, row["pooled_sd"], row["pooled_df"], level)

        diff, low, high = interval(rules.level)
        _, w_low, w_high = (welch_interval(left, right, rules.level) if math.isnan(row["than"])
                            else _one_sample_t(left, row["than"], rules.level))
        row.update(difference=diff, ci_low=low, ci_high=high, welch_low=w_low, welch_high=w_high)
        if row["written"] != "before":
            # a description: its interval, no verdict, and no family-wise interval (it is in no family)
            row.update(fw_low=math.nan, fw_high=math.nan, verdict=DESCRIPTION, fw_verdict=DESCRIPTION)
            continue
        _, f_low, f_high = interval(fw_level)
        row.update(fw_low=f_low, fw_high=f_high)
        for name, (lo, hi) in (("verdict", (low, high)), ("fw_verdict", (f_low, f_high))):
            said = verdict(row["direction"], lo, hi, row["margin"], row["min_effect"])
            row[name] = (f"no margin: none fixed for {row['metric']}" if said == "no margin"
                         else f"no minimum effect: none fixed for {row['metric']}" if said == "no minimum effect"
                         else said)
    return rows


COLUMNS = ["claim", "written", "metric", "measure", "match", "reading", "direction", "left", "right", "seeds",
           "left_mean", "right_mean", "difference", "ci_low", "ci_high", "verdict", "welch_low", "welch_high",
           "fw_low", "fw_high", "fw_verdict", "level", "fw_level", "claims", "pooled_sd", "pooled_df", "seed_sd",
           "eval_floor", "pooled_cells", "untrained_cells", "margin", "min_effect", "than"]


def claims_table(runs: pd.DataFrame, claims: Sequence[Claim] = CLAIMS, rules: Rules = RULES,
                 evals: pd.DataFrame | None = None, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per claim whose two cells are both among the complete runs (a within-run claim: whose cell is), per
    setting (``task`` and ``model``, when the frame has them; a ``setting`` column names it when there are several;
    a claim with a ``task`` is put to that task's setting alone). ``evals``: the runs' eval rows
    (``load_runs(...).evals``), from which each run's evaluation floor is computed, and a within-run metric
    (``paired/...``, ``analysis.paired``); without them there is no floor and no within-run claim. ``steps``: the
    runs' steps frame, whose curves a claim matched on tokens reads (without it no such claim is put); a claim
    matched on generations reads the runs frame (and its eval rows for the floor).

    Columns: claim, written, metric, measure, match (``MATCHES``), reading (where a matched claim's values come
    from, per cell: "main evaluation, 300 x 16", "diagnostic cross-play, 300 x 1", "at 2,082,636 generated
    tokens"; "" at equal steps), direction, left, right, seeds, left_mean and right_mean (of each
    cell's values under the measure), difference, ci_low/ci_high (pooled interval) and verdict, welch_low/welch_high,
    fw_low/fw_high and fw_verdict (the family-wise interval; nan for a claim written after its runs), level and
    fw_level, claims (k), pooled_sd (the SD the intervals use: max(seed_sd, eval_floor)), pooled_df, seed_sd (the
    seeds' pooled SD), eval_floor (nan without eval rows), pooled_cells, untrained_cells (left out of the pool),
    margin (nan but on "about equal" claims), min_effect (nan on "about equal" claims) and than (a within-run
    claim's number, which ``right`` and ``right_mean`` also hold; nan for two cells).
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
        for row in _setting_claims(group, claims, rules, evals, steps):
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


def _sd(value: float, metric: str) -> str:
    return "n/a" if math.isnan(value) else _num(value, metric, False, _digits([value], metric))


def _notes(table: pd.DataFrame) -> list[str]:
    """The lines under a setting's table: how the intervals were formed (the seeds' SD, the floor and which of them
    the intervals use), the multiplicity, the minimum effects and the margin."""
    first = table.iloc[0]
    table = table.assign(match=table["match"] if "match" in table else "steps")
    pools = []
    for (metric, measure, match), rows in table.groupby(["metric", "measure", "match"], sort=False):
        r = rows.iloc[0]
        what = f"{'the change in ' if measure == 'change' else 'final '}{metric}"
        what += "" if match == "steps" else f" at equal {match}"
        unit = "tokens" if in_tokens(metric) else "points"
        if math.isnan(r["eval_floor"]):
            floor = "no evaluation floor (the runs' eval rows were not read)"
        else:
            # one seed per cell: no SD over seeds (df 0) to hold against the floor, and no interval from it
            used = ("no SD over seeds to compare" if math.isnan(r["seed_sd"])
                    else "used" if r["eval_floor"] > r["seed_sd"] else "below it")
            floor = f"evaluation floor {_sd(r['eval_floor'], metric)}, {used}"
        pools.append(f"{_sd(r['pooled_sd'], metric)} {unit} on {what} (seeds {_sd(r['seed_sd'], metric)}, df "
                     f"{int(r['pooled_df'])}; {floor})")
    which = "every experiment but the untrained MoA" if first["untrained_cells"] else "every cell of the grid"
    lines = [f"Intervals: Student's t with the seeds' SD pooled over the {int(first['pooled_cells'])} trained cells "
             f"({which}), never below the largest evaluation-sampling SD of one pooled run: {'; '.join(pools)}. "
             "Welch's interval, from the two cells' own seeds alone, is shown beside it."]
    within = table[table["than"].notna()] if "than" in table else table.iloc[:0]
    if len(within):
        metrics = ", ".join(dict.fromkeys(within["metric"]))
        lines.append(f"Within-run claims ({metrics}; analysis.paired): one cell's mean over its runs against a "
                     "fixed number, the SD pooled over the trained cells the metric applies to and never below the "
                     "largest per-run SE (clustered by problem), the interval never narrower than the widest of "
                     "one of its runs (they share their problems); beside it Student's t on the cell's own seeds "
                     "in place of Welch's.")
    matched = table[table["match"] != "steps"]
    if len(matched):
        lines.append("Match: each claim compares its cells at equal training steps (`steps`: each cell's headline "
                     "after the steps of its study) unless it says otherwise.")
    if (matched["match"] == "generations").any():
        lines.append("At equal generations (`generations`): each cell's headline at two generations per answer, "
                     "`eval/accuracy_two_generations` of its final evaluation (a cascade's headline itself; a "
                     "one-generation headline's self-cascade on the very same drafts, GRPO's A>A); for runs from "
                     "before the evaluation played the self-cascades, the recap diagnostic's cross-play at the final "
                     "evaluation (the same orders on the diagnostic's own drafts; `analysis.tables.generation_runs`), "
                     "which logs its accuracy alone, no rows, so its floor is the binomial SD over its answers. The "
                     "match column says which and at what size (problems x samples); two cells read from different "
                     "sources are not compared.")
    if (matched["match"] == "tokens").any():
        lines.append("At equal tokens (`tokens`): each trained run's held-out accuracy curve read at the largest "
                     "count of generated tokens every trained run of the setting reaches, each curve on one "
                     "evaluation design (`analysis.paired.budget_table`, as `paired.md` reads it); its floor is the "
                     "largest binomial SD of the evaluations read.")
    k, after = int(first["claims"]), int((table["written"] != "before").sum())
    if k:
        lines.append(f"Multiplicity: {k} claims written before their runs put to this task; the family-wise "
                     f"interval is at 1 - {1 - first['level']:.2f}/{k} = {_pct(first['fw_level'])} (Bonferroni), "
                     f"so all {k} hold together at {_pct(first['level'])}.")
    if after:
        lines.append(f"Written after their runs: {after} claim(s), shown as descriptions with their "
                     f"{_pct(first['level'])} interval and no verdict.")
    tested = table[(table["written"] == "before") & (table["direction"] != "similar")]
    effects = {m: e for m, e in zip(tested["metric"], tested["min_effect"])}
    if effects:
        said = "; ".join(f"{_sd(e, m)} {'tokens' if in_tokens(m) else 'points'} on {m}" for m, e in effects.items())
        lines.append(f"Minimum effect (analysis/claims.yaml): a directional claim holds only when its interval lies "
                     f"beyond it on the claimed side: {said}.")
    similar = table[(table["written"] == "before") & (table["direction"] == "similar")]
    for metric, margin in dict(zip(similar["metric"], similar["margin"])).items():
        lines.append(f"About equal: within ±{_sd(margin, metric)} {'tokens' if in_tokens(metric) else 'points'} "
                     f"on {metric}, fixed in analysis/claims.yaml." if not math.isnan(margin)
                     else f"About equal: no margin fixed for {metric}.")
    return lines


def claims_markdown(table: pd.DataFrame) -> str:
    """The claims as a Markdown table per setting, accuracies in points, lengths in tokens, with the intervals'
    rules, the multiplicity, the minimum effects and the margin in lines under it."""
    if table.empty:
        return "(no claim has both of its cells among the runs)\n"
    parts = []
    settings = table.groupby("setting", sort=False) if "setting" in table else [(None, table)]
    for setting, rows in settings:
        fw = _pct(rows.iloc[0]["fw_level"])
        level = _pct(rows.iloc[0]["level"])
        lines = [f"**{setting}**\n"] if setting is not None else []
        lines += [f"| claim | written | cells | match | seeds | means | difference [{level} CI, pooled] | verdict | "
                  f"Welch {level} CI | family-wise [{fw} CI] | family-wise verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for _, r in rows.iterrows():
            m, unit = r["metric"], _unit(r["metric"])
            change = r["measure"] == "change"
            numbers = ["left_mean", "right_mean", "difference", "ci_low", "ci_high", "welch_low", "welch_high",
                       "fw_low", "fw_high"]
            digits = _digits([r[c] for c in numbers[2:]] if change else [r[c] for c in numbers], m)

            def num(column: str, signed: bool = True, m: str = m, r: pd.Series = r, digits: int = digits) -> str:
                return _num(r[column], m, signed, digits)

            # a within-run metric is a difference within each run: signed (a within-run claim: against its number)
            within = not math.isnan(r.get("than", math.nan))
            signed = change or within or str(m).startswith("paired/")
            means = f"{'change ' if change else ''}{num('left_mean', signed)} vs {num('right_mean', signed)}{unit}"
            cells = f"{r['left']} (within run)" if within else f"{r['left']} vs {r['right']}"
            # a description is in no family: no family-wise interval or verdict
            family = ("- | - |" if r["written"] != "before" else
                      f"[{num('fw_low')}, {num('fw_high')}]{unit} | {r['fw_verdict']} |")
            # what the cells are matched on, and for a matched reading where its numbers come from
            match = str(r.get("match", "steps"))
            match += f" ({r['reading']})" if r.get("reading") else ""
            lines.append(
                f"| {r['claim']} | {r['written']} | {cells} | {match} | {r['seeds']} | {means} | "
                f"{num('difference')} [{num('ci_low')}, {num('ci_high')}]{unit} | {r['verdict']} | "
                f"[{num('welch_low')}, {num('welch_high')}]{unit} | {family}")
        lines += [""] + [f"- {note}" for note in _notes(rows)]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
