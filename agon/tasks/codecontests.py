"""CodeContests (``deepmind/code_contests``): competitive programming graded by running the program on tests.

Problems come from the hub through ``datasets`` or from a local copy in the same schema (a parquet/JSONL file or a
directory of them; a hub snapshot directory is split by file-name prefix, ``train-*.parquet``). The "easy" filter
(on by default, ``task.easy_only``) keeps a problem when its Codeforces rating is in ``(0, task.max_cf_rating]`` or
its difficulty is one of ``task.easy_difficulties`` (1 = EASY, 7 = A); problems with file I/O (``input_file`` /
``output_file``), with ``<image>`` in the statement, without tests, or (``task.require_python_solution``) without
a Python 3 reference solution are dropped.

The program is the last fenced ```python block after ``</think>`` (the recap drops that block). It runs in the
sandbox (``agon.tasks.sandbox``) on every public and private test plus the first ``task.max_generated_tests``
generated ones, stopping at the first failure; it is correct only when every selected test passes with exit code 0
and matching output. Matching is CodeContests' own (``OutputsMatch``): whitespace-separated tokens,
case-insensitive, equal token counts, each token equal as text or, for two numbers that are not both integers,
within 1e-5. Completions are graded ``task.workers`` at a time.
"""

from __future__ import annotations

import logging
import math
import re
from concurrent.futures import ThreadPoolExecutor
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
_INT = re.compile(r"[+-]?\d+")


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


def _token_match(a: str, b: str) -> bool:
    if a == b:
        return True
    if _INT.fullmatch(a) and _INT.fullmatch(b):
        return False  # two different integers
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) or math.isnan(y):
        return False
    return abs(x - y) < 1e-5


def outputs_match(expected: str, actual: str) -> bool:
    """CodeContests' ``OutputsMatch``: whitespace tokens, lower-cased, same count, floats within 1e-5."""
    e, a = expected.lower().split(), actual.lower().split()
    if e == a:
        return True
    return len(e) == len(a) and all(_token_match(x, y) for x, y in zip(e, a))


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


def keep_problem(row: dict, cfg: Any) -> bool:
    """The easy filter and the runnability checks (see the module docstring)."""
    if row.get("input_file") or row.get("output_file"):
        return False
    if "<image>" in (row.get("description") or ""):
        return False
    if not (_tests(row.get("public_tests")) or _tests(row.get("private_tests"))):
        return False
    if cfg.require_python_solution:
        langs = (row.get("solutions") or {}).get("language") or []
        if PYTHON3 not in langs:
            return False
    if cfg.easy_only:
        rating = row.get("cf_rating") or 0
        if not (0 < rating <= cfg.max_cf_rating or row.get("difficulty") in set(cfg.easy_difficulties)):
            return False
    return True


def to_problem(row: dict, cfg: Any) -> Problem:
    tests = _tests(row.get("public_tests")) + _tests(row.get("private_tests"))
    tests += _tests(row.get("generated_tests"))[: cfg.max_generated_tests]
    seen, unique = set(), []
    for t in tests:
        if t[0] not in seen:
            seen.add(t[0])
            unique.append(t)
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
    return Problem(f"codecontests/{row['name']}", row["description"].strip(), None, meta)


def load_problems(cfg: Any, split: str) -> list[Problem]:
    ds = load_table(
        cfg.source, what="CodeContests", hub_id=HUB_ID, columns=COLUMNS, split=split, example="/path/to/code_contests"
    )
    out, seen, n = [], set(), 0
    for row in ds:
        n += 1
        if keep_problem(row, cfg) and row["name"] not in seen:
            seen.add(row["name"])
            out.append(to_problem(row, cfg))
    log.info("codecontests: %d of %d problems in split %r pass the filters", len(out), n, split)
    return out


# ---------------------------------------------------------------------------------------------------------------


@register_task("codecontests")
class CodeContestsTask(Task):
    def __init__(self, cfg: Any, sandbox: Sandbox | None = None):
        super().__init__(cfg)
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
        return list(self._pool.map(self.verify_one, problems, completions))

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
        for k, (stdin, expected) in enumerate(tests):
            res = self.sandbox.run(
                RunRequest(
                    code=code,
                    stdin=stdin,
                    time_limit_s=problem.meta.get("time_limit_s", self.cfg.time_limit_s),
                    memory_mb=problem.meta.get("memory_mb", self.cfg.memory_mb),
                    max_output_bytes=self.cfg.max_output_bytes,
                )
            )
            where = f"test {k + 1}/{len(tests)} ({'public' if k < n_public else 'hidden'})"
            if res.status == "sandbox_error":
                return Verdict(False, True, "error", f"{where}: sandbox error: {res.detail}")
            if res.status != "ok":
                return Verdict(False, True, "wrong", f"{where}: {res.status} {res.detail}".strip())
            if not outputs_match(expected, res.stdout):
                return Verdict(False, True, "wrong", f"{where}: wrong answer")
        return Verdict(True, True, "ok", f"passed {len(tests)} tests")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
