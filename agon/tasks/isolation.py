"""The kernel's isolation, as the sandbox uses it: a seccomp filter, a cgroup per run, and a uid per concurrent run.

Pure glue over what Linux provides; ``agon.tasks.sandbox`` puts these together with bubblewrap's namespaces.

- ``seccomp_filter``: a classic BPF program (``struct sock_filter`` records) for ``bwrap --seccomp``, written out
  here because it is 60 instructions and libseccomp's Python bindings are not on PyPI.
- ``Cgroups`` / ``RunCgroup``: one cgroup per run under ``agon-sandbox/``, cgroup v1 (``memory``, ``pids``,
  ``cpu``, ``cpuacct``) or v2, with the run's memory and process limits, its CPU time, OOM kills, refused forks,
  and the kill of all of its processes.
- ``UidSlots``: one uid per concurrent run, claimed with a file lock, so that trainer processes on one machine never
  share one.

Left out on purpose: AppArmor/SELinux profiles (host policy, not ours), and seccomp numbers of architectures other
than x86_64 and aarch64 (the sandbox refuses to run there).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import signal
import struct
import threading
import time
from pathlib import Path
from typing import Iterator

# the uids concurrent runs take, one each (nobody's 65534 is not among them: other software runs as nobody)
UID_BASE, UID_SLOTS = 61000, 64


class SandboxUnavailable(RuntimeError):
    """Isolation cannot be set up here; the message says what is missing and how to fix it."""


# ---------------------------------------------------------------------------------------------------------------
# seccomp: a classic BPF program for bwrap --seccomp

# syscalls refused with EPERM, by architecture (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h)
DENIED = {
    "x86_64": {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
               "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "keyctl": 250, "add_key": 248,
               "request_key": 249, "bpf": 321, "io_uring_setup": 425, "io_uring_enter": 426,
               "io_uring_register": 427, "perf_event_open": 298, "userfaultfd": 323, "kexec_load": 246,
               "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
               "open_by_handle_at": 304, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
               "fsmount": 432, "fspick": 433, "mount_setattr": 442, "swapon": 167, "swapoff": 168, "reboot": 169,
               "acct": 163},
    "aarch64": {"unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
                "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "keyctl": 219, "add_key": 217,
                "request_key": 218, "bpf": 280, "io_uring_setup": 425, "io_uring_enter": 426,
                "io_uring_register": 427, "perf_event_open": 241, "userfaultfd": 282, "kexec_load": 104,
                "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
                "open_by_handle_at": 265, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
                "fsmount": 432, "fspick": 433, "mount_setattr": 442, "swapon": 224, "swapoff": 225, "reboot": 142,
                "acct": 89},
}
_ARCH = {"x86_64": (0xC000003E, 56, 435), "aarch64": (0xC00000B7, 220, 435)}  # audit arch, clone, clone3
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NAMESPACES = 0x7E020000
_EPERM, _ENOSYS = 1, 38
_RET_ALLOW, _RET_ERRNO, _RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def seccomp_filter(machine: str | None = None) -> bytes:
    """The sandbox's seccomp program for ``machine`` (``platform.machine()``), as ``struct sock_filter`` records."""
    machine = machine or platform.machine()
    if machine not in _ARCH:
        raise SandboxUnavailable(f"no seccomp filter for the {machine} architecture (x86_64 and aarch64 only)")
    audit, clone, clone3 = _ARCH[machine]
    prog = [(_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, audit), (_RET, 0, 0, _RET_KILL), (_LD_ABS, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers (bit 30 set) would bypass every check below
        prog += [(_JGE, 0, 1, 0x40000000), (_RET, 0, 0, _RET_ERRNO | _EPERM)]
    for nr in sorted(DENIED[machine].values()):
        prog += [(_JEQ, 0, 1, nr), (_RET, 0, 0, _RET_ERRNO | _EPERM)]
    prog += [(_JEQ, 0, 1, clone3), (_RET, 0, 0, _RET_ERRNO | _ENOSYS)]
    # clone: its flags are the first argument (the low 32 bits hold every CLONE_NEW* flag)
    prog += [(_JEQ, 0, 3, clone), (_LD_ABS, 0, 0, 16), (_JSET, 0, 1, CLONE_NAMESPACES),
             (_RET, 0, 0, _RET_ERRNO | _EPERM), (_RET, 0, 0, _RET_ALLOW)]
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


# ---------------------------------------------------------------------------------------------------------------
# cgroups: one per run


class Cgroups:
    """Where this host lets the sandbox make a cgroup per run: v2 (one tree) or v1 (one tree per controller)."""

    ROOT = Path("/sys/fs/cgroup")
    NAME = "agon-sandbox"

    def __init__(self, version: int, parents: dict[str, Path]):
        self.version, self.parents = version, parents  # controller (or "unified") -> our parent directory

    @classmethod
    def detect(cls) -> tuple["Cgroups | None", str]:
        """(the host's cgroups, "") or (None, why not)."""
        if os.geteuid() != 0:
            return None, "not root"
        try:
            if (cls.ROOT / "cgroup.controllers").exists():  # v2
                parent = cls.ROOT / cls.NAME
                parent.mkdir(exist_ok=True)
                available = set((cls.ROOT / "cgroup.subtree_control").read_text().split())
                missing = {"memory", "pids", "cpu"} - available
                for controller in sorted(missing):
                    (cls.ROOT / "cgroup.subtree_control").write_text(f"+{controller}")
                (parent / "cgroup.subtree_control").write_text("+memory +pids +cpu")
                return cls(2, {"unified": parent}), ""
            parents = {}
            for controller in ("memory", "pids", "cpuacct", "cpu"):
                base = cls.ROOT / controller
                if not base.is_dir():
                    return None, f"cgroup v1 controller {controller} is not mounted"
                (base / cls.NAME).mkdir(exist_ok=True)
                parents[controller] = base / cls.NAME
            return cls(1, parents), ""
        except OSError as exc:
            return None, f"cannot create cgroups under {cls.ROOT} ({exc})"

    def create(self, name: str, memory_bytes: int, pids: int) -> "RunCgroup":
        dirs = {c: p / name for c, p in self.parents.items()}
        for d in dirs.values():
            d.mkdir()
        group = RunCgroup(self.version, dirs)
        try:
            if self.version == 2:
                d = dirs["unified"]
                (d / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (d / "memory.swap.max").write_text("0")
                (d / "pids.max").write_text(str(pids))
            else:
                (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):  # swap accounting is off on many hosts
                    (dirs["memory"] / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                (dirs["pids"] / "pids.max").write_text(str(pids))
        except OSError:
            group.remove()
            raise
        return group


class RunCgroup:
    """One run's cgroup: what its processes join, what they used, and the kill of all of them."""

    def __init__(self, version: int, dirs: dict[str, Path]):
        self.version, self.dirs = version, dirs

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def _read(self, controller: str, name: str) -> str:
        try:
            return (self.dirs["unified" if self.version == 2 else controller] / name).read_text()
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        if self.version == 2:
            for line in self._read("cpu", "cpu.stat").splitlines():
                if line.startswith("usage_usec"):
                    return int(line.split()[1]) / 1e6
            return 0.0
        return int(self._read("cpuacct", "cpuacct.usage") or 0) / 1e9

    def oom_kills(self) -> int:
        text = self._read("memory", "memory.events" if self.version == 2 else "memory.oom_control")
        for line in text.splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def pids_limit_hits(self) -> int:
        for line in self._read("pids", "pids.events").splitlines():
            if line.startswith("max "):
                return int(line.split()[1])
        return 0

    def pids(self) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError):
                out |= {int(x) for x in Path(f).read_text().split()}
        return out

    def kill_all(self, timeout_s: float = 10.0) -> bool:
        """SIGKILL every process in the cgroup until it is empty; True when it is."""
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            pids = self.pids()
            if not pids:
                return True
            if self.version == 2:
                with contextlib.suppress(OSError):
                    (self.dirs["unified"] / "cgroup.kill").write_text("1")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        return not self.pids()

    def remove(self) -> None:
        for d in self.dirs.values():
            with contextlib.suppress(OSError):
                d.rmdir()


# ---------------------------------------------------------------------------------------------------------------
# uid slots: one uid per concurrent run, across every process on this machine


class UidSlots:
    """Claims a free uid in [base, base + size) with a file lock, released on exit (or when the holder dies)."""

    def __init__(self, lock_dir: Path, base: int = UID_BASE, size: int = UID_SLOTS):
        self.lock_dir, self.base, self.size = lock_dir, base, size
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._next = 0
        self._mutex = threading.Lock()

    @contextlib.contextmanager
    def claim(self, timeout_s: float = 60.0) -> Iterator[int]:
        give_up = time.monotonic() + timeout_s
        while True:
            with self._mutex:
                start = self._next
                self._next = (self._next + 1) % self.size
            for k in range(self.size):
                slot = (start + k) % self.size
                fd = os.open(self.lock_dir / f"uid-{self.base + slot}", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                try:
                    yield self.base + slot
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
                return
            if time.monotonic() > give_up:
                raise SandboxUnavailable(f"all {self.size} sandbox uids are in use for {timeout_s:.0f} s")
            time.sleep(0.01)
