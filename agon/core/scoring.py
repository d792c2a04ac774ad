"""Log-probabilities of the sampled tokens without the vocabulary-wide tensors that a plain ``log_softmax`` builds.

At Qwen3's 151,936-token vocabulary, the straightforward scoring (``log_softmax(logits.float() / T)`` over the
whole ``[b, T, V]`` logits, then a gather) holds about 0.6 GB per 1,000 tokens for each of the float32 logits and
their log-softmax: about 10 GB for one 8k-token trace. Only one number per token is needed: the chosen token's
logit minus the log-sum-exp of its row. ``selective_logps`` computes that from the final hidden states, applying
the output head to ``chunk_tokens`` tokens at a time in float32; under autograd each chunk is recomputed in the
backward pass (activation checkpointing), so neither pass ever holds more than one chunk of logits.

When the sampler truncated its distribution (top-k, top-p), the log-probs are taken over the same kept support
(``kept_support``), so that they are the sampler's own probabilities and the importance ratio against an engine that
reports them (vLLM's processed log-probs) starts at 1 instead of at the kept mass.

``full_logps`` is the straightforward computation, kept as the reference the tests and ``make bench`` compare with.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

Head = Callable[[Tensor], Tensor]


def kept_support(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor | None:
    """[n, V] bool, the tokens a sampler keeps after top-k then top-p on ``logits`` (already divided by the
    temperature), as transformers' and vLLM's samplers decide it; None when neither truncates.

    top-k keeps every token at least as likely as the k-th (ties included). top-p then sorts what top-k kept by
    probability and drops the least likely tokens while their renormalised mass stays at most ``1 - top_p``, always
    keeping the most likely one. With ``top_k`` set the sort covers only the logits top-k kept ([n, k], wider
    where the k-th ties); top-p alone sorts the whole vocabulary ([n, V] values and indices). Where tokens tie at
    the top-p threshold, all of them are kept (the samplers keep those their sort put last: an order of their own).
    """
    truncate_k = 0 < top_k < logits.size(-1)
    if not truncate_k and top_p >= 1.0:
        return None
    if truncate_k:
        top = torch.topk(logits, top_k, dim=-1).values  # [n, k] descending
        keep = logits >= top[:, -1:]
        if top_p >= 1.0:
            return keep
        # top-p's mass is over every token top-k kept, ties with the k-th included (transformers' and vLLM's too)
        widest = torch.topk(logits, int(keep.sum(-1).max()), dim=-1).values  # [n, k'] descending, k' >= k
        ascending = widest.masked_fill(widest < top[:, -1:], float("-inf")).flip(-1)
        drop = ascending.softmax(-1).cumsum(-1) <= 1 - top_p  # [n, k']
        drop[:, -1] = False
        # the smallest logit still kept is the top-p threshold
        threshold = ascending.masked_fill(drop, float("inf")).min(-1, keepdim=True).values
        return keep & (logits >= threshold)
    ascending, order = torch.sort(logits, dim=-1)
    drop = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
    drop[:, -1] = False
    return torch.ones_like(logits, dtype=torch.bool).scatter(-1, order, ~drop)


def _chunk_logps(hidden: Tensor, ids: Tensor, head: Head, temperature: float, top_k: int = 0,
                 top_p: float = 1.0) -> Tensor:
    """hidden [n, H], ids [n] -> [n] float32 log-probabilities of ``ids``."""
    logits = head(hidden)
    # [n, V] in float32 at least (float64 stays: the exactness tests); in place: the head's backward keeps no output
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)).div_(temperature)
    with torch.no_grad():
        keep = kept_support(logits, top_k, top_p)
    if keep is not None:
        # the sampled token always counts as kept: where the trainer's logits put it just outside the sampler's
        # support (numerics at the boundary), its log-prob stays finite instead of -inf
        keep.scatter_(-1, ids.unsqueeze(-1), True)
        logits = logits.masked_fill(~keep, float("-inf"))
    return logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def selective_logps(hidden: Tensor, ids: Tensor, head: Head, temperature: float = 1.0,
                    chunk_tokens: int = 512, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """log softmax(truncate(head(hidden) / temperature)) at ``ids``, ``chunk_tokens`` rows of logits at a time.

    Args:
        hidden: [N, H] final hidden states (after the last norm), one row per scored token.
        ids: [N] the token each row predicts.
        head: the output projection, hidden [n, H] -> logits [n, V] (the model's ``lm_head``, softcap included).
        top_k, top_p: the sampler's truncation (``kept_support``); the log-probs are then those of the distribution
            the tokens were sampled from, renormalised over the kept tokens. 0 and 1.0: the full softmax.
    Returns:
        [N] float32. Equal to ``full_logps(head(hidden), ids, temperature, top_k, top_p)``; with grad, each chunk's
        logits are recomputed in the backward pass instead of being kept.
    """
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(
        p.requires_grad for p in getattr(head, "parameters", lambda: [])()))
    out = []
    for start in range(0, hidden.size(0), chunk_tokens):
        h, i = hidden[start : start + chunk_tokens], ids[start : start + chunk_tokens]
        if grad:
            out.append(checkpoint(_chunk_logps, h, i, head, temperature, top_k, top_p, use_reentrant=False))
        else:
            out.append(_chunk_logps(h, i, head, temperature, top_k, top_p))
    # no tokens: an empty result still tied to ``hidden``, so a backward pass through it works (and adds zeros)
    return torch.cat(out) if out else hidden.sum(-1).float()


def full_logps(logits: Tensor, ids: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """The straightforward computation: logits [..., V], ids [...] -> [...] via a full float32 log-softmax (over the
    kept support, the sampled token included, when ``top_k`` or ``top_p`` truncate)."""
    scaled = logits.float() / temperature
    keep = kept_support(scaled.reshape(-1, scaled.size(-1)), top_k, top_p)
    if keep is not None:
        keep = keep.reshape(scaled.shape).scatter(-1, ids.unsqueeze(-1), True)
        scaled = scaled.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(scaled, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
