"""The GRPO core against hand-computed values and against TRL's own loss on identical tensors."""

from __future__ import annotations

import math

import pytest
import torch

from agon.core.grpo import (LOSSES, clipped_surrogate, get_loss, group_advantages, kl_k3, masked_mean, merge_stats,
                            policy_loss, sampler_correction, sampler_mismatch)


def groups(batch: int, size: int) -> torch.Tensor:
    """Group ids of a problem-major batch: consecutive runs of ``size`` rows."""
    return torch.arange(batch) // size


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    # group 1: mean 0.25, Bessel std sqrt(0.25) = 0.5; group 2: zero spread
    adv = group_advantages(rewards, groups(8, 4), scale_rewards="group", eps=1e-4)
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-4)
    torch.testing.assert_close(adv.advantages[:4], expected)
    assert torch.equal(adv.advantages[4:], torch.zeros(4))
    assert adv.zero_std.tolist() == [False] * 4 + [True] * 4


def test_group_advantages_batch_and_none():
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0])
    batch = group_advantages(rewards, groups(4, 2), "batch", eps=0.0).advantages
    std = rewards.std()  # Bessel, over the batch
    torch.testing.assert_close(batch, torch.tensor([0.5, -0.5, 1.0, -1.0]) / std)
    none = group_advantages(rewards, groups(4, 2), "none").advantages
    torch.testing.assert_close(none, torch.tensor([0.5, -0.5, 1.0, -1.0]))


def test_unscorable_rows_get_zero_advantage_and_leave_the_baseline():
    rewards = torch.tensor([1.0, float("nan"), 0.0, float("nan"), float("nan"), float("nan")])
    adv = group_advantages(rewards, groups(6, 3), "none").advantages
    torch.testing.assert_close(adv, torch.tensor([0.5, 0.0, -0.5, 0.0, 0.0, 0.0]))
    assert torch.isfinite(adv).all()


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_groups_are_found_by_id_not_by_position(scale):
    """Shuffled rows get their shuffled advantages; a group filtered out leaves the others' advantages as they were
    (under group scaling, where nothing is shared across groups)."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 2.0, 3.0, float("nan"), 1.0, 0.0, 0.0, 1.0, 1.0])
    ids = groups(12, 4)
    whole = group_advantages(rewards, ids, scale)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    shuffled = group_advantages(rewards[perm], ids[perm] * 7 + 3, scale)  # any id values, in any order
    torch.testing.assert_close(shuffled.advantages, whole.advantages[perm])
    assert torch.equal(shuffled.zero_std, whole.zero_std[perm])
    if scale == "group":
        kept = ids != 1
        torch.testing.assert_close(group_advantages(rewards[kept], ids[kept], scale).advantages,
                                   whole.advantages[kept])


def test_group_ids_must_match_the_rewards():
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages(torch.zeros(4), torch.zeros(3, dtype=torch.long))


def test_clipped_surrogate_by_hand():
    logps = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))  # ratios 1.5, 0.5, 1.0 against old logps of 0
    old = torch.zeros(1, 3)
    pos = clipped_surrogate(logps, old, torch.tensor([2.0]), epsilon=0.2)
    # positive advantage: min(r*A, clip(r)*A) -> 1.2*2, 0.5*2, 1*2
    torch.testing.assert_close(pos.per_token_loss, -torch.tensor([[2.4, 1.0, 2.0]]))
    assert pos.high_clipped.tolist() == [[True, False, False]] and not pos.low_clipped.any()
    neg = clipped_surrogate(logps, old, torch.tensor([-1.0]), epsilon=0.2, epsilon_high=0.28)
    # negative advantage: min(-r, -clip(r)) -> -1.5, -0.8, -1
    torch.testing.assert_close(neg.per_token_loss, torch.tensor([[1.5, 0.8, 1.0]]))
    assert neg.low_clipped.tolist() == [[False, True, False]]


def test_a_zero_advantage_is_never_counted_as_clipped():
    """Clipping changes nothing where the advantage is 0 (a group without spread), so it is not logged as clipped."""
    logps = torch.log(torch.tensor([[1.5, 0.5]]))
    terms = clipped_surrogate(logps, torch.zeros(1, 2), torch.tensor([0.0]), epsilon=0.2)
    assert not terms.low_clipped.any() and not terms.high_clipped.any()
    assert torch.equal(terms.per_token_loss, torch.zeros(1, 2))


def test_sampler_correction_by_hand():
    """Row 0: trainer above the sampler by 0.5 then 1.5 (ratios e^0.5, e^1.5, sequence e^2); row 1: below by 2 on its
    one token (e^-2), its padded column ignored; TRL's four modes with bounds [0.2, 3]."""
    old = torch.tensor([[-1.0, -0.5], [-3.0, 9.0]])
    sampler = torch.tensor([[-1.5, -2.0], [-1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    e = math.exp

    def run(mode):
        return sampler_correction(old, sampler, mask, mode, clip_min=0.2, clip_max=3.0)

    assert torch.allclose(run("token_truncate"), torch.tensor([[e(0.5), 3.0], [0.2, 1.0]]))
    assert torch.allclose(run("token_mask"), torch.tensor([[e(0.5), 0.0], [0.0, 1.0]]))
    assert torch.allclose(run("sequence_truncate"), torch.tensor([[3.0], [0.2]]))
    assert torch.equal(run("sequence_mask"), torch.tensor([[0.0], [0.0]]))
    assert torch.allclose(sampler_correction(old, sampler, mask, "sequence_mask", None, None),
                          torch.tensor([[e(2.0)], [e(-2.0)]]))
    # a token the engine did not score (NaN) counts as no difference
    nan = sampler.clone()
    nan[0, 1] = float("nan")
    assert torch.allclose(sampler_correction(old, nan, mask, "token_truncate", None, None)[0],
                          torch.tensor([e(0.5), 1.0]))
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        run("token")


def test_sampler_weights_scale_the_surrogate_and_not_the_kl():
    logps, old, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    adv, weights = torch.tensor([2.0]), torch.tensor([[0.5, 0.0]])
    plain = clipped_surrogate(logps, old, adv, 0.2, beta=0.1, ref_logps=ref)
    weighted = clipped_surrogate(logps, old, adv, 0.2, beta=0.1, ref_logps=ref, sampler_weights=weights)
    kl = 0.1 * plain.kl
    assert torch.allclose(weighted.per_token_loss - kl, (plain.per_token_loss - kl) * weights)


def test_sampler_mismatch_adds_up_over_micro_batches_and_takes_extremes():
    old = torch.tensor([[-1.0, -2.0], [-1.0, 0.0]])
    sampler = torch.tensor([[-1.5, -2.0], [-4.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    weights = torch.tensor([[1.0], [0.25]])
    total = {}
    for rows in (slice(0, 1), slice(1, 2)):
        merge_stats(total, sampler_mismatch(old[rows], sampler[rows], mask[rows], weights[rows], 3.0, 2))
    assert total["sampling/sampling_logp_difference/mean"] == pytest.approx((0.5 + 0.0 + 3.0) / 3)
    assert total["sampling/sampling_logp_difference/max"] == 3.0  # the padded column's 7 is not a token
    assert total["sampling/importance_sampling_ratio/mean"] == pytest.approx(0.625)
    assert (total["sampling/importance_sampling_ratio/min"], total["sampling/importance_sampling_ratio/max"]) == \
        (0.25, 1.0)


def test_masked_mean_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert masked_mean(x, mask) == pytest.approx((1 + 2 + 6) / 3)
    assert masked_mean(x, torch.zeros_like(mask)) == 0.0
    assert masked_mean(x, torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])) == 5.0


def test_kl_k3_is_zero_at_equality_and_positive_elsewhere():
    x = torch.tensor([[-1.0, -2.0]])
    assert torch.equal(kl_k3(x, x), torch.zeros_like(x))
    assert (kl_k3(x, x + 0.3) > 0).all()


def test_aggregations_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # grpo: mean per sequence, then over sequences: (2 + 4) / 2
    assert get_loss("grpo")(per_token, mask, 8, 4.0, 2).item() == pytest.approx(3.0)
    # dr_grpo: token sum over rows * max length: 10 / (2 * 8)
    assert get_loss("dr_grpo")(per_token, mask, 8, 4.0, 2).item() == pytest.approx(10 / 16)
    # dapo: token sum over tokens in the batch: 10 / 4
    assert get_loss("dapo")(per_token, mask, 8, 4.0, 2).item() == pytest.approx(2.5)
    with pytest.raises(KeyError, match="registered"):
        get_loss("ppo")


@pytest.mark.parametrize("loss_type", sorted(LOSSES))
def test_micro_batches_sum_to_the_whole_batch(loss_type):
    torch.manual_seed(0)
    logps, old = torch.randn(6, 5), torch.randn(6, 5)
    adv, mask = torch.randn(6), (torch.rand(6, 5) > 0.3).float()
    kw = dict(loss_type=loss_type, epsilon=0.2, max_completion_length=5, num_items_in_batch=float(mask.sum()),
              batch_rows=6)
    whole, _ = policy_loss(logps, old, adv, mask, **kw)
    parts = sum(policy_loss(logps[s], old[s], adv[s], mask[s], **kw)[0] for s in (slice(0, 2), slice(2, 6)))
    torch.testing.assert_close(whole, parts)


# -- TRL equivalence --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trl_setup(tmp_path_factory):
    from datasets import Dataset

    from agon.models import world
    from agon.core.config import TinyWorldConfig

    tok = world.build_tokenizer()
    model = world.build_model(TinyWorldConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                              intermediate_size=64), len(tok), seed=1)
    data = Dataset.from_dict({"prompt": ["12+3"] * 4})
    out = tmp_path_factory.mktemp("trl")
    # TRL builds its KL reference from the model's path, so the model goes through save_pretrained
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    return tok, str(out / "model"), data, out


@pytest.mark.parametrize("loss_type,beta,eps_high", [("grpo", 0.0, None), ("dr_grpo", 0.0, 0.28), ("grpo", 0.04, None),
                                                    ("dapo", 0.0, 0.28), ("dapo", 0.1, None)])
def test_loss_equals_trl(trl_setup, loss_type, beta, eps_high):
    from trl import GRPOConfig, GRPOTrainer

    from agon.models.policies import Policies
    from agon.models.tokens import Completion

    tok, model, data, out = trl_setup
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=6, report_to="none", use_cpu=True, loss_type=loss_type, beta=beta,
                      epsilon=0.2, epsilon_high=eps_high or 0.2, temperature=0.7, logging_steps=1)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=data, processing_class=tok)
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    prompt = tok(["<|im_start|>u12+3<|im_end|><|im_start|>a"] * 4, return_tensors="pt", add_special_tokens=False)
    completion_ids = torch.randint(5, 60, (4, 6))
    completion_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0], [1] * 2 + [0] * 4])
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt.input_ids, completion_ids], 1),
            torch.cat([prompt.attention_mask, completion_mask], 1), 6)
    old = logps + 0.3 * torch.randn_like(logps)  # ratios away from 1, so clipping is exercised
    ref = logps + 0.2 * torch.randn_like(logps)
    advantages = torch.tensor([1.5, -0.7, 0.3, -1.1])
    inputs = {"prompt_ids": prompt.input_ids, "prompt_mask": prompt.attention_mask,
              "completion_ids": completion_ids, "completion_mask": completion_mask, "advantages": advantages,
              "old_per_token_logps": old, "num_items_in_batch": completion_mask.sum()}
    if beta:
        inputs["ref_per_token_logps"] = ref
    trl_loss = trainer._compute_loss(trainer.model, inputs)

    # ours, on the very same log-prob tensors TRL's loss saw
    ours, _ = policy_loss(logps, old, advantages, completion_mask.float(), loss_type=loss_type, epsilon=0.2,
                          epsilon_high=eps_high, beta=beta, ref_logps=ref if beta else None,
                          max_completion_length=6)
    assert math.isfinite(ours.item())
    torch.testing.assert_close(ours, trl_loss, atol=1e-5, rtol=1e-5)

    # and our own log-probs of the same tokens, temperature applied; TRL's fused, chunked LM head rounds differently,
    # so these agree to a few 1e-3 rather than 1e-5
    from agon.families import get_family

    policies = Policies.__new__(Policies)
    policies.model, policies.tokenizer, policies.family = trainer.model, tok, get_family("qwen3")
    comps = [Completion("", tuple(r[m.bool()].tolist()), False) for r, m in zip(completion_ids, completion_mask)]
    batch = policies.batch_tensors(["<|im_start|>u12+3<|im_end|><|im_start|>a"] * 4, comps)
    with torch.no_grad():
        ours_logps = policies.token_logps(batch, temperature=0.7)
    torch.testing.assert_close(ours_logps * completion_mask, logps * completion_mask, atol=5e-3, rtol=0)
