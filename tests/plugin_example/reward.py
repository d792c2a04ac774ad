"""A reward mode of its own: the competitive reward with a bonus of ``params.bonus`` when the challenger is right
and its completion is shorter than the draft, whoever was right first (the built-in tiebreak pays only when both
are)."""

from __future__ import annotations

from typing import Any

from agon.core.rewards import Outcome, RoleRewards, RoundRewards, competitive, register_reward


@register_reward("brevity")
def brevity(o: Outcome, w: Any) -> RoundRewards:
    base = competitive(o, w)
    if base.challenger is None:
        return base
    shorter = (o.challenge_tokens < o.draft_tokens).float()
    bonus = float(w.params.get("bonus", 0.0)) * o.challenge_correct * shorter
    return RoundRewards(base.drafter, RoleRewards({**base.challenger.components, "brevity": bonus}))
