"""Sampling engines: what turns a batch of prompts into completions for the rollout and the evaluation cascade.

Every engine implements one interface (``agon.engines.base``: ``Engine.sample(prompts, adapter, sampling)``) and
registers under the name ``generation.engine`` gives it, one engine to a module:

- ``hf`` (``agon.engines.hf``): transformers' ``generate`` on the trainer's own PEFT model (``Policies.sample``).
  The default, and what the offline world uses: nothing to publish, the adapters sampled are the ones being trained.
- ``hf_continuous`` (``agon.engines.hf_continuous``): transformers' continuous batching (``generate_batch``) on the
  same model: rows that finish give their cache to waiting ones, so long, uneven completions do not hold a batch to
  its longest row. What the paper presets fall back to (``generation.fallback``) where vLLM is not installed.
- ``vllm`` (``agon.engines.vllm_engine``): vLLM's multi-LoRA serving, in this process or as a worker process of its
  own (``agon/engines/vllm_worker.py``, a script that imports nothing of agon).

This module picks the engine a run samples with (``engine_name``, falling back where vLLM is missing or does not
serve the model's family) and builds it (``build_engine``).

Latent exchange (``exchange=latent``): ``sample(..., prefixes=)`` reads each prompt after a prefix of the drafter's
key/value states. Only ``hf`` does (``Engine.latent_prefix``); the other two keep their own paged caches and refuse a
prefix (the config check refuses the pairing before any model loads).

Streaming (``Engine.stream``): vLLM submits each challenge the moment its draft finishes, into the call that is
running, and seeds every request (``Request.seed``), so streamed, two-stage and resumed plays draw the same rows.
The ``hf`` engines play waves: every draft, then every challenge, from their one RNG stream.

Left out on purpose: a shared vLLM server for several trainer processes (TRL's ``vllm_mode=server``; here every
rank has its own engine, as TRL's colocate mode), sleep mode between generation and training, and streaming on
``hf_continuous``: transformers' manager takes requests while it runs, but its model has one active adapter, so a
challenge under the other adapter cannot join a running batch.
"""

from __future__ import annotations

from typing import Any, Callable

from agon.core.distributed import Ranks
from agon.engines.base import ENGINES, Engine, EngineError, OnSampled, Request, Sampling, Then, register_engine
from agon.engines.hf import HFEngine
from agon.engines.hf_continuous import HFContinuousEngine
from agon.engines.vllm_engine import VLLMEngine, vllm_placement, worker_python
from agon.models.policies import Policies

__all__ = ["ENGINES", "Engine", "EngineError", "HFContinuousEngine", "HFEngine", "OnSampled", "Request", "Sampling",
           "Then", "VLLMEngine", "build_engine", "engine_name", "register_engine"]


def engine_name(cfg: Any) -> str:
    """The engine a run samples with: ``generation.engine``, or ``generation.fallback`` when the engine is vLLM and
    vLLM is installed neither here nor at the worker's python (the paper presets: vLLM where a GPU cluster has it,
    transformers' continuous batching where it does not), or when the engine does not serve ``model.family``."""
    from agon.families import FAMILIES

    g = cfg.generation
    family = FAMILIES.get(cfg.model.family)
    if g.fallback and family is not None and g.engine not in family.engines:
        return g.fallback
    if g.engine == "vllm" and g.fallback:
        try:
            vllm_placement(cfg)
        except EngineError:
            return g.fallback
    return g.engine


def build_engine(cfg: Any, policies: Policies, ranks: Ranks = Ranks(), log: Callable = print) -> Engine:
    """The engine ``engine_name`` picks, over ``policies``."""
    name = engine_name(cfg)
    if name != cfg.generation.engine:
        log(f"[engine] generation.engine={cfg.generation.engine} does not serve model.family={cfg.model.family} "
            f"or is not installed here nor at the worker's python ({worker_python(cfg.generation.vllm)}); "
            f"sampling with generation.fallback={name} instead")
    return ENGINES.get_or_raise(name)(policies, cfg, ranks, log)

