"""Truncated sampling and scoring where logits tie at the top-k boundary (``agon.core.scoring.kept_support``).

Random float32 logits never tie, so a test drawing them cannot tell "every token at least as likely as the k-th"
from "exactly k tokens". Real logits come out of a bfloat16 head: 8 bits of mantissa, so a row of thousands of
logits holds many equal values, and the k-th largest is often one of several. transformers' ``TopKLogitsWarper``
keeps all of them (``scores < kth`` is removed), and so does vLLM's sampler; scoring must keep the same support, or
the trainer's log-probs are those of a distribution the sampler never drew from.
"""

from __future__ import annotations

import pytest
import torch

from agon.core.scoring import full_logps, kept_support, selective_logps


def _bf16_logits(rows: int = 64, vocab: int = 2000, seed: int = 0) -> torch.Tensor:
    """Logits as a bfloat16 head gives them: drawn at a trained model's scale, rounded to bfloat16, in float32."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=g) * 4).to(torch.bfloat16).float()


def _samplers_support(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    warped = logits.clone()
    if top_k:
        warped = TopKLogitsWarper(top_k)(None, warped)
    if top_p < 1:
        warped = TopPLogitsWarper(top_p)(None, warped)
    return ~warped.isinf()


@pytest.mark.parametrize("top_k", [5, 20, 64])
def test_the_kept_support_keeps_every_token_tied_with_the_kth_as_the_sampler_does(top_k):
    """Catches a top-k that keeps exactly k tokens (``topk(...).indices``) where the sampler keeps the ties too:
    held against transformers' own warper on bfloat16 logits, where ties at the boundary are common."""
    logits = _bf16_logits()
    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
    tied = ((logits >= kth).sum(-1) > top_k)
    assert int(tied.sum()) >= 5, "premise: rows whose k-th logit is tied with a token beyond it"
    want = _samplers_support(logits, top_k, 1.0)
    got = kept_support(logits, top_k, 1.0)
    assert torch.equal(got, want)
    assert bool((got.sum(-1)[tied] > top_k).all())


@pytest.mark.parametrize("top_k,top_p", [(5, 0.9), (20, 0.95), (64, 0.5)])
def test_top_k_then_top_p_keeps_the_samplers_support_on_tied_logits(top_k, top_p):
    """Catches top-p renormalised over exactly k tokens after a top-k that kept more (the ties with the k-th): the
    samplers' top-p sorts every token top-k kept, so its mass, and where it cuts, include the tied ones. Rows whose
    top-p threshold itself is tied are left out: which of those tokens a sampler keeps is the order its sort leaves
    them in (agon keeps them all, and always scores the sampled token)."""
    logits = _bf16_logits(rows=256, seed=1) / 2  # flatter rows: top-p keeps more than one token
    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
    want = _samplers_support(logits, top_k, top_p)
    after_k = logits >= kth
    threshold = logits.masked_fill(~want, float("inf")).min(-1, keepdim=True).values
    tied_at_p = ((logits == threshold) & after_k & ~want).any(-1)
    tied_at_k = ((logits == kth).sum(-1) > 1) & ((logits >= kth).sum(-1) > top_k)
    rows = ~tied_at_p
    assert int((rows & tied_at_k).sum()) >= 3, "premise: rows tied at the k-th logit and not at the top-p threshold"
    got = kept_support(logits, top_k, top_p)
    assert torch.equal(got[rows], want[rows])
    assert bool((got | ~want).all()), "every token the sampler keeps is kept"


def test_a_sampled_token_tied_at_the_boundary_scores_over_the_samplers_distribution_values_and_grads():
    """The scored log-prob of a token tied with the k-th is the sampler's: log-softmax over every tied token, in
    value and gradient, chunked or not; a scorer that dropped a tied token would give it -inf or put the mass of
    the dropped ones elsewhere."""
    top_k, temperature = 8, 1.0
    hidden_size, vocab, rows = 16, 512, 96
    g = torch.Generator().manual_seed(2)
    head = torch.nn.Linear(hidden_size, vocab, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        head.weight.copy_((torch.randn(vocab, hidden_size, generator=g) * 0.5).to(torch.bfloat16))
        head.weight[vocab // 2:] = head.weight[: vocab // 2]  # pairs of equal rows: every logit has a twin
    hidden = torch.randn(rows, hidden_size, generator=g).to(torch.bfloat16).requires_grad_()
    with torch.no_grad():
        logits = head(hidden).float()
        keep = _samplers_support(logits, top_k, 1.0)
        # the sampled token: one of the tied tokens at the boundary (the least likely that the sampler keeps)
        ids = logits.masked_fill(~keep, float("inf")).argmin(-1)
    kth = torch.topk(logits, top_k, dim=-1).values[:, -1]
    assert bool(((logits == kth[:, None]).sum(-1) >= 2).all()), "premise: the k-th logit is tied in every row"
    weights = torch.linspace(-1, 1, rows)
    ours = selective_logps(hidden, ids, head, temperature, 17, top_k)
    assert bool(torch.isfinite(ours).all())
    (ours * weights).sum().backward()
    got = (ours.detach(), hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    scaled = head(hidden).float() / temperature
    want = torch.log_softmax(scaled.masked_fill(~keep, float("-inf")), -1).gather(-1, ids[:, None]).squeeze(-1)
    (want * weights).sum().backward()
    for a, b in zip(got, (want.detach(), hidden.grad, head.weight.grad)):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(full_logps(head(hidden), ids, temperature, top_k).detach(), want.detach())
