"""The kernel's isolation, as the sandbox uses it: a seccomp filter, a cgroup per run, and a uid per concurrent run.

Pure glue over what Linux provides; ``agon.tasks.sandbox`` puts these together with bubblewrap's namespaces.

- ``seccomp_filter``: a classic BPF program (``struct sock_filter`` records) for ``bwrap --seccomp``, written out
  here because it is a table and a loop, and libseccomp's Python bindings are not on PyPI. An allow-list: what is
  not named answers ENOSYS; sockets are UNIX sockets only; huge pages, locks, AIO, inotify/fanotify are refused.
- ``Cgroups`` / ``RunCgroup``: one cgroup per run under ``agon-sandbox/``, cgroup v1 (``memory``, ``pids``,
  ``cpu``, ``cpuacct``) or v2, with the run's memory and process limits, its CPU time, OOM kills, refused forks,
  and the kill of all of its processes.
- ``UidSlots``: one uid per concurrent run, claimed with a file lock at one fixed path (``UID_LOCK_DIR``), so that
  trainer processes on one machine never share one, whatever their temporary directories.

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
import time
from pathlib import Path
from typing import Iterator

# the uids concurrent runs take, one each (nobody's 65534 is not among them: other software runs as nobody)
UID_BASE, UID_SLOTS = 61000, 64


class SandboxUnavailable(RuntimeError):
    """Isolation cannot be set up here; the message says what is missing and how to fix it."""


# ---------------------------------------------------------------------------------------------------------------
# seccomp: a classic BPF program for bwrap --seccomp

# An allow-list: a syscall that is not named here answers ENOSYS ("this kernel has no such call"), which is also what
# makes the C library fall back from calls newer than the list (clone3). Numbers by architecture: (x86_64 from
# asm/unistd_64.h, aarch64 from asm-generic/unistd.h); None where the architecture has no such call.
# Left out on purpose, beside what DENIED names: sync (it flushes every disk of the host), mincore and cachestat (the
# page cache of shared files tells when a neighbour reads them), sysinfo (the host's count of processes, exact, and
# its shared memory: a channel between runs), name_to_handle_at, kcmp, personality, modify_ldt, pkey_*, POSIX
# message queues, and every call that needs a capability the run never has.
ALLOWED = {
    "read": (0, 63), "write": (1, 64), "open": (2, None), "close": (3, 57), "stat": (4, None), "fstat": (5, 80),
    "lstat": (6, None), "poll": (7, None), "lseek": (8, 62), "mprotect": (10, 226), "munmap": (11, 215),
    "brk": (12, 214), "rt_sigaction": (13, 134), "rt_sigprocmask": (14, 135), "rt_sigreturn": (15, 139),
    "ioctl": (16, 29), "pread64": (17, 67), "pwrite64": (18, 68), "readv": (19, 65), "writev": (20, 66),
    "access": (21, None), "pipe": (22, None), "select": (23, None), "sched_yield": (24, 124), "mremap": (25, 216),
    "madvise": (28, 233), "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197),
    "dup": (32, 23), "dup2": (33, None), "pause": (34, None), "nanosleep": (35, 101), "getitimer": (36, 102),
    "alarm": (37, None), "setitimer": (38, 103), "getpid": (39, 172), "sendfile": (40, 71), "connect": (42, 203),
    "accept": (43, 202), "sendto": (44, 206), "recvfrom": (45, 207), "sendmsg": (46, 211), "recvmsg": (47, 212),
    "shutdown": (48, 210), "bind": (49, 200), "listen": (50, 201), "getsockname": (51, 204),
    "getpeername": (52, 205), "getsockopt": (55, 209), "fork": (57, None),
    "vfork": (58, None), "execve": (59, 221), "exit": (60, 93), "wait4": (61, 260), "kill": (62, 129),
    "uname": (63, 160), "semget": (64, 190), "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192),
    "msgget": (68, 186), "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187), 
    "truncate": (76, 45), "ftruncate": (77, 46), "getdents": (78, None), "getcwd": (79, 17),
    "chdir": (80, 49), "fchdir": (81, 50), "rename": (82, None), "mkdir": (83, None), "rmdir": (84, None),
    "creat": (85, None), "link": (86, None), "unlink": (87, None), "symlink": (88, None), "readlink": (89, None),
    "chmod": (90, None), "fchmod": (91, 52), "chown": (92, None), "fchown": (93, 55), "lchown": (94, None),
    "umask": (95, 166), "gettimeofday": (96, 169), "getrlimit": (97, 163), "getrusage": (98, 165),
    "times": (100, 153), "getuid": (102, 174), "getgid": (104, 176), "setuid": (105, 146),
    "setgid": (106, 144), "geteuid": (107, 175), "getegid": (108, 177), "setpgid": (109, 154),
    "getppid": (110, 173), "getpgrp": (111, None), "setsid": (112, 157), "setreuid": (113, 145),
    "setregid": (114, 143), "getgroups": (115, 158), "setgroups": (116, 159), "setresuid": (117, 147),
    "getresuid": (118, 148), "setresgid": (119, 149), "getresgid": (120, 150), "getpgid": (121, 155),
    "setfsuid": (122, 151), "setfsgid": (123, 152), "getsid": (124, 156), "capget": (125, 90), "capset": (126, 91),
    "rt_sigpending": (127, 136), "rt_sigtimedwait": (128, 137), "rt_sigqueueinfo": (129, 138),
    "rt_sigsuspend": (130, 133), "sigaltstack": (131, 132), "utime": (132, None), "mknod": (133, None),
    "statfs": (137, 43), "fstatfs": (138, 44), "getpriority": (140, 141), "setpriority": (141, 140),
    "sched_setparam": (142, 118), "sched_getparam": (143, 121), "sched_setscheduler": (144, 119),
    "sched_getscheduler": (145, 120), "sched_get_priority_max": (146, 125), "sched_get_priority_min": (147, 126),
    "sched_rr_get_interval": (148, 127), "mlock": (149, 228), "munlock": (150, 229), "mlockall": (151, 230),
    "munlockall": (152, 231), "prctl": (157, 167), "arch_prctl": (158, None), "setrlimit": (160, 164),
    "gettid": (186, 178), "setxattr": (188, 5), "lsetxattr": (189, 6),
    "fsetxattr": (190, 7), "getxattr": (191, 8), "lgetxattr": (192, 9), "fgetxattr": (193, 10),
    "listxattr": (194, 11), "llistxattr": (195, 12), "flistxattr": (196, 13), "removexattr": (197, 14),
    "lremovexattr": (198, 15), "fremovexattr": (199, 16), "tkill": (200, 130), "time": (201, None),
    "futex": (202, 98), "sched_setaffinity": (203, 122), "sched_getaffinity": (204, 123),
    "set_thread_area": (205, None), "get_thread_area": (211, None), "epoll_create": (213, None),
    "epoll_wait": (232, None), "epoll_ctl": (233, 21), "getdents64": (217, 61), "set_tid_address": (218, 96),
    "restart_syscall": (219, 128), "timer_create": (222, 107),
    "timer_settime": (223, 110), "timer_gettime": (224, 108), "timer_getoverrun": (225, 109),
    "timer_delete": (226, 111), "clock_gettime": (228, 113), "clock_getres": (229, 114),
    "clock_nanosleep": (230, 115), "exit_group": (231, 94), "tgkill": (234, 131), "utimes": (235, None),
    "mbind": (237, 235), "set_mempolicy": (238, 237), "get_mempolicy": (239, 236), "waitid": (247, 95),
    "ioprio_set": (251, 30), "ioprio_get": (252, 31), "openat": (257, 56), "mkdirat": (258, 34),
    "mknodat": (259, 33), "fchownat": (260, 54), "futimesat": (261, None), "newfstatat": (262, 79),
    "unlinkat": (263, 35), "renameat": (264, 38), "linkat": (265, 37), "symlinkat": (266, 36),
    "readlinkat": (267, 78), "fchmodat": (268, 53), "faccessat": (269, 48), "pselect6": (270, 72),
    "ppoll": (271, 73), "set_robust_list": (273, 99), "get_robust_list": (274, 100), "splice": (275, 76),
    "tee": (276, 77), "vmsplice": (278, 75), "utimensat": (280, 88),
    "epoll_pwait": (281, 22), "signalfd": (282, None), "timerfd_create": (283, 85), "eventfd": (284, None),
    "fallocate": (285, 47), "timerfd_settime": (286, 86), "timerfd_gettime": (287, 87), "accept4": (288, 242),
    "signalfd4": (289, 74), "eventfd2": (290, 19), "epoll_create1": (291, 20), "dup3": (292, 24),
    "pipe2": (293, 59), "preadv": (295, 69), "pwritev": (296, 70), "rt_tgsigqueueinfo": (297, 240),
    "recvmmsg": (299, 243), "prlimit64": (302, 261), "sendmmsg": (307, 269),
    "getcpu": (309, 168), "sched_setattr": (314, 274), "sched_getattr": (315, 275), "renameat2": (316, 276),
    "getrandom": (318, 278), "execveat": (322, 281), "membarrier": (324, 283),
    "mlock2": (325, 284), "copy_file_range": (326, 285),
    "statx": (332, 291), "rseq": (334, 293), "pidfd_send_signal": (424, 424),
    "close_range": (436, 436), "openat2": (437, 437), "faccessat2": (439, 439), "epoll_pwait2": (441, 441),
}
# answered with success and not done. Flushes reach the host's file systems and disk cache from any descriptor (a
# read-only one included: syncfs on it flushed the host's root file system, fsync its disk cache), msync(MS_SYNC) is
# fsync for a shared mapping, and readahead and fadvise (WILLNEED, DONTNEED, NOREUSE) mark or drop pages in the
# page cache of a file. All are hints or no-ops on the run's own tmpfs, the only files it can write.
NO_OPS = {"fsync": (74, 82), "fdatasync": (75, 83), "syncfs": (306, 267), "sync_file_range": (277, 84),
          "msync": (26, 227), "readahead": (187, 213), "fadvise64": (221, 223)}
# preadv2 and pwritev2 without RWF_NOWAIT, which answers from cached pages only (mincore by another name);
# refused with EOPNOTSUPP, as from a file system that has no such mode, so that a caller falls back
RW2 = {"preadv2": (327, 286), "pwritev2": (328, 287)}
RWF_NOWAIT, EOPNOTSUPP = 0x8, 95
# allowed when one argument passes a check: (name, numbers, argument index, check); see _argument_rule
SOCKET_CALLS = {"socket": (41, 198), "socketpair": (53, 199)}
AF_UNIX, EAFNOSUPPORT = 1, 97
# the low 32 bits of the flags: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET, and
# CLONE_PIDFD: a pidfd's inode number is pidfs's, one sequence for every process the host starts (a neighbour's
# forks move it, so a copier read a solver's answer off it)
CLONE = (56, 220)
CLONE_REFUSED = 0x7E020000 | 0x1000
# setsockopt's options that attach a BPF program to a socket (SO_ATTACH_FILTER, SO_ATTACH_BPF,
# SO_ATTACH_REUSEPORT_CBPF and _EBPF at SOL_SOCKET): each is compiled into the host's one pool of BPF JIT memory,
# which no cgroup charges and from which the sandbox's own seccomp filter comes
SETSOCKOPT = (54, 208)
SOL_SOCKET, SOCKET_FILTER_OPTIONS = 1, (26, 50, 51, 52)
# huge pages come from a host-wide pool that no cgroup of the run charges
HUGETLB_FLAGS = {"mmap": ((9, 222), 3, 0x40000), "shmget": ((29, 194), 2, 0x800), "memfd_create": ((319, 279), 1, 0x4)}
# fcntl's lock, lease and directory-notify commands: F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK,
# F_OFD_SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY. Locks on the shared read-only files (/usr) are a channel between
# concurrent runs, and a run has no one else to coordinate with.
FCNTL = (72, 25)
FCNTL_DENIED = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)
# keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL) only: the monitor gives the run a new, empty session keyring with it
KEYCTL, KEYCTL_JOIN_SESSION_KEYRING = (250, 219), 1
CLONE3 = (435, 435)
# refused with EPERM, so that a program (and a reader of its stderr) sees a refusal rather than a missing call:
# namespaces and mounts, other processes' memory, the kernel keyring, eBPF, io_uring and the legacy AIO ring (a
# host-wide pool of events), inotify and fanotify (they tell when a neighbour opens a shared file), flock (a channel
# through the shared files), kernel modules, kexec, swap, reboot and accounting; seccomp() (a filter stacked per
# call, in BPF JIT memory no cgroup charges: prctl(PR_SET_SECCOMP) is refused by the monitor's own filter), and
# pidfd_open and pidfd_getfd (pidfs's global sequence of inode numbers, see CLONE)
DENIED = {
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "chroot": (161, 51), "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "add_key": (248, 217), "request_key": (249, 218), "bpf": (321, 280), "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "perf_event_open": (298, 241),
    "userfaultfd": (323, 282), "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "open_by_handle_at": (304, 265),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442), "swapon": (167, 224),
    "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89), "io_setup": (206, 0), "io_destroy": (207, 1),
    "io_getevents": (208, 4), "io_submit": (209, 2), "io_cancel": (210, 3), "io_pgetevents": (333, 292),
    "inotify_init": (253, None), "inotify_init1": (294, 26), "inotify_add_watch": (254, 27),
    "inotify_rm_watch": (255, 28), "fanotify_init": (300, 262), "fanotify_mark": (301, 263), "flock": (73, 32),
    "seccomp": (317, 277), "pidfd_open": (434, 434), "pidfd_getfd": (438, 438),
}
MACHINES = ("x86_64", "aarch64")
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_EPERM, _ENOSYS = 1, 38
_RET_ALLOW, _RET_ERRNO, _RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _arg(i: int, high: bool = False) -> int:
    """Offset of argument ``i``'s low (or high) 32 bits in ``struct seccomp_data`` (little-endian)."""
    return 16 + 8 * i + (4 if high else 0)


def seccomp_filter(machine: str | None = None) -> bytes:
    """The sandbox's seccomp program for ``machine`` (``platform.machine()``), as ``struct sock_filter`` records.

    Each syscall is its own test-and-return, so that no jump is longer than classic BPF's 255 instructions; the
    kernel's seccomp cache turns the unconditional ``ALLOWED`` entries into a bitmap lookup.
    """
    machine = machine or platform.machine()
    if machine not in MACHINES:
        raise SandboxUnavailable(f"no seccomp filter for the {machine} architecture (x86_64 and aarch64 only)")
    k = MACHINES.index(machine)
    eperm, allow = (_RET, 0, 0, _RET_ERRNO | _EPERM), (_RET, 0, 0, _RET_ALLOW)
    prog = [(_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, _AUDIT_ARCH[machine]), (_RET, 0, 0, _RET_KILL), (_LD_ABS, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers (bit 30 set) would bypass every check below
        prog += [(_JGE, 0, 1, 0x40000000), eperm]

    def block(nr: int, body: list[tuple]) -> None:
        """``if syscall == nr: body`` (body ends in a return on every path)."""
        prog.extend([(_JEQ, 0, len(body), nr), *body])

    for numbers in SOCKET_CALLS.values():  # UNIX sockets only: no loopback TCP/UDP, no vsock, no netlink
        block(numbers[k], [(_LD_ABS, 0, 0, _arg(0)), (_JEQ, 0, 1, AF_UNIX), allow,
                           (_RET, 0, 0, _RET_ERRNO | EAFNOSUPPORT)])
    block(CLONE[k], [(_LD_ABS, 0, 0, _arg(0)), (_JSET, 0, 1, CLONE_REFUSED), eperm, allow])
    skip = 2 * len(SOCKET_FILTER_OPTIONS) + 1  # another level: past the options' checks, to allow
    setsockopt_body: list[tuple] = [(_LD_ABS, 0, 0, _arg(1)), (_JEQ, 0, skip, SOL_SOCKET), (_LD_ABS, 0, 0, _arg(2))]
    for option in SOCKET_FILTER_OPTIONS:
        setsockopt_body += [(_JEQ, 0, 1, option), eperm]
    block(SETSOCKOPT[k], setsockopt_body + [allow])
    for numbers, index, flag in HUGETLB_FLAGS.values():
        block(numbers[k], [(_LD_ABS, 0, 0, _arg(index)), (_JSET, 0, 1, flag), eperm, allow])
    fcntl_body: list[tuple] = [(_LD_ABS, 0, 0, _arg(1))]
    for cmd in FCNTL_DENIED:
        fcntl_body += [(_JEQ, 0, 1, cmd), eperm]
    block(FCNTL[k], fcntl_body + [allow])
    block(KEYCTL[k], [(_LD_ABS, 0, 0, _arg(0)), (_JEQ, 0, 5, KEYCTL_JOIN_SESSION_KEYRING),
                      (_LD_ABS, 0, 0, _arg(1)), (_JEQ, 0, 3, 0), (_LD_ABS, 0, 0, _arg(1, high=True)),
                      (_JEQ, 0, 1, 0), allow, eperm])
    block(CLONE3[k], [(_RET, 0, 0, _RET_ERRNO | _ENOSYS)])  # ENOSYS: the C library falls back to clone
    for numbers in RW2.values():  # flags: argument 5 (fd, iov, iovcnt, pos_l, pos_h, flags)
        block(numbers[k], [(_LD_ABS, 0, 0, _arg(5)), (_JSET, 0, 1, RWF_NOWAIT), (_RET, 0, 0, _RET_ERRNO | EOPNOTSUPP),
                           allow])
    for numbers in NO_OPS.values():
        block(numbers[k], [(_RET, 0, 0, _RET_ERRNO | 0)])
    for numbers in DENIED.values():
        if numbers[k] is not None:
            block(numbers[k], [eperm])
    for numbers in ALLOWED.values():
        if numbers[k] is not None:
            block(numbers[k], [allow])
    prog.append((_RET, 0, 0, _RET_ERRNO | _ENOSYS))
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


UID_LOCK_DIR = Path("/run/agon-sandbox/uid-locks")


def run_cgroup_owner(name: str) -> int | None:
    """The pid of the process whose sandbox made the run cgroup ``name`` (``run-<pid>-<n>``), None for any other
    name: what tells one trainer's runs from another's on a shared host, even after the trainer died."""
    parts = name.split("-")
    ok = len(parts) == 3 and parts[0] == "run" and parts[1].isdigit() and parts[2].isdigit()
    return int(parts[1]) if ok else None


def run_cgroup_owner_of(pid: int) -> int | None:
    """The pid of the trainer whose run cgroup process ``pid`` is in, None when it is in none."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # "4:memory:/agon-sandbox/run-123-7" (v1, one line per hierarchy) or "0::/..." (v2)
        parent, _, name = line.split(":", 2)[-1].rpartition("/")
        if parent.rpartition("/")[2] == Cgroups.NAME and (owner := run_cgroup_owner(name)) is not None:
            return owner
    return None


def foreign_uid_users(uids: range, processes: bool = True) -> list[str]:
    """Who else on this host uses a uid of ``uids``: accounts in the user database, and processes that run as one
    outside every sandbox run cgroup. Either would share the run's per-user limits (``RLIMIT_NPROC`` counts every
    process of a uid) and its files."""
    import pwd

    found = []
    for uid in uids:
        with contextlib.suppress(KeyError):
            found.append(f"uid {uid} is the account {pwd.getpwuid(uid).pw_name!r}")
    for entry in os.listdir("/proc") if processes else ():
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = {k: v.split() for k, _, v in (ln.partition(":") for ln in status.splitlines())}
        real = int(fields.get("Uid", ["-1"])[0])
        zombie = fields.get("State", ["?"])[0] in ("Z", "X")  # an exited run's process is in no cgroup any more
        if real in uids and not zombie and run_cgroup_owner_of(int(entry)) is None:
            name = " ".join(fields.get("Name", ["?"]))
            found.append(f"pid {entry} ({name}) runs as uid {real} outside any sandbox run")
    return found


class UidSlots:
    """Claims a free uid in [base, base + size) with a file lock, released on exit (or when the holder dies).

    The locks are named by uid in ``lock_dir``, the same directory for every trainer on the host (``UID_LOCK_DIR``;
    never under ``TMPDIR``, which two trainers may set apart). Pools that overlap therefore share the locks of the
    uids they have in common and still never hand one out twice. What a lock cannot exclude is a user of the uids
    that is not a sandbox: the pool is refused, naming it, when an account or a process outside the sandbox's runs
    holds one of its uids.
    """

    def __init__(self, base: int = UID_BASE, size: int = UID_SLOTS, lock_dir: Path = UID_LOCK_DIR,
                 runs_in_cgroups: bool = True):
        self.lock_dir, self.base, self.size = lock_dir, base, size
        # without a run cgroup, a live run of another trainer cannot be told from a foreign process: accounts only
        if clash := foreign_uid_users(range(base, base + size), processes=runs_in_cgroups):
            raise SandboxUnavailable(
                f"the sandbox's uid pool [{base}, {base + size}) overlaps other users of these uids on this host: "
                f"{'; '.join(clash[:5])}. Free them or give the sandbox another pool (LocalSandbox(uid_base=...))")
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def hold(self, uid: int) -> Iterator[bool]:
        """Whether uid ``uid``'s lock was free; held, when it was, until the block ends (no run of any trainer
        takes the uid meanwhile)."""
        fd = os.open(self.lock_dir / f"uid-{uid}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def claim(self, timeout_s: float = 60.0) -> Iterator[int]:
        give_up = time.monotonic() + timeout_s
        while True:
            # the lowest free uid: each uid keeps a copy of the runtime in memory (sandbox.slot_runtime), so the
            # copies are as many as the runs that were ever at once, not the whole pool
            for slot in range(self.size):
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
