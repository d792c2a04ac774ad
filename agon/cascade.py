"""Held-out evaluation as the method is deployed: the cascade, each adapter alone, and the rates between them.

For Agon, one adapter drafts and the other reads the recap and gives the final answer; both orders are scored
(``A>B`` and ``B>A``). pass@1 is the mean correctness of the final answer over ``eval.samples`` samples per problem.
The drafts of a cascade are each adapter alone on the plain prompt, so solo accuracy comes from the same samples.
Conversion is P(final right | draft wrong) and regression P(final wrong | draft right), pooled over the headline
orders. The headline (``eval/accuracy``) is, per method:

    Agon         mean of A>B and B>A (rotation=alternate); A>B (rotation=fixed)
    self-refine  A>A: one adapter drafts and answers its own recap
    MoA          base>base: the untrained base run as the cascade
    GRPO         A alone

(each method declares its pairs and headline: ``methods.Method.evaluation``).

The second stage sees the recap under ``exchange=visible``, the plain prompt under ``exchange=hidden``, and the plain
prompt after the drafter's key/value states of ``exchange.span`` under ``exchange=latent`` (``agon.latent``), the
same information it had in training. Keys that do not apply to a method are None (null in summary.json).

Divergence: ``eval/agree_AB`` is the chance that a draft of A and a draft of B to the same problem commit to the
same answer (``agon.tasks.text.final_answer``; no answer agrees with nothing), ``eval/agree_AA`` and
``eval/agree_BB`` the chance that two different drafts of one adapter do, each averaged over problems, and
``eval/divergence`` is mean(agree_AA, agree_BB) - agree_AB. Two adapters that act as one policy score 0 in
expectation (the A-B pairs are then draws from one policy, like the A-A pairs); adapters with blind spots of their
own score above it. It needs both adapters drafting and 2+ samples per problem, else None.

Playing and scoring are separate: ``evaluate`` plays the pipelines, then ``summarise``, a pure function of the
played games, builds the eval.jsonl rows and the metrics, so the definitions above can be checked on games built
by hand (tests/test_cascade.py) and the analysis fixtures are written by the same code. With several processes,
each rank plays its share of the problems (``rollout.play_split``) and every rank summarises the whole games.

Sizes: the evaluations before and after training score ``eval.n_problems`` x ``eval.samples``; those during training
(phase ``train``) the first ``eval.interim_problems`` of them x ``eval.interim_samples`` (``eval_size``), so a curve
can be drawn often without each point costing a full evaluation. Every logged point carries ``eval/n_problems``
and ``eval/samples``, the size it was scored at.

Progress: one bar over the completions this rank samples (total known before the first call), advanced as each
of the engine's batches returns (a ``generate`` call of ``hf``; vLLM hands back a stage's completions at once), so a
long evaluation shows an ETA instead of looking hung. Left out on purpose: the optional diagnostic
(``agon.eval.diagnose``), which samples outside the bar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from agon.distributed import Ranks
from agon.engines import Engine, Sampling
from agon.methods import get_method
from agon.policies import Policies
from agon.rollout import Attempt, Game, play_split
from agon.tasks import Problem, Task
from agon.tasks.text import final_answer

NAMES = {None: "base"}


def _name(adapter: str | None) -> str:
    return NAMES.get(adapter, adapter)  # type: ignore[arg-type]


def order_name(drafter: str | None, answerer: str | None | bool) -> str:
    """``A>B`` for a cascade, the drafter's name alone when ``answerer`` is False (drafts only)."""
    return _name(drafter) if answerer is False else f"{_name(drafter)}>{_name(answerer)}"


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    rows: list[dict[str, Any]]
    games: dict[str, Game]


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _accuracy(attempts: Sequence[Attempt] | None) -> float | None:
    return _mean([float(a.verdict.correct) for a in attempts or ()])


def eval_size(eval_cfg: Any, phase: str) -> tuple[int, int]:
    """(problems, samples per problem) of an evaluation in ``phase``: the interim size during training (``train``),
    where set, else ``eval.n_problems`` x ``eval.samples``."""
    n, k = eval_cfg.n_problems, eval_cfg.samples
    if phase == "train":
        n = n if eval_cfg.interim_problems is None else eval_cfg.interim_problems
        k = k if eval_cfg.interim_samples is None else eval_cfg.interim_samples
    return n, k


def progress_label(phase: str, step: int) -> str:
    """``eval start``, ``eval step 50``, ``eval final``: what the bar of an evaluation is called."""
    return f"eval step {step}" if phase == "train" else f"eval {phase}"


def evaluate(policies: Policies, task: Task, cfg: Any, problems: Sequence[Problem], step: int,
             phase: str, ranks: Ranks = Ranks(), engine: Engine | None = None, *, samples: int | None = None,
             progress: bool = False) -> EvalResult:
    """Play every pipeline of ``cfg.method`` on ``problems`` x ``samples`` (default ``eval.samples``; sampled by
    ``engine``, default ``hf``); metrics and eval.jsonl rows. ``progress``: a bar over the completions on rank 0."""
    from tqdm.auto import tqdm

    e = cfg.eval
    samples = e.samples if samples is None else samples
    sampling = Sampling.from_config(e)
    evaluation = get_method(cfg.method.name).evaluation(cfg.rotation.mode)
    rows = len(ranks.split(problems)) * samples  # this rank's share: the completions its bar counts, per stage
    total = sum(rows * (1 if answerer is False else 2) for _, answerer in evaluation.plays)
    games: dict[str, Game] = {}
    # an interim bar is cleared when done, so the training bar under it keeps its line
    with tqdm(total=total, desc=progress_label(phase, step), unit="completion",
              disable=not (progress and ranks.is_main), leave=phase != "train", dynamic_ncols=True) as bar:
        for drafter, answerer in evaluation.plays:
            order = order_name(drafter, answerer)
            bar.set_postfix_str(order)
            games[order] = play_split(ranks, policies, task, cfg.model, problems, drafter=drafter,
                                      challenger=answerer, exchange=cfg.exchange.mode, group_size=samples,
                                      sampling=sampling, engine=engine, on_sampled=bar.update,
                                      span=cfg.exchange.span)[0]
    return summarise(games, evaluation.headline, step=step, phase=phase)


def summarise(games: Mapping[str, Game], headline: Sequence[str], *, step: int, phase: str) -> EvalResult:
    """The eval.jsonl rows and the metrics of played games (``order name -> Game``, as ``evaluate`` plays them).

    Pure: nothing is sampled or graded here, only the verdicts already in the games are counted.
    """
    rows = [row for order, game in games.items() for row in _rows(order, game, step, phase)]
    # a game's final answer is the challenge, or the draft itself when nobody answered it (grpo)
    finals = {o: [r.challenge or r.draft for r in g.rounds] for o, g in games.items()}
    solo: dict[str, list[Attempt]] = {}
    for game in games.values():  # every draft is its drafter alone on the plain prompt
        solo.setdefault(_name(game.drafter), []).extend(game.attempts("drafter"))
    pairs = [(r.draft.verdict.correct, r.challenge.verdict.correct)
             for o in headline for r in games[o].rounds if r.challenge is not None]
    attempts = [a for g in games.values() for r in g.rounds for a in (r.draft, r.challenge) if a is not None]
    first = next(iter(games.values()))
    metrics = {
        "eval/accuracy": _mean([_accuracy(finals[o]) for o in headline]),  # type: ignore[arg-type]
        "eval/final_trace_tokens": _mean([float(a.completion.n_tokens) for o in headline for a in finals[o]]),
        "eval/n_problems": len(first.rounds) // first.group_size,
        "eval/samples": first.group_size,
        "eval/cascade_acc_AB": _accuracy(finals.get("A>B")),
        "eval/cascade_acc_BA": _accuracy(finals.get("B>A")),
        "eval/solo_acc_A": _accuracy(solo.get("A")),
        "eval/solo_acc_B": _accuracy(solo.get("B")),
        "eval/solo_acc_base": _accuracy(solo.get("base")),
        "eval/conversion_rate": _mean([float(final) for draft, final in pairs if not draft]),
        "eval/regression_rate": _mean([float(not final) for draft, final in pairs if draft]),
        # each completion once: the solo rows repeat the drafts and are not counted again
        "eval/verifier_failures": sum(a.verdict.failed for a in attempts),
        "eval/headline_orders": list(headline),
        **divergence(_answers_by_problem(games, "A"), _answers_by_problem(games, "B")),
    }
    return EvalResult(metrics, rows, dict(games))


Answers = dict[str, list[str | None]]


def _answers_by_problem(games: Mapping[str, Game], adapter: str) -> Answers:
    """{problem id: the final answer of each draft ``adapter`` wrote for it}, over every game it drafted."""
    out: Answers = {}
    for game in games.values():
        if _name(game.drafter) == adapter:
            for rnd in game.rounds:
                out.setdefault(rnd.problem.id, []).append(final_answer(rnd.draft.completion.text))
    return out


def agreement(left: Answers, right: Answers | None = None) -> float | None:
    """Mean over problems of the chance that two drafts commit to the same answer: a draft of ``left`` and one of
    ``right``, every pair; or with ``right`` None, two different drafts of ``left``. None answers never agree.
    None when no problem has a pair."""

    def same(x: str | None, y: str | None) -> float:
        return float(x is not None and x == y)

    rates = []
    for pid, xs in left.items():
        if right is None:
            pairs = [(xs[i], xs[j]) for i in range(len(xs)) for j in range(i + 1, len(xs))]
        else:
            pairs = [(x, y) for x in xs for y in right.get(pid, ())]
        if pairs:
            rates.append(sum(same(x, y) for x, y in pairs) / len(pairs))
    return _mean(rates)


def divergence(a: Answers, b: Answers) -> dict[str, float | None]:
    """``eval/agree_AB``, ``eval/agree_AA``, ``eval/agree_BB`` and ``eval/divergence`` (module docstring)."""
    ab, aa, bb = agreement(a, b), agreement(a), agreement(b)
    div = None if None in (ab, aa, bb) else (aa + bb) / 2 - ab  # type: ignore[operator]
    return {"eval/agree_AB": ab, "eval/agree_AA": aa, "eval/agree_BB": bb, "eval/divergence": div}


def _rows(order: str, game: Game, step: int, phase: str) -> list[dict[str, Any]]:
    """eval.jsonl rows of one game: a cascade's draft and final stages, and its drafts again as the drafter alone."""
    rows = []
    for i, rnd in enumerate(game.rounds):
        if rnd.challenge is None:
            stages = [(order, "final", rnd.draft)]
        else:
            stages = [(order, "draft", rnd.draft), (order, "final", rnd.challenge),
                      (_name(game.drafter), "final", rnd.draft)]
        rows += [{"step": step, "phase": phase, "order": o, "stage": stage, "problem_id": rnd.problem.id,
                  "sample": i % game.group_size, "correct": a.verdict.correct, "format_ok": a.verdict.format_ok,
                  "tokens": a.completion.n_tokens, "status": a.verdict.status,
                  "answer": final_answer(a.completion.text)} for o, stage, a in stages]
    return rows
