"""A task family of its own: sums whose operands are all doubled in the statement (``double:1+2`` is 2+4), with a
setting of its own, ``factor``. It reuses the arithmetic task's drawing and worked solutions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from agon.core.config import ArithmeticTaskConfig
from agon.tasks import Problem, register_task
from agon.tasks.arithmetic import ArithmeticTask, evaluate, worked_solution


@dataclass
class ScaledSumsConfig(ArithmeticTaskConfig):
    kind: str = "scaled_sums"
    name: str = "scaled_sums"
    # every operand is multiplied by this before the sum is worked
    factor: int = 2


def scaled(expr: str, factor: int) -> str:
    """``1+2-3`` with every operand times ``factor``."""
    out, number = "", ""
    for ch in expr + "\0":
        if ch.isdigit():
            number += ch
            continue
        if number:
            out += str(int(number) * factor)
            number = ""
        if ch != "\0":
            out += ch
    return out


@register_task("scaled_sums", schema=ScaledSumsConfig)
class ScaledSumsTask(ArithmeticTask):
    def _problem(self, expr: str) -> Problem:
        worked = scaled(expr, int(self.cfg.factor))
        return Problem(id=worked, question=worked, answer=str(evaluate(worked)))

    def heldout_problems(self) -> Sequence[Problem]:
        return [self._problem(e) for e in self._heldout]

    def worked_solution(self, problem: Problem, corrupt_rng=None) -> str:
        return worked_solution(problem.question, corrupt_rng)
