"""Writes tests/analysis/fixtures/: two small multirun roots in the run-directory format the trainer writes.

    python tests/analysis/make_fixture.py

Four held-out problems, one sample each. ``SPECS`` gives, per run and phase, each order's draft and final
correctness and final-stage tokens; summary.json is derived from the final phase exactly as the trainer defines
it (headline accuracy = mean final-stage correctness over the headline orders; conversion = P(final right | draft
wrong) and regression = P(final wrong | draft right), pooled over the cascade orders). The expected table values
in test_analysis.py are worked out by hand from SPECS.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

ROOT = Path(__file__).parent / "fixtures" / "sweeps" / "2026-11-30"
PROBLEMS = ["p0", "p1", "p2", "p3"]
STEPS = 4

# run dir -> axes, seed, and per phase: {order: (draft correct, final correct, final tokens)}
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
    "11-00-00/1_method=self_refine": {"method": "self_refine", "reward": "competitive", "exchange": "visible", "seed": 0},
}
# fmt: on


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def phase_stats(orders: dict) -> dict:
    headline = [o for o in orders if ">" in o] or list(orders)
    finals = [c for o in headline for c in orders[o][1]]
    tokens = [t for o in headline for t in orders[o][2]]
    conv, regr = [], []
    for o in headline:
        draft, final, _ = orders[o]
        if draft is None:
            continue
        for d, f in zip(draft, final):
            (regr if d else conv).append(1 - f if d else f)
    return {
        "accuracy": _mean(finals),
        "final_trace_tokens": _mean(tokens),
        "conversion_rate": _mean(conv),
        "regression_rate": _mean(regr),
        "headline": headline,
    }


def eval_rows(step: int, phase: str, orders: dict) -> list[dict]:
    rows = []
    for order, (draft, final, tokens) in orders.items():
        for i, pid in enumerate(PROBLEMS):
            stages = (
                [("final", final[i], tokens[i])]
                if draft is None
                else [("draft", draft[i], 90), ("final", final[i], tokens[i])]
            )
            for stage, ok, n in stages:
                rows.append(
                    {
                        "step": step,
                        "phase": phase,
                        "order": order,
                        "stage": stage,
                        "problem_id": pid,
                        "sample": 0,
                        "correct": bool(ok),
                        "format_ok": True,
                        "tokens": n,
                        "status": "ok",
                    }
                )
    # each adapter alone (only for the two-adapter method)
    if "A>B" in orders:
        for solo, first in (("A", "A>B"), ("B", "B>A")):
            for i, pid in enumerate(PROBLEMS):
                rows.append(
                    {
                        "step": step,
                        "phase": phase,
                        "order": solo,
                        "stage": "final",
                        "problem_id": pid,
                        "sample": 0,
                        "correct": bool(orders[first][0][i]),
                        "format_ok": True,
                        "tokens": 90,
                        "status": "ok",
                    }
                )
    return rows


def eval_metrics(stats: dict, orders: dict, prefix: str = "eval") -> dict:
    m = {
        f"{prefix}/accuracy": stats["accuracy"],
        f"{prefix}/final_trace_tokens": stats["final_trace_tokens"],
        f"{prefix}/conversion_rate": stats["conversion_rate"],
        f"{prefix}/regression_rate": stats["regression_rate"],
    }
    if "A>B" in orders:
        m.update(
            {
                "eval/cascade_acc_AB": _mean(orders["A>B"][1]),
                "eval/cascade_acc_BA": _mean(orders["B>A"][1]),
                "eval/solo_acc_A": _mean(orders["A>B"][0]),
                "eval/solo_acc_B": _mean(orders["B>A"][0]),
            }
        )
    else:
        m.update(
            {
                "eval/cascade_acc_AB": None,
                "eval/cascade_acc_BA": None,
                "eval/solo_acc_A": _mean(orders["A"][1]),
                "eval/solo_acc_B": None,
            }
        )
    return m


def write_run(rel: str, spec: dict) -> None:
    run = ROOT / rel
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
    final, start = spec.get("final"), spec.get("start")
    metrics, evals, samples = [], [], []
    if start:
        s0 = phase_stats(start)
        metrics.append({"train/step": 0, **eval_metrics(s0, start)})
        evals += eval_rows(0, "start", start)
    last = STEPS if final else 2
    for step in range(1, last + 1):
        frac = step / STEPS
        acc, tok = None, 60 - 5 * step
        if final:
            s1 = phase_stats(final)
            acc = round(s0["accuracy"] + (s1["accuracy"] - s0["accuracy"]) * frac, 4)
            tok = round(60 + (s1["final_trace_tokens"] - 60) * frac, 2)
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
    if final:
        s1 = phase_stats(final)
        metrics.append({"train/step": STEPS, **eval_metrics(s1, final)})
        evals += eval_rows(STEPS, "final", final)
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
            for i, pid in enumerate(PROBLEMS[:2])
        ]
    with open(run / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in metrics)
    with open(run / "eval.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in evals)
    with open(run / "samples.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in samples)
    if not final:
        return
    summary = {
        **eval_metrics(s1, final),
        "eval/accuracy_at_start": s0["accuracy"],
        "eval/n_problems": len(PROBLEMS),
        "eval/samples": 1,
        "eval/headline_orders": s1["headline"],
        "train/steps": STEPS,
        "train/generated_tokens": 1000 * STEPS,
        "time/total_s": 6.0,
        "method": spec["method"],
        "reward": spec["reward"],
        "exchange": spec["exchange"],
        "rotation": "alternate",
        "init": "divergent",
        "task": "arithmetic",
        "model": "tiny",
        "experiment": None,
        "seed": spec["seed"],
        "overrides": ",".join(overrides),
        "git_commit": "0" * 40,
        "versions": {"agon": "0.1.0"},
        "config": config,
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))


def main() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    for sweep in {rel.split("/")[0] for rel in SPECS}:
        (ROOT / sweep).mkdir(parents=True)
        (ROOT / sweep / "multirun.yaml").write_text("# fixture: the sweep's Hydra config would be here\nhydra: {}\n")
    for rel, spec in SPECS.items():
        write_run(rel, spec)


if __name__ == "__main__":
    main()
