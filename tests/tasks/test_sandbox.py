"""Hostile programs through the sandbox: each is contained, bounded in time and leaves nothing behind.

"Nothing behind" (``run``): no process of a sandbox uid and no new child of this process survives, no run cgroup
and no working directory is left, and this process's memory is back where it was. Every case uses limits of one to
a few seconds so that none can hang or starve a 2-core machine. The sandbox needs bubblewrap, root and cgroups:
``make test`` installs bubblewrap; where isolation cannot be set up these tests fail (the sandbox fails closed),
except the ones about failing closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from agon.tasks import sandbox as sbx
from agon.tasks.isolation import UID_BASE, UID_SLOTS, SandboxUnavailable, UidSlots, seccomp_filter
from agon.tasks.sandbox import (
    ISOLATION_BWRAP,
    ISOLATION_UNSAFE,
    WORKDIR_PREFIX,
    LocalSandbox,
    RunRequest,
    RunResult,
    Sandbox,
    remove_stale_workdirs,
)

X86 = platform.machine() == "x86_64"


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    return LocalSandbox()


# children this test process already had (e.g. a service another test file started): not the sandbox's
_BASELINE_CHILDREN = {c.pid for c in psutil.Process().children(recursive=True)}


def leftovers(sb: LocalSandbox | None = None) -> list[str]:
    """What a run may have left: processes of a sandbox uid, new children of this process, run cgroups, workdirs."""
    found = []
    for p in psutil.process_iter(["pid", "uids", "name"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if p.info["uids"] and UID_BASE <= p.info["uids"].real < UID_BASE + UID_SLOTS:
                found.append(f"{p.info['pid']}:{p.info['name']} (uid {p.info['uids'].real})")
    for c in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if c.pid not in _BASELINE_CHILDREN and c.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{c.pid}:{c.name()} (child)")
    if sb is not None:
        if sb.cgroups is not None:
            found += [str(d) for p in sb.cgroups.parents.values() for d in p.glob(f"run-{os.getpid()}-*")]
        found += [d for d in os.listdir(sb.tmp_root) if d.startswith(f"{WORKDIR_PREFIX}{os.getpid()}-")]
    return found


def _host_files(sb: LocalSandbox) -> set[str]:
    """What a run could leave on the host's shared file systems: /dev/shm, /tmp and the sandbox's tmp root."""
    return {f"{d}/{n}" for d in {"/dev/shm", "/tmp", sb.tmp_root} for n in os.listdir(d)
            if not n.startswith("pytest-")}


def _shmem_bytes() -> int:
    """Host-wide tmpfs and shared memory in use (/proc/meminfo Shmem)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) << 10
    return 0


def run(sb: LocalSandbox, code: str, **kw) -> RunResult:
    """One run through the verifier's path, then: nothing left running, no new file on the host's shared file
    systems, and this process's memory and the host's shared memory back where they were."""
    kw.setdefault("time_limit_s", 1)
    rss, shmem, files = psutil.Process().memory_info().rss, _shmem_bytes(), _host_files(sb)
    res = sb.run(RunRequest(code=textwrap.dedent(code), **kw))
    assert leftovers(sb) == [], f"left behind after {code[:60]!r}"
    assert _host_files(sb) - files == set(), f"files left by {code[:60]!r}"
    assert psutil.Process().memory_info().rss - rss < 64 << 20
    assert _shmem_bytes() - shmem < 16 << 20, "tmpfs or shared memory outlived the run"
    return res


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
        for path in ({str(secret)!r}, "/etc/shadow", "/etc/passwd", "/root", "/proc/1/environ"):
            try:
                open(path).read()
                print("read", path)
            except OSError as e:
                print("no", type(e).__name__)
        """)
    lines = res.stdout.splitlines()
    assert lines[0] == str(sorted(["bin", "dev", "lib", "lib64", "proc", "sbin", "tmp", "usr", "work"]))
    assert lines[1] == "['main.py'] /work"
    uid = int(lines[2].split()[0])
    assert UID_BASE <= uid < UID_BASE + UID_SLOTS and lines[2] == f"{uid} {uid} []"
    assert len(eval(lines[3])) <= 3  # bwrap's init, the monitor, the program: none of the host's  # noqa: S307
    assert all(ln.startswith("no ") for ln in lines[4:9]), lines[4:]


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
    assert set(eval(res.stdout)) <= {"PATH", "LANG", "PYTHONIOENCODING", "LC_CTYPE", "PWD"}  # noqa: S307


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
                s = socket.socket(family)
                s.settimeout(1)
                try:
                    s.connect(address)
                    print("connected")
                except OSError as e:
                    print("refused", type(e).__name__)
            """)
        assert res.stdout.splitlines() == ["refused ConnectionRefusedError", "refused OSError",
                                           "refused FileNotFoundError"], res.stdout
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
        assert len(prog) % 8 == 0 and len(prog) // 8 < 256
    with pytest.raises(SandboxUnavailable, match="riscv64"):
        seccomp_filter("riscv64")


# ---------------------------------------------------------------------------------------------------------------
# time, processes, memory, output, files: each ended, by its real cause


def test_infinite_loop_is_ended_by_the_runs_cpu_budget(sandbox):
    t0 = time.monotonic()
    res = run(sandbox, "while True:\n    pass\n", time_limit_s=1)
    assert res.status == "timeout" and "CPU time" in res.detail and time.monotonic() - t0 < 4


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
        """, time_limit_s=1, wall_time_s=6)
    assert res.status == "timeout" and res.detail.startswith("CPU time of the run"), res


def test_long_sleep_hits_the_wall_clock(sandbox):
    res = run(sandbox, "import time\nprint('started', flush=True)\ntime.sleep(1e6)\n", wall_time_s=1.5)
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
        """, time_limit_s=2, wall_time_s=3)
    assert res.stdout == "parent done\n" and res.wall_s < 4


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
        """, memory_mb=256, max_file_mb=64, time_limit_s=3, wall_time_s=6)
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
    res = run(sandbox, "import sys\nwhile True:\n    sys.stderr.write('e' * 65536)\n", max_output_bytes=1 << 16)
    assert res.status == "output_limit" and len(res.stderr) == 1 << 16


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
        return sandbox.run(RunRequest(code=CORRECT, stdin=f"{i * 1000}\n", time_limit_s=2, wall_time_s=6))

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert time.monotonic() - t0 < 15
    for i, r in enumerate(results[1:], start=1):
        assert (r.status, r.stdout) == ("ok", f"{sum(range(i * 1000))}\n"), (i, r)
    assert leftovers(sandbox) == []


def test_a_killed_trainer_leaves_no_process_and_its_leftovers_are_cleaned_by_the_next(sandbox):
    trainer = subprocess.Popen(
        [sys.executable, "-c",
         "from agon.tasks.sandbox import LocalSandbox, RunRequest\n"
         "sb = LocalSandbox()\n"
         "print('probed', flush=True)\n"
         "sb.run(RunRequest(code='import os, time\\nif os.fork() == 0:\\n    os.setsid()\\ntime.sleep(60)', "
         "time_limit_s=30))\n"],
        stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    try:
        assert trainer.stdout.readline().strip() == b"probed"
        deadline = time.monotonic() + 10
        while len([ln for ln in leftovers() if "uid" in ln]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len([ln for ln in leftovers() if "uid" in ln]) >= 2
        trainer.kill()
        trainer.wait(10)
        deadline = time.monotonic() + 5
        while leftovers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert leftovers() == []
        stale = [d for d in os.listdir(sandbox.tmp_root) if d.startswith(f"{WORKDIR_PREFIX}{trainer.pid}-")]
        assert len(stale) == 1
        LocalSandbox()  # the next sandbox removes the dead trainer's directory and cgroup
        assert not os.path.exists(os.path.join(sandbox.tmp_root, stale[0]))
        assert remove_stale_workdirs(sandbox.tmp_root) == 0
        if sandbox.cgroups is not None:
            assert not [d for p in sandbox.cgroups.parents.values() for d in p.glob(f"run-{trainer.pid}-*")]
    finally:
        trainer.kill()
        trainer.wait()


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
                          script], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert "REFUSED the sandbox cannot isolate model-written programs here" in out.stdout, out
    assert "CAP_SYS_ADMIN" in out.stdout and "UNSAFE unsafe 42" in out.stdout
    assert "UNSAFE: model-written programs run WITHOUT isolation" in out.stderr


def test_a_codecontests_run_stops_before_loading_anything_when_the_sandbox_cannot_isolate(tmp_path, monkeypatch):
    from agon.config import compose_config
    from agon.tasks import build_task

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    cfg = compose_config(["task=codecontests", f"task.source={tmp_path / 'no-such-dataset'}"])
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        build_task(cfg.task)  # the dataset path does not exist: the sandbox stopped the run first


def test_uid_slots_are_exclusive_across_threads(tmp_path):
    slots = UidSlots(tmp_path / "locks", base=70000, size=3)
    held, errors = [], []
    barrier = threading.Barrier(3)

    def take():
        try:
            with slots.claim() as uid:
                held.append(uid)
                barrier.wait(5)
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
