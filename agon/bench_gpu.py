"""``make bench-gpu``: an Agon step at Qwen3-0.6B's shape on a GPU, random weights, at 1,024 and 4,096 new tokens.

For each completion budget it runs one short warm-up step (``--warmup-tokens`` new tokens) and ``--steps`` measured
Agon steps (both roles: drafts,
recaps, challenges, the GRPO update of each adapter) with the paper preset's settings (bf16, gradient checkpointing,
LoRA r=16, token-budget micro-batches, chunked scoring) and records seconds per step, generated tokens per second
and peak GPU memory (``torch.cuda.max_memory_allocated``) into ``bench-gpu.json`` with the date and the device,
rewritten after each budget so a run stopped by a time limit keeps what it measured.
Random weights almost never emit the end-of-turn token, so every completion runs to the budget: the worst case.

It refuses to run without CUDA (exit code 2). ``--cpu-check`` runs the same code on a CPU at a tiny shape, so a
machine without a GPU can check that the script works. Left out on purpose: vLLM (the engine is HF ``generate``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=151_936)


def measure(new_tokens: int, prompts: int, generations: int, steps: int, device: str,
            shape: dict | None = None, warmup_tokens: int = 32) -> dict:
    """A warm-up step at ``warmup_tokens``, then ``steps`` Agon steps at ``new_tokens``; seconds, tokens per second,
    peak memory."""
    import dataclasses

    from agon.config import compose_config
    from agon.policies import build_policies
    from agon.qwen3_shape import build_tokenizer, qwen3_config
    from agon.recorder import Recorder
    from agon.tasks import build_task
    from agon.trainer import Trainer

    cfg = compose_config([
        "experiment=paper_deepmath", "task=arithmetic", "logger=none", f"trainer.max_new_tokens={new_tokens}",
        f"trainer.prompts_per_step={prompts}", f"trainer.num_generations={generations}"])
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = __import__("transformers").AutoModelForCausalLM.from_config(
        qwen3_config("0.6b", **(shape or {})), dtype=torch.bfloat16).to(device)
    for p in model.parameters():
        p.requires_grad_(False)
    task = build_task(cfg.task)
    policies = build_policies(cfg, model, tokenizer)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, policies, task, Recorder(Path(tmp), enabled=False), Path(tmp), log=lambda *_: None)
        budget = trainer.sampling
        trainer.sampling = dataclasses.replace(budget, max_new_tokens=warmup_tokens)
        trainer.step()  # kernels, the allocator and the tokenizer warm up on a short step
        trainer.sampling = budget
        rows = []
        for _ in range(steps):
            if device == "cuda":
                torch.cuda.synchronize()
            t0, before = time.perf_counter(), trainer.state.generated_tokens
            m = trainer.step()
            if device == "cuda":
                torch.cuda.synchronize()
            rows.append({"step_s": time.perf_counter() - t0, "generation_s": m["time/generation_s"],
                         "tokens": m["train/generated_tokens"] - before})
    out = {
        "new_tokens": new_tokens, "prompts_per_step": prompts, "num_generations": generations,
        "step_s": [r["step_s"] for r in rows], "generation_s": [r["generation_s"] for r in rows],
        "generated_tokens_per_step": [r["tokens"] for r in rows],
        "generated_tokens_per_s": sum(r["tokens"] for r in rows) / sum(r["generation_s"] for r in rows),
    }
    if device == "cuda":
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["peak_gpu_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    del trainer, policies, model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agon.bench_gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--warmup-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("bench-gpu.json"))
    parser.add_argument("--cpu-check", action="store_true", help="run on CPU at a tiny shape (checks the script)")
    args = parser.parse_args(argv)
    if not args.cpu_check and not torch.cuda.is_available():
        print("make bench-gpu needs a CUDA device; none is visible here (torch.cuda.is_available() is False). "
              "Use --cpu-check to test the script itself on a CPU.", file=sys.stderr)
        return 2
    device = "cpu" if args.cpu_check else "cuda"
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (--cpu-check, tiny shape)",
        "torch": torch.__version__, "shape": "Qwen3-0.6B" if device == "cuda" else f"Qwen3-0.6B with {TINY_SHAPE}",
        "results": [],
    }
    for n in args.new_tokens:
        r = measure(n, args.prompts, args.generations, args.steps, device, TINY_SHAPE if args.cpu_check else None,
                    args.warmup_tokens)
        report["results"].append(r)
        args.out.write_text(json.dumps(report, indent=2))
        peak = f", peak GPU memory {r['peak_gpu_gib']:.1f} GiB" if "peak_gpu_gib" in r else ""
        print(f"{r['new_tokens']:>5} new tokens, {r['prompts_per_step']} prompts x {r['num_generations']}: Agon step "
              f"{sum(r['step_s']) / len(r['step_s']):.1f} s, {r['generated_tokens_per_s']:.0f} generated tokens/s"
              f"{peak}", flush=True)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
