"""The built-in arithmetic task: worked solutions, verification, a fixed held-out split disjoint from training."""

from __future__ import annotations

import random

from omegaconf import OmegaConf

from agon.core.config import ArithmeticTaskConfig
from agon.tasks import build_task
from agon.tasks.arithmetic import evaluate, worked_solution


def _task(**kw):
    return build_task(OmegaConf.structured(ArithmeticTaskConfig(heldout_size=50, train_size=500, **kw)))


def test_worked_solution_by_hand():
    assert evaluate("93+1-38") == 56
    assert worked_solution("93+1-38") == "<think>93+1=94;94-38=56</think>93+1=94\\boxed{56}"


def test_reference_solutions_verify_and_corrupted_ones_do_not():
    task = _task()
    problems = list(task.heldout_problems())
    good = task.verify(problems, [worked_solution(p.question) for p in problems])
    assert all(v.correct and v.format_ok and v.status == "ok" for v in good)
    rng = random.Random(0)
    bad = task.verify(problems, [worked_solution(p.question, rng) for p in problems])
    assert not any(v.correct for v in bad)


def test_format_failures():
    task = _task()
    p = task.heldout_problems()[0]
    verdicts = task.verify([p] * 4, [f"\\boxed{{{p.answer}}}",  # no reasoning block
                                     f"<think>x</think>{p.answer}",  # no box
                                     f"<think>x</think>\\boxed{{{p.answer}}}\\boxed{{{p.answer}}}",  # two boxes
                                     ""])
    assert [v.correct for v in verdicts] == [False] * 4
    assert [v.status for v in verdicts] == ["no_answer", "no_answer", "wrong", "no_answer"]


def test_heldout_is_fixed_and_disjoint_from_training():
    one, two = _task(), _task()
    held = [p.id for p in one.heldout_problems()]
    assert held == [p.id for p in two.heldout_problems()] and len(set(held)) == 50
    assert not set(held) & {p.id for p in one.train_problems()}
    assert len(one.train_problems()) == 500
