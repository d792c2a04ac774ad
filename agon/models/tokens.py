"""What a sampled completion is and how a batch of them is cut to fit a token budget.

``Completion`` is one sampled answer as every engine returns it; ``Tokens`` is a batch of prompts and completions as
tensors, what scoring reads. Work is bounded by tokens, not rows: ``token_batches`` cuts a batch into contiguous
slices whose rows times padded width stay within a budget (a generation call holds prompt plus ``max_new_tokens``
per row in its KV cache; a scoring call holds prompt plus completion). At 8k-token traces that is a handful of rows
per call; on the offline world the whole batch fits in one. Scoring, whose rows differ in length, cuts by
``length_batches`` instead: rows longest first, so a micro-batch holds rows of similar length, and a row of
``solo_tokens`` or more alone, unpadded, which ``Policies.token_logps`` runs without an attention mask.
``render_chat`` writes one user message as the chat prompt. Left out on purpose: any model; this module holds data
and arithmetic on lengths only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass(frozen=True)
class Completion:
    # the assistant's turn as the verifier reads it: the part the chat template already wrote into the prompt
    # (Qwen3 with thinking off: an empty "<think>\n\n</think>\n\n") followed by the decoded completion
    text: str
    # completion token ids, up to and including the end-of-turn token when one was produced
    token_ids: tuple[int, ...]
    # True when generation hit its token limit before the end-of-turn token
    truncated: bool
    # True when the model's context, not max_new_tokens, set the limit (empty when the prompt alone filled it)
    context_limited: bool = False
    # the sampler's log-probability of each token after temperature, when the engine gives them (vLLM); the trainer
    # compares them with its own and corrects for the difference (trainer.vllm_importance_sampling_*)
    logps: tuple[float, ...] | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Tokens:
    """Prompts and completions as tensors, on the CPU (``token_logps`` moves each micro-batch to the model); under
    ``exchange=latent`` also each row's prefix (``agon.models.latent``: ids run under the drafter's adapter before the
    prompt), else None."""

    prompt_ids: torch.Tensor  # [B, P] long, left-padded
    prompt_mask: torch.Tensor  # [B, P] long
    completion_ids: torch.Tensor  # [B, T] long, right-padded
    completion_mask: torch.Tensor  # [B, T] long, 1 on completion tokens
    prefix_ids: torch.Tensor | None = None  # [B, S] long, left-padded (S = 0 when every prefix is empty)
    prefix_mask: torch.Tensor | None = None  # [B, S] long

    def __getitem__(self, rows: slice | torch.Tensor) -> "Tokens":
        def cut(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[rows]

        return Tokens(self.prompt_ids[rows], self.prompt_mask[rows], self.completion_ids[rows],
                      self.completion_mask[rows], cut(self.prefix_ids), cut(self.prefix_mask))

    def __len__(self) -> int:
        return self.prompt_ids.size(0)

    def widths(self) -> list[tuple[int, ...]]:
        """(prompt tokens, completion tokens) of every row, what ``token_batches`` cuts by; (prefix, prompt,
        completion) when the rows have prefixes, each part padded apart (the prefix's tokens count in every
        budget: their keys and values are held and attended to like the prompt's)."""
        parts = [self.prompt_mask, self.completion_mask]
        if self.prefix_mask is not None:
            parts.insert(0, self.prefix_mask)
        return list(zip(*(m.sum(1).tolist() for m in parts)))


def render_chat(tokenizer: Any, user: str, system: str | None = None, enable_thinking: bool = True) -> str:
    """The chat prompt for one user message (and an optional system message), ready for the assistant's turn."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=enable_thinking)


def token_batches(widths: Sequence[tuple[int, ...]], budget: int, max_rows: int | None = None) -> list[slice]:
    """Contiguous slices of rows, each within ``budget`` tokens: rows x (sum over parts of each part's widest).

    ``widths[i]`` is row i's length in each part padded apart: (prompt, completion), or (prefix, prompt,
    completion) under ``exchange=latent``; padding makes every row of a slice as wide as the sum of the widest of
    each part. A row wider than the budget still gets a slice of its own.
    """
    out: list[slice] = []
    start, widest = 0, None
    for i, row in enumerate(widths):
        grown = tuple(row) if widest is None else tuple(max(w, r) for w, r in zip(widest, row))
        rows = i - start + 1
        if rows > 1 and (rows * sum(grown) > budget or (max_rows is not None and rows > max_rows)):
            out.append(slice(start, i))
            start, grown = i, tuple(row)
        widest = grown
    if widths:
        out.append(slice(start, len(widths)))
    return out


def length_batches(widths: Sequence[tuple[int, ...]], budget: int, max_rows: int | None = None,
                   solo_tokens: int | None = None) -> list[list[int]]:
    """Row indices of micro-batches of rows of similar length, each within ``budget`` as ``token_batches`` counts it.

    ``widths[i]`` is row i's length in each part (prompt, completion; or prefix, prompt, completion). Rows are
    taken longest first (the sum of the parts; equal lengths in their original order), so a micro-batch pads its
    rows only up to its neighbours' lengths, not to the longest row of the batch. A row of at least ``solo_tokens``
    (None: no such rule) is a micro-batch of its own: nothing to pad, so it runs without an attention mask. Every
    row is in exactly one micro-batch; the longest come first, so a batch too large for the device fails at its
    first micro-batch.
    """
    order = sorted(range(len(widths)), key=lambda i: -sum(widths[i]))
    solo = [i for i in order if solo_tokens is not None and sum(widths[i]) >= solo_tokens]
    rest = order[len(solo):]  # the solo rows are the longest, so a prefix of the order
    return [[i] for i in solo] + [rest[part] for part in token_batches([widths[i] for i in rest], budget, max_rows)]
