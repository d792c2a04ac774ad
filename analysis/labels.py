"""The names readers see: one map from agon's internal names (presets, metric keys) to human labels, used by every
figure, the tables and the W&B dashboard, so that a cell is called the same everywhere. A method's label is its
registry's (``agon.core.methods``, recorded in each run's summary as ``method_label``), never a second table here.

Left out on purpose: labels of cells that the axes already spell out (``competitive · visible``): those come from
``analysis.load`` and are shown as they are.
"""

from __future__ import annotations

import re
from typing import Any

# a named preset that is a variant of a method: how a reader knows it (conf/experiment/<name>.yaml says why)
EXPERIMENT_LABELS = {
    # GRPO at Agon's rollout budget: Agon samples N drafts and N challenges per problem, GRPO gets 2N samples
    "grpo_matched": "GRPO (2N samples)",
}
# metric keys as axis and panel titles
METRIC_LABELS = {
    "eval/accuracy": "held-out pass@1",
    "eval/final_trace_tokens": "final-stage tokens",
    "eval/conversion_rate": "conversion",
    "eval/regression_rate": "regression",
    "train/accuracy": "training accuracy",
    "train/final_trace_tokens": "training trace length",
    "eval/divergence": "divergence A vs B",
    "eval/accuracy_one_generation": "one generation per answer",
    "eval/accuracy_two_generations": "two generations per answer",
}
# the check battery's kinds of recap (``agon.tasks.BATTERY_KINDS``: ``battery/<answerer>/<kind>``) and its answerers
BATTERY_LABELS = {
    "right": "right prefix",
    "wrong_step": "wrong step shown",
    "dead_end": "dead end",
    "empty": "empty recap",
}
ANSWERER_LABELS = {"A": "adapter A", "B": "adapter B", "base": "base"}


def cell_label(cell: Any) -> str:
    """A cell's label for a reader: a preset variant by its human name (``GRPO [experiment=grpo_matched]`` ->
    ``GRPO (2N samples)``), any other ``[experiment=x]`` as ``[x]``, other bracketed overrides as they are."""
    text = str(cell)
    match = re.search(r"\s*\[experiment=([^\],]+)\]", text)
    if match:
        name = match.group(1)
        human = EXPERIMENT_LABELS.get(name)
        text = text.replace(match.group(0), "") if human is None else human + text[match.end():]
        if human is None:
            text = f"{text} [{name}]"
    return text
