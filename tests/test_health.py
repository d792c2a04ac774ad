"""Saying when a run cannot learn: the watch on step metrics, and a real run that trains on nothing."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from agon.training.health import LearningWatch


def _metrics(zero_std: float, truncated: float, limited: int = 0, roles=("drafter", "challenger")) -> dict:
    m = {}
    for r in roles:
        m |= {f"role/{r}/accuracy": 0.0, f"role/{r}/frac_reward_zero_std": zero_std,
              f"role/{r}/truncated_ratio": truncated, f"role/{r}/context_limited": limited}
    return m


def _watch() -> LearningWatch:
    return LearningWatch(after_steps=3, zero_std_ratio=0.9, truncated_ratio=0.9, max_new_tokens=256,
                         num_generations=8, task="deepmath_hard")


def test_no_signal_is_said_once_after_the_streak_and_names_the_knobs():
    watch = _watch()
    said = [watch.observe(_metrics(1.0, 0.0), step) for step in (1, 2)]
    said.append(watch.observe(_metrics(0.5, 0.0), 3))  # one step with signal breaks the streak
    said += [watch.observe(_metrics(0.95, 0.0), step) for step in (4, 5, 6, 7, 8)]
    assert [len(s) for s in said] == [0, 0, 0, 0, 0, 1, 0, 0]
    cause, message = said[5][0]
    assert cause == "no_signal"
    assert "steps 4-6" in message and "trainer.num_generations=8" in message and "task.name=deepmath_hard" in message


def test_no_signal_needs_every_role_without_spread():
    watch = _watch()
    mixed = _metrics(1.0, 0.0) | {"role/challenger/frac_reward_zero_std": 0.2}
    assert all(not watch.observe(mixed, step) for step in range(1, 6))


def test_truncation_is_said_once_naming_the_budget():
    watch = _watch()
    said = [watch.observe(_metrics(0.0, 0.97, roles=("drafter",)), step) for step in range(1, 6)]
    assert [len(s) for s in said] == [0, 0, 1, 0, 0]
    assert said[2][0][0] == "truncated" and "trainer.max_new_tokens=256" in said[2][0][1] and "97%" in said[2][0][1]


def test_a_low_importance_weight_in_any_one_role_is_said_after_the_streak():
    """The challenger alone has its weights far below 1 (the drafter's are fine): one role is enough, and the
    message names the role's weight and the settings that put the sampler and the trainer apart."""
    watch = _watch()
    key = "sampling/importance_sampling_ratio/mean"
    low = _metrics(0.0, 0.0) | {f"role/drafter/{key}": 1.0, f"role/challenger/{key}": 0.31}
    fine = _metrics(0.0, 0.0) | {f"role/drafter/{key}": 0.97, f"role/challenger/{key}": 1.02}
    said = [watch.observe(low, 1), watch.observe(low, 2), watch.observe(fine, 3)]
    said += [watch.observe(low, step) for step in (4, 5, 6, 7)]
    assert [len(s) for s in said] == [0, 0, 0, 0, 0, 1, 0]
    cause, message = said[5][0]
    assert cause == "sampler_mismatch"
    assert "challenger 0.31" in message and "steps 4-6" in message and "top_p" in message
    # a run without sampler log-probs (the hf engine) has no such metric: never said
    quiet = _watch()
    assert not any(quiet.observe(_metrics(0.0, 0.0), step) for step in range(1, 6))


ROLES = ("drafter", "challenger")
KEY = "sampling/importance_sampling_ratio/mean"


def _roles(zero_std: dict | None = None, truncated: dict | None = None, weight: dict | None = None) -> dict:
    """Step metrics of both roles, each condition given per role (the rest healthy: spread, nothing cut, weight 1)."""
    m = _metrics(0.0, 0.0)
    for r in ROLES:
        m |= {f"role/{r}/frac_reward_zero_std": (zero_std or {}).get(r, 0.0),
              f"role/{r}/truncated_ratio": (truncated or {}).get(r, 0.0),
              f"role/{r}/{KEY}": (weight or {}).get(r, 1.0)}
    return m


def _causes(watch: LearningWatch, steps: list[dict]) -> list[list[str]]:
    return [[cause for cause, _ in watch.observe(m, step)] for step, m in enumerate(steps, start=1)]


@pytest.mark.parametrize("bare", ROLES)
def test_no_signal_is_said_only_when_every_role_lacks_spread(bare):
    """One role without spread (either one) is not enough: the other still learns. Both, and it is said."""
    other = next(r for r in ROLES if r != bare)
    one = _roles(zero_std={bare: 1.0, other: 0.5})
    assert _causes(_watch(), [one] * 5) == [[]] * 5
    both = _roles(zero_std={bare: 1.0, other: 0.95})
    assert _causes(_watch(), [both] * 4) == [[], [], ["no_signal"], []]


@pytest.mark.parametrize("cut", ROLES)
def test_truncation_in_any_one_role_is_said(cut):
    """One role cut at the budget (either one; the other finishes) is enough: its answers score 0 whatever their
    reasoning. Neither role cut: never said."""
    other = next(r for r in ROLES if r != cut)
    said = _causes(_watch(), [_roles(truncated={cut: 0.97, other: 0.1})] * 4)
    assert said == [[], [], ["truncated"], []]
    assert _causes(_watch(), [_roles(truncated={cut: 0.85, other: 0.85})] * 5) == [[]] * 5


@pytest.mark.parametrize("low", ROLES)
def test_a_low_importance_weight_in_either_role_is_said_and_in_neither_is_not(low):
    other = next(r for r in ROLES if r != low)
    said = _causes(_watch(), [_roles(weight={low: 0.2, other: 1.0})] * 4)
    assert said == [[], [], ["sampler_mismatch"], []]
    assert _causes(_watch(), [_roles(weight={low: 0.6, other: 0.9})] * 5) == [[]] * 5


def test_the_shares_count_from_their_threshold_on_and_the_weight_only_below_its_own():
    """At exactly the settings: a share of 0.9 counts (at least this share), a weight of 0.5 does not (below it)."""
    at = _roles(zero_std={"drafter": 0.9, "challenger": 0.9}, truncated={"drafter": 0.9},
                weight={"challenger": 0.5})
    assert _causes(_watch(), [at] * 3) == [[], [], ["no_signal", "truncated"]]
    # just past each threshold on the other side: nothing holds
    below = _roles(zero_std={"drafter": 0.89, "challenger": 0.95}, truncated={"drafter": 0.89},
                   weight={"challenger": 0.51})
    assert _causes(_watch(), [below] * 4) == [[]] * 4


def test_each_causes_streak_resets_when_broken_and_counts_apart_from_the_others():
    """warn_after_steps=3: truncation holds on steps 1-2, breaks on 3, holds on 4-6 and is said at 6, not before. The
    sampler mismatch holds on steps 1-4 throughout, and the truncation's break does not reset it (said at 3). A cause
    said once is not said again after a break and a new full streak."""
    cut = {"challenger": 1.0}
    low = {"drafter": 0.1}
    steps = [_roles(truncated=cut, weight=low), _roles(truncated=cut, weight=low), _roles(weight=low),
             _roles(truncated=cut, weight=low), _roles(truncated=cut), _roles(truncated=cut),
             _roles(), _roles(truncated=cut, weight=low), _roles(truncated=cut, weight=low),
             _roles(truncated=cut, weight=low)]
    assert _causes(_watch(), steps) == [[], [], ["sampler_mismatch"], [], [], ["truncated"], [], [], [], []]


def test_after_one_step_a_cause_is_said_at_once():
    watch = LearningWatch(after_steps=1)
    assert _causes(watch, [_roles(), _roles(truncated={"drafter": 0.95})]) == [[], ["truncated"]]


def test_the_trainer_watches_with_the_warn_settings_of_its_config(small_cfg, policies, tmp_path):
    """Each trainer.warn_* key reaches the watch in its own place (distinct values, so a swap shows)."""
    from agon.records.recorder import Recorder
    from agon.tasks import build_task
    from agon.training.trainer import Trainer

    t = small_cfg.trainer
    t.warn_after_steps, t.warn_zero_std_ratio, t.warn_truncated_ratio, t.warn_importance_ratio = 2, 0.6, 0.7, 0.3
    trainer = Trainer(small_cfg, policies, build_task(small_cfg.task), Recorder(tmp_path), tmp_path,
                      log=lambda *_: None)
    watch = trainer.watch
    assert (watch.after_steps, watch.zero_std_ratio, watch.truncated_ratio, watch.importance_ratio) == (2, 0.6, 0.7,
                                                                                                        0.3)
    # and they act: 0.65 without spread in both roles (past 0.6), 0.65 cut in one (short of 0.7), a weight of 0.4
    # (above 0.3): no signal alone, said at the second step
    m = _roles(zero_std={"drafter": 0.65, "challenger": 0.65}, truncated={"drafter": 0.65},
               weight={"challenger": 0.4})
    assert _causes(watch, [m, m]) == [[], ["no_signal"]]


def test_prompts_past_the_context_are_said_at_once():
    watch = _watch()
    said = watch.observe(_metrics(0.0, 0.0, limited=2), 1)
    assert [c for c, _ in said] == ["context"] and "context_limited" in said[0][1]
    assert not watch.observe(_metrics(0.0, 0.0, limited=2), 2)


def test_a_run_whose_completions_are_all_cut_says_so(small_cfg, capsys):
    """On the test world with room for 3 tokens no answer can finish: every completion is cut at the budget and
    every group has zero spread. The run says both, once, and keeps them in summary.json."""
    from agon.run import run

    OmegaConf.update(small_cfg, "trainer.max_new_tokens", 3)
    OmegaConf.update(small_cfg, "trainer.max_steps", 3)
    OmegaConf.update(small_cfg, "trainer.warn_after_steps", 2)
    summary = run(small_cfg)
    out = capsys.readouterr().out
    causes = [w for w in summary["train/warnings"]]
    assert len(causes) == 2
    assert any("trainer.max_new_tokens=3" in w for w in causes)
    assert any("trainer.num_generations=2" in w for w in causes)
    assert all(out.count(w) == 1 for w in causes)
