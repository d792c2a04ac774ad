"""``python tools/target_sum_gate.py``: the gate a target-sum base passes before any RL run on it.

The base (``experiment=target_sum``'s world: the shipped one) plays the challenger on the first ``--problems``
held-out problems (100 of 300 by default: on a shared 2-core CPU a condition of 200 rows takes minutes; ``--problems
300 --samples 4`` where time allows), each sampled ``--samples`` times (2) at each temperature (the evaluation's, and
0.6), reading:

- ``right``: the worked solution's recap (the drafter's found chain but its last sign);
- ``dead_end``: a wrong chain's recap that no last sign finishes (one per problem, drawn with ``--seed``);
- ``extendable``: a wrong chain's recap that the other last sign finishes (a draft that erred in its last sign),
  where the problem has one whose text is not the right recap's (about one problem in five);
- ``solo``: no recap, the plain prompt (the drafter's accuracy);
- ``cascade``: the recap of its own solo draft of the same row (the untrained cascade, base>base).

Each is the share of right final answers, with its standard error over problems (samples of one problem are not
independent). The gate passes when ``right`` is at least ``--min-right`` (0.9) at every temperature; the numbers
are printed and written to ``--out`` as JSON, and the command exits 1 when the gate fails. The recap texts are the
task's own (``TargetSumTask.recap_kinds``), so the gate reads what the warm start taught, not the eval
diagnostic's wrong recaps (``agon.game.diagnostic.diagnose``: a wrong chain's recap of either kind, not told apart).

A tool above agon (it loads the base and samples, which ``agon.tasks`` never does), beside the run rather than
in it. Left out on purpose: adapters (a run's own recap diagnostic measures them), and a bar on the wrong recaps:
after a dead end the challenger searches, so its accuracy there is reported beside the solo one, not held to a bar.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere: agon beside it

CONDITIONS = ("right", "dead_end", "extendable", "solo", "cascade")
# the temperatures the gate reads the base at: the evaluation's (None: eval.temperature) and a cooler one
TEMPERATURES = (None, 0.6)


def share(flags_by_problem: dict[str, list[bool]]) -> dict[str, float]:
    """{mean, se, n, problems}: the share of right answers over every sample, with its standard error over
    problems (the spread of the per-problem means; the samples of one problem are not independent)."""
    means = [sum(f) / len(f) for f in flags_by_problem.values() if f]
    flags = [x for f in flags_by_problem.values() for x in f]
    if not flags:  # None, not NaN: the JSON file stays strict JSON
        return {"mean": None, "se": None, "n": 0, "problems": 0}
    k = len(means)
    spread = sum((m - sum(means) / k) ** 2 for m in means) / (k - 1) if k > 1 else None
    return {"mean": sum(flags) / len(flags), "se": None if spread is None else math.sqrt(spread / k),
            "n": len(flags), "problems": k}


def shown(x: dict[str, Any]) -> str:
    """``0.912±0.015 (n=1200)``: a share as the gate prints it."""
    number = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    return f"{number(x['mean'])}±{number(x['se'])} (n={x['n']})"


def gate(cfg: Any, problems: Sequence[Any], samples: int, temperatures: Sequence[float], seed: int,
         policies: Any = None, log=print) -> dict[str, Any]:
    """{temperature: {condition: share}} for the base of ``cfg`` (``policies`` if given) on ``problems``."""
    import torch

    from agon.engines import Sampling
    from agon.engines.hf import HFEngine
    from agon.models.loading import load_base
    from agon.models.policies import build_policies
    from agon.game.rollout import render, sample_attempts
    from agon.tasks import build_task
    from agon.tasks.target_sum import parse, recap_text

    task = build_task(cfg.task)
    if policies is None:
        model, tokenizer = load_base(cfg.model, cfg.task, log=log)
        policies = build_policies(cfg, model, tokenizer)
    engine = HFEngine(policies)
    rng = random.Random(seed)
    rows = [p for p in problems for _ in range(samples)]
    recaps: dict[str, list[tuple[int, str]]] = {"right": [], "dead_end": [], "extendable": []}
    for p in problems:  # one recap of each kind per problem, shared by its samples
        kinds, operands = task.recap_kinds(p), parse(p.question)[0]
        for kind in recaps:
            if kinds[kind]:
                text = recap_text(rng.choice(kinds[kind]), operands)
                recaps[kind] += [(i, text) for i, r in enumerate(rows) if r.id == p.id]

    def answers(which: list[int], messages: list[str], sampling: Sampling, salt: int) -> list[Any]:
        torch.manual_seed(seed * 1000 + salt)
        prompts = [render(policies, task, cfg.model, m) for m in messages]
        return sample_attempts(engine, task, None, [rows[i] for i in which], prompts, sampling)

    def by_problem(which: list[int], attempts: list[Any]) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for i, a in zip(which, attempts):
            out.setdefault(rows[i].id, []).append(a.verdict.correct)
        return out

    out: dict[str, Any] = {}
    for t_index, temperature in enumerate(temperatures):
        sampling = Sampling(cfg.eval.max_new_tokens, temperature, cfg.eval.top_p, cfg.eval.top_k,
                            cfg.eval.generation_batch_tokens)
        t0, every = time.time(), list(range(len(rows)))
        result: dict[str, Any] = {}
        solo = answers(every, [task.user_message(p) for p in rows], sampling, 10 * t_index)
        result["solo"] = share(by_problem(every, solo))
        cascade = answers(every, [task.challenge_message(p, task.recap(a.completion.text)) for p, a in
                                  zip(rows, solo)], sampling, 10 * t_index + 1)
        result["cascade"] = share(by_problem(every, cascade))
        for k, kind in enumerate(recaps):
            which = [i for i, _ in recaps[kind]]
            got = answers(which, [task.challenge_message(rows[i], r) for i, r in recaps[kind]], sampling,
                          10 * t_index + 2 + k) if which else []
            result[kind] = share(by_problem(which, got))
        result["seconds"] = time.time() - t0
        out[f"{temperature:g}"] = {c: result[c] for c in (*CONDITIONS, "seconds")}
        log(f"[gate] temperature {temperature:g}: " + ", ".join(f"{c} {shown(result[c])}" for c in CONDITIONS)
            + f" ({result['seconds']:.0f}s)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the target-sum base's gate before any RL run (docs/tasks.md)")
    parser.add_argument("--problems", type=int, default=100, help="held-out problems, from the first (of 300)")
    parser.add_argument("--samples", type=int, default=2, help="samples per problem and condition")
    parser.add_argument("--temperatures", type=float, nargs="*", default=None,
                        help="default: the evaluation's (eval.temperature) and 0.6")
    parser.add_argument("--seed", type=int, default=0, help="the wrong recaps' draw and the sampling's seed")
    parser.add_argument("--min-right", type=float, default=0.9, help="the bar on right-recap accuracy")
    parser.add_argument("--out", type=Path, default=Path("outputs/target_sum_gate.json"))
    parser.add_argument("overrides", nargs="*", help="config overrides after experiment=target_sum")
    args = parser.parse_args(argv)

    from agon.training.checks import compose_config
    from agon.tasks import build_task

    cfg = compose_config(["experiment=target_sum", *args.overrides])
    temperatures = args.temperatures or [cfg.eval.temperature if t is None else t for t in TEMPERATURES]
    problems = list(build_task(cfg.task).heldout_problems())[: args.problems]
    t0 = time.time()
    numbers = gate(cfg, problems, args.samples, temperatures, args.seed)
    passed = all((numbers[f"{t:g}"]["right"]["mean"] or 0) >= args.min_right for t in temperatures)
    from agon.models.world import world_key, world_task_cfg

    world = cfg.model.path or f"tiny-{world_key(cfg.model, world_task_cfg(cfg.task))}"
    report = {"passed": passed, "min_right": args.min_right, "world": world,
              "problems": len(problems), "samples": args.samples, "seed": args.seed, "overrides": args.overrides,
              "seconds": time.time() - t0, "by_temperature": numbers}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    verdict = "passes" if passed else "FAILS"
    print(f"[gate] {verdict}: right-recap accuracy "
          + ", ".join(f"{shown(numbers[f'{t:g}']['right']).split('±')[0]} at {t:g}" for t in temperatures)
          + f" against {args.min_right} ({args.out})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
