"""One role's rows of a training step as a typed batch: tokens, advantages, group ids, the adapter, normalisers.

``role_batches`` is the one place a played ``Game`` and its rewards become tensors. Advantages are computed over
the whole step's batch (every rank's rows, grouped by group id), and then each rank keeps only its own rows; the
normalisers of the loss (completion tokens for dapo, rows for grpo and dr_grpo) are the whole batch's too, so the
losses of all ranks' micro-batches sum to the one-process loss of the whole batch. ``RoleBatch.micro_batches`` is
the one micro-batch iterator: rows sorted by length and cut within a token budget (``policies.length_batches``), a
row of ``solo_tokens`` or more alone and unpadded (a latent challenger's prefix counts in the budget:
``Tokens.widths``). Because every normaliser is the whole batch's, which rows share a micro-batch and in what order
they come changes the loss only by the order of float sums. A micro-batch carries its
rows' positions (``RoleBatch.rows``); ``in_place`` puts what was computed per micro-batch back in the batch's order.

Left out on purpose: packing several sequences into one row (it needs variable-length attention kernels); rows are
padded to the widest prompt and completion of their micro-batch, which sorting keeps close to their own lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Mapping, Sequence

import torch

from agon.core.grpo import group_advantages
from agon.models.latent import Prefixes
from agon.models.policies import Policies
from agon.models.tokens import Tokens, length_batches
from agon.core.rewards import RoleRewards
from agon.game.rollout import Game

Tensor = torch.Tensor


@dataclass(frozen=True)
class RoleBatch:
    """One role's rows (this rank's share) and what its GRPO update reads. Tensors stay on the CPU."""

    role: str  # drafter | challenger
    adapter: str | None  # the adapter that played the role (None: the base, which never trains)
    tokens: Tokens  # [b, P] prompts, [b, T] completions
    advantages: Tensor  # [b]
    group_ids: Tensor  # [b] long, the problem each row answers
    # of the whole step's batch, every rank's rows: completion tokens (dapo) and rows (grpo, dr_grpo)
    batch_tokens: float
    batch_rows: int
    # share of the whole batch's rows whose group has no reward spread (logged, no learning signal)
    frac_zero_std: float
    # [b, T] under the sampling policy (num_iterations > 1) and under the base (beta != 0)
    old_logps: Tensor | None = None
    ref_logps: Tensor | None = None
    # [b, T] the sampling engine's log-probs of the completion tokens (vLLM), None when it gives none (hf)
    sampler_logps: Tensor | None = None
    # [b] long, where these rows sit in the batch they were cut from (a micro-batch's); None: the batch itself
    rows: Tensor | None = None
    # exchange=latent, the challenger's rows: whose key/value states their prefixes (tokens.prefix_ids) are, the
    # drafter's adapter (ids unused: each row's are in tokens); None: no prefixes
    prefixes: Prefixes | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def mask(self) -> Tensor:
        """[b, T] float, 1 on completion tokens."""
        return self.tokens.completion_mask.float()

    def __getitem__(self, rows: slice | Tensor) -> "RoleBatch":
        """The selected rows (a slice, or [b] long positions in any order), each field cut alike."""
        def cut(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[rows]

        where = torch.arange(len(self)) if self.rows is None else self.rows
        return replace(self, tokens=self.tokens[rows], advantages=self.advantages[rows],
                       group_ids=self.group_ids[rows], old_logps=cut(self.old_logps), ref_logps=cut(self.ref_logps),
                       sampler_logps=cut(self.sampler_logps), rows=where[rows])

    def micro_batches(self, budget_tokens: int, max_rows: int | None = None,
                      solo_tokens: int | None = None) -> Iterator["RoleBatch"]:
        """Micro-batches of rows of similar length, longest first, each within ``budget_tokens`` (rows x padded
        width) and ``max_rows`` rows; a row of at least ``solo_tokens`` (prompt + completion) alone. Not contiguous:
        each carries its rows' positions in ``rows`` (``in_place`` undoes the permutation)."""
        for part in length_batches(self.tokens.widths(), budget_tokens, max_rows, solo_tokens):
            yield self[torch.tensor(part, dtype=torch.long)]


def in_place(parts: Sequence[tuple[Tensor, Tensor]], n: int) -> Tensor:
    """Per-micro-batch results back in the batch's row order.

    Args:
        parts: (rows [b_i] long, values [b_i, ...]) of each micro-batch, as ``RoleBatch.rows`` and what was computed
            from that micro-batch; together the rows must be each of ``0 .. n-1`` exactly once.
        n: rows of the whole batch.
    Returns:
        [n, ...] with row ``rows[j]`` of the output holding ``values[j]``, on the values' device and dtype.
    """
    if not parts:
        raise ValueError(f"no micro-batches to put back into {n} rows")
    rows = torch.cat([r.cpu() for r, _ in parts])
    if rows.numel() != n or not torch.equal(rows.sort().values, torch.arange(n)):
        raise ValueError(f"micro-batches cover rows {rows.tolist()}, not each of 0..{n - 1} once")
    values = torch.cat([v for _, v in parts])
    out = torch.empty_like(values)
    out[rows.to(values.device)] = values
    return out


def role_batches(policies: Policies, game: Game, rewards: Mapping[str, RoleRewards], rows: slice,
                 scale_rewards: str, adv_eps: float) -> list[RoleBatch]:
    """A ``RoleBatch`` per rewarded role of ``game`` (the whole step's batch), holding ``rows`` (this rank's)."""
    group_ids = game.group_ids()
    out = []
    for role, reward in rewards.items():
        adv = group_advantages(reward.total, group_ids, scale_rewards, adv_eps)  # over the whole batch
        attempts = game.attempts(role)
        mine = attempts[rows]
        # the challenger's rows read the drafter's states (exchange=latent): the prefixes travel with the tokens
        latent = role == "challenger" and any(a.prefix for a in attempts)
        tokens = policies.batch_tensors([a.prompt for a in mine], [a.completion for a in mine],
                                        [a.prefix for a in mine] if latent else None)
        out.append(RoleBatch(
            role=role, adapter=game.drafter if role == "drafter" else game.challenger, tokens=tokens,
            advantages=adv.advantages[rows], group_ids=group_ids[rows],
            batch_tokens=float(sum(a.completion.n_tokens for a in attempts)), batch_rows=len(attempts),
            frac_zero_std=float(adv.zero_std.float().mean()),
            sampler_logps=sampler_logps([a.completion.logps for a in mine], tokens.completion_ids.size(1)),
            prefixes=Prefixes(game.drafter, ()) if latent else None))
    return out


def sampler_logps(rows: list[tuple[float, ...] | None], width: int) -> Tensor | None:
    """[b, width] float32, the engine's log-probs right-padded with 0; None unless every row has them."""
    if not rows or any(r is None for r in rows):
        return None
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)  # type: ignore[arg-type]
    return out
