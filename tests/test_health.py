"""Saying when a run cannot learn: the watch on step metrics, and a real run that trains on nothing."""

from __future__ import annotations

from omegaconf import OmegaConf

from agon.health import LearningWatch


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
