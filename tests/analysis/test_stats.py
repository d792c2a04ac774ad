"""analysis.stats: the pooled SD and the interval with it, by hand and against scipy's equal-variance t."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.stats import pooled_interval, pooled_sd


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
