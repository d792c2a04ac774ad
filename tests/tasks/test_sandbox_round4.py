"""The fourth round: right programs graded right, and the host's last views, counters, budgets and leftovers.

A right program is one a judge accepts: each program below is run as Codeforces or AtCoder runs it (the host's
python3 on its own, stdin from a file; ``judge``) and through the sandbox, and must pass both. The rest are stopped:
a global id sequence a neighbour moves (pidfs inode numbers), the host's file system behind the program's files,
kernel memory no cgroup charges (BPF JIT images of seccomp and socket filters), runtime copies left mounted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

from agon.tasks import sandbox as sandbox_module
from agon.tasks.sandbox import RUNTIME_DIR, LocalSandbox, RunRequest
from tests.tasks.test_sandbox import run

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    return LocalSandbox()


def judge(code: str, stdin: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """The program as a judge runs it: the host's python3, the program a file, stdin a regular file."""
    with tempfile.TemporaryDirectory() as d:
        prog, data = Path(d) / "main.py", Path(d) / "input.txt"
        prog.write_text(textwrap.dedent(code))
        data.write_text(stdin)
        with open(data) as f:
            return subprocess.run([sandbox_module.SYSTEM_PYTHON, str(prog)], stdin=f, capture_output=True,
                                  text=True, timeout=timeout, cwd=d)


# ---------------------------------------------------------------------------------------------------------------
# right programs: each prints its answer judge-style and in the sandbox

RIGHT = {
    # Codeforces' most common fast-input line: the whole of stdin, sized by fstat
    "fstat-sized read": ("import os\ndata = os.read(0, os.fstat(0).st_size).split()\nprint(sum(map(int, data)))\n",
                         "1 2 3\n", "6"),
    "mmap of stdin": ("import mmap\nm = mmap.mmap(0, 0, prot=mmap.PROT_READ)\n"
                      "print(sum(map(int, m.read().split())))\n", "4 5 6\n", "15"),
    "stdin read twice (rewound)": ("import sys\na = sys.stdin.read()\nsys.stdin.seek(0)\nb = sys.stdin.read()\n"
                                   "print(len(a) == len(b) == 6)\n", "7 8 9\n", "True"),
    "/dev/stdin, /dev/stdout, /dev/stderr": (
        "data = open('/dev/stdin').read().split()\nout = open('/dev/stdout', 'w')\n"
        "open('/dev/stderr', 'w').write('debug\\n')\nout.write(str(sum(map(int, data))) + '\\n')\nout.close()\n",
        "10 20\n", "30"),
    "multiprocessing over its own function": (
        "from multiprocessing import Pool\ndef sq(x):\n    return x * x\nif __name__ == '__main__':\n"
        "    with Pool(2) as p:\n        print(sum(p.map(sq, range(int(input())))))\n", "10\n", "285"),
    "pickling its own class": (
        "import pickle\nclass P:\n    def __init__(self, v):\n        self.v = v\n"
        "print(pickle.loads(pickle.dumps(P(int(input())))).v)\n", "41\n", "41"),
    "host facilities": (
        "import os, getpass, zoneinfo, datetime, pwd\nassert open('/proc/loadavg').read().split()[0]\n"
        "assert getpass.getuser() and os.path.expanduser('~') != '~'\n"
        "assert pwd.getpwuid(os.getuid()).pw_name\n"
        "t = datetime.datetime(2020, 7, 1, 12, tzinfo=zoneinfo.ZoneInfo('Europe/Paris'))\n"
        "print(t.utcoffset().seconds // 3600 + int(input()))\n", "1\n", "3"),
    "the stack template": (
        "import resource, sys, threading\n"
        "resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "sys.setrecursionlimit(10 ** 6)\n"
        "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
        "print(depth(int(input())))\n", "50000\n", "50000"),
    "debug lines on stderr past the output cap": (
        "import sys\nfor i in range(40000):\n    print('debug line', i, 'of the search', file=sys.stderr)\n"
        "print(int(input()) * 2)\n", "21\n", "42"),
}


@pytest.mark.parametrize("name", list(RIGHT))
def test_a_right_program_passes_as_a_judge_runs_it_and_in_the_sandbox(sandbox, name):
    code, stdin, answer = RIGHT[name]
    judged = judge(code, stdin)
    assert judged.returncode == 0 and judged.stdout.split() == [answer], judged.stderr[-2000:]
    res = run(sandbox, code, stdin=stdin, time_limit_s=5, max_output_bytes=1 << 18)
    assert res.status == "ok" and res.stdout.split() == [answer], res


def test_what_cannot_match_a_judge_is_named_in_the_verdict(sandbox):
    """os.getloadavg() (and os.sysconf('SC_PHYS_PAGES')) come from sysinfo(), which the sandbox refuses: it counts
    the host's processes, a number every neighbour moves. A program that fails on it is told why."""
    res = run(sandbox, "import os\nprint(os.getloadavg())\n")
    assert res.status == "runtime_error" and "sysinfo" in res.detail and "getloadavg" in res.detail, res


def test_stdin_is_a_read_only_regular_file_holding_exactly_the_input(sandbox):
    res = run(sandbox, """
        import os, stat
        st = os.fstat(0)
        try:
            os.write(0, b'x')
            wrote = 'wrote'
        except OSError:
            wrote = 'refused'
        print(stat.S_ISREG(st.st_mode), st.st_size, wrote)
    """, stdin="é 1 2\n")
    assert res.status == "ok" and res.stdout.split() == ["True", "7", "refused"], res


@pytest.mark.long
def test_a_program_at_ninety_percent_of_its_cpu_budget_passes_twenty_runs_while_the_other_core_is_busy(sandbox):
    """CPU time judged by the exact clock: the kernel's per-process limit samples ticks (3-35% ahead of the exact
    time here), so it is only a backstop above the budget, and the run's exact total (its cgroup's) decides."""
    budget = 1.0
    code = f"""
        import time
        end = {0.9 * budget}
        while time.process_time() < end:
            pass
        print('done')
    """
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            subprocess.run([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 2: pass"])

    spinner = threading.Thread(target=busy, daemon=True)
    spinner.start()
    try:
        # sandbox.run itself: the spinner is a child of this process, which run()'s leftover check would count
        results = [sandbox.run(RunRequest(code=textwrap.dedent(code), time_limit_s=budget, wall_time_s=60))
                   for _ in range(20)]
    finally:
        stop.set()
        spinner.join()
    failed = [r for r in results if r.status != "ok"]
    assert not failed, failed[:3]
    # and the budget still binds: twice over it is a timeout
    over = run(sandbox, code.replace(f"{0.9 * budget}", f"{2 * budget}"), time_limit_s=budget, wall_time_s=60)
    assert over.status == "timeout", over


# ---------------------------------------------------------------------------------------------------------------
# views of the host and global counters

def test_pidfs_inode_numbers_a_neighbour_moves_cannot_be_read(sandbox):
    """pidfs numbers every process the host starts in one global sequence (kernel 6.9 on): a pidfd's inode number
    read before and after told a copier how many processes a neighbour forked. pidfd_open and clone's CLONE_PIDFD
    are refused."""
    res = run(sandbox, """
        import ctypes, os
        try:
            os.pidfd_open(os.getpid())
            print('opened')
        except OSError as e:
            print('refused', e.errno)
        libc = ctypes.CDLL(None, use_errno=True)
        fd = ctypes.c_int(-1)
        # clone(CLONE_PIDFD | SIGCHLD, child stack NULL, &pidfd): the child would be a fork
        pid = libc.syscall(56, 0x1000 | 17, None, ctypes.byref(fd), None, None)
        if pid == 0:
            os._exit(0)
        print('clone', pid if pid < 0 else 'forked', ctypes.get_errno())
    """)
    assert res.status == "ok" and res.stdout.split() == ["refused", "1", "clone", "-1", "1"], res


def test_the_programs_files_are_not_on_the_hosts_file_system(sandbox):
    """main.py, the given files and stdin are copies in the run's own memory: no host path, no trainer pid in the
    mount table, and no host file system's free blocks or inodes behind them."""
    host = os.statvfs(sandbox.tmp_root)
    res = run(sandbox, """
        import os
        for path in ('/work/main.py', '/work/data.txt', '/proc/self/fd/0'):
            st = os.statvfs(path)
            print(st.f_blocks, st.f_bfree, st.f_files, st.f_ffree)
        print(open('/proc/self/mountinfo').read())
    """, files={"data.txt": "x"})
    assert res.status == "ok", res
    lines = res.stdout.splitlines()
    for line in lines[:3]:
        assert [int(v) for v in line.split()] != [host.f_blocks, host.f_bfree, host.f_files, host.f_ffree], line
    # the host's working directory of the run (named by the trainer's pid) was the source of main.py's bind
    assert sandbox_module.WORKDIR_PREFIX not in "\n".join(lines[3:]), lines[3:]


# ---------------------------------------------------------------------------------------------------------------
# budgets: kernel memory no cgroup charges

def test_no_seccomp_or_socket_filter_can_be_loaded_so_no_bpf_jit_memory_is_drawn(sandbox):
    """Each filter a program loads is compiled into the host's one pool of BPF JIT memory, which no cgroup charges
    and from which the sandbox's own seccomp filter comes: when it runs out, every run fails to start. seccomp(),
    prctl(PR_SET_SECCOMP) and SO_ATTACH_FILTER / SO_ATTACH_REUSEPORT_CBPF are refused."""
    res = run(sandbox, """
        import ctypes, socket, struct
        libc = ctypes.CDLL(None, use_errno=True)
        ins = struct.pack('<HBBI', 0x06, 0, 0, 0x7FFF0000)  # return ALLOW
        buf = ctypes.create_string_buffer(ins)
        class Prog(ctypes.Structure):
            _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]
        prog = Prog(1, ctypes.addressof(buf))
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS (set already)
        loaded = 0
        for _ in range(200):
            if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0:
                loaded += 1
        print('prctl', loaded, ctypes.get_errno())
        print('seccomp', libc.syscall(317, 1, 0, ctypes.byref(prog)), ctypes.get_errno())
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for opt in (26, 51):
            try:
                s.setsockopt(socket.SOL_SOCKET, opt, bytes(prog))
                print(opt, 'attached')
            except OSError as e:
                print(opt, 'refused', e.errno)
    """)
    assert res.status == "ok", res
    assert res.stdout.split() == ["prctl", "0", "1", "seccomp", "-1", "1", "26", "refused", "1", "51", "refused",
                                  "1"], res


# ---------------------------------------------------------------------------------------------------------------
# leftovers: the runtime copies

# a uid pool of this test's own, so that no other test's sandbox (another pytest worker) mounts or sweeps its copies
POOL = dict(uid_base=61100, uid_slots=4)


def _runtime_mounts() -> set[str]:
    """The mounted runtime copies of ``POOL``'s uids."""
    ours = {f"{RUNTIME_DIR}/uid-{uid}" for uid in range(POOL["uid_base"], POOL["uid_base"] + POOL["uid_slots"])}
    with open("/proc/mounts") as f:
        return {line.split()[1] for line in f if line.split()[1] in ours}


def test_a_trainers_runtime_copies_are_unmounted_when_it_exits_and_stale_ones_swept_at_start(tmp_path):
    """A trainer (here a child process) runs two programs at once, so two uids hold a copy; when it exits its copies
    are unmounted. A copy left by a trainer that was killed is swept by the next sandbox that starts."""
    script = textwrap.dedent("""
        import sys
        from concurrent.futures import ThreadPoolExecutor
        from agon.tasks.sandbox import LocalSandbox, RunRequest
        sb = LocalSandbox(uid_base=61100, uid_slots=4)
        req = RunRequest(code="import time\\ntime.sleep(0.5)\\nprint(1)", time_limit_s=2, wall_time_s=30)
        with ThreadPoolExecutor(2) as pool:
            print([r.status for r in pool.map(sb.run, [req, req])], flush=True)
        if sys.argv[1] == "kill":
            import os, signal
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    LocalSandbox(**POOL).close()  # this process's probe run done (once per process), its copy unmounted
    before = _runtime_mounts()
    out = subprocess.run([sys.executable, "-c", script, "exit"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert "['ok', 'ok']" in out.stdout, out.stderr[-3000:]
    assert _runtime_mounts() - before == set(), "copies left mounted by a trainer that exited"
    before = _runtime_mounts()
    out = subprocess.run([sys.executable, "-c", script, "kill"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert "['ok', 'ok']" in out.stdout, out.stderr[-3000:]
    left = _runtime_mounts() - before
    assert left, "the premise: a killed trainer leaves its copies"
    started = LocalSandbox(**POOL)
    assert _runtime_mounts() & left == set(), "stale copies not swept at start"
    started.close()
