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
"""

from __future__ import annotations

import logging
import random
import re
from typing import Any, Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from agon.tasks import Problem, Task, Verdict, register_task
from agon.tasks.arithmetic import SLIPS
from agon.tasks.arithmetic import worked_solution as arithmetic_solution
from agon.tasks.text import last_boxed, visible_text, worked_text

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


def _products(entry: dict, corrupt_rng: random.Random | None) -> str | None:
    """``42 * 25``: ``42*5=210;42*20=840;210+840=1050``; None for negative factors."""
    try:
        factors = [int(f) for f in str(entry["metadata"]["expression"]).split("*")]
    except (KeyError, ValueError):
        return None
    if any(f < 0 for f in factors):
        return None
    steps, answer = _product_steps(factors)
    if corrupt_rng is not None:
        steps, answer = _product_steps(factors, corrupt_rng.randrange(len(steps)), corrupt_rng)
    return worked_text(steps, str(answer))


def _additions(entry: dict, corrupt_rng: random.Random | None) -> str | None:
    """``5 - 3 - 6``: the built-in arithmetic's steps; None for negatives or parentheses."""
    expr = str(entry.get("metadata", {}).get("expression", "")).replace(" ", "")
    if not re.fullmatch(r"\d+([+-]\d+)+", expr):
        return None
    return arithmetic_solution(expr, corrupt_rng)


# dataset name -> (entry, corrupt_rng) -> reference completion, or None where the entry is outside its reach
WORKED_SOLUTIONS: dict[str, Callable[[dict, random.Random | None], str | None]] = {
    "products": _products,
    "basic_arithmetic": _additions,
    "chain_sum": _additions,
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
