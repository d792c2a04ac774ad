"""Gates outside the analysis, each put to inputs that differ where its thresholds and its parts differ: the target-sum
gate (its bar at every temperature, its share over problems of unequal size), the learning watch (three causes, each
with its own threshold), the slow-engine check (a long budget from either of two budgets) and the context check (each
budget exactly at the context).

A gate with two thresholds tested with one value lets a swap of the two pass; a rule over several parts (roles,
temperatures, budgets) tested where every part is alike lets ``all`` for ``any``, or one part for the maximum, pass.
So each case here sets the thresholds apart, puts one part on each side of its threshold (in both orders), and puts
a value exactly at each boundary; the expected verdict is worked out in the test from the rule as documented.

Left out on purpose: the memory check's boundary (its estimate builds a meta copy of a real model, seconds this file
does not spend; tests/test_memory.py checks the refusal and the fit), the gate's sampling (``gate()`` on the shipped
base is the slow test of tests/tasks/test_target_sum_gate.py), the config's single-key ranges (test_config), and the
analysis's gates and statistics (tests/analysis/test_heterogeneous.py).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from agon.core.config import ConfigError
from agon.training.health import IMPORTANCE, LearningWatch
from agon.training.preflight import LONG_BUDGET, check_context, check_engine
from tests.conftest import compose_config

TOOL = Path(__file__).resolve().parents[1] / "tools" / "target_sum_gate.py"


@pytest.fixture(scope="module")
def target_sum_gate():
    """The gate's command, loaded from its file (a tool beside the package; tools/mutation.py's scratch copy holds
    tools/ too, so its mutants are tested there)."""
    spec = importlib.util.spec_from_file_location("agon_target_sum_gate_gates", TOOL)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------------------------
# the target-sum gate


def test_a_share_is_over_every_sample_and_its_error_over_the_problems_where_problems_differ_in_samples(
        target_sum_gate):
    """Problems of 6, 2 and 3 samples: the share is 7 right of 11 samples (not the mean of the problems' means,
    5/9), its error the SD of the three problem means over sqrt(3)."""
    flags = {"p9": [True, True, True, True, False, False], "p2": [False, False], "p5": [True, True, True]}
    got = target_sum_gate.share(flags)
    every = [x for f in flags.values() for x in f]
    means = np.array([np.mean(f) for f in flags.values()])
    assert got["mean"] == pytest.approx(sum(every) / len(every)) and got["mean"] != pytest.approx(means.mean())
    assert got["se"] == pytest.approx(means.std(ddof=1) / math.sqrt(3))
    assert (got["n"], got["problems"]) == (11, 3)


def _gate_giving(target_sum_gate, right: dict[str, float | None]):
    """A gate() whose right-recap share at each temperature is ``right[f"{t:g}"]`` (the rest arbitrary)."""
    def gate(cfg, problems, samples, temperatures, seed, policies=None, log=print):
        out = {}
        for t in temperatures:
            row = {c: {"mean": 0.3, "se": 0.01, "n": 8, "problems": 4} for c in target_sum_gate.CONDITIONS}
            row["right"] = {"mean": right[f"{t:g}"], "se": 0.01, "n": 8, "problems": 4}
            out[f"{t:g}"] = {**row, "seconds": 0.0}
        return out
    return gate


@pytest.mark.parametrize("cooler,evaluation,bar", [
    (0.95, 0.85, 0.9), (0.85, 0.95, 0.9),  # one temperature above the bar, the other below, in both orders
    (0.9, 0.9, 0.9),  # exactly at the bar at both: at least the bar passes
    (0.9, 0.8999, 0.9), (0.8999, 0.9, 0.9),  # a hair below at one
    (0.85, 0.8, 0.8), (0.85, 0.8, 0.85),  # another bar: at it at one temperature, then above it
    (None, 0.95, 0.9),  # no right-recap rows at one temperature: nothing shows the base checks there
])
def test_the_gate_passes_only_when_every_temperature_reaches_the_bar(target_sum_gate, tmp_path, monkeypatch, capsys,
                                                                     cooler, evaluation, bar):
    monkeypatch.setattr(target_sum_gate, "gate", _gate_giving(target_sum_gate, {"0.6": cooler, "1": evaluation}))
    out = tmp_path / "gate.json"
    argv = ["--problems", "2", "--samples", "1", "--temperatures", "1", "0.6", "--min-right", str(bar),
            "--out", str(out)]
    code = target_sum_gate.main(argv)
    want = all(m is not None and m >= bar for m in (cooler, evaluation))
    report = json.loads(out.read_text())
    assert report["passed"] is want and report["min_right"] == bar
    said = capsys.readouterr().out
    assert code == (0 if want else 1) and ("passes" if want else "FAILS") in said
    assert f"{'-' if cooler is None else f'{cooler:.3f}'} at 0.6" in said


# ---------------------------------------------------------------------------------------------------------------
# the learning watch

ROLES = ("drafter", "challenger")


def _step(zero: dict, cut: dict, weight: dict) -> dict:
    m = {}
    for r in ROLES:
        m |= {f"role/{r}/accuracy": 0.5, f"role/{r}/frac_reward_zero_std": zero[r],
              f"role/{r}/truncated_ratio": cut[r], f"role/{r}/{IMPORTANCE}": weight[r]}
    return m


# each cause's threshold apart from the others', in each order: a swap of two thresholds reads another's
THRESHOLDS = [(0.8, 0.6, 0.4), (0.6, 0.8, 0.3), (0.7, 0.5, 0.6)]


@pytest.mark.parametrize("zero_t,cut_t,weight_t", THRESHOLDS)
@pytest.mark.parametrize("cause", ["no_signal", "truncated", "sampler_mismatch"])
def test_each_cause_of_the_learning_watch_is_judged_against_its_own_threshold_and_its_own_role_rule(
        cause, zero_t, cut_t, weight_t):
    """One cause's metric set per role to every value of interest (each of the three thresholds, a hair below and
    above it), the others healthy: no signal holds when every role's zero-spread share is at least its threshold,
    truncation when any role's cut share is at least its own, the sampler mismatch when any role's weight is below
    its own. A watch of one step says it at once."""
    levels = sorted({round(v, 2) for t in (zero_t, cut_t, weight_t) for v in (t - 0.01, t, t + 0.01)})
    rule = {"no_signal": lambda a, b: a >= zero_t and b >= zero_t,
            "truncated": lambda a, b: a >= cut_t or b >= cut_t,
            "sampler_mismatch": lambda a, b: a < weight_t or b < weight_t}[cause]
    seen = set()
    for a, b in itertools.product(levels, repeat=2):
        healthy = {"zero": {r: 0.0 for r in ROLES}, "cut": {r: 0.0 for r in ROLES}, "weight": {r: 1.0 for r in ROLES}}
        which = {"no_signal": "zero", "truncated": "cut", "sampler_mismatch": "weight"}[cause]
        healthy[which] = {"drafter": a, "challenger": b}
        watch = LearningWatch(after_steps=1, zero_std_ratio=zero_t, truncated_ratio=cut_t, importance_ratio=weight_t)
        said = [c for c, _ in watch.observe(_step(healthy["zero"], healthy["cut"], healthy["weight"]), 1)]
        assert said == ([cause] if rule(a, b) else []), (cause, a, b, zero_t, cut_t, weight_t)
        seen.add(rule(a, b))
    assert seen == {True, False}


# ---------------------------------------------------------------------------------------------------------------
# the slow-engine check: the long budget is the larger of training's and the evaluation's


@pytest.mark.parametrize("trainer_new,eval_new", [
    (LONG_BUDGET, 64), (64, LONG_BUDGET), (LONG_BUDGET - 1, 64), (64, LONG_BUDGET - 1),
    (LONG_BUDGET - 1, LONG_BUDGET - 1), (LONG_BUDGET + 1, LONG_BUDGET - 1)])
def test_the_fallback_is_refused_when_either_budget_is_long(trainer_new, eval_new, monkeypatch):
    monkeypatch.setenv("AGON_VLLM_PYTHON", "/nonexistent/python")
    cfg = compose_config(["generation.engine=vllm", "generation.fallback=hf_continuous",
                          f"trainer.max_new_tokens={trainer_new}", f"eval.max_new_tokens={eval_new}"])
    if max(trainer_new, eval_new) >= LONG_BUDGET:
        with pytest.raises(ConfigError, match=f"at {max(trainer_new, eval_new):,} new tokens"):
            check_engine(cfg)
    else:
        check_engine(cfg)
    OmegaConf.update(cfg, "generation.allow_slow", True)
    check_engine(cfg)


# ---------------------------------------------------------------------------------------------------------------
# the context check: each budget with the longest prompt, exactly at the context


@pytest.fixture(scope="module")
def context_case():
    from agon.models.world import build_tokenizer
    from agon.tasks import build_task

    cfg = compose_config(["task.heldout_size=20", "task.train_size=50", "eval.n_problems=20"])
    task, tok = build_task(cfg.task), build_tokenizer()
    cfg.trainer.max_new_tokens = cfg.eval.max_new_tokens = 1
    return cfg, task, tok, check_context(cfg, task, tok, context=10 ** 6)


@pytest.mark.parametrize("key,other", [("trainer", "eval"), ("eval", "trainer")])
def test_each_budget_fits_exactly_at_the_context_and_not_one_token_past_it(context_case, key, other):
    cfg, task, tok, longest = context_case
    cfg = OmegaConf.merge(cfg, {key: {"max_new_tokens": 40}, other: {"max_new_tokens": 8}})
    assert check_context(cfg, task, tok, context=longest + 40) == longest
    with pytest.raises(ConfigError, match=rf"{key}\.max_new_tokens=40 is {longest + 40} tokens"):
        check_context(cfg, task, tok, context=longest + 39)
