"""Target sum: put ``+`` or ``-`` between given numbers, in their order, so that the chain equals a target.

A problem is ``7?3?5?2=7``: the operands in order, a ``?`` in each gap, and the target. Any sign pattern that
reaches the target is right (``7+3-5+2`` here), graded by evaluating the boxed chain. The worked solution is a
depth-first search over the gaps, ``+`` before ``-``, one step per node::

    <think>7+3=10;10+5=15;15+2=17;15-2=13;10-5=5;5+2=7</think>7+3=10;10-5=5\\boxed{7+3-5+2}

The reasoning block holds the search; the recap after it holds the found chain's steps but the last, and the box
holds the chain.

Why this task (the offline testbed where a rival's recap can matter): it is built so that checking a recap can be
cheaper than solving. Finding a chain is a search over 2^(n-1) sign patterns (up to 2^n - 2 steps with shared
prefixes); a recap states a prefix (every sign but the last), and the leaf test of the last gap (``acc+x``, then
``acc-x``) either finishes it or shows it is a dead end, in one or two steps. Whether a model finds the check
cheaper is measured (``tools/target_sum_gate.py``), not assumed: the first base, warm-started without it, picked
the last sign after a live recap at chance; this design with half its rows challenges learned the check only
together with the search; with nine rows in ten challenges (``warm_start_challenges``) the shipped base checks a
right recap 92% of the time while it solves 59% alone (docs/tasks.md).

What the warm start teaches a challenger (``warm_start_pair``), by the kind of recap it reads:

- **right** (the drafter's found chain's recap): reuse it. The trace is the leaf test below the recap's prefix, the
  same test the drafter's search does (``5+2=7``; ``5+2=7;5-2=3`` where the target is 3), so the last sign is chosen
  by computing, then the recap and the finished chain.
- **dead end** (a wrong chain's recap from which no sign pattern for the remaining gaps reaches the target): the
  leaf test shows it (both leaves miss), then the search from scratch, the drafter's own text.
- **extendable** (a wrong chain's recap that another sign still finishes: the draft erred in its last sign): the same
  answer as after a right recap, the leaf test picking the other sign. Only another right chain's prefix differs
  from the right recap as text, so where a problem has none the dead end is shown instead.

``warm_start_challenges`` of the warm start's rows are challenges (0.9 in ``experiment=target_sum``: the check is
then learned before the search from scratch is, so a base stopped between the two checks and still has a search to
learn); ``warm_start_wrong_recaps`` (0.3) of the challenges read a wrong recap, half of them the extendable kind
where the problem has one (about one 4-operand problem in five does), so about 27% dead ends and 3% extendable; the
rest read a right one (``warm_start_reuse``, 1.0: always reused; below 1 the rest search from scratch, the first
design).
Right recaps stay the majority because choosing the last sign is what the first base could not do; dead ends are
shown often enough to teach the switch from checking to searching, while the search after it is only as good as a
solo draft, which is what RL is left to improve (with the drafter's own search).

The check battery (``recap_battery``) asks a trained challenger to answer after a right recap, a dead end, a recap
whose last step's result is wrong, and none, each with the completions that continue it as it stands.

Left out on purpose: countdown's other operations and free order. Multiplication alone walls off a model this
size (reasoning-gym's products start near 20% after a long warm start), and free order makes the search
factorial, which no short trace holds. Skipping the refuted subtree in the search after a dead end: it would save
two steps, and a search that is the drafter's own text is one skill instead of two.
"""

from __future__ import annotations

import itertools
import random
import re
from functools import cached_property
from typing import Sequence

from agon.tasks import BatteryRecap, Problem, Task, Verdict, register_task
from agon.tasks.text import BOX, THINK_CLOSE, THINK_OPEN, boxed_answers, visible_text

CHAIN = re.compile(r"\d+(?:[+-]\d+)*")
# the warm start's design, part of the world key (agon.models.world): the shares are keys, the texts are code, and a
# cache built by another design must not load (1: reuse half the right recaps, no wrong ones; 2: check every recap)
WARM_START_DESIGN = 2
# share of the warm start's wrong recaps that are extendable where the problem has one (else a dead end): half, so
# the check's other outcome (the leaf test picking the sign the draft missed) is shown beside the refutation
EXTENDABLE_SHARE = 0.5


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


def search(operands: Sequence[int], target: int, stop_at: Sequence[str] | None = None,
           prefix: Sequence[str] = ()) -> tuple[list[str], list[str] | None]:
    """(trace, signs): the depth-first search's steps, ``+`` before ``-``, up to the first chain that reaches
    ``target`` (or, given ``stop_at``, up to that chain whatever its value: a search that stopped too early).
    ``prefix``: the search below those first signs only (the check of a recap), signs None where nothing below them
    reaches the target; the whole search raises instead, since every problem drawn here has a chain."""
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

    found = walk(chain_value(prefix, operands), list(prefix))
    if found is None and not prefix:
        raise ValueError(f"no sign pattern of {operands} reaches {target}")
    return trace, found


def live(operands: Sequence[int], target: int, prefix: Sequence[str]) -> bool:
    """Whether some signs for the gaps after ``prefix`` reach ``target`` (else the prefix is a dead end)."""
    return search(operands, target, prefix=prefix)[1] is not None


def recap_text(prefix: Sequence[str], operands: Sequence[int]) -> str:
    """The recap of any chain whose signs begin with ``prefix`` (one sign short of the chain): the prefix's steps."""
    return ";".join(chain_steps(prefix, operands))


def completion(trace: Sequence[str], signs: Sequence[str], operands: Sequence[int], recap: str | None = None) -> str:
    """``<think>trace</think>`` the chain's steps but the last (or ``recap``, a recap as read), and the chain boxed."""
    recap = recap_text(signs[:-1], operands) if recap is None else recap
    return f"{THINK_OPEN}{';'.join(trace)}{THINK_CLOSE}{recap}{BOX}{chain_text(signs, operands)}}}"


def leaf_finishes(operands: Sequence[int], target: int, prefix: Sequence[str], acc: int, recap: str,
                  hits_only: bool) -> tuple[str, ...]:
    """The completions that finish ``recap`` (a recap stating ``prefix`` whose last step reads ``acc``) as it
    stands: for each last sign, ``+`` first, the leaf test from ``acc`` as far as that sign, ``recap`` and the chain
    boxed; with ``hits_only``, only the signs whose leaf (as computed from ``acc``) reaches ``target``."""
    x, trace, out = operands[len(prefix) + 1], [], []
    for sign in "+-":
        leaf = acc + x if sign == "+" else acc - x
        trace.append(f"{acc}{sign}{x}={leaf}")
        if leaf == target or not hits_only:
            out.append(completion(trace, [*prefix, sign], operands, recap))
    return tuple(out)


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

    def recap_kinds(self, problem: Problem) -> dict[str, list[tuple[str, ...]]]:
        """The prefixes a recap of this problem can state (every sign but the last), by kind: ``right`` (the
        worked solution's), ``extendable`` (another prefix that a last sign still finishes: a wrong chain's recap
        when that chain erred in its last sign, its text never the right recap's) and ``dead_end`` (no last sign
        reaches the target)."""
        operands, target = parse(problem.question)
        right = tuple(search(operands, target)[1][:-1])
        kinds: dict[str, list[tuple[str, ...]]] = {"right": [right], "extendable": [], "dead_end": []}
        for prefix in itertools.product("+-", repeat=len(operands) - 2):
            if prefix != right:
                kinds["extendable" if live(operands, target, prefix) else "dead_end"].append(prefix)
        return kinds

    def answer_recap(self, problem: Problem, prefix: Sequence[str]) -> str:
        """The challenger's answer to a recap stating ``prefix``: the search below it (the leaf test of the last
        gap where the recap is one sign short) and, where it finishes the chain, the recap reused and the chain
        boxed; where it shows a dead end, the search from scratch after it and its chain."""
        operands, target = parse(problem.question)
        check, signs = search(operands, target, prefix=prefix)
        if signs is not None:
            return completion(check, signs, operands)
        trace, signs = search(operands, target)
        return completion(check + trace, signs, operands)

    def warm_start_pair(self, problem: Problem, rival_wrong: bool, rng: random.Random) -> tuple[str, str]:
        """(recap, answer) for one of the warm start's challenges (``agon.models.world``): after a right recap its
        reuse (``warm_start_reuse`` of the time, else the search from scratch); after a wrong one, an extendable recap
        (half the time, where the problem has one) or a dead end, answered by ``answer_recap``. The module's
        docstring says why these shares."""
        kinds, operands = self.recap_kinds(problem), parse(problem.question)[0]
        prefix = kinds["right"][0]
        if rival_wrong:
            extend = rng.random() < EXTENDABLE_SHARE
            prefix = rng.choice(kinds["extendable"] if extend and kinds["extendable"] else kinds["dead_end"]
                                or kinds["extendable"] or [prefix])
        elif rng.random() >= self.cfg.warm_start_reuse:
            return recap_text(prefix, operands), self.worked_solution(problem)
        return recap_text(prefix, operands), self.answer_recap(problem, prefix)

    def recap_battery(self, problem: Problem, solution: str,
                      rng: random.Random) -> dict[str, BatteryRecap | None]:
        """The check battery (``Task.recap_battery``), each finish of a recap that shows steps written as the leaf
        test of the last gap from the running value the recap's last step reads (``leaf_finishes``):

        - ``right``: the worked solution's recap, finished by the last sign that reaches the target.
        - ``dead_end``: a dead-end prefix drawn with ``rng`` (``recap_kinds``), finished by both last signs, neither
          of which reaches the target; None where every prefix is live.
        - ``wrong_step``: the right recap with its last step's result wrong (``10-5=9`` for ``10-5=5``), finished by
          the sign whose leaf, computed from the wrong value, reaches the target. That chain truly misses: the
          right value reaches the target with the other sign, and both signs cannot (operands are positive). Only
          this wrong value (off by twice the last operand) makes a wrong step: from any other the leaf test shows a
          dead end, whose finishes box each last sign, the right chain among them. None where the recap shows no
          step (two operands).
        - ``empty``: "", finished by ``solution``.

        The right and wrong recaps do not depend on ``rng``; only the dead end is drawn."""
        operands, target = parse(problem.question)
        kinds, last = self.recap_kinds(problem), operands[-1]
        right = kinds["right"][0]
        right_recap = recap_text(right, operands)
        value = chain_value(right, operands)
        battery: dict[str, BatteryRecap | None] = {
            "right": BatteryRecap("right", right_recap,
                                  leaf_finishes(operands, target, right, value, right_recap, hits_only=True)),
            "wrong_step": None,
            "dead_end": None,
            "empty": BatteryRecap("empty", "", (solution,)),
        }
        if kinds["dead_end"]:
            dead = rng.choice(kinds["dead_end"])
            dead_recap = recap_text(dead, operands)
            battery["dead_end"] = BatteryRecap("dead_end", dead_recap, leaf_finishes(
                operands, target, dead, chain_value(dead, operands), dead_recap, hits_only=False))
        if right:
            # the one wrong value from which the other last sign's leaf reaches the target
            wrong = target + last if value + last == target else target - last
            steps = chain_steps(right, operands)
            recap = ";".join(steps[:-1] + [steps[-1].rpartition("=")[0] + f"={wrong}"])
            battery["wrong_step"] = BatteryRecap("wrong_step", recap,
                                                 leaf_finishes(operands, target, right, wrong, recap, hits_only=True))
        return battery

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
