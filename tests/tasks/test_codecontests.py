"""CodeContests loader, easy filter, answer extraction, output matching and sandboxed grading, on a fixture in
the dataset's schema."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agon.tasks import build_task
from agon.tasks.codecontests import CodeContestsTask, extract_code, outputs_match
from agon.tasks.deepmath import DatasetUnavailableError
from agon.tasks.sandbox import RunRequest, RunResult

FIXTURE = Path(__file__).parent / "fixtures" / "codecontests.jsonl"
EASY = {"codecontests/1_A. Sum of Two", "codecontests/2_A. Mean Value", "codecontests/EVENODD"}


@pytest.fixture
def make(compose_task):
    def make(*overrides: str, **kw) -> CodeContestsTask:
        cfg = compose_task("codecontests", f"source={FIXTURE}", "heldout_size=1", *overrides)
        task = CodeContestsTask(cfg, **kw) if kw else build_task(cfg)
        assert isinstance(task, CodeContestsTask)
        return task

    return make


@pytest.fixture
def task(make):
    t = make("heldout_size=0", "time_limit_s=1")
    yield t
    t.close()


def by_name(task: CodeContestsTask, name: str):
    return next(p for p in task.train_problems() if p.meta["name"] == name)


def answer(code: str, chat: str = "Here is my solution.") -> str:
    return f"<think>work it out</think>{chat}\n```python\n{code}\n```\n"


# ---------------------------------------------------------------------------------------------------------------
# loading and filtering


def test_yaml_defaults(compose_task):
    cfg = compose_task("codecontests")
    assert (cfg.kind, cfg.source, cfg.max_cf_rating, cfg.max_generated_tests) == (
        "codecontests", "deepmind/code_contests", 1200, 20,
    )
    assert cfg.easy_only and list(cfg.easy_difficulties) == [1, 7] and "```python" in cfg.instruction


def test_easy_filter(make):
    t = make()
    train, held = t.train_problems(), t.heldout_problems()
    assert {p.id for p in [*train, *held]} == EASY and len(held) == 1
    assert not {p.id for p in train} & {p.id for p in held}
    # file I/O, "<image>" and Python-2-only problems stay out; the rating cut is configurable
    loose = make("easy_only=false", "require_python_solution=false")
    names = {p.meta["name"] for p in [*loose.train_problems(), *loose.heldout_problems()]}
    assert names == {"1_A. Sum of Two", "2_A. Mean Value", "EVENODD", "3_E. Hard Trees", "7_A. Old Python"}
    strict = make("max_cf_rating=900", "easy_difficulties=[]", "heldout_size=0")
    assert [p.meta["name"] for p in strict.train_problems()] == ["1_A. Sum of Two"]


def test_tests_and_limits(make):
    t = make("heldout_size=0")
    ab = by_name(t, "1_A. Sum of Two")
    assert len(ab.meta["tests"]) == 1 + 2 + 5 and ab.meta["n_public"] == 1
    assert ab.meta["time_limit_s"] == 4.0 and ab.meta["memory_mb"] == 256  # min(4, 2 x 2 s); the problem's 256 MB
    even = by_name(t, "EVENODD")
    assert even.meta["time_limit_s"] == 4.0 and even.meta["memory_mb"] == 512  # no limits given: the task's
    capped = make("heldout_size=0", "max_generated_tests=2")
    assert len(by_name(capped, "1_A. Sum of Two").meta["tests"]) == 1 + 2 + 2


def test_heldout_from_another_split(make, tmp_path):
    shutil.copy(FIXTURE, tmp_path / "train-00000-of-00001.jsonl")
    shutil.copy(FIXTURE, tmp_path / "test-00000-of-00001.jsonl")
    t = make(f"source={tmp_path}", "heldout_split=test", "heldout_size=2")
    assert len(t.heldout_problems()) == 2 and len(t.train_problems()) == 1
    assert not {p.id for p in t.train_problems()} & {p.id for p in t.heldout_problems()}


def test_unreachable_hub_gives_one_clear_error(make):
    with pytest.raises(DatasetUnavailableError, match="(?s)CodeContests.*task.source=/path/to/code_contests"):
        make("source=deepmind/code_contests")


# ---------------------------------------------------------------------------------------------------------------
# extraction and matching


def test_extract_code_takes_the_last_python_block_after_think():
    text = (
        "<think>```python\nprint('draft')\n```</think>"
        "First try:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```"
    )
    assert extract_code(text).strip() == "print(2)"
    assert extract_code("<think>```python\nprint(1)\n```") is None  # never closed the reasoning
    assert extract_code("<think>x</think>no code here") is None
    assert extract_code("<think>x</think>```python\nprint(1)\n") is None  # truncated block
    assert extract_code("<think>x</think>```cpp\nint main(){}\n```") is None


def test_recap_drops_the_final_program(task):
    text = "<think>secret</think>Idea: add them.\n```python\nprint(sum(map(int, input().split())))\n```\nDone."
    assert task.recap(text) == "Idea: add them.\n\nDone."
    assert task.recap("<think>no close") == ""


@pytest.mark.parametrize(
    "expected, actual, ok",
    [
        ("3\n", "3", True),
        ("1 2\n3 4\n", "  1\t2 3\n\n4 ", True),  # whitespace is only a separator
        ("YES\n", "yes\n", True),  # case-insensitive
        ("2.500000\n", "2.5\n", True),  # floats within 1e-5
        ("1.3333333\n", "1.33333\n", True),
        ("1.5\n", "1.5001\n", False),
        ("10\n", "10.0\n", True),  # not both integers: compared as numbers
        ("10\n", "11\n", False),
        ("1\n2\n3\n", "1\n2\n", False),  # token counts must match (a zip-based check would pass this)
        ("1\n2\n", "1\n2\n3\n", False),
        ("abc\n", "abd\n", False),
        ("", "", True),
        ("nan\n", "nan\n", True),
    ],
)
def test_outputs_match(expected, actual, ok):
    assert outputs_match(expected, actual) is ok


# ---------------------------------------------------------------------------------------------------------------
# grading in the sandbox

AB_OK = "a, b = map(int, input().split())\nprint(a + b)"


def test_verify_correct_and_incorrect_programs(task):
    ab, mean, even = by_name(task, "1_A. Sum of Two"), by_name(task, "2_A. Mean Value"), by_name(task, "EVENODD")
    cases = [
        (ab, answer(AB_OK), "ok", True),
        (ab, answer("a, b = map(int, input().split())\nprint(a - b)"), "wrong", False),
        (ab, answer("print(3)"), "wrong", False),  # passes the public test only
        (mean, answer("n = int(input())\nxs = list(map(int, input().split()))\nprint(round(sum(xs) / n, 5))"),
         "ok", True),
        (even, answer("print('yes' if int(input()) % 2 == 0 else 'no')"), "ok", True),
        (ab, "<think>x</think>The answer is a+b.", "no_answer", False),
        (ab, f"<think>unclosed\n```python\n{AB_OK}\n```", "no_answer", False),
    ]
    got = task.verify([c[0] for c in cases], [c[1] for c in cases])
    for (problem, completion, status, correct), v in zip(cases, got):
        assert (v.status, v.correct) == (status, correct), (problem.meta["name"], completion, v)
    assert got[0].detail == "passed 8 tests" and got[0].format_ok
    assert got[2].detail.startswith("test 2/8 (hidden): wrong answer")
    assert not got[5].format_ok


@pytest.mark.parametrize(
    "code, why",
    [
        ("import sys\nsys.exit(0)\n" + AB_OK, "wrong answer"),  # exit 0 before the work: no output, no pass
        ("import os\nos._exit(0)\n" + AB_OK, "wrong answer"),
        ("import sys\nprint(3)\nsys.exit(0)", "wrong answer"),
        ("def solve(:\n    pass", "runtime_error"),
        ("a = input()\nb = input()\nprint(a)", "runtime_error"),  # reads past the end of input
        ("while True:\n    pass", "timeout"),
        ("x = bytearray(10**10)", "memory"),
        ("import sys\nwhile True:\n    sys.stdout.write('3 ' * 10000)", "output_limit"),
    ],
)
def test_hostile_or_broken_programs_score_zero(task, code, why):
    (v,) = task.verify([by_name(task, "1_A. Sum of Two")], [answer(code)])
    assert (v.correct, v.status) == (False, "wrong") and why in v.detail and not v.failed


class BrokenSandbox:
    """A stand-in remote sandbox that is down: its failures are the verifier's, counted, never the model's."""

    isolation = "remote"

    def run(self, req: RunRequest) -> RunResult:
        return RunResult("sandbox_error", None, "", "", False, 0.0, "service unavailable")


def test_sandbox_failure_is_a_counted_error(make):
    t = make("heldout_size=0", sandbox=BrokenSandbox())
    (v,) = t.verify([by_name(t, "1_A. Sum of Two")], [answer(AB_OK)])
    assert v.status == "error" and v.failed and "service unavailable" in v.detail
    t.close()
