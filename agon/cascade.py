"""Held-out evaluation as the method is deployed: the cascade, each adapter alone, and the rates between them.

For Agon, one adapter drafts and the other reads the recap and gives the final answer; both orders are scored
(``A>B`` and ``B>A``). pass@1 is the mean correctness of the final answer over ``eval.samples`` samples per problem.
The drafts of a cascade are each adapter alone on the plain prompt, so solo accuracy comes from the same samples.
Conversion is P(final right | draft wrong) and regression P(final wrong | draft right), pooled over the headline
orders. The headline (``eval/accuracy``) is, per method:

    agon         mean of A>B and B>A (rotation=alternate); A>B (rotation=fixed)
    self_refine  A>A: one adapter drafts and answers its own recap
    moa          base>base: the untrained base run as the cascade
    grpo         A alone

The second stage sees the recap under ``exchange=visible`` and the plain prompt under ``exchange=hidden``, the same
information it had in training. Keys that do not apply to a method are None (null in summary.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from agon.policies import Policies
from agon.rollout import Game, Sampling, play
from agon.tasks import Problem, Task

NAMES = {None: "base"}


def _name(adapter: str | None) -> str:
    return NAMES.get(adapter, adapter)  # type: ignore[arg-type]


def pipelines(method: str, rotation: str) -> tuple[list[tuple[str | None, str | None | bool]], list[str]]:
    """(the (drafter, answerer) pairs to play, the headline order names). ``False`` answerer: drafts only."""
    if method == "agon":
        return [("A", "B"), ("B", "A")], (["A>B", "B>A"] if rotation == "alternate" else ["A>B"])
    if method == "self_refine":
        return [("A", "A")], ["A>A"]
    if method == "moa":
        return [(None, None)], ["base>base"]
    if method == "grpo":
        return [("A", False)], ["A"]
    raise KeyError(f"unknown method {method!r}")


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    rows: list[dict[str, Any]]
    games: dict[str, Game]


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def evaluate(policies: Policies, task: Task, cfg: Any, problems: Sequence[Problem], step: int,
             phase: str) -> EvalResult:
    """Play every pipeline of ``cfg.method`` on ``problems`` x ``cfg.eval.samples``; metrics and eval.jsonl rows."""
    e = cfg.eval
    sampling = Sampling.from_config(e, e.batch_size)
    plays, headline = pipelines(cfg.method.name, cfg.rotation.mode)
    rows: list[dict[str, Any]] = []
    games: dict[str, Game] = {}
    final_acc: dict[str, float] = {}
    solo_acc: dict[str, float] = {}
    failures = 0
    for drafter, answerer in plays:
        game = play(policies, task, cfg.model, problems, drafter=drafter, challenger=answerer,
                    exchange=cfg.exchange.mode, group_size=e.samples, sampling=sampling)
        order = _name(drafter) if answerer is False else f"{_name(drafter)}>{_name(answerer)}"
        games[order] = game
        for i, rnd in enumerate(game.rounds):
            stages = [("final" if answerer is False else "draft", rnd.draft)]
            if rnd.challenge is not None:
                stages.append(("final", rnd.challenge))
            for stage, attempt in stages:
                failures += attempt.verdict.failed
                rows.append({"step": step, "phase": phase, "order": order, "stage": stage,
                             "problem_id": rnd.problem.id, "sample": i % e.samples,
                             "correct": attempt.verdict.correct, "format_ok": attempt.verdict.format_ok,
                             "tokens": attempt.completion.n_tokens, "status": attempt.verdict.status})
            if answerer is not False:  # the draft is the drafter alone on the plain prompt
                rows.append({**rows[-2], "order": _name(drafter), "stage": "final"})
        finals = [r for r in rows if r["order"] == order and r["stage"] == "final"]
        final_acc[order] = _mean([float(r["correct"]) for r in finals])  # type: ignore[assignment]
        solo = [r for r in rows if r["order"] == _name(drafter) and r["stage"] == "final"]
        solo_acc.setdefault(_name(drafter), _mean([float(r["correct"]) for r in solo]))  # type: ignore[arg-type]

    head_final = [r for r in rows if r["order"] in headline and r["stage"] == "final"]
    head_draft = [r for r in rows if r["order"] in headline and r["stage"] == "draft"]
    conv = [float(f["correct"]) for d, f in zip(head_draft, _finals_of(head_draft, head_final)) if not d["correct"]]
    regr = [float(not f["correct"]) for d, f in zip(head_draft, _finals_of(head_draft, head_final)) if d["correct"]]
    metrics = {
        "eval/accuracy": _mean([final_acc[o] for o in headline]),
        "eval/final_trace_tokens": _mean([float(r["tokens"]) for r in head_final]),
        "eval/n_problems": len(problems),
        "eval/samples": e.samples,
        "eval/cascade_acc_AB": final_acc.get("A>B"),
        "eval/cascade_acc_BA": final_acc.get("B>A"),
        "eval/solo_acc_A": solo_acc.get("A"),
        "eval/solo_acc_B": solo_acc.get("B"),
        "eval/solo_acc_base": solo_acc.get("base"),
        "eval/conversion_rate": _mean(conv) if head_draft else None,
        "eval/regression_rate": _mean(regr) if head_draft else None,
        "eval/verifier_failures": failures,
        "eval/headline_orders": headline,
    }
    return EvalResult(metrics, rows, games)


def _finals_of(drafts: list[dict[str, Any]], finals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The final-stage row answering each draft row (same order, problem and sample)."""
    index = {(r["order"], r["problem_id"], r["sample"]): r for r in finals}
    return [index[(d["order"], d["problem_id"], d["sample"])] for d in drafts]
