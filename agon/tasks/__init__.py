"""Tasks: problems, their held-out split, and a verifier, behind one small interface and a registry by name.

A task family is a subclass of ``Task`` registered with ``@register_task("kind")``; ``build_task(cfg)`` looks it
up by ``cfg.kind`` and nothing else creates tasks. Verification takes whole batches so that a family can grade in
worker processes; it never raises for a bad completion and never returns a silent zero: every ``Verdict`` says
why it scored as it did, and ``status`` values other than ``ok``/``wrong``/``no_answer`` are counted as verifier
failures by the trainer.

``Task.recap_battery`` makes the check battery: for one problem, recaps with a known defect (or none), each with the
completions that finish it faithfully, so an evaluation can ask whether a challenger checks a recap rather than
completing it. Each task makes the kinds it can make exactly (docs/tasks.md, "The check battery").
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from random import Random
from typing import Any, Callable, ClassVar, Mapping, Sequence

from agon.tasks.text import perturb_last_number, remove_boxed, visible_text

# Statuses a verifier may return. ok/wrong/no_answer are the model's doing; the rest are the verifier's failures.
MODEL_STATUSES = ("ok", "wrong", "no_answer")
FAILURE_STATUSES = ("timeout", "error", "unscorable")


@dataclass(frozen=True)
class Problem:
    """One problem: what the model reads, and what the verifier needs to grade it."""

    id: str
    question: str
    # the gold answer as text (None for code problems, whose gold is their tests in meta)
    answer: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    correct: bool
    # the completion has a closed reasoning block and a final answer in the expected form
    format_ok: bool
    # ok | wrong | no_answer | timeout | error | unscorable
    status: str = "ok"
    detail: str = ""

    @property
    def failed(self) -> bool:
        """True when the verifier, not the model, is why this could not be scored."""
        return self.status in FAILURE_STATUSES


# the kinds of recap in the check battery, in the order tables show them
BATTERY_KINDS = ("right", "wrong_step", "dead_end", "empty")


@dataclass(frozen=True)
class BatteryRecap:
    """One recap of the check battery: its kind (``BATTERY_KINDS``), its text, and every completion that finishes
    it faithfully (continues its shown steps as they stand), which the task's verifier grades: some right for
    ``right``, none right for ``wrong_step`` and ``dead_end``; ``empty`` is finished by the worked solution."""

    kind: str
    recap: str
    finishes: tuple[str, ...]


class Task(ABC):
    """A task family. Subclasses set ``kind`` and implement the three abstract methods."""

    kind: ClassVar[str]

    def __init__(self, cfg: Any):
        self.cfg = cfg

    @abstractmethod
    def train_problems(self) -> Sequence[Problem]:
        """The training pool (disjoint from the held-out split)."""

    @abstractmethod
    def heldout_problems(self) -> Sequence[Problem]:
        """The fixed held-out split, the same in every run with the same task config."""

    @abstractmethod
    def verify(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        """Grade ``completions[i]`` against ``problems[i]``. Never raises for a bad completion."""

    def user_message(self, problem: Problem) -> str:
        return problem.question + self.cfg.instruction

    def challenge_message(self, problem: Problem, recap: str) -> str:
        return self.cfg.challenge_template.format(problem=self.user_message(problem), recap=recap)

    def strip_answer(self, visible: str) -> str:
        """The visible text with the final answer removed (math: every box; code tasks override)."""
        return remove_boxed(visible)

    def recap(self, completion: str) -> str:
        """What a challenger may read of a draft: visible text, final answer removed; empty without ``</think>``."""
        visible = visible_text(completion)
        return "" if visible is None else self.strip_answer(visible).strip()

    def worked_solution(self, problem: Problem, corrupt_rng: Random | None = None) -> str | None:
        """A reference completion for the offline world's warm start (``agon.tasks.text.worked_text``); with
        ``corrupt_rng``, a plausible wrong one (one step off, the error carried on). None: this family has none."""
        return None

    def warm_start_pair(self, problem: Problem, rival_wrong: bool, rng: Random) -> tuple[str, str | None]:
        """(rival's recap, answer) of one of the offline world's warm-start challenges: by default the recap of the
        worked solution (of a plausible wrong one when ``rival_wrong``) and the worked solution from scratch. A task
        whose answer checks the recap (target sum) draws the two together."""
        return self.recap(self.worked_solution(problem, rng if rival_wrong else None)), self.worked_solution(problem)

    def recap_battery(self, problem: Problem, solution: str, rng: Random) -> dict[str, BatteryRecap | None]:
        """For a problem and a right worked solution (its completion text), a recap of each kind, None where the
        task cannot make that kind for this problem; every key of ``BATTERY_KINDS`` is present. Deterministic given
        ``rng``.

        The default (DeepMath, CodeContests, any plugin task) knows no steps, only text: ``right`` is the recap of
        ``solution``, finished by it; ``empty`` is "", finished by ``solution``; ``wrong_step`` is the right recap
        with the last number of its last shown step moved (``agon.tasks.text.perturb_last_number``; None where the
        recap is empty or that step has no number), with no finishes: the framework cannot write a faithful finish
        of a text it changed blindly. On free text a changed number is not always a wrong recap (the last line may
        restate the problem, or name a number the answer does not rest on), which is why an evaluation reports how
        many such recaps it made, not that each is wrong. ``dead_end`` is None: a dead end needs the task's own
        search."""
        right = self.recap(solution)
        wrong = perturb_last_number(right, rng)
        return {
            "right": BatteryRecap("right", right, (solution,)),
            "wrong_step": None if wrong is None else BatteryRecap("wrong_step", wrong, ()),
            "dead_end": None,
            "empty": BatteryRecap("empty", "", (solution,)),
        }

    def close(self) -> None:
        """Release worker pools or sandboxes."""


TASKS: dict[str, type[Task]] = {}
# modules imported on first lookup, so heavy optional imports (datasets, math-verify) load only when used
_TASK_MODULES = {
    "arithmetic": "agon.tasks.arithmetic",
    "target_sum": "agon.tasks.target_sum",
    "reasoning_gym": "agon.tasks.reasoning_gym",
    "deepmath": "agon.tasks.deepmath",
    "codecontests": "agon.tasks.codecontests",
}
for _kind in _TASK_MODULES:
    TASKS.setdefault(_kind, None)  # type: ignore[arg-type]  # known name, class filled in on import


def register_task(kind: str, schema: type | None = None) -> Callable[[type[Task]], type[Task]]:
    """A class decorator: the task family ``kind`` (``task.kind``), with ``schema``, a dataclass extending
    ``agon.core.config.TaskConfig``, typing its settings (``agon.core.config.register_task_schema``). A module outside
    agon registers its own family this way and is named in ``plugins`` (docs/extending.md)."""
    def wrap(cls: type[Task]) -> type[Task]:
        if TASKS.get(kind) is not None and TASKS[kind] is not cls:
            raise ValueError(f"task kind {kind!r} is already registered to {TASKS[kind].__name__}")
        if schema is not None:
            from agon.core.config import register_task_schema

            register_task_schema(kind, schema)
        cls.kind = kind
        TASKS[kind] = cls
        return cls

    return wrap


def load_task_kind(kind: str) -> type[Task] | None:
    """The class registered for ``kind``, its module imported first when it is a built-in one not yet loaded (which
    registers its config schema too); None for a kind nobody registered."""
    if TASKS.get(kind) is None and kind in _TASK_MODULES:
        importlib.import_module(_TASK_MODULES[kind])
    return TASKS.get(kind)


def build_task(cfg: Any) -> Task:
    """The task for ``cfg.kind`` (``task.kind`` in the config)."""
    cls = load_task_kind(cfg.kind)
    if cls is None:
        raise KeyError(f"unknown task.kind {cfg.kind!r}; registered: {sorted(TASKS)}")
    return cls(cfg)
