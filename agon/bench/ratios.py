"""``make bench``: how fast agon's training step is, measured side by side, with equal work on both sides.

Its parts, each measured within one run so the machine's speed cancels out of its ratio (``--only`` picks some):

``agon-vs-grpo``: an Agon step (drafts and challenges, then an update of each role's adapter) against agon's own
vanilla GRPO step (drafts, then one update) on the same batch. Both trainers are built the way ``agon.run`` builds
them: the config composed from ``conf/`` with ``method=agon`` or ``method=grpo`` (Hydra overrides given on the
command line reach both), the offline world's model, the same seed and so the same problems in the same order, the
same prompts per step, group size and completion budget. They take turns, one step each, the first to go alternating,
so a change in the machine's load reaches both. Each runs 7 steps; the first is a warm-up, left out of the medians.
Reported: median step, generation and update (step minus generation) seconds of each, the ratios Agon / GRPO, the
step's ratio per completion token next to the target (per-token parity: at most 1.0x; an Agon step plays twice
GRPO's tokens), and completion tokens per step of each.

``trl``: a vanilla GRPO step of agon against TRL's ``GRPOTrainer`` in one process. Both train the same LoRA (rank 8,
all linear layers) on the same randomly initialised Qwen3-architecture model and tokenizer, on prompts from the same
arithmetic task, with the same group size, batch and completion budget, on the same threads; each is warmed up, then
timed over ``--steps`` steps. Reported: the ratio of median step times (TRL / agon).

``memory``: the memory of scoring (per-token log-probabilities, forward and backward) at Qwen3's vocabulary of
151,936 for one batch of 4 sequences x 1,024 completion tokens, on a 2-layer model of Qwen3-0.6B's width: agon's
chunked ``selective_logps`` from hidden states against the straightforward full float32 log-softmax of the whole
logits, each in its own process, so neither inherits the other's allocations (peak resident memory: the process's
own high-water mark, Linux's ``VmHWM``; not ``ru_maxrss``, which Linux carries from a parent into its children, so
that after the other parts every child would report at least the bench's own size).

``engines``: generation alone, the same batch (one step's drafts: ``prompts_per_step`` x ``num_generations``
prompts of the offline world) sampled by the ``hf`` engine and by vLLM (``generation.engine=vllm``, in this process
or its worker environment; skipped with a note when vLLM is installed nowhere and the part was not asked for by
name), taking turns for ``--engine-rounds`` rounds after one warm-up call each. Reported: median seconds of each and
their ratio, and the sampler mismatch of vLLM's completions: the mean and max |log-prob| difference between vLLM's
log-probs and the trainer's for the same tokens (what ``trainer.vllm_importance_sampling_*`` corrects). On a CPU the
ratio says little (vLLM's CPU LoRA kernels, a model of 1M parameters); the number that matters there is the mismatch.

``length-skew``: the update (forward, GRPO loss, backward) of one length-skewed batch, ``--skew-rows`` rows of which
``--skew-long-rows`` are ``--skew-long-tokens`` completion tokens long, spread through the batch, and the rest at most
48, on a random Qwen3-architecture model (128 wide, 4 layers) with one LoRA: the same rows cut two ways. Before:
contiguous slices in the batch's order within the token budget (``policies.token_batches``), so each long row pads
its neighbours to its length and brings an attention mask. After: ``RoleBatch.micro_batches``, rows sorted by length,
rows of ``solo_row_tokens`` or more alone with no padding and no mask. The budget and the solo threshold are the paper
preset's at 16k-token traces scaled by the long rows' length (65,536 and 8,192 at 16,384: 4 and 1/2 long rows).
Seconds are taken in this process, the two taking turns for ``--skew-rounds`` rounds after one warm-up round each;
peak memory is each side's one update alone in its own process (peak resident memory, as ``memory``). Reported:
the ratios after / before of median seconds, of peak memory and of how far the update raises the peak above that of
building the model and the batch (NaN where it does not raise it at all), and the tokens each side computes (rows x
padded width). Equal work: both sides score every row once and must give the same gradient (up to the order of
float sums), else ``UNEQUAL WORK``.

``latent``: an Agon step with ``exchange=latent`` (the challenger reads the drafter's key/value states of
``--latent-span``, ``agon/models/latent.py``) against the same step with ``exchange=visible`` (a text recap), both
composed as ``agon-vs-grpo`` composes its sides (the same overrides reach both), taking turns one step each for
``--latent-steps`` steps, the first left out of the medians. Peak memory is each side's own steps in a process of its
own (peak resident memory, as ``memory``; and how far the steps raise it above building the trainer). Reported: the
ratios latent / visible of median step, generation and update seconds and of peak memory, and the prefix tokens a
challenge reads per step (what latent adds: a prefix pass at sampling and at every scoring pass). Equal work: both
sides write every completion to its budget, twice one role's tokens per step, else ``UNEQUAL WORK``.

``streamed``: streamed rounds against two-stage rounds on vLLM (``agon/bench/streamed.py``): GRPO, Agon visible and
Agon hidden steps and the cascade's evaluation on the test world, each budget drawn from its request's seed so that a
tenth run to the cap (an untrained model's heavy tail), each side with its own trainer and vLLM worker, on the same
rows. Reported: Agon visible / GRPO and Agon hidden / GRPO step, streamed and two-stage, the evaluation's
two-stage / streamed seconds, each beside issue 49's target, and the critical path in tokens of every side (what
bounds streaming on an engine whose decode step costs the same whatever it holds). Skipped with a note, as
``engines``, when vLLM is installed nowhere and the part was not asked for by name.

``sandbox``: the sandbox's cost per program, a correct "hello world" run ``--sandbox-runs`` times (median) through
``LocalSandbox`` (bubblewrap, a uid, a cgroup and a seccomp filter per run) and through the same monitor with no
isolation at all (``allow_unsafe``), taking turns.

Equal work: every completion on every side runs to its token budget (agon's ``Sampling.ignore_eos``: generation
does not stop at the end of turn, whose text still ends there, so recaps and grades are the natural ones; TRL's
``min_new_tokens``: the end of turn is suppressed), so no side is faster for stopping earlier. Completion tokens per
step are counted from what each side reports (agon's ``train/generated_tokens`` and ``role/*/completion_tokens``,
TRL's ``completions/mean_length``), printed, and checked: every step of every side writes exactly its budget, so an
Agon step writes twice a GRPO step's tokens (drafts + challenges) and agon's GRPO step as many as TRL's. Any other
count prints ``UNEQUAL WORK`` and exits 1; ``bench.json`` is still written, with ``equal_work: false``.

Every ratio is then compared with ``bench_baseline.json`` (the last measurement on a quiet machine, each ratio with
the noise seen between runs), and one line per ratio says whether it moved beyond that noise, worse or better;
``--write-baseline`` stores a run's ratios there.

Left out on purpose: seconds as claims (they depend on the machine; a ratio measured in one run is the claim, the
per-token target included); what the steps learn (rewards are computed, never compared); evaluation, except the
``streamed`` part's; prompt tokens, which differ a little between the agon and TRL sides (each draws its own problems
from the task); the wall time of the first steps (model loading, warm-up), which the medians leave out.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

# the two sides of the method comparison: the method under study and its one-adapter baseline
from agon.bench.streamed import BASELINE, STUDIED, run_trainer

PARTS = ("agon-vs-grpo", "latent", "trl", "memory", "length-skew", "engines", "streamed", "sandbox")
# the issue's bar: an Agon step (both roles' rollouts and updates) costs at most this many GRPO steps (one role's)
# an Agon step plays twice GRPO's completion tokens (drafts + challenges): per completion token it should cost no
# more than a GRPO step does (per-token parity), whatever the prompts' lengths
AGON_OVER_GRPO_PER_TOKEN_TARGET = 1.0
# agon's GRPO step against TRL's on equal work: at least this many times faster (not met on CPU at the bench's
# shape, where both spend most of the step in the same transformers generate)
TRL_OVER_AGON_TARGET = 2.0
# the ratios of the last measurement on a quiet 2-core machine, each with the noise seen between runs: `make bench`
# says which ratio moved by more than its noise (refresh with --write-baseline after a change that moves one)
BASELINE_FILE = Path(__file__).resolve().parents[2] / "bench_baseline.json"
# ratio name -> (the report's path to it, lower is better)
RATIOS = {
    "agon_over_grpo_step_per_token": (("agon_vs_grpo", "ratio_agon_over_grpo", "step_per_token"), True),
    "trl_over_agon_step": (("trl", "speedup_trl_over_agon"), False),
    "scoring_peak_selective_over_full": (("scoring_peak_ratio_selective_over_full",), True),
    "length_skew_seconds": (("length_skew", "ratio_by_length_over_contiguous", "seconds"), True),
    "latent_over_visible_step": (("latent_vs_visible", "ratio_latent_over_visible", "step"), True),
    "sandbox_isolated_over_bare": (("sandbox", "isolated_over_bare"), True),
    "streamed_visible_over_grpo_step": (("streamed", "ratios", "visible_over_grpo", "streamed"), True),
    "two_stage_visible_over_grpo_step": (("streamed", "ratios", "visible_over_grpo", "two_stage"), True),
    "streamed_hidden_over_grpo_step": (("streamed", "ratios", "hidden_over_grpo", "streamed"), True),
    "two_stage_hidden_over_grpo_step": (("streamed", "ratios", "hidden_over_grpo", "two_stage"), True),
    "streamed_eval_speedup": (("streamed", "ratios", "eval_two_stage_over_streamed"), False),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agon.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=PARTS,
                        help="run this part only (repeat for several; default: all)")
    parser.add_argument("--agon-vs-grpo-steps", type=int, default=7, help="steps of each trainer (agon-vs-grpo)")
    parser.add_argument("--agon-vs-grpo-warmup", type=int, default=1,
                        help="leading steps left out of the medians (agon-vs-grpo)")
    parser.add_argument("overrides", nargs="*",
                        help="Hydra overrides for the trainers of agon-vs-grpo, latent, engines and streamed (after "
                             "streamed's own sizes), e.g. trainer.prompts_per_step=8")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of each side (trl)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed leading steps of each side (trl)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (trl)")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt (trl)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens of every completion (trl)")
    parser.add_argument("--hidden", type=int, default=64, help="model width (trl)")
    parser.add_argument("--layers", type=int, default=4, help="model depth (trl)")
    parser.add_argument("--engine-rounds", type=int, default=5, help="timed calls of each engine (engines)")
    parser.add_argument("--skew-rounds", type=int, default=3, help="timed updates of each side (length-skew)")
    parser.add_argument("--skew-rows", type=int, default=24, help="rows of the batch (length-skew)")
    parser.add_argument("--skew-long-rows", type=int, default=3, help="long rows among them (length-skew)")
    parser.add_argument("--skew-long-tokens", type=int, default=768,
                        help="completion tokens of each long row (length-skew)")
    parser.add_argument("--sandbox-runs", type=int, default=20, help="hello-world runs of each sandbox (sandbox)")
    parser.add_argument("--latent-steps", type=int, default=5, help="steps of each side (latent)")
    parser.add_argument("--latent-span", choices=("recap", "trace"), default="trace",
                        help="what of the draft the latent challenger reads (latent)")
    parser.add_argument("--streamed-steps", type=int, default=6, help="steps of each of the six sides (streamed)")
    parser.add_argument("--streamed-warmup", type=int, default=1,
                        help="leading steps left out of the medians (streamed)")
    parser.add_argument("--streamed-eval-rounds", type=int, default=3,
                        help="timed evaluations of each side, after one warm-up each (streamed)")
    parser.add_argument("--streamed-threads", type=int, default=1,
                        help="threads of the trainers and of each vLLM worker, 0: as set (streamed; "
                             "agon/bench/streamed.py says why one)")
    parser.add_argument("--out", type=Path, default=Path("bench.json"))
    parser.add_argument("--write-baseline", action="store_true",
                        help="store this run's ratios as the baseline (bench_baseline.json), keeping each noise")
    parser.add_argument("--scoring-child", choices=["selective", "full"], help=argparse.SUPPRESS)
    parser.add_argument("--skew-child", choices=SKEW_SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--latent-child", choices=LATENT_SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scoring_child:  # one side of the memory comparison, alone in this process
        print(json.dumps(_score_once(args.scoring_child)))
        return 0
    if args.skew_child:  # one side of the length-skew memory comparison, alone in this process
        print(json.dumps(_skew_memory_once(args.skew_child, _skew_shape(args))))
        return 0
    if args.latent_child:  # one side of the latent memory comparison, alone in this process
        print(json.dumps(_latent_memory_once(args.latent_child, args.latent_span, args.latent_steps,
                                             args.overrides)))
        return 0
    parts = args.only or list(PARTS)
    report: dict[str, Any] = {"setup": _environment(argv)}
    unequal: list[str] = []
    if "agon-vs-grpo" in parts:
        pair = agon_vs_grpo(args.agon_vs_grpo_steps, args.agon_vs_grpo_warmup, args.overrides)
        report["agon_vs_grpo"] = pair
        unequal += pair["unequal_work"]
        _print_agon_vs_grpo(pair)
    if "latent" in parts:
        latent = latent_vs_visible(args.latent_steps, args.latent_span, args.overrides)
        report["latent_vs_visible"] = latent
        unequal += latent["unequal_work"]
        _print_latent(latent)
    if "trl" in parts:
        versus = trl_vs_agon(args)
        report["trl"] = versus
        unequal += versus["unequal_work"]
        _print_trl(versus)
    if "memory" in parts:
        memory = {kind: _scoring_memory(kind) for kind in ("full", "selective")}
        report["scoring_memory"] = memory
        report["scoring_peak_ratio_selective_over_full"] = memory["selective"]["peak_gib"] / memory["full"]["peak_gib"]
        _print_memory(memory)
    if "length-skew" in parts:
        skew = length_skew(_skew_shape(args), args.skew_rounds)
        report["length_skew"] = skew
        unequal += skew["unequal_work"]
        _print_length_skew(skew)
    if "engines" in parts:
        both = engines_side_by_side(args.engine_rounds, args.overrides, required=args.only is not None)
        report["engines"] = both
        unequal += both.get("unequal_work", [])
        _print_engines(both)
    if "streamed" in parts:
        from agon.bench.streamed import print_report, streamed_vs_two_stage

        streamed = streamed_vs_two_stage(args.streamed_steps, args.streamed_warmup, args.streamed_eval_rounds,
                                         args.overrides, required=args.only is not None,
                                         threads=args.streamed_threads)
        report["streamed"] = streamed
        unequal += streamed.get("unequal_work", [])
        print_report(streamed)
    if "sandbox" in parts:
        report["sandbox"] = sandbox_overhead(args.sandbox_runs)
        _print_sandbox(report["sandbox"])
    report["equal_work"] = not unequal
    report["against_baseline"] = against_baseline(report, _read_baseline())
    _print_against_baseline(report["against_baseline"])
    if args.write_baseline:
        write_baseline(report)
    args.out.write_text(json.dumps(report, indent=2))
    for line in unequal:
        print(f"UNEQUAL WORK: {line}")
    print(f"written to {args.out}")
    return 1 if unequal else 0


def _ratio(report: dict[str, Any], path: tuple[str, ...]) -> float | None:
    node: Any = report
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node)


def _read_baseline() -> dict[str, Any]:
    return json.loads(BASELINE_FILE.read_text())["ratios"] if BASELINE_FILE.exists() else {}


def against_baseline(report: dict[str, Any], baseline: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each ratio this run measured beside its baseline: ``moved`` is ``worse`` or ``better`` when it lies further
    from the baseline than the baseline's noise (a share of it), else ``within noise``; a ratio without a baseline
    is ``new``."""
    out = {}
    for name, (path, lower_is_better) in RATIOS.items():
        now = _ratio(report, path)
        if now is None:
            continue
        base = baseline.get(name)
        if base is None:
            out[name] = {"now": now, "moved": "new"}
            continue
        off = (now - base["value"]) / base["value"]
        moved = "within noise" if abs(off) <= base["noise"] else (
            "worse" if (off > 0) == lower_is_better else "better")
        out[name] = {"now": now, "baseline": base["value"], "noise": base["noise"], "change": off, "moved": moved}
    return out


def _print_against_baseline(rows: dict[str, dict[str, Any]]) -> None:
    if not rows:
        return
    print(f"against the baseline ({BASELINE_FILE.name}):")
    for name, r in rows.items():
        if r["moved"] == "new":
            print(f"  {name:36} {r['now']:.3f}   no baseline")
            continue
        flag = "   <-- MOVED" if r["moved"] in ("worse", "better") else ""
        print(f"  {name:36} {r['now']:.3f}   baseline {r['baseline']:.3f} +/- {100 * r['noise']:.0f}%: "
              f"{100 * r['change']:+.0f}%, {r['moved']}{flag}")


def write_baseline(report: dict[str, Any]) -> None:
    """Store this run's ratios as the baseline, keeping the noise each had (10% for a new one)."""
    old = _read_baseline()
    ratios = {name: {"value": now, "noise": old.get(name, {}).get("noise", 0.10)}
              for name, (path, _) in RATIOS.items() if (now := _ratio(report, path)) is not None}
    merged = {**old, **ratios}
    BASELINE_FILE.write_text(json.dumps({"ratios": merged, "git_commit": report["setup"]["git_commit"]}, indent=1,
                                        sort_keys=True) + "\n")


def _environment(argv: list[str] | None) -> dict[str, Any]:
    from agon.run import _git_commit, _versions

    return {"argv": list(sys.argv[1:] if argv is None else argv), "threads": torch.get_num_threads(),
            "git_commit": _git_commit(), "versions": _versions()}


def _budgeted(sampling):
    """``sampling`` that does not stop at the end of turn: every completion runs to ``max_new_tokens`` (equal work)."""
    return dataclasses.replace(sampling, ignore_eos=True)


def unequal_work(side: str, tokens_per_step: Sequence[int], expected: int) -> list[str]:
    """One line for each step of ``side`` whose completion tokens are not ``expected``; empty when all are."""
    return [f"{side} wrote {n} completion tokens at step {i + 1}, expected {expected}"
            for i, n in enumerate(tokens_per_step) if n != expected]


def _median(xs: Sequence[float], warmup: int) -> float:
    return statistics.median(xs[warmup:])


# ---------------------------------------------------------------------------------------------------------------
# Agon vs agon's GRPO


def _run_trainer(cfg, run_dir: Path, stack: contextlib.ExitStack):
    """``streamed.run_trainer``'s trainer (built as a run builds it), sampling every completion to its budget."""
    trainer = run_trainer(cfg, run_dir, stack)
    trainer.sampling = _budgeted(trainer.sampling)
    return trainer


def _side(metrics: list[dict[str, Any]], rows: int, warmup: int) -> dict[str, Any]:
    """Per-step seconds and completion tokens of one trainer, from its step metrics, and their medians."""
    step = [m["time/step_s"] for m in metrics]
    generation = [m["time/generation_s"] for m in metrics]
    update = [s - g for s, g in zip(step, generation)]
    cumulative = [0] + [int(m["train/generated_tokens"]) for m in metrics]
    return {
        "step_s": step, "generation_s": generation, "update_s": update,
        "median_step_s": _median(step, warmup), "median_generation_s": _median(generation, warmup),
        "median_update_s": _median(update, warmup),
        "completion_tokens": [b - a for a, b in zip(cumulative, cumulative[1:])],
        # the role metrics are means per completion; times the rows they are the role's tokens of the step
        "draft_tokens": [round(m["role/drafter/completion_tokens"] * rows) for m in metrics],
        "challenge_tokens": [round(m.get("role/challenger/completion_tokens", 0.0) * rows) for m in metrics],
    }


def agon_vs_grpo(steps: int = 7, warmup: int = 1, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """An Agon step against agon's GRPO step on the same batch, every completion at its budget (module docstring)."""
    from omegaconf import OmegaConf

    from agon.training.checks import compose_config

    if not 0 <= warmup < steps:
        raise ValueError(f"--agon-vs-grpo-warmup ({warmup}) must be below --agon-vs-grpo-steps ({steps})")
    # the run's own settings (model=tiny: the offline world), without what a bench has no use for: no logger,
    # no evaluation before training, no progress bar; the method comes last so both sides differ in it alone
    common = ["logger=none", "eval.at_start=false", "progress=false", *overrides]
    cfgs = {method: compose_config([*common, f"method={method}"]) for method in (BASELINE, STUDIED)}
    t = cfgs[BASELINE].trainer
    rows = t.prompts_per_step * t.num_generations
    metrics: dict[str, list[dict[str, Any]]] = {BASELINE: [], STUDIED: []}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        trainers = {m: _run_trainer(cfg, Path(tmp) / m, stack) for m, cfg in cfgs.items()}
        for i in range(steps):
            # taking turns, with the first alternating, spreads the machine's load and any order effect over both
            for method in (BASELINE, STUDIED) if i % 2 == 0 else (STUDIED, BASELINE):
                metrics[method].append(trainers[method].step())
    grpo, agon = (_side(metrics[m], rows, warmup) for m in (BASELINE, STUDIED))
    budget = rows * t.max_new_tokens  # one role's completions, each run to the budget
    unequal = (unequal_work("GRPO", grpo["completion_tokens"], budget)
               + unequal_work("GRPO drafts", grpo["draft_tokens"], budget)
               + unequal_work("Agon", agon["completion_tokens"], 2 * budget)
               + unequal_work("Agon drafts", agon["draft_tokens"], budget)
               + unequal_work("Agon challenges", agon["challenge_tokens"], budget))
    model = cfgs[STUDIED].model
    ratio = {k: agon[f"median_{k}_s"] / grpo[f"median_{k}_s"] for k in ("step", "generation", "update")}
    tokens = statistics.median(agon["completion_tokens"]) / max(statistics.median(grpo["completion_tokens"]), 1)
    ratio["step_per_token"] = ratio["step"] / tokens
    return {
        "setup": {
            "model": model.name,
            "tiny": OmegaConf.to_container(model.tiny, resolve=True) if model.name == "tiny" else None,
            "lora_rank": model.lora.rank, "prompts_per_step": t.prompts_per_step,
            "num_generations": t.num_generations, "max_new_tokens": t.max_new_tokens, "ignore_eos": True,
            "seed": cfgs[STUDIED].seed, "steps": steps, "warmup": warmup, "overrides": list(overrides),
            "threads": torch.get_num_threads(),
        },
        BASELINE: grpo, STUDIED: agon,
        "ratio_agon_over_grpo": ratio, "target_step_per_token": AGON_OVER_GRPO_PER_TOKEN_TARGET,
        "meets_target": ratio["step_per_token"] <= AGON_OVER_GRPO_PER_TOKEN_TARGET,
        "budget_tokens_per_role": budget, "unequal_work": unequal,
    }


def _print_agon_vs_grpo(r: dict[str, Any]) -> None:
    s, g, a, ratio = r["setup"], r[BASELINE], r[STUDIED], r["ratio_agon_over_grpo"]
    model = s["model"] if s["tiny"] is None else (
        f"offline world (tiny, {s['tiny']['hidden_size']} wide x {s['tiny']['num_layers']} layers)")
    print(f"Agon step vs agon's GRPO step on the same batch: {model}, LoRA r={s['lora_rank']}, "
          f"{s['prompts_per_step']} prompts x {s['num_generations']} completions x {s['max_new_tokens']} tokens "
          f"(no stop at the end of turn), {s['threads']} threads; {s['steps']} steps each, median of steps "
          f"{s['warmup'] + 1}-{s['steps']}")

    def tokens(side: dict[str, Any]) -> str:  # the step's tokens, or every step's when they differ
        n = side["completion_tokens"]
        return str(n[0]) if len(set(n)) == 1 else "/".join(map(str, n))

    print(f"  {'':10} {'step s':>8} {'generation s':>13} {'update s':>9}   completion tokens per step")
    print(f"  {'GRPO':10} {g['median_step_s']:8.3f} {g['median_generation_s']:13.3f} {g['median_update_s']:9.3f}   "
          f"{tokens(g)} (drafts)")
    print(f"  {'Agon':10} {a['median_step_s']:8.3f} {a['median_generation_s']:13.3f} {a['median_update_s']:9.3f}   "
          f"{tokens(a)} (drafts + challenges)")
    verdict = "met" if r["meets_target"] else "NOT met"
    token_ratio = statistics.median(a["completion_tokens"]) / max(statistics.median(g["completion_tokens"]), 1)
    print(f"  {'Agon/GRPO':10} {ratio['step']:7.2f}x {ratio['generation']:12.2f}x {ratio['update']:8.2f}x   "
          f"{token_ratio:.2f}x (2x expected)")
    print(f"  per completion token: {ratio['step_per_token']:.2f}x   target: <= {r['target_step_per_token']}x "
          f"(per-token parity), {verdict}")


# ---------------------------------------------------------------------------------------------------------------
# latent exchange vs visible exchange

LATENT_SIDES = ("visible", "latent")


def _latent_configs(span: str, overrides: Sequence[str]) -> dict[str, Any]:
    """Each side's config: the run's own, as ``agon_vs_grpo`` composes it, the exchange last."""
    from agon.training.checks import compose_config

    common = ["logger=none", "eval.at_start=false", "progress=false", *overrides]
    return {"visible": compose_config([*common, "exchange=visible"]),
            "latent": compose_config([*common, "exchange=latent", f"exchange.span={span}"])}


def latent_vs_visible(steps: int = 5, span: str = "trace", overrides: Sequence[str] = ()) -> dict[str, Any]:
    """An Agon step with latent exchange against one with visible exchange (module docstring)."""
    if steps < 2:
        raise ValueError(f"--latent-steps ({steps}) must be at least 2: the first is a warm-up")
    cfgs = _latent_configs(span, overrides)
    t = cfgs["visible"].trainer
    rows = t.prompts_per_step * t.num_generations
    metrics: dict[str, list[dict[str, Any]]] = {side: [] for side in LATENT_SIDES}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        trainers = {side: _run_trainer(cfg, Path(tmp) / side, stack) for side, cfg in cfgs.items()}
        for i in range(steps):
            for side in LATENT_SIDES if i % 2 == 0 else tuple(reversed(LATENT_SIDES)):
                metrics[side].append(trainers[side].step())
    sides = {side: _side(metrics[side], rows, 1) for side in LATENT_SIDES}
    sides["latent"]["prefix_tokens"] = [round(m.get("role/challenger/prefix_tokens", 0.0) * rows)
                                        for m in metrics["latent"]]
    budget = rows * t.max_new_tokens
    unequal = [line for side in LATENT_SIDES for line in unequal_work(f"{side} exchange",
                                                                      sides[side]["completion_tokens"], 2 * budget)]
    memory = {side: _latent_memory(side, span, steps, overrides) for side in LATENT_SIDES}
    ratio = {k: sides["latent"][f"median_{k}_s"] / sides["visible"][f"median_{k}_s"]
             for k in ("step", "generation", "update")}
    ratio["peak_memory"] = memory["latent"]["peak_gib"] / memory["visible"]["peak_gib"]
    return {
        "setup": {"span": span, "prompts_per_step": t.prompts_per_step, "num_generations": t.num_generations,
                  "max_new_tokens": t.max_new_tokens, "steps": steps, "warmup": 1, "overrides": list(overrides),
                  "threads": torch.get_num_threads(), "ignore_eos": True},
        **sides, "memory": memory, "ratio_latent_over_visible": ratio, "budget_tokens_per_role": budget,
        "unequal_work": unequal,
    }


def _latent_memory_once(side: str, span: str, steps: int, overrides: Sequence[str]) -> dict[str, float]:
    """``steps`` steps of one side in this process: its peak resident memory, and how far the steps raised it above
    the peak of building the trainer, in GiB."""
    cfg = _latent_configs(span, overrides)[side]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        trainer = _run_trainer(cfg, Path(tmp) / side, stack)
        before = _peak_gib()
        for _ in range(steps):
            trainer.step()
        peak = _peak_gib()
    return {"peak_gib": peak, "steps_gib": peak - before}


def _latent_memory(side: str, span: str, steps: int, overrides: Sequence[str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "agon.bench", "--latent-child", side, "--latent-span", span,
                          "--latent-steps", str(steps), *overrides], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _print_latent(r: dict[str, Any]) -> None:
    s, ratio = r["setup"], r["ratio_latent_over_visible"]
    print(f"Agon step, latent exchange (span {s['span']}) vs visible: {s['prompts_per_step']} prompts x "
          f"{s['num_generations']} completions x {s['max_new_tokens']} tokens (no stop at the end of turn), "
          f"{s['threads']} threads; {s['steps']} steps each, median of steps 2-{s['steps']}, memory in separate "
          f"processes")
    print(f"  {'':10} {'step s':>8} {'generation s':>13} {'update s':>9} {'peak GiB':>9}   prefix tokens per step")
    for side in LATENT_SIDES:
        a, mem = r[side], r["memory"][side]
        prefix = statistics.median(a["prefix_tokens"]) if side == "latent" else 0
        print(f"  {side:10} {a['median_step_s']:8.3f} {a['median_generation_s']:13.3f} {a['median_update_s']:9.3f} "
              f"{mem['peak_gib']:9.3f}   {prefix:.0f}")
    print(f"  {'latent/vis':10} {ratio['step']:7.2f}x {ratio['generation']:12.2f}x {ratio['update']:8.2f}x "
          f"{ratio['peak_memory']:8.2f}x")


# ---------------------------------------------------------------------------------------------------------------
# agon's GRPO vs TRL's GRPOTrainer


def _setup(hidden: int, layers: int):
    from omegaconf import OmegaConf

    from agon.models import world
    from agon.core.config import ArithmeticTaskConfig, TinyWorldConfig
    from agon.tasks import build_task

    tok = world.build_tokenizer()
    shape = TinyWorldConfig(hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2,
                            intermediate_size=3 * hidden)
    model = world.build_model(shape, len(tok), seed=0)
    task = build_task(OmegaConf.structured(ArithmeticTaskConfig(heldout_size=10, train_size=2000)))
    return tok, model, task


def trl_vs_agon(args) -> dict[str, Any]:
    """agon's GRPO step against TRL's, every completion at its budget on both sides (module docstring)."""
    agon, trl = _agon_steps(args), _trl_steps(args)
    budget = args.prompts * args.generations * args.max_new_tokens
    a, t = _median(agon["step_s"], args.warmup), _median(trl["step_s"], args.warmup)
    return {
        "setup": {"prompts": args.prompts, "generations": args.generations, "max_new_tokens": args.max_new_tokens,
                  "ignore_eos": True, "hidden": args.hidden, "layers": args.layers, "lora_rank": 8,
                  "steps": args.steps, "warmup": args.warmup, "threads": torch.get_num_threads()},
        "agon_trainer": agon | {"median_step_s": a}, "trl": trl | {"median_step_s": t},
        "speedup_trl_over_agon": t / a, "budget_tokens": budget,
        "unequal_work": (unequal_work("agon (vs TRL)", agon["completion_tokens"], budget)
                         + unequal_work("TRL", trl["completion_tokens"], budget)),
    }


def _print_trl(r: dict[str, Any]) -> None:
    s, a, t = r["setup"], r["agon_trainer"], r["trl"]
    print(f"agon GRPO step vs TRL GRPOTrainer step: {s['prompts']} prompts x {s['generations']} completions x "
          f"{s['max_new_tokens']} tokens (every completion to the budget on both), LoRA r={s['lora_rank']}, "
          f"{s['hidden']}x{s['layers']} Qwen3, {s['threads']} threads; median of {s['steps']} steps after "
          f"{s['warmup']} warm-up")
    w = s["warmup"]
    for name, side in (("agon GRPO", a), ("TRL GRPO", t)):
        timed = ", ".join(f"{x:.2f}" for x in side["step_s"][w:])
        tokens = side["completion_tokens"]
        print(f"  {name:9} median {side['median_step_s']:.3f} s/step ({timed})   completion tokens per step "
              f"{tokens[0] if len(set(tokens)) == 1 else '/'.join(map(str, tokens))}")
    ratio = r["speedup_trl_over_agon"]
    print(f"  ratio TRL/agon = {ratio:.2f}x (target >= {TRL_OVER_AGON_TARGET:.1f}x: "
          f"{'met' if ratio >= TRL_OVER_AGON_TARGET else 'NOT met'})")


def _agon_steps(args) -> dict[str, list]:
    from agon.training.checks import compose_config
    from agon.models.policies import build_policies
    from agon.records.recorder import Recorder
    from agon.training.trainer import Trainer

    tok, model, task = _setup(args.hidden, args.layers)
    cfg = compose_config([
        "method=grpo", "logger=none", f"trainer.prompts_per_step={args.prompts}",
        f"trainer.num_generations={args.generations}", f"trainer.max_new_tokens={args.max_new_tokens}",
        "trainer.learning_rate=1e-5", "model.lora.rank=8", "model.lora.alpha=16"])
    cfg.task = task.cfg
    policies = build_policies(cfg, model, tok)
    out: dict[str, list] = {"step_s": [], "completion_tokens": [], "truncated_ratio": []}
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, policies, task, Recorder(Path(tmp), enabled=False), Path(tmp), log=lambda *_: None)
        trainer.sampling = _budgeted(trainer.sampling)
        done = 0
        for _ in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            m = trainer.step()
            out["step_s"].append(time.perf_counter() - t0)
            out["completion_tokens"].append(m["train/generated_tokens"] - done)
            out["truncated_ratio"].append(m["role/drafter/truncated_ratio"])
            done = m["train/generated_tokens"]
    return out


def _trl_steps(args) -> dict[str, list]:
    from datasets import Dataset
    from peft import LoraConfig as PeftLora
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok, model, task = _setup(args.hidden, args.layers)
    problems = list(task.train_problems())[: args.prompts * (args.warmup + args.steps + 2)]
    by_prompt = {}
    prompts = []
    for p in problems:
        text = tok.apply_chat_template([{"role": "user", "content": p.question}], tokenize=False,
                                       add_generation_prompt=True)
        by_prompt[text] = p
        prompts.append(text)

    def reward(prompts, completions, **kw):
        return [float(v.correct) for v in task.verify([by_prompt[p] for p in prompts], completions)]

    out: dict[str, list] = {"step_s": [], "completion_tokens": [], "clipped_ratio": []}
    rows = args.prompts * args.generations

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            out["step_s"].append(time.perf_counter() - self.t0)

        # logging_steps=1: one log per step, after on_step_end, so outside the clock; TRL's own count of the step's
        # completion lengths (up to and including an end of turn) is how we know min_new_tokens took effect
        def on_log(self, args_, state, control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                out["completion_tokens"].append(round(logs["completions/mean_length"] * rows))
                out["clipped_ratio"].append(logs["completions/clipped_ratio"])

    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(output_dir=tmp, per_device_train_batch_size=rows,
                            num_generations=args.generations, max_completion_length=args.max_new_tokens,
                            # every completion to the budget, as agon's ignore_eos (here: the end of turn suppressed)
                            generation_kwargs={"min_new_tokens": args.max_new_tokens},
                            max_steps=args.warmup + args.steps, learning_rate=1e-5, report_to="none",
                            use_cpu=True, logging_steps=1, save_strategy="no", temperature=1.0,
                            gradient_checkpointing=False, disable_tqdm=True)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config,
                              train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tok,
                              peft_config=PeftLora(r=8, lora_alpha=16, target_modules="all-linear",
                                                   task_type="CAUSAL_LM"), callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)  # logging every step is for Clock; printing it is noise
        trainer.train()
    return out


# ---------------------------------------------------------------------------------------------------------------
# scoring memory


SCORING_VOCAB, SCORING_TOKENS, SCORING_ROWS = 151_936, 1024, 4


def engines_side_by_side(rounds: int = 5, overrides: Sequence[str] = (), required: bool = True) -> dict[str, Any]:
    """Seconds to sample one step's drafts with ``hf`` and with vLLM, and vLLM's log-prob mismatch (see above)."""
    from agon.training.checks import compose_config
    from agon.engines import EngineError, Sampling, build_engine
    from agon.engines.hf import HFEngine
    from agon.engines.vllm_engine import vllm_placement
    from agon.models.loading import load_base
    from agon.models.policies import build_policies
    from agon.training.role_batch import sampler_logps
    from agon.tasks import build_task

    cfg = compose_config(["logger=none", "generation.engine=vllm", *overrides])
    try:
        placement = vllm_placement(cfg)
    except EngineError as exc:
        if required:
            raise
        return {"skipped": str(exc)}
    policies = build_policies(cfg, *load_base(cfg.model, cfg.task, log=lambda *_: None))
    adapter = policies.adapters[-1]  # B under the default divergent init: a LoRA that changes the output
    task = build_task(cfg.task)
    t = cfg.trainer
    problems = list(task.train_problems())[: t.prompts_per_step]
    prompts = [policies.render(task.user_message(p)) for p in problems for _ in range(t.num_generations)]
    sampling = _budgeted(Sampling.from_config(t))
    engines = {"hf": HFEngine(policies), "vllm": build_engine(cfg, policies, log=lambda *_: None)}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    unequal: list[str] = []
    try:
        for r in range(rounds + 1):  # round 0 warms both up
            for name in (list(engines) if r % 2 else list(reversed(engines))):
                t0 = time.perf_counter()
                out = engines[name].sample(prompts, adapter, sampling)
                seconds[name].append(time.perf_counter() - t0)
                if name == "vllm":
                    served = out
                tokens = sum(c.n_tokens for c in out)
                if tokens != len(prompts) * t.max_new_tokens:
                    unequal.append(f"engines: {name} wrote {tokens} tokens, not {len(prompts)} x {t.max_new_tokens}")
    finally:
        engines["vllm"].close()
        task.close()
    batch = policies.batch_tensors(prompts, served)
    with torch.no_grad(), policies.use_adapter(adapter):
        ours = policies.token_logps(batch, None, t.temperature)
    mask = batch.completion_mask.bool()
    theirs = sampler_logps([c.logps for c in served], ours.size(1))
    diff = (ours - theirs).abs()[mask]
    hf_s, vllm_s = _median(seconds["hf"], 1), _median(seconds["vllm"], 1)
    return {"rows": len(prompts), "max_new_tokens": t.max_new_tokens, "placement": placement, "hf_s": hf_s,
            "vllm_s": vllm_s, "vllm_over_hf": vllm_s / hf_s, "seconds": seconds,
            "logp_diff_mean": float(diff.mean()), "logp_diff_max": float(diff.max()), "unequal_work": unequal}


def sandbox_overhead(runs: int = 20) -> dict[str, Any]:
    """Median seconds of a hello-world program through the isolated sandbox and through no isolation."""
    from agon.tasks.sandbox import LocalSandbox, RunRequest

    sides = {"isolated": LocalSandbox(), "unisolated": LocalSandbox(bwrap="/nonexistent", allow_unsafe=True)}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    request = RunRequest(code='print("hello world")')
    for i in range(runs + 1):  # the first of each warms up
        for name in (list(sides) if i % 2 else list(reversed(sides))):
            t0 = time.perf_counter()
            res = sides[name].run(request)
            seconds[name].append(time.perf_counter() - t0)
            if res.stdout != "hello world\n":
                raise RuntimeError(f"sandbox bench: {name} run failed: {res}")
    isolated, bare = _median(seconds["isolated"], 1), _median(seconds["unisolated"], 1)
    return {"runs": runs, "isolated_s": isolated, "unisolated_s": bare, "isolation_overhead_s": isolated - bare,
            "isolated_over_bare": isolated / bare,
            "isolation": sides["isolated"].isolation, "seconds": seconds}


def _print_sandbox(r: dict[str, Any]) -> None:
    print(f"sandbox, hello world x {r['runs']} (median): isolated ({r['isolation']}) {1000 * r['isolated_s']:.1f} ms, "
          f"no isolation {1000 * r['unisolated_s']:.1f} ms: isolation costs {1000 * r['isolation_overhead_s']:.1f} "
          f"ms per program")


def _print_engines(r: dict[str, Any]) -> None:
    if "skipped" in r:
        print(f"engines: skipped ({r['skipped']})")
        return
    print(f"engines ({r['rows']} completions x {r['max_new_tokens']} tokens, vLLM {r['placement']}): hf "
          f"{r['hf_s']:.2f}s, vLLM {r['vllm_s']:.2f}s = {r['vllm_over_hf']:.2f}x; vLLM vs trainer log-probs: mean "
          f"|diff| {r['logp_diff_mean']:.2e}, max {r['logp_diff_max']:.2e}")


def _print_memory(memory: dict[str, dict[str, float]]) -> None:
    full, sel = memory["full"], memory["selective"]
    print(f"scoring 4 x {SCORING_TOKENS} tokens at vocabulary {SCORING_VOCAB:,}, forward + backward, peak RSS in "
          f"separate processes: selective {sel['peak_gib']:.2f} GiB vs full log-softmax {full['peak_gib']:.2f} GiB "
          f"= {sel['peak_gib'] / full['peak_gib']:.2f}x (above the loaded model: {sel['scoring_gib']:.2f} vs "
          f"{full['scoring_gib']:.2f} GiB)")


def _score_once(kind: str) -> dict[str, float]:
    """Forward + backward of one batch's log-probabilities with ``kind`` scoring; peak RSS in GiB (this process)."""
    from omegaconf import OmegaConf
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agon.core.config import LoraConfig
    from agon.models.policies import Policies
    from agon.models.tokens import Completion
    from agon.core.scoring import full_logps
    from agon.models.world import build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=SCORING_VOCAB, hidden_size=1024, intermediate_size=3072, num_hidden_layers=2,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        max_position_embeddings=4096, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    for p in model.parameters():
        p.requires_grad_(False)
    policies = Policies(model, tok, ["A"], OmegaConf.structured(LoraConfig(rank=8, alpha=16)))
    completions = [Completion("", tuple(torch.randint(0, SCORING_VOCAB, (SCORING_TOKENS,)).tolist()), True)
                   for _ in range(SCORING_ROWS)]
    batch = policies.batch_tensors([policies.render("1+2+3")] * SCORING_ROWS, completions)
    before = _peak_gib()
    if kind == "selective":
        logps = policies.token_logps(batch)
    else:
        ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
        attn = torch.cat([batch.prompt_mask, batch.completion_mask], 1)
        logits = policies.model(input_ids=ids, attention_mask=attn, use_cache=False).logits
        logps = full_logps(logits[:, batch.prompt_ids.size(1) - 1 : -1], batch.completion_ids)
    logps.sum().backward()
    peak = _peak_gib()
    return {"peak_gib": peak, "scoring_gib": peak - before}


def _peak_gib() -> float:
    """This process's peak resident memory so far, in GiB: its own high-water mark (``VmHWM``), not ``ru_maxrss``,
    which Linux keeps across fork and exec, so that a child of a large parent reports at least the parent's size.
    ``ru_maxrss`` only where there is no /proc."""
    with contextlib.suppress(OSError):
        found = re.search(r"^VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
        if found:
            return int(found.group(1)) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# ---------------------------------------------------------------------------------------------------------------
# the update on a length-skewed batch: contiguous micro-batches against length-sorted ones with solo long rows


# before: today's contiguous slices in the batch's order; after: RoleBatch.micro_batches
SKEW_SIDES = ("contiguous", "by_length")
SKEW_HIDDEN, SKEW_LAYERS, SKEW_SHORT_MAX = 128, 4, 48


def _skew_shape(args) -> dict[str, int]:
    """The batch's shape and, scaled to its long rows as the paper preset's are to 16,384 tokens, the token budget
    (4 long rows) and the solo threshold (half a long row)."""
    long = args.skew_long_tokens
    return {"rows": args.skew_rows, "long_rows": args.skew_long_rows, "long_tokens": long,
            "short_max": SKEW_SHORT_MAX, "budget": 4 * long, "solo": long // 2}


def _skew_setup(shape: dict[str, int]):
    """(policies, batch): one LoRA on a random Qwen3-architecture model, and a RoleBatch whose long rows sit evenly
    spaced among short ones (random completion tokens, random advantages, seeded)."""
    from omegaconf import OmegaConf

    from agon.models import world
    from agon.core.config import LoraConfig, TinyWorldConfig
    from agon.models.policies import Policies
    from agon.models.tokens import Completion
    from agon.training.role_batch import RoleBatch

    tok = world.build_tokenizer()
    tiny = TinyWorldConfig(hidden_size=SKEW_HIDDEN, num_layers=SKEW_LAYERS, num_heads=4, num_kv_heads=2,
                           intermediate_size=3 * SKEW_HIDDEN, max_position=shape["long_tokens"] + 64)
    model = world.build_model(tiny, len(tok), seed=0)
    for p in model.parameters():
        p.requires_grad_(False)
    policies = Policies(model, tok, ["A"], OmegaConf.structured(LoraConfig(rank=8, alpha=16)))
    gen = torch.Generator().manual_seed(0)
    n, spacing = shape["rows"], shape["rows"] // max(shape["long_rows"], 1)
    long = {spacing // 2 + k * spacing for k in range(shape["long_rows"])}
    lengths = [shape["long_tokens"] if i in long else int(torch.randint(8, shape["short_max"] + 1, (), generator=gen))
               for i in range(n)]
    completions = [Completion("", tuple(torch.randint(5, len(tok), (m,), generator=gen).tolist()), True)
                   for m in lengths]
    prompts = [policies.render(f"{i}+{2 * i}-3") for i in range(n)]
    tokens = policies.batch_tensors(prompts, completions)
    batch = RoleBatch(role="drafter", adapter="A", tokens=tokens, advantages=torch.randn(n, generator=gen),
                      group_ids=torch.arange(n) // 4, batch_tokens=float(tokens.completion_mask.sum()), batch_rows=n,
                      frac_zero_std=0.0)
    return policies, batch


def _skew_parts(batch, side: str, shape: dict[str, int]) -> list:
    from agon.models.tokens import token_batches

    if side == "contiguous":
        return [batch[part] for part in token_batches(batch.tokens.widths(), shape["budget"])]
    return list(batch.micro_batches(shape["budget"], None, shape["solo"]))


def _skew_update(policies, batch, parts) -> list[torch.Tensor]:
    """One update of ``parts`` (forward, the trainer's default DAPO loss normalised by the whole batch, backward);
    the LoRA weights' gradient."""
    from agon.core.grpo import policy_loss

    params = policies.parameters("A")
    for p in params:
        p.grad = None
    with policies.use_adapter("A"):
        for mb in parts:
            logps = policies.token_logps(mb.tokens)
            loss, _ = policy_loss(logps, logps.detach(), mb.advantages, mb.mask, loss_type="dapo", epsilon=0.2,
                                  max_completion_length=batch.tokens.completion_ids.size(1),
                                  num_items_in_batch=batch.batch_tokens, batch_rows=batch.batch_rows)
            loss.backward()
    return [p.grad.clone() for p in params]


def _computed_tokens(parts) -> int:
    """Rows x padded width summed over micro-batches: the tokens the forward and backward passes run on."""
    return sum(len(mb) * (int(mb.tokens.prompt_mask.sum(1).max()) + int(mb.tokens.completion_mask.sum(1).max()))
               for mb in parts)


def length_skew(shape: dict[str, int], rounds: int = 3) -> dict[str, Any]:
    """The update of one length-skewed batch cut the two ways, side by side (module docstring)."""
    policies, batch = _skew_setup(shape)
    parts = {side: _skew_parts(batch, side, shape) for side in SKEW_SIDES}
    seconds: dict[str, list[float]] = {side: [] for side in SKEW_SIDES}
    grads: dict[str, list[torch.Tensor]] = {}
    for r in range(rounds + 1):  # round 0 warms both up
        for side in (SKEW_SIDES if r % 2 else tuple(reversed(SKEW_SIDES))):
            t0 = time.perf_counter()
            grads[side] = _skew_update(policies, batch, parts[side])
            seconds[side].append(time.perf_counter() - t0)
    before, after = grads["contiguous"], grads["by_length"]
    scale = max(float(g.abs().max()) for g in before)
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(after, before)) / max(scale, 1e-30)
    unequal = []
    for side in SKEW_SIDES:
        rows = sorted(i for mb in parts[side] for i in (mb.rows.tolist() if mb.rows is not None else []))
        if rows != list(range(len(batch))):
            unequal.append(f"length-skew: {side} scored rows {rows}, not each of the {len(batch)} once")
    if not grad_diff < 1e-4:
        unequal.append(f"length-skew: the two sides' gradients differ by {grad_diff:.2e} of the largest entry")
    memory = {side: _skew_memory(side, shape) for side in SKEW_SIDES}
    median = {side: _median(seconds[side], 1) for side in SKEW_SIDES}
    before_update = memory["contiguous"]["update_gib"]
    ratio = {"seconds": median["by_length"] / median["contiguous"],
             "peak_memory": memory["by_length"]["peak_gib"] / memory["contiguous"]["peak_gib"],
             "update_memory": memory["by_length"]["update_gib"] / before_update if before_update > 0 else math.nan}
    return {
        "setup": {**shape, "hidden": SKEW_HIDDEN, "layers": SKEW_LAYERS, "lora_rank": 8, "rounds": rounds,
                  "threads": torch.get_num_threads(),
                  "rows_tokens": int(batch.tokens.prompt_mask.sum() + batch.tokens.completion_mask.sum())},
        "micro_batches": {side: [len(mb) for mb in parts[side]] for side in SKEW_SIDES},
        "computed_tokens": {side: _computed_tokens(parts[side]) for side in SKEW_SIDES},
        "seconds": seconds, "median_s": median, "memory": memory, "ratio_by_length_over_contiguous": ratio,
        "grad_max_rel_diff": grad_diff, "unequal_work": unequal,
    }


def _skew_memory_once(side: str, shape: dict[str, int]) -> dict[str, float]:
    """One update of ``side`` in this process: its peak resident memory, and how far the update raised it above the
    peak of building the model and the batch, in GiB."""
    policies, batch = _skew_setup(shape)
    parts = _skew_parts(batch, side, shape)
    before = _peak_gib()
    _skew_update(policies, batch, parts)
    peak = _peak_gib()
    return {"peak_gib": peak, "update_gib": peak - before}


def _skew_memory(side: str, shape: dict[str, int]) -> dict[str, float]:
    sizes = ["--skew-rows", str(shape["rows"]), "--skew-long-rows", str(shape["long_rows"]),
             "--skew-long-tokens", str(shape["long_tokens"])]
    out = subprocess.run([sys.executable, "-m", "agon.bench", "--skew-child", side, *sizes], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _print_length_skew(r: dict[str, Any]) -> None:
    s, ratio, tokens, mem = r["setup"], r["ratio_by_length_over_contiguous"], r["computed_tokens"], r["memory"]
    print(f"update of a length-skewed batch: {s['rows']} rows, {s['long_rows']} of {s['long_tokens']} completion "
          f"tokens among rows of at most {s['short_max']}, {s['hidden']}x{s['layers']} Qwen3, "
          f"LoRA r={s['lora_rank']}, budget {s['budget']} tokens, solo from {s['solo']}, {s['threads']} threads; "
          f"median of {s['rounds']} rounds, memory in separate processes")
    for side, label in (("contiguous", "contiguous (before)"), ("by_length", "by length, solo long rows")):
        print(f"  {label:26} {r['median_s'][side]:7.3f} s  peak {mem[side]['peak_gib']:.2f} GiB (update "
              f"{mem[side]['update_gib']:.3f} GiB)  {tokens[side]} tokens computed for {s['rows_tokens']}  "
              f"micro-batches {r['micro_batches'][side]}")
    print(f"  after/before: seconds {ratio['seconds']:.2f}x, peak memory {ratio['peak_memory']:.2f}x, memory the "
          f"update adds {ratio['update_memory']:.2f}x; gradients agree to {r['grad_max_rel_diff']:.1e}")


def _scoring_memory(kind: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "agon.bench", "--scoring-child", kind], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
