"""What a method is, in one place: its adapters, who plays which role in a training step, what is played at
evaluation and which orders make the headline, whether it trains, and which ablation axes apply to it.

Every other module asks the method registered under ``method.name`` (``get_method``) and never compares the name
itself: the trainer asks for the step's ``Turn``, the cascade for the ``Evaluation``, ``Policies`` for the adapters,
the config check for the registered names, the run for whether to train, and ``summary.json`` records ``axes`` and
``label`` so that ``analysis/`` can name and pool cells without its own tables.

Adding a method is one subclass here (or in your own module, imported before the run):

    @register_method
    class Debate(Method):
        name, label, adapters, axes = "debate", "debate", ("A", "B"), ("reward", "exchange")
        def turn(self, rotation, step): return Turn("A", "B")
        def evaluation(self, rotation): return Evaluation([("A", "B")], ["A>B"])

Adapter names are the ones ``Policies`` creates; ``None`` is the untrained base model.

Left out on purpose: methods with more than two stages per round (a tournament of three adapters would need a
longer ``Game``); the draft-and-challenge round is what every method here plays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agon.core.registry import Registry

# the ablation axes a method may take, each a config group: reward.name, exchange.mode, rotation.mode, init.mode
AXES = ("reward", "exchange", "rotation", "init")

# who plays a stage: an adapter name, None for the base model
Player = str | None


@dataclass(frozen=True)
class Turn:
    """The roles of one training step. ``challenger`` False: drafts only, nobody answers (vanilla GRPO)."""

    drafter: Player
    challenger: Player | bool


@dataclass(frozen=True)
class Evaluation:
    """What evaluation plays: (drafter, answerer) pairs (answerer False: drafts only), and the order names whose
    final answers make the headline ``eval/accuracy`` (``A>B``, ``A``, ``base>base``; see ``cascade.order_name``)."""

    plays: list[tuple[Player, Player | bool]]
    headline: list[str]

    def reads(self) -> list[tuple[Player, Player]]:
        """The controls at equal generations that no play already scores: (drafter, reader) for every drafter
        reading its own drafts (the self-cascade) and every other drafter's (the cross cascades), self first. Each
        is answered on the drafts of the drafter's first play, so a self-cascade and a cross cascade answer the
        very same drafts, and each costs one answer per row (``eval.equal_generations``)."""
        drafters = list(dict.fromkeys(d for d, _ in self.plays))
        answered = {(d, a) for d, a in self.plays if a is not False}
        return [(d, r) for d in drafters for r in sorted(drafters, key=lambda x: x != d) if (d, r) not in answered]


class Method:
    """A method of the study. Subclasses set the class attributes and the two methods; ``register_method`` adds
    an instance to ``METHODS``."""

    # the value of method.name
    name: ClassVar[str]
    # how tables and figures name it
    label: ClassVar[str]
    # the LoRA adapters it owns (each with its own optimizer)
    adapters: ClassVar[tuple[str, ...]] = ("A",)
    # False: evaluated untrained (method.train is ignored)
    trains: ClassVar[bool] = True
    # the ablation axes (a subset of AXES) whose value changes what this method does
    axes: ClassVar[tuple[str, ...]] = ()
    # compared against, not the method under study: drawn in its own colour, not in the 2x2 grid
    baseline: ClassVar[bool] = True

    def turn(self, rotation: str, step: int) -> Turn:
        """Who drafts and who challenges at training step ``step`` under ``rotation.mode``."""
        raise NotImplementedError(f"method {self.name!r} does not train")

    def evaluation(self, rotation: str) -> Evaluation:
        raise NotImplementedError


METHODS: Registry[Method] = Registry("method.name")


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator: register one instance of ``cls`` under ``cls.name``."""
    unknown = set(cls.axes) - set(AXES)
    if unknown:
        raise ValueError(f"method {cls.name!r}: unknown axes {sorted(unknown)}; choose from {list(AXES)}")
    METHODS.register(cls.name)(cls())
    return cls


def get_method(name: str) -> Method:
    return METHODS.get_or_raise(name)


@register_method
class Agon(Method):
    """Two adapters play draft-and-challenge; the rival's outcome grades the draft. Both train every step."""

    name, label, adapters, baseline = "agon", "Agon", ("A", "B"), False
    axes = ("reward", "exchange", "rotation", "init")

    def turn(self, rotation: str, step: int) -> Turn:
        # alternate: A drafts on even steps, B on odd; fixed: A always drafts
        return Turn("A", "B") if rotation == "fixed" or step % 2 == 0 else Turn("B", "A")

    def evaluation(self, rotation: str) -> Evaluation:
        # both orders are played (the solo rows come from their drafts); fixed roles are deployed as trained
        return Evaluation([("A", "B"), ("B", "A")], ["A>B", "B>A"] if rotation == "alternate" else ["A>B"])


@register_method
class SelfRefine(Method):
    """One adapter plays both roles: it drafts, then answers its own recap."""

    name, label = "self_refine", "self-refine"
    axes = ("reward", "exchange")

    def turn(self, rotation: str, step: int) -> Turn:
        return Turn("A", "A")

    def evaluation(self, rotation: str) -> Evaluation:
        return Evaluation([("A", "A")], ["A>A"])


@register_method
class VanillaGRPO(Method):
    """One adapter drafts alone on the plain prompt, rewarded by correctness."""

    name, label = "grpo", "GRPO"

    def turn(self, rotation: str, step: int) -> Turn:
        return Turn("A", False)

    def evaluation(self, rotation: str) -> Evaluation:
        return Evaluation([("A", False)], ["A"])


@register_method
class MixtureOfAgents(Method):
    """The untrained base runs the cascade: it drafts, then answers its own recap. Nothing trains."""

    name, label, trains = "moa", "MoA (untrained)", False
    axes = ("exchange",)

    def evaluation(self, rotation: str) -> Evaluation:
        return Evaluation([(None, None)], ["base>base"])
