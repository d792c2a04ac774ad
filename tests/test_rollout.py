"""The draft -> recap -> challenge game on the test world, checked value by value.

The test world answers about a quarter of its problems right and every well-formed draft carries a one-step recap,
so each check below compares real, non-empty values: the exact recap a challenger reads, each role's own lengths
and verdicts in the outcome, and what a verifier failure turns into.
"""

from __future__ import annotations

from typing import Sequence

import pytest
import torch

from agon.grpo import group_advantages
from agon.rewards import compute_rewards
from agon.rollout import Game, Sampling, play, render
from agon.tasks import Problem, Verdict, build_task
from agon.tasks.arithmetic import ArithmeticTask

SAMPLING = Sampling(max_new_tokens=32, temperature=1.0)


def _game(cfg, policies, exchange: str, task=None, problems: int = 6, group_size: int = 4) -> Game:
    task = task or build_task(cfg.task)
    torch.manual_seed(0)
    return play(policies, task, cfg.model, list(task.train_problems())[:problems], drafter="A", challenger="B",
                exchange=exchange, group_size=group_size, sampling=SAMPLING)


def test_a_visible_challenger_reads_exactly_its_drafters_recap(small_cfg, policies):
    task = build_task(small_cfg.task)
    game = _game(small_cfg, policies, "visible", task)
    nonempty = [r for r in game.rounds if r.recap]
    assert len(nonempty) >= len(game.rounds) // 2, "the test world should give most drafts a recap"
    for r in game.rounds:
        assert r.recap == task.recap(r.draft.completion.text)
        challenge = task.challenge_message(r.problem, r.recap)
        assert r.challenge.prompt == render(policies, task, small_cfg.model, challenge)
        if r.recap:
            # the recap is there, verbatim, after the problem; the reasoning block and the boxed answer are not
            assert r.challenge.prompt.count(f"|{r.recap}") == 1
            assert "<think>" not in r.challenge.prompt and "\\boxed{" not in r.challenge.prompt
    # each round's challenge answers its own draft: recaps differ across rounds, and so do the prompts
    assert len({r.challenge.prompt for r in nonempty}) == len({r.recap for r in nonempty}) > 1


def test_a_hidden_challenger_sees_the_plain_prompt_and_no_recap(small_cfg, policies):
    task = build_task(small_cfg.task)
    game = _game(small_cfg, policies, "hidden", task)
    recaps = [r.recap for r in game.rounds if r.recap]
    assert recaps, "the test world should give drafts a recap"
    for r in game.rounds:
        assert r.challenge.prompt == r.draft.prompt == render(policies, task, small_cfg.model,
                                                              task.user_message(r.problem))
        assert not any(recap in r.challenge.prompt for recap in recaps)


def test_the_outcome_holds_each_roles_own_verdicts_and_lengths(small_cfg, policies):
    game = _game(small_cfg, policies, "visible")
    outcome = game.outcome()
    drafts, challenges = game.attempts("drafter"), game.attempts("challenger")
    assert outcome.draft_correct.tolist() == [float(a.verdict.correct) for a in drafts]
    assert outcome.challenge_correct.tolist() == [float(a.verdict.correct) for a in challenges]
    assert outcome.draft_tokens.tolist() == [a.completion.n_tokens for a in drafts]
    assert outcome.challenge_tokens.tolist() == [a.completion.n_tokens for a in challenges]
    assert outcome.draft_format.tolist() == [float(a.verdict.format_ok) for a in drafts]
    assert outcome.challenge_format.tolist() == [float(a.verdict.format_ok) for a in challenges]
    # the checks above have power only if the roles differ somewhere
    assert not torch.equal(outcome.draft_tokens, outcome.challenge_tokens)
    assert not torch.equal(outcome.draft_correct, outcome.challenge_correct)
    assert 0 < float(outcome.draft_correct.mean()) < 1


def test_the_length_tiebreak_pays_a_challenger_shorter_than_its_own_draft(small_cfg, policies):
    """With the tiebreak alone switched on, its component is b * a * [len(z) < len(y)] from the attempts."""
    game = _game(small_cfg, policies, "visible", problems=10)
    cfg = small_cfg.reward
    cfg.correct_weight, cfg.conversion_bonus, cfg.length_tiebreak, cfg.format_weight = 0.0, 0.0, 1.0, 0.0
    tiebreak = compute_rewards(game.outcome(), cfg).challenger.components["tiebreak"]
    expected = [float(r.draft.verdict.correct and r.challenge.verdict.correct
                      and r.challenge.completion.n_tokens < r.draft.completion.n_tokens) for r in game.rounds]
    assert tiebreak.tolist() == expected


class FlakyVerifierTask(ArithmeticTask):
    """The arithmetic task whose verifier times out on chosen rows of its first call (the drafts)."""

    def __init__(self, cfg, fail_rows: set[int]):
        super().__init__(cfg)
        self.fail_rows, self.calls = fail_rows, 0

    def verify(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        verdicts = super().verify(problems, completions)
        self.calls += 1
        if self.calls > 1:
            return verdicts
        return [Verdict(False, v.format_ok, "timeout", "deadline") if i in self.fail_rows else v
                for i, v in enumerate(verdicts)]


def test_a_verifier_failure_is_nan_then_advantage_zero_never_a_silent_zero(small_cfg, policies):
    # rows 0-3 are the whole first group; 5 is one row of the second
    task = FlakyVerifierTask(small_cfg.task, fail_rows={0, 1, 2, 3, 5})
    game = _game(small_cfg, policies, "visible", task)
    outcome = game.outcome()
    failed = torch.isnan(outcome.draft_correct)
    assert failed.nonzero().flatten().tolist() == [0, 1, 2, 3, 5]
    assert not torch.isnan(outcome.challenge_correct).any()
    rewards = compute_rewards(outcome, small_cfg.reward)
    assert torch.isnan(rewards.drafter.total[failed]).all() and not torch.isnan(rewards.drafter.total[~failed]).any()
    adv = group_advantages(rewards.drafter.total, game.group_ids()).advantages
    assert (adv[failed] == 0).all()
    # the second group is normalised over its three scorable rows only
    scorable = rewards.drafter.total[[4, 6, 7]]
    if scorable.std() > 0:
        expected = (scorable - scorable.mean()) / (scorable.std() + 1e-4)
        torch.testing.assert_close(adv[[4, 6, 7]], expected)


@pytest.mark.parametrize("exchange", ["visible", "hidden"])
def test_every_round_is_one_problem_of_its_group(small_cfg, policies, exchange):
    game = _game(small_cfg, policies, exchange, problems=3, group_size=5)
    assert len(game.rounds) == 15
    ids = [r.problem.id for r in game.rounds]
    assert [ids[g * 5: (g + 1) * 5] for g in range(3)] == [[i] * 5 for i in dict.fromkeys(ids)]
