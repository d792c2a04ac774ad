"""Reward modes of the draft-and-challenge game, looked up by name in ``REWARD_MODES``.

A mode maps one batch of outcomes (drafter correct ``a``, challenger correct ``b``, lengths, format flags) to each
role's reward *components*; the reward is their sum and every component is logged on its own. Correctness is the
only input to "all wrong" checks elsewhere: shaped terms never decide whether a group carries signal.

    drafter     r_d = correct_weight * a  (+ team_weight * b under cooperative)
    challenger  competitive: correct_weight * b + conversion_bonus * b * (1 - a)
                             + length_tiebreak * b * a * [len(z) < len(y)] + format_weight * format_ok(z)
                cooperative: correct_weight * b + format_weight * format_ok(z)  (the team term instead of the
                             conversion bonus and the tiebreak; the format term kept, so a preset's weights mean
                             the same under both modes)
    paper       competitive with the weights of the paper's reward form (2, 1, 0, 0.5): R = 2 c(b) + c(b)(1 - c(a))
                + 0.5 format(b), set in conf/reward/paper.yaml

A NaN correctness (the verifier could not score the completion) makes that row's reward NaN, which the advantage
leaves out of its group and gives advantage 0. Without a challenger (vanilla GRPO) only the drafter's terms exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from agon.core.registry import Registry

Tensor = torch.Tensor


@dataclass(frozen=True)
class Outcome:
    """One game batch, every tensor [B] float (correctness 0/1, NaN when unscorable; lengths in tokens)."""

    draft_correct: Tensor
    draft_tokens: Tensor
    draft_format: Tensor
    challenge_correct: Tensor | None = None
    challenge_tokens: Tensor | None = None
    challenge_format: Tensor | None = None


@dataclass(frozen=True)
class RoleRewards:
    """Named components [B] each; ``total`` is their sum."""

    components: dict[str, Tensor]

    @property
    def total(self) -> Tensor:
        return torch.stack(list(self.components.values())).sum(0)


@dataclass(frozen=True)
class RoundRewards:
    drafter: RoleRewards
    challenger: RoleRewards | None


RewardMode = Callable[[Outcome, Any], RoundRewards]
REWARD_MODES: Registry[RewardMode] = Registry("reward.name")
register_reward = REWARD_MODES.register
get_reward_mode = REWARD_MODES.get_or_raise


WEIGHTS = ("correct_weight", "conversion_bonus", "length_tiebreak", "team_weight", "format_weight")


def reward_summary(cfg: Any) -> dict[str, Any]:
    """The reward a run pays, in full: its mode and every weight (``summary.json``'s ``reward_weights``, the start
    line of the run's log), so the paper's reward and the offline default's are told apart by more than a name."""
    params = cfg.get("params") or {}
    return {"name": str(cfg.name), **{k: float(cfg[k]) for k in WEIGHTS}, "params": {k: params[k] for k in params}}


def describe_reward(cfg: Any) -> str:
    """``reward_summary`` on one line: ``competitive (correct 2, conversion 1, tiebreak 0, team 0, format 0.5)``."""
    s = reward_summary(cfg)
    params = "".join(f", {k} {v}" for k, v in s["params"].items())
    return f"{s['name']} (" + ", ".join(f"{k.split('_')[0] if k != 'length_tiebreak' else 'tiebreak'} {s[k]:g}"
                                        for k in WEIGHTS) + params + ")"


def compute_rewards(outcome: Outcome, cfg: Any) -> RoundRewards:
    """The rewards of ``outcome`` under the mode ``cfg.name`` with ``cfg``'s weights."""
    return get_reward_mode(cfg.name)(outcome, cfg)


@register_reward("competitive")
def competitive(o: Outcome, w: Any) -> RoundRewards:
    drafter = RoleRewards({"correct": w.correct_weight * o.draft_correct})
    if o.challenge_correct is None:
        return RoundRewards(drafter, None)
    a, b = o.draft_correct, o.challenge_correct
    shorter = (o.challenge_tokens < o.draft_tokens).float()
    challenger = RoleRewards(
        {
            "correct": w.correct_weight * b,
            "conversion": w.conversion_bonus * b * (1 - a),
            "tiebreak": w.length_tiebreak * b * a * shorter,
            "format": w.format_weight * o.challenge_format,
        }
    )
    return RoundRewards(drafter, challenger)


@register_reward("cooperative")
def cooperative(o: Outcome, w: Any) -> RoundRewards:
    if o.challenge_correct is None:
        return RoundRewards(RoleRewards({"correct": w.correct_weight * o.draft_correct}), None)
    drafter = RoleRewards({"correct": w.correct_weight * o.draft_correct, "team": w.team_weight * o.challenge_correct})
    challenger = RoleRewards({"correct": w.correct_weight * o.challenge_correct,
                              "format": w.format_weight * o.challenge_format})
    return RoundRewards(drafter, challenger)


# the paper's form is the competitive formula with other weights (conf/reward/paper.yaml)
register_reward("paper")(competitive)
