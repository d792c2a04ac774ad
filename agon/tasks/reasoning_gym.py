"""Any reasoning-gym dataset, by name: ``task=reasoning_gym task.name=<dataset>``.

The dataset is built with ``reasoning_gym.create_dataset(name, size=, seed=, **kwargs)``, where kwargs are
``task.dataset_defaults[name]`` (presets kept in the YAML, used only for that dataset) overridden key by key by
``task.dataset_args``. The held-out split is ``task.heldout_size`` items drawn with seed ``task.split_seed``; the
training pool is ``task.train_size`` items drawn with a different seed (``split_seed + 1``), minus any question that
is also held out. The answer is the last ``\\boxed{}`` after ``</think>``, scored by the dataset's own
``score_answer``; it is correct only when the score is exactly 1.0 (the default scorer gives partial credit), and a
scorer that raises scores 0 with ``status="error"`` (counted by the trainer).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from agon.tasks import Problem, Task, Verdict, register_task
from agon.tasks.text import last_boxed, visible_text

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
                "heldout": make(name, size=max(1, cfg.heldout_size), seed=cfg.split_seed, **kwargs),
                "train": make(name, size=cfg.train_size, seed=cfg.split_seed + 1, **kwargs),
            }
        except TypeError as e:
            raise ValueError(f"task.dataset_args {kwargs} do not fit reasoning-gym dataset {name!r}: {e}") from None
        self._heldout = [self._problem("heldout", i, e) for i, e in enumerate(self._ds["heldout"])][: cfg.heldout_size]
        held_q = {p.question for p in self._heldout}
        self._train = [
            self._problem("train", i, e) for i, e in enumerate(self._ds["train"]) if e["question"] not in held_q
        ]
        if not self._train:
            raise ValueError(f"reasoning-gym {name!r}: no training problems left outside the held-out split")
        log.info("reasoning_gym %s %s: %d train, %d held out", name, kwargs, len(self._train), len(self._heldout))

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
