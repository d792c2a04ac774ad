"""CodeContests loader, easy filter, answer extraction, output matching and sandboxed grading, on a fixture in
the dataset's schema."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path

import pytest

from agon.tasks import Problem, build_task
from agon.tasks.codecontests import (
    CodeContestsTask,
    drop_reason,
    extract_code,
    keep_problem,
    output_cap,
    outputs_match,
    stated_any_case,
    stated_tolerance,
    to_problem,
)
from agon.tasks.deepmath import DatasetUnavailableError
from agon.tasks.sandbox import LocalSandbox, RunRequest, RunResult

FIXTURE = Path(__file__).parent / "fixtures" / "codecontests.jsonl"
# five Codeforces problems with their statements' samples: four whose answer is a word in a case the statement
# fixes (281A, 131A, 59A, 118A), one whose answer is YES/NO (4A)
CASE_FIXTURE = Path(__file__).parent / "fixtures" / "codecontests_case.jsonl"
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


def with_a_hidden_test(rows: list[dict], path: Path) -> Path:
    """``rows`` as a JSONL file, each example-only row given a private test, so that it passes that filter."""
    for row in rows:
        if not (row.get("private_tests") or {}).get("input"):
            row["private_tests"] = {"input": ["hidden\n"], "output": ["0\n"]}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_easy_filter(make, tmp_path):
    t = make()
    train, held = t.train_problems(), t.heldout_problems()
    assert {p.id for p in [*train, *held]} == EASY and len(held) == 1
    assert not {p.id for p in train} & {p.id for p in held}
    # file I/O, "<image>" and Python-2-only problems stay out; the rating cut is configurable. 3_E and 7_A have only
    # their examples in the fixture: a hidden test each keeps that filter out of this one's way
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    hidden = with_a_hidden_test(rows, tmp_path / "hidden.jsonl")
    loose = make(f"source={hidden}", "easy_only=false", "require_python_solution=false")
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


def row(name: str, public: dict, private: dict | None = None, generated: dict | None = None, **kw) -> dict:
    return {"name": name, "description": "Print it.", "public_tests": public, "private_tests": private or {},
            "generated_tests": generated or {}, "cf_rating": 800, "solutions": {"language": [3]}, **kw}


EX = {"input": ["1\n", "2\n"], "output": ["1\n", "4\n"]}


@pytest.mark.parametrize(
    "private, generated, overrides, reason",
    [
        ({}, {}, (), "examples only"),
        ({"input": ["2\n"], "output": ["4\n"]}, {}, (), "examples only"),  # a private copy of an example
        ({}, EX, (), "examples only"),  # generated copies of them
        ({}, {"input": ["3\n"], "output": ["9\n"]}, ("max_generated_tests=0",), "examples only"),  # not graded
        ({}, {"input": ["3\n"], "output": ["9\n"]}, (), None),
        ({"input": ["3\n"], "output": ["9\n"]}, {}, (), None),
    ],
)
def test_a_problem_whose_graded_tests_are_all_examples_is_dropped(compose_task, private, generated, overrides,
                                                                 reason):
    """Such a problem was kept, and a program that maps the examples to their outputs passed it."""
    cfg = compose_task("codecontests", *overrides)
    r = row("1_A. Squares", EX, private, generated)
    assert drop_reason(r, cfg) == reason and keep_problem(r, cfg) is (reason is None)


def test_the_examples_only_rows_of_a_split_are_counted_and_their_lookup_tables_get_nothing(make, caplog):
    # 3_E and 7_A have only their statements' examples: with the other filters off they were the loose pool's, and
    # `print('cba')` was a right answer to 7_A. The log says how many rows this filter removes
    with caplog.at_level(logging.INFO, logger="agon.tasks.codecontests"):
        loose = make("easy_only=false", "require_python_solution=false", "heldout_size=0")
    assert {p.meta["name"] for p in loose.train_problems()} == {"1_A. Sum of Two", "2_A. Mean Value", "EVENODD"}
    assert "3 of 7 problems in split 'train' pass the filters; dropped: <image> 1, examples only 2, file I/O 1" in (
        caplog.text)
    loose.close()


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
        ("YES\n", "yes\n", True),  # yes/no answers in any case
        ("Konjac\n", "konjac\n", False),  # any other word in its own case only
        ("2.500000\n", "2.5\n", True),  # a non-integer expected number: within 1e-6 (absolute or relative)
        ("1.3333333\n", "1.333333\n", True),
        ("1.3333333\n", "1.33333\n", False),  # 3.3e-6 off: passed the old 1e-5 matcher
        ("1.5\n", "1.5001\n", False),
        ("10\n", "10.0\n", False),  # an integer expected: only the same integer, written the same way
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


# the matcher is exact where the expected output is exact (testlib's rule): an integer only as the same text, a
# non-integer number within the tolerance decided in exact decimal arithmetic, everything else as the same text

BIG = "998244359987710471"
BIG_AS_FLOAT = "9.982443599877105e+17"


def test_a_big_integer_printed_as_a_float_is_wrong():
    # the trap is real: both are the same double (spacing 128 near 1e18), so the old matcher, which compared any pair
    # that was not two integers as floats (|x - y| < 1e-5), accepted this wrong answer
    assert float(BIG) == float(BIG_AS_FLOAT) and int(float(BIG_AS_FLOAT)) != int(BIG)
    assert not outputs_match(BIG, BIG_AS_FLOAT)
    assert not outputs_match(BIG, "998244359987710400") and not outputs_match(BIG, "998244359987710471.0")
    assert outputs_match(f"{BIG}\n", f"{BIG} \r\n")


@pytest.mark.parametrize(
    "expected, actual, ok",
    [
        ("7", "7", True),
        ("-7", "-7", True),
        ("0", "-0", False),  # testlib's readLong rejects -0, a leading + and leading zeros
        ("7", "+7", False),
        ("7", "007", False),
        ("7", "7.0", False),
        ("7", "7e0", False),
        ("-0", "0", False),  # the expected text is what is matched
        ("5" * 5000, "5" * 5000, True),  # past int()'s 4300-digit limit
        ("5" * 5000, "5" * 4999 + "4", False),
        ("5" * 5000, "5" * 4999 + "5.0", False),
    ],
)
def test_an_integer_matches_only_the_same_integer_written_the_same_way(expected, actual, ok):
    assert outputs_match(expected, actual) is ok


@pytest.mark.parametrize(
    "expected, actual, ok",
    [
        ("0.500000", "0.5", True),
        ("0.500000", "5e-1", True),  # any plain decimal form, exponent included
        ("0.500000", ".5", True),
        ("0.500000", "0.500001", True),  # exactly at the bound: |0.5 - e| <= 1e-6 * max(1, 0.5)
        ("0.500000", "0.499999", True),
        ("0.500000", "0.5000010000000001", False),  # just past it
        ("0.500000", "0.4999989999999999", False),
        ("1000000.0", "1000001.0", True),  # relative above 1: 1e-6 * 1e6 = 1
        ("1000000.0", "999999.0", True),
        ("1000000.0", "1000001.0000000001", False),
        ("1000000.0", "1000000", True),  # an integer is a number where a number is due
        ("-2.500000", "-2.5000025", True),
        ("-2.500000", "-2.5000025000001", False),
        ("-2.500000", "2.500000", False),
        ("0.000000", "-0.000000", True),  # a value comparison: -0.0 is 0
        ("0.000000", "1e-99999999", True),
        ("1.5e-7", "0", True),  # |e| < 1: absolute
        ("1.5E+10", "15000015000", True),
        ("1.5E+10", "15000015000.001", False),
    ],
)
def test_a_non_integer_number_matches_within_the_tolerance_at_its_exact_edge(expected, actual, ok):
    # a stated tolerance (rcmp's, absolute or relative); the fallback's absolute edge is tested below
    assert outputs_match(expected, actual, stated=True) is ok


@pytest.mark.parametrize(
    "expected, actual, ok",
    [
        ("0.500000", "0.500001", True),  # at the bound: the doubles' difference is 1.0000000000287557e-06
        ("0.1", "0.100001", True),
        ("2.5", "2.5000025000000000025", False),  # past the bound by 2.5e-18: the nearest double is the bound
        ("0.25", "0.250001000000000001", False),
    ],
)
def test_the_tolerance_is_decided_exactly_where_binary_floats_would_decide_wrongly(expected, actual, ok):
    x, y = float(expected), float(actual)
    assert (abs(x - y) <= 1e-6 * max(1.0, abs(x))) is not ok  # a float comparison gets each of these wrong
    assert outputs_match(expected, actual, stated=True) is ok


def test_the_tolerance_is_an_argument_and_a_word_matches_only_itself():
    assert outputs_match("0.5", "0.50009", 1e-4) and not outputs_match("0.5", "0.50011", 1e-4)
    assert outputs_match("0.5", "0.5000", 0) and not outputs_match("0.5", "0.5000001", 0)
    assert outputs_match("nan", "nan") and not outputs_match("nan", "NaN")  # a word, in its own case
    assert not outputs_match("nan", "nan0") and not outputs_match("inf", "infinity")
    assert not outputs_match("0.5", "0.50001", float("nan"))  # a bad tolerance is a mismatch, never a raise


@pytest.mark.parametrize(
    "expected, actual, ok",
    [
        ("2", "2.000000000", True),  # the jury's 2, printed by a program that prints reals
        ("2", "2", True),
        ("2", "2.0000020", True),  # at the edge, absolute
        ("2", "2.0000021", False),
        ("-3", "-3e0", True),
        ("0", "-0.000000", True),
        ("1000000", "1000001.0", True),  # relative: 1e-6 * 1e6
        ("1000000", "1000001.1", False),
        ("3 2\n", "3.0\n1.9999999999\n", True),
        ("2", "two", False),
        ("2", "2.0.0", False),
    ],
)
def test_with_a_stated_tolerance_every_number_compares_as_a_number(expected, actual, ok):
    """testlib's rcmp reads every token as a double; an integer-looking expected token had to match as text."""
    assert outputs_match(expected, actual, 1e-6, stated=True) is ok
    if expected != actual:  # without a stated tolerance an integer stays exact
        assert outputs_match(expected, actual, 1e-6) is False


@pytest.mark.parametrize(
    "expected, actual, ok",
    [
        # a half-integer answer near 5e17 computed through floats: 0.5 off, inside a relative 1e-6 (5e11)
        ("499999999999999999.5", "5e+17", False),
        ("499999999999999999.5", "500000000000000000.0", False),
        ("499999999999999999.5", "499999999999999999.5", True),
        ("499999999999999999.5", "499999999999999999.50", True),
        ("1000000.0", "1000001.0", False),  # relative above 1 passed this
        ("1000000.5", "1000000.500001", True),  # absolute 1e-6, at the edge
        ("1000000.5", "1000000.5000010001", False),
        ("0.50", "0.5", True),  # the same value in other digits
        ("0.5", "0.500000000", True),
        ("2.500000", "2.5", True),
        ("1.3333333", "1.333333", True),  # "at least six digits after the point"
        ("1.3333333", "1.33333", False),
        ("-2.5", "-2.5000010", True),
        ("-2.5", "-2.5000011", False),
    ],
)
def test_without_a_stated_tolerance_a_real_is_within_an_absolute_tolerance(expected, actual, ok):
    """The fallback was relative, so near 5e17 it took errors of 5e11: float-rounded answers to exact half-integer
    problems passed. A statement's own tolerance is still relative, as rcmp6 is."""
    assert outputs_match(expected, actual) is ok
    x, e = float(actual), float(expected)
    if not ok and abs(x - e) <= 1e-6 * max(1.0, abs(e)):
        assert outputs_match(expected, actual, stated=True)  # a stated 1e-6 takes it, as rcmp6 does


HOSTILE = [
    "nan", "NaN", "inf", "-inf", "Infinity", "1_000", "0x10", "0b1", "\u0663", "\u0661.\u0665", "\uff11",
    "1e999999999999999999999", "1e-999999999999999999999", "9" * 100_000, "9" * 100_000 + "e-99999",
    "1" + "0" * 100_000 + ".5", "--1", "1..0",
    "1e", "e5", ".", "+", "-", "1e+", "1 e5", "\ud800", "\x00", "0.5\x00",
    "9" * 1_000_000 + "x",  # a megabyte token that is almost a number: rejected in linear time, not quadratic
]


@pytest.mark.parametrize("actual", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
@pytest.mark.parametrize("expected", ["0.500000", "1000", "0", "YES", "1.5e-7"])
@pytest.mark.parametrize("stated", [False, True])
def test_hostile_tokens_are_wrong_and_never_raise(expected, actual, stated):
    assert outputs_match(expected, actual, stated=stated) is False
    assert outputs_match(f"1 {expected}", f"1 {actual}", stated=stated) is False


def test_an_exponent_past_decimals_range_is_wrong_not_an_error():
    assert not outputs_match("0.5", "1e999999999999999999999") and not outputs_match("1e300", "1e999999999999999999")
    assert not outputs_match("0.5", "0.5 1e999999999999999999999")  # more tokens


@pytest.mark.parametrize(
    "expected, actual, ok",
    [
        ("1 2\n", "1 2", True),
        ("1 2", "1 2   \n\n\n", True),
        ("1 2\n3\n", "1 2\r\n3\r\n", True),
        ("1 2\n", "\t\v\f1\r2\v", True),  # ASCII whitespace: testlib's space \t \n \r, and \v \f
        ("1 2\n", "1\x1c2\n", False),  # str.split() would split here; a judge does not
        ("1 2\n", "1\u00a02\n", False),
        ("1 2\n", "1\u20282\n", False),
        ("1 2\n", "1\u30002\n", False),
        ("1 2\n", "1 2\u00a0\n", False),  # a trailing non-ASCII space is part of the last token
        ("a\u00a0b\n", "a\u00a0b\n", True),  # the same token
        ("a\u00a0b\n", "A\u00a0B\n", False),  # letter case is part of the token
        ("\u00e9\n", "\u00c9\n", False),  # only ASCII letters fold
        ("", "", True),
        ("", "\n \n", True),
        ("", "0", False),
        ("0", "", False),
        ("1 2", "1 2 3", False),
        ("1 2 3", "1 2", False),
    ],
)
def test_only_ascii_whitespace_separates_tokens(expected, actual, ok):
    assert outputs_match(expected, actual) is ok


def test_very_long_outputs_are_matched_whole():
    n = 200_000
    ints = "\n".join(str(i * 7919) for i in range(n)) + "\n"
    assert outputs_match(ints, ints.replace("\n", " "))
    assert not outputs_match(ints, ints[:-1] + "1\n")  # the last token one off
    assert not outputs_match(ints, ints + "0\n")
    floats = " ".join(f"{i / 7:.6f}" for i in range(n))
    assert outputs_match(floats, " ".join(f"{i / 7:.9f}" for i in range(n)))
    assert not outputs_match(floats, " ".join(f"{i / 7:.9f}" for i in range(n - 1)) + " 0")
    assert not outputs_match("1 " * n, "1 " * (n - 1) + "\u0661")


# ---------------------------------------------------------------------------------------------------------------
# the tolerance a statement states


@pytest.mark.parametrize(
    "statement, tol",
    [
        ("Your answer will be considered correct if its absolute or relative error does not exceed $$$10^{-6}$$$.",
         1e-6),
        ("Your answer is considered correct if its absolute or relative error does not exceed 10^{-9}.\n\n"
         "Formally, let your answer be a, and the jury's answer be b. Your answer is accepted if and only if "
         "\\frac{|a - b|}{max{(1, |b|)}} ≤ 10^{-9}.", 1e-9),
        ("The answer will be considered correct if the absolute or relative error doesn't exceed 10 - 4.", 1e-4),
        ("Print the area. The absolute or relative error should not exceed 10<sup>-6</sup>.", 1e-6),
        ("Your output is considered correct if the absolute or relative error from the judge's output is at most "
         "10^{\u22122}.", 1e-2),
        ("Answers with an absolute error of at most 10^-3 are accepted.", 1e-3),
        ("Print the probability with an absolute error not greater than 1e-7.", 1e-7),
        ("The checker allows an error up to $$$2 \\cdot 10^{-5}$$$.", 2e-5),
        ("Your answer will be accepted if the absolute error is less than 0.01.", 1e-2),
        ("Print the answer.\n\nNote: errors are within 0.000001 tolerance.", 1e-6),
    ],
)
def test_a_statement_states_its_tolerance(statement, tol):
    assert stated_tolerance(statement) == tol


@pytest.mark.parametrize(
    "statement",
    [
        "You are given two integers a and b (-10^9 <= a, b <= 10^9). Print a + b.",
        "It is guaranteed that the answer changes by at least 10^{-9} when r changes by 10^{-6}. Print it modulo "
        "10^9+7.",  # a 10^{-9} that is not about the error
        "If your program has an error, fix it. The answer changes by at least 10^{-9}.",  # another sentence
        "An error is reported when the sum differs from the expected one by more than a quarter of the total, "
        "and any 10^{-6} difference is tolerated.",  # more than 80 characters apart
        "Print the answer with absolute error at most 0.5.",  # a plain decimal that large is not a tolerance
        "",
    ],
)
def test_a_statement_without_a_tolerance_states_none(statement):
    assert stated_tolerance(statement) is None


def test_the_statements_tolerance_is_the_problems(compose_task):
    cfg = compose_task("codecontests")
    row = {"name": "9_A. Circle", "description": "Print the area. The absolute or relative error must not exceed "
           "10^{-2}.", "public_tests": {"input": ["1\n"], "output": ["3.14\n"]}}
    assert to_problem(row, cfg).meta["float_tolerance"] == 1e-2
    assert "float_tolerance" not in to_problem({**row, "description": "Print the area."}, cfg).meta


# ---------------------------------------------------------------------------------------------------------------
# the tolerance and the bytes in grading


def test_task_float_tolerance_is_the_one_grading_uses(make):
    # the mean (2.5 on the public test) printed 5e-6 off: wrong at the default 1e-6, right at
    # task.float_tolerance=1e-5, wrong at 2.1e-6: the statement states none, so the task's is absolute only (a
    # relative 2.1e-6 * 2.5 would pass it)
    off = answer("n = int(input())\nxs = list(map(int, input().split()))\nprint(f'{sum(xs) / n + 5e-6:.7f}')")
    verdicts = {}
    for tol in (None, "1e-5", "2.1e-6"):
        t = make("heldout_size=0", "time_limit_s=1", *([f"float_tolerance={tol}"] if tol else []))
        mean = by_name(t, "2_A. Mean Value")
        assert "float_tolerance" not in mean.meta and t.cfg.float_tolerance == float(tol or 1e-6)
        (verdicts[tol],) = t.verify([mean], [off])
        t.close()
    assert [verdicts[k].correct for k in (None, "1e-5", "2.1e-6")] == [False, True, False]
    assert verdicts[None].detail == "test 1/2 (public): wrong answer"
    # a problem's own tolerance wins over the task's (and is relative: 1e-6 * 2.5 < 5e-6 is still wrong)
    t = make("heldout_size=0", "time_limit_s=1", "float_tolerance=1e-5")
    mean = by_name(t, "2_A. Mean Value")
    strict = Problem(mean.id, mean.question, None, {**mean.meta, "float_tolerance": 1e-6})
    assert [v.correct for v in t.verify([mean, strict], [off, off])] == [True, False]
    t.close()
    with pytest.raises(ValueError, match="float tolerance"):
        make("heldout_size=0", "float_tolerance=-1")


class FixedSandbox:
    """A sandbox that answers every run with the same result (``stdout_is_utf8`` as given)."""

    isolation = "remote"

    def __init__(self, stdout: str, utf8: bool):
        self.result = RunResult("ok", 0, stdout, "", False, 0.0, stdout_is_utf8=utf8)

    def run(self, req: RunRequest) -> RunResult:
        return self.result


def test_output_that_is_not_utf8_is_wrong_even_where_its_stand_ins_would_match(make):
    # invalid bytes show as U+FFFD in stdout; an expected output holding U+FFFD must not be matched by them
    problem = Problem("codecontests/replacement", "Print the replacement character.", None,
                      {"tests": (("\n", "\ufffd\n"),), "n_public": 1})
    for utf8, status in ((True, "ok"), (False, "wrong")):
        t = make("heldout_size=0", sandbox=FixedSandbox("\ufffd\n", utf8))
        (v,) = t.verify([problem], [answer("import sys\nsys.stdout.buffer.write(b'\\xff\\n')")])
        assert (v.status, v.correct, v.failed) == (status, utf8, False), v
        t.close()
    assert v.detail == "test 1/1 (public): output is not UTF-8"


# ---------------------------------------------------------------------------------------------------------------
# grading in the sandbox

AB_OK = "a, b = map(int, input().split())\nprint(a + b)"


def test_verify_correct_and_incorrect_programs(task):
    ab, mean, even = by_name(task, "1_A. Sum of Two"), by_name(task, "2_A. Mean Value"), by_name(task, "EVENODD")
    cases = [
        (ab, answer(AB_OK), "ok", True),
        (ab, answer("a, b = map(int, input().split())\nprint(a - b)"), "wrong", False),
        (ab, answer("print(3)"), "wrong", False),  # passes the public test only
        (mean, answer("n = int(input())\nxs = list(map(int, input().split()))\nprint(f'{sum(xs) / n:.6f}')"),
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


class _Timed:
    """The local sandbox, each run's span noted under its program's first line."""

    isolation = "bwrap"

    def __init__(self):
        self.inner, self.spans, self.lock = LocalSandbox(), [], threading.Lock()

    def run(self, req: RunRequest) -> RunResult:
        t0 = time.monotonic()
        res = self.inner.run(req)
        with self.lock:
            self.spans.append((req.code.splitlines()[0], t0, time.monotonic()))
        return res

    def close(self) -> None:
        self.inner.close()


def test_programs_for_one_problem_never_run_together_while_other_problems_do(make):
    """A copier needs a solver of its own problem running beside it (issue 51: the kernel's pipe and socket inode
    numbers are one host-wide sequence): the completions of one problem are graded one after another, different
    problems at once."""
    sb = _Timed()
    t = make("heldout_size=0", "workers=4", "time_limit_s=2", sandbox=sb)
    try:
        ab, even = by_name(t, "1_A. Sum of Two"), by_name(t, "EVENODD")
        wrong = "import time\ntime.sleep(0.3)\nprint(-1)"
        problems = [ab, ab, ab, even, even, even]
        got = t.verify(problems, [answer(f"# {p.meta['name']} {i}\n{wrong}") for i, p in enumerate(problems)])
    finally:
        t.close()
    assert [v.status for v in got] == ["wrong"] * 6, got

    def spans(name: str) -> list[tuple[float, float]]:
        return sorted((a, b) for tag, a, b in sb.spans if name in tag)

    for name in ("1_A", "EVENODD"):
        runs = spans(name)
        assert len(runs) == 3 and all(b1 <= a2 for (_, b1), (a2, _) in zip(runs, runs[1:])), runs
    assert any(a1 < b2 and a2 < b1 for a1, b1 in spans("1_A") for a2, b2 in spans("EVENODD"))


def test_the_number_rules_in_grading(task):
    """With a stated tolerance a program printing reals is right where the jury printed integers; without one, a
    float-rounded half-integer near 5e17 is wrong and its exact twin right."""
    cfg = task.cfg
    stated = to_problem(row("9_A. Average", {"input": ["2\n1 3\n"], "output": ["2\n"]},
                            {"input": ["2\n1 2\n", "3\n5 5 5\n"], "output": ["1.5\n", "5\n"]},
                            description="Print the mean. The absolute or relative error must not exceed 10^{-6}."),
                        cfg)
    half = to_problem(row("9_B. Half", {"input": ["4\n"], "output": ["2.0\n"]},
                          {"input": ["999999999999999999\n"], "output": ["499999999999999999.5\n"]},
                          description="Print n / 2."), cfg)
    assert stated.meta["float_tolerance"] == 1e-6 and "float_tolerance" not in half.meta
    mean = "input()\nxs = list(map(int, input().split()))\nprint(f'{sum(xs) / len(xs):.9f}')"
    cases = [
        (stated, mean, True),  # 2.000000000 for 2: wrong before
        (stated, "input()\nxs = list(map(int, input().split()))\nprint(sum(xs) // len(xs))", False),
        (half, "print(int(input()) / 2)", False),  # 5e+17: right before
        (half, "n = int(input())\nprint(f'{n // 2}.{5 if n % 2 else 0}')", True),
    ]
    verdicts = task.verify([c[0] for c in cases], [answer(c[1]) for c in cases])
    assert [v.correct for v in verdicts] == [c[2] for c in cases], verdicts


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


def test_the_stdout_cap_is_sized_from_the_expected_output():
    assert output_cap("3\n", 1 << 20) == 1 << 20  # the floor, task.max_output_bytes
    assert output_cap("7" * 1_000_000, 1 << 20) == 4_000_000
    assert output_cap("\u00e9" * 300_000, 1 << 20) == 2_400_000  # UTF-8 bytes, not characters


N_BIG = 250_000  # 1,638,895 bytes of output: past the 1 MiB that capped every run
COUNT = Problem("codecontests/count", "Print 1 to n, one a line.", None, {
    "tests": ((f"{N_BIG}\n", "".join(f"{i}\n" for i in range(1, N_BIG + 1))),), "n_public": 0, "time_limit_s": 4.0})


@pytest.mark.parametrize(
    "code, status",
    [
        ("n = int(input())\nprint('\\n'.join(map(str, range(1, n + 1))))", "ok"),
        ("import sys\nn = int(input())\nsys.stdout.write(''.join(f'{i} \\r\\n' for i in range(1, n + 1)))", "ok"),
        ("n = int(input())\nprint('\\n'.join(map(str, range(2, n + 2))))", "wrong"),
        ("import sys\nwhile True:\n    sys.stdout.write('1 ' * 10000)", "wrong"),  # a flood still ends at the cap
    ],
)
def test_a_right_answer_longer_than_a_mebibyte_passes_and_a_flood_still_fails(task, code, status):
    """Every run was capped at task.max_output_bytes (1 MiB), so a right program whose answer is longer failed."""
    (v,) = task.verify([COUNT], [answer(code)])
    assert v.status == status, v
    if "while True" in code:
        assert "output_limit" in v.detail


def test_debug_output_on_stderr_is_not_graded(task):
    """A judge ignores stderr. 2 MiB of debug lines went past the sandbox's cap and failed a right program; the
    sandbox now drops stderr past its cap and the grader never reads it."""
    debug = "import sys\nfor i in range(2 ** 15):\n    print('debug line', i, 'x' * 50, file=sys.stderr)\n"
    ab = by_name(task, "1_A. Sum of Two")
    right, wrong = task.verify([ab, ab], [answer(debug + AB_OK), answer(debug + "print(3)")])
    assert (right.status, right.correct) == ("ok", True), right
    assert (wrong.status, wrong.detail) == ("wrong", "test 2/8 (hidden): wrong answer")


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


def test_a_program_writing_bytes_that_are_not_utf8_is_wrong_in_the_real_sandbox(task):
    problem = Problem("codecontests/replacement", "Print the replacement character.", None,
                      {"tests": (("\n", "\ufffd\n"),), "n_public": 1, "time_limit_s": 2.0})
    raw, text = (answer(f"import sys\nsys.stdout.buffer.write({b!r})") for b in (b"\xff\n", "\ufffd\n".encode()))
    bad, good = task.verify([problem, problem], [raw, text])
    assert (bad.status, bad.correct, bad.detail) == ("wrong", False, "test 1/1 (public): output is not UTF-8")
    assert (good.status, good.correct) == ("ok", True)  # the same text, written as UTF-8


# ---------------------------------------------------------------------------------------------------------------
# letter case: exact, as testlib's wcmp, except yes/no answers and statements that allow any case


@pytest.mark.parametrize(
    "expected, actual, fold, ok",
    [
        ("Konjac\n", "konjac\n", False, False),
        ("Konjac\n", "Konjac\n", False, True),
        (".c.d.f.r.c.s\n", ".C.d.f.r.c.s\n", False, False),
        ("YES\n", "yes\n", False, True),  # testlib's yesno: any case
        ("NO\n", "nO\n", False, True),
        ("Yes 3\nabc\n", "YES 3\nabc\n", False, True),  # the yes/no token folds ...
        ("Yes 3\nabc\n", "YES 3\nABC\n", False, False),  # ... and only that one
        ("YES\n", "yess\n", False, False),
        ("Alice\n", "ALICE\n", True, True),  # the statement allows any case: every token folds
        ("Alice\n", "Bob\n", True, False),
        ("\u00e9\n", "\u00c9\n", True, False),  # ASCII letters only
        ("1.5\n", "1.5E0\n", False, True),  # numbers compare by value, whatever the exponent's letter
    ],
)
def test_tokens_compare_in_their_own_case_except_yes_no_and_where_the_statement_allows_any(expected, actual, fold,
                                                                                          ok):
    assert outputs_match(expected, actual, fold_case=fold) is ok


@pytest.mark.parametrize(
    "statement, any_case",
    [
        ("Print the name of the winner. You can print each letter in any case (upper or lower).", True),
        ("You may print letters in arbitrary case.", True),
        ("Output the answer in any register.", True),
        ("The checker is case-insensitive.", True),
        ("Letter case does not matter.", True),
        ("Print Alice or Bob. The case of the letters does not matter.", True),
        ("Uppercase and lowercase letters are considered the same.", True),
        # a permission about the yes/no answers only: they fold anyway, the rest of the output stays exact
        ('Print "YES" or "NO". You can output the answer in any case (for example, the strings "yEs", "yes", "Yes" '
         'and "YES" will be recognized as a positive answer).', False),
        ("You can print YES and NO in any case.", False),
        # the idiom, and statements that say nothing about case
        ("In any case, print -1.", False),
        # the idiom opening a clause after an output word: each of these was read as permission
        ("Print the answer (in any case, it does not exceed 10^{18}).", False),
        ("Output the lexicographically smallest string (in any case, such a string exists).", False),
        ("Print the number of moves, in any case, it is at most 10^9.", False),
        ("Print the string; in any case it is unique.", False),
        ("Output the word \u2014 in any case it is unique.", False),
        ("Print the answer (in any case, it fits in 64 bits) and the string in any case.", True),  # and permission
        ("Print the word in any case you want.", True),
        ("You may print the letters in any case, for example aBc or ABC.", True),
        ("Print the word (in any letter case).", True),
        ("If there are several answers, print any. In this case the order does not matter.", False),
        ("Output the given word after capitalization.", False),
        ("Replace all uppercase consonants with corresponding lowercase ones.", False),
        ("", False),
    ],
)
def test_a_statement_that_allows_any_case(statement, any_case):
    assert stated_any_case(statement) is any_case


def test_the_case_reader_on_every_statement_here():
    """CodeContests itself is not on this machine: these are the statements of both fixtures. None allows any case
    (the four string problems fix theirs; 4A's permission is about YES and NO)."""
    rows = [json.loads(line) for f in (FIXTURE, CASE_FIXTURE) for line in f.read_text().splitlines()]
    assert len(rows) == 12 and [r["name"] for r in rows if stated_any_case(r["description"])] == []


def test_an_idiom_after_an_output_word_leaves_the_case_exact(compose_task):
    cfg = compose_task("codecontests")
    r = row("1_A. Winner", {"input": ["1\n"], "output": ["Alice\n"]},
            description="Print the winner's name (in any case, the winner is unique).")
    p = to_problem(r, cfg)
    assert "fold_case" not in p.meta and not outputs_match("Alice\n", "ALICE\n", fold_case=False)


def test_only_a_statement_that_allows_any_case_folds_every_token(compose_task):
    cfg = compose_task("codecontests")
    row = {"name": "1_A. Winner", "description": "Print the winner. You can print each letter in any case.",
           "public_tests": {"input": ["1\n"], "output": ["Alice\n"]}}
    assert to_problem(row, cfg).meta["fold_case"] is True
    assert "fold_case" not in to_problem({**row, "description": "Print the winner."}, cfg).meta


@pytest.fixture
def case_task(compose_task):
    t = build_task(compose_task("codecontests", f"source={CASE_FIXTURE}", "heldout_size=0", "time_limit_s=1"))
    yield t
    t.close()


def test_a_program_that_skips_the_problems_case_handling_is_wrong_and_yes_still_answers_yes(case_task):
    """Every token was compared in lower case: ``print(input())`` passed 281A, 131A and 59A on their samples, and
    118A passed without its lowercasing step. Each is wrong now, its right twin is right, and a yes/no problem
    still takes ``yes`` for ``YES``."""
    echo = "print(input())"
    cases = [
        ("281_A. Word Capitalization", echo, "wrong"),
        ("281_A. Word Capitalization", "s = input()\nprint(s[0].upper() + s[1:])", "ok"),
        ("131_A. cAPS lOCK", echo, "wrong"),
        ("131_A. cAPS lOCK", "s = input()\nprint(s.swapcase() if s[1:] == s[1:].upper() else s)", "ok"),
        ("59_A. Word", echo, "wrong"),
        ("59_A. Word", "s = input()\nu = sum(c.isupper() for c in s)\nprint(s.upper() if u > len(s) - u else "
                       "s.lower())", "ok"),
        ("118_A. String Task", "print(''.join('.' + c for c in input() if c.lower() not in 'aoyeui'))", "wrong"),
        ("118_A. String Task", "print(''.join('.' + c for c in input().lower() if c not in 'aoyeui'))", "ok"),
        ("4_A. Watermelon", "w = int(input())\nprint('yes' if w % 2 == 0 and w > 2 else 'no')", "ok"),
        ("4_A. Watermelon", "w = int(input())\nprint('Yes' if w % 2 == 1 else 'No')", "wrong"),
    ]
    problems = [by_name(case_task, name) for name, _, _ in cases]
    assert not any(p.meta.get("fold_case") for p in problems)  # none of these statements allows any case
    verdicts = case_task.verify(problems, [answer(code) for _, code, _ in cases])
    for (name, code, status), v in zip(cases, verdicts):
        assert v.status == status, (name, code, v)
    assert verdicts[0].detail == "test 2/2 (hidden): wrong answer"  # "konjac" for "Konjac"
    assert verdicts[6].detail == "test 2/3 (hidden): wrong answer"  # ".C.d.f.r.c.s" for ".c.d.f.r.c.s"
