"""Rollouts of the draft-and-challenge game: draft, recap, challenge, as small dataclasses.

``play`` samples ``group_size`` drafts per problem from the drafter on the plain prompt, grades them, extracts each
draft's recap (visible text after ``</think>``, final answer removed; never the reasoning), then, when a challenger
is given, samples one challenge per draft: from a prompt holding the problem and that recap (``exchange=visible``)
or from the plain prompt (``exchange=hidden``: the rival is out of context, its outcome still enters the reward),
or from the plain prompt read after a prefix of the drafter's key/value states (``exchange=latent``: the span
``exchange.span`` names, run under the drafter's adapter; ``agon.models.latent``).
Rows are ordered problem-major, so each problem's ``group_size`` rows are one GRPO group for either role.

Completions come from an engine (``agon.engines``: transformers or vLLM). Adapter names are the ones in
``Policies``; ``None`` plays the untrained base (the mixture-of-agents baseline).
``play_split`` is ``play`` across processes: each rank plays its share of the problems, and every rank gets the
whole game back. ``answer_drafts`` (``answer_split`` across processes) answers a played game's drafts again with
another answerer: the same drafts and recaps, read by someone else (an evaluation's self-cascades).
``on_sampled(n)`` hears of each batch of ``n`` completions as the engine returns it (each ``generate`` call of the
``hf`` engine, each budget of continuous batching, the whole call of vLLM), so a long evaluation can show its
progress.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from agon.core.distributed import Ranks
from agon.engines import Engine, Request, Sampling
from agon.engines.hf import HFEngine
from agon.models.latent import SPANS, Prefixes
from agon.models.policies import Policies
from agon.models.tokens import Completion
from agon.core.rewards import Outcome
from agon.tasks import Problem, Task, Verdict


@dataclass(frozen=True)
class Attempt:
    """One completion of one role: the prompt it saw, what it wrote, and the verdict."""

    prompt: str
    completion: Completion
    verdict: Verdict
    # exchange=latent: the token ids whose key/value states, under the drafter's adapter, preceded the prompt
    # (empty: none; agon.models.latent)
    prefix: tuple[int, ...] = ()


@dataclass(frozen=True)
class Round:
    """One draft and (for two-role methods) the challenge that answered it."""

    problem: Problem
    draft: Attempt
    recap: str
    challenge: Attempt | None = None


@dataclass(frozen=True)
class Game:
    """A batch of rounds, problem-major: rows ``[p * group_size, (p + 1) * group_size)`` share problem ``p``."""

    rounds: list[Round]
    drafter: str | None
    challenger: str | None
    group_size: int

    @classmethod
    def concat(cls, games: Sequence["Game"]) -> "Game":
        """One game of several played by the same roles (the ranks' shares of a step, in rank order)."""
        if len(games) == 1:
            return games[0]
        first = games[0]
        return cls([r for g in games for r in g.rounds], first.drafter, first.challenger, first.group_size)

    def group_ids(self) -> torch.Tensor:
        """[B] long: the GRPO group (problem) of each row."""
        return torch.arange(len(self.rounds)) // self.group_size

    def attempts(self, role: str) -> list[Attempt]:
        return [r.draft if role == "drafter" else r.challenge for r in self.rounds]  # type: ignore[misc]

    def outcome(self) -> Outcome:
        def correct(attempts: Sequence[Attempt]) -> torch.Tensor:
            return torch.tensor([float("nan") if a.verdict.failed else float(a.verdict.correct) for a in attempts])

        def tokens(attempts: Sequence[Attempt]) -> torch.Tensor:
            return torch.tensor([float(a.completion.n_tokens) for a in attempts])

        def fmt(attempts: Sequence[Attempt]) -> torch.Tensor:
            return torch.tensor([float(a.verdict.format_ok) for a in attempts])

        drafts = self.attempts("drafter")
        if self.rounds[0].challenge is None:
            return Outcome(correct(drafts), tokens(drafts), fmt(drafts))
        challenges = self.attempts("challenger")
        return Outcome(correct(drafts), tokens(drafts), fmt(drafts),
                       correct(challenges), tokens(challenges), fmt(challenges))


def sample_attempts(engine: Engine, task: Task, adapter: str | None, problems: Sequence[Problem],
                    prompts: Sequence[str], sampling: Sampling,
                    on_sampled: Callable[[int], object] | None = None,
                    prefixes: Prefixes | None = None) -> list[Attempt]:
    # told as the engine's batches return, before grading: the sampling is the long part, what a progress bar counts
    kwargs = {} if prefixes is None else {"prefixes": prefixes}  # an engine that predates latent exchange: none
    completions = engine.sample(prompts, adapter, sampling, on_sampled=on_sampled, **kwargs)
    verdicts = task.verify(problems, [c.text for c in completions])
    ids = prefixes.ids if prefixes is not None else [()] * len(prompts)
    return [Attempt(p, c, v, tuple(x)) for p, c, v, x in zip(prompts, completions, verdicts, ids, strict=True)]


def latent_prefixes(policies: Policies, task: Task, drafts: Sequence[Attempt], drafter: str | None,
                    span: str) -> Prefixes:
    """Each draft's ``span`` (``agon.models.latent.SPANS``) as the prefix its challenger reads, under ``drafter``'s
    adapter."""
    cut = SPANS.get_or_raise(span)
    return Prefixes(drafter, tuple(cut(policies, task, d.prompt, d.completion) for d in drafts))


def render(policies: Policies, task: Task, model_cfg: Any, message: str) -> str:
    return policies.render(message, system=task.cfg.system_prompt, enable_thinking=model_cfg.enable_thinking)


def derive_seed(*parts: Any) -> int:
    """A seed of 63 bits from ``parts`` (the run's seed, a phase, a step, a row): the same parts, the same seed, on
    every machine and Python (not ``hash``, which is salted per process)."""
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:15], 16)


@dataclass(frozen=True)
class Match:
    """One table of rounds: who drafts, who answers (``False``: drafts only; ``None``: the base), one problem per
    round and each round's seed (``None``: the engine's own stream). The challenge draws from a seed derived from
    its round's, so a round samples the same whatever else shares its engine call."""

    drafter: str | None
    challenger: str | None | bool
    problems: Sequence[Problem]
    seeds: Sequence[int | None]
    # drafts already written, one per round (another order's, read again by another answerer): only the answers are
    # sampled, each from its round's challenge seed
    drafts: Sequence[Attempt] | None = None


# told (match, row, round) as each round is complete
OnRound = Callable[[int, int, Round], object]


def play_rounds(policies: Policies, task: Task, model_cfg: Any, matches: Sequence[Match], *, exchange: str,
                sampling: Sampling, engine: Engine, on_sampled: Callable[[int], object] | None = None,
                on_round: OnRound | None = None) -> list[list[Round]]:
    """Every match's rounds, played in one ``Engine.stream``: all drafts submitted at once, each draft graded and
    recapped as it finishes and its challenge submitted then (``exchange=visible``); under ``exchange=hidden`` the
    challenges read the plain prompt and go in with the drafts. On an engine that streams, the challenges' tails
    overlap the drafts'; on the others the stream plays two waves, every draft before any challenge. Rounds in row
    order per match. Not ``exchange=latent``: its challenger reads the drafter's states (``play``)."""
    plain = [[render(policies, task, model_cfg, task.user_message(p)) for p in m.problems] for m in matches]
    # per request index: (match, row, stage), in the order the stream indexes them
    index: list[tuple[int, int, str]] = []
    drafts: dict[tuple[int, int], Attempt] = {}
    recaps: dict[tuple[int, int], str] = {}
    challenges: dict[tuple[int, int], Attempt] = {}
    challenge_prompts: dict[tuple[int, int], str] = {}
    rounds: list[list[Round | None]] = [[None] * len(m.problems) for m in matches]

    def challenge_seed(m: int, i: int) -> int | None:
        seed = matches[m].seeds[i]
        return None if seed is None else derive_seed(seed, "challenge")

    def request(m: int, i: int, stage: str, prompt: str) -> Request:
        index.append((m, i, stage))
        if stage == "draft":
            return Request(prompt, matches[m].drafter, matches[m].seeds[i])
        challenge_prompts[(m, i)] = prompt
        return Request(prompt, matches[m].challenger, challenge_seed(m, i))  # type: ignore[arg-type]

    def complete(m: int, i: int) -> None:
        rnd = Round(matches[m].problems[i], drafts[(m, i)], recaps[(m, i)], challenges.get((m, i)))
        rounds[m][i] = rnd
        if on_round is not None:
            on_round(m, i, rnd)

    def then(finished: list[tuple[int, Completion]]) -> list[Request]:
        which = [index[k] for k, _ in finished]
        verdicts = task.verify([matches[m].problems[i] for m, i, _ in which], [c.text for _, c in finished])
        follow = []
        for (k, c), (m, i, stage), v in zip(finished, which, verdicts):
            if stage == "draft":
                drafts[(m, i)] = Attempt(plain[m][i], c, v)
                recaps[(m, i)] = recap = task.recap(c.text)
                if matches[m].challenger is False or (m, i) in challenges:
                    complete(m, i)
                elif exchange == "visible":
                    message = task.challenge_message(matches[m].problems[i], recap)
                    follow.append(request(m, i, "challenge", render(policies, task, model_cfg, message)))
            else:
                challenges[(m, i)] = Attempt(challenge_prompts[(m, i)], c, v)
                if (m, i) in drafts:
                    complete(m, i)
        return follow

    first = [request(m, i, "draft", plain[m][i])
             for m, match in enumerate(matches) if match.drafts is None for i in range(len(match.problems))]
    for m, match in enumerate(matches):
        for i, draft in enumerate(match.drafts or ()):
            drafts[(m, i)], recaps[(m, i)] = draft, task.recap(draft.completion.text)
            if exchange == "visible":
                message = task.challenge_message(match.problems[i], recaps[(m, i)])
                first.append(request(m, i, "challenge", render(policies, task, model_cfg, message)))
    if exchange != "visible":  # the challenge reads the plain prompt: it need not wait for its draft
        first += [request(m, i, "challenge", plain[m][i]) for m, match in enumerate(matches)
                  if match.challenger is not False for i in range(len(match.problems))]
    engine.stream(first, sampling, then, on_sampled)
    return rounds  # type: ignore[return-value]


def answer_drafts(policies: Policies, task: Task, model_cfg: Any, game: Game, reader: str | None, *, exchange: str,
                  sampling: Sampling, engine: Engine, seeds: Sequence[int | None] | None = None,
                  on_sampled: Callable[[int], object] | None = None, span: str = "recap") -> Game:
    """``game``'s drafts answered again, by ``reader``: the same drafts and recaps, another answerer (a self-cascade
    of A reads the very drafts of ``A>B``). ``seeds``: each row's seed, from which its answer's is derived."""
    drafts = game.attempts("drafter")
    problems = [r.problem for r in game.rounds]
    if exchange == "latent":
        plain = [d.prompt for d in drafts]
        prefixes = latent_prefixes(policies, task, drafts, game.drafter, span)
        answers = sample_attempts(engine, task, reader, problems, plain, sampling, on_sampled, prefixes)
        rounds = [Round(p, d, r.recap, a) for p, d, r, a in zip(problems, drafts, game.rounds, answers)]
    else:
        match = Match(game.drafter, reader, problems, [None] * len(problems) if seeds is None else seeds, drafts)
        rounds = play_rounds(policies, task, model_cfg, [match], exchange=exchange, sampling=sampling,
                             engine=engine, on_sampled=on_sampled)[0]
    return Game(rounds, game.drafter, reader, game.group_size)


def play(
    policies: Policies,
    task: Task,
    model_cfg: Any,
    problems: Sequence[Problem],
    *,
    drafter: str | None,
    challenger: str | None | bool,
    exchange: str,
    group_size: int,
    sampling: Sampling,
    engine: Engine | None = None,
    on_sampled: Callable[[int], object] | None = None,
    span: str = "recap",
    seeds: Sequence[int | None] | None = None,
) -> Game:
    """Draft ``group_size`` times per problem with ``drafter``; challenge each draft with ``challenger``.

    ``challenger=False`` plays drafts only (vanilla GRPO, solo evaluation); ``None`` means the base model.
    ``engine`` samples (``agon.engines``; default: ``hf`` on ``policies``). ``on_sampled(n)`` is called as the
    engine returns each batch of ``n`` completions. ``span``: what of each draft a latent challenger reads
    (``exchange=latent`` only). ``seeds``: each problem's seed, for engines that seed requests (``Engine.seeded``);
    its ``group_size`` rows draw from seeds derived from it.
    """
    engine = engine or HFEngine(policies)
    rows = [p for p in problems for _ in range(group_size)]
    if exchange == "latent" and challenger is not False:
        return _play_latent(policies, task, model_cfg, rows, drafter, challenger, group_size, sampling, engine,
                            on_sampled, span)
    row_seeds = [None] * len(rows) if seeds is None else [derive_seed(s, k) for s in seeds for k in range(group_size)]
    match = Match(drafter, challenger, rows, row_seeds)
    rounds = play_rounds(policies, task, model_cfg, [match], exchange=exchange, sampling=sampling, engine=engine,
                         on_sampled=on_sampled)[0]
    return Game(rounds, drafter, None if challenger is False else challenger, group_size)  # type: ignore[arg-type]


def _play_latent(policies: Policies, task: Task, model_cfg: Any, rows: list[Problem], drafter: str | None,
                 challenger: str | None, group_size: int, sampling: Sampling, engine: Engine,
                 on_sampled: Callable[[int], object] | None, span: str) -> Game:
    """``play`` under ``exchange=latent``: every draft, then every challenge read after its draft's span of
    key/value states (which exist only once the draft is written, on the ``hf`` engine)."""
    plain = [render(policies, task, model_cfg, task.user_message(p)) for p in rows]
    drafts = sample_attempts(engine, task, drafter, rows, plain, sampling, on_sampled)
    recaps = [task.recap(d.completion.text) for d in drafts]
    prefixes = latent_prefixes(policies, task, drafts, drafter, span)
    challenges = sample_attempts(engine, task, challenger, rows, plain, sampling, on_sampled, prefixes)
    rounds = [Round(p, d, r, c) for p, d, r, c in zip(rows, drafts, recaps, challenges)]
    return Game(rounds, drafter, challenger, group_size)


def play_split(ranks: Ranks, policies: Policies, task: Task, model_cfg: Any, problems: Sequence[Problem],
               seeds: Sequence[int] | None = None, **kwargs: Any) -> tuple[Game, slice]:
    """``play`` of this rank's share of ``problems`` (``ranks.split``: whole groups) and of their ``seeds``; returns
    the whole game, every rank's rounds in problem order, and this rank's rows of it. One process: ``play`` itself,
    all rows."""
    mine = play(policies, task, model_cfg, ranks.split(problems),
                seeds=None if seeds is None else ranks.split(seeds), **kwargs)
    games = ranks.gather(mine)
    start = sum(len(g.rounds) for g in games[: ranks.rank])
    return Game.concat(games), slice(start, start + len(mine.rounds))


def answer_split(ranks: Ranks, policies: Policies, task: Task, model_cfg: Any, game: Game, rows: slice,
                 reader: str | None, seeds: Sequence[int | None] | None = None, **kwargs: Any) -> Game:
    """``answer_drafts`` of this rank's ``rows`` of ``game`` (``play_split``'s slice; ``seeds``: one per row of
    the whole game); returns the whole game, every rank's rounds in order."""
    mine = Game(game.rounds[rows], game.drafter, game.challenger, game.group_size)
    answered = answer_drafts(policies, task, model_cfg, mine, reader, seeds=None if seeds is None else seeds[rows],
                             **kwargs)
    return Game.concat(ranks.gather(answered))
