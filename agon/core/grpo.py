"""GRPO as pure tensor functions: group-relative advantages, the clipped surrogate, loss aggregation.

Names and meanings follow TRL's ``GRPOTrainer`` (trl 1.16) so that a TRL user reads the config unchanged:
``scale_rewards`` in {group, batch, none}, ``epsilon``/``epsilon_high``, ``beta`` (k3 KL estimator to the reference),
``loss_type`` in {grpo, dr_grpo, dapo}. Loss variants are looked up in ``LOSSES`` by name; nothing calls an
aggregation directly.

``sampler_correction`` is TRL's vLLM importance-sampling correction (``vllm_importance_sampling_*``): the engine
that sampled the tokens computes their probabilities differently from the trainer, and the loss is reweighted by
the ratio of the two, truncated or masked.

Left out on purpose: TRL's sequence-level importance sampling (GSPO), entropy masks and the cispo/sapo/vespo/luspo
variants; the two-adapter game needs none of them to be compared with the paper.
Everything here is model-free, so the tests can check it by hand and against TRL on identical tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from agon.core.registry import Registry

Tensor = torch.Tensor


def nanstd(x: Tensor, dim: int | None = None) -> Tensor:
    """Bessel-corrected standard deviation ignoring NaNs (NaN where fewer than 2 values), as TRL's ``nanstd``."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    var = var * torch.where(count > 1, count / (count - 1), torch.full_like(var, float("nan")))
    out = var.sqrt()
    return out.squeeze(dim) if dim is not None else out.squeeze()


@dataclass(frozen=True)
class Advantages:
    """Output of ``group_advantages``; every tensor is [B] with B = groups * group_size."""

    advantages: Tensor
    # True where the reward's group (or batch, under scale_rewards=batch) has zero spread: no learning signal
    zero_std: Tensor


def group_advantages(rewards: Tensor, group_ids: Tensor, scale_rewards: str = "group",
                     eps: float = 1e-4) -> Advantages:
    """Group-relative advantages, TRL semantics.

    Args:
        rewards: [B] float. NaN marks an unscorable completion: it is left out of its group's mean and std and gets
            advantage 0.
        group_ids: [B] long, the group (problem) of each row. A group's rows need not be contiguous, and a batch
            may hold any subset of groups (filtered groups are simply absent).
        scale_rewards: "group" divides by the group's std, "batch" by the std over the whole batch, "none" not at all.
        eps: added to the std before dividing.

    Returns:
        Advantages with ``advantages`` [B] and ``zero_std`` [B].
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards [B] and group_ids [B] needed, got {tuple(rewards.shape)} and "
                         f"{tuple(group_ids.shape)}")
    _, index = torch.unique(group_ids, return_inverse=True)  # [B] in 0..groups-1
    groups = int(index.max()) + 1 if index.numel() else 0
    valid = ~torch.isnan(rewards)  # [B]
    filled = torch.where(valid, rewards, torch.zeros_like(rewards))  # [B]
    count = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, index, valid.to(rewards.dtype))  # [groups]
    total = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, index, filled)  # [groups]
    group_mean = total / count  # [groups], NaN for an all-NaN group
    mean = group_mean[index]  # [B]
    if scale_rewards in ("group", "none"):
        sq = torch.where(valid, (rewards - mean) ** 2, torch.zeros_like(rewards))  # [B]
        ss = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, index, sq)  # [groups]
        # Bessel-corrected, NaN below 2 values, in nanstd's order of operations (bitwise the same advantages)
        var = (ss / count) * torch.where(count > 1, count / (count - 1), torch.full_like(ss, float("nan")))
        std = var.sqrt()[index]  # [B]
    elif scale_rewards == "batch":
        std = (nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())).expand_as(rewards)  # [B]
    else:
        raise ValueError(f"scale_rewards={scale_rewards!r}; choose group, batch or none")
    std = torch.nan_to_num(std, nan=0.0)
    adv = rewards - mean
    if scale_rewards != "none":
        adv = adv / (std + eps)
    adv = torch.nan_to_num(adv, nan=0.0)  # unscorable rows and all-NaN groups carry no signal
    return Advantages(advantages=adv, zero_std=torch.isclose(std, torch.zeros_like(std)))


def kl_k3(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1. Shapes [B, T] -> [B, T]."""
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


@dataclass(frozen=True)
class SurrogateTerms:
    per_token_loss: Tensor  # [B, T], masked positions included (aggregation masks them)
    low_clipped: Tensor  # [B, T] bool: ratio < 1 - eps_low with negative advantage (clipping active)
    high_clipped: Tensor  # [B, T] bool: ratio > 1 + eps_high with positive advantage
    kl: Tensor | None  # [B, T] or None when beta == 0


def clipped_surrogate(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    epsilon: float,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logps: Tensor | None = None,
    use_bias_correction_kl: bool = True,
    sampler_weights: Tensor | None = None,
) -> SurrogateTerms:
    """PPO's clipped objective per token, negated as a loss, plus ``beta`` times the k3 KL.

    Args:
        logps: [B, T] log-probabilities of the sampled tokens under the current policy (with grad).
        old_logps: [B, T] the same under the policy that sampled them (detached).
        advantages: [B] one advantage per completion.
        epsilon, epsilon_high: the clip range [1 - epsilon, 1 + epsilon_high]; epsilon_high None means epsilon.
        beta: KL coefficient; ``ref_logps`` [B, T] is required when beta != 0.
        use_bias_correction_kl: multiply the KL by the importance ratio, which makes its gradient the unbiased
            reverse-KL gradient (TRL's default since 1.x, after DeepSeek-V3.2).
        sampler_weights: [B, T] or [B, 1], ``sampler_correction``'s weights; they multiply the clipped objective,
            not the KL term (as TRL applies them).
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(1)  # [B, 1]
    ratio = torch.exp(logps - old_logps)  # [B, T]
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)  # [B, T]
    per_token = -torch.min(ratio * adv, clipped * adv)  # [B, T]
    if sampler_weights is not None:
        per_token = per_token * sampler_weights
    kl = None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs ref_logps")
        kl = kl_k3(logps, ref_logps)
        if use_bias_correction_kl:
            kl = kl * ratio
        per_token = per_token + beta * kl
    return SurrogateTerms(
        per_token_loss=per_token,
        low_clipped=(ratio < 1 - epsilon) & (adv < 0),
        high_clipped=(ratio > 1 + eps_high) & (adv > 0),
        kl=kl,
    )


# ---------------------------------------------------------------------------------------------------------------
# loss aggregation, by name

# (per_token_loss [b, T], mask [b, T], max_completion_length, num_items_in_batch, batch_rows) -> scalar.
# Every aggregation is additive over micro-batches: summing it over the micro-batches of one generation batch gives
# the loss of the whole batch, which is what TRL computes with gradient accumulation.
Aggregation = Callable[[Tensor, Tensor, int, float, int], Tensor]
LOSSES: Registry[Aggregation] = Registry("trainer.loss_type")
register_loss = LOSSES.register
get_loss = LOSSES.get_or_raise


@register_loss("grpo")
def grpo_aggregate(per_token_loss: Tensor, mask: Tensor, max_len: int, num_items: float, batch_rows: int) -> Tensor:
    """Mean over each sequence's tokens, then over sequences (length-biased, as TRL warns)."""
    return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / batch_rows


@register_loss("dr_grpo")
def dr_grpo_aggregate(per_token_loss: Tensor, mask: Tensor, max_len: int, num_items: float, batch_rows: int) -> Tensor:
    """Token sum over a constant: batch rows times the maximum completion length (Dr. GRPO)."""
    return (per_token_loss * mask).sum() / (batch_rows * max_len)


@register_loss("dapo")
def dapo_aggregate(per_token_loss: Tensor, mask: Tensor, max_len: int, num_items: float, batch_rows: int) -> Tensor:
    """Token sum over the number of completion tokens in the whole generation batch (DAPO; TRL's default)."""
    return (per_token_loss * mask).sum() / max(float(num_items), 1.0)


def policy_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_type: str,
    epsilon: float,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logps: Tensor | None = None,
    use_bias_correction_kl: bool = True,
    sampler_weights: Tensor | None = None,
    max_completion_length: int,
    num_items_in_batch: float | None = None,
    batch_rows: int | None = None,
) -> tuple[Tensor, SurrogateTerms]:
    """The GRPO loss of one (micro-)batch: clipped surrogate, then the ``loss_type`` aggregation.

    Args:
        logps, old_logps, ref_logps, mask: [B, T]; mask is 1 on completion tokens.
        advantages: [B].
        num_items_in_batch: completion tokens in the whole generation batch (dapo); defaults to ``mask.sum()``.
        batch_rows: completions in the whole generation batch (grpo, dr_grpo); defaults to B. Pass both when this
            call sees one micro-batch of a larger batch, and sum the returned losses.
        sampler_weights: [B, T] or [B, 1] from ``sampler_correction``, or None.

    Returns:
        (scalar loss, the per-token terms for logging).
    """
    terms = clipped_surrogate(logps, old_logps, advantages, epsilon, epsilon_high, beta, ref_logps,
                              use_bias_correction_kl, sampler_weights)
    num_items = float(mask.sum()) if num_items_in_batch is None else num_items_in_batch
    rows = logps.size(0) if batch_rows is None else batch_rows
    loss = get_loss(loss_type)(terms.per_token_loss, mask, max_completion_length, num_items, rows)
    return loss, terms


# vllm_importance_sampling_mode: the ratio per token or per sequence (the product of its tokens' ratios), and what
# happens outside [clip_min, clip_max]: truncated to the bound, or the token / sequence left out of the loss
SAMPLER_CORRECTIONS = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def sampler_correction(old_logps: Tensor, sampler_logps: Tensor, mask: Tensor, mode: str,
                       clip_min: float | None = None, clip_max: float | None = 3.0) -> Tensor:
    """TRL's vLLM importance-sampling weights: pi_trainer / pi_sampler of the sampled tokens, truncated or masked.

    Args:
        old_logps: [B, T] the trainer's log-probs of the sampled tokens under the weights that sampled them.
        sampler_logps: [B, T] the sampling engine's log-probs of the same tokens (after temperature). NaN (a token
            the engine did not score) counts as no difference.
        mask: [B, T] 1 on completion tokens.
        mode: one of ``SAMPLER_CORRECTIONS``.
        clip_min, clip_max: the bounds (None: unbounded on that side).

    Returns:
        [B, T] for token_* modes, [B, 1] for sequence_* modes; 0 where a mask mode drops the token or sequence.
    """
    if mode not in SAMPLER_CORRECTIONS:
        raise ValueError(f"vllm_importance_sampling_mode={mode!r}; choose one of {list(SAMPLER_CORRECTIONS)}")
    diff = torch.nan_to_num((old_logps - sampler_logps) * mask, nan=0.0)  # [B, T]
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)  # [B, 1]
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio if clip_min is None and clip_max is None else torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def sampler_mismatch(old_logps: Tensor, sampler_logps: Tensor, mask: Tensor, weights: Tensor | None,
                     batch_tokens: float, batch_rows: int) -> dict[str, float]:
    """TRL's sampler-mismatch metrics of one micro-batch: |trainer - sampler| log-prob per token and the correction
    weights. ``/mean`` entries are this micro-batch's share of the whole batch's mean (they add up over micro-batches
    and ranks); ``/max`` and ``/min`` entries are over this micro-batch's tokens or sequences only.

    Shapes: logps and mask [B, T]; weights [B, T], [B, 1] or None (no correction applied).
    """
    valid = mask.bool() & ~torch.isnan(sampler_logps)
    delta = (old_logps - sampler_logps).abs()[valid]
    out = {"sampling/sampling_logp_difference/mean": float(delta.sum()) / max(batch_tokens, 1.0),
           "sampling/sampling_logp_difference/max": float(delta.max()) if delta.numel() else 0.0}
    if weights is not None:
        flat = weights.flatten() if weights.size(1) == 1 else weights[mask.bool()]
        denominator = batch_rows if weights.size(1) == 1 else max(batch_tokens, 1.0)
        out |= {"sampling/importance_sampling_ratio/mean": float(flat.sum()) / denominator,
                "sampling/importance_sampling_ratio/min": float(flat.min()) if flat.numel() else 1.0,
                "sampling/importance_sampling_ratio/max": float(flat.max()) if flat.numel() else 1.0}
    return out


def is_extreme(key: str) -> bool:
    """A ``/max`` or ``/min`` statistic: combined by max or min, never summed."""
    return key.endswith(("/max", "/min"))


def merge_stats(into: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """``into`` updated with ``new``: ``/max`` and ``/min`` keys by max and min, every other key summed."""
    for key, value in new.items():
        if key not in into:
            into[key] = value
        elif is_extreme(key):
            into[key] = (max if key.endswith("/max") else min)(into[key], value)
        else:
            into[key] += value
    return into


def masked_mean(x: Tensor, mask: Tensor) -> float:
    """Mean of ``x`` over ``mask`` (0.0 for an empty mask); shapes [B, T]."""
    total = mask.sum()
    return float((x * mask).sum() / total) if total > 0 else 0.0
