"""``make smoke-real``: the real code path at a model's exact shape (Qwen3-0.6B unless ``MODEL=`` names another
``conf/model`` option), on a CPU, in minutes.

A randomly initialised checkpoint with the model's published configuration and a tokenizer with its family's special
tokens, chat template and vocabulary size (``agon.bench.model_shape``, built once and cached; ``--layers N`` keeps the
width and vocabulary but only the first N layers, for models that do not fit the machine, cut as the family keeps its
layers valid, ``Family.cut_layers``: a depth below the smallest cut, which ``--help`` lists per shape, is refused
before anything is built) is loaded
through ``from_pretrained`` by ``python -m agon.run experiment=paper_deepmath debug=smoke_real model=<model>
model.path=<dir>``, in a child process: bfloat16 (float32 on a CPU without native bfloat16 matmul, where bfloat16
would take hours), gradient checkpointing, micro-batches, the paper's reward and LoRA rank, DeepMath grading on a
small local file. Two Agon steps and one cascade evaluation on two problems with up to 64 new tokens. It prints
and writes (``smoke_real.json``) seconds per step, the peak resident memory of the run's process and of its process
tree (graders included), and the adapter pair's share of the base parameters at r=8 and r=16.

``--model-path DIR`` runs a real checkpoint of the model through the same path. Left out on purpose: any judgement
of the numbers the run reports about accuracy; the weights are random.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from agon.bench.model_shape import layers_help
from agon.models.loading import cpu_has_fast_bf16
from agon.training.memory import adapter_share

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DATA = ROOT / "tests" / "tasks" / "fixtures" / "deepmath.jsonl"


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[int, float, int, int]:
    """(exit code, seconds, peak RSS of the process, peak summed RSS of its process tree sampled every 0.2 s)."""
    t0 = time.time()
    child = subprocess.Popen(cmd, env=env, cwd=ROOT)
    peak_tree, done = 0, threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        proc = psutil.Process(child.pid)
        while not done.is_set():
            try:
                peak_tree = max(peak_tree, _tree_rss(proc))
            except psutil.Error:
                return
            done.wait(0.2)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(child.pid, 0)
    done.set()
    watcher.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, time.time() - t0, usage.ru_maxrss * 1024, peak_tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agon.bench.smoke_real", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3_0.6b", help="a conf/model option with a published shape")
    parser.add_argument("--layers", type=int, default=None, metavar="N", help=layers_help())
    parser.add_argument("--model-path", type=Path, help="a real checkpoint of --model instead of the random one")
    parser.add_argument("--source", default=str(SAMPLE_DATA), help="DeepMath problems (parquet or JSONL)")
    parser.add_argument("--out", type=Path, default=Path("smoke-real"), help="run directory and smoke_real.json")
    parser.add_argument("--max-minutes", type=float, default=20.0, help="fail when the run takes longer")
    parser.add_argument("--max-rss-gib", type=float, default=12.0, help="fail when the run's peak RSS is larger")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the run")
    args = parser.parse_args(argv)

    from transformers import AutoConfig

    from agon.bench.model_shape import cut_overrides, ensure_model, model_shape_of

    family, size = model_shape_of(args.model)
    if args.model_path is None:
        layers = cut_overrides(parser, family, size, args.layers)
        model_dir = ensure_model(family, size, "bfloat16", log=lambda m: print(m, flush=True), overrides=layers)
    else:
        model_dir = args.model_path
    run_dir = args.out.resolve() / time.strftime("%Y%m%d-%H%M%S")
    dtype = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("model.dtype=")), "bfloat16")
    overrides = list(args.overrides)
    if dtype == "bfloat16" and not torch.cuda.is_available() and not cpu_has_fast_bf16():
        # the path is the same in float32; bfloat16 here would take hours, not minutes
        dtype = "float32"
        overrides.append("model.dtype=float32")
        print("[smoke-real] this CPU has no native bfloat16 matmul (torch's fallback is about 90x slower than "
              "float32): running in float32", flush=True)
    cmd = [sys.executable, "-m", "agon.run", "experiment=paper_deepmath", f"model={args.model}", "debug=smoke_real",
           "logger=none",
           f"model.path={model_dir}", f"task.source={args.source}", f"output_dir={run_dir}", *overrides]
    print("[smoke-real]", " ".join(cmd[1:]), flush=True)
    code, seconds, peak, peak_tree = run_measured(cmd, dict(os.environ))
    if code != 0:
        print(f"[smoke-real] the run failed (exit code {code}) after {seconds:.0f}s", file=sys.stderr)
        return code

    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_s = [m["time/step_s"] for m in steps if "time/step_s" in m]
    gen_s = [m["time/generation_s"] for m in steps if "time/generation_s" in m]
    summary = json.loads((run_dir / "summary.json").read_text())
    shares, config = {}, AutoConfig.from_pretrained(model_dir)
    for rank in (8, 16):
        base, lora, uncovered = adapter_share(config, rank)
        shares[rank] = 2 * lora / base
    text = config.get_text_config()
    report = {
        "model": args.model, "family": family, "shape": size, "layers": text.num_hidden_layers,
        "base_parameters": base, "model_dir": str(model_dir), "run_dir": str(run_dir), "threads": os.cpu_count(),
        "dtype": dtype,
        "seconds_total": seconds, "seconds_per_step": step_s, "generation_seconds_per_step": gen_s,
        "peak_rss_gib": peak / 2**30, "peak_tree_rss_gib": peak_tree / 2**30,
        "adapter_pair_share": {f"r{r}": s for r, s in shares.items()},
        "train_steps": summary["train/steps"], "eval_final_trace_tokens": summary["eval/final_trace_tokens"],
        "adapters_moved": summary.get("train/adapters_moved"), "base_unchanged": summary.get("train/base_unchanged"),
    }
    (args.out / "smoke_real.json").write_text(json.dumps(report, indent=2))
    print(f"[smoke-real] {args.model} shape, {text.num_hidden_layers} layers "
          f"({model_dir.name if args.model_path is None else model_dir}), {dtype}, "
          f"gradient checkpointing, micro-batches of 2: {summary['train/steps']} Agon steps and one cascade "
          f"evaluation in {seconds:.0f}s")
    print(f"[smoke-real] seconds per step: {', '.join(f'{s:.1f}' for s in step_s)} "
          f"(generation {', '.join(f'{s:.1f}' for s in gen_s)})")
    print(f"[smoke-real] peak resident memory: {peak / 2**30:.2f} GiB (run process), "
          f"{peak_tree / 2**30:.2f} GiB (with its grader processes)")
    print(f"[smoke-real] adapter pair / base parameters: {shares[8]:.2%} at r=8, {shares[16]:.2%} at r=16 "
          f"(this run: r={summary['config']['model']['lora']['rank']})")
    print(f"[smoke-real] written to {args.out / 'smoke_real.json'}")
    checks = {f"took {seconds / 60:.1f} min > --max-minutes {args.max_minutes}": seconds > 60 * args.max_minutes,
              f"peak RSS {peak / 2**30:.2f} GiB > --max-rss-gib {args.max_rss_gib}": peak > args.max_rss_gib * 2**30,
              f"{uncovered} linear layers of the language model have no LoRA": uncovered > 0}
    limits = [message for message, failed in checks.items() if failed]
    for limit in limits:
        print(f"[smoke-real] FAILED: {limit}", file=sys.stderr)
    return 1 if limits else 0


if __name__ == "__main__":
    sys.exit(main())
