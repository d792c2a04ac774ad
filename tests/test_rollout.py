"""The draft -> recap -> challenge game on the test world, checked value by value.

The test world answers about half of its problems right and every well-formed draft carries a one-step recap,
so each check below compares real, non-empty values: the exact recap a challenger reads, each role's own lengths
and verdicts in the outcome, and what a verifier failure turns into.

The ``policies`` fixture's adapters are both zero-initialised: A, B and the base answer alike, so a stage played by
the wrong one would not show there. The rivals below are two adapters that answer very differently (A nudged off
the base, still mostly well-formed and often right; B pushed far, hardly ever well-formed or right).
Decoding greedily, every completion of a stage must equal, token for token, the one the named adapter gives for
the same prompts, and differ from the other adapter's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import pytest
import torch

from agon.core.grpo import group_advantages
from agon.core.methods import Turn, get_method
from agon.models.policies import Policies
from agon.models.tokens import Completion
from agon.core.rewards import compute_rewards
from agon.game.rollout import Game, Sampling, play, render
from agon.tasks import Problem, Task, Verdict, build_task
from agon.tasks.arithmetic import ArithmeticTask

SAMPLING = Sampling(max_new_tokens=32, temperature=1.0)
GREEDY = Sampling(max_new_tokens=32, temperature=0.0)


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


@dataclass
class Rivals:
    """Adapters A and B that answer very differently, the prompts of a few problems, and each adapter's greedy
    completions of any batch of prompts (sampled once, through ``Policies.sample`` rather than the rollout)."""

    policies: Policies
    task: Task
    model_cfg: Any
    problems: list[Problem]
    group_size: int
    greedy_seen: dict = field(default_factory=dict)

    def greedy(self, adapter: str | None, prompts: Sequence[str]) -> list[Completion]:
        key = (adapter, tuple(prompts))
        if key not in self.greedy_seen:
            self.greedy_seen[key] = self.policies.sample(prompts, adapter, max_new_tokens=GREEDY.max_new_tokens,
                                                         temperature=0.0)
        return self.greedy_seen[key]

    @property
    def rows(self) -> list[Problem]:
        """The game's rows: each problem ``group_size`` times, problem-major."""
        return [p for p in self.problems for _ in range(self.group_size)]

    @property
    def plain(self) -> list[str]:
        return [render(self.policies, self.task, self.model_cfg, self.task.user_message(p)) for p in self.rows]

    def play(self, drafter: str | None, challenger: str | None, exchange: str) -> Game:
        return play(self.policies, self.task, self.model_cfg, self.problems, drafter=drafter, challenger=challenger,
                    exchange=exchange, group_size=self.group_size, sampling=GREEDY)


@pytest.fixture(scope="module")
def rivals(tiny_base) -> Rivals:
    """A: the test world's base with small noise on its LoRA (its answers differ from the base's on some problems,
    most are well-formed, some right). B: noise 6 times larger (hardly ever a well-formed answer, mostly cut at the
    budget). Read-only: no test trains them."""
    cfg, (model, tokenizer) = tiny_base
    # PEFT draws lora_A from the global RNG: seeded here, so that the rivals are one fixed pair whatever
    # AGON_TEST_SEED says (nothing below samples at random: every completion is greedy)
    torch.manual_seed(0)
    policies = Policies(copy.deepcopy(model), tokenizer, ["A", "B"], cfg.model.lora)
    policies.perturb("A", 0.05, seed=3)
    policies.perturb("B", 0.3, seed=2)
    task = build_task(cfg.task)
    return Rivals(policies, task, cfg.model, list(task.train_problems())[:4], group_size=2)


def _differ(x: Sequence[Completion], y: Sequence[Completion]) -> int:
    return sum(a.token_ids != b.token_ids for a, b in zip(x, y, strict=True))


def test_the_rivals_answer_differently_from_each_other_and_from_the_base(rivals):
    plain = rivals.plain
    a, b, base = rivals.greedy("A", plain), rivals.greedy("B", plain), rivals.greedy(None, plain)
    assert _differ(a, b) == len(plain), "A and B should differ on every problem"
    assert _differ(a, base) > 0, "A should differ from the base somewhere"
    a_ok = rivals.task.verify(rivals.rows, [c.text for c in a])
    b_ok = rivals.task.verify(rivals.rows, [c.text for c in b])
    assert sum(v.format_ok for v in a_ok) > len(plain) // 2 and sum(v.correct for v in a_ok) > 0
    assert sum(v.format_ok for v in b_ok) <= len(plain) // 4 and sum(v.correct for v in b_ok) < sum(
        v.correct for v in a_ok)
    assert any(rivals.task.recap(c.text) for c in a), "A's drafts should carry recaps for a visible challenger"


# what Agon's turn says at steps 0 and 1 (the trainer's step counter) under each rotation
TURNS = {"alternate": [Turn("A", "B"), Turn("B", "A")], "fixed": [Turn("A", "B"), Turn("A", "B")]}


@pytest.mark.parametrize("exchange", ["visible", "hidden"])
def test_each_stage_is_played_by_the_adapter_the_turn_names(rivals, exchange):
    """Steps 0 and 1 of Agon's rotation, alternate and fixed: the drafts are the drafter's completions of the plain
    prompts, each recap is cut from its own draft, and the challenges are the challenger's completions of the
    prompts its exchange gives (the problem with that recap, or the plain prompt), never the other adapter's."""
    task, plain = rivals.task, rivals.plain
    other = {"A": "B", "B": "A"}
    games: dict[Turn, Game] = {}  # greedy: a turn played twice is the same game, so each turn is played once
    for rotation, turns in TURNS.items():
        for step, expected in enumerate(turns):
            turn = get_method("agon").turn(rotation, step)
            assert turn == expected, (rotation, step)
            if turn not in games:
                games[turn] = rivals.play(turn.drafter, turn.challenger, exchange)
            game = games[turn]
            assert (game.drafter, game.challenger) == (turn.drafter, turn.challenger)
            assert [r.problem for r in game.rounds] == rivals.rows

            drafts = rivals.greedy(turn.drafter, plain)
            assert _differ(drafts, rivals.greedy(other[turn.drafter], plain)) == len(plain)
            assert [r.draft.prompt for r in game.rounds] == plain
            assert [r.draft.completion for r in game.rounds] == drafts, (rotation, step)
            recaps = [task.recap(d.text) for d in drafts]
            assert [r.recap for r in game.rounds] == recaps

            if exchange == "visible":
                prompts = [render(rivals.policies, task, rivals.model_cfg, task.challenge_message(p, recap))
                           for p, recap in zip(rivals.rows, recaps)]
            else:
                prompts = plain
            challenges = rivals.greedy(turn.challenger, prompts)
            assert _differ(challenges, rivals.greedy(other[turn.challenger], prompts)) == len(prompts)
            assert [r.challenge.prompt for r in game.rounds] == prompts
            assert [r.challenge.completion for r in game.rounds] == challenges, (rotation, step)
    assert len(games) == 2, "the steps should have played both orders"


# B's drafts carry no recap, and A answers an empty one wrong: A challenges B on the plain prompt, where it is
# sometimes right, so that correctness differs between the roles in both orders
@pytest.mark.parametrize("drafter,challenger,exchange", [("A", "B", "visible"), ("B", "A", "hidden")])
def test_the_outcome_holds_each_roles_own_verdicts_lengths_and_format(rivals, drafter, challenger, exchange):
    """Each role's correctness, length and format flag come from its own completions, graded on its own: checked
    where the two roles differ (A mostly well-formed and often right, B hardly ever, and mostly at the budget)."""
    game = rivals.play(drafter, challenger, exchange)
    outcome = game.outcome()
    for role, correct, tokens, fmt in (
            ("drafter", outcome.draft_correct, outcome.draft_tokens, outcome.draft_format),
            ("challenger", outcome.challenge_correct, outcome.challenge_tokens, outcome.challenge_format)):
        attempts = game.attempts(role)
        verdicts = rivals.task.verify(rivals.rows, [a.completion.text for a in attempts])
        assert [a.verdict for a in attempts] == verdicts
        assert correct.tolist() == [float(v.correct) for v in verdicts]
        assert fmt.tolist() == [float(v.format_ok) for v in verdicts]
        assert tokens.tolist() == [a.completion.n_tokens for a in attempts]
    # the checks above have power only where the roles differ, in each of the three
    assert not torch.equal(outcome.draft_format, outcome.challenge_format)
    assert not torch.equal(outcome.draft_tokens, outcome.challenge_tokens)
    assert not torch.equal(outcome.draft_correct, outcome.challenge_correct)


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
