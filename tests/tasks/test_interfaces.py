"""The tasks' outside world as it really is: CodeContests statements with line breaks as the dataset writes them, the
kernel's system-call argument positions (not the C library's), and datasets that repeat items.

* Statements: CodeContests stores a problem's statement as one text whose sections ("Input", "Output", "Examples",
  "Note") are paragraphs separated by blank lines, list items with trailing spaces before their line break, some
  rows with ``\\r\\n``. The grading rules read sentences (a stated tolerance, a permission to print in any case) that
  end at a line break as well as at a full stop; the examples and notes after them hold the words (``no``, ``YES``)
  and numbers that a sentence running on would take in. Each statement is also graded end to end, by the sandbox.
* System calls: every argument-filtered rule of the sandbox's seccomp program (``isolation.seccomp_filter``) and of
  its monitor's filter is called with raw numbers through ``syscall(2)``, in the argument positions the x86_64
  kernel passes (clone's flags first, where the C library's wrapper takes them third), once with the refused value
  where the kernel reads it and once with that value in every other position. The filter is agon's with its refusals
  marked (errno 3000 + e instead of e), so that a refusal by the filter is never confused with the kernel's own
  answer to the same call; it is loaded once directly by a child process and once through bubblewrap as a run gets
  it. The set of rules probed is read off the program, so a rule added later without a probe fails here.
* Datasets that repeat items: reasoning-gym draws items independently (a small space repeats them), DeepMath and
  CodeContests hold repeated rows, also across splits. Each split holds each item once, no held-out item is a
  training item, and the counts are the ones asked for.

Left out on purpose: other architectures' numbers (the sandbox refuses to run there; tests/tasks/test_sandbox.py
checks the aarch64 program is valid) and a statement's sentence broken by a line break in its middle (CodeContests
keeps a paragraph on one line; such a break ends the sentence for these rules).
"""

from __future__ import annotations

import json
import platform
import struct
import subprocess
import sys
import textwrap

import pytest

from agon.tasks import build_task
from agon.tasks import isolation
from agon.tasks import sandbox as sandbox_module
from agon.tasks.codecontests import outputs_match, stated_any_case, stated_tolerance
from agon.tasks.isolation import SandboxUnavailable
from agon.tasks.sandbox import LocalSandbox

X86 = platform.machine() == "x86_64"
needs_x86 = pytest.mark.skipif(not X86, reason="system-call numbers of x86_64")


# ---------------------------------------------------------------------------------------------------------------
# statements with line breaks as CodeContests writes them


def _layout(text: str, crlf: bool) -> str:
    """A statement as a CodeContests row holds it, with ``\\r\\n`` line breaks where ``crlf``."""
    return text.replace("\n", "\r\n") if crlf else text


# any case: the permission stands alone on its line, with no full stop; an "no" in the Input section before it
# and in the Note after it (a sentence running over the line breaks would take one in and drop the permission)
ANY_CASE = (
    "Alice and Bob take turns removing stones from piles; the player who cannot move loses. Determine the winner.\n\n"
    "Input\n\nThe first line contains n (1 ≤ n ≤ 100) — the number of piles, no two of them equal \n"
    "The second line contains n integers a_i \n\n"
    "Output\n\nPrint the name of the winner\n\nYou can print each letter in any case\n\n"
    "Examples\n\nInput\n\n1\n3\n\n\nOutput\n\nAlice\n\n\n"
    "Note\n\nIn the first example Bob has no move after Alice takes all three stones."
)
# the idiom, not a permission: "In any case" opening the Output section's paragraph, right after its heading
IDIOM = (
    "Rearrange the letters of the word s so that it reads the same from both ends.\n\n"
    "Input\n\nThe only line contains the word s. \n\n"
    "Output\n\nIn any case, print the rearranged word; if there are several, print the smallest one\n\n"
    "Examples\n\nInput\n\naab\n\n\nOutput\n\naba\n"
)
# a tolerance in the Output section, after a list whose items end in trailing spaces
TOLERANCE = (
    "A circle of radius r is drawn. Find:\n\n  * its area; \n  * nothing else. \n\n"
    "Input\n\nThe only line contains r (1 ≤ r ≤ 100).\n\n"
    "Output\n\nPrint the area.\n\nYour answer is considered correct if its absolute or relative error does not "
    "exceed 10^{-4}. \n\nExamples\n\nInput\n\n1\n\n\nOutput\n\n3.1415926536\n"
)
# "errors" ends a line of the Input section; the 10^{-6} on the next line is a bound on p, not a tolerance
NO_TOLERANCE = (
    "Each of k messages is lost with probability p.\n\n"
    "Input\n\nThe first line contains k, the number of errors allowed\nThe second line contains p "
    "(10^{-6} ≤ p ≤ 1) \n\nOutput\n\nPrint the number of ways modulo 998244353.\n"
)


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
def test_the_grading_rules_read_a_sentence_up_to_its_line_break(crlf):
    assert stated_any_case(_layout(ANY_CASE, crlf)) is True
    assert stated_any_case(_layout(IDIOM, crlf)) is False
    assert stated_any_case(_layout(TOLERANCE, crlf)) is False
    assert stated_tolerance(_layout(TOLERANCE, crlf)) == 1e-4
    assert stated_tolerance(_layout(NO_TOLERANCE, crlf)) is None
    assert stated_tolerance(_layout(ANY_CASE, crlf)) is None


def _row(name: str, description: str, tests: list[tuple[str, str]]) -> dict:
    """A CodeContests row that the easy filter keeps: its first test public, the others private."""
    (pub_in, pub_out), *private = tests
    return {"name": name, "description": description, "public_tests": {"input": [pub_in], "output": [pub_out]},
            "private_tests": {"input": [i for i, _ in private], "output": [o for _, o in private]},
            "generated_tests": {"input": [], "output": []}, "source": 2, "difficulty": 7, "cf_rating": 800,
            "input_file": "", "output_file": "", "solutions": {"language": [3], "solution": [""]},
            "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 268435456}


def _program(code: str) -> str:
    return f"<think>work</think>Here it is.\n```python\n{textwrap.dedent(code).strip()}\n```\n"


@pytest.fixture
def statements_task(compose_task, tmp_path):
    """The four statements as a CodeContests split, in ``\\r\\n`` rows and with ``\\r\\n`` tests (inputs and expected
    outputs with trailing spaces, as the dataset's older problems have them)."""
    rows = [
        _row("1_A. Stones", _layout(ANY_CASE, True), [("1\r\n3\r\n", "Alice\r\n"), ("2\r\n1 2\r\n", "Bob \r\n")]),
        _row("2_A. Palindrome", _layout(IDIOM, True), [("aab\r\n", "aba\r\n"), ("aabb\r\n", "abba\r\n")]),
        _row("3_A. Circle", _layout(TOLERANCE, True), [("1\r\n", "3.1415926536\r\n"), ("2\r\n", "12.566370614\r\n")]),
        _row("4_A. Lost", _layout(NO_TOLERANCE, True),
             [("1\r\n0.5 \r\n", "1 \r\n2\r\n"), ("2\r\n1\r\n", "2\r\n3 \r\n")]),
    ]
    source = tmp_path / "codecontests.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        task = build_task(compose_task("codecontests", f"source={source}", "heldout_size=0", "time_limit_s=2"))
    except SandboxUnavailable as exc:
        pytest.skip(f"no sandbox here: {exc}")
    yield task
    task.close()


def test_statements_and_tests_with_crlf_line_breaks_are_graded_by_what_each_statement_states(statements_task):
    """Graded in the sandbox: the stated permission folds the winner's case, the idiom leaves the word exact, the
    stated 10^{-4} accepts 3.1416 (the task's own 1e-6 would not), no tolerance keeps integers exact; every
    ``\\r\\n`` and trailing space of the tests is a blank."""
    problems = {p.meta["name"]: p for p in statements_task.train_problems()}
    assert problems["1_A. Stones"].meta.get("fold_case") is True
    assert "fold_case" not in problems["2_A. Palindrome"].meta
    assert problems["3_A. Circle"].meta.get("float_tolerance") == 1e-4
    assert "float_tolerance" not in problems["4_A. Lost"].meta
    stones = "n = int(input())\nprint('{}' if n % 2 else '{}')"
    palindrome = "s = sorted(input().strip())\nh = s[::2]\nprint(''.join(h + h[::-1][len(s) % 2:]){})"
    circle = "import math\nprint({})"
    cases = [
        ("1_A. Stones", stones.format("ALICE", "bOB"), "ok"),  # any case, as its statement allows
        ("1_A. Stones", stones.format("Bob", "Alice"), "wrong"),
        ("2_A. Palindrome", palindrome.format(""), "ok"),
        ("2_A. Palindrome", palindrome.format(".upper()"), "wrong"),  # the idiom allows nothing
        ("3_A. Circle", circle.format("f'{math.pi * int(input()) ** 2:.4f}'"), "ok"),  # within the stated 1e-4
        ("3_A. Circle", circle.format("f'{math.pi * int(input()) ** 2:.2f}'"), "wrong"),
        ("4_A. Lost", "k = int(input())\nprint(k)\nprint(k + 1)", "ok"),  # the lines' breaks are blanks
        ("4_A. Lost", "k = int(input())\nprint(float(k))\nprint(k + 1)", "wrong"),  # 1.0 for 1: exact integers
    ]
    verdicts = statements_task.verify([problems[n] for n, _, _ in cases], [_program(c) for _, c, _ in cases])
    assert [v.status for v in verdicts] == [s for _, _, s in cases], [(n, v.detail) for (n, _, _), v in
                                                                      zip(cases, verdicts)]


def test_crlf_and_trailing_spaces_of_a_multi_line_expected_output_are_blanks():
    assert outputs_match("1 2 \r\n3\r\n", "1 2\n3\n") and outputs_match("1 2\n3\n", "1 2 \r\n3 \r\n")
    assert not outputs_match("1 2 \r\n3\r\n", "1 2 3 4\n") and not outputs_match("1 2\r\n3\r\n", "12\r\n3\r\n")


# ---------------------------------------------------------------------------------------------------------------
# the kernel's system-call argument positions

# x86_64's numbers (asm/unistd_64.h) and the values the filter looks for, from the kernel's headers
CLONE, SOCKET, SOCKETPAIR, SETSOCKOPT, MMAP, SHMGET, MEMFD_CREATE, FCNTL, KEYCTL, PREADV2, PWRITEV2, PRCTL = (
    56, 41, 53, 54, 9, 29, 319, 72, 250, 327, 328, 157)
SIGCHLD = 17
CLONE_BITS = {"NEWNS": 0x20000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000, "NEWIPC": 0x08000000,
              "NEWUSER": 0x10000000, "NEWPID": 0x20000000, "NEWNET": 0x40000000, "PIDFD": 0x1000}
CLONE_ALL = sum(CLONE_BITS.values())
EPERM, EAFNOSUPPORT, EOPNOTSUPP = 1, 97, 95
# a refusal by the filter answers errno MARK + its errno: no kernel answer is that large
MARK = 3000
_BPF_RET, _SECCOMP_RET_ERRNO = 0x06, 0x00050000


def marked_filter(machine: str | None = None) -> bytes:
    """agon's seccomp program with each refusal's errno (EPERM, EAFNOSUPPORT, EOPNOTSUPP) raised by MARK: the same
    decisions, told apart from the kernel's own errors. ENOSYS stays as it is (the C library falls back on it)."""
    out = []
    for code, jt, jf, k in struct.iter_unpack("<HBBI", isolation.seccomp_filter(machine)):
        if code == _BPF_RET and k & 0xFFFF0000 == _SECCOMP_RET_ERRNO and k & 0xFFFF in (EPERM, EAFNOSUPPORT,
                                                                                         EOPNOTSUPP):
            k = _SECCOMP_RET_ERRNO | (MARK + (k & 0xFFFF))
        out.append(struct.pack("<HBBI", code, jt, jf, k))
    return b"".join(out)


def argument_rules(program: bytes) -> dict[int, set[int]]:
    """The system calls whose rule in ``program`` reads an argument, with the offsets it reads in ``struct
    seccomp_data`` (argument i at 16 + 8 i): the program is a prelude, then one ``if nr == N: body`` per call."""
    ins = list(struct.iter_unpack("<HBBI", program))
    i = next(j for j, x in enumerate(ins) if x == (0x20, 0, 0, 0)) + 1  # the prelude loads nr last
    if ins[i][0] == 0x35:  # x86_64's x32 check and its refusal
        i += 2
    rules: dict[int, set[int]] = {}
    while ins[i][0] == 0x15:
        _, _, length, nr = ins[i]
        loads = {k for code, _, _, k in ins[i + 1: i + 1 + length] if code == 0x20 and k >= 16}
        if loads:
            rules[nr] = loads
        i += 1 + length
    assert ins[i] == (_BPF_RET, 0, 0, _SECCOMP_RET_ERRNO | 38) and i == len(ins) - 1  # the whole program was read
    return rules


# label -> (system call, arguments, expected): ("refused", errno) or "passed" (the kernel answered). Each rule's
# refused value sits where the x86_64 kernel passes its argument, then in every other position. Names in the
# arguments: a descriptor ("unix", "file", and the same dup'ed to the number given), a pointer ("buf", "iov", "sv",
# "name"). PROBE runs them in a program of its own.
PROBES = {
    **{f"clone CLONE_{n}": (CLONE, (bit | SIGCHLD, 0, 0, 0, 0), ("refused", EPERM)) for n, bit in CLONE_BITS.items()},
    # the C library's clone(fn, stack, flags, arg, ...) takes the flags third; the kernel's first, then the child's
    # stack, the parent's and child's tid pointers and the TLS (ignored without their flags)
    "clone, the refused flags in the other arguments": (CLONE, (SIGCHLD, 0, CLONE_ALL, CLONE_ALL, CLONE_ALL),
                                                       "passed"),
    "socket AF_INET": (SOCKET, (2, 1, 0), ("refused", EAFNOSUPPORT)),
    "socket AF_INET6": (SOCKET, (10, 1, 0), ("refused", EAFNOSUPPORT)),
    "socket AF_NETLINK": (SOCKET, (16, 3, 0), ("refused", EAFNOSUPPORT)),
    "socket AF_UNIX, AF_INET in the other arguments": (SOCKET, (1, 2, 2), "passed"),
    "socketpair AF_INET": (SOCKETPAIR, (2, 1, 0, "sv"), ("refused", EAFNOSUPPORT)),
    "socketpair AF_UNIX, AF_INET in the other arguments": (SOCKETPAIR, (1, 2, 2, "sv"), "passed"),
    **{f"setsockopt SOL_SOCKET {o}": (SETSOCKOPT, ("unix", 1, o, 0, 0), ("refused", EPERM)) for o in (26, 50, 51, 52)},
    "setsockopt SO_RCVBUF, 26 as descriptor and length": (SETSOCKOPT, ("unix@26", 1, 8, "buf", 26), "passed"),
    "setsockopt option 26 at another level": (SETSOCKOPT, ("unix", 0, 26, 0, 0), "passed"),
    "mmap MAP_HUGETLB": (MMAP, (0, 2 << 20, 3, 0x22 | 0x40000, -1, 0), ("refused", EPERM)),
    "mmap, MAP_HUGETLB in the other arguments": (MMAP, (0x40000, 0x40000, 3, 0x22, -1, 0x40000), "passed"),
    "shmget SHM_HUGETLB": (SHMGET, (0x6167, 2 << 20, 0o600 | 0x800), ("refused", EPERM)),  # no IPC_CREAT
    "shmget, SHM_HUGETLB in the other arguments": (SHMGET, (0x800, 0x800, 0o600), "passed"),
    "memfd_create MFD_HUGETLB": (MEMFD_CREATE, ("name", 4), ("refused", EPERM)),
    "memfd_create, MFD_HUGETLB as the name": (MEMFD_CREATE, (4, 0), "passed"),
    **{f"fcntl {cmd}": (FCNTL, ("file", cmd, 0), ("refused", EPERM)) for cmd in isolation.FCNTL_DENIED},
    "fcntl F_GETFL, refused commands as descriptor and argument": (FCNTL, ("file@37", 3, 1026), "passed"),
    "keyctl KEYCTL_JOIN_SESSION_KEYRING, no name": (KEYCTL, (1, 0, 1, 1, 1), "passed"),
    "keyctl KEYCTL_JOIN_SESSION_KEYRING, a name": (KEYCTL, (1, "name"), ("refused", EPERM)),
    "keyctl KEYCTL_JOIN_SESSION_KEYRING, a name above 4 GiB": (KEYCTL, (1, 1 << 32), ("refused", EPERM)),
    "keyctl KEYCTL_GET_KEYRING_ID": (KEYCTL, (0, 0, 0), ("refused", EPERM)),
    **{f"{name} RWF_NOWAIT": (nr, ("file", "iov", 1, 0, 0, 8), ("refused", EOPNOTSUPP))
       for name, nr in (("preadv2", PREADV2), ("pwritev2", PWRITEV2))},
    **{f"{name}, RWF_NOWAIT in the other arguments": (nr, ("file@8", "iov", 8, 8, 8, 0), "passed")
       for name, nr in (("preadv2", PREADV2), ("pwritev2", PWRITEV2))},
}
# the monitor's own filter, stacked inside the sandbox: prctl's option is its first argument
MONITOR_PROBES = {
    "prctl PR_SET_SECCOMP": (PRCTL, (22, 2, "fprog", 0, 0), ("monitor", EPERM)),
    "prctl PR_GET_NAME, PR_SET_SECCOMP in the other arguments": (PRCTL, (16, "buf", 22, 22, 22), "passed"),
}

PROBE = r'''
import ctypes, json, os, socket, sys, tempfile
probes = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
unix = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
file = tempfile.TemporaryFile()
file.write(b"x" * 64)
file.flush()
buf = ctypes.create_string_buffer(64)
sv = (ctypes.c_int * 2)()
name = ctypes.create_string_buffer(b"probe")
class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
iov = (Iovec * 8)(*[Iovec(ctypes.addressof(buf), 1)] * 8)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
allow = ctypes.create_string_buffer(bytes.fromhex("06000000" "0000ff7f"))  # return ALLOW
fprog = Fprog(1, ctypes.addressof(allow))
pointers = {"buf": buf, "sv": sv, "name": name, "iov": iov, "fprog": ctypes.byref(fprog)}
descriptors = {"unix": unix.fileno(), "file": file.fileno()}
def argument(a):
    if isinstance(a, int):
        return ctypes.c_long(a)
    if a in pointers:
        return pointers[a]
    fd, _, number = a.partition("@")
    if number:
        os.dup2(descriptors[fd], int(number))
        return ctypes.c_long(int(number))
    return ctypes.c_long(descriptors[fd])
out = {}
for label, (nr, args) in probes.items():
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[argument(a) for a in args])
    if nr == 56 and r == 0:
        os._exit(0)  # the child of a clone that went through
    out[label] = ctypes.get_errno() if r == -1 else 0
    if nr == 56 and r > 0:
        os.waitpid(r, 0)
    elif nr in (41, 319) and r >= 0:
        os.close(r)
    elif nr == 9 and r != -1:
        libc.munmap(ctypes.c_void_p(r), ctypes.c_size_t(args[1]))
print(json.dumps(out))
'''

LOAD = r'''
import ctypes, sys
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
code = ctypes.create_string_buffer(bytes.fromhex(sys.argv.pop(1)))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
if libc.prctl(22, 2, ctypes.byref(Fprog(len(code.raw) // 8, ctypes.addressof(code))), 0, 0) != 0:  # PR_SET_SECCOMP
    raise OSError(ctypes.get_errno(), "seccomp")
'''


def _check(results: dict, probes: dict) -> None:
    assert set(results) == set(probes)
    wrong = {}
    for label, (_, _, expected) in probes.items():
        got = results[label]
        if expected == "passed":
            ok = got < MARK  # the filter let it through: whatever the kernel then answered (0: success)
        elif expected[0] == "monitor":
            ok = got == expected[1]  # the monitor's own filter: the errno unmarked
        else:
            ok = got == MARK + expected[1]
        if not ok:
            wrong[label] = (got, expected)
    assert not wrong, wrong


def _wire(probes: dict) -> str:
    return json.dumps({label: [nr, list(args)] for label, (nr, args, _) in probes.items()})


def test_every_argument_filtered_rule_is_probed():
    """Read off the program: the calls whose rule reads an argument are exactly the ones probed (a rule added without
    a probe here fails)."""
    probed = {nr for nr, _, _ in PROBES.values()}
    assert set(argument_rules(isolation.seccomp_filter("x86_64"))) == probed


@needs_x86
def test_each_rule_reads_the_argument_the_kernel_passes_in_a_process_that_loads_the_filter(tmp_path):
    """The filter loaded by a child process of its own (no bubblewrap needed): each refused value is refused where
    the kernel passes it, and nowhere else."""
    done = subprocess.run([sys.executable, "-c", LOAD + PROBE, marked_filter("x86_64").hex(), _wire(PROBES)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, env={"TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    _check(json.loads(done.stdout), PROBES)


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    try:
        return LocalSandbox()
    except SandboxUnavailable as exc:
        pytest.skip(f"no sandbox here: {exc}")


@needs_x86
def test_each_rule_reads_the_argument_the_kernel_passes_in_the_sandbox(sandbox, monkeypatch):
    """As a run gets the filter (bubblewrap's ``--seccomp``, under the monitor's own): the same answers, keyctl
    aside (the monitor refuses every keyctl after its own, so bubblewrap's keyctl rule is the monitor's start, which
    every run passes), and prctl's option read as the first argument."""
    from tests.tasks.test_sandbox import run

    monkeypatch.setattr(sandbox_module, "seccomp_filter", marked_filter)
    probes = {k: v for k, v in PROBES.items() if v[0] != KEYCTL} | MONITOR_PROBES
    probes["keyctl, refused by the monitor"] = (KEYCTL, (1, 0, 1, 1, 1), ("monitor", EPERM))
    code = f"import sys\nsys.argv[1:] = [{_wire(probes)!r}]\n" + PROBE
    res = run(sandbox, code, time_limit_s=5)
    assert res.status == "ok", res
    _check(json.loads(res.stdout), probes)


def test_the_probes_can_tell_a_refusal_from_the_kernels_answer():
    """The premise of the marks: no errno the kernel gives reaches MARK, and the marked program differs from agon's
    only in the refusals' errnos."""
    assert max(__import__("errno").errorcode) < MARK
    plain, marked = isolation.seccomp_filter("x86_64"), marked_filter("x86_64")
    differ = [(a, b) for a, b in zip(struct.iter_unpack("<HBBI", plain), struct.iter_unpack("<HBBI", marked))
              if a != b]
    assert len(plain) == len(marked) and differ
    assert {b[3] - a[3] for a, b in differ} == {MARK}


# ---------------------------------------------------------------------------------------------------------------
# datasets that repeat items


def _questions(problems) -> list[str]:
    return [p.question for p in problems]


def test_reasoning_gym_splits_keep_each_question_once_and_hold_out_as_many_as_asked(compose_task):
    """One-digit products: 81 items, drawn independently, so 40 and 60 draws repeat some. The held-out split is the
    first 20 distinct items of its draw, the training pool every distinct item of its own draw that is not held
    out, in order."""
    import reasoning_gym

    from agon.tasks.reasoning_gym import dataset_kwargs

    cfg = compose_task("reasoning_gym", "name=products", "train_size=60", "heldout_size=20",
                       "+task.dataset_args.min_digits=1", "+task.dataset_args.max_digits=1")
    task = build_task(cfg)
    held_draw = [e["question"] for e in reasoning_gym.create_dataset("products", size=40, seed=cfg.split_seed,
                                                                     **dataset_kwargs(cfg))]
    train_draw = [e["question"] for e in reasoning_gym.create_dataset("products", size=60, seed=cfg.split_seed + 1,
                                                                      **dataset_kwargs(cfg))]
    assert len(set(held_draw[:20])) < 20 and len(set(train_draw)) < 60  # the premise: the draws repeat items
    held = list(dict.fromkeys(held_draw))[:20]
    assert _questions(task.heldout_problems()) == held
    assert _questions(task.train_problems()) == [q for q in dict.fromkeys(train_draw) if q not in held]
    ids = [p.id for p in [*task.train_problems(), *task.heldout_problems()]]
    assert len(set(ids)) == len(ids)


def test_deepmath_rows_repeated_in_the_file_are_one_problem_each(compose_task, tmp_path):
    """Twelve questions, four of them repeated (one exactly, one with the spaces and line breaks a scrape leaves
    around it, one with another answer, one three times): twelve problems, four held out, none of them trained on."""
    questions = [f"Compute the sum of the first {n} positive integers." for n in range(3, 15)]
    rows = [{"question": q, "final_answer": str(n * (n + 1) // 2), "difficulty": 8.5, "topic": "Algebra"}
            for n, q in zip(range(3, 15), questions)]
    rows += [dict(rows[0]), {**rows[1], "question": f"  {questions[1]}\r\n"}, {**rows[2], "final_answer": "0"},
             dict(rows[3]), dict(rows[3])]
    source = tmp_path / "deepmath.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = build_task(compose_task("deepmath_hard", f"source={source}", "heldout_size=4"))
    try:
        train, held = _questions(task.train_problems()), _questions(task.heldout_problems())
        assert len(held) == 4 and len(train) == 8
        assert sorted(train + held) == sorted(questions)  # each question once, in one split
    finally:
        task.close()


def test_codecontests_rows_repeated_within_and_across_splits_are_one_problem_held_out_or_trained(compose_task,
                                                                                             tmp_path):
    """The training split repeats a problem and holds one of the test split's; the test split repeats one of its
    own. Held out: the test split's three problems, once each; trained: the training split's others, once each."""
    def rows(*names: str) -> str:
        return "".join(json.dumps(_row(n, "Print the square of n.", [("2\n", "4\n"), ("3\n", "9\n")])) + "\n"
                       for n in names)

    (tmp_path / "train-00000-of-00001.jsonl").write_text(rows("1_A. A", "2_A. B", "5_A. Shared", "1_A. A", "3_A. C"))
    (tmp_path / "test-00000-of-00001.jsonl").write_text(rows("5_A. Shared", "6_A. E", "6_A. E", "7_A. F"))
    # nothing is run: a machine without isolation loads the splits all the same
    task = build_task(compose_task("codecontests", f"source={tmp_path}", "heldout_split=test", "heldout_size=3",
                                   "sandbox.allow_unsafe=true"))
    try:
        held = [p.meta["name"] for p in task.heldout_problems()]
        train = [p.meta["name"] for p in task.train_problems()]
        assert sorted(held) == ["5_A. Shared", "6_A. E", "7_A. F"]
        assert train == ["1_A. A", "2_A. B", "3_A. C"]
    finally:
        task.close()


def test_a_time_limit_is_its_seconds_and_its_nanos_as_codecontests_writes_them():
    """CodeContests writes a limit as a protobuf Duration, ``{"seconds": s, "nanos": n}``, either part left out when
    zero: each part counts (a shipped test's 2 s limit gave the task's own 4 s either way, so a lost part passed)."""
    from agon.tasks.codecontests import _seconds

    assert _seconds({"seconds": 2}) == 2.0 and _seconds({"nanos": 500_000_000}) == 0.5
    assert _seconds({"seconds": 1, "nanos": 250_000_000}) == 1.25
    assert _seconds(None) == _seconds({}) == 0.0
