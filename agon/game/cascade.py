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
prompt after the drafter's key/value states of ``exchange.span`` under ``exchange=latent`` (``agon.models.latent``),
the same information it had in training. Keys that do not apply to a method are None (null in summary.json).

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

Resuming: an evaluation plays its problems in chunks of ``eval.chunk_problems`` (every pipeline on one chunk, then
the next), each chunk sampled from its own seed (``chunk_seed``: the run's seed, the phase, the step, the chunk and
the rank) and, with a ``PartStore``, committed to the run directory as it finishes (written to a temporary file,
then renamed). A run killed during any evaluation and launched again plays only the chunks that were not committed,
and since no chunk's samples depend on another's, its rows are line for line the uninterrupted run's. The store is
keyed by the adapters' digest and the settings that shape the evaluation, so parts of another evaluation are never
read. The evaluation runs under a forked RNG: training after it draws what it would have drawn without it, so an
interim evaluation resumed from its parts leaves the rest of the run as it was.

Progress: one bar over the completions this rank samples (total known before the first call), advanced as each
of the engine's batches returns (a ``generate`` call of ``hf``, each finished request of vLLM, a call of continuous
batching per completion budget), starting at the completions of committed chunks, so a long evaluation shows an
ETA instead of looking hung. Left out on purpose: the optional diagnostic (``agon.game.diagnostic.diagnose``), which
samples outside the bar, and per-request seeds for vLLM, which samples from its engine's seed: a vLLM evaluation
resumes without sampling again what was done, but its remaining chunks draw other samples than an uninterrupted run
would.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from agon.core.distributed import Ranks
from agon.engines import Engine, Sampling
from agon.core.methods import get_method
from agon.models.policies import Policies
from agon.game.rollout import Attempt, Game, play_split
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


def chunk_seed(*parts: Any) -> int:
    """A seed of 63 bits from ``parts`` (the run's seed, phase, step, chunk, rank): the same parts, the same seed, on
    every machine and Python (not ``hash``, which is salted per process)."""
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:15], 16)


@contextlib.contextmanager
def forked_rng() -> Iterator[None]:
    """torch's (CPU and the current CUDA device's) and Python's RNG restored on leaving: what runs inside draws
    nothing from the caller's streams."""
    state = random.getstate()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(state)


class PartStore:
    """The committed chunks of one evaluation, ``<directory>/<key>/chunk_<i>.pt`` (``key``: the adapters' digest and
    the evaluation's settings). Rank 0 reads and writes; every rank gets what it read. The caller removes the
    directory once no resume can need the parts (the trainer: at each checkpoint and at the end of the run), so a
    run sent back to an earlier checkpoint finds the evaluations it replays already done."""

    def __init__(self, directory: Path, key: str, ranks: Ranks = Ranks()):
        self.dir, self.ranks = Path(directory) / key, ranks

    def load(self, chunk: int) -> dict[str, Game] | None:
        path = self.dir / f"chunk_{chunk}.pt"
        games = torch.load(path, weights_only=False) if self.ranks.is_main and path.exists() else None
        return self.ranks.share(games)

    def save(self, chunk: int, games: dict[str, Game]) -> None:
        if self.ranks.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".chunk_{chunk}.tmp"
            torch.save(games, tmp)
            os.replace(tmp, self.dir / f"chunk_{chunk}.pt")
        self.ranks.barrier()


def store_key(digest: str, cfg: Any, phase: str, step: int, n: int, samples: int) -> str:
    """Names one evaluation's parts: the adapters evaluated and everything that shapes what it samples."""
    from omegaconf import OmegaConf

    shaping = {k: OmegaConf.to_container(cfg[k], resolve=True)
               for k in ("model", "task", "method", "exchange", "rotation", "eval", "generation")}
    blob = json.dumps([digest, shaping, cfg.seed, phase, step, n, samples], sort_keys=True, default=str)
    return f"{phase}-{step}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


class _Counted:
    """An engine whose ``sample`` calls are counted (the evaluation says how many it made)."""

    def __init__(self, engine: Engine | None):
        self.engine, self.calls = engine, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.engine.sample(*args, **kwargs)  # type: ignore[union-attr]


def evaluate(policies: Policies, task: Task, cfg: Any, problems: Sequence[Problem], step: int,
             phase: str, ranks: Ranks = Ranks(), engine: Engine | None = None, *, samples: int | None = None,
             progress: bool = False, store: PartStore | None = None,
             on_chunk: Callable[[int], None] | None = None, log: Callable[[str], None] | None = None) -> EvalResult:
    """Play every pipeline of ``cfg.method`` on ``problems`` x ``samples`` (default ``eval.samples``; sampled by
    ``engine``, default ``hf``), chunk by chunk (module docstring); metrics and eval.jsonl rows. ``store``: the
    committed chunks, read instead of played and written as each is played; ``on_chunk(i)`` after chunk ``i`` is
    committed; ``log``: one line saying how many chunks were played and how many engine calls that took.
    ``progress``: a bar over the completions on rank 0."""
    from agon.engines.hf import HFEngine
    from tqdm.auto import tqdm

    e = cfg.eval
    samples = e.samples if samples is None else samples
    sampling = Sampling.from_config(e)
    evaluation = get_method(cfg.method.name).evaluation(cfg.rotation.mode)
    # a multiple of the processes, so that every rank has a share of every chunk
    size = -(-max(e.chunk_problems, ranks.world) // ranks.world) * ranks.world
    chunks = [list(problems[i: i + size]) for i in range(0, len(problems), size)]
    stages = sum(1 if answerer is False else 2 for _, answerer in evaluation.plays)
    # this rank's share: the completions its bar counts
    total = sum(len(ranks.split(chunk)) * samples * stages for chunk in chunks)
    counted = _Counted(engine if engine is not None else HFEngine(policies))
    parts: list[dict[str, Game]] = []
    played = 0
    # an interim bar is cleared when done, so the training bar under it keeps its line
    with forked_rng(), tqdm(total=total, desc=progress_label(phase, step), unit="completion",
                            disable=not (progress and ranks.is_main), leave=phase != "train",
                            dynamic_ncols=True) as bar:
        for i, chunk in enumerate(chunks):
            games = store.load(i) if store is not None else None
            if games is None:
                torch.manual_seed(chunk_seed(cfg.seed, phase, step, i, ranks.rank))
                random.seed(chunk_seed(cfg.seed, phase, step, i, ranks.rank, "python"))
                games = {}
                for drafter, answerer in evaluation.plays:
                    order = order_name(drafter, answerer)
                    bar.set_postfix_str(order)
                    games[order] = play_split(ranks, policies, task, cfg.model, chunk, drafter=drafter,
                                              challenger=answerer, exchange=cfg.exchange.mode, group_size=samples,
                                              sampling=sampling, engine=counted, on_sampled=bar.update,
                                              span=cfg.exchange.span)[0]
                played += 1
                if store is not None:
                    store.save(i, games)
            else:
                bar.update(len(ranks.split(chunk)) * samples * stages)
            parts.append(games)
            if on_chunk is not None:
                on_chunk(i)
    if log is not None:
        kept = f", {len(chunks) - played} kept from an interrupted run" if played < len(chunks) else ""
        log(f"[eval] {progress_label(phase, step)}: {played} of {len(chunks)} chunks played in {counted.calls} "
            f"engine calls{kept}")
    games = {order: Game.concat([part[order] for part in parts]) for order in parts[0]} if parts else {}
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
