r"""CodeContests (``deepmind/code_contests``): competitive programming graded by running the program on tests.

Problems come from the hub through ``datasets`` or from a local copy in the same schema (a parquet/JSONL file or a
directory of them; a hub snapshot directory is split by file-name prefix, ``train-*.parquet``). The "easy" filter
(on by default, ``task.easy_only``) keeps a problem when its Codeforces rating is in ``(0, task.max_cf_rating]`` or
its difficulty is one of ``task.easy_difficulties`` (1 = EASY, 7 = A); problems with file I/O (``input_file`` /
``output_file``), with ``<image>`` in the statement, without tests, or (``task.require_python_solution``) without
a Python 3 reference solution are dropped, and so is a problem whose graded tests are all the statement's examples
(a program that maps the examples to their outputs would pass it).

The program is the last fenced ```python block after ``</think>`` (the recap drops that block). It runs in the
sandbox (``agon.tasks.sandbox``) on every public and private test plus the first ``task.max_generated_tests``
generated ones, stopping at the first failure; it is correct only when every selected test passes with exit code 0
and matching output. Each run may write ``max(task.max_output_bytes, 4 x the test's expected output)`` bytes to
stdout (``output_cap``); what it writes to stderr is never graded (the sandbox bounds it). Completions are graded
``task.workers`` at a time.

Matching (``outputs_match``) is exact where the expected output is exact, as Codeforces' testlib checkers are:

* Output is cut into tokens at ASCII whitespace only: testlib's blanks (space, ``\t``, ``\n``, ``\r``) plus ``\v``
  and ``\f``. A Unicode space (U+00A0, U+2028, ``\x1c``...) is part of a token, as it is for a judge (Python's
  ``str.split`` would split there). Tokens compare exactly, letter case included, as testlib's ``wcmp``: a
  program that skips a problem's case handling fails. Case folds (ASCII letters only) for an expected ``yes`` or
  ``no`` in any case (testlib's ``yesno``), and for every token of a problem whose statement allows any case ("you
  can print each letter in any case", "case-insensitive"; ``stated_any_case``, parsed into
  ``meta["fold_case"]``). The token counts must be equal.
* Numbers are tokens in plain ASCII decimal form (``[+-]?(d+[.d*]|.d+)([eE][+-]?d+)?``), compared by value in
  exact decimal arithmetic, never through binary floats. Which numbers, and how closely, is the one rule below.
* Any other expected token (words, ``nan``, ``inf``) matches only the same text.

The number rule (``_token_match``):

* A statement that states a tolerance ("absolute or relative error does not exceed 10^{-9}", parsed into
  ``meta["float_tolerance"]``) gets testlib's ``rcmp``: every numeric expected token, integers included, matches a
  number within ``|actual - expected| <= tol * max(1, |expected|)`` (absolute or relative error). ``2.000000000``
  is right for a jury's ``2``.
* Without one, the answers are taken to be exact (integers; exact decimals such as half-integers), with room only
  for the digits a program chooses to print. An integer (``[+-]?[0-9]+``) matches only the same text: no ``+7``,
  ``007`` or ``7.0`` for ``7``, no ``-0`` for ``0``, no ``9.982443599877105e+17`` for ``998244359987710471``
  (testlib's ``readLong``, which its ``ncmp`` checker uses, rejects each of these forms; ``wcmp``/``lcmp`` compare
  the text). Any other number matches within ``task.float_tolerance`` (1e-6) *absolute*, never relative: ``0.5``
  for ``0.50`` and ``2.5`` for ``2.500000`` (the same value), ``1.333333`` for ``1.3333333`` (a statement that asks
  for "at least six digits after the point"), but not the float-rounded ``500000000000000000.0`` or ``5e+17`` for
  the half-integer ``499999999999999999.5``, which a relative 1e-6 (5e11 there) passed. Two exact answers differ
  by their granularity (0.5, 0.01), which 1e-6 absolute never bridges at any magnitude; a relative bound grows
  with the value until it does. At the default this accepts nothing that ``rcmp6`` rejects.

A run whose stdout is not valid UTF-8 is wrong, whatever it decodes to. The matcher never raises: a malformed,
hostile or enormous token is a mismatch, so no output can turn a wrong answer into a grader error.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, Inexact, InvalidOperation, Overflow
from functools import lru_cache
from typing import Any, Sequence

from agon.tasks import Problem, Task, Verdict, register_task
from agon.tasks.deepmath import load_table, split_heldout
from agon.tasks.sandbox import LocalSandbox, RunRequest, Sandbox
from agon.tasks.text import visible_text

log = logging.getLogger(__name__)

HUB_ID = "deepmind/code_contests"
COLUMNS = (
    "name",
    "description",
    "public_tests",
    "private_tests",
    "generated_tests",
    "source",
    "difficulty",
    "cf_rating",
    "input_file",
    "output_file",
    "solutions",
    "time_limit",
    "memory_limit_bytes",
)
PYTHON3 = 3  # solutions.language: 0 UNKNOWN, 1 PYTHON (2), 2 CPP, 3 PYTHON3, 4 JAVA
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
# tokens are bytes (ASCII-only classes: no Unicode digits, no underscores, no inf/nan/hex). Unambiguous, so a
# megabyte-long token is rejected in linear time (``[0-9]+\.?[0-9]*`` backtracks quadratically on "999...9x")
_INTEGER = re.compile(rb"[+-]?[0-9]+")
_NUMBER = re.compile(rb"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
DEFAULT_TOLERANCE = 1e-6
# a right output may be longer than the jury's: "\r\n" for "\n", trailing spaces, a real printed with more digits
# ("0.5" as "0.500000000"); four times the expected bytes is room for each, the configured floor for small outputs
OUTPUT_CAP_FACTOR = 4
# answers whose case never matters: testlib's yesno checker folds them, and Codeforces statements say so
_YES_NO = {b"yes", b"no"}
# exact sums and products of the (trusted) expected token and tolerance; a malformed actual token raises
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[Inexact, InvalidOperation, Overflow])


# ---------------------------------------------------------------------------------------------------------------
# answer extraction and output matching


def _last_block(visible: str) -> re.Match | None:
    last = None
    for m in _CODE_BLOCK.finditer(visible):
        last = m
    return last


def extract_code(completion: str) -> str | None:
    """The last ```python block after the last ``</think>``, or None."""
    visible = visible_text(completion)
    if visible is None:
        return None
    m = _last_block(visible)
    return m.group(1) if m and m.group(1).strip() else None


def _decimal(value: Any) -> Decimal:
    """A tolerance as the decimal it is written as (1e-6 is 1e-6, not the double nearest it)."""
    d = value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else str(value))
    if not (d.is_finite() and d >= 0):
        raise ValueError(f"a float tolerance must be a finite number >= 0, not {value!r}")
    return d


@lru_cache(maxsize=4096)
def _bounds(expected: bytes, tol: Decimal, relative: bool) -> tuple[Decimal, Decimal]:
    """``expected -/+ tol * max(1, |expected|)`` (``relative``) or ``expected -/+ tol``, exactly."""
    e = Decimal(expected.decode("ascii"), _EXACT)
    d = _EXACT.multiply(tol, max(Decimal(1), e.copy_abs())) if relative else tol  # copy_abs: abs() would round
    return _EXACT.subtract(e, d), _EXACT.add(e, d)


def _token_match(expected: bytes, actual: bytes, tol: Decimal, fold_case: bool, stated: bool) -> bool:
    """The matching rule (the module docstring gives it with its examples)."""
    if expected == actual:
        return True
    if (fold_case or expected.lower() in _YES_NO) and expected.lower() == actual.lower():
        return True  # ASCII letters only: bytes.lower() leaves every other byte as it is
    if not _NUMBER.fullmatch(expected) or not _NUMBER.fullmatch(actual):
        return False  # a word, or a non-number where a number is due: only the same text
    if not stated and _INTEGER.fullmatch(expected):
        return False  # no tolerance stated: an integer is exact, its text included
    # a stated tolerance is rcmp's, absolute or relative; the task's fallback is absolute only, because a relative
    # 1e-6 lets a float-rounded 5e17 pass for an exact half-integer
    lo, hi = _bounds(expected, tol, stated)
    # only compared, never computed with: a token like 1e999999999999999999999 raises (caught) instead
    x = Decimal(actual.decode("ascii"), _EXACT)
    return x.is_finite() and lo <= x <= hi


def _tokens(text: str) -> list[bytes]:
    return text.encode("utf-8", "surrogatepass").split()  # bytes: split at ASCII whitespace only


def outputs_match(expected: str, actual: str, tolerance: Any = DEFAULT_TOLERANCE, fold_case: bool = False,
                  stated: bool = False) -> bool:
    """Whether ``actual`` is a right output for ``expected``; never raises (anything malformed is a mismatch).

    Tokens are cut at ASCII whitespace only and compared exactly, as testlib's ``wcmp`` does; the counts must be
    equal. ASCII case folds for an expected ``yes``/``no`` (any case: testlib's ``yesno`` checker, and "print YES
    in any case"), and for every token with ``fold_case`` (a statement that allows any case, ``meta["fold_case"]``).
    Numbers (plain ASCII decimal form, exponent allowed) compare by value, in exact decimal arithmetic, with
    ``tolerance`` taken as the decimal it is written as:

    * ``stated`` (the statement's own tolerance): every numeric expected token, integers included, within
      ``|actual - expected| <= tolerance * max(1, |expected|)``, as testlib's ``rcmp``: ``2.000000000`` for ``2``.
    * otherwise (the task's fallback, default 1e-6): an integer only as the same text (no ``-0`` for ``0``, ``007``
      or ``7.0`` for ``7``, ``9.982443599877105e+17`` for ``998244359987710471``), any other number within
      ``|actual - expected| <= tolerance``, absolute only (``0.5`` for ``0.50``; not ``5e+17`` for
      ``499999999999999999.5``).

    Any other token matches only the same text.
    """
    try:
        e, a = _tokens(expected), _tokens(actual)
        if e == a:
            return True
        if len(e) != len(a):
            return False
        tol = _decimal(tolerance)
        return all(_token_match(x, y, tol, fold_case, stated) for x, y in zip(e, a))
    except Exception:  # noqa: BLE001 - a grader that raises lets a wrong answer dodge its penalty
        return False


# statements state their tolerance in words: "absolute or relative error does not exceed 10^{-6}" (Codeforces,
# LaTeX), "... doesn't exceed 10 - 6" (older Codeforces statements, the superscript lost), "10<sup>-6</sup>",
# "is at most 10^{−6}" (AtCoder), "10^-6", "1e-6", "2 \cdot 10^{-5}", "0.01" (a plain decimal only below 0.1). The
# number must follow the word "error" in the same sentence, at most 80 characters on; the first such is taken.
_MINUS = "[-\u2212\u2013]"
_STATED_TOLERANCE = re.compile(
    r"\berrors?\b(?:(?!\.\s)[^\n]){0,80}?(?<![\d.])(?:"
    r"(?:(?P<m>\d+(?:\.\d+)?)\s*(?:\\cdot|\\times|\u00b7|\u00d7|\*)\s*)?"
    rf"10\s*(?:\^\s*\{{?|<sup[^>]*>)?\s*{_MINUS}\s*(?P<k>\d{{1,3}})(?!\d)"
    rf"|(?P<sm>\d+(?:\.\d+)?)\s*[eE]\s*{_MINUS}\s*(?P<sk>\d{{1,3}})(?!\d)"
    r"|(?P<dec>0\.0+[1-9]\d*)(?!\.?\d)"
    r")",
    re.IGNORECASE,
)


# statements that let the answer be printed in any letter case: "You can print each letter in any case", "in
# arbitrary case", "in any register" (translations), "case-insensitive", "letter case does not matter", "uppercase
# and lowercase letters are considered the same". "in any case" counts only after a word about the output in the
# same sentence ("print ... in any case"), never as the idiom, which opens a sentence ("In any case, print -1") or
# a clause after a bracket, comma, semicolon, colon or dash ("Print the answer (in any case, it fits in 64 bits)").
_CLAUSE_OPENER = "(\\[,;:\u2013\u2014-"
_ANY_CASE = re.compile(
    r"\bcase[- ]?insensitiv"
    r"|\b(?:print|output|write|answer|letters?|characters?|strings?|words?)\b[^.\n]{0,100}?(?:"
    rf"(?<![{_CLAUSE_OPENER}])(?<![{_CLAUSE_OPENER}]\s)\bin\s+any\s+case\b"
    r"|\busing\s+(?:any|arbitrary)\s+(?:letter\s+)?(?:case|register)\b"
    r"|\bin\s+(?:arbitrary\s+(?:letter\s+)?(?:case|register)|any\s+(?:letter\s+case|register))\b)"
    r"|\b(?:any|arbitrary)\s+letter\s+case\b"
    r"|\b(?:letter\s+case|register|case\s+of\s+(?:the\s+)?(?:letters|characters|output))\s+"
    r"(?:(?:does\s+not|doesn't|doesn\u2019t)\s+matter|is\s+not\s+important|is\s+irrelevant)"
    r"|\b(?:upper|lower)[- ]?case\b[^.\n]{0,60}?\b(?:upper|lower)[- ]?case\b[^.\n]{0,60}?"
    r"\b(?:accepted|allowed|equivalent|considered\s+(?:equal|the\s+same|identical))",
    re.IGNORECASE,
)
# a sentence that names yes/no answers: its permission is the yes/no folding every problem already gets
_YES_NO_WORDS = re.compile(r"\b(?:yes|no|positive|negative)\b", re.IGNORECASE)


def stated_any_case(statement: str) -> bool:
    """Whether a statement lets every output token be printed in any letter case. A permission whose sentence
    names the yes/no answers ("print YES or NO in any case: yEs, yes, Yes will be recognized as a positive
    answer") is about those words only, which fold anyway, and leaves the rest of the output exact."""
    text = statement or ""
    for m in _ANY_CASE.finditer(text):
        start = max(text.rfind(". ", 0, m.start()), text.rfind("\n", 0, m.start())) + 1
        ends = [i for i in (text.find(". ", m.end()), text.find("\n", m.end())) if i >= 0]
        if not _YES_NO_WORDS.search(text[start: min(ends, default=len(text))]):
            return True
    return False


def stated_tolerance(statement: str) -> float | None:
    """The float tolerance a statement states ("absolute or relative error does not exceed 10^{-9}"), or None."""
    m = _STATED_TOLERANCE.search(statement or "")
    if m is None:
        return None
    if m["k"] is not None:
        tol = float(f"{m['m'] or 1}e-{m['k']}")  # the decimal as written: 1e-06, not 10.0 ** -6
    elif m["sk"] is not None:
        tol = float(f"{m['sm']}e-{m['sk']}")
    else:
        tol = float(m["dec"])
    return tol if 0 < tol < 1 else None


def output_cap(expected: str, floor: int) -> int:
    """The stdout bytes a run may write for ``expected``: ``max(floor, OUTPUT_CAP_FACTOR x its UTF-8 bytes)``, so
    that a right answer longer than the floor (``task.max_output_bytes``) is not cut off."""
    return max(int(floor), OUTPUT_CAP_FACTOR * len(expected.encode("utf-8", "surrogatepass")))


# ---------------------------------------------------------------------------------------------------------------
# loading


def _tests(field: Any) -> list[tuple[str, str]]:
    if not field:
        return []
    return list(zip(field.get("input") or [], field.get("output") or []))


def _seconds(tl: Any) -> float:
    if not tl:
        return 0.0
    return float(tl.get("seconds") or 0) + float(tl.get("nanos") or 0) / 1e9


def graded_tests(row: dict, cfg: Any) -> list[tuple[str, str]]:
    """The tests a program runs on: public, private, then the first ``cfg.max_generated_tests`` generated ones, each
    input once (its first output)."""
    tests = _tests(row.get("public_tests")) + _tests(row.get("private_tests"))
    tests += _tests(row.get("generated_tests"))[: cfg.max_generated_tests]
    seen, unique = set(), []
    for t in tests:
        if t[0] not in seen:
            seen.add(t[0])
            unique.append(t)
    return unique


def drop_reason(row: dict, cfg: Any) -> str | None:
    """Why the easy filter or the runnability checks drop a row (see the module docstring), or None to keep it.
    The examples-only check comes last, so that its count is of rows nothing else would drop."""
    if row.get("input_file") or row.get("output_file"):
        return "file I/O"
    if "<image>" in (row.get("description") or ""):
        return "<image>"
    if not (_tests(row.get("public_tests")) or _tests(row.get("private_tests"))):
        return "no tests"
    if cfg.require_python_solution:
        langs = (row.get("solutions") or {}).get("language") or []
        if PYTHON3 not in langs:
            return "no Python 3 solution"
    if cfg.easy_only:
        rating = row.get("cf_rating") or 0
        if not (0 < rating <= cfg.max_cf_rating or row.get("difficulty") in set(cfg.easy_difficulties)):
            return "not easy"
    examples = {t[0] for t in _tests(row.get("public_tests"))}
    if all(t[0] in examples for t in graded_tests(row, cfg)):
        return "examples only"  # the statement shows every test: a lookup table of its examples would pass
    return None


def keep_problem(row: dict, cfg: Any) -> bool:
    """The easy filter and the runnability checks (see the module docstring)."""
    return drop_reason(row, cfg) is None


def to_problem(row: dict, cfg: Any) -> Problem:
    unique = graded_tests(row, cfg)
    tl = _seconds(row.get("time_limit"))
    time_limit = min(cfg.time_limit_s, cfg.time_limit_factor * tl) if tl > 0 else cfg.time_limit_s
    mem_mb = (row.get("memory_limit_bytes") or 0) // (1 << 20)
    memory = min(cfg.memory_mb, mem_mb) if mem_mb > 0 else cfg.memory_mb
    meta = {
        "tests": tuple(unique),
        "n_public": len(_tests(row.get("public_tests"))),
        "time_limit_s": time_limit,
        "memory_mb": int(memory),
        "cf_rating": row.get("cf_rating"),
        "difficulty": row.get("difficulty"),
        "name": row["name"],
    }
    tol = stated_tolerance(row.get("description") or "")
    if tol is not None:  # the statement's own; else the grader uses task.float_tolerance
        meta["float_tolerance"] = tol
    if stated_any_case(row.get("description") or ""):  # else only yes/no answers fold
        meta["fold_case"] = True
    return Problem(f"codecontests/{row['name']}", row["description"].strip(), None, meta)


def load_problems(cfg: Any, split: str) -> list[Problem]:
    ds = load_table(
        cfg.source, what="CodeContests", hub_id=HUB_ID, columns=COLUMNS, split=split, example="/path/to/code_contests"
    )
    out, seen, n, dropped = [], set(), 0, Counter()
    for row in ds:
        n += 1
        why = drop_reason(row, cfg)
        if why is not None:
            dropped[why] += 1
        elif row["name"] not in seen:
            seen.add(row["name"])
            out.append(to_problem(row, cfg))
    log.info("codecontests: %d of %d problems in split %r pass the filters; dropped: %s", len(out), n, split,
             ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "none")
    return out


# ---------------------------------------------------------------------------------------------------------------


@register_task("codecontests")
class CodeContestsTask(Task):
    def __init__(self, cfg: Any, sandbox: Sandbox | None = None):
        super().__init__(cfg)
        _decimal(cfg.float_tolerance)  # a bad tolerance stops the run here, not every float answer later
        # first: a machine that cannot isolate model-written programs stops the run here, before any data loads
        self.sandbox: Sandbox = sandbox or LocalSandbox(allow_unsafe=cfg.sandbox.allow_unsafe)
        problems = load_problems(cfg, cfg.split)
        if cfg.heldout_split:
            import random

            held = sorted(load_problems(cfg, cfg.heldout_split), key=lambda p: p.id)
            random.Random(cfg.split_seed).shuffle(held)
            self._heldout = held[: cfg.heldout_size]
            names = {p.id for p in self._heldout}
            self._train = [p for p in problems if p.id not in names]
        else:
            self._train, self._heldout = split_heldout(
                problems, cfg.heldout_size, cfg.split_seed, f"task.max_cf_rating={cfg.max_cf_rating}"
            )
        log.info(
            "codecontests: %d train, %d held out; sandbox isolation %s",
            len(self._train), len(self._heldout), self.sandbox.isolation,
        )
        self._pool = ThreadPoolExecutor(max_workers=max(1, cfg.workers), thread_name_prefix="codecontests")

    def train_problems(self) -> Sequence[Problem]:
        return self._train

    def heldout_problems(self) -> Sequence[Problem]:
        return self._heldout

    def strip_answer(self, visible: str) -> str:
        """The visible text without its final code block (the program is the answer)."""
        m = _last_block(visible)
        return visible if m is None else visible[: m.start()] + visible[m.end() :]

    def verify(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        """Every completion graded; the completions of one problem one after another, different problems at once.
        Two programs for one problem never run together, so neither can copy the other's answer through what the
        kernel still shares between runs (the global sequences of pipe and socket inode numbers, timing)."""
        by_problem: dict[str, list[int]] = {}
        for i, problem in enumerate(problems):
            by_problem.setdefault(problem.id, []).append(i)
        verdicts: list[Verdict | None] = [None] * len(problems)

        def grade(rows: list[int]) -> None:
            for i in rows:
                verdicts[i] = self.verify_one(problems[i], completions[i])

        list(self._pool.map(grade, by_problem.values()))
        return verdicts  # type: ignore[return-value]

    def verify_one(self, problem: Problem, completion: str) -> Verdict:
        try:
            return self._verify_one(problem, completion)
        except Exception as e:  # a bug here must not kill the training loop; it is counted instead
            log.exception("codecontests: verifier error")
            return Verdict(False, False, "error", f"{type(e).__name__}: {e}")

    def _verify_one(self, problem: Problem, completion: str) -> Verdict:
        code = extract_code(completion)
        if code is None:
            return Verdict(False, False, "no_answer", "no ```python block after </think>")
        tests = problem.meta.get("tests") or ()
        if not tests:
            return Verdict(False, True, "unscorable", "problem has no tests")
        n_public = problem.meta.get("n_public", 0)
        # a tolerance the statement states is a real-number checker's; the task's is a fallback for exact answers
        stated = "float_tolerance" in problem.meta
        tol = problem.meta["float_tolerance"] if stated else self.cfg.float_tolerance
        fold_case = bool(problem.meta.get("fold_case"))
        for k, (stdin, expected) in enumerate(tests):
            res = self.sandbox.run(
                RunRequest(
                    code=code,
                    stdin=stdin,
                    time_limit_s=problem.meta.get("time_limit_s", self.cfg.time_limit_s),
                    memory_mb=problem.meta.get("memory_mb", self.cfg.memory_mb),
                    max_output_bytes=output_cap(expected, self.cfg.max_output_bytes),
                )
            )
            where = f"test {k + 1}/{len(tests)} ({'public' if k < n_public else 'hidden'})"
            if res.status == "sandbox_error":
                return Verdict(False, True, "error", f"{where}: sandbox error: {res.detail}")
            # nothing reads stderr: a judge ignores it, so debug lines cannot fail a run (the sandbox drops them past
            # its cap instead of ending the run)
            if res.status != "ok":
                return Verdict(False, True, "wrong", f"{where}: {res.status} {res.detail}".strip())
            if not res.stdout_is_utf8:  # its U+FFFD stand-ins must not match an expected U+FFFD
                return Verdict(False, True, "wrong", f"{where}: output is not UTF-8")
            if not outputs_match(expected, res.stdout, tol, fold_case, stated):
                return Verdict(False, True, "wrong", f"{where}: wrong answer")
        return Verdict(True, True, "ok", f"passed {len(tests)} tests")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        close = getattr(self.sandbox, "close", None)  # a LocalSandbox unmounts its runtime copies
        if close is not None:
            close()
