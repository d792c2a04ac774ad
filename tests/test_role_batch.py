"""Micro-batches by length: every row once, rows of similar length together, long rows alone and unpadded, and every
field of a micro-batch cut by the same rows, which ``in_place`` puts back in the batch's order."""

from __future__ import annotations

import pytest
import torch

from agon.models.tokens import Tokens, length_batches, token_batches
from agon.training.role_batch import RoleBatch, in_place

# (prompt, completion) lengths: a few long rows among short ones, in no order
WIDTHS = [(20, 5), (20, 300), (18, 7), (22, 3), (20, 120), (19, 6), (20, 2), (21, 500), (20, 4), (20, 8)]


def _cost(rows: list[tuple[int, int]]) -> int:
    """Tokens a micro-batch holds: rows x (widest prompt + widest completion)."""
    return len(rows) * (max(a for a, _ in rows) + max(b for _, b in rows))


def test_length_batches_cover_every_row_once_longest_first_within_the_budget():
    parts = length_batches(WIDTHS, budget=1200, max_rows=4, solo_tokens=100)
    assert sorted(i for part in parts for i in part) == list(range(len(WIDTHS)))
    order = [i for part in parts for i in part]
    totals = [sum(WIDTHS[i]) for i in order]
    assert totals == sorted(totals, reverse=True)
    # rows of 100 tokens or more alone, the longest first; the rest within the budget and max_rows
    assert parts[:3] == [[7], [1], [4]]
    assert [len(part) for part in parts[3:]] == [4, 3]
    assert all(_cost([WIDTHS[i] for i in part]) <= 1200 for part in parts)


def test_sorted_micro_batches_hold_little_more_than_the_rows_own_tokens():
    """The same rows cut in the batch's order pad short rows to the long ones they happen to sit next to."""
    tokens = sum(a + b for a, b in WIDTHS)
    contiguous = sum(_cost(WIDTHS[s]) for s in token_batches(WIDTHS, 1200))
    by_length = sum(_cost([WIDTHS[i] for i in part]) for part in length_batches(WIDTHS, 1200, solo_tokens=100))
    assert contiguous > 2 * tokens and by_length < 1.05 * tokens


def test_equal_lengths_keep_their_order_and_no_solo_rule_means_budget_alone():
    assert length_batches([(3, 3)] * 5, budget=1000) == [[0, 1, 2, 3, 4]]
    assert length_batches([(3, 3)] * 5, budget=12) == [[0, 1], [2, 3], [4]]
    # without solo_tokens the long rows still get their own micro-batch here, but only because of the budget
    assert length_batches([(1, 1), (10, 90), (1, 2)], budget=150) == [[1], [2, 0]]
    assert length_batches([(1, 1), (10, 90), (1, 2)], budget=150, solo_tokens=100) == [[1], [2, 0]]
    assert length_batches([(1, 1), (10, 90), (1, 2)], budget=1000) == [[1, 2, 0]]
    assert length_batches([(1, 1), (10, 90), (1, 2)], budget=1000, solo_tokens=100) == [[1], [2, 0]]
    assert length_batches([], budget=10, solo_tokens=1) == []


def _batch(widths: list[tuple[int, int]]) -> RoleBatch:
    """A RoleBatch whose every field names its row: token ids, advantages and log-probs are the row's index."""
    n, p, t = len(widths), max(a for a, _ in widths), max(b for _, b in widths)
    prompt_ids, prompt_mask = torch.zeros(n, p, dtype=torch.long), torch.zeros(n, p, dtype=torch.long)
    completion_ids, completion_mask = torch.zeros(n, t, dtype=torch.long), torch.zeros(n, t, dtype=torch.long)
    for i, (a, b) in enumerate(widths):
        prompt_ids[i, p - a:], prompt_mask[i, p - a:] = i, 1  # left-padded
        completion_ids[i, :b], completion_mask[i, :b] = i, 1  # right-padded
    index = torch.arange(n, dtype=torch.float32)
    tokens = Tokens(prompt_ids, prompt_mask, completion_ids, completion_mask)
    return RoleBatch(role="drafter", adapter="A", tokens=tokens, advantages=index.clone(),
                     group_ids=torch.arange(n) // 2, batch_tokens=float(completion_mask.sum()), batch_rows=n,
                     frac_zero_std=0.0, old_logps=index[:, None].expand(n, t) * completion_mask,
                     ref_logps=-index[:, None].expand(n, t) * completion_mask)


def test_a_micro_batch_cuts_every_field_by_the_rows_it_names():
    batch = _batch(WIDTHS)
    seen = []
    for mb in batch.micro_batches(200, max_rows=4, solo_tokens=100):
        assert mb.rows is not None and len(mb) == len(mb.rows)
        seen += mb.rows.tolist()
        rows = mb.rows
        assert torch.equal(mb.advantages, rows.float())
        assert torch.equal(mb.group_ids, rows // 2)
        assert torch.equal(mb.tokens.prompt_ids.max(1).values, rows)
        assert torch.equal(mb.tokens.completion_ids.max(1).values, rows)
        assert torch.equal(mb.tokens.completion_mask.sum(1), torch.tensor([WIDTHS[i][1] for i in rows.tolist()]))
        assert torch.equal(mb.old_logps.max(1).values, rows.float())
        assert torch.equal(mb.ref_logps.min(1).values, -rows.float())
        assert mb.batch_tokens == batch.batch_tokens and mb.batch_rows == batch.batch_rows
    assert sorted(seen) == list(range(len(WIDTHS))) and seen != sorted(seen)  # every row, and not in order
    # a micro-batch of a micro-batch still names rows of the whole batch
    first = next(batch.micro_batches(10_000))
    assert torch.equal(first[torch.tensor([2, 0])].rows, first.rows[[2, 0]])


def test_in_place_undoes_the_micro_batches_permutation():
    batch = _batch(WIDTHS)
    parts = [(mb.rows, mb.old_logps) for mb in batch.micro_batches(200, max_rows=4, solo_tokens=100)]
    assert torch.equal(in_place(parts, len(batch)), batch.old_logps)
    assert not torch.equal(torch.cat([v for _, v in parts]), batch.old_logps)  # concatenated, they are permuted
    with pytest.raises(ValueError, match="not each of"):
        in_place(parts[1:], len(batch))
    with pytest.raises(ValueError, match="not each of"):
        in_place(parts + parts[:1], len(batch))
