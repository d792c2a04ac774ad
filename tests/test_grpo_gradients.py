"""Gradients, not only values, of every term of the GRPO loss at a non-zero weight (``agon.core.grpo``).

A loss term can have the right value and the wrong gradient: a factor detached that should not be (the KL's
importance ratio), a weight that carries a graph it should not. Value comparisons (tests/test_grpo.py against TRL)
cannot see either. Here the gradient of ``policy_loss`` is compared with (1) TRL's own ``_compute_loss``, backward
through the same model, for each loss type with the KL on (with and without its bias correction) and the sampler
correction's weights on; and (2) a float64 reference written out below for every combination of terms, where each
term is switched on alone as well, so a wrong gradient names its term.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from agon.core.grpo import policy_loss, sampler_correction
from tests.test_grpo import trl_setup  # noqa: F401  (the fixture: a tiny model TRL's trainer loads)

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")


def _reference(logps, old, adv, mask, loss_type, eps_low, eps_high, beta, ref, bias_kl, weights, max_len):
    """TRL 1.16's ``_compute_loss`` from its log-probs on, written out (whole batch, no accumulation)."""
    ratio = torch.exp(logps - old)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    a = adv[:, None]
    per = -torch.min(ratio * a, clipped * a)
    if weights is not None:
        per = per * weights
    if beta:
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        per = per + beta * (kl * ratio if bias_kl else kl)
    if loss_type == "grpo":
        return ((per * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return (per * mask).sum() / (per.size(0) * max_len)
    return (per * mask).sum() / mask.sum().clamp(min=1.0)


def _batch(dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    b, t = 6, 7
    logps = -torch.rand(b, t, generator=g, dtype=dtype) * 3
    old = logps + 0.3 * torch.randn(b, t, generator=g, dtype=dtype)  # ratios on both sides of the clip range
    ref = logps + 0.4 * torch.randn(b, t, generator=g, dtype=dtype)
    sampler = old + 0.5 * torch.randn(b, t, generator=g, dtype=dtype)
    adv = torch.tensor([1.5, -0.7, 0.3, -1.1, 0.9, -0.2], dtype=dtype)
    mask = torch.ones(b, t, dtype=dtype)
    for row, n in enumerate((7, 5, 3, 6, 1, 4)):
        mask[row, n:] = 0
    return logps, old, ref, sampler, adv, mask


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_term_alone_and_together_has_the_reference_gradient(loss_type):
    """Each term switched on alone, then together, at a non-zero weight: the gradient with respect to the
    log-probs equals the written-out reference's (float64, 1e-12), and so does the value. Catches a factor of a
    term detached (or left attached) where the value stays the same."""
    logps0, old, ref, sampler, adv, mask = _batch()
    modes = [None, "token_truncate", "sequence_mask"]
    seen_clip = False
    for beta, bias_kl, mode in itertools.product((0.0, 0.05), (True, False), modes):
        if not beta and not bias_kl:
            continue  # the bias correction only acts on the KL
        weights = None if mode is None else sampler_correction(old, sampler, mask, mode, 0.5, 1.8)
        grads = []
        for ours in (True, False):
            logps = logps0.clone().requires_grad_()
            if ours:
                loss, terms = policy_loss(logps, old, adv, mask, loss_type=loss_type, epsilon=0.2, epsilon_high=0.28,
                                          beta=beta, ref_logps=ref if beta else None, use_bias_correction_kl=bias_kl,
                                          sampler_weights=weights, max_completion_length=7)
                seen_clip |= bool((terms.low_clipped | terms.high_clipped)[mask.bool()].any())
            else:
                loss = _reference(logps, old, adv, mask, loss_type, 0.2, 0.28, beta, ref, bias_kl, weights, 7)
            loss.backward()
            grads.append((loss.detach(), logps.grad))
        (v, g), (v_ref, g_ref) = grads
        assert float(g_ref.abs().sum()) > 0
        torch.testing.assert_close(v, v_ref, atol=1e-12, rtol=0)
        torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=0,
                                   msg=lambda m: f"beta={beta} bias_kl={bias_kl} sampler={mode}: {m}")
    assert seen_clip, "premise: some tokens clipped"


@pytest.mark.parametrize("loss_type,bias_kl", [("grpo", True), ("dr_grpo", False), ("dapo", True)])
def test_the_gradient_through_the_model_equals_trls(trl_setup, loss_type, bias_kl):  # noqa: F811
    """Backward through the same model from TRL's ``_compute_loss`` and from agon's ``policy_loss`` on TRL's own
    log-probs (with their graph), KL on, the sampler correction's weights on: every weight's gradient agrees.
    Catches a term whose value equals TRL's while its gradient does not (TRL's test compares values only)."""
    from trl import GRPOConfig, GRPOTrainer

    tok, model, data, out = trl_setup
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=6, report_to="none", use_cpu=True, loss_type=loss_type, beta=0.05,
                      epsilon=0.2, epsilon_high=0.28, temperature=0.7, logging_steps=1,
                      use_bias_correction_kl=bias_kl)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=data, processing_class=tok)
    trainer.current_gradient_accumulation_steps = 1
    # TRL applies the sampler correction only where vLLM sampled; the weights are given as its input is
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    torch.manual_seed(0)
    prompt = tok(["<|im_start|>u12+3<|im_end|><|im_start|>a"] * 4, return_tensors="pt", add_special_tokens=False)
    completion_ids = torch.randint(5, 60, (4, 6))
    completion_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0], [1] * 2 + [0] * 4])
    ids = torch.cat([prompt.input_ids, completion_ids], 1)
    attn = torch.cat([prompt.attention_mask, completion_mask], 1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, 6)
    old = logps + 0.3 * torch.randn_like(logps)
    ref = logps + 0.2 * torch.randn_like(logps)
    weights = sampler_correction(old, old + 0.4 * torch.randn_like(logps), completion_mask.float(), "token_truncate",
                                 0.5, 1.5)
    advantages = torch.tensor([1.5, -0.7, 0.3, -1.1])
    inputs = {"prompt_ids": prompt.input_ids, "prompt_mask": prompt.attention_mask,
              "completion_ids": completion_ids, "completion_mask": completion_mask, "advantages": advantages,
              "old_per_token_logps": old, "ref_per_token_logps": ref, "num_items_in_batch": completion_mask.sum(),
              "importance_sampling_ratio": weights}
    params = [p for p in trainer.model.parameters() if p.requires_grad]

    def grads(loss):
        trainer.model.zero_grad(set_to_none=True)
        loss.backward()
        return [p.grad.clone() for p in params]

    want = grads(trainer._compute_loss(trainer.model, inputs))
    live, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, 6)
    ours, _ = policy_loss(live, old, advantages, completion_mask.float(), loss_type=loss_type, epsilon=0.2,
                          epsilon_high=0.28, beta=0.05, ref_logps=ref, use_bias_correction_kl=bias_kl,
                          sampler_weights=weights, max_completion_length=6)
    got = grads(ours)
    assert sum(float(w.abs().sum()) for w in want) > 0
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)
