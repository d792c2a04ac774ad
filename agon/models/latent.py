"""Latent exchange (``exchange=latent``): the challenger reads the drafter's key/value states instead of a text recap.

Both policies are adapters on one frozen base, so the keys and values the drafter's adapter computes live in the
space the challenger's attention reads. Under ``latent`` the challenger's prompt is the plain challenge prompt (as
under ``hidden``), preceded by a **prefix**: the key/value states of a span of the drafter's tokens, computed by a
forward pass of those tokens under the drafter's adapter, from position 0. The challenger's own tokens continue at
position P after a P-token prefix, so the prefix and the prompt read as one sequence whose first part was written
by the other adapter. With the two adapters equal, the challenger's logits are those of the span and the prompt
written out as one sequence (tests/test_latent.py checks it to 1e-5 in float32).

The span (``exchange.span``, the ``SPANS`` registry) says which tokens:

- ``recap``: the recap's text tokens alone (``task.recap(draft)``: the visible text after the last ``</think>``
  with the final answer removed, exactly what ``visible`` shows as text), tokenized without special tokens.
- ``trace``: the drafter's own prompt and its completion up to and including the last ``</think>``: its reasoning,
  read as the drafter read and wrote it. The final answer is by definition after the last ``</think>`` (the last
  box of the visible text for math tasks, the last fenced code block of it for code), so it is never in the span;
  whatever the drafter wrote inside its reasoning (a value it later boxes included) is.

A draft whose reasoning block never closed has no visible text and no recap, so both spans are empty; an empty
span is an empty prefix, and the challenger then reads exactly the plain prompt.

The prefix is a constant of the challenger's update: computed without a graph (and in eval mode, no LoRA dropout),
so no gradient reaches the drafter's adapter through it, and the same at sampling and at every scoring pass of the
step (``Policies.token_logps`` recomputes it from the ids; with ``num_iterations > 1`` from the drafter's weights as
they were when it was sampled). ``fixed_prefix_layer`` holds it as a cache layer that later tokens read but never
extend, so a pass can be repeated and replayed by gradient checkpointing.

Left out on purpose: engines that manage their own KV cache (vLLM's paged cache and transformers' continuous
batching take no external key/value states: both fail at the config check under ``latent``), and families whose
layers are not all full attention (sliding windows, linear attention and KV sharing keep states a prefix of keys and
values does not describe; ``Family.latent_exchange``).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from agon.core.registry import Registry

Tensor = torch.Tensor


@dataclass(frozen=True)
class Prefixes:
    """The latent prefixes of a batch of prompts: each row's token ids, run under ``adapter`` (the drafter's; None:
    the base) from position 0. ``weights``: that adapter's LoRA weights to run them with, when they are no longer
    its current ones (``Policies.lora_state``); None: its current weights."""

    adapter: str | None
    ids: tuple[tuple[int, ...], ...]
    weights: dict[str, Tensor] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, rows: Sequence[int]) -> "Prefixes":
        return Prefixes(self.adapter, tuple(self.ids[i] for i in rows), self.weights)

    @property
    def empty(self) -> bool:
        return not any(self.ids)


# (policies, task, the drafter's prompt, its completion) -> the span's token ids
Span = Callable[[Any, Any, str, Any], tuple[int, ...]]
SPANS: Registry[Span] = Registry("exchange.span")


@SPANS.register("recap")
def recap_span(policies: Any, task: Any, prompt: str, completion: Any) -> tuple[int, ...]:
    """The recap's text tokens (``task.recap``: visible text, final answer removed); empty without a recap."""
    recap = task.recap(completion.text)
    return tuple(policies.prompt_ids([recap])[0]) if recap else ()


@SPANS.register("trace")
def trace_span(policies: Any, task: Any, prompt: str, completion: Any) -> tuple[int, ...]:
    """The drafter's prompt and its completion through the last end of its reasoning block; empty when the block
    never closed (no visible text, so no recap either)."""
    from agon.tasks.text import visible_text

    if visible_text(completion.text) is None:
        return ()
    ids = tuple(policies.prompt_ids([prompt])[0]) + tuple(completion.token_ids)
    end = reasoning_end(ids, policies.think_close_ids, len(ids) - len(completion.token_ids))
    return ids[:end] if end else ()


def reasoning_end(ids: Sequence[int], close: Sequence[int], start: int = 0) -> int:
    """One past the last occurrence of the token sequence ``close`` (the family's ``</think>``) in ``ids``, looked
    for from ``start`` on and then, when the completion has none (a template that closed an empty block in the
    prompt: Qwen3 with thinking off), anywhere; 0 when there is none."""
    n = len(close)
    for lo in (start, 0):
        for end in range(len(ids), lo + n - 1, -1):
            if n and tuple(ids[end - n : end]) == tuple(close):
                return end
    return 0


def left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[Tensor, Tensor]:
    """Rows of token ids left-padded to the longest: ids [b, S] long and mask [b, S] long (S = 0 when all empty)."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids, mask


def positions(mask: Tensor) -> Tensor:
    """[b, L] long position ids of a sequence whose parts may each be padded (prefix, prompt, completion): each
    row's real tokens numbered 0, 1, ... in order (a padding column repeats the position before it, or 0; attention
    never reads it). The challenger's first real token after a P-token prefix is at position P, as in the sequence
    written out whole."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def fixed_cache(cache: Any) -> Any:
    """A transformers ``Cache`` holding the key/value states of ``cache`` (one full-attention layer each) as
    fixed-prefix layers (``fixed_prefix_layer``): every pass that reads it sees the same prefix, and nothing it
    computes is stored."""
    from transformers.cache_utils import Cache

    layer = fixed_prefix_layer()
    return Cache(layers=[layer.holding(c.keys, c.values) for c in cache.layers])


@functools.cache
def fixed_prefix_layer() -> type:
    """The cache layer class of a prefix that later tokens read but never extend (built on first use, so importing
    this module does not import transformers)."""
    from transformers.cache_utils import DynamicLayer

    class FixedPrefixLayer(DynamicLayer):
        """``update`` returns the prefix followed by the new states and keeps nothing, so a pass can be repeated or
        replayed by gradient checkpointing and reads the same prefix every time."""

        @classmethod
        def holding(cls, keys: Tensor, values: Tensor) -> "FixedPrefixLayer":
            """keys and values [b, kv_heads, S, head_dim], detached."""
            layer = cls()
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys.detach(), values.detach()
            return layer

        def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any):
            return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)

    return FixedPrefixLayer


@contextlib.contextmanager
def checkpointing_reads_cache(model: torch.nn.Module) -> Iterator[None]:
    """Let gradient-checkpointed layers keep a read-only cache (transformers drops a cache under checkpointing,
    since a writing cache would be extended again by the backward's replay; a fixed prefix is not)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if any(m.gradient_checkpointing for m in layers) and not hasattr(GradientCheckpointingLayer,
                                                                     "_can_checkpoint_with_cache"):
        raise RuntimeError("exchange=latent with model.gradient_checkpointing needs transformers' "
                           "_can_checkpoint_with_cache (transformers >= 5.24); this version would drop the prefix")
    try:
        for m in layers:
            m._can_checkpoint_with_cache = True
        yield
    finally:
        for m in layers:
            m.__dict__.pop("_can_checkpoint_with_cache", None)
