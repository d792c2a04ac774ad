"""A method of its own: A always drafts and B always answers (fixed roles whatever ``rotation`` says), evaluated in
the one order it trains."""

from __future__ import annotations

from agon.core.methods import Evaluation, Method, Turn, register_method


@register_method
class Relay(Method):
    name, label, adapters, baseline = "relay", "relay", ("A", "B"), False
    axes = ("reward", "exchange")

    def turn(self, rotation: str, step: int) -> Turn:
        return Turn("A", "B")

    def evaluation(self, rotation: str) -> Evaluation:
        return Evaluation([("A", "B")], ["A>B"])
