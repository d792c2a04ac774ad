"""The pooled-SD interval both ``analysis.claims`` and ``analysis.paired`` put their differences in.

    pooled_sd        the SD pooled over groups (cells, arms): sqrt(sum (n_i - 1) s_i^2 / df), df = sum (n_i - 1);
                     a group of one value adds nothing
    pooled_interval  Student's t on the difference of two groups' means with an SD pooled elsewhere:
                     diff +- t_df * sd * sqrt(1/n_a + 1/n_b), so a group of one value still gets an interval

Pure functions of numbers: which groups are pooled, and the floor an SD is raised to (an evaluation's own sampling
SD, a binomial SD), are the callers' (``analysis.claims`` says why for claims, ``analysis.paired`` for arms at equal
budgets). This module imports nothing from ``analysis``, so that both can import it.

Left out on purpose: Welch's interval and the one-cell interval of a within-run claim (``analysis.claims`` alone
uses them), and any bootstrap (a t interval on a handful of seeds is what a reader can redo by hand).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


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
