"""A local sandbox for model-written Python programs, shaped so that a remote service can replace it.

``Sandbox.run(RunRequest) -> RunResult`` mirrors SandboxFusion's ``/run_code`` (code, stdin, run timeout, memory
limit in, status / return code / stdout / stderr / time out), so a client for such a service is one more class with
the same ``run``. ``LocalSandbox`` runs each program in a subprocess with:

- a fresh temporary working directory (removed afterwards; one left by a killed trainer is removed by the next
  ``LocalSandbox``) holding ``main.py`` and any extra files;
- an allow-listed environment (``PATH``, ``LANG``, ``PYTHONIOENCODING``): no tokens, keys or ``HOME``;
- rlimits set inside the child before the program runs: CPU seconds, address space, file size, process count,
  open files, no core dumps;
- a wall-clock deadline, and output read incrementally and capped per stream (the program is killed when it
  writes past the cap, and the result is flagged ``truncated``).

Two isolation levels, reported by ``LocalSandbox.isolation``:

``namespace`` (root with ``unshare`` and ``setpriv``, the default where it works): the program runs as an
    unprivileged user (uid/gid 65534, no supplementary groups, no capabilities, ``no_new_privs``) in its own PID,
    network and IPC namespaces: ``unshare --pid --fork --kill-child --net --ipc setpriv ... python3``. The
    namespace's init is a small bootstrap that forks the program, reaps orphans and exits with the program's
    status; its host pid is recorded (through a pidfd, so a recycled pid is never signalled) and SIGKILLed on every
    exit path, which makes the kernel kill every process left in the namespace, ``setsid`` daemons included.
    ``--kill-child`` alone is not enough: its parent-death signal is cleared when ``setpriv`` changes the uid.
    RLIMIT_NPROC holds here because the user is not root. The interpreter is ``/usr/bin/python3``: a virtual
    environment under ``/root`` is unreadable to uid 65534.
``session`` (the fallback: not root, or no ``unshare``/``setpriv``, or the probe run failed): a plain subprocess
    in a new session with the same rlimits, killed with ``killpg``. A child that calls ``setsid`` escapes the
    kill, and as root the process-count limit is not enforced and the filesystem is not protected.

Grading never trusts the exit code alone: callers compare stdout for every test, so ``sys.exit(0)`` or
``os._exit(0)`` before the work is done cannot fake a pass (SandboxFusion's "antihack" concern).
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

log = logging.getLogger(__name__)

# RunResult.status values
STATUSES = ("ok", "timeout", "runtime_error", "memory", "output_limit", "sandbox_error")

ISOLATION_NAMESPACE = "namespace"
ISOLATION_SESSION = "session"

SYSTEM_PYTHON = "/usr/bin/python3"
NOBODY = 65534
ENV_ALLOWLIST = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
# exit code of the bootstrap when it cannot set the sandbox up (rlimits, fork)
SETUP_FAILED = 121
_SETUP_MARK = b"agon-sandbox-setup:"


@dataclass(frozen=True)
class RunRequest:
    """One program run. Field names follow SandboxFusion's run_code where one exists."""

    code: str
    stdin: str = ""
    # only "python" runs locally
    language: str = "python"
    # CPU seconds (RLIMIT_CPU, rounded up to whole seconds); the program is ended when it uses more
    time_limit_s: float = 4.0
    # wall-clock deadline; None means 2 * time_limit_s + 1 (room for a loaded machine and interpreter start-up)
    wall_time_s: float | None = None
    # address-space limit (RLIMIT_AS) of every process of the program
    memory_mb: int = 512
    # per stream; the program is killed when it writes more
    max_output_bytes: int = 1 << 20
    # largest file the program may write (RLIMIT_FSIZE)
    max_file_mb: int = 64
    # processes and threads the program may have at once (RLIMIT_NPROC; enforced only for a non-root user)
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
# the bootstrap: runs inside the sandbox under the target interpreter (stdlib only, no site imports needed)

_BOOTSTRAP = r"""
import os, resource, sys
def _setup():
    prog, as_init = sys.argv[1], sys.argv[2] == "1"
    cpu, mem, fsize, nproc, nofile, wall = (int(v) for v in sys.argv[3:9])
    try:
        for lim, soft, hard in (
            (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_CPU, cpu, cpu + 1),
            (resource.RLIMIT_AS, mem, mem),
            (resource.RLIMIT_FSIZE, fsize, fsize),
            (resource.RLIMIT_NPROC, nproc, nproc),
            (resource.RLIMIT_NOFILE, nofile, nofile),
        ):
            resource.setrlimit(lim, (soft, hard))
        pid = os.fork() if as_init else 0
    except BaseException as e:
        os.write(2, b"agon-sandbox-setup: " + repr(e).encode())
        os._exit(121)
    if pid:
        # the PID namespace's init: reap every orphan, exit with the program's status (128+N: killed by signal N).
        # A last-resort deadline of its own: should the parent fail to end the namespace, its exit ends it.
        import signal
        signal.signal(signal.SIGALRM, lambda *_: os._exit(137))
        signal.alarm(wall)
        os.closerange(0, 3)
        while True:
            try:
                p, status = os.wait()
            except ChildProcessError:
                os._exit(121)
            except InterruptedError:
                continue
            if p == pid:
                code = os.waitstatus_to_exitcode(status)
                os._exit(code if code >= 0 else 128 - code)
    return prog
_prog = _setup()
del _setup
sys.argv = [_prog]
with open(_prog, "rb") as _f:
    _code = compile(_f.read(), _prog, "exec")
exec(_code, {"__name__": "__main__", "__file__": _prog, "__builtins__": __builtins__})
"""


# ---------------------------------------------------------------------------------------------------------------
# isolation probe (once per configuration and process)

_PROBES: dict[tuple, tuple[str, str]] = {}
_PROBE_LOCK = threading.Lock()


def _traversable_by_others(path: str) -> bool:
    """Every directory from / down to ``path`` can be entered by a user that is neither owner nor group."""
    p = os.path.abspath(path)
    while True:
        try:
            if not os.stat(p).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        parent = os.path.dirname(p)
        if parent == p:
            return True
        p = parent


def _namespace_prefix(uid: int, gid: int, network: bool) -> list[str]:
    # parent-death signals chain the namespace to the calling thread: if the trainer dies (even by SIGKILL),
    # unshare gets SIGKILL, then the init does (its own signal is set by setpriv after the uid change), and the
    # kernel ends the rest of the namespace
    cmd = ["setpriv", "--pdeathsig", "KILL", "unshare", "--pid", "--fork", "--kill-child", "--ipc"]
    if not network:
        cmd.append("--net")
    cmd += [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--pdeathsig",
        "KILL",
    ]
    return cmd


WORKDIR_PREFIX = "agon-sbx-"


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
        owner = name[len(WORKDIR_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and int(owner) != os.getpid() and not os.path.exists(f"/proc/{owner}"):
            shutil.rmtree(os.path.join(tmp_root, name), ignore_errors=True)
            removed += 1
    return removed


def _process_count(uid: int) -> int:
    n = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                n += entry.stat().st_uid == uid
            except OSError:
                pass
    return n


# ---------------------------------------------------------------------------------------------------------------


class LocalSandbox:
    """Runs Python programs on this machine (see the module docstring for the guarantees of each isolation level).

    ``isolation``: "auto" (namespace when it works here, else session), "namespace" (raise if unavailable) or
    "session". ``python``: the interpreter (default /usr/bin/python3, else this interpreter, with a warning).
    ``network``: keep the host's network namespace (off by default: the program sees no network at all).
    Safe to call ``run`` from several threads at once (no ``preexec_fn``: limits are set by the bootstrap).
    """

    def __init__(
        self,
        isolation: str = "auto",
        python: str | None = None,
        uid: int = NOBODY,
        gid: int = NOBODY,
        network: bool = False,
        tmp_root: str | None = None,
    ):
        if isolation not in ("auto", ISOLATION_NAMESPACE, ISOLATION_SESSION):
            raise ValueError(f"isolation={isolation!r}; choose auto, namespace or session")
        self.uid, self.gid, self.network = uid, gid, network
        notes = []
        if python is None:
            if os.access(SYSTEM_PYTHON, os.X_OK):
                python = SYSTEM_PYTHON
            else:
                python = sys.executable
                notes.append(f"{SYSTEM_PYTHON} not found; using {python}")
        self.python = python
        self.tmp_root = tmp_root or tempfile.gettempdir()
        if tmp_root is None and not _traversable_by_others(self.tmp_root) and _traversable_by_others("/tmp"):
            self.tmp_root = "/tmp"  # e.g. TMPDIR under /root, which uid 65534 cannot enter
        self._has_setpriv = sys.platform.startswith("linux") and shutil.which("setpriv") is not None
        remove_stale_workdirs(self.tmp_root)
        level, why = ISOLATION_SESSION, "requested"
        if isolation != ISOLATION_SESSION:
            level, why = self._probe_namespace()
            if level != ISOLATION_NAMESPACE and isolation == ISOLATION_NAMESPACE:
                raise RuntimeError(f"namespace isolation is not available here: {why}")
        if level == ISOLATION_SESSION and why != "requested":
            notes.append(f"namespace isolation unavailable ({why})")
        self._isolation = level
        self.note = "; ".join(notes)
        if level == ISOLATION_SESSION and isolation == "auto":
            log.warning(
                "sandbox: falling back to session isolation (%s): a setsid child escapes the kill%s",
                self.note,
                ", and as root the process limit and the filesystem are not protected" if os.geteuid() == 0 else "",
            )
        elif notes:
            log.warning("sandbox: %s", self.note)

    @property
    def isolation(self) -> str:
        return self._isolation

    # --- probe -----------------------------------------------------------------------------------------------

    def _probe_namespace(self) -> tuple[str, str]:
        key = (self.python, self.uid, self.gid, self.network, self.tmp_root)
        with _PROBE_LOCK:
            if key not in _PROBES:
                _PROBES[key] = self._probe_once()
            return _PROBES[key]

    def _probe_once(self) -> tuple[str, str]:
        if not sys.platform.startswith("linux"):
            return ISOLATION_SESSION, "not Linux"
        if os.geteuid() != 0:
            return ISOLATION_SESSION, "not running as root"
        missing = [b for b in ("unshare", "setpriv") if shutil.which(b) is None]
        if missing:
            return ISOLATION_SESSION, f"{' and '.join(missing)} not found"
        if not _traversable_by_others(self.tmp_root):
            return ISOLATION_SESSION, f"uid {self.uid} cannot enter the temporary directory {self.tmp_root}"
        self._isolation = ISOLATION_NAMESPACE
        res = self.run(RunRequest(code="print('agon-probe-ok')", time_limit_s=5, wall_time_s=20))
        if res.status == "ok" and res.stdout.strip() == "agon-probe-ok":
            return ISOLATION_NAMESPACE, ""
        return ISOLATION_SESSION, f"probe run failed: {res.status} {res.detail} {res.stderr[-300:].strip()}"

    # --- run -------------------------------------------------------------------------------------------------

    def run(self, req: RunRequest) -> RunResult:
        t0 = time.monotonic()
        if req.language != "python":
            return RunResult("sandbox_error", None, "", "", False, 0.0, f"language {req.language!r} is not supported")
        workdir = None
        try:
            workdir = self._make_workdir(req)
            return self._execute(req, workdir, t0)
        except Exception as e:  # the sandbox's own failure, never the program's
            log.exception("sandbox: run failed")
            return RunResult("sandbox_error", None, "", "", False, time.monotonic() - t0, f"{type(e).__name__}: {e}")
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _make_workdir(self, req: RunRequest) -> str:
        workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-", dir=self.tmp_root)
        for name, content in {**req.files, "main.py": req.code}.items():
            if os.path.basename(name) != name or name in ("", ".", ".."):
                raise ValueError(f"file name {name!r} must be a plain name")
            with open(os.path.join(workdir, name), "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(content)
        if self._isolation == ISOLATION_NAMESPACE:
            for name in os.listdir(workdir):
                os.chown(os.path.join(workdir, name), self.uid, self.gid)
            os.chown(workdir, self.uid, self.gid)
        os.chmod(workdir, 0o700)
        return workdir

    def _command(self, req: RunRequest, workdir: str) -> list[str]:
        ns = self._isolation == ISOLATION_NAMESPACE
        nproc = req.max_processes
        if not ns and os.geteuid() != 0:
            # RLIMIT_NPROC counts every process of the real user, so leave room for the ones it already has
            nproc += _process_count(os.getuid())
        limits = [
            max(1, math.ceil(req.time_limit_s)),
            (req.memory_mb + 32) << 20,  # interpreter overhead on top of the program's own memory
            req.max_file_mb << 20,
            nproc + (1 if ns else 0),  # the namespace init is one of them
            req.max_open_files,
            math.ceil(req.wall_limit_s) + 5,  # the init's own deadline (namespace mode)
        ]
        boot = [self.python, "-I", "-c", _BOOTSTRAP, os.path.join(workdir, "main.py"), "1" if ns else "0"]
        boot += [str(v) for v in limits]
        if ns:
            return _namespace_prefix(self.uid, self.gid, self.network) + boot
        # session mode: the program still dies with the calling thread where setpriv exists
        return (["setpriv", "--pdeathsig", "KILL"] if self._has_setpriv else []) + boot

    def _execute(self, req: RunRequest, workdir: str, t0: float) -> RunResult:
        ns = self._isolation == ISOLATION_NAMESPACE
        proc = subprocess.Popen(
            self._command(req, workdir),
            cwd=workdir,
            env=dict(ENV_ALLOWLIST),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        out, err = _Capped(req.max_output_bytes), _Capped(req.max_output_bytes)

        def drain() -> None:
            out.drain(proc.stdout.fileno())
            err.drain(proc.stderr.fileno())

        killer = _Killer(proc, ns, drain)
        sel = selectors.DefaultSelector()
        timed_out = over_cap = False
        exit_fd = None
        try:
            stdin_data = req.stdin.encode("utf-8", "surrogatepass")
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            if stdin_data:
                os.set_blocking(proc.stdin.fileno(), False)
                sel.register(proc.stdin, selectors.EVENT_WRITE, None)
            else:
                proc.stdin.close()
            exit_fd = os.pidfd_open(proc.pid)
            sel.register(exit_fd, selectors.EVENT_READ, "exit")
            deadline = t0 + req.wall_limit_s
            exited_at = None
            written = 0
            while True:
                now = time.monotonic()
                if ns and killer.init_fd is None:
                    killer.find_init()
                open_streams = sum(1 for k in sel.get_map().values() if isinstance(k.data, _Capped))
                if exited_at is not None and (open_streams == 0 or now - exited_at > 0.5):
                    break  # finished; a leftover writer (session mode only) gets half a second
                if now >= deadline:
                    timed_out = True
                    break
                wait = min(deadline - now, 0.05 if ns and killer.init_fd is None else 1.0)
                for key, _ in sel.select(wait):
                    if key.data == "exit":
                        sel.unregister(exit_fd)
                        exited_at = time.monotonic()
                    elif key.data is None:  # stdin
                        try:
                            written += os.write(proc.stdin.fileno(), stdin_data[written : written + 65536])
                        except (BrokenPipeError, BlockingIOError) as e:
                            if isinstance(e, BrokenPipeError):
                                written = len(stdin_data)
                        if written >= len(stdin_data):
                            sel.unregister(proc.stdin)
                            proc.stdin.close()
                    else:
                        chunk = os.read(key.fileobj.fileno(), 65536)
                        if not chunk:
                            sel.unregister(key.fileobj)
                        elif not key.data.add(chunk):
                            over_cap = True
                if over_cap:
                    break
        finally:
            killer.kill_all()
            sel.close()
            if exit_fd is not None:
                os.close(exit_fd)
            drain()
            proc.stdout.close()
            proc.stderr.close()
            if proc.stdin and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        wall = time.monotonic() - t0
        rc = killer.returncode
        stdout, stderr = out.text(), err.text()
        truncated = out.truncated or err.truncated
        if over_cap or timed_out:
            # unshare's complaint about re-raising the SIGKILL its child got is not the program's output
            stderr = "".join(ln for ln in stderr.splitlines(True) if not ln.startswith("unshare: sigprocmask"))
        if over_cap:
            return RunResult(
                "output_limit", None, stdout, stderr, True, wall, f"wrote more than {req.max_output_bytes} bytes"
            )
        if timed_out:
            return RunResult("timeout", None, stdout, stderr, truncated, wall, f"wall clock > {req.wall_limit_s:g}s")
        if (rc == SETUP_FAILED and err.head.startswith(_SETUP_MARK)) or (
            rc not in (0, None) and err.head.startswith((b"unshare: ", b"setpriv: "))
        ):
            # the sandbox could not start the program (e.g. no process slot left): not the program's fault
            return RunResult("sandbox_error", rc, stdout, stderr, truncated, wall, "sandbox setup failed")
        if ns and rc is not None and rc > 128:
            rc = -(rc - 128)  # the init's convention for "killed by signal N"
        if rc == 0:
            return RunResult("ok", 0, stdout, stderr, truncated, wall)
        if rc is not None and rc < 0 and -rc in (signal.SIGXCPU, signal.SIGKILL):
            return RunResult("timeout", rc, stdout, stderr, truncated, wall, f"CPU time > {req.time_limit_s:g}s")
        if "MemoryError" in stderr[-2000:] or "Cannot allocate memory" in stderr[-2000:]:
            return RunResult("memory", rc, stdout, stderr, truncated, wall, f"memory > {req.memory_mb} MB")
        return RunResult("runtime_error", rc, stdout, stderr, truncated, wall, f"exit code {rc}")


class _Capped:
    """An output buffer that keeps at most ``cap`` bytes."""

    def __init__(self, cap: int):
        self.cap, self.parts, self.size, self.truncated = cap, [], 0, False
        self.head = b""

    def add(self, chunk: bytes) -> bool:
        """Keep what fits (the rest is dropped); False once the stream went past the cap."""
        if not self.head:
            self.head = chunk[:64]
        room = self.cap - self.size
        if len(chunk) > room:
            if room > 0:
                self.parts.append(chunk[:room])
                self.size = self.cap
            self.truncated = True
            return False
        self.parts.append(chunk)
        self.size += len(chunk)
        return True

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
        return b"".join(self.parts).decode("utf-8", errors="replace")


class _Killer:
    """Ends every process of one run: the namespace's init (by pidfd) or the process group, before reaping."""

    def __init__(self, proc: subprocess.Popen, namespace: bool, drain):
        self.proc, self.namespace, self.drain = proc, namespace, drain
        self.init_fd: int | None = None
        self.returncode: int | None = None

    def find_init(self) -> None:
        """Open a pidfd on unshare's forked child, the namespace's init (pid 1 inside)."""
        pid = self.proc.pid
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                children = f.read().split()
        except OSError:
            return
        if not children:
            return
        try:
            fd = os.pidfd_open(int(children[0]))
        except OSError:
            return
        # guard against a recycled pid: the process behind the pidfd must still be unshare's child
        try:
            with open(f"/proc/{children[0]}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            ppid = -1
        if ppid != pid:
            os.close(fd)
            return
        self.init_fd = fd

    def kill_all(self) -> None:
        """SIGKILL whatever is left, then reap the direct child (its exit code is kept in ``returncode``)."""
        proc = self.proc
        if self.namespace:
            if self.init_fd is None:
                self.find_init()
            if self.init_fd is not None:
                try:
                    signal.pidfd_send_signal(self.init_fd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                # the dying init waits in the kernel until every process of the namespace is gone; unshare then
                # reaps it and exits. Killing unshare first would leave the init a zombie for the host's pid 1.
                # Keep the pipes drained meanwhile: unshare may write to a stderr pipe the program filled.
                give_up = time.monotonic() + 10
                while proc.poll() is None and time.monotonic() < give_up:
                    self.drain()
                    time.sleep(0.005)
                if proc.returncode is None:
                    log.error("sandbox: namespace of pid %d did not end within 10 s of SIGKILL", proc.pid)
            # unshare itself: needed only when its child was never found (then --kill-child's signal applies)
            if proc.returncode is None:
                proc.kill()
        else:
            # the leader is not reaped yet, so its pid (the group id) cannot have been recycled
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.returncode = proc.wait()
        if self.init_fd is not None:
            # unshare waited for its child, so the init is gone, and the kernel ended the rest of the namespace
            os.close(self.init_fd)
            self.init_fd = None
