"""Preemption: SIGTERM stops a run cleanly, its committed work kept, and asks the scheduler to run it again.

SLURM sends SIGTERM to every process of a job it preempts or cancels (a grace time before SIGKILL), as a container
runtime does to a container it stops. Under ``stop_on_sigterm`` the first SIGTERM raises ``Preempted`` in the main
thread, wherever it is: everything a run writes is atomic or journaled (checkpoints, the JSONL records, an
evaluation's committed rounds and chunks), so stopping anywhere loses only what came after the last commit, and the
``finally`` blocks run: the engine is closed (its worker killed at once if it was mid-call: there is no time to ask
it), W&B finished as preempting. Then ``requeue`` hands the job back: under submitit (``hydra/launcher=slurm`` or
``local``) its own handler requeues it, and the same cell resumes (``trainer.resume=auto``); otherwise the process
exits with ``EXIT_CODE``, and the same command resumes it.

The vLLM worker ignores a SIGTERM while its trainer lives (``vllm_worker._die_with_parent``): SLURM signals it too,
and the trainer, not the worker, decides when the engine ends.

Left out on purpose: finishing the step in flight or writing a checkpoint on the way out. A paper cell's step is
minutes, often longer than a cluster's grace time, and a checkpoint cut by the SIGKILL after it is one more partial
write; the last checkpoint and the committed rounds are what a resume needs.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator

# what a shell reports for a process that SIGTERM ended (128 + 15): a wrapper script or a workflow tool reads it as
# "stopped from outside", not as a failure of the run
EXIT_CODE = 128 + signal.SIGTERM


class Preempted(BaseException):
    """SIGTERM reached the run. A BaseException, as KeyboardInterrupt is: Hydra's and the run's handlers of errors
    (``except Exception``) must not count it as a failed cell and go on to the next one."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While the block runs, the first SIGTERM raises ``Preempted`` in the main thread; later ones are ignored (the
    clean-up they would cut short is what the first one started). The handler before it comes back after. Outside
    the main thread (where Python cannot take signals) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Preempted("SIGTERM: the run stopped, keeping its last checkpoint and every committed evaluation round")

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def requeue() -> None:
    """Hand a preempted job back to submitit when this process is one of its jobs: its signal handler (the one its
    time limit sends, ``SUBMITIT_PREEMPT_SIGNAL``, USR2 by default) requeues the job and exits. Returns when this
    process is not a submitit job; the caller exits with ``EXIT_CODE``."""
    try:
        from submitit.core.job_environment import JobEnvironment
    except ImportError:
        return
    handler = signal.getsignal(JobEnvironment._usr_sig())
    if type(getattr(handler, "__self__", None)).__name__ == "SignalHandler" and callable(handler):
        print("[agon] preempted: asking submitit to requeue this job", file=sys.stderr, flush=True)
        handler(JobEnvironment._usr_sig(), None)  # requeues and exits (sys.exit); a job out of requeues raises
