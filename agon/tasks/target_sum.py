"""Target sum: put ``+`` or ``-`` between given numbers, in their order, so that the chain equals a target.

A problem is ``7?3?5?2=7``: the operands in order, a ``?`` in each gap, and the target. Any sign pattern that
reaches the target is right (``7+3-5+2`` here), graded by evaluating the boxed chain. The worked solution is a
depth-first search over the gaps, ``+`` before ``-``, one step per node::

    <think>7+3=10;10+5=15;15+2=17;15-2=13;10-5=5;5+2=7</think>7+3=10;10-5=5\\boxed{7+3-5+2}

The reasoning block holds the search; the recap after it holds the found chain's steps but the last, and the box
holds the chain.

Why this task (the offline testbed where a rival's recap can matter): **checking is cheaper than solving.** Finding
a chain is a search over 2^(n-1) sign patterns (up to 2^n - 2 steps with shared prefixes); checking one is n - 1
additions and a comparison. A challenger handed a right recap needs one step (the last sign); handed a wrong one (a
chain that cannot reach the target), one step shows it, and only then must it search. Arithmetic chains (the other
offline task) do not have this: re-doing a step costs what checking it does.

The warm start never shows the challenger a wrong recap (``warm_start_wrong_recaps``, 0 here): it reads right
recaps only, and half the time it reuses one (re-deriving the chain it states and adding the last step), half the
time it searches from scratch (``warm_start_reuse``). Which to do given the recap is what RL must teach; a warm
start with wrong recaps and the right chain as the target (the arithmetic world's) would teach it up front.

Left out on purpose: countdown's other operations and free order. Multiplication alone walls off a model this
size (reasoning-gym's products start near 20% after a long warm start), and free order makes the search
factorial, which no short trace holds.
"""

from __future__ import annotations

import random
import re
from functools import cached_property
from typing import Sequence

from agon.tasks import Problem, Task, Verdict, register_task
from agon.tasks.text import BOX, THINK_CLOSE, THINK_OPEN, boxed_answers, visible_text

CHAIN = re.compile(r"\d+(?:[+-]\d+)*")


def parse(question: str) -> tuple[list[int], int]:
    """(operands, target) of ``7?3?5?2=7``."""
    chain, _, target = question.partition("=")
    return [int(x) for x in chain.split("?")], int(target)


def chain_value(signs: Sequence[str], operands: Sequence[int]) -> int:
    """The value of ``operands[0] signs[0] operands[1] ...``."""
    acc = operands[0]
    for sign, x in zip(signs, operands[1:]):
        acc = acc + x if sign == "+" else acc - x
    return acc


def chain_text(signs: Sequence[str], operands: Sequence[int]) -> str:
    return str(operands[0]) + "".join(s + str(x) for s, x in zip(signs, operands[1:]))


def chain_steps(signs: Sequence[str], operands: Sequence[int]) -> list[str]:
    """``["7+3=10", "10-5=5", ...]``: the steps of one chain, left to right."""
    steps, acc = [], operands[0]
    for sign, x in zip(signs, operands[1:]):
        new = acc + x if sign == "+" else acc - x
        steps.append(f"{acc}{sign}{x}={new}")
        acc = new
    return steps


def search(operands: Sequence[int], target: int, stop_at: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """(trace, signs): the depth-first search's steps, ``+`` before ``-``, up to the first chain that reaches
    ``target`` (or, given ``stop_at``, up to that chain whatever its value: a search that stopped too early)."""
    trace: list[str] = []
    n = len(operands) - 1

    def walk(acc: int, signs: list[str]) -> list[str] | None:
        if len(signs) == n:
            hit = list(signs) == list(stop_at) if stop_at is not None else acc == target
            return list(signs) if hit else None
        x = operands[len(signs) + 1]
        for sign in "+-":
            new = acc + x if sign == "+" else acc - x
            trace.append(f"{acc}{sign}{x}={new}")
            found = walk(new, signs + [sign])
            if found is not None:
                return found
        return None

    found = walk(operands[0], [])
    if found is None:
        raise ValueError(f"no sign pattern of {operands} reaches {target}")
    return trace, found


def completion(trace: Sequence[str], signs: Sequence[str], operands: Sequence[int]) -> str:
    """``<think>trace</think>`` the chain's steps but the last, and the chain boxed."""
    recap = ";".join(chain_steps(signs, operands)[:-1])
    return f"{THINK_OPEN}{';'.join(trace)}{THINK_CLOSE}{recap}{BOX}{chain_text(signs, operands)}}}"


def random_problem(rng: random.Random, min_terms: int, max_terms: int, max_operand: int) -> str:
    n = rng.randint(min_terms, max_terms)
    operands = [rng.randint(1, max_operand) for _ in range(n)]
    signs = [rng.choice("+-") for _ in range(n - 1)]
    return "?".join(map(str, operands)) + f"={chain_value(signs, operands)}"


@register_task("target_sum")
class TargetSumTask(Task):
    def _problem(self, question: str) -> Problem:
        operands, target = parse(question)
        return Problem(id=question, question=question,
                       answer=chain_text(search(operands, target)[1], operands))

    def _draw(self, seed: int, n: int, exclude: set[str]) -> list[str]:
        lo, hi, top = int(self.cfg.min_terms), int(self.cfg.max_terms), int(self.cfg.max_operand)
        rng, seen, out = random.Random(seed), set(exclude), []
        for _ in range(50 * n):  # the attempt cap only guards tiny configs
            if len(out) == n:
                break
            q = random_problem(rng, lo, hi, top)
            if q not in seen:
                seen.add(q)
                out.append(q)
        return out

    @cached_property
    def _heldout(self) -> list[str]:
        return self._draw(self.cfg.split_seed, self.cfg.heldout_size, set())

    def heldout_problems(self) -> Sequence[Problem]:
        return [self._problem(q) for q in self._heldout]

    @cached_property
    def _train(self) -> list[Problem]:
        return [self._problem(q) for q in self._draw(self.cfg.split_seed + 1, self.cfg.train_size, set(self._heldout))]

    def train_problems(self) -> Sequence[Problem]:
        return self._train

    def worked_solution(self, problem: Problem, corrupt_rng: random.Random | None = None) -> str:
        """The search to the first chain that reaches the target; with ``corrupt_rng``, a search that stopped at a
        chain that does not (its steps right, its sum wrong), where one exists."""
        operands, target = parse(problem.question)
        stop_at = None
        if corrupt_rng is not None:
            n = len(operands) - 1
            wrong = [s for s in (format(k, f"0{n}b").replace("0", "+").replace("1", "-") for k in range(2 ** n))
                     if chain_value(s, operands) != target]
            stop_at = corrupt_rng.choice(wrong) if wrong else None
        trace, signs = search(operands, target, stop_at)
        return completion(trace, signs, operands)

    def warm_start_challenge(self, problem: Problem, rival_wrong: bool, rng: random.Random) -> str:
        """What the warm start teaches a challenger to write after a rival's recap: after a right one, with
        probability ``warm_start_reuse`` the recap's chain re-derived and finished (the recap reused), else the
        search from scratch; after a wrong one (only with ``warm_start_wrong_recaps``), the search."""
        if rival_wrong or rng.random() >= self.cfg.warm_start_reuse:
            return self.worked_solution(problem)
        operands, target = parse(problem.question)
        signs = search(operands, target)[1]
        return completion(chain_steps(signs, operands), signs, operands)

    def verify(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        out = []
        for problem, text in zip(problems, completions, strict=True):
            visible = visible_text(text)
            answers = boxed_answers(visible) if visible is not None else []
            if not answers:
                out.append(Verdict(correct=False, format_ok=False, status="no_answer"))
                continue
            chain = answers[-1].strip()
            operands, target = parse(problem.question)
            ok = len(answers) == 1 and CHAIN.fullmatch(chain) is not None
            if ok:
                numbers = [int(x) for x in re.split(r"[+-]", chain)]
                signs = [c for c in chain if c in "+-"]
                ok = numbers == operands and chain_value(signs, operands) == target
            out.append(Verdict(correct=ok, format_ok=len(answers) == 1, status="ok" if ok else "wrong"))
        return out
