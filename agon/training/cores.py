"""Torch's CPU threads: as many as the cores this process may really use, and fewer while other work shares them.

torch starts a thread per core it sees, not per core it may use: a container's CPU quota (cgroup ``cpu.max``) and an
affinity mask (``taskset``, SLURM's core binding) are both ignored. And OpenMP's threads spin while they wait for
each other, so two runs whose threads share cores wait on each other's spinning: measured on 2 cores, two
``make run``s stepping together took 5.8-6.0x their time alone with 2 threads each, and 1.47x with 1 thread each
(10-step runs, median step).

``usable_cores`` reads the affinity mask and the cgroup quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``);
``start_threads`` gives torch that many (shared among the processes of one launch on this node). ``SharedCores``
then reads, after every step, how long this process's threads waited for a core (the kernel's run delay,
``/proc/self/task/*/schedstat``, measured over the step alone, not the checkpoints and evaluations between steps):
when they waited more than ``SHARED_WAIT`` of ``SHARED_STEPS`` steps in a row, other work shares the cores, torch's
threads are halved (down to one), and the run warns once, saying what to set. Once the machine's load
shows the other work gone, the threads come back.

A count set by the user (``OMP_NUM_THREADS``) is kept and never changed: changing the thread count changes the order
of float sums, so a run whose threads followed the load is not bitwise the same run twice; the warning says so.

Left out on purpose: the vLLM worker's threads (vLLM sets its own, ``VLLM_CPU_OMP_THREADS_BIND``) and a GPU run's
(its CPU threads do the verifiers' work, not the model's).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Callable

import torch

# a step in which this process's threads waited this share of their time for a core: the cores are shared (alone
# on 2 cores the trainer's threads wait about 0-3% of a step; with a second run of 2 threads, 35-60%)
SHARED_WAIT = 0.25
# steps in a row over it before the threads are halved
SHARED_STEPS = 1
USER_THREADS = "OMP_NUM_THREADS"


def cgroup_quota(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """Cores' worth of CPU time this process's cgroup may use (quota over period), None without a quota: cgroup v2's
    ``cpu.max`` of the process's own group (``/proc/self/cgroup``) or of the mount's root, else v1's
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``."""
    groups = []
    try:
        for line in proc_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                groups.append(root / line[3:].lstrip("/"))
    except OSError:
        pass
    for group in [*groups, root]:
        try:
            quota, period = (group / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        except (OSError, ValueError):
            continue
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), at most its cgroup's quota rounded up."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else max(1, cores)


def start_threads(processes_here: int = 1) -> int:
    """Give torch this process's share of the usable cores (``processes_here``: the launch's processes on this node),
    unless ``OMP_NUM_THREADS`` chose a count; the count torch now has."""
    if USER_THREADS not in os.environ:
        torch.set_num_threads(max(1, usable_cores() // max(processes_here, 1)))
    return torch.get_num_threads()


def _run_delay_ns() -> int:
    """Nanoseconds this process's threads (those alive now) have waited on a run queue: the second field of each
    thread's ``schedstat``."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            total += int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


class SharedCores:
    """After each step, the share of their time this process's torch threads waited for a core; halves torch's
    threads while it exceeds ``SHARED_WAIT`` and gives them back once the load says the cores are free again. Does
    nothing where the user set the thread count, or where the kernel keeps no run delay."""

    def __init__(self, log: Callable[[str], None], enabled: bool = True):
        self.log = log
        self.full = torch.get_num_threads()
        self.enabled = enabled and USER_THREADS not in os.environ and Path("/proc/self/schedstat").exists()
        self.warned = False
        self.waited = 0  # steps in a row over SHARED_WAIT
        self.start()

    def start(self) -> None:
        """Where a step begins: what ``observe`` measures is the step alone, not the checkpoints and evaluations
        between steps."""
        self._last = (time.monotonic(), _run_delay_ns())

    def observe(self) -> float:
        """The share of the time since ``start`` that torch's threads waited for a core (0 when disabled); adjusts
        the thread count as it says."""
        now, delay = time.monotonic(), _run_delay_ns()
        (then, before), self._last = self._last, (now, delay)
        if not self.enabled or now <= then:
            return 0.0
        threads = torch.get_num_threads()
        wait = max(delay - before, 0) / 1e9 / ((now - then) * threads)
        self.waited = self.waited + 1 if wait > SHARED_WAIT else 0
        if self.waited >= SHARED_STEPS and threads > 1:
            torch.set_num_threads(threads // 2)
            self.waited = 0
            self._warn(wait, threads)
        elif threads < self.full and os.getloadavg()[0] < threads + 0.5:  # the rest of the load is gone
            torch.set_num_threads(self.full)
            self.log(f"[agon] the cores are free again: torch threads {threads} -> {self.full}")
        return wait

    def _warn(self, wait: float, threads: int) -> None:
        line = (f"torch threads {threads} -> {threads // 2}: this run's threads waited for a core {wait:.0%} of the "
                f"last step (load {os.getloadavg()[0]:.1f} on {usable_cores()} usable cores)")
        if self.warned:
            self.log(f"[agon] {line}")
            return
        self.warned = True
        self.log(f"[agon] warning: another job shares this machine's cores; {line}. Two runs on shared cores slow "
                 f"each other far more than their share; the thread count now follows the load, so this run is not "
                 f"bitwise repeatable. Give each run its own cores (taskset, SLURM's --cpus-per-task) or fix the "
                 f"count with OMP_NUM_THREADS=<cores per run>")
