"""The built-in multi-step arithmetic task: sums and differences of a few operands, worked step by step.

A problem is ``93+1-38``; its worked solution is ``<think>93+1=94;94-38=56</think>93+1=94\\boxed{56}``: the
reasoning block holds every step, the recap after it repeats all steps but the last (so a rival can check or reuse
the partial results without being handed the answer), and the answer sits in a box. Problems come from a seeded
generator; the held-out split is drawn with ``split_seed`` and removed from the training pool, so it is the same in
every run and never trained on. Difficulty knobs: ``min_terms``/``max_terms`` and ``max_operand``. The check
battery (``recap_battery``) has a right recap, one whose last shown step slipped, and none; no dead end.

Left out on purpose: multiplication and parentheses. The tiny model has to learn carries within minutes on two CPU
cores; anything harder belongs to ``task=reasoning_gym``.
"""

from __future__ import annotations

import random
from functools import cached_property
from typing import Sequence

from agon.tasks import BatteryRecap, Problem, Task, Verdict, register_task
from agon.tasks.text import SLIPS, boxed_answers, visible_text, worked_text


def _steps(expr: str) -> list[tuple[int, str, int, int]]:
    """[(left, op, right, result)] of a left-to-right evaluation of ``a+b-c...``."""
    tokens, num, out = [], "", []
    for ch in expr:
        if ch in "+-" and num:
            tokens.append(int(num))
            tokens.append(ch)
            num = ""
        else:
            num += ch
    tokens.append(int(num))
    acc = tokens[0]
    for op, right in zip(tokens[1::2], tokens[2::2]):
        new = acc + right if op == "+" else acc - right
        out.append((acc, op, right, new))
        acc = new
    return out


def evaluate(expr: str) -> int:
    steps = _steps(expr)
    return steps[-1][3] if steps else int(expr)


def worked_solution(expr: str, corrupt_rng: random.Random | None = None) -> str:
    """The reference completion for ``expr``; with ``corrupt_rng`` one step's result is off by a small amount and
    the error propagates (a plausible wrong draft, used to make rival recaps imperfect in the warm start)."""
    if corrupt_rng is None:
        return slipped_solution(expr, -1, 0)
    bad = corrupt_rng.randrange(len(_steps(expr)))
    return slipped_solution(expr, bad, corrupt_rng.choice(SLIPS))


def slipped_solution(expr: str, step: int, slip: int) -> str:
    """The reference completion for ``expr`` with step ``step``'s result off by ``slip``, the error carried into
    every later step and the answer (no step, -1, or no slip, 0: the right one)."""
    lines, acc = [], None
    for i, (left, op, right, _) in enumerate(_steps(expr)):
        left = left if acc is None else acc
        acc = left + right if op == "+" else left - right
        if i == step:
            acc += slip
        lines.append(f"{left}{op}{right}={acc}")
    return worked_text(lines, str(acc))


def wrong_last_shown_step(expr: str, rng: random.Random) -> str | None:
    """The check battery's wrong step: the reference completion with the last step its recap shows (every step but
    the last) off by a slip drawn from ``SLIPS``, the steps before it right and the error carried through the hidden
    last step to a wrong answer; None where the recap shows no step (two operands)."""
    shown = len(_steps(expr)) - 1
    return slipped_solution(expr, shown - 1, rng.choice(SLIPS)) if shown > 0 else None


def random_expression(rng: random.Random, min_terms: int, max_terms: int, max_operand: int) -> str:
    n = rng.randint(min_terms, max_terms)
    parts = [str(rng.randint(1, max_operand))]
    for _ in range(n - 1):
        parts.append(rng.choice("+-") + str(rng.randint(1, max_operand)))
    return "".join(parts)


@register_task("arithmetic")
class ArithmeticTask(Task):
    def _problem(self, expr: str) -> Problem:
        return Problem(id=expr, question=expr, answer=str(evaluate(expr)))

    def _draw(self, seed: int, n: int, exclude: set[str]) -> list[str]:
        # plain ints once: an OmegaConf lookup per draw was most of the seconds 100,000 problems took
        lo, hi, top = int(self.cfg.min_terms), int(self.cfg.max_terms), int(self.cfg.max_operand)
        rng, seen, out = random.Random(seed), set(exclude), []
        # the space of problems is large (10^7 at the defaults); the attempt cap only guards tiny configs
        for _ in range(50 * n):
            if len(out) == n:
                break
            expr = random_expression(rng, lo, hi, top)
            if expr not in seen:
                seen.add(expr)
                out.append(expr)
        return out

    @cached_property
    def _heldout(self) -> list[str]:
        return self._draw(self.cfg.split_seed, self.cfg.heldout_size, set())

    def heldout_problems(self) -> Sequence[Problem]:
        return [self._problem(e) for e in self._heldout]

    @cached_property
    def _train(self) -> list[Problem]:
        # seconds at the default 100,000 problems: drawn once per task, however often the pool is asked for
        return [self._problem(e) for e in self._draw(self.cfg.split_seed + 1, self.cfg.train_size, set(self._heldout))]

    def train_problems(self) -> Sequence[Problem]:
        return self._train

    def worked_solution(self, problem: Problem, corrupt_rng: random.Random | None = None) -> str:
        return worked_solution(problem.question, corrupt_rng)

    def recap_battery(self, problem: Problem, solution: str,
                      rng: random.Random) -> dict[str, BatteryRecap | None]:
        """The check battery (``Task.recap_battery``): ``right``, the recap of ``solution``, finished by it;
        ``wrong_step``, the recap with its last shown step's result off by a slip (``wrong_last_shown_step``),
        finished by the completion that carries the wrong value through the hidden last step to its wrong answer
        (None for two operands, whose recap shows no step); ``empty``, "", finished by ``solution``. ``dead_end`` is
        None: a left-to-right sum has no dead end, since right steps always extend to the answer."""
        wrong = wrong_last_shown_step(problem.question, rng)
        return {
            "right": BatteryRecap("right", self.recap(solution), (solution,)),
            "wrong_step": None if wrong is None else BatteryRecap("wrong_step", self.recap(wrong), (wrong,)),
            "dead_end": None,
            "empty": BatteryRecap("empty", "", (solution,)),
        }

    def verify(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        out = []
        for problem, completion in zip(problems, completions, strict=True):
            visible = visible_text(completion)
            answers = boxed_answers(visible) if visible is not None else []
            if not answers:
                out.append(Verdict(correct=False, format_ok=False, status="no_answer"))
                continue
            # exactly one box: several boxes would let a policy hedge
            ok = len(answers) == 1 and answers[0].strip() == problem.answer
            out.append(Verdict(correct=ok, format_ok=len(answers) == 1, status="ok" if ok else "wrong"))
        return out
