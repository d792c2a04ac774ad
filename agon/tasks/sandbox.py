"""A sandbox for model-written Python programs that fails closed, shaped so that a remote service can replace it.

``Sandbox.run(RunRequest) -> RunResult`` mirrors SandboxFusion's ``/run_code`` (code, stdin, run timeout, memory
limit in, status / return code / stdout / stderr / time out), so a client for such a service is one more class with
the same ``run``. ``LocalSandbox`` runs each program under **bubblewrap** (``bwrap``, the tool Flatpak uses):

- **its own namespaces**: mount, PID, IPC, network, UTS and cgroup. The program sees, read-only, only what the
  interpreter needs (``runtime_of``: the interpreter, ``setpriv``, the standard library and the shared libraries it
  loads; not ``/usr/local``, no other program, no site-packages), served from a tmpfs copy per uid of the pool
  (``slot_runtime``), never from a bind of a host file, so that no page cache, futex key or file system is shared
  with the host or another slot; a private ``/proc`` that shows only its own processes and none of the host-wide
  counters (``PROC_HIDDEN``); a ``/dev`` of ``null``, ``zero``, ``full``, ``random`` and ``urandom`` (no ptmx: ptys
  are a host-wide pool); and three fresh size-capped tmpfs: ``/work`` (its working directory), ``/tmp`` and
  ``/dev/shm``. No other host file is there: no datasets, no test files, no sockets, no other run's directory. Its
  program files, its stdin (``STDIN_PATH``, made fd 0 by the monitor: a regular file, as a judge gives it) and its
  account (``/etc/passwd``, ``/etc/group``) are copies bubblewrap writes from memfds, root's and read-only.
- **a judge's environment where isolation allows it**: the program is the ``__main__`` module (pickle and
  multiprocessing find its functions), ``/dev/stdout`` and ``/dev/stderr`` open (the pipes are the run's uid's),
  a constant ``/proc/loadavg``, the time-zone database, a stack at the memory limit with no ceiling, and CPU time
  judged by the exact clock of the run's cgroup (RLIMIT_CPU is a backstop above it). What cannot match a judge is
  named in the verdict (``UNLIKE_A_JUDGE``).
- **a user of its own**: every concurrent run takes a uid of its own (``isolation.UidSlots``: a file lock per
  uid at one fixed path for the whole host, so that runs of trainers with different ``TMPDIR`` do not share one
  either), with no supplementary groups, no capabilities and ``no_new_privs``. Another run's processes are not
  visible and not ptrace-able.
- **a seccomp allow-list** (``isolation.seccomp_filter``): a call not on it answers ENOSYS. Sockets are UNIX
  sockets only (no loopback TCP/UDP, whose buffers no v1 cgroup charges; no vsock); huge pages, file locks,
  leases and dnotify, the legacy AIO pool, inotify/fanotify, new namespaces, mounts, ``ptrace``, ``bpf``,
  ``io_uring``, pidfds (pidfs's global inode sequence) and seccomp or socket filters (BPF JIT memory no cgroup
  charges) are refused (EPERM). Another architecture than x86_64 or aarch64 is killed.
- **every process limit set** by the monitor (all 16 of the kernel's, none inherited from the trainer), and a new,
  empty session keyring instead of the trainer's, after which the monitor's own filter refuses ``keyctl``.
- **a budget per run** (``isolation.Cgroups``): memory (resident plus tmpfs), process count, CPU time and an equal
  CPU share counted for all of the run's processes together, in a cgroup of its own (cgroup v1 with ``memory``,
  ``pids``, ``cpu``/``cpuacct``, or cgroup v2). Where no cgroup can be made, the sandbox says so once and keeps the
  per-process limits.
- **a wall-clock deadline**, and output read incrementally: stdout capped (past it the run ends), stderr's head and
  tail kept and the rest dropped.

**Verdicts a program cannot forge.** Inside the sandbox a small monitor (``_BOOTSTRAP``) sets the limits, tells the
sandbox over a private pipe that setup succeeded, and forks the program, which closes the pipe before its first
line runs. The monitor then reports the program's real wait status (exit code or signal) on the same pipe. The
monitor is not dumpable, so the program cannot reach the pipe through ``/proc``. Nothing the program prints is
taken as the sandbox's own message. A run whose setup never reported is a ``sandbox_error``, the only unscored
verdict. After the program started, nothing it does can make the verdict raise: every exit status, every signal
number (real-time ones included), any output; an unexpected state is a ``runtime_error`` with its cause. Kills are
reported by their cause: the deadline, CPU time (the run's total or a process's SIGXCPU), the cgroup's OOM killer,
the process limit, or a signal.

**Fail closed.** When bubblewrap is missing or cannot set up its namespaces (root without CAP_SYS_ADMIN, the
default in Docker and Kubernetes, and no user namespaces), ``LocalSandbox()`` raises ``SandboxUnavailable`` with
what is missing and how to fix it. ``LocalSandbox(allow_unsafe=True)`` (``task.sandbox.allow_unsafe=true``) runs
programs anyway, in a plain subprocess with the per-process limits only, after a loud warning.

**Every exit path ends the run.** The run's processes are SIGKILLed through bubblewrap's PID namespace (bwrap dies
with its parent, the trainer's thread, and the namespace with it) and then through the cgroup, which must be
empty before it is removed; the working directory goes with the mount namespace.

Grading never trusts the exit code alone: callers compare stdout for every test, so ``sys.exit(0)`` or
``os._exit(0)`` before the work is done cannot fake a pass (SandboxFusion's "antihack" concern).

Left out on purpose: languages other than Python (the interpreter is the host's ``/usr/bin/python3``, copied),
a network allow-list (a run has no network at all), and a disk quota beyond the tmpfs sizes.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import platform
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol, runtime_checkable

from agon.tasks.isolation import (
    UID_BASE,
    UID_SLOTS,
    Cgroups,
    RunCgroup,
    SandboxUnavailable,
    UidSlots,
    run_cgroup_owner,
    seccomp_filter,
)

log = logging.getLogger(__name__)

# RunResult.status values
STATUSES = ("ok", "timeout", "runtime_error", "memory", "output_limit", "sandbox_error")

ISOLATION_BWRAP = "bwrap"
ISOLATION_UNSAFE = "unsafe"

SYSTEM_PYTHON = "/usr/bin/python3"
ENV_ALLOWLIST = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
# the run's user as the C library and Python see it (getpass, pwd, expanduser): one account, its uid the run's
RUN_USER = "judge"
# and inside the sandbox, what a judge's account has
RUN_ENV = {"HOME": "/work", "USER": RUN_USER, "LOGNAME": RUN_USER}
# the memory the interpreter itself takes, on top of what the request grants the program
INTERPRETER_MB = 48
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`) and run as root with "
                "CAP_SYS_ADMIN (Docker: `--cap-add SYS_ADMIN`, and `--security-opt apparmor=unconfined` where "
                "AppArmor confines the container), or set task.sandbox.allow_unsafe=true to run model-written code "
                "with per-process limits only")
@dataclass(frozen=True)
class RunRequest:
    """One program run. Field names follow SandboxFusion's run_code where one exists."""

    code: str
    stdin: str = ""
    # only "python" runs locally
    language: str = "python"
    # CPU seconds of the whole run, by the exact clock of its cgroup (every process together, the sandbox's own
    # start allowed: CPU_ALLOWANCE_S); each process also has RLIMIT_CPU, a backstop above it (CPU_BACKSTOP), which
    # is the limit where no cgroup can be made. The program is ended when it uses more
    time_limit_s: float = 4.0
    # wall-clock deadline; None means 2 * time_limit_s + 1 (room for a loaded machine and interpreter start-up)
    wall_time_s: float | None = None
    # memory of the whole run (resident memory plus its tmpfs files, every process together; a cgroup), and the
    # address space of each of its processes (RLIMIT_AS)
    memory_mb: int = 512
    # stdout; the program is ended when it writes more (output_limit)
    max_output_bytes: int = 1 << 20
    # stderr kept (its first bytes and its last STDERR_TAIL); more is read and dropped, never a failure: debug lines
    # on stderr are no error on a judge
    max_stderr_bytes: int = 1 << 20
    # largest file the program may write (RLIMIT_FSIZE), and the size of each of its tmpfs (/work, /tmp, /dev/shm)
    max_file_mb: int = 64
    # processes and threads the run may have at once, all of its processes together
    max_processes: int = 32
    max_open_files: int = 256
    # extra files written next to main.py, name -> content
    files: Mapping[str, str] = field(default_factory=dict)

    @property
    def wall_limit_s(self) -> float:
        return self.wall_time_s if self.wall_time_s is not None else 2.0 * self.time_limit_s + 1.0


@dataclass(frozen=True)
class RunResult:
    # ok | timeout | runtime_error | memory | output_limit | sandbox_error
    status: str
    # the program's exit code; negative: killed by that signal; None: it never ran or was killed by the sandbox
    return_code: int | None
    stdout: str
    stderr: str
    # some output was dropped at the cap
    truncated: bool
    wall_s: float
    detail: str = ""
    # False when stdout held bytes that are not UTF-8 (``stdout`` shows each as U+FFFD): no expected text can match it
    stdout_is_utf8: bool = True
    # the run's exact CPU seconds (its cgroup's count: the program's, and the sandbox's own start); None without one
    cpu_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@runtime_checkable
class Sandbox(Protocol):
    """Anything that runs a ``RunRequest``; a remote SandboxFusion client fits the same shape."""

    @property
    def isolation(self) -> str: ...

    def run(self, req: RunRequest) -> RunResult: ...




# ---------------------------------------------------------------------------------------------------------------
# the monitor inside the sandbox (stdlib only, run as `python3 -I -S -c _BOOTSTRAP`)

_BOOTSTRAP = r"""
import os, resource, sys
prog, chan = sys.argv[1], int(sys.argv[2])
cpu, mem, fsize, nproc, nofile, sigpending, keyctl, lock_keys, prctl_nr = (int(v) for v in sys.argv[3:12])
stdin_path = sys.argv[12]
try:
    # every limit the kernel has, set here: none passes through from the trainer
    limits = {
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (mem, mem),
        resource.RLIMIT_DATA: (mem, mem),
        resource.RLIMIT_RSS: (mem, mem),
        # a judge's stack: the memory limit, and no ceiling, so that the common template line that raises it to
        # unlimited works (the run's memory and address space still bound it)
        resource.RLIMIT_STACK: (mem, resource.RLIM_INFINITY),
        resource.RLIMIT_FSIZE: (fsize, fsize),
        resource.RLIMIT_NPROC: (nproc, nproc),
        resource.RLIMIT_NOFILE: (nofile, nofile),
        resource.RLIMIT_MEMLOCK: (0, 0),
        resource.RLIMIT_MSGQUEUE: (0, 0),
        resource.RLIMIT_SIGPENDING: (sigpending, sigpending),
        resource.RLIMIT_NICE: (0, 0),
        resource.RLIMIT_RTPRIO: (0, 0),
        resource.RLIMIT_RTTIME: (0, 0),
        10: (0, 0),  # RLIMIT_LOCKS, which the resource module leaves out
    }
    unset = {getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_")} | set(range(16))
    if unset - set(limits):  # a kernel or Python with a limit this list does not know: fail closed
        raise RuntimeError("limits the sandbox does not set: %s" % sorted(unset - set(limits)))
    for lim, (soft, hard) in limits.items():
        resource.setrlimit(lim, (soft, hard))
    # signals as a fresh interpreter has them, whatever the trainer ignored or blocked (both pass through exec):
    # default dispositions but Python's own (SIGPIPE, SIGXFSZ ignored), nothing blocked. SIGINT too: a trainer
    # started in the background (`nohup ... &`) ignores it, and the program's interpreter would keep that
    import signal
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the pipe cannot be reopened through /proc
    # a new, empty session keyring (KEYCTL_JOIN_SESSION_KEYRING, no name) instead of the trainer's
    if libc.syscall(keyctl, 1, None) < 0 and ctypes.get_errno() != 38:
        raise OSError(ctypes.get_errno(), "keyctl(KEYCTL_JOIN_SESSION_KEYRING): " + os.strerror(ctypes.get_errno()))
    if lock_keys:  # a filter stacked on bubblewrap's: keyctl and prctl(PR_SET_SECCOMP) refused (EPERM) from here
        # on, the program included (each filter it stacked would take BPF JIT memory that no cgroup charges)
        import struct
        ins = [(0x20, 0, 0, 0), (0x15, 0, 1, keyctl), (0x06, 0, 0, 0x50001), (0x15, 0, 3, prctl_nr),
               (0x20, 0, 0, 16), (0x15, 0, 1, 22), (0x06, 0, 0, 0x50001), (0x06, 0, 0, 0x7FFF0000)]
        code = ctypes.create_string_buffer(b"".join(struct.pack("<HBBI", *i) for i in ins))
        class _Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
        if libc.prctl(22, 2, ctypes.byref(_Prog(len(ins), ctypes.addressof(code))), 0, 0) != 0:  # PR_SET_SECCOMP
            raise OSError(ctypes.get_errno(), "seccomp (keyctl): " + os.strerror(ctypes.get_errno()))
    os.write(chan, b"ready\n")  # before the program exists, so nothing it does can withhold it
    pid = os.fork()
except BaseException as e:
    os.write(chan, b"setup-failed " + repr(e).encode() + b"\n")
    os._exit(121)
if pid:
    os.closerange(0, 3)
    while True:
        try:
            p, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    os.write(chan, b"status %d\n" % status)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
os.close(chan)
# stdin a regular, read-only file, as a judge gives it: sized by fstat, mapped, read twice
_fd = os.open(stdin_path, os.O_RDONLY)
os.dup2(_fd, 0)
os.close(_fd)
del pid, chan, libc, limits, unset, lock_keys, _fd
sys.argv = [prog]
with open(prog, "rb") as _f:
    _code = compile(_f.read(), prog, "exec")
# the program is the __main__ module, so pickle (and multiprocessing) find its functions and classes there
import types
_main = types.ModuleType("__main__")
_main.__file__, _main.__builtins__ = prog, __builtins__
sys.modules["__main__"] = _main
exec(_code, _main.__dict__)
"""
# /proc entries that show a host-wide count a program can move or read another run's moves in (threads and forks
# in loadavg and stat, file handles, inodes and ptys in sys/, keys per uid, locks, page and memory counters, cgroups
# per controller, interrupts, pressure), shown as an empty file or directory; a run's own /proc/<pid> stays
PROC_HIDDEN = ("keys", "key-users", "locks", "loadavg", "stat", "vmstat", "meminfo", "zoneinfo", "buddyinfo",
               "pagetypeinfo", "slabinfo", "interrupts", "softirqs", "schedstat", "diskstats", "swaps", "uptime",
               "cgroups", "timer_list", "sched_debug", "vmallocinfo", "latency_stats", "sys", "pressure")
PROC_HIDDEN_DIRS = ("/proc/sys", "/proc/pressure")
DEV_NODES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
             ("stderr", "/proc/self/fd/2"))


@functools.lru_cache(maxsize=1)
def _proc_hidden() -> tuple[str, ...]:
    """The ``PROC_HIDDEN`` entries this kernel has (bubblewrap cannot mount over one that does not exist)."""
    return tuple(f"/proc/{name}" for name in PROC_HIDDEN if os.path.lexists(f"/proc/{name}"))


# the last bytes of stderr kept past its cap: a traceback after pages of debug lines
STDERR_TAIL = 4096
# the run's stdin where it runs without isolation (in its working directory, next to main.py)
STDIN_FILE = ".stdin"
# the CPU time the run's cgroup counts besides the program's (bubblewrap, setpriv, the monitor's interpreter start:
# about 0.03-0.06 s here), allowed over the budget so that a program inside its budget never fails
CPU_ALLOWANCE_S = 0.1
# pending signals of the run's uid (RLIMIT_SIGPENDING counts per user)
SIGPENDING = 1024
# keyctl's and prctl's numbers, by architecture
KEYCTL_NR = {"x86_64": 250, "aarch64": 219}
PRCTL_NR = {"x86_64": 157, "aarch64": 167}
# where a run's stdin is, a read-only file of the run's own (the monitor makes it fd 0)
STDIN_PATH = "/run/agon/stdin"
# /proc/loadavg as a run sees it: constant (the host's moves with every neighbour), but there: os.getloadavg() works
LOADAVG = b"0.00 0.00 0.00 1/1 1\n"
# the per-process CPU limit (RLIMIT_CPU) where the run's cgroup counts its exact CPU time: the kernel checks it
# against tick-sampled time, which ran 3-35% ahead of the exact time here, so it is a backstop well above the
# budget and the cgroup's exact total decides
CPU_BACKSTOP = 1.5
SETUP_FAILED = 121


# ---------------------------------------------------------------------------------------------------------------
# what of the host's /usr a run sees: the interpreter, its standard library and the shared libraries it loads

# run by the sandbox's interpreter once: every extension module of its standard library imported, then the files
# it has mapped (the C library, libffi, libssl, libsqlite3, ...) read from /proc/self/maps
_RUNTIME_PROBE = r"""
import importlib, json, os, sys, sysconfig
stdlib, platstdlib = sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")
dynload = os.path.join(platstdlib, "lib-dynload")
for name in sorted(os.listdir(dynload) if os.path.isdir(dynload) else ()):
    if name.endswith(".so"):
        try:
            importlib.import_module(name.split(".", 1)[0])
        except BaseException:
            pass
libs = sorted({ln.split(None, 5)[5].strip() for ln in open("/proc/self/maps") if len(ln.split(None, 5)) == 6
               and ln.split(None, 5)[5].startswith("/")})
print(json.dumps({"stdlib": [stdlib, platstdlib], "libs": libs}))
"""
_RUNTIMES: dict[tuple[str, str], "Runtime"] = {}

# where each uid of the pool keeps its copy of the runtime: a tmpfs of its own, made at the uid's first run and kept
# for the next one (of any trainer on this host), so that a run reads no host file and no other slot's
RUNTIME_DIR = "/run/agon-sandbox/runtime"
RUNTIME_STAMP = ".agon-runtime"
RUNTIME_EMPTY = ".agon-empty"
# parts of the standard library no judged program needs, left out of the copy: the test suite, the GUI and IDLE,
# the installer and the build's static library (config-3.X-*/libpython3.X.a, 25 MB that nothing reads at run time)
STDLIB_LEFT_OUT = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages",
                   "dist-packages")
# the time-zone database's variants that count leap seconds (right/), which no judged program reads
ZONEINFO_LEFT_OUT = ("right",)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MNT_DETACH = 1, 2, 4, 32, 2


@dataclass(frozen=True)
class Runtime:
    """What of the host a run needs, as a tree to copy: ``entries`` are (path, "dir" | "file" | "link", the link's
    target), parents before children; ``tops`` the top-level names (``/usr``, ``/bin`` ...) a run sees."""

    entries: tuple[tuple[str, str, str], ...]
    tops: tuple[str, ...]
    digest: str
    size: int

    def mounts(self, root: str) -> list[str]:
        """bubblewrap arguments that show a run the copy under ``root``, read-only: one bind per top-level
        directory, and the top-level symlinks (``/bin -> usr/bin`` where /usr is merged)."""
        kinds = {path: (kind, target) for path, kind, target in self.entries}
        args: list[str] = []
        for top in self.tops:
            kind, target = kinds[top]
            args += ["--symlink", target, top] if kind == "link" else ["--ro-bind", root + top, top]
        return args


def _ldd(exe: str) -> set[str]:
    """The shared libraries ``exe`` loads, as the dynamic loader resolves them (what ``ldd`` prints)."""
    out = subprocess.run([exe], env={"LD_TRACE_LOADED_OBJECTS": "1"}, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60).stdout
    return {os.path.realpath(m.group(1)) for m in re.finditer(r"(/\S+) \(0x", out)}


def runtime_of(python: str, setpriv: str) -> Runtime:
    """The runtime a run needs, found once per process: the interpreter and ``setpriv`` (with the symlinks on the
    way to them), the interpreter's standard library (less ``STDLIB_LEFT_OUT`` and the optimized ``.pyc``), from
    the directories of the shared libraries it maps with every extension module imported only those libraries
    (plus ``setpriv``'s, and ``libgcc_s``, which the C library opens to end a thread), ``/usr/lib/locale``, the
    time-zone database (``/usr/share/zoneinfo``: ``zoneinfo``), and the host's top-level ``/lib*`` and ``/bin``
    symlinks. Not ``/usr/local``, other programs, site-packages, headers or the rest of ``/usr/share``."""
    key = (python, setpriv)
    if key in _RUNTIMES:
        return _RUNTIMES[key]
    probe = subprocess.run([python, "-I", "-S", "-c", _RUNTIME_PROBE], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=120, env=dict(ENV_ALLOWLIST))
    if probe.returncode != 0:
        raise SandboxUnavailable(f"{python} could not list what it loads: {probe.stderr[-400:].strip()}")
    info = json.loads(probe.stdout.splitlines()[-1])
    stdlib = {os.path.realpath(d) for d in info["stdlib"]}
    libs = {os.path.realpath(lib) for lib in info["libs"] if ".so" in os.path.basename(lib)}
    libs |= _ldd(setpriv) | _ldd(python)
    lib_dirs = {os.path.dirname(lib) for lib in libs}
    for d in sorted(lib_dirs):
        gcc = os.path.join(d, "libgcc_s.so.1")
        if os.path.exists(gcc):
            libs.add(os.path.realpath(gcc))
    whole = {d for d in ("/usr/lib/locale", "/usr/lib64", "/usr/share/zoneinfo")
             if os.path.isdir(d) and not os.path.islink(d)}
    tops: list[str] = []
    entries: dict[str, tuple[str, str]] = {}

    def add_parents(path: str) -> None:
        for parent in reversed(Path(path).parents):
            if str(parent) != "/" and str(parent) not in entries:
                entries[str(parent)] = ("dir", "")

    def add(path: str, kind: str, target: str = "") -> None:
        add_parents(path)
        entries[path] = (kind, target)

    def add_with_links(path: str) -> None:
        """``path`` and every symlink on the way to the file it names (/usr/bin/python3 -> python3.11)."""
        for _ in range(40):
            if not os.path.islink(path):
                break
            target = os.readlink(path)
            add(path, "link", target)
            path = os.path.normpath(os.path.join(os.path.dirname(path), target))
        add(os.path.realpath(path), "file")

    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            entries[top] = ("link", os.readlink(top))
    in_stdlib = lambda p: any(p == d or p.startswith(d + "/") for d in stdlib)  # noqa: E731
    for d in sorted(stdlib | lib_dirs | whole):
        if in_stdlib(d) and d not in stdlib:
            continue  # comes with the standard library's directory
        for dirpath, dirnames, filenames in os.walk(d):
            rel_top = os.path.relpath(dirpath, d).split(os.sep)[0]
            if d in stdlib and (rel_top in STDLIB_LEFT_OUT or rel_top.startswith("config-")) or \
                    d in whole and rel_top in ZONEINFO_LEFT_OUT:
                dirnames[:] = []
                continue
            if d in stdlib or d in whole:
                add(dirpath, "dir")
            else:
                dirnames[:] = []  # a library directory: only the libraries a run loads, none of its subdirectories
            for name in sorted(filenames + [n for n in dirnames if os.path.islink(os.path.join(dirpath, n))]):
                path = os.path.join(dirpath, name)
                if name.endswith((".opt-1.pyc", ".opt-2.pyc")):
                    continue
                if d not in stdlib and d not in whole and os.path.realpath(path) not in libs:
                    continue
                if os.path.islink(path):
                    add(path, "link", os.readlink(path))
                elif os.path.isfile(path):
                    add(path, "file")
            dirnames[:] = [n for n in dirnames if not os.path.islink(os.path.join(dirpath, n))]
    for lib in sorted(libs):  # a library outside the directories walked (an unmerged /lib, say)
        if lib not in entries:
            add_with_links(lib)
    for exe in (python, setpriv):
        add_with_links(exe)
    for path in sorted(entries):
        top = "/" + path.split("/")[1]
        if top not in tops:
            tops.append(top)
    ordered = tuple((path, *entries[path]) for path in sorted(entries))
    digest, size = hashlib.sha256(f"layout 2 {RUNTIME_EMPTY}\n".encode()), 0
    for path, kind, target in ordered:
        st = os.lstat(path) if kind != "dir" else None
        if kind == "file":
            size += -(-st.st_size // 4096) * 4096  # a tmpfs file takes whole pages
        digest.update(f"{path}\0{kind}\0{target}\0{st.st_size if st else 0}\0{st.st_mtime_ns if st else 0}\n"
                      .encode("utf-8", "surrogateescape"))
    _RUNTIMES[key] = Runtime(ordered, tuple(tops), digest.hexdigest(), size)
    return _RUNTIMES[key]


def _mount_call(*args) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.umount2 if len(args) == 2 else libc.mount
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{'umount2' if len(args) == 2 else 'mount'}{args[:2]}: {os.strerror(err)}")


def slot_runtime(runtime: Runtime, uid: int, base: str = RUNTIME_DIR) -> str:
    """The root of uid ``uid``'s copy of ``runtime``: a tmpfs of its own, read-only, made (or remade, when the
    host's runtime changed) here. Called while the uid's slot lock is held, so no other run of any trainer uses
    the copy while it is made."""
    root = os.path.join(base, f"uid-{uid}")
    stamp = os.path.join(root, RUNTIME_STAMP)
    with contextlib.suppress(OSError):
        with open(stamp) as f:
            if os.path.ismount(root) and f.read() == runtime.digest:
                return root
    os.makedirs(base, mode=0o700, exist_ok=True)
    os.makedirs(root, mode=0o755, exist_ok=True)
    for _ in range(8):  # a stale copy, or copies stacked by a trainer that died while making one
        if not os.path.ismount(root):
            break
        _mount_call(root.encode(), _MNT_DETACH)
    size = f"size={runtime.size + (4 << 20)},mode=0755"
    flags = _MS_NOSUID | _MS_NODEV
    try:  # noswap (Linux 6.4+): its pages never leave memory, so no run can tell whether another touched them
        _mount_call(b"tmpfs", root.encode(), b"tmpfs", flags, f"{size},noswap".encode())
    except OSError:
        _mount_call(b"tmpfs", root.encode(), b"tmpfs", flags, size.encode())
    try:
        for path, kind, target in runtime.entries:
            dest = root + path
            if kind == "dir":
                os.makedirs(dest, mode=0o755, exist_ok=True)
            elif kind == "link":
                os.symlink(target, dest)
            else:
                shutil.copy2(path, dest)
                os.chown(dest, 0, 0)
        with open(os.path.join(root, RUNTIME_EMPTY), "w"):  # what a run sees in place of a hidden /proc file
            pass
        with open(stamp, "w") as f:
            f.write(runtime.digest)
        # read-only for the host too. A child that another thread forks holds a copied file open for writing until
        # it execs (EBUSY): tried again a while, and else left writable, which no run sees (its binds are --ro-bind)
        give_up = time.monotonic() + 1.0
        while True:
            try:
                _mount_call(b"tmpfs", root.encode(), b"tmpfs", flags | _MS_REMOUNT | _MS_RDONLY, None)
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > give_up:
                    break
                time.sleep(0.01)
    except BaseException:
        with contextlib.suppress(OSError):
            _mount_call(root.encode(), _MNT_DETACH)
        raise
    return root


def release_runtime(uid: int, base: str = RUNTIME_DIR) -> bool:
    """Unmount uid ``uid``'s copy of the runtime (called with the uid's lock held); whether one was mounted."""
    root = os.path.join(base, f"uid-{uid}")
    found = False
    for _ in range(8):  # copies stacked by a trainer that died while making one
        if not os.path.ismount(root):
            break
        _mount_call(root.encode(), _MNT_DETACH)
        found = True
    with contextlib.suppress(OSError):
        os.rmdir(root)
    return found


def sweep_runtimes(slots: UidSlots, uids: set[int] | range, base: str = RUNTIME_DIR) -> int:
    """Unmount the copies of ``uids`` that no run holds (their locks free): a trainer's own when it exits, and any
    a killed trainer left when the next one starts (48 MiB each, otherwise mounted until the host reboots). A copy
    another trainer holds for its next run is made again at that run. How many were unmounted."""
    swept = 0
    for uid in sorted(uids):
        if not os.path.ismount(os.path.join(base, f"uid-{uid}")):
            continue
        with slots.hold(uid) as free:
            if free:
                swept += release_runtime(uid, base)
    return swept


# ---------------------------------------------------------------------------------------------------------------
# working directories and cgroups left by a trainer that died mid-run

WORKDIR_PREFIX = "agon-sbx-"


def _pid_alive(owner: str) -> bool:
    return owner.isdigit() and (int(owner) == os.getpid() or os.path.exists(f"/proc/{owner}"))


def remove_stale_workdirs(tmp_root: str) -> int:
    """Delete working directories left by processes that died mid-run (named ``agon-sbx-<pid>-*``)."""
    removed = 0
    try:
        entries = os.listdir(tmp_root)
    except OSError:
        return 0
    for name in entries:
        if not name.startswith(WORKDIR_PREFIX):
            continue
        owner = name[len(WORKDIR_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not _pid_alive(owner):
            shutil.rmtree(os.path.join(tmp_root, name), ignore_errors=True)
            removed += 1
    return removed


def _remove_stale_cgroups(cgroups: Cgroups) -> None:
    names = {d.name for parent in cgroups.parents.values() if parent.is_dir() for d in parent.iterdir() if d.is_dir()}
    for name in names:
        owner = run_cgroup_owner(name)
        if owner is not None and not _pid_alive(str(owner)):
            group = RunCgroup(cgroups.version, {c: p / name for c, p in cgroups.parents.items()})
            group.kill_all()
            group.remove()


# ---------------------------------------------------------------------------------------------------------------

_PROBES: dict[tuple, str | None] = {}
_PROBE_LOCK = threading.Lock()
_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)


class LocalSandbox:
    """Runs Python programs on this machine under bubblewrap (see the module docstring); fails closed.

    ``allow_unsafe``: where isolation cannot be set up, run programs anyway with per-process limits only (loudly)
    instead of raising ``SandboxUnavailable``. ``network``: keep the host's network (off by default: none at all).
    Safe to call ``run`` from several threads at once: each run has its own uid, cgroup and working directory.
    """

    # numbers for run cgroups, one count per process, not per sandbox: a trainer may hold several sandboxes, and
    # their runs at the same time must not pick the same cgroup name
    _runs = itertools.count(1)

    def __init__(self, allow_unsafe: bool = False, python: str = SYSTEM_PYTHON, network: bool = False,
                 tmp_root: str | None = None, bwrap: str | None = None, uid_base: int = UID_BASE,
                 uid_slots: int = UID_SLOTS):
        self.python, self.network = python, network
        self.tmp_root = tmp_root or tempfile.gettempdir()
        self.bwrap = bwrap or shutil.which("bwrap")
        # where the run's PATH finds it (the trainer's PATH is not the run's)
        self.setpriv = shutil.which("setpriv", path=ENV_ALLOWLIST["PATH"])
        remove_stale_workdirs(self.tmp_root)
        self.cgroups, no_cgroup = Cgroups.detect()
        if self.cgroups is not None:
            _remove_stale_cgroups(self.cgroups)
        else:
            _warn_once(f"sandbox: no cgroup per run ({no_cgroup}): memory, process and CPU limits are per process")
        self.slots: UidSlots | None = None
        problem = None
        if os.geteuid() == 0:  # without root there is no uid to switch to, and the probe says so
            try:
                self.slots = UidSlots(uid_base, uid_slots, runs_in_cgroups=self.cgroups is not None)
                sweep_runtimes(self.slots, range(uid_base, uid_base + uid_slots))  # a killed trainer's copies
            except (SandboxUnavailable, OSError) as exc:
                problem = f"no uid pool for the runs: {exc}"
        # the uids whose runtime copy this sandbox used: unmounted at close (and at exit), unless a run holds one
        self._copies: set[int] = set()
        atexit.register(self.close)
        problem = problem or self._probe()
        if problem is None:
            self._isolation = ISOLATION_BWRAP
        elif allow_unsafe:
            self._isolation = ISOLATION_UNSAFE
            _warn_once(f"sandbox: UNSAFE: model-written programs run WITHOUT isolation (task.sandbox.allow_unsafe="
                       f"true), as this process's user with per-process limits only: {problem}")
        else:
            raise SandboxUnavailable(f"the sandbox cannot isolate model-written programs here: {problem}. To fix "
                                     f"it: {INSTALL_HINT}.")
        self.note = problem or ""

    @property
    def isolation(self) -> str:
        return self._isolation

    def close(self) -> None:
        """Unmount the runtime copies this sandbox made or used, unless a run (of any trainer) holds one now."""
        if self.slots is not None and self._copies:
            with contextlib.suppress(OSError):
                sweep_runtimes(self.slots, set(self._copies))
            self._copies.clear()

    def _probe(self) -> str | None:
        """None when bubblewrap runs a program here with every isolation in place, else why not (once per
        configuration and process)."""
        key = (self.bwrap, self.python, self.network, self.tmp_root)
        with _PROBE_LOCK:
            if key not in _PROBES:
                _PROBES[key] = self._probe_once()
            return _PROBES[key]

    def _probe_once(self) -> str | None:
        if platform.system() != "Linux":
            return "not Linux"
        if not self.bwrap or not os.access(self.bwrap, os.X_OK):
            return f"bubblewrap is not installed ({self.bwrap or 'no bwrap on PATH'})"
        if os.geteuid() != 0:
            return "not running as root (a uid per run needs root)"
        if not os.access(self.python, os.X_OK):
            return f"{self.python} not found"
        if self.setpriv is None:
            return f"setpriv (util-linux) not found on {ENV_ALLOWLIST['PATH']}"
        try:
            seccomp_filter()
        except SandboxUnavailable as exc:
            return str(exc)
        self._isolation = ISOLATION_BWRAP
        res = self.run(RunRequest(code="print('agon-probe-ok')", time_limit_s=5, wall_time_s=30))
        if res.status == "ok" and res.stdout.strip() == "agon-probe-ok":
            return None
        return f"bubblewrap could not set up the sandbox: {res.detail} {res.stderr[-400:].strip()}".strip()

    # --- run -------------------------------------------------------------------------------------------------

    def run(self, req: RunRequest) -> RunResult:
        t0 = time.monotonic()
        if req.language != "python":
            return RunResult("sandbox_error", None, "", "", False, 0.0, f"language {req.language!r} is not supported")
        workdir, group = None, None
        try:
            isolated = self._isolation == ISOLATION_BWRAP and self.slots is not None
            with self.slots.claim() if isolated else contextlib.nullcontext() as uid:
                try:
                    # the uid's own copy of the runtime; made here at the uid's first run, while its lock is held
                    runtime_root = slot_runtime(runtime_of(self.python, self.setpriv), uid) if isolated else None
                    if isolated:
                        self._copies.add(uid)
                    workdir = self._make_workdir(req)
                    if self.cgroups is not None:
                        name = f"run-{os.getpid()}-{next(self._runs)}"
                        group = self.cgroups.create(name, (req.memory_mb + 2 * INTERPRETER_MB) << 20,
                                                    req.max_processes + 4)
                    return self._execute(req, workdir, uid, group, t0, runtime_root)
                finally:
                    if group is not None and not group.kill_all():
                        log.error("sandbox: processes of %s survived SIGKILL", group.dirs)
                    if group is not None:
                        group.remove()
                    if workdir is not None:
                        shutil.rmtree(workdir, ignore_errors=True)
        except Exception as e:  # the sandbox's own failure, never the program's
            log.exception("sandbox: run failed")
            return RunResult("sandbox_error", None, "", "", False, time.monotonic() - t0, f"{type(e).__name__}: {e}")

    def _make_workdir(self, req: RunRequest) -> str:
        """The run's host directory, bubblewrap's cwd. Its files (the program, its files, its stdin: root-owned,
        read-only) are written here only when unsafe, where it is the program's cwd; an isolated run gets copies
        from memfds instead (``_data``)."""
        workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-", dir=self.tmp_root)
        for name, content in {**req.files, "main.py": req.code, STDIN_FILE: req.stdin}.items():
            if os.path.basename(name) != name or name in ("", ".", ".."):
                raise ValueError(f"file name {name!r} must be a plain name")
            if self._isolation == ISOLATION_BWRAP:
                continue
            path = os.path.join(workdir, name)
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(content)
            os.chmod(path, 0o444)
        os.chmod(workdir, 0o700)
        return workdir

    def _command(self, req: RunRequest, workdir: str, uid: int | None, group: RunCgroup | None, seccomp_fd: int,
                 chan: int, runtime_root: str | None = None, data: dict[str, int] | None = None) -> list[str]:
        """The command that runs the monitor; ``data``: path inside the run -> a descriptor of its content, each
        copied by bubblewrap into a read-only file of the run's own (the program, its files, stdin, the account)."""
        # the run's cgroup counts its exact CPU time: the per-process limit is a backstop above it (CPU_BACKSTOP)
        cpu = math.ceil(req.time_limit_s * CPU_BACKSTOP) + 1 if group is not None else max(1, math.ceil(
            req.time_limit_s))
        limits = [cpu, (req.memory_mb + INTERPRETER_MB) << 20, req.max_file_mb << 20,
                  req.max_processes + 1, req.max_open_files, SIGPENDING,  # + 1: the monitor
                  KEYCTL_NR.get(platform.machine(), -1), int(self._isolation == ISOLATION_BWRAP),
                  PRCTL_NR.get(platform.machine(), -1)]
        join = []
        if group is not None:  # the shell joins the run's cgroup, then becomes bwrap: every process is counted
            join = ["/bin/sh", "-c", 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 120; shift; done; shift; '
                    'exec "$@"', "sh", *group.procs_files, "--"]
        if self._isolation == ISOLATION_UNSAFE:
            boot = [self.python, "-I", "-c", _BOOTSTRAP, os.path.join(workdir, "main.py"), str(chan)]
            return join + boot + [str(v) for v in limits] + [os.path.join(workdir, STDIN_FILE)]
        size = str(max(req.max_file_mb, 1) << 20)
        cmd = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
               "--unshare-cgroup-try", "--hostname", "sandbox"]
        if not self.network:
            cmd.append("--unshare-net")
        cmd += runtime_of(self.python, self.setpriv).mounts(runtime_root)
        cmd += ["--proc", "/proc"]
        data = data or {}
        # host-wide counters a program could move or count (see PROC_HIDDEN): an empty file or directory instead,
        # or a constant where programs read one (/proc/loadavg)
        for path in _proc_hidden():
            if path in data:
                cmd += ["--perms", "0444", "--ro-bind-data", str(data[path]), path]
            elif path in PROC_HIDDEN_DIRS:
                cmd += ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
            else:
                cmd += ["--ro-bind", f"{runtime_root}/{RUNTIME_EMPTY}", path]
        # a /dev of the character devices a program uses, and no more: bubblewrap's --dev has a devpts and ptmx,
        # whose ptys come from the host's pool (kernel.pty.max), and /dev/tty
        cmd += ["--perms", "0755", "--size", "65536", "--tmpfs", "/dev"]
        for node in DEV_NODES:
            cmd += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
        for link, target in DEV_LINKS:
            cmd += ["--symlink", target, f"/dev/{link}"]
        for tmpfs in ("/dev/shm", "/tmp", "/work"):
            cmd += ["--perms", "1777", "--size", size, "--tmpfs", tmpfs]
        # copies, not binds of host files: no host path, file system or free-block count behind them
        for path, fd in sorted(data.items()):
            if not path.startswith("/proc/"):
                cmd += ["--perms", "0444", "--ro-bind-data", str(fd), path]
        cmd += ["--chdir", "/work", "--seccomp", str(seccomp_fd), "--clearenv"]
        for key, value in {**ENV_ALLOWLIST, **RUN_ENV}.items():
            cmd += ["--setenv", key, value]
        cmd += ["--", "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--",
                self.python, "-I", "-c", _BOOTSTRAP, "/work/main.py", str(chan)]
        return join + cmd + [str(v) for v in limits] + [STDIN_PATH]

    def _data(self, req: RunRequest, uid: int | None) -> dict[str, bytes]:
        """What bubblewrap copies into the run (path inside -> content): the program, its files, its stdin, the
        run's account, and the constant load average."""
        files = {f"/work/{name}": content.encode("utf-8", "surrogatepass")
                 for name, content in {**req.files, "main.py": req.code}.items()}
        account = f"{RUN_USER}:x:{uid}:{uid}:{RUN_USER}:/work:/usr/sbin/nologin\n".encode()
        return {**files, STDIN_PATH: req.stdin.encode("utf-8", "surrogatepass"), "/etc/passwd": account,
                "/etc/group": f"{RUN_USER}:x:{uid}:\n".encode(), "/proc/loadavg": LOADAVG}

    def _execute(self, req: RunRequest, workdir: str, uid: int | None, group: RunCgroup | None,
                 t0: float, runtime_root: str | None = None) -> RunResult:
        isolated = self._isolation == ISOLATION_BWRAP
        seccomp_fd = _memfd(seccomp_filter() if isolated else b"")
        data = {path: _memfd(content) for path, content in self._data(req, uid).items()} if isolated else {}
        chan_r, chan_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        if isolated and uid is not None:  # the run's own pipes: /dev/stdout and /dev/stderr open, as on a judge
            for fd in (out_w, err_w):
                os.fchown(fd, uid, uid)
        stdin = open(os.path.join(workdir, STDIN_FILE), "rb") if not isolated else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                self._command(req, workdir, uid, group, seccomp_fd, chan_w, runtime_root, data),
                cwd=workdir, env=dict(ENV_ALLOWLIST), stdin=stdin, stdout=out_w, stderr=err_w,
                start_new_session=True, close_fds=True, pass_fds=(seccomp_fd, chan_w, *data.values()))
        finally:
            for fd in (seccomp_fd, chan_w, out_w, err_w, *data.values()):
                os.close(fd)
            if stdin is not subprocess.DEVNULL:
                stdin.close()
        out, err, chan = _Capped(req.max_output_bytes), _Capped(req.max_stderr_bytes, STDERR_TAIL), _Capped(4096)

        def drain() -> None:
            out.drain(out_r)
            err.drain(err_r)
            chan.drain(chan_r)

        sel = selectors.DefaultSelector()
        timed_out = over_cap = cpu_over = False
        exit_fd, loop_error = None, ""
        allowance = req.time_limit_s + CPU_ALLOWANCE_S
        try:
            sel.register(out_r, selectors.EVENT_READ, out)
            sel.register(err_r, selectors.EVENT_READ, err)
            sel.register(chan_r, selectors.EVENT_READ, chan)
            exit_fd = os.pidfd_open(proc.pid)
            sel.register(exit_fd, selectors.EVENT_READ, "exit")
            deadline = t0 + req.wall_limit_s
            exited_at = None
            while True:
                now = time.monotonic()
                open_streams = sum(1 for k in sel.get_map().values() if isinstance(k.data, _Capped))
                if exited_at is not None and (open_streams == 0 or now - exited_at > 0.5):
                    break
                if now >= deadline:
                    timed_out = True
                    break
                if group is not None and group.cpu_seconds() > allowance:
                    cpu_over = True
                    break
                for key, _ in sel.select(min(deadline - now, 0.05)):
                    if key.data == "exit":
                        sel.unregister(exit_fd)
                        exited_at = time.monotonic()
                    else:
                        chunk = os.read(key.fileobj, 65536)
                        if not chunk:
                            sel.unregister(key.fileobj)
                        # stdout past its cap ends the run; stderr past its cap is dropped (debug output is no
                        # failure on a judge)
                        elif not key.data.add(chunk) and key.data is out:
                            over_cap = True
                if over_cap:
                    break
            # what the run spent between the last poll and its end counts too: the exact total decides
            cpu_over = cpu_over or (group is not None and not timed_out and group.cpu_seconds() > allowance)
        except Exception as exc:  # the sandbox's own failure mid-run; graded below by whether the program had started
            loop_error = f"{type(exc).__name__}: {exc}"
            log.exception("sandbox: watching the run failed")
        finally:
            # bwrap dies, and with it (--die-with-parent) its namespace; then the cgroup, for anything else
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if group is not None:
                group.kill_all()
            proc.wait()
            sel.close()
            if exit_fd is not None:
                os.close(exit_fd)
            drain()
            for fd in (out_r, err_r, chan_r):
                os.close(fd)
        cpu_s = group.cpu_seconds() if group is not None else None
        res = self._verdict(req, group, out, err, chan.text(), proc.returncode, time.monotonic() - t0,
                            timed_out, over_cap, cpu_over, loop_error)
        return dataclasses.replace(res, cpu_s=cpu_s)

    @classmethod
    def _verdict(cls, req: RunRequest, group: RunCgroup | None, out: "_Capped", err: "_Capped", chan: str,
                 outer_rc: int | None, wall: float, timed_out: bool, over_cap: bool, cpu_over: bool,
                 loop_error: str = "") -> RunResult:
        """The run's result; never raises. ``sandbox_error`` only where the monitor never said the program could
        start; anything unexpected after that is a failed run with its cause named, so that no exit status, signal
        or output of a program can turn its failure into an unscored run."""
        started = "ready" in chan.splitlines()
        try:
            res = cls._classify(req, group, out, err, chan, outer_rc, wall, timed_out, over_cap, cpu_over)
        except Exception as exc:
            log.exception("sandbox: the verdict failed")
            res = RunResult("runtime_error" if started else "sandbox_error", None, out.text(), err.text(),
                            out.truncated or err.truncated, wall, f"unexpected state: {type(exc).__name__}: {exc}")
        if loop_error and res.status in ("ok", "sandbox_error"):  # whatever the program did was not watched to its end
            res = RunResult("runtime_error" if started else "sandbox_error", None, res.stdout, res.stderr,
                            res.truncated, wall, f"the sandbox lost track of the run: {loop_error}")
        return dataclasses.replace(res, stdout_is_utf8=out.is_utf8())

    @staticmethod
    def _classify(req: RunRequest, group: RunCgroup | None, out: "_Capped", err: "_Capped", chan: str,
                  outer_rc: int | None, wall: float, timed_out: bool, over_cap: bool, cpu_over: bool) -> RunResult:
        stdout, stderr, truncated = out.text(), err.text(), out.truncated or err.truncated
        lines = chan.splitlines()
        refused = group.pids_limit_hits() if group is not None else 0
        oom_kills = group.oom_kills() if group is not None else 0
        pids_note = f"; the process limit ({req.max_processes}) refused {refused} forks" if refused else ""
        oom = oom_kills > 0
        if over_cap:
            return RunResult("output_limit", None, stdout, stderr, True, wall,
                             f"wrote more than {req.max_output_bytes} bytes{pids_note}")
        if timed_out:
            return RunResult("timeout", None, stdout, stderr, truncated, wall,
                             f"wall clock > {req.wall_limit_s:g}s{pids_note}")
        if cpu_over:
            return RunResult("timeout", None, stdout, stderr, truncated, wall,
                             f"CPU time of the run > {req.time_limit_s:g}s (+{CPU_ALLOWANCE_S:g}s for the sandbox's "
                             f"own start){pids_note}")
        if "ready" not in lines or any(ln.startswith("setup-failed") for ln in lines):
            # the monitor never said the program could start: whatever went wrong is the sandbox's
            why = next((ln for ln in lines if ln.startswith("setup-failed")), f"exit code {outer_rc}")
            return RunResult("sandbox_error", None, stdout, stderr, truncated, wall, f"sandbox setup failed: {why}")
        status = next((int(m.group(1)) for ln in lines if (m := _STATUS_LINE.fullmatch(ln))), None)
        if status is None:  # the monitor was killed before it could report: by the OOM killer or by the program
            if oom:
                return RunResult("memory", None, stdout, stderr, truncated, wall,
                                 f"killed by the OOM killer: memory of the run > {req.memory_mb} MB")
            return RunResult("runtime_error", None, stdout, stderr, truncated, wall,
                             f"the program ended the sandbox's monitor{pids_note}")
        rc = exit_code(status)
        if oom:  # the run went over its memory, whichever of its processes the kernel chose to end
            return RunResult("memory", rc, stdout, stderr, truncated, wall,
                             f"the OOM killer ended {oom_kills} of its processes: memory of the run > "
                             f"{req.memory_mb} MB")
        if rc == 0:
            return RunResult("ok", 0, stdout, stderr, truncated, wall, pids_note.lstrip("; "))
        if rc is None:
            return RunResult("runtime_error", None, stdout, stderr, truncated, wall,
                             f"the program ended in an unexpected wait status {status:#x}{pids_note}")
        memory_error = "MemoryError" in stderr[-2000:] or "Cannot allocate memory" in stderr[-2000:]
        if rc == -signal.SIGXCPU:  # the per-process backstop (CPU_BACKSTOP), or the limit itself without a cgroup
            return RunResult("timeout", rc, stdout, stderr, truncated, wall,
                             f"CPU time of one process past its limit (SIGXCPU)")
        if memory_error:
            return RunResult("memory", rc, stdout, stderr, truncated, wall,
                             f"MemoryError: memory > {req.memory_mb} MB")
        if rc < 0:
            return RunResult("runtime_error", rc, stdout, stderr, truncated, wall,
                             f"killed by {signal_name(-rc)}{pids_note}")
        unlike = next((why for mark, why in UNLIKE_A_JUDGE.items() if mark in stderr[-2000:]), "")
        return RunResult("runtime_error", rc, stdout, stderr, truncated, wall,
                         f"exit code {rc}{pids_note}{'; ' + unlike if unlike else ''}")


_STATUS_LINE = re.compile(r"status (\d{1,10})")
# what a judge has and the sandbox cannot give, by the error a program fails with: named in its verdict
UNLIKE_A_JUDGE = {
    "Load averages are unobtainable": "os.getloadavg() needs sysinfo(), which the sandbox refuses (it counts the "
                                      "host's processes, which every neighbour moves); /proc/loadavg reads a constant",
}


def _memfd(content: bytes) -> int:
    """A descriptor of ``content`` at offset 0, in memory only (bubblewrap reads it to its end)."""
    fd = os.memfd_create("agon-sandbox", 0)
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def exit_code(status: int) -> int | None:
    """A wait status as ``subprocess`` writes it (exit code, or minus the signal), None for any other state."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return None


def signal_name(number: int) -> str:
    """``SIGSEGV``, ``SIGRTMIN+6``, or ``signal 99``: for every number, including the real-time signals that
    ``signal.Signals`` has no member for."""
    try:
        return signal.Signals(number).name
    except ValueError:
        pass
    low, high = getattr(signal, "SIGRTMIN", 34), getattr(signal, "SIGRTMAX", 64)
    if low <= number <= high:
        return f"SIGRTMIN+{number - low}" if number - low <= high - number else f"SIGRTMAX-{high - number}"
    return f"signal {number}"


class _Capped:
    """An output buffer that keeps at most ``cap`` bytes: its first ones, and with ``tail`` also its last ``tail``
    (where a traceback is) once the stream went past the cap."""

    def __init__(self, cap: int, tail: int = 0):
        self.cap, self.parts, self.size, self.truncated = cap, [], 0, False
        self.head = b""
        self.tail_cap, self.tail, self.dropped = min(tail, cap), b"", 0

    def add(self, chunk: bytes) -> bool:
        """Keep what fits (the rest is dropped, but for the tail); False once the stream went past the cap."""
        if not self.head:
            self.head = chunk[:64]
        room = self.cap - self.tail_cap - self.size
        if len(chunk) <= room:
            self.parts.append(chunk)
            self.size += len(chunk)
            return True
        if room > 0:
            self.parts.append(chunk[:room])
            self.size += room
            chunk = chunk[room:]
        if self.tail_cap:
            kept = self.tail + chunk
            self.dropped += max(len(kept) - self.tail_cap, 0)
            self.tail = kept[-self.tail_cap:]
        self.truncated = self.dropped > 0 or not self.tail_cap
        return not self.truncated

    def drain(self, fd: int, limit: int = 1 << 26) -> None:
        """Read what the pipe holds now without waiting (so that no dying writer blocks on a full pipe)."""
        try:
            os.set_blocking(fd, False)
            while limit > 0:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                limit -= len(chunk)
                self.add(chunk)
        except (BlockingIOError, OSError, ValueError):
            pass

    def text(self) -> str:
        body = b"".join(self.parts)
        if self.tail:
            body += (f"\n[... {self.dropped} bytes dropped ...]\n".encode() if self.dropped else b"") + self.tail
        return body.decode("utf-8", errors="replace")

    def is_utf8(self) -> bool:
        try:
            b"".join(self.parts).decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

