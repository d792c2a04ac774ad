"""Any reasoning-gym dataset, by name: ``task=reasoning_gym task.name=<dataset>``.

The dataset is built with ``reasoning_gym.create_dataset(name, size=, seed=, **kwargs)``, where kwargs are
``task.dataset_defaults[name]`` (presets kept in the YAML, used only for that dataset) overridden key by key by
``task.dataset_args``. The held-out split is ``task.heldout_size`` items drawn with seed ``task.split_seed``; the
training pool is ``task.train_size`` items drawn with a different seed (``split_seed + 1``), minus any question that
is also held out. The answer is the last ``\\boxed{}`` after ``</think>``, scored by the dataset's own
``score_answer``; it is correct only when the score is exactly 1.0 (the default scorer gives partial credit), and a
scorer that raises scores 0 with ``status="error"`` (counted by the trainer).

``worked_solution`` gives the offline world its reference completions (``task.warm_start=own`` warm-starts the
tiny model on the dataset's own training items): step by step for the datasets in ``WORKED_SOLUTIONS``
(``products``: long multiplication, one partial product per digit, then their sums; ``basic_arithmetic`` and
``chain_sum``: left to right, as the built-in arithmetic), and for any other dataset the bare answer in the
reasoning block, so its recap is empty and the visible exchange carries nothing. Left out on purpose: worked
solutions for datasets whose reasoning is not a chain of small computations (puzzles, graphs, text games); add
one to ``WORKED_SOLUTIONS`` to give a dataset a stepwise warm start.

The check battery's wrong step (``recap_battery``) is, for the same three datasets, the worked solution with the
last step its recap shows slipped and the error carried to the answer (``WRONG_LAST_SHOWN_STEP``); any other dataset
gets the default text perturbation, which on a bare-answer recap makes nothing.
"""

from __future__ import annotations

import logging
import random
import re
from typing import Any, Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from agon.tasks import BatteryRecap, Problem, Task, Verdict, register_task
from agon.tasks.arithmetic import worked_solution as arithmetic_solution
from agon.tasks.arithmetic import wrong_last_shown_step as arithmetic_wrong_step
from agon.tasks.text import SLIPS, last_boxed, visible_text, worked_text

log = logging.getLogger(__name__)


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def dataset_kwargs(cfg: Any) -> dict:
    kwargs = dict(_plain(cfg.get("dataset_defaults", {})).get(cfg.name) or {})
    kwargs.update(_plain(cfg.dataset_args))
    for reserved in ("size", "seed"):
        if reserved in kwargs:
            raise ValueError(
                f"task.dataset_args.{reserved} is set by agon (task.train_size / task.heldout_size, task.split_seed)"
            )
    # YAML gives lists where reasoning-gym's configs expect tuples (e.g. basic_arithmetic's operators)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}


def _product_steps(factors: list[int], bad: int = -1, rng: random.Random | None = None) -> tuple[list[str], int]:
    """Long multiplication left to right over the factors; step ``bad`` (if any) off by a small amount, the error
    carried into every later step."""
    steps: list[str] = []

    def slip() -> int:
        return rng.choice(SLIPS) if rng is not None and len(steps) == bad else 0

    acc = factors[0]
    for right in factors[1:]:
        parts = []
        for term in [int(d) * 10**place for place, d in enumerate(reversed(str(right))) if d != "0"] or [0]:
            parts.append(acc * term + slip())
            steps.append(f"{acc}*{term}={parts[-1]}")
        total = parts[0]
        for part in parts[1:]:
            new = total + part + slip()
            steps.append(f"{total}+{part}={new}")
            total = new
        acc = total
    return steps, acc


def _factors(entry: dict) -> list[int] | None:
    """The factors of a products entry (``42 * 25``); None where they are not all non-negative integers."""
    try:
        factors = [int(f) for f in str(entry["metadata"]["expression"]).split("*")]
    except (KeyError, ValueError):
        return None
    return None if any(f < 0 for f in factors) else factors


def _products(entry: dict, corrupt_rng: random.Random | None) -> str | None:
    """``42 * 25``: ``42*5=210;42*20=840;210+840=1050``; None for negative factors."""
    factors = _factors(entry)
    if factors is None:
        return None
    steps, answer = _product_steps(factors)
    if corrupt_rng is not None:
        steps, answer = _product_steps(factors, corrupt_rng.randrange(len(steps)), corrupt_rng)
    return worked_text(steps, str(answer))


def _products_wrong_step(entry: dict, rng: random.Random) -> str | None:
    """``_products`` with the last step its recap shows off by a slip, carried through the hidden last step
    (``42*20=841`` then ``210+841=1051``); None for negative factors, a recap that shows no step (``42 * 50``), or
    a slip the last step erases (a product by 0)."""
    factors = _factors(entry)
    if factors is None:
        return None
    steps, answer = _product_steps(factors)
    # with one step the recap shows none: step -1 slips nothing and the answer stays right
    steps, wrong = _product_steps(factors, len(steps) - 2, rng)
    return worked_text(steps, str(wrong)) if wrong != answer else None


def _expression(entry: dict) -> str | None:
    """A sum's expression without spaces (``5-3-6``); None for negatives or parentheses."""
    expr = str(entry.get("metadata", {}).get("expression", "")).replace(" ", "")
    return expr if re.fullmatch(r"\d+([+-]\d+)+", expr) else None


def _additions(entry: dict, corrupt_rng: random.Random | None) -> str | None:
    """``5 - 3 - 6``: the built-in arithmetic's steps; None for negatives or parentheses."""
    expr = _expression(entry)
    return None if expr is None else arithmetic_solution(expr, corrupt_rng)


def _additions_wrong_step(entry: dict, rng: random.Random) -> str | None:
    """The built-in arithmetic's wrong step (``agon.tasks.arithmetic.wrong_last_shown_step``)."""
    expr = _expression(entry)
    return None if expr is None else arithmetic_wrong_step(expr, rng)


# dataset name -> (entry, corrupt_rng) -> reference completion, or None where the entry is outside its reach
WORKED_SOLUTIONS: dict[str, Callable[[dict, random.Random | None], str | None]] = {
    "products": _products,
    "basic_arithmetic": _additions,
    "chain_sum": _additions,
}
# dataset name -> (entry, rng) -> the check battery's wrong step: the reference completion with the last step its
# recap shows off by a slip and the error carried to a wrong answer; None where the recap shows no step
WRONG_LAST_SHOWN_STEP: dict[str, Callable[[dict, random.Random], str | None]] = {
    "products": _products_wrong_step,
    "basic_arithmetic": _additions_wrong_step,
    "chain_sum": _additions_wrong_step,
}


@register_task("reasoning_gym")
class ReasoningGymTask(Task):
    def __init__(self, cfg: Any):
        super().__init__(cfg)
        import reasoning_gym

        name = cfg.name
        if name not in reasoning_gym.factory.DATASETS:
            raise ValueError(
                f"task.name={name!r} is not a reasoning-gym dataset; "
                f"choose one of {sorted(reasoning_gym.factory.DATASETS)}"
            )
        kwargs = dataset_kwargs(cfg)
        try:
            make = reasoning_gym.create_dataset
            self._ds = {
                # twice the size asked for, so that the held-out split still fills after repeats are dropped (an item
                # depends on the seed and its index only: the first heldout_size items are the same at any size)
                "heldout": make(name, size=max(1, 2 * cfg.heldout_size), seed=cfg.split_seed, **kwargs),
                "train": make(name, size=cfg.train_size, seed=cfg.split_seed + 1, **kwargs),
            }
        except TypeError as e:
            raise ValueError(f"task.dataset_args {kwargs} do not fit reasoning-gym dataset {name!r}: {e}") from None
        # each question once in its split, and none in both: reasoning-gym draws items independently, so a small space
        # repeats them (38 of 100 held-out one-digit products did); a repeat would count one problem twice in
        # pass@1 and let training see a held-out question
        self._heldout = self._distinct("heldout", self._ds["heldout"], set())[: cfg.heldout_size]
        held_q = {p.question for p in self._heldout}
        self._train = self._distinct("train", self._ds["train"], held_q)
        if not self._train:
            raise ValueError(f"reasoning-gym {name!r}: no training problems left outside the held-out split")
        log.info("reasoning_gym %s %s: %d train, %d held out", name, kwargs, len(self._train), len(self._heldout))

    def _distinct(self, split: str, entries: Any, exclude: set[str]) -> list[Problem]:
        """The entries as problems, each question once and none of ``exclude``, in their order."""
        seen, out = set(exclude), []
        for i, e in enumerate(entries):
            if e["question"] not in seen:
                seen.add(e["question"])
                out.append(self._problem(split, i, e))
        return out

    def _problem(self, split: str, index: int, entry: dict) -> Problem:
        answer = entry.get("answer")
        return Problem(
            f"{self.cfg.name}/{split}/{index}",
            entry["question"],
            None if answer is None else str(answer),
            {"split": split, "index": index, "entry": entry},
        )

    def train_problems(self) -> Sequence[Problem]:
        return self._train

    def heldout_problems(self) -> Sequence[Problem]:
        return self._heldout

    def worked_solution(self, problem: Problem, corrupt_rng: random.Random | None = None) -> str | None:
        """Stepwise where ``WORKED_SOLUTIONS`` knows the dataset, else the bare answer (an empty recap)."""
        if problem.answer is None:
            return None
        write = WORKED_SOLUTIONS.get(self.cfg.name)
        text = write(problem.meta["entry"], corrupt_rng) if write else None
        return text if text is not None else worked_text([problem.answer], problem.answer)

    def recap_battery(self, problem: Problem, solution: str,
                      rng: random.Random) -> dict[str, BatteryRecap | None]:
        """The check battery (``Task.recap_battery``). For a dataset in ``WRONG_LAST_SHOWN_STEP``: ``right``, the
        recap of ``solution``, finished by it; ``wrong_step``, the worked solution with the last step its recap
        shows off by a slip, finished by that completion (the wrong value carried to a wrong answer, graded by the
        dataset's ``score_answer``), None where the recap shows no step; ``dead_end`` None (sums and long
        multiplication have none); ``empty``, "", finished by ``solution``. Any other dataset: the default."""
        write = WRONG_LAST_SHOWN_STEP.get(self.cfg.name)
        if write is None:
            return super().recap_battery(problem, solution, rng)
        wrong = write(problem.meta["entry"], rng)
        return {
            "right": BatteryRecap("right", self.recap(solution), (solution,)),
            "wrong_step": None if wrong is None else BatteryRecap("wrong_step", self.recap(wrong), (wrong,)),
            "dead_end": None,
            "empty": BatteryRecap("empty", "", (solution,)),
        }

    def verify(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        return [self._verify_one(p, c) for p, c in zip(problems, completions, strict=True)]

    def _verify_one(self, problem: Problem, completion: str) -> Verdict:
        visible = visible_text(completion)
        answer = None if visible is None else last_boxed(visible)
        if answer is None:
            return Verdict(False, False, "no_answer", "no \\boxed{} answer after </think>")
        ds = self._ds[problem.meta["split"]]
        try:
            score = ds.score_answer(answer.strip(), problem.meta["entry"])
        except Exception as e:  # some scorers raise on malformed answers: counted, never a silent zero
            return Verdict(False, True, "error", f"score_answer raised {type(e).__name__}: {str(e)[:200]}")
        if score == 1.0:
            return Verdict(True, True, "ok", "")
        return Verdict(False, True, "wrong", f"score {score!r}")
