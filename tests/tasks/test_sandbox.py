"""Hostile programs through the sandbox: each is contained, bounded in time and leaves nothing behind.

"Nothing behind" (``run``): no process of this process's runs (found by their cgroups) and no new child of this
process survives, no run cgroup, working directory or file of a sandbox uid is left, and this process's memory and
descriptors are back where they were. Only this process's own runs count: another trainer's on the same host (its
uids, its working directories, its tmpfs) are none of these tests' business. Every case uses CPU limits of one to a
few seconds so that none can starve a 2-core machine, and wall clocks far enough off that a busy host does not
change a verdict, except where the wall clock is the subject. The sandbox needs bubblewrap, root and cgroups:
``make test`` installs bubblewrap; where isolation cannot be set up these tests fail (the sandbox fails closed),
except the ones about failing closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator

import psutil
import pytest

from agon.tasks import sandbox as sbx
from agon.tasks.isolation import (
    UID_BASE,
    UID_SLOTS,
    RunCgroup,
    SandboxUnavailable,
    UidSlots,
    run_cgroup_owner_of,
    seccomp_filter,
)
from agon.tasks.sandbox import (
    ISOLATION_BWRAP,
    ISOLATION_UNSAFE,
    WORKDIR_PREFIX,
    LocalSandbox,
    RunRequest,
    RunResult,
    Sandbox,
    run_cgroup_owner,
)

X86 = platform.machine() == "x86_64"
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    return LocalSandbox()


# children this test process already had (e.g. a service another test file started): not the sandbox's
_BASELINE_CHILDREN = {c.pid for c in psutil.Process().children(recursive=True)}
SANDBOX_UIDS = range(UID_BASE, UID_BASE + UID_SLOTS)


def run_processes(owners: Iterable[int]) -> list[psutil.Process]:
    """The live processes of the sandbox runs that the processes ``owners`` started: every process in one of their
    run cgroups (a run's processes cannot leave it, and its name keeps the owner's pid after the owner died), and
    every descendant of a live owner that runs as a sandbox uid. Another trainer's runs on this host are never
    among them, whichever uids they hold."""
    owners = set(owners)
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and run_cgroup_owner_of(p.pid) in owners:
            found[p.pid] = p
    for owner in owners:
        with contextlib.suppress(psutil.NoSuchProcess):
            for c in psutil.Process(owner).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    if _uid(c) in SANDBOX_UIDS and c.status() != psutil.STATUS_ZOMBIE:
                        found[c.pid] = c
    return [found[pid] for pid in sorted(found)]


def _uid(p: psutil.Process) -> int | None:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        return p.uids().real
    return None


def _alive(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    return False


def _name(p: psutil.Process) -> str:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        return p.name()
    return "(gone)"


def leftovers(sb: LocalSandbox | None = None) -> list[str]:
    """What this test process's runs may have left: their processes, new children of this process and, with ``sb``,
    their run cgroups and working directories. Only this process's own runs count, never another trainer's on the
    same host (a scan of every sandbox uid failed whenever one ran beside the tests)."""
    me = os.getpid()
    found = [f"{p.pid}:{_name(p)} (uid {_uid(p)})" for p in run_processes([me])]
    for c in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if c.pid not in _BASELINE_CHILDREN and c.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{c.pid}:{c.name()} (child)")
    if sb is not None:
        if sb.cgroups is not None:
            found += [str(d) for p in sb.cgroups.parents.values() if p.is_dir() for d in p.iterdir()
                      if run_cgroup_owner(d.name) == me]
        found += [d for d in os.listdir(sb.tmp_root) if d.startswith(f"{WORKDIR_PREFIX}{me}-")]
    return found


def _host_files(sb: LocalSandbox) -> set[str]:
    """Files on the host's shared file systems (/dev/shm, /tmp, the sandbox's tmp root) that a sandbox uid owns:
    only a run's program could have made one. Everyone else's files come and go on a shared host, and the
    sandbox's own working directories are counted per trainer by ``leftovers``."""
    found = set()
    for d in {"/dev/shm", "/tmp", sb.tmp_root}:
        for name in os.listdir(d):
            with contextlib.suppress(OSError):
                if os.lstat(os.path.join(d, name)).st_uid in SANDBOX_UIDS:
                    found.add(f"{d}/{name}")
    return found


@contextlib.contextmanager
def nothing_left_behind(sb: LocalSandbox, what: str) -> Iterator[None]:
    """Around runs of ``sb``: afterwards nothing of theirs is left running, no file of theirs is on the host's
    shared file systems, and this process's memory and descriptors are back where they were. A run's tmpfs
    outlives it only while its mount namespace is held, by one of its processes or by a descriptor of this one,
    so both are counted instead of the host's shared memory, which other trainers' runs move."""
    me = psutil.Process()
    rss, fds, files = me.memory_info().rss, me.num_fds(), _host_files(sb)
    yield
    assert leftovers(sb) == [], f"left behind after {what}"
    assert _host_files(sb) - files == set(), f"files left by {what}"
    assert me.memory_info().rss - rss < 64 << 20
    assert me.num_fds() <= fds, f"descriptors left open by {what}"


def run(sb: LocalSandbox, code: str, **kw) -> RunResult:
    """One run through the verifier's path, then nothing of it left (``nothing_left_behind``)."""
    kw.setdefault("time_limit_s", 1)
    kw.setdefault("wall_time_s", 30)  # far off unless a test is about it: a busy host slows every start
    with nothing_left_behind(sb, repr(code[:60])):
        return sb.run(RunRequest(code=textwrap.dedent(code), **kw))


# ---------------------------------------------------------------------------------------------------------------
# the interface and what the program sees


def test_interface_and_isolation(sandbox):
    assert isinstance(sandbox, Sandbox)
    assert sandbox.isolation == ISOLATION_BWRAP, sandbox.note
    res = run(sandbox, "n = int(input())\nprint(sum(map(int, input().split())) * n)\n", stdin="2\n1 2 3\n")
    assert (res.status, res.return_code, res.stdout, res.truncated) == ("ok", 0, "12\n", False)


def test_the_program_sees_only_its_own_files_processes_and_user(sandbox, tmp_path):
    secret = tmp_path / "expected_output.txt"  # like a local CodeContests copy's test files
    secret.write_text("42\n")
    res = run(sandbox, f"""
        import os
        print(sorted(os.listdir("/")))
        print(sorted(os.listdir("/work")), os.getcwd())
        print(os.getuid(), os.getgid(), os.getgroups())
        print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        for path in ({str(secret)!r}, "/etc/shadow", "/root", "/proc/1/environ"):
            try:
                open(path).read()
                print("read", path)
            except OSError as e:
                print("no", type(e).__name__)
        print(repr(open("/etc/passwd").read()))
        """)
    lines = res.stdout.splitlines()
    # etc: the run's account (passwd, group) and nothing else; run: its stdin (STDIN_PATH)
    assert lines[0] == str(sorted(["bin", "dev", "etc", "lib", "lib64", "proc", "run", "sbin", "tmp", "usr", "work"]))
    assert lines[1] == "['main.py'] /work"
    uid = int(lines[2].split()[0])
    assert UID_BASE <= uid < UID_BASE + UID_SLOTS and lines[2] == f"{uid} {uid} []"
    assert len(eval(lines[3])) <= 3  # bwrap's init, the monitor, the program: none of the host's  # noqa: S307
    assert all(ln.startswith("no ") for ln in lines[4:8]), lines[4:]
    assert lines[8] == repr(f"judge:x:{uid}:{uid}:judge:/work:/usr/sbin/nologin\n")  # its own account, no other


def test_no_way_back_to_root(sandbox):
    res = run(sandbox, """
        import os
        for name, call in (("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                           ("setgroups", lambda: os.setgroups([0])), ("chroot", lambda: os.chroot("/tmp"))):
            try:
                call()
                print(name, "allowed")
            except OSError as e:
                print(name, type(e).__name__)
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        print(status["CapEff"].strip(), status["CapBnd"].strip(), status["NoNewPrivs"].strip())
        """)
    lines = res.stdout.splitlines()
    assert lines[:4] == ["setuid PermissionError", "setgid PermissionError", "setgroups PermissionError",
                         "chroot PermissionError"], lines
    assert lines[4] == "0000000000000000 0000000000000000 1"


def test_environment_is_allow_listed(sandbox, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_fakeSecretToken456")
    monkeypatch.setenv("WANDB_API_KEY", "fake-wandb-secret-123")
    res = run(sandbox, "import os\nprint(dict(os.environ))\n")
    assert "fake" not in res.stdout and "TOKEN" not in res.stdout
    allowed = {"PATH", "LANG", "PYTHONIOENCODING", "LC_CTYPE", "PWD", "HOME", "USER", "LOGNAME"}
    assert set(eval(res.stdout)) <= allowed  # noqa: S307


def test_no_network_not_even_host_loopback_or_unix_sockets(sandbox, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    path = str(tmp_path / "docker.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(path)
    unix.listen()
    try:
        res = run(sandbox, f"""
            import socket
            for family, address in ((socket.AF_INET, ("127.0.0.1", {server.getsockname()[1]})),
                                    (socket.AF_INET, ("1.1.1.1", 80)), (socket.AF_UNIX, {path!r})):
                try:
                    s = socket.socket(family)
                    s.settimeout(1)
                    s.connect(address)
                    print("connected")
                except OSError as e:
                    print("refused", type(e).__name__, e.errno)
            """)
        # only UNIX sockets can be made at all (seccomp), and no host socket file is in the run's file system
        assert res.stdout.splitlines() == ["refused OSError 97", "refused OSError 97",
                                           "refused FileNotFoundError 2"], res.stdout
    finally:
        server.close()
        unix.close()


def test_read_only_program_and_system_and_private_tmp(sandbox):
    res = run(sandbox, """
        import os
        for path in ("/work/main.py", "/usr/bin/python3", "/usr/evil"):
            try:
                open(path, "a").write("x")
                print("wrote", path)
            except OSError as e:
                print("no", type(e).__name__)
        open("/tmp/left-behind", "w").write("x")
        open("/dev/shm/left-behind", "w").write("x")
        open("/work/scratch", "w").write("x")
        print("ok")
        """)
    lines = res.stdout.splitlines()  # the program file is root's and read-only; /usr is a read-only mount
    assert [ln.split()[0] for ln in lines[:3]] == ["no"] * 3 and lines[3] == "ok", res.stdout
    again = run(sandbox, "import os\nprint(os.listdir('/tmp'), os.listdir('/dev/shm'), os.listdir('/work'))\n")
    assert again.stdout == "[] [] ['main.py']\n"
    assert not os.path.exists("/tmp/left-behind") and not os.path.exists("/dev/shm/left-behind")


@pytest.mark.skipif(not X86, reason="syscall numbers of x86_64")
def test_the_seccomp_filter_refuses_namespaces_ptrace_io_uring_keyctl_bpf_mount(sandbox):
    res = run(sandbox, """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        CLONE_NEWUSER = 0x10000000
        for name, nr, args in (("unshare", 272, (CLONE_NEWUSER,)), ("setns", 308, (0, 0)),
                               ("ptrace", 101, (16, 1, 0, 0)), ("io_uring_setup", 425, (8, 0)),
                               ("keyctl", 250, (0, 0)), ("bpf", 321, (0, 0, 0)),
                               ("mount", 165, (0, 0, 0, 0, 0)), ("perf_event_open", 298, (0, 0, 0, 0, 0)),
                               ("userfaultfd", 323, (0,)), ("clone-newuser", 56, (CLONE_NEWUSER | 17, 0, 0, 0, 0)),
                               ("clone3", 435, (0, 0))):
            r = libc.syscall(nr, *args)
            print(name, r, os.strerror(ctypes.get_errno()))
        pid = os.fork()  # plain clone still works
        if pid == 0:
            os._exit(7)
        print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """)
    out = dict(ln.split(" ", 1) for ln in res.stdout.splitlines())
    for name in ("unshare", "setns", "ptrace", "io_uring_setup", "keyctl", "bpf", "mount", "perf_event_open",
                 "userfaultfd", "clone-newuser"):
        assert out[name] == "-1 Operation not permitted", (name, out[name])
    assert out["clone3"] == "-1 Function not implemented" and out["fork"] == "7"


def test_the_filter_is_a_valid_program_for_both_architectures():
    for machine in ("x86_64", "aarch64"):
        prog = seccomp_filter(machine)
        assert len(prog) % 8 == 0 and len(prog) // 8 < 4096  # BPF_MAXINSNS
    with pytest.raises(SandboxUnavailable, match="riscv64"):
        seccomp_filter("riscv64")


# ---------------------------------------------------------------------------------------------------------------
# time, processes, memory, output, files: each ended, by its real cause


def test_infinite_loop_is_ended_by_the_runs_cpu_budget(sandbox):
    # a wall clock far off: on a busy host 1 s of CPU took more than the default 3 s of wall time
    res = run(sandbox, "while True:\n    pass\n", time_limit_s=1, wall_time_s=60)
    assert res.status == "timeout" and "CPU time" in res.detail, res


def test_cpu_split_over_processes_is_counted_for_the_run(sandbox):
    """4 processes of 0.6 s each stay under a per-process limit of 1 s but not under the run's 1 s."""
    res = run(sandbox, """
        import os, time
        for _ in range(4):
            if os.fork() == 0:
                end = time.process_time() + 0.6
                while time.process_time() < end:
                    pass
                os._exit(0)
        for _ in range(4):
            os.wait()
        print("done")
        """, time_limit_s=1, wall_time_s=60)
    assert res.status == "timeout" and res.detail.startswith("CPU time of the run"), res


def test_long_sleep_hits_the_wall_clock(sandbox):
    # long enough for the interpreter to start and print on a busy host
    res = run(sandbox, "import time\nprint('started', flush=True)\ntime.sleep(1e6)\n", wall_time_s=4)
    assert res.status == "timeout" and res.stdout == "started\n" and "wall clock" in res.detail


def test_fork_bomb_is_held_and_the_next_run_is_fine(sandbox):
    res = run(sandbox, """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """, time_limit_s=1, wall_time_s=2, max_processes=16)
    assert res.status == "timeout"
    assert run(sandbox, "print('alive')").stdout == "alive\n"


def test_setsid_daemons_and_spinners_do_not_outlive_the_run(sandbox):
    res = run(sandbox, """
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    while True:
                        pass
                os._exit(0)
        time.sleep(0.1)
        print("parent done")
        """, time_limit_s=2, wall_time_s=60)
    # the run ends with its program, not when the daemons' budget or the wall clock runs out
    assert (res.status, res.stdout) == ("ok", "parent done\n"), res


@pytest.mark.parametrize("code", [
    "x = bytearray(10**10)\n",
    "xs = []\nwhile True:\n    xs.append(bytearray(10**7))\n",
], ids=["one-allocation", "growing"])
def test_memory_bomb(sandbox, code):
    # CPU time to spare: reclaim near the limit is charged to the run, and on a busy machine the growing bomb was
    # once stopped at the default 1 s of CPU before it reached 256 MB
    res = run(sandbox, code, memory_mb=256, time_limit_s=10, wall_time_s=20)
    assert res.status == "memory", res


def test_memory_is_counted_for_the_whole_run_tmpfs_included(sandbox):
    """8 processes of 64 MB each stay under a per-process limit of 256 MB, not under the run's; files in /dev/shm
    count too. The cgroup's OOM killer ends them, and that is the verdict."""
    res = run(sandbox, """
        import os, time
        open("/dev/shm/blob", "wb").write(b"x" * (60 << 20))
        for _ in range(8):
            if os.fork() == 0:
                block = b"y" * (64 << 20)  # written, so resident (a zeroed bytearray may not be)
                time.sleep(3)
                os._exit(0)
        for _ in range(8):
            os.wait()
        print("survived")
        """, memory_mb=256, max_file_mb=64, time_limit_s=3, wall_time_s=30)
    assert res.status == "memory" and "OOM" in res.detail, res


def test_tmpfs_is_capped(sandbox):
    res = run(sandbox, """
        try:
            open("/dev/shm/big", "wb").write(b"x" * (8 << 20))
        except OSError as e:
            print(type(e).__name__, e.errno)
        """, max_file_mb=4)
    assert res.stdout.split()[-1] in ("27", "28"), res  # EFBIG (RLIMIT_FSIZE) or ENOSPC (tmpfs size)


def test_output_floods_are_capped(sandbox):
    res = run(sandbox, "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n",
              max_output_bytes=1 << 20, time_limit_s=2)
    assert res.status == "output_limit" and res.truncated and len(res.stdout) == 1 << 20
    # stderr past its cap is dropped, never a failure (debug lines are no error on a judge): an endless flood ends
    # by the CPU budget, its first bytes and its last STDERR_TAIL kept
    res = run(sandbox, "import sys\nwhile True:\n    sys.stderr.write('e' * 65536)\n", max_stderr_bytes=1 << 16)
    assert res.status == "timeout" and res.truncated and "bytes dropped" in res.stderr, res.detail
    assert len(res.stderr) < (1 << 16) + 100


def test_large_file_write_is_refused(sandbox):
    res = run(sandbox, "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (100 << 20))\n", max_file_mb=2)
    assert res.status == "runtime_error" and "File too large" in res.stderr


# ---------------------------------------------------------------------------------------------------------------
# verdicts the program cannot forge


@pytest.mark.parametrize("prefix", ["setpriv: ", "unshare: ", "bwrap: ", "agon-sandbox-setup: "])
def test_a_program_cannot_forge_a_sandbox_failure(sandbox, prefix):
    res = run(sandbox, f"import sys\nprint({prefix!r} + 'failed', file=sys.stderr)\nsys.exit(1)\n")
    assert res.status == "runtime_error" and res.return_code == 1


def test_exit_code_137_is_an_exit_code_not_a_kill(sandbox):
    res = run(sandbox, "import sys\nsys.exit(137)\n")
    assert (res.status, res.return_code, res.detail) == ("runtime_error", 137, "exit code 137")


def test_killing_the_monitor_is_the_programs_fault(sandbox):
    res = run(sandbox, "import os, signal\nprint('x', flush=True)\nos.kill(os.getppid(), signal.SIGKILL)\n")
    assert res.status == "runtime_error" and "monitor" in res.detail


def test_the_monitors_pipe_is_out_of_reach(sandbox):
    res = run(sandbox, """
        import os
        ppid = os.getppid()
        try:
            print(os.listdir(f"/proc/{ppid}/fd"))
        except OSError as e:
            print("no", type(e).__name__)
        """)
    assert res.stdout.startswith("no PermissionError"), res.stdout


@pytest.mark.parametrize("code, status, rc", [
    ("import sys\nsys.exit(0)\nprint(42)\n", "ok", 0),
    ("import os\nos._exit(0)\nprint(42)\n", "ok", 0),
    ("def f(:\n    pass\n", "runtime_error", 1),
    ("a = input()\nb = input()\n", "runtime_error", 1),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "runtime_error", -11),
], ids=["sys.exit(0)", "os._exit(0)", "syntax-error", "eof", "sigsegv"])
def test_exits_and_errors(sandbox, code, status, rc):
    res = run(sandbox, code, stdin="one line\n")
    assert (res.status, res.return_code, res.stdout) == (status, rc, "")


def test_large_unread_stdin_does_not_block_and_other_languages_are_refused(sandbox):
    assert run(sandbox, "print('ignored')\n", stdin="1 " * 2_000_000).stdout == "ignored\n"
    assert sandbox.run(RunRequest(code="int main(){}", language="cpp")).status == "sandbox_error"


# ---------------------------------------------------------------------------------------------------------------
# runs side by side


HOSTILE_NEIGHBOURS = {
    "fork-bomb": """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
    "setsid-spinners": """
        import os
        for _ in range(6):
            if os.fork() == 0:
                os.setsid()
                while True:
                    pass
        while True:
            pass
        """,
    "tamper": """
        import os, time
        end = time.time() + 2
        while time.time() < end:
            for pid in os.listdir("/proc"):
                if pid.isdigit() and int(pid) > 3:
                    try:
                        with open(f"/proc/{pid}/mem", "r+b") as mem:
                            mem.write(b"x")
                    except OSError:
                        pass
            for root in ("/tmp", "/work", "/dev/shm"):
                for name in os.listdir(root):
                    try:
                        open(os.path.join(root, name), "w").write("print(0)")
                    except OSError:
                        pass
        """,
}
CORRECT = """
import time
n = int(input())
end = time.process_time() + 0.2
while time.process_time() < end:
    pass
print(sum(range(n)))
"""


@pytest.mark.parametrize("hostile", list(HOSTILE_NEIGHBOURS))
def test_eight_runs_at_once_one_hostile_the_others_still_graded_correct(sandbox, hostile):
    def one(i: int) -> RunResult:
        if i == 0:
            return sandbox.run(RunRequest(code=textwrap.dedent(HOSTILE_NEIGHBOURS[hostile]), time_limit_s=2,
                                          wall_time_s=3, max_processes=32))
        # the wall clock far off: on a busy host the 0.2 s of CPU may take seconds; CPU time is the budget
        return sandbox.run(RunRequest(code=CORRECT, stdin=f"{i * 1000}\n", time_limit_s=2, wall_time_s=60))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    for i, r in enumerate(results[1:], start=1):
        assert (r.status, r.stdout) == ("ok", f"{sum(range(i * 1000))}\n"), (i, r)
    assert leftovers(sandbox) == []


def _wait_for(condition, timeout_s: float, what: str) -> None:
    """Poll ``condition`` until it holds; generous deadlines, since a busy host only makes things slower."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.05)


def test_a_killed_trainer_leaves_no_process_and_its_leftovers_are_cleaned_by_the_next(sandbox):
    trainer = subprocess.Popen(
        [sys.executable, "-c",
         "from agon.tasks.sandbox import LocalSandbox, RunRequest\n"
         "sb = LocalSandbox()\n"
         "print('probed', flush=True)\n"
         "sb.run(RunRequest(code='import os, time\\nif os.fork() == 0:\\n    os.setsid()\\ntime.sleep(60)', "
         "time_limit_s=30))\n"],
        stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert trainer.stdout.readline().strip() == b"probed"
        # its program and the daemon that program forked, both as a sandbox uid (the monitor too)
        sandboxed = lambda: [p for p in run_processes([trainer.pid]) if _uid(p) in SANDBOX_UIDS]  # noqa: E731
        _wait_for(lambda: len(sandboxed()) >= 2, 60, "the trainer's run never started")
        running = sandboxed()
        workdirs = [d for d in os.listdir(sandbox.tmp_root) if d.startswith(f"{WORKDIR_PREFIX}{trainer.pid}-")]
        assert len(workdirs) == 1
        trainer.kill()
        trainer.wait(10)
        # after its trainer died, a run's processes are found by their cgroup (or, with none, as they were seen)
        _wait_for(lambda: not run_processes([trainer.pid]) and not any(map(_alive, running)), 30,
                  "the killed trainer's runs outlived it")
        LocalSandbox()  # the next sandbox removes the dead trainer's directory and cgroup
        # (another trainer on this host may have been the next one: either way they are gone)
        assert not [d for d in os.listdir(sandbox.tmp_root) if d.startswith(f"{WORKDIR_PREFIX}{trainer.pid}-")]
        if sandbox.cgroups is not None:
            assert not [d for p in sandbox.cgroups.parents.values() for d in p.iterdir()
                        if run_cgroup_owner(d.name) == trainer.pid]
    finally:
        trainer.kill()
        trainer.wait()


NEIGHBOUR = r"""
import os, sys, threading
from agon.tasks.sandbox import LocalSandbox, RunRequest
sb = LocalSandbox(uid_base=int(sys.argv[1]), uid_slots=int(sys.argv[2]))
# 32 MB into its own tmpfs, then it sleeps as `sleep`: that name says it got that far
code = ("open('/dev/shm/blob', 'wb').write(b'x' * (32 << 20))\nimport ctypes, time\n"
        "ctypes.CDLL(None).prctl(15, b'sleep', 0, 0, 0)\ntime.sleep(300)\n")  # PR_SET_NAME: no /bin/sleep in a run
print(os.getpid(), flush=True)
for _ in sys.stdin:  # one long run per line
    threading.Thread(target=sb.run, args=(RunRequest(code=code, time_limit_s=60, wall_time_s=300,
                                                      memory_mb=128),)).start()
os._exit(0)  # its input closed (the test ended or died): the trainer ends, and its runs with it
"""


def test_another_trainers_runs_beside_this_test_are_not_its_leftovers_and_its_own_leftover_still_is(
        sandbox, tmp_path, monkeypatch):
    """Another trainer on this host, a process of its own and no child of this one, runs long programs as sandbox
    uids while this test's runs are checked: the checks pass and its runs never share a uid with this test's.
    Then a run of this test whose cleanup is cut leaves a process behind, and the same checks fail."""
    assert sandbox.cgroups is not None, "the leftover checks find a run's processes by their cgroup"
    base, slots = UID_BASE + UID_SLOTS - 4, 4  # both sandboxes draw from the top 4 uids, so that they collide
    ours = LocalSandbox(uid_base=base, uid_slots=slots)
    # setsid --fork: its parent exits at once, and the trainer, orphaned, is no child of this process
    launcher = subprocess.Popen(["setsid", "--fork", sys.executable, "-c", NEIGHBOUR, str(base), str(slots)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    launcher.wait(60)
    line = launcher.stdout.readline()
    assert line.strip().isdigit(), f"the other trainer did not start: {line!r}"
    neighbour = psutil.Process(int(line))
    assert neighbour.pid not in {c.pid for c in psutil.Process().children(recursive=True)}
    sleeping = lambda: [p for p in run_processes([neighbour.pid]) if _name(p) == "sleep"]  # noqa: E731
    their_workdirs = lambda: [d for d in os.listdir(ours.tmp_root)  # noqa: E731
                              if d.startswith(f"{WORKDIR_PREFIX}{neighbour.pid}-")]

    def another_run(n: int) -> None:
        launcher.stdin.write("run\n")
        launcher.stdin.flush()
        _wait_for(lambda: len(sleeping()) == n, 60, f"the other trainer's run {n} never started")

    try:
        another_run(1)
        # what a scan of every sandbox uid counted as this test's leftovers
        assert all(_uid(p) in SANDBOX_UIDS for p in sleeping())
        with nothing_left_behind(ours, "runs beside another trainer's"):
            # during the checks: another uid taken, a new working directory and 32 MB more tmpfs on the host
            another_run(2)
            assert len(their_workdirs()) == 2
            # each run starts its search at another slot, so one of them starts at each slot the other trainer holds
            uids = [int(run(ours, "import os\nprint(os.getuid())\n").stdout) for _ in range(slots)]
        theirs = {_uid(p) for p in sleeping()}
        assert len(theirs) == 2 and not theirs & set(uids), (theirs, uids)

        # this test's own leftover: an unsafe run (no namespace) whose cgroup is never emptied leaves its daemon
        leaky = LocalSandbox(bwrap=str(tmp_path / "no" / "bwrap"), allow_unsafe=True)
        with monkeypatch.context() as patch:
            patch.setattr(RunCgroup, "kill_all", lambda self, timeout_s=10.0: True)
            with pytest.raises(AssertionError, match="left behind"):
                run(leaky, """
                    import os, time
                    if os.fork() == 0:
                        os.setsid()
                        time.sleep(60)
                    """)
        left = run_processes([os.getpid()])
        assert left and all(run_cgroup_owner_of(p.pid) == os.getpid() for p in left)  # found by its cgroup
    finally:
        launcher.stdin.close()  # the other trainer ends at the end of its input
        with contextlib.suppress(psutil.NoSuchProcess):
            neighbour.kill()
        for owner in (os.getpid(), neighbour.pid):
            for name in {d.name for p in sandbox.cgroups.parents.values() for d in p.iterdir()
                         if run_cgroup_owner(d.name) == owner}:
                group = RunCgroup(sandbox.cgroups.version, {c: p / name for c, p in sandbox.cgroups.parents.items()})
                group.kill_all()
                group.remove()
        for d in their_workdirs():
            shutil.rmtree(os.path.join(ours.tmp_root, d), ignore_errors=True)
    assert leftovers(sandbox) == []


# ---------------------------------------------------------------------------------------------------------------
# failing closed


def test_without_bubblewrap_it_refuses_unless_unsafe_is_asked_for_loudly(tmp_path, caplog):
    missing = str(tmp_path / "no" / "bwrap")
    with pytest.raises(SandboxUnavailable) as err:
        LocalSandbox(bwrap=missing)
    message = str(err.value)
    assert "bubblewrap" in message and "apt-get install bubblewrap" in message
    assert "task.sandbox.allow_unsafe=true" in message and "CAP_SYS_ADMIN" in message
    sbx._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="agon.tasks.sandbox"):
        unsafe = LocalSandbox(bwrap=missing, allow_unsafe=True)
    assert unsafe.isolation == ISOLATION_UNSAFE
    assert any("UNSAFE" in r.getMessage() for r in caplog.records)
    res = run(unsafe, "import os\nprint(int(input()) * 7, os.getuid())\n", stdin="6\n")
    assert (res.status, res.stdout) == ("ok", f"42 {os.getuid()}\n")
    assert run(unsafe, "while True:\n    pass\n").status == "timeout"


@pytest.mark.skipif(os.geteuid() != 0 or not sbx.shutil.which("setpriv"), reason="needs root and setpriv")
def test_without_cap_sys_admin_the_sandbox_refuses_with_the_fix_or_runs_unsafe_when_asked():
    script = textwrap.dedent("""
        import logging, sys
        logging.basicConfig(level=logging.WARNING)
        from agon.tasks.sandbox import LocalSandbox, RunRequest, SandboxUnavailable
        try:
            LocalSandbox()
            print("ISOLATED")
        except SandboxUnavailable as e:
            print("REFUSED", e)
        sb = LocalSandbox(allow_unsafe=True)
        print("UNSAFE", sb.isolation, sb.run(RunRequest(code="print(6 * 7)")).stdout.strip())
        """)
    out = subprocess.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", sys.executable, "-c",
                          script], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert "REFUSED the sandbox cannot isolate model-written programs here" in out.stdout, out
    assert "CAP_SYS_ADMIN" in out.stdout and "UNSAFE unsafe 42" in out.stdout
    assert "UNSAFE: model-written programs run WITHOUT isolation" in out.stderr


def test_a_codecontests_run_stops_before_loading_anything_when_the_sandbox_cannot_isolate(tmp_path, monkeypatch):
    from agon.training.checks import compose_config
    from agon.tasks import build_task

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    cfg = compose_config(["task=codecontests", f"task.source={tmp_path / 'no-such-dataset'}"])
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        build_task(cfg.task)  # the dataset path does not exist: the sandbox stopped the run first


def test_uid_slots_are_exclusive_across_threads(tmp_path):
    slots = UidSlots(base=70000, size=3, lock_dir=tmp_path / "locks")
    held, errors = [], []
    barrier = threading.Barrier(3)

    def take():
        try:
            with slots.claim() as uid:
                held.append(uid)
                barrier.wait(60)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=take) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(held) == [70000, 70001, 70002]


def test_runs_at_the_same_time_run_as_different_users(sandbox):
    """So that RLIMIT_NPROC, /proc permissions and file ownership separate them even beyond their namespaces."""
    request = RunRequest(code="import os, time\ntime.sleep(0.5)\nprint(os.getuid())\n", time_limit_s=2)
    with ThreadPoolExecutor(4) as pool:
        uids = [r.stdout.strip() for r in pool.map(lambda _: sandbox.run(request), range(4))]
    assert len(set(uids)) == 4 and all(UID_BASE <= int(u) < UID_BASE + UID_SLOTS for u in uids), uids


def test_two_sandboxes_of_one_process_run_at_the_same_time_each_in_a_cgroup_of_its_own(sandbox):
    """A trainer may hold several sandboxes (one per task). Run cgroups were numbered per sandbox, so two fresh
    ones running at once picked the same name, and the second run was a sandbox_error."""
    pair = [LocalSandbox(), LocalSandbox()]
    request = RunRequest(code="import time\ntime.sleep(0.5)\nprint('ran')\n", time_limit_s=2, wall_time_s=30)

    def timed(sb: LocalSandbox) -> tuple[float, RunResult, float]:
        return time.monotonic(), sb.run(request), time.monotonic()

    with nothing_left_behind(sandbox, "two sandboxes' runs"), ThreadPoolExecutor(2) as pool:
        (start_a, a, end_a), (start_b, b, end_b) = pool.map(timed, pair)
    assert max(start_a, start_b) < min(end_a, end_b), "the two runs did not overlap"
    assert [(r.status, r.stdout) for r in (a, b)] == [("ok", "ran\n")] * 2, (a, b)
