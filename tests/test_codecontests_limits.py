"""Per-problem resource limits read from the problem's own metadata (``CodeContestsTask`` in the real sandbox).

CodeContests gives each problem its own time and memory limit (``to_problem`` keeps them in ``problem.meta``,
capped by the task's). A grader that runs every program under the task's defaults instead passes solutions the
problem's limits would fail: too slow or too large for the problem, graded right. The test's problems carry limits
far below the defaults, and a program inside the defaults but over the problem's limit must fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agon.training.checks import compose_config
from agon.tasks import Problem, build_task

FIXTURE = Path(__file__).parent / "tasks" / "fixtures" / "codecontests.jsonl"
BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5:\n    pass\nprint(42)"
LARGE = "b = bytearray(200 * 1024 * 1024)\nb[::4096] = b'x' * len(b[::4096])\nprint(42)"


def _answer(code: str) -> str:
    return f"<think>work it out</think>Here it is.\n```python\n{code}\n```\n"


@pytest.fixture(scope="module")
def task():
    cfg = compose_config(["task=codecontests", f"task.source={FIXTURE}", "task.heldout_size=0",
                          "task.time_limit_s=6", "task.memory_mb=1024"]).task
    t = build_task(cfg)
    yield t
    t.close()


def _problem(**limits) -> Problem:
    return Problem("codecontests/limits", "Print 42.", None, {"tests": (("\n", "42\n"),), "n_public": 1, **limits})


@pytest.mark.parametrize("code,limits", [(BUSY, {"time_limit_s": 0.5}), (LARGE, {"memory_mb": 64})],
                         ids=["time", "memory"])
def test_a_problems_own_limit_decides_not_the_tasks_default(task, code, limits):
    """Catches a per-problem limit ignored in favour of the config's default: the same program passes under the
    task's default (a problem without limits of its own) and fails under the problem's lower limit."""
    assert all(v < task.cfg[k] for k, v in limits.items()), "premise: the problem's limit is below the default"
    free, limited = task.verify([_problem(), _problem(**limits)], [_answer(code)] * 2)
    assert (free.status, free.correct) == ("ok", True), free.detail
    assert (limited.status, limited.correct) == ("wrong", False), limited.detail
