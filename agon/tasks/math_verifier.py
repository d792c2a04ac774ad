"""Math answers graded by math-verify in worker processes, with an outer deadline per item.

math-verify's own timeouts use ``signal.alarm``: off the main thread they raise ``ValueError``, and its
``TimeoutException`` is a ``BaseException`` that ``except Exception`` misses; hangs have been reported even with
them on. So grading runs in a small pool of worker processes (``python -m agon.tasks.math_verifier``, started with
``subprocess``: no fork of a process that may hold CUDA, no re-import of the trainer's ``__main__``), where the
signal timeouts work, and the parent enforces its own deadline: a worker that overruns it is SIGKILLed and replaced,
and that item is scored ``status="timeout"`` (counted by the trainer, never a silent zero). ``MathVerifier.verify``
can be called from any thread; calls are serialised.

Grading rules (DeepMath's and TRL's, see docs/tasks.md):
- only the text after the last ``</think>`` counts; no ``</think>`` or no ``\\boxed{}`` there: ``no_answer``,
  ``format_ok=False``;
- the prediction is the last ``\\boxed{...}`` of that text, parsed with
  ``LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)`` and ``extraction_mode=
  "first_match"``;
- the gold answer is wrapped as ``$...$`` and parsed with the defaults; a gold that does not parse is
  ``unscorable``;
- yes/no/true/false golds are compared as case-insensitive strings (math-verify reads ``Yes`` as ``E*s*y``);
- ``verify`` is called with keyword arguments (its positional order changed between releases).
"""

from __future__ import annotations

import json
import logging
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

log = logging.getLogger(__name__)

STRING_ANSWERS = ("yes", "no", "true", "false")


@dataclass(frozen=True)
class MathVerdict:
    """What the grader says about one completion (``agon.tasks.Verdict`` has the same first fields)."""

    correct: bool
    format_ok: bool
    # ok | wrong | no_answer | timeout | error | unscorable
    status: str
    detail: str = ""


# ---------------------------------------------------------------------------------------------------------------
# text side (runs in the caller; cheap, no math-verify)


def _strip_text_wrappers(s: str) -> str:
    """``$\\text{Yes}$.`` -> ``yes``: math delimiters, text macros and a final period go, case is folded."""
    prev = None
    while s != prev:
        prev = s
        s = s.strip().strip("$").rstrip(".").strip()
        m = re.fullmatch(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mbox|operatorname)\s*\{(.*)\}", s, flags=re.S)
        if m:
            s = m.group(1)
    return s.lower()


def _gold_latex(gold: str) -> str:
    g = gold.strip()
    if "\\boxed" in g or (len(g) >= 2 and g.startswith("$") and g.endswith("$")):
        return g
    return f"${g}$"


def extract_prediction(completion: str) -> str | None:
    """The content of the last ``\\boxed{}`` after the last ``</think>``, or None."""
    from agon.tasks.text import last_boxed, visible_text

    visible = visible_text(completion)
    if visible is None:
        return None
    box = last_boxed(visible)
    if box is None or not box.strip():
        return None
    return box


# ---------------------------------------------------------------------------------------------------------------
# worker side (runs in the worker process's main thread, where math-verify's signal timeouts work)


def grade(gold: str, pred_box: str, timeout_s: int = 5) -> tuple[str, bool, str]:
    """(status, correct, detail) for a gold answer and the content of the predicted box."""
    from math_verify import LatexExtractionConfig, parse, verify
    from math_verify.errors import TimeoutException

    try:
        gold_parsed = parse(_gold_latex(gold), parsing_timeout=timeout_s, raise_on_error=True)
        if not gold_parsed:
            return "unscorable", False, f"gold answer does not parse: {gold[:200]!r}"
        pred_parsed = parse(
            "\\boxed{" + pred_box + "}",
            extraction_config=[LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)],
            extraction_mode="first_match",
            parsing_timeout=timeout_s,
            raise_on_error=True,
        )
        if not pred_parsed:
            return "wrong", False, "boxed answer does not parse"
        ok = verify(gold=gold_parsed, target=pred_parsed, timeout_seconds=timeout_s, raise_on_error=True)
        return ("ok", True, "") if ok else ("wrong", False, "")
    except TimeoutException as e:
        return "timeout", False, f"math-verify timeout: {str(e)[:200]}"
    except Exception as e:
        return "error", False, f"{type(e).__name__}: {str(e)[:200]}"


def _set_parent_death_signal() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _worker_main() -> None:
    """Protocol: one JSON object per line on stdin ({"gold", "pred", "timeout"}), one per line back on stdout.

    The worker ends at EOF on stdin (the pool closed it, or the parent died), and by SIGKILL when the thread that
    started it ends (PR_SET_PDEATHSIG), which also covers a worker stuck in C code when the trainer dies.
    """
    _set_parent_death_signal()
    mem_mb = int(os.environ.get("AGON_MATH_WORKER_MEMORY_MB", "0") or 0)
    if mem_mb > 0:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    # keep the protocol stream clean of anything a library prints
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    logging.disable(logging.CRITICAL)
    import math_verify  # noqa: F401  (import before saying ready: the start-up is not charged to an item)

    proto.write('{"ready": true}\n')
    for line in sys.stdin:
        try:
            req = json.loads(line)
            status, correct, detail = grade(req["gold"], req["pred"], int(req.get("timeout", 5)))
        except BaseException as e:  # noqa: BLE001  (the worker must answer every line)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            status, correct, detail = "error", False, f"{type(e).__name__}: {str(e)[:200]}"
        proto.write(json.dumps({"status": status, "correct": correct, "detail": detail}) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# the pool (parent side)


class _Worker:
    def __init__(self, env: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agon.tasks.math_verifier"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self.buf = b""
        self.ready = False
        self.item: int | None = None
        self.deadline = 0.0
        self.started = time.monotonic()
        os.set_blocking(self.proc.stdout.fileno(), False)

    def send(self, item: int, payload: dict, deadline: float) -> None:
        self.item, self.deadline = item, deadline
        self.proc.stdin.write((json.dumps(payload) + "\n").encode())
        self.proc.stdin.flush()

    def read_lines(self) -> list[str] | None:
        """Complete lines available now; None at EOF (the worker died)."""
        try:
            chunk = os.read(self.proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return []
        if not chunk:
            return None
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [ln.decode() for ln in lines if ln.strip()]

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _shutdown(workers: list[_Worker], spawner: ThreadPoolExecutor) -> None:
    for w in workers:
        w.kill()
    workers.clear()
    spawner.shutdown(wait=False)


class MathVerifier:
    """A pool of ``workers`` math-verify processes; ``timeout_s`` is the outer deadline per item.

    Workers start on first use and are replaced when one dies or overruns. ``startup_timeout_s`` bounds the
    start of a worker (importing sympy takes seconds on a loaded machine); it is not charged to any item.
    ``inner_timeout_s`` is math-verify's own (signal) timeout inside the worker, by default half the outer one.
    ``memory_mb`` caps each worker's address space (a pathological expression fails instead of swapping).
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 10.0,
        startup_timeout_s: float = 120.0,
        memory_mb: int = 4096,
        inner_timeout_s: int | None = None,
    ):
        if workers < 1:
            raise ValueError(f"workers={workers} must be >= 1")
        self.n_workers, self.timeout_s, self.startup_timeout_s = workers, float(timeout_s), startup_timeout_s
        # math-verify's own (signal) timeouts fire first, so a slow item is usually reported by the worker itself
        self.inner_timeout_s = inner_timeout_s if inner_timeout_s is not None else max(1, int(self.timeout_s / 2))
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["AGON_MATH_WORKER_MEMORY_MB"] = str(memory_mb)
        self._env = env
        self.restarts = 0
        # workers die with the thread that started them (PR_SET_PDEATHSIG), so one long-lived thread starts them all
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="math-verify-spawner")
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._spawner)

    # --- public ----------------------------------------------------------------------------------------------

    def verify(self, golds: Sequence[str | None], completions: Sequence[str]) -> list[MathVerdict]:
        """Grade ``completions[i]`` against ``golds[i]``; never raises for a bad completion."""
        if len(golds) != len(completions):
            raise ValueError(f"{len(golds)} gold answers for {len(completions)} completions")
        out: list[MathVerdict | None] = [None] * len(golds)
        todo: list[tuple[int, str, str]] = []
        for i, (gold, completion) in enumerate(zip(golds, completions)):
            pred = extract_prediction(completion)
            if pred is None:
                out[i] = MathVerdict(False, False, "no_answer", "no \\boxed{} answer after </think>")
            elif gold is None or not str(gold).strip():
                out[i] = MathVerdict(False, True, "unscorable", "no gold answer")
            elif _strip_text_wrappers(str(gold)) in STRING_ANSWERS:
                ok = _strip_text_wrappers(pred) == _strip_text_wrappers(str(gold))
                out[i] = MathVerdict(ok, True, "ok" if ok else "wrong", "compared as strings")
            else:
                todo.append((i, str(gold), pred))
        if todo:
            with self._lock:
                for i, (status, correct, detail) in self._run(todo).items():
                    out[i] = MathVerdict(correct, True, status, detail)
        return out  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            _shutdown(self._workers, self._spawner)

    def __enter__(self) -> "MathVerifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- dispatch --------------------------------------------------------------------------------------------

    def _start(self) -> _Worker:
        w = self._spawner.submit(_Worker, self._env).result()
        self._workers.append(w)
        return w

    def _retire(self, w: _Worker) -> None:
        w.kill()
        self._workers.remove(w)

    def _run(self, todo: list[tuple[int, str, str]]) -> dict[int, tuple[str, bool, str]]:
        results: dict[int, tuple[str, bool, str]] = {}
        pending = deque(todo)
        failed_starts = 0
        while len(self._workers) < min(self.n_workers, len(todo)):
            self._start()
        sel = selectors.DefaultSelector()
        try:
            while pending or any(w.item is not None for w in self._workers):
                now = time.monotonic()
                # hand out work
                for w in self._workers:
                    if w.ready and w.item is None and pending:
                        i, gold, pred = pending.popleft()
                        try:
                            payload = {"gold": gold, "pred": pred, "timeout": self.inner_timeout_s}
                            w.send(i, payload, now + self.timeout_s)
                        except OSError:
                            pending.appendleft((i, gold, pred))
                            w.item = None
                            w.proc.kill()  # noticed as EOF below
                # wait for answers or the nearest deadline
                deadlines = [w.deadline if w.item is not None else w.started + self.startup_timeout_s
                             for w in self._workers if w.item is not None or not w.ready]
                wait = max(0.0, min(deadlines) - now) if deadlines else 0.05
                for w in self._workers:
                    try:
                        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
                    except (KeyError, ValueError):
                        pass
                events = sel.select(min(wait, 1.0))
                for key, _ in events:
                    w: _Worker = key.data
                    lines = w.read_lines()
                    if lines is None:  # died
                        sel.unregister(w.proc.stdout)
                        if w.item is not None:
                            results[w.item] = ("error", False, f"math-verify worker died (exit {w.proc.poll()})")
                        else:
                            failed_starts += 1
                        self._retire(w)
                        self.restarts += 1
                        continue
                    for line in lines:
                        try:
                            msg = json.loads(line)
                        except ValueError:
                            msg = {"status": "error", "correct": False, "detail": f"bad worker reply {line[:80]!r}"}
                        if msg.get("ready"):
                            w.ready, failed_starts = True, 0
                        elif w.item is not None:
                            results[w.item] = (msg["status"], bool(msg["correct"]), msg.get("detail", ""))
                            w.item = None
                # overruns
                now = time.monotonic()
                for w in list(self._workers):
                    late_item = w.item is not None and now > w.deadline
                    late_start = not w.ready and now > w.started + self.startup_timeout_s
                    if late_item or late_start:
                        try:
                            sel.unregister(w.proc.stdout)
                        except (KeyError, ValueError):
                            pass
                        if late_item:
                            why = f"no answer within {self.timeout_s:g}s; worker replaced"
                            results[w.item] = ("timeout", False, why)
                        else:
                            failed_starts += 1
                        self._retire(w)
                        self.restarts += 1
                if failed_starts >= 3:
                    while pending:
                        i, _, _ = pending.popleft()
                        results[i] = ("error", False, "math-verify workers fail to start")
                    log.error("math-verify workers fail to start (%d attempts)", failed_starts)
                # keep the pool at strength while there is work
                want = min(self.n_workers, len(pending) + sum(w.item is not None for w in self._workers))
                while len(self._workers) < want:
                    self._start()
        finally:
            sel.close()
        return results


if __name__ == "__main__":
    _worker_main()
