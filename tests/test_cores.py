"""Torch's CPU threads (``agon.training.cores``): the cgroup quota as the kernel writes it, the affinity mask of a
process started on one core, the user's OMP_NUM_THREADS kept, and a run's threads halved, with one warning, once
busy processes share its cores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agon.training.cores import cgroup_quota

ROOT = Path(__file__).parents[1]


def _env(**extra: str) -> dict[str, str]:
    """This environment without the tests' own thread count (conftest sets OMP_NUM_THREADS)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def test_the_cgroup_quota_is_read_from_v2s_own_group_then_its_root_then_v1(tmp_path):
    root, proc = tmp_path / "cgroup", tmp_path / "proc-self-cgroup"
    (root / "job" / "step").mkdir(parents=True)
    proc.write_text("0::/job/step\n")
    assert cgroup_quota(root, proc) is None  # no cpu.max anywhere
    (root / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(root, proc) is None  # v2 without a quota
    (root / "job" / "step" / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(root, proc) == 1.5  # the process's own group first
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(v1, tmp_path / "absent") == 0.5
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota(v1, tmp_path / "absent") is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="affinity masks are Linux's")
def test_a_process_bound_to_one_core_gets_one_torch_thread_unless_omp_num_threads_says_otherwise():
    script = ("import os, torch; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); torch.set_num_threads(4)\n"
              "from agon.training.cores import start_threads, usable_cores\n"
              "print(usable_cores(), start_threads(), torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "1", "1"], out.stderr
    out = subprocess.run([sys.executable, "-c", script], env=_env(OMP_NUM_THREADS="3"), capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split() == ["1", "4", "4"], out.stderr  # the user's choice (here overridden after it) stays


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="halving needs two threads")
def test_a_run_whose_cores_busy_processes_share_halves_its_threads_and_warns_once():
    """Two processes spinning on the cores while this one multiplies matrices on two threads: its threads wait for
    a core most of the time, so after SHARED_STEPS such steps the watch halves them to one and warns once, naming
    OMP_NUM_THREADS."""
    script = """
import subprocess, sys, time, torch
torch.set_num_threads(2)
from agon.training.cores import SHARED_STEPS, SharedCores
said = []
watch = SharedCores(said.append)
busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
try:
    time.sleep(0.5)
    a = torch.randn(512, 512)
    waits = []
    for _ in range(SHARED_STEPS):
        watch.start()
        t0 = time.time()
        while time.time() - t0 < 2:
            a = (a @ a).clamp_(-1, 1)
        waits.append(watch.observe())
        if len(waits) < SHARED_STEPS:
            assert torch.get_num_threads() == 2, "halved too early"
    wait = min(waits)
finally:
    for p in busy:
        p.kill()
print(round(wait, 2), torch.get_num_threads(), len(said))
print(said[0] if said else "")
"""
    out = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=120)
    wait, threads, warnings = out.stdout.splitlines()[0].split()
    assert float(wait) > 0.25 and threads == "1" and warnings == "1", out.stdout + out.stderr
    assert "another job shares this machine's cores" in out.stdout and "OMP_NUM_THREADS" in out.stdout
