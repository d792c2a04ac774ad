"""Log-probabilities of the sampled tokens without the vocabulary-wide tensors that a plain ``log_softmax`` builds.

At Qwen3's 151,936-token vocabulary, the straightforward scoring (``log_softmax(logits.float() / T)`` over the
whole ``[b, T, V]`` logits, then a gather) holds about 0.6 GB per 1,000 tokens for each of the float32 logits and
their log-softmax: about 10 GB for one 8k-token trace. Only one number per token is needed: the chosen token's
logit minus the log-sum-exp of its row. ``selective_logps`` computes that from the final hidden states, applying
the output head to ``chunk_tokens`` tokens at a time in float32; under autograd each chunk is recomputed in the
backward pass (activation checkpointing), so neither pass ever holds more than one chunk of logits.

``full_logps`` is the straightforward computation, kept as the reference the tests and ``make bench`` compare with.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

Head = Callable[[Tensor], Tensor]


def _chunk_logps(hidden: Tensor, ids: Tensor, head: Head, temperature: float) -> Tensor:
    """hidden [n, H], ids [n] -> [n] float32 log-probabilities of ``ids``."""
    logits = head(hidden).float().div_(temperature)  # [n, V]; in place: the head's backward keeps no output
    return logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def selective_logps(hidden: Tensor, ids: Tensor, head: Head, temperature: float = 1.0,
                    chunk_tokens: int = 512) -> Tensor:
    """log softmax(head(hidden) / temperature) at ``ids``, ``chunk_tokens`` rows of logits at a time.

    Args:
        hidden: [N, H] final hidden states (after the last norm), one row per scored token.
        ids: [N] the token each row predicts.
        head: the output projection, hidden [n, H] -> logits [n, V] (the model's ``lm_head``, softcap included).
    Returns:
        [N] float32. Equal to ``full_logps(head(hidden), ids, temperature)``; with grad, each chunk's logits are
        recomputed in the backward pass instead of being kept.
    """
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(
        p.requires_grad for p in getattr(head, "parameters", lambda: [])()))
    out = []
    for start in range(0, hidden.size(0), chunk_tokens):
        h, i = hidden[start : start + chunk_tokens], ids[start : start + chunk_tokens]
        if grad:
            out.append(checkpoint(_chunk_logps, h, i, head, temperature, use_reentrant=False))
        else:
            out.append(_chunk_logps(h, i, head, temperature))
    # no tokens: an empty result still tied to ``hidden``, so a backward pass through it works (and adds zeros)
    return torch.cat(out) if out else hidden.sum(-1).float()


def full_logps(logits: Tensor, ids: Tensor, temperature: float = 1.0) -> Tensor:
    """The straightforward computation: logits [..., V], ids [...] -> [...] via a full float32 log-softmax."""
    return torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
