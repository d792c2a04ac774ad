"""Every reward mode on every case of the game, by hand.

The truth table is (draft right, challenge right, draft well-formed, challenge well-formed, challenge shorter): 32
rows. Each mode is checked on all of them with every weight non-zero and a power of two apart from the others, so
no term can hide behind a zero weight or cancel another, and each total says which terms were paid. The expected
values are written out below from the definitions in agon/core/rewards.py's docstring (and docs/metrics.md's
components), not computed by the test."""

from __future__ import annotations

import itertools

import pytest
import torch
from omegaconf import OmegaConf

from agon.core.config import RewardConfig
from agon.core.rewards import REWARD_MODES, Outcome, compute_rewards, get_reward_mode

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
        # no conversion bonus or tiebreak, whatever their weights say; the format term is paid as under competitive
        assert r.challenger.total[i].item() == pytest.approx(b + 5.0)
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


# ---------------------------------------------------------------------------------------------------------------
# the whole truth table, every weight non-zero

NAN = float("nan")
# weights in powers of two, so a total names the terms paid: competitive and cooperative share one set (cooperative
# must ignore its conversion and tiebreak weights), the paper mode gets its own around the paper's 2 and 1
WEIGHTS = {
    "competitive": dict(correct_weight=1.0, conversion_bonus=2.0, length_tiebreak=4.0, format_weight=8.0,
                        team_weight=16.0),
    "cooperative": dict(correct_weight=1.0, conversion_bonus=2.0, length_tiebreak=4.0, format_weight=8.0,
                        team_weight=16.0),
    "paper": dict(correct_weight=2.0, conversion_bonus=1.0, length_tiebreak=0.25, format_weight=0.5,
                  team_weight=4.0),
}
# (draft right a, challenge right b, draft well-formed, challenge well-formed, challenge shorter) ->
#   (competitive drafter, challenger, cooperative drafter, challenger, paper drafter, challenger) under WEIGHTS.
# competitive: drafter 1a; challenger 1b + 2b(1-a) + 4ab[shorter] + 8 format(z)   (team 16 unused)
# cooperative: drafter 1a + 16b; challenger 1b + 8 format(z)                       (2 and 4 unused)
# paper:       drafter 2a; challenger 2b + 1b(1-a) + 0.25ab[shorter] + 0.5 format(z) (team 4 unused)
# The draft's own format never pays anyone.
TABLE = {
    (0, 0, 0, 0, 0): (0, 0, 0, 0, 0, 0),
    (0, 0, 0, 0, 1): (0, 0, 0, 0, 0, 0),
    (0, 0, 0, 1, 0): (0, 8, 0, 8, 0, 0.5),
    (0, 0, 0, 1, 1): (0, 8, 0, 8, 0, 0.5),
    (0, 0, 1, 0, 0): (0, 0, 0, 0, 0, 0),
    (0, 0, 1, 0, 1): (0, 0, 0, 0, 0, 0),
    (0, 0, 1, 1, 0): (0, 8, 0, 8, 0, 0.5),
    (0, 0, 1, 1, 1): (0, 8, 0, 8, 0, 0.5),
    # a conversion: the challenger right after a wrong draft (no tiebreak: the draft was wrong)
    (0, 1, 0, 0, 0): (0, 3, 16, 1, 0, 3),
    (0, 1, 0, 0, 1): (0, 3, 16, 1, 0, 3),
    (0, 1, 0, 1, 0): (0, 11, 16, 9, 0, 3.5),
    (0, 1, 0, 1, 1): (0, 11, 16, 9, 0, 3.5),
    (0, 1, 1, 0, 0): (0, 3, 16, 1, 0, 3),
    (0, 1, 1, 0, 1): (0, 3, 16, 1, 0, 3),
    (0, 1, 1, 1, 0): (0, 11, 16, 9, 0, 3.5),
    (0, 1, 1, 1, 1): (0, 11, 16, 9, 0, 3.5),
    # a regression: the challenger wrong after a right draft
    (1, 0, 0, 0, 0): (1, 0, 1, 0, 2, 0),
    (1, 0, 0, 0, 1): (1, 0, 1, 0, 2, 0),
    (1, 0, 0, 1, 0): (1, 8, 1, 8, 2, 0.5),
    (1, 0, 0, 1, 1): (1, 8, 1, 8, 2, 0.5),
    (1, 0, 1, 0, 0): (1, 0, 1, 0, 2, 0),
    (1, 0, 1, 0, 1): (1, 0, 1, 0, 2, 0),
    (1, 0, 1, 1, 0): (1, 8, 1, 8, 2, 0.5),
    (1, 0, 1, 1, 1): (1, 8, 1, 8, 2, 0.5),
    # both right: the tiebreak pays a strictly shorter challenge
    (1, 1, 0, 0, 0): (1, 1, 17, 1, 2, 2),
    (1, 1, 0, 0, 1): (1, 5, 17, 1, 2, 2.25),
    (1, 1, 0, 1, 0): (1, 9, 17, 9, 2, 2.5),
    (1, 1, 0, 1, 1): (1, 13, 17, 9, 2, 2.75),
    (1, 1, 1, 0, 0): (1, 1, 17, 1, 2, 2),
    (1, 1, 1, 0, 1): (1, 5, 17, 1, 2, 2.25),
    (1, 1, 1, 1, 0): (1, 9, 17, 9, 2, 2.5),
    (1, 1, 1, 1, 1): (1, 13, 17, 9, 2, 2.75),
}
COLUMN = {"competitive": 0, "cooperative": 2, "paper": 4}
# the components each role logs (docs/metrics.md)
COMPONENTS = {"competitive": ({"correct"}, {"correct", "conversion", "tiebreak", "format"}),
              "cooperative": ({"correct", "team"}, {"correct", "format"}),
              "paper": ({"correct"}, {"correct", "conversion", "tiebreak", "format"})}


def _table_outcome(rows) -> Outcome:
    """The rows as one batch. The draft is 10 tokens; a shorter challenge 7, one that is not shorter 10 (equal is
    not shorter) when ill-formed and 13 when well-formed, so both kinds of not-shorter meet both-right rows."""
    a, b, draft_ok, challenge_ok, shorter = (torch.tensor([float(r[i]) for r in rows]) for i in range(5))
    challenge_tokens = torch.where(shorter.bool(), 7.0, torch.where(challenge_ok.bool(), 13.0, 10.0))
    return Outcome(a, torch.full((len(rows),), 10.0), draft_ok, b, challenge_tokens, challenge_ok)


def test_the_truth_table_has_every_case_and_cases_that_tell_the_terms_apart():
    assert set(TABLE) == set(itertools.product([0, 1], repeat=5))
    o = _table_outcome(list(TABLE))
    both_right = (o.draft_correct == 1) & (o.challenge_correct == 1)
    # the format of the draft and of the challenge disagree on half the rows, both ways
    assert {(float(d), float(c)) for d, c in zip(o.draft_format, o.challenge_format)} == {(0, 0), (0, 1), (1, 0),
                                                                                          (1, 1)}
    # both-right rows meet a shorter, an equal and a longer challenge
    assert {float(t) for t in o.challenge_tokens[both_right]} == {7.0, 10.0, 13.0}


@pytest.mark.parametrize("mode", list(COLUMN))
def test_every_mode_pays_each_term_by_hand_over_the_whole_truth_table(mode):
    rows = list(TABLE)
    r = compute_rewards(_table_outcome(rows), _weights(name=mode, **WEIGHTS[mode]))
    column = COLUMN[mode]
    expected_drafter = [TABLE[row][column] for row in rows]
    expected_challenger = [TABLE[row][column + 1] for row in rows]
    assert r.drafter.total.tolist() == expected_drafter
    assert r.challenger.total.tolist() == expected_challenger
    drafter_parts, challenger_parts = COMPONENTS[mode]
    assert set(r.drafter.components) == drafter_parts and set(r.challenger.components) == challenger_parts


# the presets as conf/reward/*.yaml ship them: (a, b, challenge well-formed) -> (drafter, challenger); their
# tiebreak weight is 0, so the draft's format and the lengths change nothing
# competitive (1, 1, 0, 0, team 0): a; b + b(1-a)
# cooperative (1, 0, 0, 0, team 1): a + b; b
# paper (2, 1, 0, 0.5, team 0):     2a; 2b + b(1-a) + 0.5 format(z)
PRESETS = {
    "competitive": {(0, 0, 0): (0, 0), (0, 0, 1): (0, 0), (0, 1, 0): (0, 2), (0, 1, 1): (0, 2),
                    (1, 0, 0): (1, 0), (1, 0, 1): (1, 0), (1, 1, 0): (1, 1), (1, 1, 1): (1, 1)},
    "cooperative": {(0, 0, 0): (0, 0), (0, 0, 1): (0, 0), (0, 1, 0): (1, 1), (0, 1, 1): (1, 1),
                    (1, 0, 0): (1, 0), (1, 0, 1): (1, 0), (1, 1, 0): (2, 1), (1, 1, 1): (2, 1)},
    "paper": {(0, 0, 0): (0, 0), (0, 0, 1): (0, 0.5), (0, 1, 0): (0, 3), (0, 1, 1): (0, 3.5),
              (1, 0, 0): (2, 0), (1, 0, 1): (2, 0.5), (1, 1, 0): (2, 2), (1, 1, 1): (2, 2.5)},
}


@pytest.mark.parametrize("mode", list(PRESETS))
def test_each_shipped_reward_preset_pays_its_documented_form_over_the_truth_table(mode):
    from tests.conftest import compose_config

    cfg = compose_config([f"reward={mode}"]).reward
    assert cfg.name == mode
    rows = list(TABLE)
    r = compute_rewards(_table_outcome(rows), cfg)
    expected = [PRESETS[mode][(a, b, challenge_ok)] for a, b, _, challenge_ok, _ in rows]
    assert r.drafter.total.tolist() == [d for d, _ in expected]
    assert r.challenger.total.tolist() == [c for _, c in expected]


# verifier failures: (a, b) -> (competitive drafter, challenger, cooperative drafter, challenger, paper drafter,
# challenger) under WEIGHTS, both completions well-formed and the challenge shorter. A role's reward is NaN exactly
# when a correctness its formula reads is NaN: the competitive challenger reads a (the conversion bonus, the
# tiebreak) even when b = 0, the cooperative challenger reads only b (and its own format), the cooperative drafter
# reads both.
NAN_TABLE = {
    (NAN, 0): (NAN, NAN, NAN, 8, NAN, NAN),
    (NAN, 1): (NAN, NAN, NAN, 9, NAN, NAN),
    (0, NAN): (0, NAN, NAN, NAN, 0, NAN),
    (1, NAN): (1, NAN, NAN, NAN, 2, NAN),
    (NAN, NAN): (NAN, NAN, NAN, NAN, NAN, NAN),
}


@pytest.mark.parametrize("mode", list(COLUMN))
def test_an_unscorable_correctness_makes_nan_exactly_the_rewards_that_read_it(mode):
    rows = list(NAN_TABLE)
    n = len(rows)
    o = Outcome(torch.tensor([float(a) for a, _ in rows]), torch.full((n,), 10.0), torch.ones(n),
                torch.tensor([float(b) for _, b in rows]), torch.full((n,), 7.0), torch.ones(n))
    r = compute_rewards(o, _weights(name=mode, **WEIGHTS[mode]))
    column = COLUMN[mode]
    for role, got in (("drafter", r.drafter.total), ("challenger", r.challenger.total)):
        expected = torch.tensor([NAN_TABLE[row][column + (role == "challenger")] for row in rows])
        torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda m: f"{mode} {role}: {m}")
