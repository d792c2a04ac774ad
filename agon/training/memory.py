"""The trainer's GPU memory at the peak of its update, from the model's published shape and the scoring settings,
and whether a card holds it beside vLLM's share: a run that would run out of memory in its first update (an hour or
more into a paper cell, after the start evaluation) is refused at its start, before any weights load, with the
numbers and the settings that fit (``agon.training.preflight.check_memory``, ``python -m agon.estimate``).

The update's peak is one micro-batch's forward and backward under gradient checkpointing:

- weights: the base's parameters in the model's dtype;
- adapters: every adapter's LoRA parameters, 8 bytes each in bf16 (weight, gradient, AdamW's two moments);
- checkpointed inputs: every layer's input for the micro-batch, ``tokens x hidden x layers`` in the model's dtype,
  ``tokens`` the larger of ``scoring_batch_tokens`` and a solo row (prompt and ``max_new_tokens``);
- head chunk: the log-probs of ``logit_chunk_tokens`` tokens at a time, ``HEAD_CHUNK_FACTOR`` times their float32
  logits (measured: the softmax, top-k/top-p masks and their gradients);
- recompute: the layer being recomputed in the backward, ``RECOMPUTE_FACTOR x tokens x intermediate`` in the model's
  dtype.

The two factors are the H200 GPU check of Qwen3-0.6B's (docs/gpu.md): with them its two scoring cases, 14.3 and 10.8
GiB over the model, come out within 0.3 GiB. What the caching allocator reserves beyond what is allocated
(``ALLOCATOR_HEADROOM``) and the trainer's CUDA context are allowances, not measurements.

Left out on purpose: the hf engines' generation (it runs while no update does, and ``generation_batch_tokens``
bounds its cache) and a reference model's pass (``beta != 0`` scores without a graph: less than the update's peak).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

# the peak of one checkpointed head chunk over its float32 logits (H200, Qwen3-0.6B, top-k 20, top-p 0.95: 9.85 GiB
# over 2.32 at 4,096 tokens, 1.23 over 0.29 at 512)
HEAD_CHUNK_FACTOR = 4.25
# a recomputed layer's transients per token, in units of the MLP's width (H200, Qwen3-0.6B: what 65,528 tokens
# cost over their checkpointed inputs and the head chunk, 0.95 GiB, over 65,528 x 3,072 x 2 bytes)
RECOMPUTE_FACTOR = 2.5
# what the caching allocator reserves over the allocated peak as micro-batch shapes vary (an allowance;
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lowers it)
ALLOCATOR_HEADROOM = 1.15
# the trainer's CUDA context and cuBLAS/cuDNN workspaces, GiB (an allowance)
CUDA_CONTEXT_GIB = 0.75
# bytes per LoRA parameter in training: the weight, its gradient and AdamW's two moments, in bf16
ADAPTER_BYTES = 8
# a prompt's share of a solo row: the longest challenge prompt (problem and recap), tokens
PROMPT_TOKENS = 1024
GIB = 2 ** 30


@dataclass(frozen=True)
class UpdateMemory:
    """GiB of each part of the update's peak, and the settings they were computed at."""

    weights: float
    adapters: float
    inputs: float
    head_chunk: float
    recompute: float
    tokens: int
    chunk_tokens: int

    @property
    def allocated(self) -> float:
        return self.weights + self.adapters + self.inputs + self.head_chunk + self.recompute

    @property
    def needed(self) -> float:
        """What the card must leave the trainer: the allocated peak with the allocator's headroom and the context."""
        return self.allocated * ALLOCATOR_HEADROOM + CUDA_CONTEXT_GIB

    def parts(self) -> str:
        return (f"weights {self.weights:.1f}, adapters and optimizer {self.adapters:.1f}, checkpointed inputs of a "
                f"{self.tokens:,}-token micro-batch {self.inputs:.1f}, a {self.chunk_tokens:,}-token head chunk "
                f"{self.head_chunk:.1f}, recompute {self.recompute:.1f}")


@lru_cache(maxsize=16)
def _counts(family: str, size: str, rank: int, adapters: int) -> tuple[int, int]:
    """(base parameters, LoRA parameters of ``adapters`` all-linear adapters at ``rank``) of the language model of
    the family's published shape, counted on the meta device."""
    from agon.families import get_family

    config = get_family(family).shape_config(size)
    base, lora, _ = adapter_share(config, rank)
    return base, lora * adapters


def adapter_share(config: Any, rank: int) -> tuple[int, int, int]:
    """(base parameters, parameters of one all-linear LoRA adapter at ``rank``, linear layers left without a LoRA
    besides the output head) of the language model of ``config`` (a multimodal checkpoint's text part: what agon
    loads and trains), counted on the meta device."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config.get_text_config())
    base = sum(p.numel() for p in model.parameters())
    linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules()) - 1  # the head is never adapted
    peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))
    adapted = sum(hasattr(m, "lora_A") for m in peft.modules())
    return base, sum(p.numel() for n, p in peft.named_parameters() if "lora_" in n), linear - adapted


def update_memory(cfg: Any, scoring_batch_tokens: int | None = None,
                  logit_chunk_tokens: int | None = None) -> UpdateMemory | None:
    """The update's peak for ``cfg`` (at other scoring settings when given); None for a model without a published
    shape (``model.shape``: a hub name agon has no shape for, the offline world)."""
    from agon.core.methods import get_method
    from agon.families import get_family

    m, t = cfg.model, cfg.trainer
    if not m.get("shape") or m.family is None:
        return None
    shape = get_family(m.family).shape.sizes[m.shape]
    width = torch.finfo(getattr(torch, str(m.dtype))).bits // 8
    adapters = max(len(get_method(cfg.method.name).adapters), 1)
    base, lora = _counts(m.family, m.shape, int(m.lora.rank), adapters)
    tokens = max(scoring_batch_tokens or t.scoring_batch_tokens, t.max_new_tokens + PROMPT_TOKENS)
    chunk = min(logit_chunk_tokens or t.logit_chunk_tokens, tokens)
    return UpdateMemory(
        weights=base * width / GIB, adapters=lora * ADAPTER_BYTES / GIB,
        inputs=tokens * shape["hidden_size"] * width * shape["num_hidden_layers"] / GIB,
        head_chunk=HEAD_CHUNK_FACTOR * chunk * shape["vocab_size"] * 4 / GIB,
        recompute=RECOMPUTE_FACTOR * tokens * shape["intermediate_size"] * width / GIB,
        tokens=tokens, chunk_tokens=chunk)


def trainer_share(cfg: Any, total_gib: float, engine: str) -> float:
    """GiB of a card of ``total_gib`` left to the trainer: all of it, less vLLM's share when vLLM runs on it."""
    return total_gib * (1 - cfg.generation.vllm.gpu_memory_utilization if engine == "vllm" else 1.0)


def fitting_settings(cfg: Any, left_gib: float) -> tuple[dict[str, int], UpdateMemory] | None:
    """The cheapest scoring settings whose update fits ``left_gib``: the head chunk halved first (down to 512
    tokens: it saves about 5% of a micro-batch's time at 4,096, docs/gpu.md), then the micro-batch (down to a solo
    row); None when none does."""
    t = cfg.trainer
    chunks = [c for c in (t.logit_chunk_tokens, t.logit_chunk_tokens // 2, t.logit_chunk_tokens // 4,
                          t.logit_chunk_tokens // 8) if c >= 512] or [t.logit_chunk_tokens]
    batches = [t.scoring_batch_tokens // 2 ** i for i in range(0, 8)]
    for batch in batches:
        for chunk in chunks:
            est = update_memory(cfg, batch, chunk)
            if est is not None and est.needed <= left_gib:
                changed = {k: v for k, v, was in (("trainer.scoring_batch_tokens", batch, t.scoring_batch_tokens),
                                                  ("trainer.logit_chunk_tokens", chunk, t.logit_chunk_tokens))
                           if v != was}
                return changed, est
            if est is not None and batch <= est.tokens and batch < t.max_new_tokens + PROMPT_TOKENS:
                break  # a solo row bounds the micro-batch: halving it further changes nothing
    return None


def utilization_that_fits(cfg: Any, total_gib: float, needed_gib: float) -> float | None:
    """The largest ``gpu_memory_utilization`` (two decimals) that leaves ``needed_gib`` on the card; None below 0.3,
    where vLLM's cache holds too few long traces to be worth it."""
    util = math.floor((1 - needed_gib / total_gib) * 100) / 100
    return util if util >= 0.3 else None
