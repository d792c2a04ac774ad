"""The paper's claims, put to a set of runs: each a difference between two cells, with a 95% interval over seeds.

A claim (``claims.yaml``, a data file beside the code) names two cells by their ``experiment`` (the named
presets of ``conf/experiment``, which the results sweeps use), a metric and a direction. The difference of the
cells' means over seeds gets Welch's t interval (the seeds of two cells are independent runs; their variances
need not be equal). The verdict:

    holds        the interval lies on the claimed side of 0
    reversed     it lies on the other side
    unresolved   it holds 0 (for a claim of "about equal": "holds" when it holds 0 and is narrower than
                 ``SIMILAR_WITHIN`` on each side, else "unresolved")

Left out on purpose: corrections for testing several claims at once; the table reports intervals, and a reader
who wants a family-wise level widens them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import numpy as np
import pandas as pd
import yaml

# "about equal" holds when the whole 95% interval of the difference is within this many points of accuracy
SIMILAR_WITHIN = 0.05


@dataclass(frozen=True)
class Claim:
    text: str
    left: str
    right: str
    # "greater": left > right; "smaller": left < right; "similar": left about equal to right
    direction: str
    metric: str = "eval/accuracy"


def load_claims() -> tuple[Claim, ...]:
    """The claims of ``claims.yaml`` (installed with the package), which says where each comes from."""
    data = yaml.safe_load(resources.files("analysis").joinpath("claims.yaml").read_text())
    return tuple(Claim(**c) for c in data["claims"])


CLAIMS = load_claims()


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


def verdict(direction: str, low: float, high: float) -> str:
    if math.isnan(low):
        return "too few seeds"
    if direction == "similar":
        return "holds" if low >= -SIMILAR_WITHIN and high <= SIMILAR_WITHIN else \
            ("differs" if low > 0 or high < 0 else "unresolved")
    above, below = low > 0, high < 0
    if direction == "smaller":
        above, below = below, above
    return "holds" if above else "reversed" if below else "unresolved"


def claims_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per claim whose two cells are both present among the complete runs."""
    done = runs[runs["status"] == "complete"] if "status" in runs else runs
    rows = []
    if "experiment" not in done:
        return pd.DataFrame(rows)
    for claim in CLAIMS:
        if claim.metric not in done:
            continue
        values = {side: pd.to_numeric(done[done["experiment"] == name][claim.metric], errors="coerce").dropna()
                  .to_numpy(float) for side, name in (("left", claim.left), ("right", claim.right))}
        if not len(values["left"]) or not len(values["right"]):
            continue
        diff, low, high = welch_interval(values["left"], values["right"])
        rows.append({"claim": claim.text, "metric": claim.metric, "left": claim.left, "right": claim.right,
                     "seeds": f"{len(values['left'])} vs {len(values['right'])}",
                     "left_mean": float(values["left"].mean()), "right_mean": float(values["right"].mean()),
                     "difference": diff, "ci_low": low, "ci_high": high,
                     "verdict": verdict(claim.direction, low, high)})
    return pd.DataFrame(rows)


def claims_markdown(table: pd.DataFrame) -> str:
    """The claims as a Markdown table: accuracies in points, lengths in tokens."""
    if table.empty:
        return "(no claim has both of its cells among the runs)\n"
    lines = ["| claim | cells | seeds | means | difference [95% CI] | verdict |", "|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        scale, unit = (100, "") if r["metric"] == "eval/accuracy" else (1, " tok")

        def num(v: float) -> str:
            return "n/a" if math.isnan(v) else f"{v * scale:+.1f}" if scale == 100 else f"{v * scale:+.0f}"

        means = f"{r['left_mean'] * scale:.1f} vs {r['right_mean'] * scale:.1f}{unit}"
        lines.append(f"| {r['claim']} | {r['left']} vs {r['right']} | {r['seeds']} | {means} | "
                     f"{num(r['difference'])} [{num(r['ci_low'])}, {num(r['ci_high'])}]{unit} | {r['verdict']} |")
    return "\n".join(lines) + "\n"
