"""Text surgery shared by every task: the visible part of a completion, boxed answers, the recap.

A completion looks like ``<think>reasoning</think>visible text \\boxed{answer}``. The visible part is what follows
the last ``</think>``; a completion without a closed reasoning block has no visible part at all (a format
failure, as DeepMath scores it). Boxes are found by a balanced-brace scan because a regex breaks on
``\\boxed{\\frac{1}{2}}``. ``worked_text`` writes the offline world's reference completions in that shape.
``perturb_last_number`` writes the check battery's generic wrong recap (``agon.tasks.Task.recap_battery``).

Left out on purpose: any parse of the math itself. The perturbation is text surgery on the last number of the last
step; whether the changed text is a wrong step (and not, say, a restated given) is for a task that knows its steps.
"""

from __future__ import annotations

import re
from decimal import Decimal, localcontext
from random import Random

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
BOX = "\\boxed{"
# an unsigned decimal numeral: a minus before it stays where it is, so "7-3" never reads as 7 and -3
NUMBER = re.compile(r"\d+(?:\.\d+)?")
# how far a corrupted step is off: the plausible slips of a worked step (a wrong rival in the warm start, the check
# battery's wrong recaps, ``perturb_last_number``)
SLIPS = (-10, -2, -1, 1, 2, 10)


def visible_text(completion: str) -> str | None:
    """The text after the last ``</think>``, or None when the reasoning block never closed."""
    head, sep, tail = completion.rpartition(THINK_CLOSE)
    return tail if sep else None


def box_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every top-level, balanced ``\\boxed{...}``; an unclosed box runs to the end of the text."""
    spans: list[tuple[int, int]] = []
    i = text.find(BOX)
    while i != -1:
        depth, j = 1, i + len(BOX)
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        spans.append((i, j))
        i = text.find(BOX, j)
    return spans


def boxed_answers(text: str) -> list[str]:
    """Contents of every top-level box, in order (an unclosed box yields its partial content)."""
    out = []
    for start, end in box_spans(text):
        inner = text[start + len(BOX) : end]
        out.append(inner[:-1] if inner.endswith("}") else inner)
    return out


def last_boxed(text: str) -> str | None:
    answers = boxed_answers(text)
    return answers[-1] if answers else None


def final_answer(completion: str) -> str | None:
    """The answer a completion commits to: its visible text's last box, whitespace-stripped; None without one (or
    without a closed reasoning block). Compared as text, where two policies agree or differ (``eval/agree_*``)."""
    visible = visible_text(completion)
    box = None if visible is None else last_boxed(visible)
    return None if box is None else box.strip()


def remove_boxed(text: str) -> str:
    """The text with every ``\\boxed{...}`` cut out (balanced braces, so nested ones go too)."""
    out, last = [], 0
    for start, end in box_spans(text):
        out.append(text[last:start])
        last = end
    out.append(text[last:])
    return "".join(out)


def worked_text(steps: list[str], answer: str) -> str:
    """A reference completion in the offline world's format: every step in ``<think>``, a recap of all steps but
    the last after it (partial results a rival can check or reuse, never the answer), and the answer boxed."""
    return f"{THINK_OPEN}{';'.join(steps)}{THINK_CLOSE}{';'.join(steps[:-1])}{BOX}{answer}}}"


def last_step_span(recap: str) -> tuple[int, int] | None:
    """(start, end) of a recap's last shown step: its last non-blank line where it has line breaks (free text), else
    its last non-blank ``;``-separated step (the offline worlds' recaps); None for a blank recap."""
    sep = "\n" if "\n" in recap else ";"
    end = len(recap)
    while end > 0:
        start = recap.rfind(sep, 0, end) + 1
        if recap[start:end].strip():
            return start, end
        end = start - 1
    return None


def perturb_last_number(recap: str, rng: Random) -> str | None:
    """The recap with the last number of its last shown step (``last_step_span``) moved by a nonzero slip drawn
    from ``SLIPS`` with ``rng``, every other character as it was; None when the recap is blank or its last
    step has no number. The numeral's magnitude moves and stays non-negative (its sign, if any, is the text before
    it), and a decimal keeps its digits after the point (``3.14`` -> ``4.14``)."""
    span = last_step_span(recap)
    numbers = [] if span is None else list(NUMBER.finditer(recap, *span))
    if not numbers:
        return None
    number = numbers[-1]
    with localcontext() as exact:
        exact.prec = len(number.group()) + 2  # the default 28 digits would round a longer numeral
        value = Decimal(number.group())
        new = value + rng.choice([slip for slip in SLIPS if value + slip >= 0])
    # fixed-point: str() writes 1E-7 for a small enough result
    return recap[: number.start()] + format(new, "f") + recap[number.end() :]
