"""The Optuna search space as ``hydra.sweeper.params`` writes it (``agon.training.tune.distribution``): every kind,
with and without each flag, parsed into the distribution Optuna is asked for, and every entry of the shipped sweeps.

A flag lost on the way (``log`` of an ``int``, say) still parses and still runs a study: only the values the
sampler draws change (uniform instead of log-uniform), which no study result reveals. So each kind is checked with
each flag against the distribution written by hand, and the flag is followed into what Optuna samples.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from agon.core.config import ConfigError
from agon.training.tune import distribution, first_value

D = optuna.distributions
ROOT = Path(__file__).resolve().parents[1]

# every kind with every flag it takes, as written in a sweep file -> the distribution it must be
SPACE = {
    "float(0.0, 2.0)": D.FloatDistribution(0.0, 2.0),
    "float(1e-4, 1e-2, log)": D.FloatDistribution(1e-4, 1e-2, log=True),
    "float( 0.5 ,8 , log )": D.FloatDistribution(0.5, 8.0, log=True),
    "int(1, 8)": D.IntDistribution(1, 8),
    "int(1, 1024, log)": D.IntDistribution(1, 1024, log=True),
    "int(2,64,log)": D.IntDistribution(2, 64, log=True),
    "choice(grpo, dapo, 3, 0.5, true)": D.CategoricalDistribution(["grpo", "dapo", 3, 0.5, True]),
}


@pytest.mark.parametrize("spec", list(SPACE))
def test_each_kind_with_each_flag_is_the_distribution_written_by_hand(spec):
    """Catches a flag of a distribution dropped or misread while parsing (``log`` of an ``int`` or a ``float``, the
    type of a choice): the parsed distribution must equal the hand-written one, flag included."""
    got = distribution("k", spec)
    want = SPACE[spec]
    assert got == want and type(got) is type(want)
    assert getattr(got, "log", None) == getattr(want, "log", None)


@pytest.mark.parametrize("kind", ["int", "float"])
def test_a_log_flag_reaches_what_optuna_samples(kind, tmp_path):
    """The flag in effect, not only on the object: Optuna's random sampler on a log scale over 1..1024 puts about
    half its draws below 32 (uniform: 3%). A flag lost between the sweep file and ``study.ask`` fails here."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    space = {"x": distribution("x", f"{kind}(1, 1024, log)")}
    draws = [study.ask(space).params["x"] for _ in range(200)]
    assert all(1 <= x <= 1024 for x in draws)
    assert sum(x < 32 for x in draws) > 60


def test_a_misspelt_flag_or_a_wrong_arity_is_refused_naming_the_key():
    """A flag that is not ``log`` is not silently dropped: the study fails before its first trial."""
    for spec in ("int(1, 8, lg)", "float(0, 1, log, log)", "float(0)", "uniform(0, 1)"):
        with pytest.raises(ConfigError, match=r"hydra.sweeper.params.k="):
            distribution("k", spec)


def test_every_shipped_sweeps_space_parses_with_its_flags():
    """Every ``hydra.sweeper.params`` entry in ``sweeps/``: parsed, its first value inside it, and a ``log`` written
    in the file is a log distribution (the file is the spec: what it says is what Optuna gets)."""
    found = 0
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        params = ((yaml.safe_load(path.read_text()) or {}).get("hydra", {}).get("sweeper", {}) or {}).get("params")
        for key, spec in (params or {}).items():
            if not str(spec).lstrip().startswith(("float(", "int(", "choice(")):
                continue  # a grid's comma list (the basic sweeper's), not an Optuna space
            found += 1
            dist = distribution(key, spec)
            assert dist._contains(dist.to_internal_repr(first_value(dist))), (path.name, key)
            flags = [a.strip() for a in str(spec).split("(", 1)[1].rstrip(") ").split(",")[2:]]
            assert getattr(dist, "log", False) == ("log" in flags), (path.name, key, spec)
    assert found >= 3, "premise: the shipped study has a search space"
