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

Equal generations (``eval.equal_generations``): a cascade answers with two generations, GRPO's headline with one, so
every evaluation also answers each drafter's drafts again, by itself and by every other drafter, where the method's
plays do not (``Evaluation.reads``: Agon's ``A>A`` and ``B>B``, GRPO's ``A>A``). A read answers the very drafts of
its drafter's first play (``rollout.answer_drafts``), so a self-cascade and a cross cascade are paired on the same
drafts. ``eval/accuracy_two_generations`` is the headline with each one-generation order replaced by its
self-cascade, ``eval/accuracy_one_generation`` the headline's drafters alone; each drafter's solo rows are its drafts
in its first play, counted once.

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

Streamed: on an engine that streams (vLLM, ``generation.stream``), an evaluation's plays are one engine call.
This rank's share of every play (both cascade orders, solo and cross-play alike) is submitted at once, each answer
the moment its draft is finished, graded and recapped (``rollout.play_rounds``), so no stage waits out another's
tail; the reads follow in a second call, once the drafts they answer exist (left out on purpose: submitting each
read inside the first call as its draft finishes, which would save that call's tail). Every request draws from its
own seed (``derive_seed``: the run's seed, the phase, the step, the order, the problem's place in the evaluation
and the sample), so a streamed evaluation and a two-stage one give the same rows.

Resuming: with a ``PartStore``, a streamed evaluation commits each round to this rank's journal
(``RoundJournal``) as it finishes; a run killed during it and launched again plays only the rounds that were not
committed (those in flight), and, each drawn from its own seed, they are the uninterrupted run's. On the other
engines an evaluation plays its problems in chunks of ``eval.chunk_problems`` (every pipeline on one chunk, then
the next), each chunk sampled from its own seed (``chunk_seed``: the run's seed, the phase, the step, the chunk and
the rank) and committed as it finishes (written to a temporary file, then renamed); a relaunch plays only the
chunks that were not committed, and since no chunk's samples depend on another's, its rows are line for line the
uninterrupted run's. The store is keyed by the adapters' digest and the settings that shape the evaluation, so
parts of another evaluation are never read. The evaluation runs under a forked RNG: training after it draws what it
would have drawn without it, so an interim evaluation resumed from its parts leaves the rest of the run as it was.

Progress: one bar over the completions this rank samples (total known before the first call), advanced as each
of the engine's batches returns (a ``generate`` call of ``hf``, each finished request of vLLM, a call of continuous
batching per completion budget), starting at the completions already committed, so a long evaluation shows an ETA
instead of looking hung. Left out on purpose: the optional diagnostic (``agon.game.diagnostic.diagnose``), which
samples outside the bar and outside the stream.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from agon.core.distributed import Ranks
from agon.engines import Engine, Sampling
from agon.core.methods import get_method
from agon.models.policies import Policies
from agon.game.rollout import (Attempt, Game, Match, Round, answer_split, derive_seed, play_rounds,
                               play_split)
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


# the seed of a chunk (the run's seed, phase, step, chunk, rank) or of a problem's requests
chunk_seed = derive_seed


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

    def journal(self) -> "RoundJournal":
        """This rank's rounds of a streamed evaluation, committed one by one."""
        return RoundJournal(self.dir / f"rounds_rank{self.ranks.rank}.pkl")

    def save(self, chunk: int, games: dict[str, Game]) -> None:
        if self.ranks.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".chunk_{chunk}.tmp"
            torch.save(games, tmp)
            os.replace(tmp, self.dir / f"chunk_{chunk}.pt")
        self.ranks.barrier()


class RoundJournal:
    """The finished rounds of a streamed evaluation, appended to one file as each finishes (a pickle per round,
    flushed and synced), so a kill loses only the rounds in flight. A record cut short by a kill mid-write is
    dropped, and the file cut back to the last whole record, when it is read."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file: Any = None

    def load(self) -> dict[tuple[str, int], Round]:
        """{(order, row): round} of every whole record."""
        out: dict[tuple[str, int], Round] = {}
        if not self.path.exists():
            return out
        whole = 0
        with open(self.path, "rb") as f:
            while True:
                try:
                    order, row, rnd = pickle.load(f)
                except Exception:  # the end, or a record a kill cut short: everything before it stands
                    break
                out[(order, row)] = rnd
                whole = f.tell()
        if whole < self.path.stat().st_size:
            os.truncate(self.path, whole)
        return out

    def append(self, order: str, row: int, rnd: Round) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")
        pickle.dump((order, row, rnd), self._file)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# what an engine runs with, not what it samples (rows draw from their own seeds, or from chunks' on hf): a relaunch
# that changes one (a lower gpu_memory_utilization after an out-of-memory, a longer start timeout) keeps the parts
RESOURCE_KEYS = {
    "generation": ("allow_slow", "stream"),
    "vllm": ("placement", "python", "gpu_memory_utilization", "cpu_kv_cache_gib", "max_num_seqs", "enforce_eager",
             "start_timeout_s"),
}


def store_key(digest: str, cfg: Any, phase: str, step: int, n: int, samples: int, world: int = 1) -> str:
    """Names one evaluation's parts: the adapters evaluated and everything that shapes what it samples (not the
    engine's resources, ``RESOURCE_KEYS``), the number of processes ``world`` among them (it sizes the chunks, and
    each rank seeds its own share of one)."""
    from omegaconf import OmegaConf

    shaping = {k: OmegaConf.to_container(cfg[k], resolve=True)
               for k in ("model", "task", "method", "exchange", "rotation", "eval", "generation")}
    for key in RESOURCE_KEYS["generation"]:
        shaping["generation"].pop(key, None)  # type: ignore[union-attr]
    for key in RESOURCE_KEYS["vllm"]:
        shaping["generation"].get("vllm", {}).pop(key, None)  # type: ignore[union-attr]
    blob = json.dumps([digest, shaping, cfg.seed, phase, step, n, samples, world], sort_keys=True, default=str)
    return f"{phase}-{step}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


class _Counted:
    """An engine whose calls are counted (the evaluation says how many it made): each ``sample``, each
    ``generate`` of an engine that makes one call of it, each ``stream`` of an engine that streams."""

    def __init__(self, engine: Engine):
        self.engine, self.calls = engine, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    @property
    def streaming(self) -> bool:
        return type(self.engine).stream is not Engine.stream and getattr(self.engine, "streaming", True)

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.engine.sample(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if type(self.engine).generate is Engine.generate:  # a sample call per adapter: counted there
            return Engine.generate(self, *args, **kwargs)  # type: ignore[arg-type]
        self.calls += 1
        return self.engine.generate(*args, **kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        if not self.streaming:  # waves of generate calls, counted there
            return Engine.stream(self, *args, **kwargs)  # type: ignore[arg-type]
        self.calls += 1
        return self.engine.stream(*args, **kwargs)


def evaluate(policies: Policies, task: Task, cfg: Any, problems: Sequence[Problem], step: int,
             phase: str, ranks: Ranks = Ranks(), engine: Engine | None = None, *, samples: int | None = None,
             progress: bool = False, store: PartStore | None = None,
             on_chunk: Callable[[int], None] | None = None, on_round: Callable[[int], None] | None = None,
             log: Callable[[str], None] | None = None) -> EvalResult:
    """Play every pipeline of ``cfg.method`` on ``problems`` x ``samples`` (default ``eval.samples``; sampled by
    ``engine``, default ``hf``), chunk by chunk (module docstring); metrics and eval.jsonl rows. ``store``: the
    committed chunks, read instead of played and written as each is played; ``on_chunk(i)`` after chunk ``i`` is
    committed, and streamed ``on_round(n)`` once ``n`` rounds are (with a store); ``log``: one line saying how many
    chunks were played and how many engine calls that took. ``progress``: a bar over the completions on rank 0."""
    from agon.engines.hf import HFEngine
    from tqdm.auto import tqdm

    e = cfg.eval
    samples = e.samples if samples is None else samples
    sampling = Sampling.from_config(e)
    evaluation = get_method(cfg.method.name).evaluation(cfg.rotation.mode)
    # each read answers the drafts of its drafter's first play: (read's order, drafter, reader, that play's order)
    sources = {d: order_name(d, a) for d, a in reversed(evaluation.plays)}
    reads = [(order_name(d, r), d, r, sources[d]) for d, r in evaluation.reads()] if e.equal_generations else []
    counted = _Counted(engine if engine is not None else HFEngine(policies))
    streamed = counted.streaming and cfg.exchange.mode != "latent"
    # a multiple of the processes, so that every rank has a share of every chunk; streamed, one chunk of everything
    size = len(problems) if streamed else -(-max(e.chunk_problems, ranks.world) // ranks.world) * ranks.world
    chunks = [list(range(i, min(i + size, len(problems)))) for i in range(0, len(problems), max(size, 1))]
    stages = sum(1 if answerer is False else 2 for _, answerer in evaluation.plays) + len(reads)
    # this rank's share: the completions its bar counts
    total = sum(len(ranks.split(chunk)) * samples * stages for chunk in chunks)

    def seeds(order: str, positions: Sequence[int]) -> list[int]:
        """Each problem's seed, by its place in ``problems``: the same rows whichever way they are played."""
        return [derive_seed(cfg.seed, phase, step, order, p) for p in positions]

    parts: list[dict[str, Game]] = []
    played = kept = 0
    # an interim bar is cleared when done, so the training bar under it keeps its line
    with forked_rng(), tqdm(total=total, desc=progress_label(phase, step), unit="completion",
                            disable=not (progress and ranks.is_main), leave=phase != "train",
                            dynamic_ncols=True) as bar:
        if streamed:
            games, played, kept = _play_streamed(policies, task, cfg, problems, samples, sampling, evaluation.plays,
                                                 reads, counted, ranks, seeds, store, bar, on_round)
            parts.append(games)
        for i, chunk in ([] if streamed else enumerate(chunks)):
            games = store.load(i) if store is not None else None
            if games is None:
                torch.manual_seed(chunk_seed(cfg.seed, phase, step, i, ranks.rank))
                random.seed(chunk_seed(cfg.seed, phase, step, i, ranks.rank, "python"))
                games, mine = {}, {}
                for drafter, answerer in evaluation.plays:
                    order = order_name(drafter, answerer)
                    bar.set_postfix_str(order)
                    games[order], mine[order] = play_split(
                        ranks, policies, task, cfg.model, [problems[p] for p in chunk], seeds(order, chunk),
                        drafter=drafter, challenger=answerer, exchange=cfg.exchange.mode, group_size=samples,
                        sampling=sampling, engine=counted, on_sampled=bar.update, span=cfg.exchange.span)
                for order, drafter, reader, source in reads:
                    bar.set_postfix_str(order)
                    row_seeds = [derive_seed(s, k) for s in seeds(order, chunk) for k in range(samples)]
                    games[order] = answer_split(ranks, policies, task, cfg.model, games[source], mine[source],
                                                reader, row_seeds, exchange=cfg.exchange.mode, sampling=sampling,
                                                engine=counted, on_sampled=bar.update, span=cfg.exchange.span)
                played += 1
                if store is not None:
                    store.save(i, games)
            else:
                kept += 1
                bar.update(len(ranks.split(chunk)) * samples * stages)
            parts.append(games)
            if on_chunk is not None:
                on_chunk(i)
    if log is not None:
        unit = "rounds" if streamed else "chunks"
        done = f"{played} of {played + kept} {unit} played in {counted.calls} engine calls"
        log(f"[eval] {progress_label(phase, step)}: {done}{f', {kept} kept from an interrupted run' if kept else ''}")
    games = {order: Game.concat([part[order] for part in parts]) for order in parts[0]} if parts else {}
    return summarise(games, evaluation.headline, step=step, phase=phase)


def _play_streamed(policies: Policies, task: Task, cfg: Any, problems: Sequence[Problem], samples: int,
                   sampling: Sampling, plays: Sequence[tuple[str | None, str | None | bool]],
                   reads: Sequence[tuple[str, str | None, str | None, str]], engine: Any, ranks: Ranks,
                   seeds: Callable[[str, Sequence[int]], list[int]], store: PartStore | None,
                   bar: Any, on_round: Callable[[int], None] | None = None) -> tuple[dict[str, Game], int, int]:
    """This rank's share of every play in one engine stream, then of every read (the plays' drafts answered again)
    in a second, each round committed to the store's journal as it finishes (``on_round(n)`` then, ``n`` the rounds
    committed so far) and the journal's rounds not played again; (every rank's games, rounds played, rounds
    kept)."""
    positions = ranks.split(list(range(len(problems))))
    rows = [(p, k) for p in positions for k in range(samples)]
    journal = store.journal() if store is not None else None
    committed = journal.load() if journal is not None else {}
    tables = [(order_name(d, a), d, a, None) for d, a in plays] + list(reads)
    todo = {o: [j for j, (p, k) in enumerate(rows) if (o, p * samples + k) not in committed] for o, *_ in tables}
    for o, _, answerer, source in tables:
        bar.update((len(rows) - len(todo[o])) * (1 if answerer is False or source is not None else 2))
    mine: dict[str, list[Round]] = {}
    done = [len(committed)]

    def play(which: list[tuple[str, str | None, Any, str | None]]) -> None:
        """The rounds of ``which`` still to play, in one stream, into ``mine``."""
        matches = []
        for o, drafter, answerer, source in which:
            problem_seeds = dict(zip(positions, seeds(o, positions)))
            drafts = None if source is None else [mine[source][j].draft for j in todo[o]]
            matches.append(Match(drafter, answerer, [problems[rows[j][0]] for j in todo[o]],
                                 [derive_seed(problem_seeds[rows[j][0]], rows[j][1]) for j in todo[o]], drafts))

        def commit(m: int, i: int, rnd: Round) -> None:
            p, k = rows[todo[which[m][0]][i]]
            journal.append(which[m][0], p * samples + k, rnd)  # type: ignore[union-attr]
            done[0] += 1
            if on_round is not None:
                on_round(done[0])

        new = play_rounds(policies, task, cfg.model, matches, exchange=cfg.exchange.mode, sampling=sampling,
                          engine=engine, on_sampled=bar.update, on_round=commit if journal is not None else None) \
            if any(todo[o] for o, *_ in which) else [[] for _ in which]
        for m, (o, *_) in enumerate(which):
            played = dict(zip(todo[o], new[m]))
            mine[o] = [played[j] if j in played else committed[(o, p * samples + k)]
                       for j, (p, k) in enumerate(rows)]

    try:
        # a read answers drafts that must exist first: its stream waits for the plays' (left out on purpose:
        # submitting each read the moment its draft finishes, inside the first stream)
        for which in ([t for t in tables if t[3] is None], [t for t in tables if t[3] is not None]):
            if which:
                play(which)
    finally:
        if journal is not None:
            journal.close()
    shares = ranks.gather(mine)
    games = {o: Game([r for share in shares for r in share[o]], d, None if a is False else a, samples)  # type: ignore
             for o, d, a, _ in tables}
    n_played = sum(len(t) for t in todo.values())
    return games, n_played, len(rows) * len(tables) - n_played


def summarise(games: Mapping[str, Game], headline: Sequence[str], *, step: int, phase: str) -> EvalResult:
    """The eval.jsonl rows and the metrics of played games (``order name -> Game``, as ``evaluate`` plays them).

    Pure: nothing is sampled or graded here, only the verdicts already in the games are counted.
    """
    # every draft is its drafter alone on the plain prompt; a drafter's solo rows are its drafts in the first game it
    # drafts (the self-cascade and cross cascades after it read those very drafts again)
    firsts = {_name(g.drafter): o for o, g in reversed(list(games.items()))}
    rows = [row for order, game in games.items()
            for row in _rows(order, game, step, phase, solo=firsts[_name(game.drafter)] == order)]
    # a game's final answer is the challenge, or the draft itself when nobody answered it (grpo)
    finals = {o: [r.challenge or r.draft for r in g.rounds] for o, g in games.items()}
    drafted = {o: games[o] for o in firsts.values()}  # each draft once
    solo = {name: games[o].attempts("drafter") for name, o in firsts.items()}
    answered = {o for o, g in games.items() if g.rounds and g.rounds[0].challenge is not None}
    # the headline at one generation per answer (its drafters alone) and at two (a one-generation order's
    # self-cascade), so that arms with different numbers of generations per answer can be compared at equal ones
    drafters = [_name(games[o].drafter) for o in headline]
    two = [o if o in answered else f"{o}>{o}" for o in headline]
    pairs = [(r.draft.verdict.correct, r.challenge.verdict.correct)
             for o in headline for r in games[o].rounds if r.challenge is not None]
    attempts = [r.draft for g in drafted.values() for r in g.rounds] + \
        [r.challenge for g in games.values() for r in g.rounds if r.challenge is not None]
    first = next(iter(games.values()))
    metrics = {
        "eval/accuracy": _mean([_accuracy(finals[o]) for o in headline]),  # type: ignore[arg-type]
        "eval/final_trace_tokens": _mean([float(a.completion.n_tokens) for o in headline for a in finals[o]]),
        "eval/n_problems": len(first.rounds) // first.group_size,
        "eval/samples": first.group_size,
        "eval/generations": 2 if any(o in answered for o in headline) else 1,
        "eval/accuracy_one_generation": _mean([_accuracy(solo[d]) for d in drafters]),  # type: ignore[misc]
        "eval/accuracy_two_generations": None if any(o not in finals for o in two)
        else _mean([_accuracy(finals[o]) for o in two]),  # type: ignore[misc]
        "eval/cascade_acc_AB": _accuracy(finals.get("A>B")),
        "eval/cascade_acc_BA": _accuracy(finals.get("B>A")),
        "eval/cascade_acc_AA": _accuracy(finals.get("A>A")),
        "eval/cascade_acc_BB": _accuracy(finals.get("B>B")),
        "eval/solo_acc_A": _accuracy(solo.get("A")),
        "eval/solo_acc_B": _accuracy(solo.get("B")),
        "eval/solo_acc_base": _accuracy(solo.get("base")),
        "eval/conversion_rate": _mean([float(final) for draft, final in pairs if not draft]),
        "eval/regression_rate": _mean([float(not final) for draft, final in pairs if draft]),
        # each completion once: the solo rows repeat the drafts and are not counted again
        "eval/verifier_failures": sum(a.verdict.failed for a in attempts),
        "eval/headline_orders": list(headline),
        **divergence(_answers_by_problem(drafted, "A"), _answers_by_problem(drafted, "B")),
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


def _rows(order: str, game: Game, step: int, phase: str, solo: bool = True) -> list[dict[str, Any]]:
    """eval.jsonl rows of one game: a cascade's draft and final stages, and (``solo``) its drafts again as the
    drafter alone."""
    rows = []
    for i, rnd in enumerate(game.rounds):
        if rnd.challenge is None:
            stages = [(order, "final", rnd.draft)]
        else:
            stages = [(order, "draft", rnd.draft), (order, "final", rnd.challenge)] + \
                [(_name(game.drafter), "final", rnd.draft)] * solo
        rows += [{"step": step, "phase": phase, "order": o, "stage": stage, "problem_id": rnd.problem.id,
                  "sample": i % game.group_size, "correct": a.verdict.correct, "format_ok": a.verdict.format_ok,
                  "tokens": a.completion.n_tokens, "status": a.verdict.status,
                  "answer": final_answer(a.completion.text)} for o, stage, a in stages]
    return rows
