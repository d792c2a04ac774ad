"""math-verify through the worker pool: grading rules, threads, and a hung worker replaced with a timeout."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from agon.tasks import Verdict
from agon.tasks.math_verifier import MathVerdict, MathVerifier, extract_prediction


@pytest.fixture(scope="module")
def mv():
    with MathVerifier(workers=2, timeout_s=10) as v:
        yield v


def done(answer: str, reasoning: str = "let me think") -> str:
    return f"<think>{reasoning}</think>\nSo the result follows.\n\\boxed{{{answer}}}"


CASES = [
    # gold, completion, status, correct, format_ok
    ("\\frac{1}{2}", done("0.5"), "ok", True, True),
    ("x^2+1", done("1+x^2"), "ok", True, True),
    ("\\frac{\\pi}{4}", done("0.785398"), "ok", True, True),
    ("1000", done("1,000"), "ok", True, True),
    ("(1,2)", done("(2,1)"), "wrong", False, True),
    ("3", done("4"), "wrong", False, True),
    # the last box after </think> is the answer
    ("5", "<think>maybe \\boxed{1}</think> first \\boxed{1}, finally \\boxed{5}", "ok", True, True),
    ("1", "<think>\\boxed{1}</think> first \\boxed{1}, finally \\boxed{5}", "wrong", False, True),
    # format failures: no closed reasoning block, no box, a box only inside the reasoning, a bare number
    ("3", "<think>it is 3 \\boxed{3}", "no_answer", False, False),
    ("3", "<think>hm</think> The answer is 3.", "no_answer", False, False),
    ("3", "<think>\\boxed{3}</think> The answer is 3.", "no_answer", False, False),
    ("3", "<think>x</think> \\boxed{}", "no_answer", False, False),
    # yes/no/true/false compare as strings (math-verify would read "Yes" as the product E*s*y)
    ("Yes", done("\\text{yes}"), "ok", True, True),
    ("Yes", done("sey"), "wrong", False, True),
    ("False", done("$\\textbf{False}$."), "ok", True, True),
    ("No", done("Yes"), "wrong", False, True),
    # an unparseable gold answer is the verifier's problem, not the model's
    ("\\", done("1"), "unscorable", False, True),
]


def test_grading_rules(mv):
    got = mv.verify([c[0] for c in CASES], [c[1] for c in CASES])
    for (gold, completion, status, correct, format_ok), v in zip(CASES, got):
        assert (v.status, v.correct, v.format_ok) == (status, correct, format_ok), (gold, completion, v)


def test_unscorable_is_counted_as_a_verifier_failure(mv):
    (v,) = mv.verify(["\\"], [done("1")])
    assert Verdict(v.correct, v.format_ok, v.status, v.detail).failed


def test_extract_prediction():
    assert extract_prediction(done("\\frac{1}{2}")) == "\\frac{1}{2}"
    assert extract_prediction("no think block \\boxed{2}") is None


def test_from_threads_and_asyncio(mv):
    golds, comps = ["\\frac{1}{2}", "7", "Yes"], [done("1/2"), done("8"), done("yes")]
    expected = [(True, "ok"), (False, "wrong"), (True, "ok")]

    def summary(vs: list[MathVerdict]):
        return [(v.correct, v.status) for v in vs]

    out = []
    t = threading.Thread(target=lambda: out.append(mv.verify(golds, comps)))
    t.start()
    t.join(60)
    assert summary(out[0]) == expected
    with ThreadPoolExecutor(3) as ex:  # concurrent callers from several threads are serialised, not mixed up
        for vs in ex.map(lambda _: mv.verify(golds, comps), range(3)):
            assert summary(vs) == expected
    assert summary(asyncio.run(asyncio.to_thread(mv.verify, golds, comps))) == expected


def test_hung_worker_is_replaced_and_scored_timeout():
    # math-verify's own timeout set far beyond the outer deadline, so only the outer deadline can end the item
    with MathVerifier(workers=1, timeout_s=1.5, inner_timeout_s=60) as v:
        assert v.verify(["2"], [done("2")])[0].status == "ok"  # worker started and warm
        (worker,) = v._workers
        pid = worker.proc.pid
        t0 = time.monotonic()
        got = v.verify(["1", "2"], [done("9^{9^{9^{9^{9}}}}"), done("2")])
        assert got[0].status == "timeout" and not got[0].correct and got[0].format_ok
        assert got[1].status == "ok" and got[1].correct  # graded by the replacement worker
        assert v.restarts == 1
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert time.monotonic() - t0 < 30
    assert v._workers == []


def test_close_ends_the_workers():
    v = MathVerifier(workers=1, timeout_s=5)
    assert v.verify(["1"], [done("1")])[0].correct
    pids = [w.proc.pid for w in v._workers]
    v.close()
    assert all(not psutil.pid_exists(p) for p in pids)


def test_workers_die_with_the_trainer():
    import signal
    import subprocess
    import sys
    from pathlib import Path

    trainer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading, time\n"
            "from agon.tasks.math_verifier import MathVerifier\n"
            "v = MathVerifier(workers=1)\n"
            "out = []\n"
            "t = threading.Thread(target=lambda: out.append(v.verify(['1'], ['</think>\\\\boxed{1}'])))\n"
            "t.start(); t.join()\n"  # started from a thread that has ended: the worker must survive that
            "assert out[0][0].correct\n"
            "print(v._workers[0].proc.pid, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
    )
    try:
        pid = int(trainer.stdout.readline())
        time.sleep(0.3)
        assert psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
        deadline = time.monotonic() + 5
        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        trainer.kill()
        trainer.wait()
