"""The second round of hostile programs: verdicts a program cannot dodge, and the kernel resources that a namespace
does not cover (socket memory, vsock, the AIO and huge-page pools, inotify, locks on shared files, the uid pool,
the keyring, /usr, process limits).

Each test runs a program that tries one thing and checks the verdict a careful grader would give, that nothing was
left behind (``run``), and where the host keeps a counter for the resource (TCP memory, ``aio-nr``, huge pages),
that the counter did not move. Where this host lacks a feature (no huge-page pool, no vsock), only the check that
needs it is skipped, and says so.
"""

from __future__ import annotations

import ctypes
import math
import os
import platform
import random
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agon.tasks import sandbox as sbx
from agon.tasks.isolation import UID_LOCK_DIR, SandboxUnavailable, UidSlots
from agon.tasks.sandbox import STATUSES, LocalSandbox, RunRequest, RunResult, signal_name
from tests.tasks.test_sandbox import CORRECT, leftovers, nothing_left_behind, run

X86 = platform.machine() == "x86_64"
needs_x86 = pytest.mark.skipif(not X86, reason="syscall numbers of x86_64")


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    return LocalSandbox()


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class _Peak:
    """The largest value ``read()`` returned while the block ran, polled every 20 ms from this process."""

    def __init__(self, read):
        self.read, self.values, self._stop = read, [read()], threading.Event()

    def __enter__(self) -> "_Peak":
        def poll():
            while not self._stop.is_set():
                self.values.append(self.read())
                time.sleep(0.02)

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.values.append(self.read())

    @property
    def rise(self) -> int:
        return max(self.values) - self.values[0]


# ---------------------------------------------------------------------------------------------------------------
# the verdict: every exit status, every signal, any output, and states no program should reach

# Python ignores SIGPIPE and SIGXFSZ; the kernel ignores these by default; SIGSTOP stops the process, and the
# terminal's stop signals are discarded for a process group with no parent outside it (the program's)
_IGNORED = {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH,
            signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
_STOPPING = {signal.SIGSTOP}
# the C library's own (glibc: SIGCANCEL, SIGSETXID), below the SIGRTMIN it gives programs
_LIBC_RESERVED = set(range(32, signal.SIGRTMIN))


def test_a_wrong_program_that_ends_itself_with_any_signal_gets_a_failing_verdict_never_an_unscored_one(sandbox):
    """Real-time signals (34-64) made the verdict raise (``signal.Signals(40)`` has no member): the run became a
    sandbox_error, its reward NaN and its advantage 0, instead of a wrong answer's reward."""
    numbers = range(1, signal.SIGRTMAX + 1)

    def one(n: int) -> RunResult:
        code = f"import os\nprint('42', flush=True)\nos.kill(os.getpid(), {n})\nimport time\ntime.sleep(0.2)\n"
        # stopping signals end by the wall clock: short, since no CPU is spent while stopped
        wall = 4 if n in _STOPPING else 60
        return sandbox.run(RunRequest(code=code, time_limit_s=1, wall_time_s=wall))

    with nothing_left_behind(sandbox, "a run per signal"), ThreadPoolExecutor(4) as pool:
        results = dict(zip(numbers, pool.map(one, numbers)))
    for n, res in results.items():
        assert res.stdout == "42\n", (n, res)
        if n in _IGNORED:
            assert res.status == "ok", (n, res)
        elif n in _LIBC_RESERVED:  # its handler may be in place, ignoring a kill() from the process itself
            assert res.status == "ok" or (res.status, res.return_code) == ("runtime_error", -n), (n, res)
        elif n in _STOPPING:
            assert res.status == "timeout" and "wall clock" in res.detail, (n, res)
        elif n == signal.SIGXCPU:
            assert res.status == "timeout", (n, res)
        else:
            assert (res.status, res.return_code) == ("runtime_error", -n), (n, res)
            assert res.detail == f"killed by {signal_name(n)}", (n, res)
    assert results[signal.SIGRTMIN + 6].detail == "killed by SIGRTMIN+6"
    assert results[signal.SIGRTMAX - 2].detail == "killed by SIGRTMAX-2"


def test_signal_names_for_every_number():
    assert signal_name(11) == "SIGSEGV" and signal_name(signal.SIGRTMIN) == "SIGRTMIN"
    assert signal_name(signal.SIGRTMIN + 1) == "SIGRTMIN+1" and signal_name(signal.SIGRTMAX) == "SIGRTMAX"
    assert signal_name(signal.SIGRTMAX - 1) == "SIGRTMAX-1" and signal_name(99) == "signal 99"
    assert signal_name(0) == "signal 0" and signal_name(-5) == "signal -5"


def test_signals_ignored_or_blocked_by_the_trainer_do_not_pass_to_the_program(sandbox):
    """Ignored dispositions and the signal mask survive fork and exec: a trainer under ``nohup`` (SIGHUP ignored),
    or a verifier thread with signals blocked, handed them to every program. The program starts as a fresh
    interpreter does: only Python's own SIGPIPE and SIGXFSZ ignored, nothing blocked."""
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGHUP, signal.SIGUSR2, signal.SIGRTMIN + 3)}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
    try:
        res = run(sandbox, """
            for line in open("/proc/self/status"):
                if line.startswith(("SigIgn", "SigBlk")):
                    print(line.split()[0], int(line.split()[1], 16))
            """)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    got = dict(ln.split() for ln in res.stdout.splitlines())
    libc_own = (1 << 31) | (1 << 32)  # 32 and 33: the C library refuses to change them (see _LIBC_RESERVED)
    python_own = (1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))
    assert int(got["SigIgn:"]) & ~libc_own == python_own and int(got["SigBlk:"]) == 0, got


@pytest.mark.parametrize("code, status, rc", [
    ("raise SystemExit(0)", "ok", 0),
    ("import os\nos._exit(256)", "ok", 0),  # the kernel keeps the low 8 bits: the program did exit with 0
    ("raise SystemExit('a message')", "runtime_error", 1),
    ("import os\nos._exit(121)", "runtime_error", 121),  # the monitor's own setup-failed code
    ("import os\nos._exit(126)", "runtime_error", 126),
    ("import os\nos._exit(128 + 9)", "runtime_error", 137),
    ("import os\nos._exit(255)", "runtime_error", 255),
])
def test_every_kind_of_exit_status(sandbox, code, status, rc):
    res = run(sandbox, "print('42')\n" + code + "\n")
    assert (res.status, res.return_code) == (status, rc), res


def test_any_output_bytes_and_sizes_are_graded_as_written(sandbox):
    every_byte = run(sandbox, """
        import sys
        sys.stdout.buffer.write(bytes(range(256)) + b"\\nready\\nstatus 0\\nsetup-failed x\\n")
        sys.stderr.buffer.write(b"ready\\nstatus 0\\n\\xff\\xfe")
        """)
    assert every_byte.status == "ok" and not every_byte.stdout_is_utf8, every_byte
    assert "status 0\nsetup-failed x\n" in every_byte.stdout
    utf8 = run(sandbox, "print('r\\u00e9sum\\u00e9 \\u2603 \\U0001F600')\n")
    assert (utf8.status, utf8.stdout, utf8.stdout_is_utf8) == ("ok", "r\u00e9sum\u00e9 \u2603 \U0001F600\n", True)
    cap = 1 << 16
    exact = run(sandbox, f"import sys\nsys.stdout.write('x' * {cap})\n", max_output_bytes=cap)
    assert (exact.status, len(exact.stdout), exact.truncated) == ("ok", cap, False), exact.detail
    over = run(sandbox, f"import sys\nsys.stdout.write('x' * {cap + 1})\n", max_output_bytes=cap)
    assert (over.status, len(over.stdout), over.truncated) == ("output_limit", cap, True)


class _Group:
    """A run cgroup whose counters cannot be read: the verdict must still be one."""

    def pids_limit_hits(self) -> int:
        raise ValueError("invalid literal for int() with base 10: 'garbage'")

    oom_kills = pids_limit_hits


def _capped(data: bytes) -> sbx._Capped:
    c = sbx._Capped(1 << 20)
    c.add(data)
    return c


def test_the_verdict_never_raises_whatever_state_the_run_ends_in():
    req = RunRequest(code="")
    out, err = _capped(b"42\n"), _capped(b"")

    def verdict(chan: str, group=None, loop_error: str = "") -> RunResult:
        return LocalSandbox._verdict(req, group, out, err, chan, 0, 0.1, False, False, False, loop_error)

    stopped = 0x137F  # WIFSTOPPED: no exit code
    assert verdict(f"ready\nstatus {stopped}\n").status == "runtime_error"
    assert "unexpected wait status" in verdict(f"ready\nstatus {stopped}\n").detail
    assert verdict("ready\nstatus\n").status == "runtime_error"  # a cut line: the monitor ended mid-write
    assert verdict("ready\nstatus 9999999999\n").status == "runtime_error"  # a status no int can hold
    assert verdict("ready\nstatus 0\n", group=_Group()).status == "runtime_error"
    assert "unexpected state: ValueError" in verdict("ready\nstatus 0\n", group=_Group()).detail
    # lost track of a run that had started: a failure of the run; before it started: the sandbox's
    assert verdict("ready\nstatus 0\n", loop_error="OSError: x").status == "runtime_error"
    assert verdict("", loop_error="OSError: x").status == "sandbox_error"
    assert verdict("ready\nstatus 0\n").status == "ok"
    rng = random.Random(0)
    pieces = ["ready", "status", "status 0", "status 256", "status -1", "setup-failed", "\x00", "\n", " ", "9" * 30]
    for _ in range(2000):
        chan = "".join(rng.choice(pieces) + rng.choice(["\n", ""]) for _ in range(rng.randint(0, 6)))
        res = verdict(chan, group=rng.choice([None, _Group()]))
        assert res.status in STATUSES
        # an unscored run only where the monitor never said the program could start
        started = "ready" in chan.splitlines() and not any(ln.startswith("setup-failed") for ln in chan.splitlines())
        assert res.status != "sandbox_error" or not started, (chan, res)


# ---------------------------------------------------------------------------------------------------------------
# sockets: UNIX only


def _tcp_pages() -> int:
    for line in Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith("TCP:"):
            fields = line.split()
            return int(fields[fields.index("mem") + 1])
    return 0


def test_only_unix_sockets_can_be_made(sandbox):
    res = run(sandbox, """
        import socket
        tries = {"inet": (socket.AF_INET, socket.SOCK_STREAM), "inet-udp": (socket.AF_INET, socket.SOCK_DGRAM),
                 "inet6": (socket.AF_INET6, socket.SOCK_STREAM), "vsock": (40, socket.SOCK_STREAM),
                 "netlink": (16, socket.SOCK_RAW), "packet": (17, socket.SOCK_RAW), "alg": (38, socket.SOCK_SEQPACKET),
                 "unix": (socket.AF_UNIX, socket.SOCK_STREAM), "unix-dgram": (socket.AF_UNIX, socket.SOCK_DGRAM),
                 "unix-seqpacket": (socket.AF_UNIX, socket.SOCK_SEQPACKET)}
        for name, (family, kind) in tries.items():
            try:
                socket.socket(family, kind).close()
                print(name, "made")
            except OSError as e:
                print(name, e.errno)
        a, b = socket.socketpair()
        a.sendall(b"ping")
        print("socketpair", b.recv(4).decode())
        try:
            socket.socketpair(socket.AF_INET)
        except OSError as e:
            print("socketpair-inet", e.errno)
        """)
    got = dict(ln.split(" ", 1) for ln in res.stdout.splitlines())
    for name in ("inet", "inet-udp", "inet6", "vsock", "netlink", "packet", "alg", "socketpair-inet"):
        assert got[name] == "97", (name, got)  # EAFNOSUPPORT
    assert [got[n] for n in ("unix", "unix-dgram", "unix-seqpacket", "socketpair")] == ["made"] * 3 + ["ping"]


def test_loopback_tcp_buffers_cannot_hold_host_socket_memory(sandbox):
    """TCP buffers over a run's own loopback are not charged to its memory cgroup on cgroup v1: a run with a 112 MiB
    limit held 147 MiB of the host's TCP memory. The host's counter (/proc/net/sockstat, global) must not move."""
    flood = """
        import socket
        held = []
        try:
            server = socket.socket()
            server.bind(("127.0.0.1", 0))
            server.listen(64)
            for _ in range(100):
                c = socket.create_connection(server.getsockname())
                s, _ = server.accept()
                c.setblocking(False)
                try:
                    while True:
                        c.send(b"x" * 65536)
                except BlockingIOError:
                    pass
                held += [c, s]
            print("held", len(held))
        except OSError as e:
            print("refused", e.errno)
        """
    with _Peak(_tcp_pages) as tcp:
        res = run(sandbox, flood, memory_mb=64, time_limit_s=3)
    assert res.stdout == "refused 97\n", res
    assert tcp.rise * 4096 < 4 << 20, f"host TCP memory rose {tcp.rise} pages during the run"


def test_unix_socket_buffers_are_charged_to_the_runs_memory(sandbox):
    """The sockets a run may make hold their buffers in its own cgroup: filling 20 processes' worth of socket pairs
    (about 500 MiB) ends in the run's OOM kill, and the host's free memory falls by about the run's limit only."""
    fill = """
        import os, socket, time
        for _ in range(20):
            if os.fork() == 0:
                pairs = []
                try:
                    for _ in range(120):
                        a, b = socket.socketpair()
                        a.setblocking(False)
                        try:
                            while True:
                                a.send(b"x" * 65536)
                        except BlockingIOError:
                            pass
                        pairs.append((a, b))
                except OSError:
                    pass
                time.sleep(5)
                os._exit(0)
        while True:
            try:
                os.wait()
            except ChildProcessError:
                break
        """
    with _Peak(lambda: -_meminfo("MemAvailable")) as used:
        res = run(sandbox, fill, memory_mb=64, time_limit_s=5, max_processes=32)
    assert res.status == "memory", res
    # the run's cgroup allows 64 + 2 * 48 MiB; other processes of the host move MemAvailable too
    assert used.rise < 400 << 10, f"the host's available memory fell by {used.rise} KiB"


def test_vsock_of_the_host_is_out_of_reach(sandbox):
    res = run(sandbox, """
        import socket
        try:
            s = socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK
            s.settimeout(1)
            s.connect((2, 5001))  # the host (CID 2)
            print("connected")
        except OSError as e:
            print("refused", e.errno)
        """)
    assert res.stdout == "refused 97\n", res
    try:
        socket.socket(40, socket.SOCK_STREAM).close()
    except OSError:
        pytest.skip("this host has no vsock: the refusal above holds, but there was nothing to reach")


@needs_x86
def test_calls_off_the_allow_list_do_not_exist_for_a_run(sandbox):
    """What the filter does not name answers ENOSYS: a deny-list leaked whatever it forgot. Among these: sync
    (flushes every disk of the host), mincore and cachestat (the page cache of shared files, a neighbour's
    timing), POSIX message queues, kcmp, personality, modify_ldt, memfd_secret."""
    calls = {"sync": (162, ()), "mincore": (27, (0, 4096, 0)), "cachestat": (451, (0, 0, 0, 0)),
             "mq_open": (240, (b"/q", 0o100, 0o600, 0)), "kcmp": (312, (1, 1, 0, 0, 0)), "personality": (135, (-1,)),
             "modify_ldt": (154, (0, 0, 0)), "memfd_secret": (447, (0,)), "syslog": (103, (3, 0, 0)),
             "name_to_handle_at": (303, (0, b"/", 0, 0, 0)), "pkey_alloc": (330, (0, 0)), "nr 500": (500, ())}
    res = run(sandbox, f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        for name, (nr, args) in {calls!r}.items():
            print(name + ":", libc.syscall(nr, *args), ctypes.get_errno())
        """)
    got = dict(ln.split(": ") for ln in res.stdout.splitlines())
    assert got == {name: "-1 38" for name in calls}, got


# ---------------------------------------------------------------------------------------------------------------
# host-wide pools and notifications: legacy AIO, huge pages, inotify/fanotify, locks on shared files


def _aio_nr() -> int:
    return int(Path("/proc/sys/fs/aio-nr").read_text())


@needs_x86
def test_the_legacy_aio_pool_is_refused(sandbox):
    """A run took all 65,536 of the host's AIO events with io_setup (no cgroup counts them)."""
    with _Peak(_aio_nr) as aio:
        res = run(sandbox, """
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            ctx = ctypes.c_ulong(0)
            for n in (65536, 4096, 1):
                r = libc.syscall(206, n, ctypes.byref(ctx))  # io_setup
                print(n, r, ctypes.get_errno())
            import time
            time.sleep(0.3)
            """)
    assert res.stdout.splitlines() == ["65536 -1 1", "4096 -1 1", "1 -1 1"], res  # EPERM
    assert aio.rise == 0, f"the host's aio-nr rose by {aio.rise}"


@needs_x86
def test_huge_pages_are_refused(sandbox):
    res = run(sandbox, """
        import ctypes, mmap
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
        MAP_HUGETLB, SHM_HUGETLB, MFD_HUGETLB = 0x40000, 0x800, 4
        r = libc.mmap(None, 2 << 20, 3, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB, -1, 0)
        print("mmap", r == ctypes.c_void_p(-1).value, ctypes.get_errno())
        print("shmget", libc.syscall(29, 0, 2 << 20, 0o1600 | SHM_HUGETLB), ctypes.get_errno())
        print("memfd", libc.syscall(319, b"x", MFD_HUGETLB), ctypes.get_errno())
        m = mmap.mmap(-1, 2 << 20)  # ordinary memory still maps
        m[0] = 1
        print("plain", len(m))
        """)
    assert res.stdout.splitlines() == ["mmap True 1", "shmget -1 1", "memfd -1 1", f"plain {2 << 20}"], res


@needs_x86
def test_the_huge_page_pool_does_not_move():
    if _meminfo("HugePages_Total") == 0:
        pytest.skip("this host has no huge-page pool (HugePages_Total 0): the refusal is tested above, the counter "
                    "cannot be")
    sb = LocalSandbox()
    free = _meminfo("HugePages_Free")
    res = sb.run(RunRequest(code=textwrap.dedent("""
        import ctypes, mmap
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap(None, 2 << 20, 3, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000, -1, 0)
        import time
        time.sleep(0.3)
        """), time_limit_s=1, wall_time_s=30))
    assert res.status == "ok" and _meminfo("HugePages_Free") == free


@needs_x86
def test_inotify_fanotify_and_dnotify_are_refused(sandbox):
    """A watch on a shared host inode (/usr's libraries) tells when a neighbour's program starts or imports."""
    res = run(sandbox, """
        import ctypes, fcntl, os
        libc = ctypes.CDLL(None, use_errno=True)
        for name, nr, args in (("inotify_init", 253, ()), ("inotify_init1", 294, (0,)),
                               ("inotify_add_watch", 254, (0, b"/usr/lib", 0xFFF)),
                               ("fanotify_init", 300, (0, 0))):
            print(name, libc.syscall(nr, *args), ctypes.get_errno())
        fd = os.open("/usr/lib", os.O_RDONLY)
        try:
            fcntl.fcntl(fd, 1026, 0x80000000 | 0x1)  # F_NOTIFY, DN_ACCESS | DN_MULTISHOT
            print("dnotify made")
        except OSError as e:
            print("dnotify", e.errno)
        """)
    assert res.stdout.splitlines() == ["inotify_init -1 1", "inotify_init1 -1 1", "inotify_add_watch -1 1",
                                       "fanotify_init -1 1", "dnotify 1"], res


LOCKS = """
import fcntl, glob, os, struct
fd = os.open(glob.glob("/usr/lib/python3*/os.py")[0], os.O_RDONLY)
def attempt(name, f):
    try:
        f()
        print(name, "held")
    except OSError as e:
        print(name, e.errno)
attempt("flock", lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
attempt("lockf", lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
lock = struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)
attempt("F_GETLK", lambda: fcntl.fcntl(fd, fcntl.F_GETLK, lock))
attempt("F_OFD_SETLK", lambda: fcntl.fcntl(fd, 37, lock))
attempt("F_OFD_GETLK", lambda: fcntl.fcntl(fd, 36, lock))
attempt("F_SETLEASE", lambda: fcntl.fcntl(fd, 1024, fcntl.F_RDLCK))
attempt("F_GETFL", lambda: fcntl.fcntl(fd, fcntl.F_GETFL))
attempt("F_SETFD", lambda: fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC))
attempt("F_DUPFD_CLOEXEC", lambda: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
"""


def test_locks_on_shared_files_are_refused_and_other_fcntl_works(sandbox):
    res = run(sandbox, LOCKS)
    got = dict(ln.split(" ", 1) for ln in res.stdout.splitlines())
    for name in ("flock", "lockf", "F_GETLK", "F_OFD_SETLK", "F_OFD_GETLK", "F_SETLEASE"):
        assert got[name] == "1", (name, got)  # EPERM
    assert [got[n] for n in ("F_GETFL", "F_SETFD", "F_DUPFD_CLOEXEC")] == ["held"] * 3, got


def test_a_copier_learns_nothing_from_a_solver_through_locks_on_shared_files(sandbox):
    """Two runs at once: the solver signals its answer's bits by locking shared read-only files (the stdlib's, one
    per bit); the copier, which never reads its input, probes them. Locks were a working channel: the copier was
    graded correct beside the solver. Now neither can take a lock, so the copier prints nothing useful."""
    solver = """
        import fcntl, glob, os, time
        answer = sum(range(int(input())))
        files = sorted(glob.glob("/usr/lib/python3*/[a-z]*.py"))[:24]
        fds = []
        for bit, path in enumerate(files):
            if answer >> bit & 1:
                fd = os.open(path, os.O_RDONLY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH)
                except OSError:
                    pass
                fds.append(fd)
        print(answer, flush=True)
        time.sleep(3)
        """
    copier = """
        import fcntl, glob, os, time
        time.sleep(1)
        files = sorted(glob.glob("/usr/lib/python3*/[a-z]*.py"))[:24]
        value = 0
        for bit, path in enumerate(files):
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                value |= 1 << bit
            except OSError:
                pass
        print(value)
        """
    stdin = "1000\n"
    with ThreadPoolExecutor(2) as pool:
        solved = pool.submit(sandbox.run, RunRequest(code=textwrap.dedent(solver), stdin=stdin, time_limit_s=2,
                                                     wall_time_s=60))
        copied = pool.submit(sandbox.run, RunRequest(code=textwrap.dedent(copier), time_limit_s=2, wall_time_s=60))
        solved, copied = solved.result(), copied.result()
    assert solved.stdout == f"{sum(range(1000))}\n", solved
    assert copied.status == "ok" and copied.stdout == "0\n", copied
    assert leftovers(sandbox) == []


# ---------------------------------------------------------------------------------------------------------------
# deployment: the uid pool, the keyring, /usr, process limits


def test_uid_locks_live_at_one_path_whatever_the_temporary_directory(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = LocalSandbox(tmp_root=str(tmp_path / "a")), LocalSandbox(tmp_root=str(tmp_path / "b"))
    assert a.slots.lock_dir == b.slots.lock_dir == UID_LOCK_DIR


def test_a_uid_held_by_a_trainer_with_another_tmpdir_is_not_handed_out(tmp_path):
    """The uid locks lived under TMPDIR: two trainers with different temporary directories handed out the same
    uids, and a hostile run in one made a correct program in the other fail (RLIMIT_NPROC counts per uid)."""
    base = 70400
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom agon.tasks.isolation import UidSlots\n"
         f"with UidSlots(base={base}, size=1).claim() as uid:\n    print(uid, flush=True)\n    sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)}, cwd=Path(__file__).parents[2])
    try:
        assert holder.stdout.readline().strip() == str(base)
        with pytest.raises(SandboxUnavailable, match="in use"):
            with UidSlots(base=base, size=1).claim(timeout_s=1):
                pass
    finally:
        holder.communicate("", timeout=60)
    with UidSlots(base=base, size=1).claim(timeout_s=30) as uid:
        assert uid == base


def test_a_fork_bomb_beside_another_trainers_runs_does_not_fail_them(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = LocalSandbox(tmp_root=str(tmp_path / "a")), LocalSandbox(tmp_root=str(tmp_path / "b"))
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"

    def one(i: int) -> RunResult:
        if i < 2:
            return first.run(RunRequest(code=bomb, time_limit_s=2, wall_time_s=5, max_processes=32))
        time.sleep(1)  # the bombs hold every process their uids may have
        return second.run(RunRequest(code=CORRECT, stdin=f"{i * 1000}\n", time_limit_s=2, wall_time_s=60))

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    for i, r in enumerate(results[2:], start=2):
        assert (r.status, r.stdout) == ("ok", f"{sum(range(i * 1000))}\n"), (i, r)
    assert leftovers(first) == [] and leftovers(second) == []


def test_a_pool_that_overlaps_another_user_of_its_uids_is_refused_naming_it():
    with pytest.raises(SandboxUnavailable, match="uid 0 is the account 'root'"):
        UidSlots(base=0, size=2)
    uid = 70500
    squatter = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until setpriv has become the sleeping uid
            status = Path(f"/proc/{squatter.pid}/status").read_text()
            if f"Uid:\t{uid}" in status:
                break
            time.sleep(0.01)
        with pytest.raises(SandboxUnavailable, match=f"pid {squatter.pid} .* runs as uid {uid} outside any sandbox"):
            UidSlots(base=uid - 3, size=8)
    finally:
        squatter.kill()
        squatter.wait()
    UidSlots(base=uid - 3, size=8)  # free again


def _add_session_key(description: bytes) -> int:
    """A key in a session keyring of this test process's own (joined first, so that the key dies with it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(250, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
    serial = libc.syscall(248, b"user", description, b"hunter2", 7, -3)  # add_key to KEY_SPEC_SESSION_KEYRING
    if serial < 0:
        pytest.skip(f"no kernel keyring here (errno {ctypes.get_errno()})")
    return serial


@needs_x86
def test_each_run_gets_an_empty_session_keyring_of_its_own(sandbox):
    """The run's session keyring is a new one, and since round three the program cannot reach any keyring: keyctl
    is refused after the monitor's own call, and /proc/keys is empty."""
    serial = _add_session_key(b"agon-test-trainer-secret")
    res = run(sandbox, f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)
        print(libc.syscall(250, 6, {serial}, buf, 256), ctypes.get_errno())  # KEYCTL_DESCRIBE the trainer's key
        print(libc.syscall(250, 6, -3, buf, 256), ctypes.get_errno())  # and its own session keyring
        print(repr(open("/proc/keys").read()))
        """)
    assert "agon-test-trainer-secret" not in res.stdout
    assert res.stdout.splitlines() == ["-1 1", "-1 1", "''"], res


def test_usr_holds_only_what_the_interpreter_needs_and_the_standard_library_works(sandbox):
    res = run(sandbox, """
        import os
        print(sorted(os.listdir("/usr")))
        print(sorted(os.listdir("/usr/bin")))
        print([p for p in ("/usr/local", "/usr/share", "/usr/include", "/usr/sbin", "/usr/lib/python3/dist-packages",
                           "/bin/sh", "/usr/bin/gcc") if os.path.lexists(p)])
        import asyncio, bisect, bz2, collections, csv, ctypes, datetime, decimal, fractions, hashlib, heapq, json
        import lzma, math, mmap, multiprocessing, random, re, sqlite3, ssl, statistics, subprocess, sys, tempfile
        import threading, unicodedata, zlib, shutil
        with multiprocessing.Pool(2) as pool:
            print(sum(pool.map(abs, range(-5, 5))))
        print(asyncio.run(asyncio.sleep(0, result="async")))
        print(subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip())
        print(sqlite3.connect(":memory:").execute("select 2 + 3").fetchone()[0])
        print(hashlib.sha256(b"").hexdigest()[:8], zlib.crc32(b"x"), str(decimal.Decimal(1) / 7)[:6])
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("x")
        shutil.copy2(f.name, f.name + ".copy")
        print(open(f.name + ".copy").read(), ssl.OPENSSL_VERSION.split()[0])
        """, time_limit_s=4, max_processes=32)
    lines = res.stdout.splitlines()
    assert res.status == "ok", res
    assert set(eval(lines[0])) <= {"bin", "lib", "lib64", "lib32", "share"}  # noqa: S307
    assert all(n.startswith("python3") or n == "setpriv" for n in eval(lines[1])), lines[1]  # noqa: S307
    # /usr/share holds the time-zone database alone (zoneinfo), round four
    assert lines[2] == "['/usr/share']", lines[2]
    assert lines[3:] == ["25", "async", "42", "5", "e3b0c442 2363233923 0.1428", "x OpenSSL"], lines[3:]


def test_every_process_limit_is_set_by_the_sandbox_not_inherited(sandbox):
    req = RunRequest(code="", time_limit_s=2, memory_mb=200, max_file_mb=16, max_processes=12, max_open_files=99)
    mem = (req.memory_mb + sbx.INTERPRETER_MB) << 20
    # the per-process CPU limit a backstop above the budget (the cgroup's exact count decides), the stack a
    # judge's: the memory limit, no ceiling (round four)
    cpu = math.ceil(2 * sbx.CPU_BACKSTOP) + 1 if sandbox.cgroups is not None else 2
    expected = {
        "RLIMIT_CORE": (0, 0), "RLIMIT_CPU": (cpu, cpu + 1), "RLIMIT_AS": (mem, mem), "RLIMIT_DATA": (mem, mem),
        "RLIMIT_RSS": (mem, mem), "RLIMIT_STACK": (mem, -1), "RLIMIT_FSIZE": (16 << 20, 16 << 20),
        "RLIMIT_NPROC": (13, 13), "RLIMIT_NOFILE": (99, 99), "RLIMIT_OFILE": (99, 99), "RLIMIT_MEMLOCK": (0, 0),
        "RLIMIT_MSGQUEUE": (0, 0), "RLIMIT_SIGPENDING": (sbx.SIGPENDING, sbx.SIGPENDING), "RLIMIT_NICE": (0, 0),
        "RLIMIT_RTPRIO": (0, 0), "RLIMIT_RTTIME": (0, 0), "10": (0, 0),
    }
    # this process's own limits, changed to values the sandbox must not pass on
    before = {k: resource.getrlimit(k) for k in (resource.RLIMIT_SIGPENDING, resource.RLIMIT_MSGQUEUE)}
    changed = {k: (min(777, hard), hard) for k, (_, hard) in before.items()}  # soft only: it can be put back
    try:
        for k, v in changed.items():
            resource.setrlimit(k, v)
        res = run(sandbox, """
            import resource
            names = sorted(n for n in dir(resource) if n.startswith("RLIMIT_"))
            for n in names:
                print(n, *resource.getrlimit(getattr(resource, n)))
            print(10, *resource.getrlimit(10))
            """, time_limit_s=2, memory_mb=200, max_file_mb=16, max_processes=12, max_open_files=99)
    finally:
        for k, v in before.items():
            resource.setrlimit(k, v)
    got = {ln.split()[0]: tuple(int(x) for x in ln.split()[1:]) for ln in res.stdout.splitlines()}
    assert got == {k: v for k, v in expected.items() if k in got} and set(got) >= set(expected) - {"RLIMIT_OFILE"}
    assert len([k for k in got if k.startswith("RLIMIT_")]) >= 16, got
