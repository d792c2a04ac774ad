"""``python tools/target_sum_scan.py [overrides]``: one target-sum warm start, read by the gate every few steps.

Picking a target-sum base means picking a warm-start design and its length: the gate (``tools/target_sum_gate.py``)
wants the challenger right after a right recap at least 90% of the time, and the study wants the base's solo
accuracy well below its ceiling, so RL has something to gain. Both move with the length of the warm start, and a
gate per length is a build per length. This runs one warm start of ``--max-steps`` (the config's
``experiment=target_sum`` world with the overrides given) and, every ``--every`` steps from ``--first``, gates a copy
of the model as it stands (``gate`` of the gate tool: right, dead end, extendable, solo, cascade) at each
``--temperatures``. Each checkpoint's line is appended to ``--out`` (JSON lines) the moment it is measured, so a
scan cut short keeps what it measured.

A checkpoint at step N is the base a warm start of N steps builds when the learning rate's ramp is fixed
(``model.tiny.warmup_ramp_steps``); unset, the ramp is a twentieth of the run's length (here ``--max-steps``), and
a build of N steps differs over its first steps. That matters: near the step where the check is learned, a
build with a ramp of 25 steps was about 80 steps behind the scan's (ramp 45) and failed the gate the scan's
checkpoint passed (docs/tasks.md). ``--save DIR`` writes each gated checkpoint as a world directory named by the
key of a build of that length, so the base shipped is the one gated, not a rebuild of it.

On the machine's GPU when it has one (``--device``, default ``model.device``), CPU otherwise. Left out on purpose:
any RL.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere: agon beside it
sys.path.insert(0, str(Path(__file__).resolve().parent))

from target_sum_gate import CONDITIONS, gate, shown  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one target-sum warm start, gated every few steps")
    parser.add_argument("--max-steps", type=int, default=1000, help="the warm start's length")
    parser.add_argument("--every", type=int, default=100, help="steps between checkpoints")
    parser.add_argument("--first", type=int, default=200, help="the first checkpoint")
    parser.add_argument("--problems", type=int, default=100, help="held-out problems, from the first")
    parser.add_argument("--samples", type=int, default=2, help="samples per problem and condition")
    parser.add_argument("--temperatures", type=float, nargs="*", default=None,
                        help="default: the evaluation's (eval.temperature)")
    parser.add_argument("--seed", type=int, default=0, help="the wrong recaps' draw and the sampling's seed")
    parser.add_argument("--device", default=None, help="default: model.device (auto: the GPU when there is one)")
    parser.add_argument("--budget-s", type=float, default=0, help="stop after the checkpoint that ends past this")
    parser.add_argument("--label", default="", help="written on every line")
    parser.add_argument("--save", type=Path, default=None,
                        help="save each checkpoint gated as a world directory here (tiny-<key of that length>)")
    parser.add_argument("--out", type=Path, default=Path("outputs/target_sum_scan.jsonl"))
    parser.add_argument("overrides", nargs="*", help="config overrides after experiment=target_sum")
    args = parser.parse_args(argv)

    from agon.training.checks import compose_config
    from agon.models.loading import resolve_device
    from agon.models.policies import build_policies
    from agon.tasks import build_task
    from agon.models.world import build_model, build_tokenizer, save_world, warm_start, world_key, world_task_cfg

    cfg = compose_config(["experiment=target_sum", *args.overrides])
    cfg.model.tiny.warmup_steps = args.max_steps
    device = args.device or resolve_device(cfg.model.device)
    temperatures = args.temperatures or [cfg.eval.temperature]
    problems = list(build_task(cfg.task).heldout_problems())[: args.problems]
    tokenizer = build_tokenizer()
    model = build_model(cfg.model.tiny, len(tokenizer), seed=cfg.model.tiny.warmup_seed).to(device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    class Stop(Exception):
        pass

    def checkpoint(step: int, live, loss: float) -> None:
        if step < args.first or (step - args.first) % args.every:
            return
        frozen = copy.deepcopy(live).eval()  # the adapters go on a copy; the warm start goes on
        for p in frozen.parameters():
            p.requires_grad_(False)
        saved = None
        if args.save is not None:  # the base a build of this length makes: its key says warmup_steps=step
            length = copy.deepcopy(cfg.model)
            length.tiny.warmup_steps = step
            saved = args.save / f"tiny-{world_key(length, world_task_cfg(cfg.task))}"
            saved.mkdir(parents=True, exist_ok=True)
            save_world(frozen, tokenizer, saved, saved.name,
                       {"warmup/final_loss": loss, "warmup/seconds": time.time() - t0})
        policies = build_policies(cfg, frozen, tokenizer)
        numbers = gate(cfg, problems, args.samples, temperatures, args.seed, policies=policies,
                       log=lambda *_: None)
        line = {"label": args.label, "step": step, "loss": loss, "seconds": time.time() - t0, "device": str(device),
                "overrides": args.overrides, "problems": len(problems), "samples": args.samples,
                "saved": None if saved is None else str(saved),
                "by_temperature": numbers}
        with open(args.out, "a") as f:
            f.write(json.dumps(line) + "\n")
        for t, result in numbers.items():
            print(f"[scan {args.label}] step {step} loss {loss:.3f} T={t}: "
                  + ", ".join(f"{c} {shown(result[c])}" for c in CONDITIONS) + f" ({time.time() - t0:.0f}s)",
                  flush=True)
        if args.budget_s and time.time() - t0 > args.budget_s:
            raise Stop

    try:
        warm_start(model, tokenizer, cfg.model.tiny, world_task_cfg(cfg.task), log=lambda m: print(m, flush=True),
                   on_step=checkpoint)
    except Stop:
        print(f"[scan {args.label}] stopped at the budget ({args.budget_s:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
