"""Target sum: the search, the grading, the recap, the wrong drafts and the warm start's challenges."""

from __future__ import annotations

import hashlib
import itertools
import random

import pytest

from agon.checks import compose_config, validate
from agon.config import ConfigError
from agon.tasks import Problem, build_task
from agon.tasks.target_sum import chain_value, parse, search


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
    """Reuse re-derives the chain the recap states and adds the last step: n - 1 steps, not the search."""
    p = _problem("9?8?7?3=-3")
    reuse = "<think>9-8=1;1-7=-6;-6+3=-3</think>9-8=1;1-7=-6\\boxed{9-8-7+3}"
    seen = {task.warm_start_challenge(p, False, random.Random(seed)) for seed in range(40)}
    assert seen == {reuse, task.worked_solution(p)}
    # after a wrong recap (only when the warm start shows any): the search, never a reuse
    assert {task.warm_start_challenge(p, True, random.Random(seed)) for seed in range(40)} == {task.worked_solution(p)}
    always = build_task(compose_config(["task=target_sum", "task.warm_start_reuse=1.0"]).task)
    assert {always.warm_start_challenge(p, False, random.Random(s)) for s in range(10)} == {reuse}


def test_the_warm_start_shows_no_wrong_recap_unless_asked():
    """With warm_start_wrong_recaps=0 every challenge's recap is a right chain's; at 0.3 some are not."""
    from agon.world import _warm_start_texts, build_tokenizer

    tok = build_tokenizer()
    for share, expect_wrong in ((0.0, False), (0.3, True)):
        t = build_task(compose_config(["task=target_sum", "task.train_size=500",
                                       f"task.warm_start_wrong_recaps={share}"]).task)
        pool = list(t.train_problems())
        by_id = {p.id: p for p in pool}
        wrong = 0
        for prompt, _ in _warm_start_texts(t, pool, 400, random.Random(0), tok):
            body = prompt.split("<|im_start|>u")[1].split("<|im_end|>")[0]
            if "|" in body:
                question, recap = body.split("|")
                wrong += recap != t.recap(t.worked_solution(by_id[question]))
        assert (wrong > 0) is expect_wrong, share


def test_the_arithmetic_warm_start_data_did_not_move():
    """The challenge hook and the wrong-recap share left the arithmetic world's warm-start stream as it was (so the
    shipped bases are what a rebuild makes): a hash of its first 256 pairs, recorded before the change."""
    from agon.world import _warm_start_texts, build_tokenizer, world_task_cfg

    t = build_task(world_task_cfg(compose_config([]).task))
    pairs = _warm_start_texts(t, list(t.train_problems())[:500], 256, random.Random(0), build_tokenizer())
    assert hashlib.sha256(repr(pairs).encode()).hexdigest()[:16] == "fc1de74a9b9c2a19"


@pytest.mark.parametrize("override,key", [
    ("task.min_terms=1", "task.min_terms"),
    ("task.max_terms=2", "task.min_terms"),
    ("task.warm_start_wrong_recaps=1.5", "task.warm_start_wrong_recaps"),
    ("task.warm_start_reuse=-0.1", "task.warm_start_reuse"),
])
def test_bad_settings_name_their_key(override, key):
    cfg = compose_config(["task=target_sum", override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)


def test_the_world_is_its_own_and_every_key_moves_it():
    from agon.world import world_key, world_task_cfg

    base = compose_config(["task=target_sum"])
    key = world_key(base.model, world_task_cfg(base.task))
    assert key != world_key(base.model, world_task_cfg(compose_config([]).task))
    for override in ("task.max_operand=8", "task.warm_start_reuse=0.4", "task.warm_start_wrong_recaps=0.3",
                     "task.min_terms=2", "task.train_size=1000"):
        cfg = compose_config(["task=target_sum", override])
        assert world_key(cfg.model, world_task_cfg(cfg.task)) != key, override
