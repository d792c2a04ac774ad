"""How long a run's generation will take, estimated before its first step from one short probe of its own engine.

The probe samples ``PROBE_TOKENS`` new tokens for as many training prompts as one engine call of a training stage
holds (at most ``PROBE_ROWS``), every row to its budget, under a forked RNG so the run draws what it would have
drawn without it. Seconds per decoding step at that width, times the budget, times the calls a stage makes and the
stages a step or an evaluation plays, give the estimate; ``run`` prints it, for every engine, so a run that will
take weeks says so in its first lines.

Left out on purpose: scoring and the backward pass (generation dominates at long budgets), early ends of turn
(every completion is counted to its budget: an upper bound for a trained model), and attention's growth with the
context (the probe's contexts are short: at budgets of thousands of tokens, engines whose cost per step grows with
the context, ``hf`` and ``hf_continuous`` on SDPA, take longer than this says; ``agon.bench.gpu`` measures them).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

PROBE_TOKENS = 16
PROBE_ROWS = 64


@dataclass(frozen=True)
class Estimate:
    engine: str
    # seconds of one decoding step of a probe call of ``rows`` rows
    step_seconds: float
    rows: int
    # generation of one training step and of one full evaluation, every completion to its budget
    train_step_s: float
    eval_s: float

    def line(self) -> str:
        return (f"[estimate] engine {self.engine}: {self.step_seconds * 1e3:.1f} ms per decoding step at {self.rows} "
                f"rows, so generation takes up to {_duration(self.train_step_s)} per training step and "
                f"{_duration(self.eval_s)} per full evaluation (every completion to its budget; attention's growth "
                f"with the context not included)")


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 172_800 else f"{seconds / 86_400:.1f} days"


def _calls(rows: int, width: int) -> int:
    return max(1, math.ceil(rows / width))


def estimate(cfg: Any, trainer: Any) -> Estimate:
    """Probe ``trainer``'s engine and scale to the run's steps and evaluation (module docstring)."""
    from agon.game.cascade import eval_size, forked_rng
    from agon.engines import Sampling, engine_name
    from agon.core.methods import get_method
    from agon.game.rollout import render

    t, world = cfg.trainer, trainer.ranks.world
    method = get_method(cfg.method.name)
    train_rows = t.prompts_per_step * t.num_generations // world
    train_stages = 0 if not (method.trains and cfg.method.train) else \
        (1 if method.turn(cfg.rotation.mode, 0).challenger is False else 2)
    n, samples = eval_size(cfg.eval, "final")
    plays = method.evaluation(cfg.rotation.mode).plays
    eval_stages = sum(1 if answerer is False else 2 for _, answerer in plays)
    chunk_rows = min(cfg.eval.chunk_problems, n) * samples // world
    width = max(1, min(train_rows or chunk_rows, PROBE_ROWS))
    problems = trainer.heldout[:width] or trainer.heldout
    messages = [trainer.task.user_message(problems[i % len(problems)]) for i in range(width)]
    prompts = [render(trainer.policies, trainer.task, cfg.model, m) for m in messages]
    probe = Sampling(PROBE_TOKENS, t.temperature, t.top_p, t.top_k, t.generation_batch_tokens, ignore_eos=True)
    adapter = trainer.policies.adapters[0] if trainer.policies.adapters else None
    with forked_rng():
        start = time.perf_counter()
        trainer.engine.sample(prompts, adapter, probe)
        seconds = (time.perf_counter() - start) / PROBE_TOKENS
    train_s = train_stages * _calls(train_rows, width) * t.max_new_tokens * seconds
    chunks = math.ceil(n / max(cfg.eval.chunk_problems, 1))
    eval_s = chunks * eval_stages * _calls(chunk_rows, width) * cfg.eval.max_new_tokens * seconds
    return Estimate(engine_name(cfg), seconds, width, train_s, eval_s)
