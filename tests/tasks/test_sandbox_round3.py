"""The third round of hostile programs: host state attached to the files every run shares (page cache, futex keys,
the file system a flush reaches) and host-wide kernel pools and counters (ptys, keys, /proc's counters).

Each channel is tried the way a copier would use it: a solver computes the answer and leaves it in the shared
state, a copier that never reads its input tries to read it back, in a later run or in a concurrent one, and its
output is graded as the verifier grades it (``outputs_match``). Before this round each copier printed the answer.
"""

from __future__ import annotations

import os
import platform
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agon.tasks import sandbox as sbx
from agon.tasks.codecontests import outputs_match
from agon.tasks.sandbox import LocalSandbox, RunRequest, RunResult
from tests.tasks.test_sandbox import leftovers, nothing_left_behind, run

needs_x86 = pytest.mark.skipif(platform.machine() != "x86_64", reason="syscall numbers of x86_64")

# a solver's answer: sum(range(1000)), 19 bits
N, ANSWER = 1000, sum(range(1000))
BITS = ANSWER.bit_length()
# a file of the standard library that nothing imports: its pages are cached only when a program reads them
MARKED = "/usr/lib/python3.11/pydoc_data/topics.py"


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    return LocalSandbox()


def _both(sandbox: LocalSandbox, solver: str, copier: str, concurrent: bool, n: int = N) -> tuple[RunResult,
                                                                                              RunResult]:
    """The solver's and the copier's results: one after the other, or both at once (the copier started second)."""
    solve = RunRequest(code=textwrap.dedent(solver), stdin=f"{n}\n", time_limit_s=3, wall_time_s=60)
    copy = RunRequest(code=textwrap.dedent(copier), time_limit_s=3, wall_time_s=60)
    with nothing_left_behind(sandbox, "a solver and a copier"):
        if not concurrent:
            return sandbox.run(solve), sandbox.run(copy)
        with ThreadPoolExecutor(2) as pool:
            solved = pool.submit(sandbox.run, solve)
            copied = pool.submit(sandbox.run, copy)
            return solved.result(), copied.result()


def _graded(solved: RunResult, copied: RunResult, answer: int = ANSWER) -> None:
    assert solved.status == "ok" and outputs_match(f"{answer}\n", solved.stdout), solved
    assert not outputs_match(f"{answer}\n", copied.stdout), f"the copier copied the answer: {copied}"


def _evict(path: str) -> None:
    """Drop the host's cached pages of ``path`` (before: a marked page must be told from an unmarked one)."""
    if os.path.exists(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------------------------------
# the page cache of the runtime's files

SOLVER_PAGES = f"""
    import os
    answer = sum(range(int(input())))
    fd = os.open({MARKED!r}, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: one read caches one page
    for bit in range({BITS}):
        if answer >> bit & 1:
            os.pread(fd, 1, (2 * bit + 1) * 4096)
    print(answer, flush=True)
    import time
    time.sleep(2)
    """
# pages checked from the last down, so that a readahead a check starts can only reach pages already checked
COPIER_NOWAIT = f"""
    import os, time
    time.sleep(0.5)
    fd = os.open({MARKED!r}, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    value = 0
    for bit in reversed(range({BITS})):
        try:
            os.preadv(fd, [bytearray(1)], (2 * bit + 1) * 4096, os.RWF_NOWAIT)  # cached pages only
            value |= 1 << bit
        except OSError:  # EAGAIN: not cached; EOPNOTSUPP: no such mode
            pass
    print(value)
    """
COPIER_FAULTS = f"""
    import mmap, os, resource, time
    time.sleep(0.5)
    fd = os.open({MARKED!r}, os.O_RDONLY)
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    m.madvise(mmap.MADV_RANDOM)  # a fault reads one page
    value = 0
    for bit in reversed(range({BITS})):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        m[(2 * bit + 1) * 4096]
        if resource.getrusage(resource.RUSAGE_SELF).ru_majflt == before:  # no disk read: it was cached
            value |= 1 << bit
    print(value)
    """


@pytest.mark.parametrize("concurrent", [False, True], ids=["later-run", "concurrent-run"])
@pytest.mark.parametrize("copier", [COPIER_NOWAIT, COPIER_FAULTS], ids=["preadv2-RWF_NOWAIT", "major-faults"])
def test_a_copier_learns_nothing_from_the_page_cache_of_the_runtime(sandbox, copier, concurrent):
    """The runtime was bound from the host: a solver's reads marked the host's page cache of a stdlib file, and a
    copier read the marks back with RWF_NOWAIT or by counting major faults, in a later run as well as beside it.
    Each uid's runtime is now a copy in a tmpfs of its own, whose pages are never out of memory, and RWF_NOWAIT is
    refused (EOPNOTSUPP)."""
    _evict(MARKED)
    _graded(*_both(sandbox, SOLVER_PAGES, copier, concurrent))


@needs_x86
def test_rwf_nowait_is_refused_and_cache_hints_do_nothing(sandbox):
    res = run(sandbox, f"""
        import os
        fd = os.open({MARKED!r}, os.O_RDONLY)
        print(os.preadv(fd, [bytearray(8)], 0, 0))
        try:
            os.preadv(fd, [bytearray(8)], 0, os.RWF_NOWAIT)
            print("nowait read")
        except OSError as e:
            print("nowait", e.errno)
        for advice in (os.POSIX_FADV_DONTNEED, os.POSIX_FADV_NOREUSE, os.POSIX_FADV_WILLNEED):
            os.posix_fadvise(fd, 0, 0, advice)
        print("fadvise ok")
        """)
    assert res.stdout.splitlines() == ["8", "nowait 95", "fadvise ok"], res


# ---------------------------------------------------------------------------------------------------------------
# futex keys of a shared file mapping

_FUTEX_PRELUDE = f"""
    import ctypes, os, threading, time
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open({MARKED!r}, os.O_RDONLY)
    base = libc.mmap(None, 65536, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED: the futex key is the file's inode
    addr = [base + 64 * bit for bit in range({BITS})]
    class Timespec(ctypes.Structure):
        _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]
    """
SOLVER_FUTEX = _FUTEX_PRELUDE + """
    answer = sum(range(int(input())))
    print(answer, flush=True)
    give_up = time.monotonic() + 3
    while time.monotonic() < give_up:
        for bit, a in enumerate(addr):
            if answer >> bit & 1:
                libc.syscall(202, ctypes.c_void_p(a), 1, 1 << 30, None, None, 0)  # FUTEX_WAKE, shared
        time.sleep(0.001)
    """
COPIER_FUTEX = _FUTEX_PRELUDE + """
    woken = [False] * len(addr)
    def wait(bit):
        value = ctypes.c_int.from_address(addr[bit]).value
        timeout = Timespec(2, 0)
        woken[bit] = libc.syscall(202, ctypes.c_void_p(addr[bit]), 0, value, ctypes.byref(timeout), None, 0) == 0
    threading.stack_size(1 << 18)
    threads = [threading.Thread(target=wait, args=(bit,)) for bit in range(len(addr))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(sum(1 << bit for bit, w in enumerate(woken) if w))
    """


@needs_x86
def test_a_copier_learns_nothing_from_futex_wakes_on_a_shared_file(sandbox):
    """Futexes in a shared mapping of a file are keyed by its inode: the solver woke the copier's waiters on the
    bits of its answer in the host's stdlib file, both mapped read-only. The runs' files are now their uids' own
    copies, different inodes, so no wake reaches the copier (each wait times out)."""
    solved, copied = _both(sandbox, SOLVER_FUTEX, COPIER_FUTEX, concurrent=True)
    assert copied.status == "ok" and copied.stdout.strip().isdigit(), copied  # it waited on every bit
    _graded(solved, copied)


# ---------------------------------------------------------------------------------------------------------------
# flushes of the host's file systems


def _dirty_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Dirty:"):
            return int(line.split()[1])
    return 0


@needs_x86
def test_a_run_cannot_flush_the_hosts_file_systems(sandbox, tmp_path):
    """syncfs on a read-only descriptor of the interpreter flushed the host's root file system (its dirty data
    went to 0), and fsync on one flushed the disk's cache. Flushes now answer success without doing anything, and
    the interpreter is a file of the uid's own tmpfs."""
    dirty = tmp_path / "dirty"
    with open(dirty, "wb") as f:  # 48 MiB of the host's dirty data, below the background writeback threshold
        for _ in range(48):
            f.write(os.urandom(1 << 20))
    try:
        before = _dirty_kib()
        if before < 40 << 10:
            pytest.skip(f"the host wrote its dirty data back at once ({before} KiB dirty)")
        res = run(sandbox, """
            import ctypes, mmap, os, sys
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(sys.executable, os.O_RDONLY)
            print(libc.syncfs(fd), libc.fsync(fd), libc.fdatasync(fd), libc.sync_file_range(fd, 0, 0, 7))
            m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ)
            m.flush()  # msync(MS_SYNC)
            print("flushed")
            """, time_limit_s=2)
        after = _dirty_kib()
    finally:
        dirty.unlink()
    assert res.stdout.splitlines() == ["0 0 0 0", "flushed"], res
    assert after > before // 2, f"the run flushed the host's dirty data: {before} -> {after} KiB"


# ---------------------------------------------------------------------------------------------------------------
# host-wide pools and counters: ptys, keys, /proc


SOLVER_PTYS = """
    import os, time
    answer = sum(range(int(input())))
    print(answer, flush=True)
    time.sleep(0.5)
    held = []
    for _ in range(answer):  # the answer as a count of ptys
        try:
            held.append(os.openpty())
        except OSError:
            break
    time.sleep(2.5)
    """
COPIER_PTYS = """
    import time
    def count():
        try:
            return int(open("/proc/sys/kernel/pty/nr").read())
        except (OSError, ValueError):
            return 0
    start = count()
    time.sleep(1.5)
    print(count() - start)
    """


def test_a_copier_learns_nothing_from_the_hosts_pty_count(sandbox):
    """bubblewrap's --dev gave each run a ptmx whose ptys come from the host's pool, and /proc/sys/kernel/pty/nr
    counts them host-wide: the solver opened as many ptys as its answer said, the copier read the count. A run now
    has no ptmx and no /proc/sys."""
    solved, copied = _both(sandbox, SOLVER_PTYS, COPIER_PTYS, concurrent=True, n=15)  # 105 ptys, 210 descriptors
    assert copied.status == "ok" and copied.stdout.strip().lstrip("-").isdigit(), copied
    _graded(solved, copied, answer=sum(range(15)))


def test_a_run_gets_no_pty_and_the_host_still_does(sandbox):
    """One run held 3,071 ptys and the host's next openpty failed (ENOSPC). A run now has no ptmx, so it holds
    none, while the host (this process) still gets one."""

    def hog() -> RunResult:
        return sandbox.run(RunRequest(code=textwrap.dedent("""
            import os, time
            held = []
            try:
                while len(held) < 5000:
                    held.append(os.openpty())
            except OSError as e:
                print(len(held), e.errno, flush=True)
            time.sleep(1.5)
            print(os.path.exists("/dev/ptmx"), os.path.exists("/dev/pts"), os.path.exists("/dev/tty"))
            """), time_limit_s=3, wall_time_s=60, max_open_files=256))

    with nothing_left_behind(sandbox, "a pty hog"), ThreadPoolExecutor(1) as pool:
        hogged = pool.submit(hog)
        time.sleep(0.5)  # the run has started and holds what it got
        master, slave = os.openpty()
        os.close(master)
        os.close(slave)
        res = hogged.result()
    assert res.status == "ok" and res.stdout.splitlines() == ["0 2", "False False False"], res


def test_a_run_sees_no_other_runs_uid_in_the_key_counts(sandbox):
    """/proc/key-users lists every uid that holds a key, host-wide, with its count: it listed the uid of every
    concurrent run (their session keyrings), and answers were copied through the counts. It is empty in a run."""
    with nothing_left_behind(sandbox, "two runs"), ThreadPoolExecutor(2) as pool:
        first = pool.submit(sandbox.run, RunRequest(code="import os, time\nprint(os.getuid(), flush=True)\n"
                                                         "time.sleep(2)\n", time_limit_s=2, wall_time_s=60))
        second = pool.submit(sandbox.run, RunRequest(code=textwrap.dedent("""
            import time
            time.sleep(0.7)
            print(repr(open("/proc/key-users").read()), repr(open("/proc/keys").read()))
            """), time_limit_s=2, wall_time_s=60))
        first, second = first.result(), second.result()
    uid = first.stdout.strip()
    assert first.status == "ok" and uid.isdigit(), first
    assert second.status == "ok" and second.stdout.split() == ["''", "''"], second


@needs_x86
def test_a_program_cannot_call_keyctl_after_the_monitor_joined_its_keyring(sandbox):
    """The monitor's own keyctl call (a new session keyring) was open to the program too: each call made a key of
    its uid, counted host-wide. A filter the monitor stacks after its call refuses keyctl (EPERM)."""
    res = run(sandbox, """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        for args in ((1, None), (0, -3, 0), (6, -3)):  # JOIN_SESSION_KEYRING, GET_KEYRING_ID, DESCRIBE
            print(libc.syscall(250, *args), ctypes.get_errno())
        """)
    assert res.stdout.splitlines() == ["-1 1"] * 3, res


def test_proc_shows_no_host_wide_counter_a_program_can_move(sandbox):
    """Threads and forks (loadavg, stat), file handles and inodes (sys/fs), ptys (sys/kernel/pty), memory and page
    counters, locks, cgroups: each an exact host-wide count that one run moves and another reads. Empty in a run;
    what a program uses of /proc (its own pid's entries, the CPU count) still works."""
    res = run(sandbox, """
        import ctypes, os
        for name in ("loadavg", "stat", "meminfo", "vmstat", "locks", "key-users", "keys", "cgroups", "uptime"):
            try:
                print(name, len(open("/proc/" + name).read()))
            except OSError as e:
                print(name, "errno", e.errno)
        print("sys", sorted(os.listdir("/proc/sys")), os.path.exists("/proc/sys/fs/file-nr"))
        print("self", os.path.exists("/proc/self/status"), os.cpu_count() >= 1)
        libc = ctypes.CDLL(None, use_errno=True)
        info = ctypes.create_string_buffer(256)
        print("sysinfo", libc.sysinfo(info), ctypes.get_errno())
        """)
    lines = res.stdout.splitlines()
    for line in lines[:9]:
        # loadavg reads a constant (round four: programs read it), the same in every run
        assert line.split()[1] in ("0", "errno") or line == f"loadavg {len(sbx.LOADAVG)}", line
    assert lines[9:] == ["sys [] False", "self True True", "sysinfo -1 38"], res


def test_nothing_of_the_runtime_comes_from_a_host_file(sandbox):
    """Every file a run can read is on a tmpfs: its own, or its uid's copy of the runtime (no bind of a host file
    whose page cache, futex keys or file system would be shared)."""
    res = run(sandbox, """
        import os
        for line in open("/proc/self/mountinfo"):
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            print(fields[4], fstype)
        """)
    mounts = dict(line.split() for line in res.stdout.splitlines())
    assert res.status == "ok", res
    for target in ("/usr", "/work", "/tmp", "/dev", "/dev/shm"):
        assert mounts.get(target) == "tmpfs", (target, mounts)
    # the program's own files (main.py) are bound from its working directory: made for this run, removed after it
    assert not [t for t, fs in mounts.items() if fs not in ("tmpfs", "proc", "devtmpfs")
                and not t.startswith("/work/")], mounts
    assert not any(t.startswith(("/dev/pts", "/dev/ptmx")) for t in mounts), mounts
    assert leftovers(sandbox) == []
