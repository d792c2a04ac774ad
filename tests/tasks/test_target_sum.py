"""Target sum: the search, the grading, the recap, the wrong drafts and the warm start's challenges."""

from __future__ import annotations

import hashlib
import itertools
import random

import pytest

from agon.training.checks import compose_config, validate
from agon.core.config import ConfigError
from agon.tasks import Problem, build_task
from agon.tasks.target_sum import chain_value, parse, recap_text, search


@pytest.fixture(scope="module")
def task():
    return build_task(compose_config(["task=target_sum", "task.train_size=2000"]).task)


def _problem(q: str) -> Problem:
    return Problem(q, q, None)


def test_the_worked_search_by_hand(task):
    """Depth first, + before -: the first leaf 2+1+1=4 misses, the second 2+1-1=2 hits."""
    p = _problem("2?1?1=2")
    # leaves in order: 2+1+1=4, 2+1-1=2 (hit)
    assert task.worked_solution(p) == "<think>2+1=3;3+1=4;3-1=2</think>2+1=3\\boxed{2+1-1}"
    assert task.recap(task.worked_solution(p)) == "2+1=3"
    q = _problem("9?8?7?3=-3")
    text = task.worked_solution(q)
    assert text.startswith("<think>9+8=17;17+7=24;24+3=27;24-3=21;17-7=10;") and text.endswith("\\boxed{9-8-7+3}")
    assert task.recap(text) == "9-8=1;1-7=-6"


def test_every_answer_that_reaches_the_target_is_right(task):
    """7?3?5?2=7 has two chains that reach 7 (7+3-5+2? 7, and 7-3+5-2? 7); both are right, the rest wrong."""
    p = _problem("7?3?5?2=7")
    verdicts = {}
    for signs in itertools.product("+-", repeat=3):
        chain = "7" + "".join(s + x for s, x in zip(signs, "352"))
        verdicts[chain] = task.verify([p], [f"<think>x</think>\\boxed{{{chain}}}"])[0].correct
    assert {c for c, ok in verdicts.items() if ok} == {"7+3-5+2", "7-3+5-2"}


@pytest.mark.parametrize("answer,why", [
    ("7+3-5+2", "right"),
    ("7+3+2-5", "operands out of order"),
    ("7+3-5", "an operand missing"),
    ("7+3-5+2+0", "an operand added"),
    ("7", "no chain"),
    ("-7+3+5+2-2", "a leading sign"),
    ("7 + 3 - 5 + 2", "spaces inside the chain"),
])
def test_grading(task, answer, why):
    p = _problem("7?3?5?2=7")
    got = task.verify([p], [f"<think>x</think>\\boxed{{{answer}}}"])[0]
    assert got.correct is (why == "right"), why
    assert got.format_ok


def test_two_boxes_no_box_or_an_open_think_are_wrong(task):
    p = _problem("7?3?5?2=7")
    texts = ["<think>x</think>\\boxed{7+3-5+2}\\boxed{7-3+5-2}", "<think>x</think>7+3-5+2",
             "<think>x \\boxed{7+3-5+2}"]
    got = task.verify([p] * 3, texts)
    assert [v.correct for v in got] == [False, False, False]
    assert [v.status for v in got] == ["wrong", "no_answer", "no_answer"]


def test_problems_are_solvable_and_the_split_is_fixed_and_disjoint(task):
    held = task.heldout_problems()
    assert len(held) == 300 and [p.id for p in held] == [p.id for p in build_task(task.cfg).heldout_problems()]
    assert not {p.id for p in held} & {p.id for p in task.train_problems()}
    for p in list(held) + list(task.train_problems())[:500]:
        operands, target = parse(p.question)
        assert 3 <= len(operands) <= 4 and all(1 <= x <= 9 for x in operands)
        assert task.verify([p], [task.worked_solution(p)])[0].correct
        assert task.verify([p], [f"<think>x</think>\\boxed{{{p.answer}}}"])[0].correct
    assert {len(parse(p.question)[0]) for p in held} == {3, 4}
    # the knobs move the problems: min_terms, max_terms, max_operand
    small = build_task(compose_config(["task=target_sum", "task.min_terms=2", "task.max_terms=2",
                                       "task.max_operand=5", "task.train_size=20", "task.heldout_size=20"]).task)
    for p in list(small.heldout_problems()) + list(small.train_problems()):
        operands, _ = parse(p.question)
        assert len(operands) == 2 and max(operands) <= 5
    assert len(small.train_problems()) == 20  # of the 50 two-operand problems, 20 held out


def test_a_wrong_draft_is_a_search_stopped_at_a_chain_that_misses(task):
    """Its steps are right and its sum is not: one step (the last sign) shows it, and its recap differs from the
    right one wherever the chains differ before the last gap."""
    rng = random.Random(0)
    differ = 0
    for p in list(task.heldout_problems())[:100]:
        operands, target = parse(p.question)
        bad = task.worked_solution(p, rng)
        if all(chain_value(s, operands) == target for s in itertools.product("+-", repeat=len(operands) - 1)):
            continue  # every chain reaches the target: there is no wrong one
        assert not task.verify([p], [bad])[0].correct
        steps = bad.split("</think>")[0].removeprefix("<think>").split(";")
        for step in steps:  # every step of the stopped search is right arithmetic: "a+b=c", a may be negative
            left, right = step.split("=")
            cut = max(left.rfind("+"), left.rfind("-"))
            a, b = int(left[:cut]), int(left[cut + 1:])
            assert (a + b if left[cut] == "+" else a - b) == int(right), step
        differ += task.recap(bad) != task.recap(task.worked_solution(p))
    assert differ > 30


def test_search_refuses_an_unreachable_target():
    with pytest.raises(ValueError, match="reaches 99"):
        search([1, 2, 3], 99)


def test_the_warm_start_challenge_reuses_a_right_recap_or_searches(task):
    """After a right recap the answer is the leaf test of the last gap, the recap reused and the chain boxed: the
    sign is chosen by computing, + first as in the search. warm_start_reuse below 1 searches from scratch instead."""
    p = _problem("9?8?7?3=-3")
    reuse = "<think>-6+3=-3</think>9-8=1;1-7=-6\\boxed{9-8-7+3}"
    assert task.recap_kinds(p)["right"] == [("-", "-")]
    assert task.answer_recap(p, ("-", "-")) == reuse
    assert {task.warm_start_pair(p, False, random.Random(seed)) for seed in range(20)} == {("9-8=1;1-7=-6", reuse)}
    # the leaf test's + misses, its - hits: both leaves are written
    q = _problem("2?1?1=2")
    assert task.answer_recap(q, ("+",)) == "<think>3+1=4;3-1=2</think>2+1=3\\boxed{2+1-1}"
    half = build_task(compose_config(["task=target_sum", "task.warm_start_reuse=0.5"]).task)
    seen = {half.warm_start_pair(p, False, random.Random(s))[1] for s in range(40)}
    assert seen == {reuse, task.worked_solution(p)}


def test_a_dead_end_recap_is_refuted_by_the_leaf_test_then_searched(task):
    """9+8+7 leaves 24, and neither 24+3 nor 24-3 is -3: the two leaves show it, then the search from scratch
    (the drafter's own text) finds the chain; the recap and box are the found chain's, not the rival's."""
    p = _problem("9?8?7?3=-3")
    assert task.recap_kinds(p)["dead_end"] == [("+", "+"), ("+", "-"), ("-", "+")]
    assert task.recap_kinds(p)["extendable"] == []
    text = task.answer_recap(p, ("+", "+"))
    assert text == "<think>24+3=27;24-3=21;" + task.worked_solution(p).removeprefix("<think>")
    assert task.verify([p], [text])[0].correct and task.recap(text) == "9-8=1;1-7=-6"


def test_an_extendable_recap_is_finished_with_the_sign_the_leaf_test_picks(task):
    """7?3?5?2=7: the search finds 7+3-5+2 (prefix +-); 7-3+5 (a draft that ended -3+5+2=11, wrong in its last
    sign) is extendable: 9+2 misses, 9-2 hits, and the answer reuses that recap rather than the search's chain."""
    p = _problem("7?3?5?2=7")
    kinds = task.recap_kinds(p)
    assert kinds["right"] == [("+", "-")] and kinds["extendable"] == [("-", "+")]
    assert kinds["dead_end"] == [("+", "+"), ("-", "-")]
    text = task.answer_recap(p, ("-", "+"))
    assert text == "<think>9+2=11;9-2=7</think>7-3=4;4+5=9\\boxed{7-3+5-2}"
    assert task.verify([p], [text])[0].correct
    # a wrong recap is the extendable one half the time, the dead ends the rest
    drawn = {task.warm_start_pair(p, True, random.Random(s))[0] for s in range(40)}
    assert drawn == {"7-3=4;4+5=9", "7+3=10;10+5=15", "7-3=4;4-5=-1"}


def test_every_warm_start_answer_is_right_and_fits_the_token_budget():
    """Over 4-operand problems, every kind of recap: the answer grades right, its recap is the recap it read where
    that was live, and it fits experiment=target_sum's max_new_tokens with the end of turn (the longest, a dead
    end's check and search, is 152 tokens of 160)."""
    from agon.models.world import build_tokenizer

    cfg = compose_config(["experiment=target_sum", "task.train_size=1500"])
    t, tok = build_task(cfg.task), build_tokenizer()
    texts = []
    for p in t.train_problems():
        operands = parse(p.question)[0]
        for kind, prefixes in t.recap_kinds(p).items():
            for prefix in prefixes:
                text = t.answer_recap(p, prefix)
                assert t.verify([p], [text])[0].correct, (p.id, prefix)
                if kind != "dead_end":
                    assert t.recap(text) == recap_text(prefix, operands)
                texts.append(text + tok.eos_token)
    longest = max(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"])
    assert 140 < longest <= cfg.trainer.max_new_tokens


def test_the_warm_start_shows_no_wrong_recap_unless_asked():
    """With warm_start_wrong_recaps=0 every challenge's recap is a right chain's; at 0.3 (the default) about 27%
    of them are dead ends and 3% extendable (the extendable kind exists on about one problem in five)."""
    from agon.models.world import _warm_start_texts, build_tokenizer

    tok = build_tokenizer()
    for share in (0.0, 0.3):
        t = build_task(compose_config(["experiment=target_sum", "task.train_size=500",
                                       f"task.warm_start_wrong_recaps={share}"]).task)
        pool = list(t.train_problems())
        by_id = {p.id: p for p in pool}
        seen = {"right": 0, "extendable": 0, "dead_end": 0}
        for prompt, answer in _warm_start_texts(t, pool, 2000, random.Random(0), tok):
            body = prompt.split("<|im_start|>u")[1].split("<|im_end|>")[0]
            if "|" in body:
                question, recap = body.split("|")
                p, operands = by_id[question], parse(question)[0]
                kind = next(k for k, v in t.recap_kinds(p).items() if recap in [recap_text(x, operands) for x in v])
                seen[kind] += 1
                assert t.verify([p], [answer.removesuffix(tok.eos_token)])[0].correct
        challenges = sum(seen.values())
        if share == 0:
            assert seen["extendable"] == seen["dead_end"] == 0 < seen["right"]
        else:
            assert 0.23 < seen["dead_end"] / challenges < 0.31 and 0.01 < seen["extendable"] / challenges < 0.06


def test_the_share_of_challenge_rows_is_a_key():
    """task.warm_start_challenges is the share of the warm start's rows that read a rival's recap: 0 gives plain
    problems only, 1 challenges only, and 0.85 about that share (over 2,000 rows: within 0.03)."""
    from agon.models.world import _warm_start_texts, build_tokenizer

    tok = build_tokenizer()
    for share in (0.0, 0.85, 1.0):
        t = build_task(compose_config(["experiment=target_sum", "task.train_size=300",
                                       f"task.warm_start_challenges={share}"]).task)
        pairs = _warm_start_texts(t, list(t.train_problems()), 2000, random.Random(0), tok)
        bodies = [prompt.split("<|im_start|>u")[1].split("<|im_end|>")[0] for prompt, _ in pairs]
        challenges = sum("|" in body for body in bodies) / len(pairs)
        assert abs(challenges - share) < 0.03, (share, challenges)


def test_the_arithmetic_warm_start_data_did_not_move():
    """The challenge hook and the wrong-recap share left the arithmetic world's warm-start stream as it was (so the
    shipped bases are what a rebuild makes): a hash of its first 256 pairs, recorded before the change."""
    from agon.models.world import _warm_start_texts, build_tokenizer, world_task_cfg

    t = build_task(world_task_cfg(compose_config([]).task))
    pairs = _warm_start_texts(t, list(t.train_problems())[:500], 256, random.Random(0), build_tokenizer())
    assert hashlib.sha256(repr(pairs).encode()).hexdigest()[:16] == "fc1de74a9b9c2a19"


@pytest.mark.parametrize("override,key", [
    ("task.min_terms=1", "task.min_terms"),
    ("task.max_terms=2", "task.min_terms"),
    ("task.warm_start_wrong_recaps=1.5", "task.warm_start_wrong_recaps"),
    ("task.warm_start_reuse=-0.1", "task.warm_start_reuse"),
    ("task.warm_start_challenges=1.2", "task.warm_start_challenges"),
])
def test_bad_settings_name_their_key(override, key):
    cfg = compose_config(["task=target_sum", override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)


def test_the_world_is_its_own_and_every_key_moves_it():
    from agon.models.world import world_key, world_task_cfg

    base = compose_config(["task=target_sum"])
    key = world_key(base.model, world_task_cfg(base.task))
    assert key != world_key(base.model, world_task_cfg(compose_config([]).task))
    for override in ("task.max_operand=8", "task.warm_start_reuse=0.4", "task.warm_start_wrong_recaps=0.2",
                     "task.min_terms=2", "task.train_size=1000", "task.warm_start_challenges=0.9"):
        cfg = compose_config(["task=target_sum", override])
        assert world_key(cfg.model, world_task_cfg(cfg.task)) != key, override
    # the study's 4-operand world (experiment=target_sum, the shipped base) is not the task's 3-4 one
    study = compose_config(["experiment=target_sum"])
    assert world_key(study.model, world_task_cfg(study.task)) != key


def test_a_new_warm_start_design_is_a_new_world(monkeypatch):
    """The warm start's texts are code, not keys: its design number is part of the world key, so a cache built by
    the first design (reuse half the right recaps, no wrong ones) is never loaded for the second."""
    from agon.tasks import target_sum
    from agon.models.world import world_key, world_task_cfg

    cfg = compose_config(["experiment=target_sum"])
    key = world_key(cfg.model, world_task_cfg(cfg.task))
    monkeypatch.setattr(target_sum, "WARM_START_DESIGN", target_sum.WARM_START_DESIGN - 1)
    assert world_key(cfg.model, world_task_cfg(cfg.task)) != key
