"""The check battery (``Task.recap_battery``): every recap has the defect its kind claims, graded by the task's own
verifier, and every finish it lists continues that recap as it stands."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from agon.tasks import BATTERY_KINDS, BatteryRecap, Problem, Task, Verdict, build_task
from agon.tasks.text import SLIPS, perturb_last_number

# held-out problems each stepwise task's battery is checked on
N = 200
# a step of the offline worlds' recaps: "7+3=10", "-8+0=-8", "42*20=840"
STEP = re.compile(r"(-?\d+)([-+*])(\d+)=(-?\d+)")


def _step_is_right(step: str) -> bool:
    left, op, right, result = STEP.fullmatch(step).groups()
    a, b = int(left), int(right)
    return {"+": a + b, "-": a - b, "*": a * b}[op] == int(result)


def _correct(task: Task, problem: Problem, texts: tuple[str, ...]) -> list[bool]:
    return [v.correct for v in task.verify([problem] * len(texts), list(texts))]


def check_battery(task: Task, problem: Problem, solution: str, battery: dict) -> set[str]:
    """What every battery of a stepwise task holds; the kinds it made."""
    assert tuple(battery) == BATTERY_KINDS
    right, empty = battery["right"], battery["empty"]
    assert right.kind == "right" and right.recap == task.recap(solution)
    assert right.finishes and any(_correct(task, problem, right.finishes))
    assert all(task.recap(finish) == right.recap for finish in right.finishes)
    assert empty.kind == "empty" and empty.recap == "" and all(_correct(task, problem, empty.finishes))
    for kind in ("wrong_step", "dead_end"):
        made = battery[kind]
        if made is None:
            continue
        assert made.kind == kind and made.finishes, (problem.id, kind)
        assert not any(_correct(task, problem, made.finishes)), (problem.id, made)
        assert all(task.recap(finish) == made.recap for finish in made.finishes), (problem.id, made)
        assert made.recap != right.recap
    wrong = battery["wrong_step"]
    if wrong is not None:
        got, want = wrong.recap.split(";"), right.recap.split(";")
        # one step changed, the last shown, from right arithmetic to wrong; the steps before it as they were
        assert len(got) == len(want) and got[:-1] == want[:-1], (problem.id, wrong.recap, right.recap)
        assert _step_is_right(want[-1]) and not _step_is_right(got[-1]), (problem.id, wrong.recap)
    return {kind for kind, made in battery.items() if made is not None}


def run_battery(task: Task, problems) -> Counter:
    """Each problem's battery (its worked solution, a seed of its own) checked; how many problems made each kind."""
    made: Counter = Counter()
    for i, problem in enumerate(problems):
        solution = task.worked_solution(problem)
        battery = task.recap_battery(problem, solution, random.Random(i))
        made.update(check_battery(task, problem, solution, battery))
        assert battery == task.recap_battery(problem, solution, random.Random(i))  # deterministic given rng
    return made


# --- target sum ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target_sum():
    from tests.tasks.conftest import compose_task

    return build_task(compose_task("target_sum", "train_size=200"))


def test_target_sum_battery_on_heldout_problems(target_sum):
    """Every 3- and 4-operand problem has a wrong step; all but the few whose every prefix is live have a dead end."""
    made = run_battery(target_sum, list(target_sum.heldout_problems())[:N])
    assert made["right"] == made["empty"] == made["wrong_step"] == N
    assert 0.9 * N < made["dead_end"] < N, made


def test_target_sum_battery_by_hand(target_sum):
    """7?3?5?2=7: the right recap 7+3=10;10-5=5 ends at 5, finished by 5+2=7. Its wrong step reads 10-5=9, the one
    wrong value from which a leaf (9-2=7) reaches the target, boxing 7+3-5-2 (3). The dead ends are ++ and --."""
    p = Problem("7?3?5?2=7", "7?3?5?2=7")
    solution = target_sum.worked_solution(p)
    battery = target_sum.recap_battery(p, solution, random.Random(0))
    assert battery["right"] == BatteryRecap("right", "7+3=10;10-5=5",
                                            ("<think>5+2=7</think>7+3=10;10-5=5\\boxed{7+3-5+2}",))
    assert battery["wrong_step"] == BatteryRecap(
        "wrong_step", "7+3=10;10-5=9", ("<think>9+2=11;9-2=7</think>7+3=10;10-5=9\\boxed{7+3-5-2}",))
    assert battery["empty"] == BatteryRecap("empty", "", (solution,))
    drawn = {target_sum.recap_battery(p, solution, random.Random(s))["dead_end"] for s in range(20)}
    assert drawn == {
        BatteryRecap("dead_end", "7+3=10;10+5=15", ("<think>15+2=17</think>7+3=10;10+5=15\\boxed{7+3+5+2}",
                                                    "<think>15+2=17;15-2=13</think>7+3=10;10+5=15\\boxed{7+3+5-2}")),
        BatteryRecap("dead_end", "7-3=4;4-5=-1", ("<think>-1+2=1</think>7-3=4;4-5=-1\\boxed{7-3-5+2}",
                                                  "<think>-1+2=1;-1-2=-3</think>7-3=4;4-5=-1\\boxed{7-3-5-2}")),
    }


def test_target_sum_battery_without_a_shown_step(target_sum):
    """3?4=7: the recap shows no step, so there is no wrong step, and the one empty prefix is the right one."""
    p = Problem("3?4=7", "3?4=7")
    battery = target_sum.recap_battery(p, target_sum.worked_solution(p), random.Random(0))
    assert battery["wrong_step"] is None and battery["dead_end"] is None
    assert battery["right"] == BatteryRecap("right", "", ("<think>3+4=7</think>\\boxed{3+4}",))


# --- arithmetic ----------------------------------------------------------------------------------------------------


def test_arithmetic_battery_on_heldout_problems(compose_task):
    task = build_task(compose_task("arithmetic", "train_size=200"))
    made = run_battery(task, list(task.heldout_problems())[:N])
    assert made["right"] == made["empty"] == made["wrong_step"] == N and made["dead_end"] == 0


def test_arithmetic_battery_by_hand(compose_task):
    """93+1-38+7: the recap's last step 94-38=56 slips by one of SLIPS and the slip reaches the box; 93+1 shows no
    step, so it has no wrong step."""
    task = build_task(compose_task("arithmetic", "train_size=200"))
    p = Problem("93+1-38+7", "93+1-38+7", "63")
    solution = task.worked_solution(p)
    seen = set()
    for seed in range(40):
        battery = task.recap_battery(p, solution, random.Random(seed))
        assert battery["right"] == BatteryRecap("right", "93+1=94;94-38=56", (solution,))
        assert battery["dead_end"] is None
        wrong = battery["wrong_step"]
        slip = int(wrong.recap.rpartition("=")[2]) - 56
        assert slip in SLIPS
        assert wrong == BatteryRecap("wrong_step", f"93+1=94;94-38={56 + slip}", (
            f"<think>93+1=94;94-38={56 + slip};{56 + slip}+7={63 + slip}</think>93+1=94;94-38={56 + slip}"
            f"\\boxed{{{63 + slip}}}",))
        seen.add(slip)
    assert seen == set(SLIPS)
    two = Problem("93+1", "93+1", "94")
    battery = task.recap_battery(two, task.worked_solution(two), random.Random(0))
    assert battery["wrong_step"] is None and battery["right"].recap == ""


# --- reasoning-gym products ----------------------------------------------------------------------------------------


def test_products_battery_on_heldout_problems(compose_task):
    """Two-digit products: the wrong partial product carried into the sum, graded by reasoning-gym's score_answer.
    A second factor with one nonzero digit (42 * 50) has a one-step solution, so no shown step to make wrong."""
    task = build_task(compose_task("reasoning_gym", "name=products", "train_size=300", f"heldout_size={N}"))
    problems = list(task.heldout_problems())
    assert len(problems) == N
    made = run_battery(task, problems)
    one_step = sum(task.recap(task.worked_solution(p)) == "" for p in problems)
    assert made["right"] == made["empty"] == N and made["dead_end"] == 0
    assert 0 < one_step < 0.25 * N and made["wrong_step"] == N - one_step


def test_products_wrong_step_by_hand(compose_task):
    task = build_task(compose_task("reasoning_gym", "name=products", "train_size=300", "heldout_size=20"))
    p = next(p for p in task.heldout_problems() if p.meta["entry"]["metadata"]["expression"] == "60 * 29")
    battery = task.recap_battery(p, task.worked_solution(p), random.Random(1))
    assert battery["right"].recap == "60*9=540;60*20=1200"
    assert battery["wrong_step"] == BatteryRecap("wrong_step", "60*9=540;60*20=1198", (
        "<think>60*9=540;60*20=1198;540+1198=1738</think>60*9=540;60*20=1198\\boxed{1738}",))
    # the slip's product is wrong to reasoning-gym's scorer, the true one right
    got = task.verify([p, p], ["<think>x</think>\\boxed{1738}", "<think>x</think>\\boxed{1740}"])
    assert [v.status for v in got] == ["wrong", "ok"]


# --- the default: perturb_last_number ------------------------------------------------------------------------------


class Pick(random.Random):
    """A rng whose choice is a given slip (which must be among those offered)."""

    def __init__(self, slip: int):
        super().__init__(0)
        self.slip = slip

    def choice(self, seq):
        assert self.slip in seq, (self.slip, seq)
        return self.slip


@pytest.mark.parametrize("recap,slip,want", [
    ("2+3=5;5*4=20", 1, "2+3=5;5*4=21"),
    ("2+3=5;5*4=20;", -10, "2+3=5;5*4=10;"),  # a trailing empty step is no step
    ("2+3=5;5*4=20;  ", 2, "2+3=5;5*4=22;  "),
    # free text: the last non-blank line; LaTeX braces and exponents are text like any other
    ("We have $x^2 = 4$; so $x = 2$.\nThen $\\frac{1}{2} \\cdot 3$ is the half.\n\n", 10,
     "We have $x^2 = 4$; so $x = 2$.\nThen $\\frac{1}{2} \\cdot 13$ is the half.\n\n"),
    ("a = 1\nThe integral of x is x^2/2, so we get .", -1, "a = 1\nThe integral of x is x^2/1, so we get ."),
    ("so $x = 3.14$, hence", 1, "so $x = 4.14$, hence"),
    ("the mean is 1.50 exactly", 2, "the mean is 3.50 exactly"),
    ("10.0000001 left", -10, "0.0000001 left"),
    # a minus before a number stays: the magnitude moves, never through zero
    ("so x = -3", -2, "so x = -1"),
    ("9-8=1;1-7=-6", 10, "9-8=1;1-7=-16"),
    ("12345678901234567890123456789012", 1, "12345678901234567890123456789013"),
])
def test_perturb_last_number_moves_one_number_of_the_last_step(recap, slip, want):
    assert perturb_last_number(recap, Pick(slip)) == want


@pytest.mark.parametrize("recap", ["", "   ", "we are done", "2+3=5;done", "x = 5\nThus the answer is .\n", ";;"])
def test_perturb_last_number_without_a_number_in_the_last_step(recap):
    assert perturb_last_number(recap, random.Random(0)) is None


def test_perturb_last_number_never_goes_below_zero_and_draws_every_slip():
    """0 only moves up; 50 moves by any of SLIPS, each drawn with some seed."""
    assert {perturb_last_number("a=0", random.Random(s)) for s in range(60)} == {"a=1", "a=2", "a=10"}
    assert {perturb_last_number("a=50", random.Random(s)) for s in range(200)} == {f"a={50 + s}" for s in SLIPS}


class Plain(Task):
    """A task that knows no steps: what a plugin task gets."""

    kind = "plain"

    def train_problems(self):
        return []

    def heldout_problems(self):
        return []

    def verify(self, problems, completions):
        return [Verdict(correct=c.endswith("\\boxed{63}"), format_ok=True) for c in completions]


def test_the_default_battery_perturbs_the_right_recap():
    task = Plain(None)
    p = Problem("q", "93+1-38+7", "63")
    solution = "<think>work</think>First 93+1=94.\nThen 94-38=56, and 56+7 is \\boxed{63}"
    battery = task.recap_battery(p, solution, Pick(2))
    assert tuple(battery) == BATTERY_KINDS
    assert battery["right"] == BatteryRecap("right", "First 93+1=94.\nThen 94-38=56, and 56+7 is", (solution,))
    assert battery["wrong_step"] == BatteryRecap("wrong_step", "First 93+1=94.\nThen 94-38=56, and 56+9 is", ())
    assert battery["dead_end"] is None and battery["empty"] == BatteryRecap("empty", "", (solution,))
    bare = task.recap_battery(p, "<think>93+1-38+7=63</think>\\boxed{63}", random.Random(0))
    assert bare["wrong_step"] is None and bare["right"].recap == ""


def test_deepmath_uses_the_default_battery(compose_task):
    from tests.tasks.test_deepmath import PARQUET

    task = build_task(compose_task("deepmath_hard", f"source={PARQUET}", "heldout_size=3", "verify_workers=1"))
    try:
        half = next(p for p in [*task.train_problems(), *task.heldout_problems()] if p.answer == "\\frac{1}{2}")
        solution = "<think>x^2/2 from 0 to 1</think>The integral of x is x^2/2, so we get \\boxed{\\frac{1}{2}}."
        battery = task.recap_battery(half, solution, Pick(1))
        assert battery["right"] == BatteryRecap("right", "The integral of x is x^2/2, so we get .", (solution,))
        assert battery["wrong_step"] == BatteryRecap("wrong_step", "The integral of x is x^2/3, so we get .", ())
        assert battery["dead_end"] is None and battery["empty"].recap == ""
        assert task.verify([half], list(battery["right"].finishes))[0].correct
    finally:
        task.close()
