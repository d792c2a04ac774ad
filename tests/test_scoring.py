"""Scoring without vocabulary-wide tensors, and work bounded by tokens: equal to the straightforward computation."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from agon.core.config import LoraConfig
from agon.models.policies import Policies
from agon.models.tokens import Completion, token_batches
from agon.core.scoring import full_logps, selective_logps
from agon.models.world import build_tokenizer


@pytest.mark.parametrize("temperature,chunk", [(1.0, 64), (0.7, 37), (0.6, 10_000)])
def test_selective_logps_equal_the_full_log_softmax_values_and_grads(temperature, chunk):
    n, hidden_size, vocab = 300, 48, 5000  # vocabulary larger than the hidden size, as in every LLM
    hidden = torch.randn(n, hidden_size, dtype=torch.float64).float().requires_grad_()
    head = torch.nn.Linear(hidden_size, vocab, bias=True)
    ids = torch.randint(0, vocab, (n,))
    weights = torch.randn(n)

    ours = selective_logps(hidden, ids, head, temperature, chunk)
    (ours * weights).sum().backward()
    got = (ours.detach(), hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone())
    hidden.grad, head.weight.grad, head.bias.grad = None, None, None

    ref = full_logps(head(hidden), ids, temperature)
    (ref * weights).sum().backward()
    want = (ref.detach(), hidden.grad, head.weight.grad, head.bias.grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("top_k,top_p", [(20, 0.95), (0, 0.8), (5, 1.0), (50, 0.5)])
def test_truncated_logps_equal_the_log_softmax_of_the_samplers_own_warped_logits(top_k, top_p):
    """With top-k/top-p the log-probs are those of the distribution transformers' sampler draws from (its own
    TopK/TopP warpers after the temperature), values and grads, chunked or not; the full softmax differs."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    n, hidden_size, vocab, temperature = 200, 48, 3000, 0.6
    hidden = torch.randn(n, hidden_size).requires_grad_()
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    with torch.no_grad():
        head.weight.mul_(8)  # peaked rows, as a trained model's: top-p keeps a few tokens
        warped = head(hidden) / temperature
        if top_k:
            warped = TopKLogitsWarper(top_k)(None, warped)
        if top_p < 1:
            warped = TopPLogitsWarper(top_p)(None, warped)
        # what the sampler draws: one token per row from the warped distribution
        ids = torch.multinomial(warped.softmax(-1), 1).squeeze(-1)
    weights = torch.randn(n)

    ours = selective_logps(hidden, ids, head, temperature, 37, top_k, top_p)
    (ours * weights).sum().backward()
    got = (ours.detach(), hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    sampler = torch.log_softmax(head(hidden) / temperature + (warped.isinf() * -1e9), -1)
    want = sampler.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    (want * weights).sum().backward()
    for g, w in zip(got, (want.detach(), hidden.grad, head.weight.grad)):  # float32 sums of 200 rows' grads
        torch.testing.assert_close(g, w, atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(got[0], full_logps(head(hidden), ids, temperature, top_k, top_p).detach())
    # the untruncated softmax puts mass outside the kept set: every log-prob is lower by log(kept mass)
    gap = full_logps(head(hidden), ids, temperature).detach() - got[0]
    assert float(gap.max()) <= 1e-6 and float(gap.mean()) < -1e-5


def test_a_sampled_token_just_outside_the_trainers_kept_set_keeps_a_finite_log_prob():
    """Numerics can put the sampled token just past the trainer's top-k boundary; its log-prob must stay finite
    (renormalised with it), or the importance ratio and the loss would be NaN."""
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    out = full_logps(logits, torch.tensor([[3]]).squeeze(-1), 1.0, top_k=2)
    assert torch.isfinite(out).all()
    expected = 1.0 - torch.logsumexp(torch.tensor([4.0, 3.0, 1.0]), 0)
    torch.testing.assert_close(out, expected.reshape(1))


def test_selective_logps_without_grad_builds_no_graph():
    head = torch.nn.Linear(8, 100)
    with torch.no_grad():
        out = selective_logps(torch.randn(5, 8), torch.randint(0, 100, (5,)), head, 1.0, 2)
    assert out.shape == (5,) and not out.requires_grad and out.dtype == torch.float32


def _policies(vocab: int = 3000, max_positions: int = 256) -> Policies:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tokenizer()
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=max_positions, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    for p in model.parameters():
        p.requires_grad_(False)
    policies = Policies(model, tok, ["A", "B"], OmegaConf.structured(LoraConfig(rank=4, alpha=8)))
    policies.perturb("A", 0.05, seed=1)  # PEFT leaves lora_B zero, which would make A's gradient path trivial
    return policies


def _straightforward(policies: Policies, batch, temperature: float) -> torch.Tensor:
    """The computation scoring replaced: whole-batch logits, a full float32 log-softmax, a gather."""
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
    attn = torch.cat([batch.prompt_mask, batch.completion_mask], 1)
    logits = policies.model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    return full_logps(logits[:, batch.prompt_ids.size(1) - 1 : -1], batch.completion_ids, temperature)


def test_token_logps_equal_the_straightforward_computation_values_and_lora_grads():
    policies = _policies()
    prompts = [policies.render("1+2+3"), policies.render("12+4-3+9+1"), policies.render("7")]
    lengths = [5, 17, 1]
    comps = [Completion("", tuple(torch.randint(0, 3000, (n,)).tolist()), False) for n in lengths]
    batch = policies.batch_tensors(prompts, comps)
    mask = batch.completion_mask.float()
    weights = torch.randn(mask.shape)
    lora = policies.parameters("A")

    ours = policies.token_logps(batch, temperature=0.7, chunk_tokens=4)
    (ours * mask * weights).sum().backward()
    ours_grads = [p.grad.clone() for p in lora]
    policies.model.zero_grad(set_to_none=True)
    ref = _straightforward(policies, batch, 0.7)
    (ref * mask * weights).sum().backward()

    torch.testing.assert_close(ours * mask, ref.detach() * mask, atol=1e-5, rtol=1e-5)
    assert ours.shape == ref.shape and float((ours.detach() * (1 - mask)).abs().sum()) == 0.0
    for g, p in zip(ours_grads, lora):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-5)
    # a micro-batch is cut to its own widths first; its rows score exactly as inside the whole batch
    with torch.no_grad():
        part = policies.token_logps(batch, slice(2, 3), temperature=0.7)
    assert part.shape == (1, ours.size(1))
    torch.testing.assert_close(part * mask[2:3], ours.detach()[2:3] * mask[2:3], atol=1e-5, rtol=1e-5)


def test_token_batches_stay_within_the_budget_and_cover_every_row_once():
    widths = [(10, 5), (12, 30), (8, 2), (40, 40), (3, 3), (3, 3), (3, 3), (200, 10), (1, 1)]
    parts = token_batches(widths, budget=100, max_rows=3)
    assert [i for part in parts for i in range(len(widths))[part]] == list(range(len(widths)))
    for part in parts:
        rows = widths[part]
        cost = len(rows) * (max(a for a, _ in rows) + max(b for _, b in rows))
        assert len(rows) <= 3 and (cost <= 100 or len(rows) == 1)
    assert widths[parts[-2]] == [(200, 10)]  # wider than the budget: alone
    assert token_batches([], 10) == []
    assert token_batches([(1, 1)] * 6, budget=1000) == [slice(0, 6)]


def test_sampling_holds_at_most_the_token_budget_per_generate_call():
    policies = _policies(vocab=len(build_tokenizer()))
    calls: list[tuple[int, int]] = []
    real = policies._generate

    def spy(prompts, max_new_tokens, *args):
        calls.append((len(prompts), max(len(policies.tokenizer(p)["input_ids"]) for p in prompts) + max_new_tokens))
        return real(prompts, max_new_tokens, *args)

    policies._generate = spy
    prompts = [policies.render("1+2")] * 5 + [policies.render("1+2+3+4+5+6+7+8")] * 5
    out = policies.sample(prompts, "A", max_new_tokens=8, temperature=1.0, batch_tokens=100)
    assert len(out) == 10 and all(c.n_tokens <= 8 for c in out)
    assert sum(n for n, _ in calls) == 10 and len(calls) > 1
    assert all(n * width <= 100 for n, width in calls)


def test_a_prompt_near_the_end_of_the_context_gets_the_room_left_and_one_past_it_is_not_sampled():
    policies = _policies(vocab=len(build_tokenizer()), max_positions=40)
    short, near, over = policies.render("1+2"), policies.render("1" * 24), policies.render("1" * 60)
    room = 40 - len(policies.tokenizer(near)["input_ids"])
    assert 0 < room < 16
    out = policies.sample([short, near, over], "A", max_new_tokens=16, temperature=1.0)
    assert not out[0].context_limited
    assert out[1].context_limited and out[1].n_tokens <= room
    assert out[2].context_limited and out[2].truncated and out[2].n_tokens == 0 and out[2].text == ""


def test_a_micro_batch_without_completion_tokens_scores_zero_and_still_backpropagates():
    """Rows whose prompt filled the context come back empty; a micro-batch of only such rows must not break the
    update's backward pass."""
    policies = _policies()
    batch = policies.batch_tensors([policies.render("1+2")] * 2, [Completion("", (), True)] * 2)
    logps = policies.token_logps(batch)
    assert float(logps.detach().abs().sum()) == 0.0
    logps.sum().backward()
    assert all(p.grad is not None and float(p.grad.abs().sum()) == 0.0 for p in policies.parameters("A"))


def test_gradient_checkpointing_changes_no_gradient():
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the same weights both times
        policies = _policies()
        if checkpointing:  # the decoder's activations recomputed in the backward pass, as the Qwen3 configs run
            policies.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            policies.model.enable_input_require_grads()
        batch = policies.batch_tensors([policies.render("1+2+3")] * 2,
                                       [Completion("", (5, 6, 7, 8), True), Completion("", (9, 10), False)])
        policies.token_logps(batch, temperature=0.6).sum().backward()
        grads.append([p.grad.clone() for p in policies.parameters("A")])
    assert policies.model.is_gradient_checkpointing
    for off, on in zip(*grads):
        torch.testing.assert_close(off, on, atol=1e-6, rtol=1e-6)
