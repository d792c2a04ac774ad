"""Every reward mode on every (drafter right, challenger right, challenger shorter) case, by hand."""

from __future__ import annotations

import itertools

import pytest
import torch
from omegaconf import OmegaConf

from agon.config import RewardConfig
from agon.rewards import REWARD_MODES, Outcome, compute_rewards, get_reward_mode

CASES = list(itertools.product([0.0, 1.0], [0.0, 1.0], [True, False]))  # (a, b, challenger shorter)


def _outcome(fmt: float = 1.0) -> Outcome:
    a = torch.tensor([c[0] for c in CASES])
    b = torch.tensor([c[1] for c in CASES])
    draft_tokens = torch.full((len(CASES),), 10.0)
    challenge_tokens = torch.tensor([5.0 if c[2] else 10.0 for c in CASES])  # equal length is not shorter
    return Outcome(a, draft_tokens, torch.ones(len(CASES)), b, challenge_tokens, torch.full((len(CASES),), fmt))


def _weights(**kw):
    return OmegaConf.structured(RewardConfig(**kw))


def test_competitive_by_hand():
    w = _weights(name="competitive", correct_weight=1.0, conversion_bonus=1.0, length_tiebreak=0.25,
                 format_weight=0.5)
    r = compute_rewards(_outcome(fmt=1.0), w)
    for i, (a, b, shorter) in enumerate(CASES):
        expected_c = b + b * (1 - a) + 0.25 * b * a * shorter + 0.5
        assert r.challenger.total[i].item() == pytest.approx(expected_c), (a, b, shorter)
        assert r.drafter.total[i].item() == pytest.approx(a)
    # components are logged apart
    assert set(r.challenger.components) == {"correct", "conversion", "tiebreak", "format"}
    # the conversion bonus pays only for b=1, a=0
    assert r.challenger.components["conversion"].tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
    # the tiebreak pays only when both are right and the challenger is strictly shorter
    assert r.challenger.components["tiebreak"].tolist() == [0, 0, 0, 0, 0, 0, 0.25, 0]


def test_competitive_defaults_match_design():
    r = compute_rewards(_outcome(fmt=0.0), _weights())  # correct 1, conversion 1, tiebreak 0, format 0
    assert r.challenger.total.tolist() == [0, 0, 2, 2, 0, 0, 1, 1]


def test_cooperative_by_hand():
    w = _weights(name="cooperative", correct_weight=1.0, conversion_bonus=5.0, length_tiebreak=5.0,
                 team_weight=1.0, format_weight=5.0)
    r = compute_rewards(_outcome(), w)
    for i, (a, b, _) in enumerate(CASES):
        # no conversion bonus, tiebreak or format term, whatever their weights say
        assert r.challenger.total[i].item() == pytest.approx(b)
        assert r.drafter.total[i].item() == pytest.approx(a + b)


def test_paper_form():
    # R = 2 c(b) + c(b)(1 - c(a)) + 0.5 format(b)
    w = _weights(name="paper", correct_weight=2.0, conversion_bonus=1.0, length_tiebreak=0.0, format_weight=0.5)
    r = compute_rewards(_outcome(fmt=1.0), w)
    for i, (a, b, _) in enumerate(CASES):
        assert r.challenger.total[i].item() == pytest.approx(2 * b + b * (1 - a) + 0.5)
        assert r.drafter.total[i].item() == pytest.approx(2 * a)


def test_no_challenger_gives_drafter_correctness_only():
    o = Outcome(torch.tensor([1.0, 0.0]), torch.tensor([3.0, 4.0]), torch.ones(2))
    for name in REWARD_MODES:
        r = compute_rewards(o, _weights(name=name))
        assert r.challenger is None
        assert r.drafter.total.tolist() == [1.0, 0.0]


def test_unscorable_correctness_propagates_as_nan():
    o = Outcome(torch.tensor([float("nan")]), torch.tensor([3.0]), torch.ones(1), torch.tensor([1.0]),
                torch.tensor([2.0]), torch.ones(1))
    r = compute_rewards(o, _weights())
    assert torch.isnan(r.drafter.total).all() and torch.isnan(r.challenger.total).all()


def test_registry_lists_valid_names():
    with pytest.raises(KeyError, match="competitive"):
        get_reward_mode("adversarial")
