"""Writes tests/analysis/fixtures/: two small multirun roots in the run-directory format the trainer writes.

    python tests/analysis/make_fixture.py

Four held-out problems, one sample each. ``SPECS`` gives, per run and phase, each order's draft and final
correctness and final-stage tokens. Those are built into ``Game`` objects (the games ``rollout.play`` returns), and
``agon.game.cascade.summarise`` turns them into the eval.jsonl rows and the evaluation metrics, exactly as a run does:
nothing here re-implements a metric. What each method plays, its axes and its label come from ``agon.core.methods``.
metrics.jsonl and summary.json take those metrics the way the trainer and ``agon.run`` write them. The expected
table values in test_analysis.py are worked out by hand from SPECS, and test_analysis.py checks that the committed
files are what this script writes with the current agon/game/cascade.py and agon/core/methods.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from agon.game.cascade import EvalResult, order_name, summarise
from agon.core.methods import get_method
from agon.models.tokens import Completion
from agon.game.rollout import Attempt, Game, Round
from agon.tasks import Problem, Verdict

ROOT = Path(__file__).parent / "fixtures" / "sweeps" / "2026-11-30"
PROBLEMS = [Problem(f"p{i}", f"{i}+1+2", str(i + 3)) for i in range(4)]
STEPS = 4
DRAFT_TOKENS = 90

# run dir -> axes, seed, and per phase: {order: (draft correct, final correct, final tokens)}; a draft of None
# means drafts only (grpo), whose final answers are the drafts
# fmt: off
SPECS = {
    "10-00-00/0_exchange=visible,reward=competitive,seed=0": {
        "method": "agon", "reward": "competitive", "exchange": "visible", "seed": 0,
        "final": {"A>B": ([0, 1, 0, 1], [1, 1, 1, 1], [20] * 4), "B>A": ([0, 0, 1, 1], [1, 0, 1, 1], [30] * 4)},
        "start": {"A>B": ([0, 1, 0, 0], [0, 1, 0, 0], [60] * 4), "B>A": ([1, 0, 0, 0], [1, 0, 0, 0], [60] * 4)},
    },
    "10-00-00/1_exchange=visible,reward=competitive,seed=1": {
        "method": "agon", "reward": "competitive", "exchange": "visible", "seed": 1,
        "final": {"A>B": ([0, 1, 0, 1], [1, 1, 0, 1], [10] * 4), "B>A": ([0, 1, 1, 0], [0, 0, 1, 1], [30] * 4)},
        "start": {"A>B": ([0, 0, 0, 1], [0, 0, 0, 1], [60] * 4), "B>A": ([0, 1, 0, 0], [0, 1, 0, 0], [60] * 4)},
    },
    "10-00-00/2_exchange=hidden,reward=competitive": {
        "method": "agon", "reward": "competitive", "exchange": "hidden", "seed": 0,
        "final": {"A>B": ([0, 0, 1, 1], [0, 1, 1, 1], [40] * 4), "B>A": ([1, 0, 0, 1], [1, 0, 0, 1], [40] * 4)},
        "start": {"A>B": ([0, 0, 1, 0], [0, 0, 1, 0], [60] * 4), "B>A": ([0, 0, 0, 1], [0, 0, 0, 1], [60] * 4)},
    },
    "10-00-00/3_exchange=visible,reward=cooperative": {
        "method": "agon", "reward": "cooperative", "exchange": "visible", "seed": 0,
        "final": {"A>B": ([1, 0, 0, 1], [1, 1, 0, 1], [50] * 4), "B>A": ([0, 1, 0, 1], [0, 1, 1, 1], [70] * 4)},
        "start": {"A>B": ([1, 0, 0, 0], [1, 0, 0, 0], [60] * 4), "B>A": ([0, 0, 0, 0], [0, 0, 0, 0], [60] * 4)},
    },
    "10-00-00/4_exchange=hidden,reward=cooperative": {
        "method": "agon", "reward": "cooperative", "exchange": "hidden", "seed": 0,
        "final": {"A>B": ([0, 0, 0, 1], [0, 0, 0, 1], [30] * 4), "B>A": ([0, 0, 1, 1], [0, 0, 1, 0], [30] * 4)},
        "start": {"A>B": ([0, 0, 0, 1], [0, 0, 0, 1], [60] * 4), "B>A": ([0, 0, 1, 0], [0, 0, 1, 0], [60] * 4)},
    },
    "11-00-00/0_method=grpo": {
        "method": "grpo", "reward": "competitive", "exchange": "visible", "seed": 0,
        "final": {"A": (None, [1, 0, 1, 0], [80] * 4)},
        "start": {"A": (None, [0, 0, 1, 0], [60] * 4)},
    },
    # crashed after two steps: metrics only, no eval rows, no summary.json
    "11-00-00/1_method=self_refine": {"method": "self_refine", "reward": "competitive", "exchange": "visible",
                                      "seed": 0},
}
# fmt: on


def _attempt(prompt: str, correct: int, tokens: int) -> Attempt:
    verdict = Verdict(correct=bool(correct), format_ok=True, status="ok" if correct else "wrong")
    return Attempt(prompt, Completion(f"<think>work</think>\\boxed{{{correct}}}", (7,) * tokens, False), verdict)


def games(orders: dict, exchange: str) -> dict[str, Game]:
    """One evaluation's games, as rollout.play returns them: one round per problem (one sample each)."""
    out = {}
    for order, (draft, final, tokens) in orders.items():
        drafter, _, answerer = order.partition(">")
        rounds = []
        for i, problem in enumerate(PROBLEMS):
            plain, recap = f"user: {problem.question}", f"recap of {order} on {problem.id}"
            if draft is None:  # drafts only (grpo): the draft is the final answer
                rounds.append(Round(problem, _attempt(plain, final[i], tokens[i]), recap))
                continue
            prompt = f"{plain}\nrival: {recap}" if exchange == "visible" else plain
            rounds.append(Round(problem, _attempt(plain, draft[i], DRAFT_TOKENS), recap,
                                _attempt(prompt, final[i], tokens[i])))
        out[order] = Game(rounds, _adapter(drafter), _adapter(answerer) if answerer else None, group_size=1)
    return out


def _adapter(name: str) -> str | None:
    return None if name == "base" else name


def evaluation(spec: dict, phase: str, step: int) -> EvalResult:
    """eval.jsonl rows and metrics of one phase, from agon.game.cascade exactly as the trainer gets them."""
    plan = get_method(spec["method"]).evaluation("alternate")
    played = games(spec[phase], spec["exchange"])
    assert list(played) == [order_name(d, a) for d, a in plan.plays], (spec["method"], list(played))
    return summarise(played, plan.headline, step=step, phase=phase)


def logged(metrics: dict) -> dict:
    """What the trainer writes to metrics.jsonl of an evaluation: every metric but the list of headline orders."""
    return {k: v for k, v in metrics.items() if not isinstance(v, list)}


def write_run(root: Path, rel: str, spec: dict) -> None:
    run = root / rel
    overrides = rel.split("/", 1)[1].split("_", 1)[1].split(",")
    config = {
        "model": {"name": "tiny"},
        "task": {"kind": "arithmetic", "name": "arithmetic"},
        "method": {"name": spec["method"], "train": True},
        "reward": {"name": spec["reward"]},
        "exchange": {"mode": spec["exchange"]},
        "rotation": {"mode": "alternate"},
        "init": {"mode": "divergent"},
        "trainer": {"max_steps": STEPS},
        "logger": {"name": "none"},
        "experiment": None,
        "seed": spec["seed"],
    }
    (run / ".hydra").mkdir(parents=True, exist_ok=True)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    complete = "final" in spec
    metrics, evals, samples = [], [], []
    if "start" in spec:
        start = evaluation(spec, "start", 0)
        metrics.append({"train/step": 0, **logged(start.metrics)})
        evals += start.rows
    if complete:
        final = evaluation(spec, "final", STEPS)
    for step in range(1, (STEPS if complete else 2) + 1):
        frac = step / STEPS
        acc, tok = None, 60 - 5 * step
        if complete:  # training curves that end at the final evaluation's values
            acc0, acc1 = start.metrics["eval/accuracy"], final.metrics["eval/accuracy"]
            acc = round(acc0 + (acc1 - acc0) * frac, 4)
            tok = round(60 + (final.metrics["eval/final_trace_tokens"] - 60) * frac, 2)
        metrics.append(
            {
                "train/step": step,
                "train/accuracy": acc if acc is not None else 0.1 * step,
                "train/final_trace_tokens": tok,
                "role/drafter/accuracy": 0.1 * step,
                "role/challenger/accuracy": 0.1 * step + 0.05,
                "train/conversion_rate": 0.2,
                "train/regression_rate": 0.1,
                "train/generated_tokens": 1000 * step,
                "time/step_s": 1.5,
            }
        )
    if complete:
        metrics.append({"train/step": STEPS, **logged(final.metrics)})
        evals += final.rows
        samples = [
            {
                "step": STEPS,
                "problem_id": pid,
                "problem": f"{i}+1+2",
                "drafter": "A",
                "draft": f"<think>{i}+1={i + 1};{i + 1}+2={i + 3}</think>{i}+1={i + 1}\\boxed{{{i + 3}}}",
                "recap": f"{i}+1={i + 1}",
                "challenge": f"<think>{i + 1}+2={i + 3}</think>\\boxed{{{i + 3}}}",
                "draft_correct": True,
                "challenge_correct": True,
                "drafter_reward": 1.0,
                "challenger_reward": 1.0,
            }
            for i, pid in enumerate(p.id for p in PROBLEMS[:2])
        ]
    with open(run / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in metrics)
    with open(run / "eval.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in evals)
    with open(run / "samples.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in samples)
    if not complete:
        return
    # the keys agon.run writes: the final evaluation's metrics, then the run's totals and identity
    summary = {
        **final.metrics,
        "eval/accuracy_at_start": start.metrics["eval/accuracy"],
        "train/steps": STEPS,
        "train/generated_tokens": 1000 * STEPS,
        "train/verifier_failures": 0,
        "time/train_s": 5.0,
        "time/total_s": 6.0,
        "method": spec["method"],
        "method_axes": list(get_method(spec["method"]).axes),
        "method_label": get_method(spec["method"]).label,
        "reward": spec["reward"],
        "exchange": spec["exchange"],
        "rotation": "alternate",
        "init": "divergent",
        "task": "arithmetic",
        "model": "tiny",
        "model_label": "tiny (offline)",
        "experiment": None,
        "seed": spec["seed"],
        "overrides": ",".join(overrides),
        "git_commit": "0" * 40,
        "versions": {"agon": "0.1.0"},
        "config": config,
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))


def main(root: Path = ROOT) -> None:
    """(Re)write every fixture run under ``root`` (the committed directory by default)."""
    shutil.rmtree(root, ignore_errors=True)
    for sweep in sorted({rel.split("/")[0] for rel in SPECS}):
        (root / sweep).mkdir(parents=True)
        (root / sweep / "multirun.yaml").write_text("# fixture: the sweep's Hydra config would be here\nhydra: {}\n")
    for rel, spec in SPECS.items():
        write_run(root, rel, spec)


if __name__ == "__main__":
    main()
