"""``python -m agon.bench.gpu --out DIR`` (``tools/gpu_check.sh``): what a first GPU session must learn, in one run.

Four parts, each written to ``DIR/bench-gpu.json`` as soon as it finishes and each guarded, so that one failing
(an OOM, a missing kernel, NCCL refusing to start) is recorded with its error and the others still run, and a run
stopped by a time limit keeps what it measured. In the order they run:

1. ``collectives``: a one-process process group (world size 1, a ``FileStore`` in a temporary directory) on
   ``agon.core.distributed.process_group_backend`` ("cpu:gloo,cuda:nccl" on a GPU, "gloo" on a CPU), and every
   collective the trainer runs, through ``agon.core.distributed.Ranks`` and accelerate, with the tensors the trainer
   hands them: a CPU float64 tensor of statistics and the flat fp32 LoRA gradients on the device (``sum_``), the
   adapter weights (``broadcast_``), pickled games (``gather``), a path (``share``), ``barrier``. Each is ok or
   failed with its error. On a GPU it also all-reduces the CPU tensor in a group of NCCL alone, which is what a group
   started with plain "nccl" would do with the trainer's statistics. It runs in a child process with a timeout: a
   process group changes global state, and a hung collective must not take the rest of the run with it.
2. ``scoring``: the trainer's scoring path (``Policies.token_logps``: bf16 base, LoRA r=16, gradient checkpointing,
   chunked head, the trainer's temperature and truncation) forward and backward (``.sum().backward()``) on the two
   micro-batch shapes training builds: one 16,384-token row alone (a row of ``solo_row_tokens`` or more: no mask,
   SDPA's causal flash path), and the first micro-batch ``length_batches`` makes of rows just under
   ``solo_row_tokens`` (8 rows of ~8k filling ``scoring_batch_tokens``, left/right-padded, a mask): seconds of a
   warm pass, peak GPU memory, and which SDPA backend ran, read from the op names torch's profiler records on a
   third pass. Then one checkpointed chunk of the output head (``selective_logps`` at ``logit_chunk_tokens`` and
   at 512), forward and backward: its peak memory over its float32 logits, the factor the preset's memory comment
   rests on.
3. ``step``: an Agon step at Qwen3-0.6B's shape with random weights, the paper preset's settings, 256 new tokens
   (``--new-tokens 1024`` for the budget the engines were first measured at: about 10 minutes on an H200 without
   flash attention, past the 6 this check is sized for), 8 problems x 8 completions (64 rows per role), with each
   engine available here: ``hf_continuous`` (what a GPU
   image without vLLM runs), ``hf``, and ``vllm`` where it is installed (recorded as skipped where not). One short
   warm-up step, then ``--steps`` measured ones: seconds per step, generation seconds, seconds per decoding step
   (each engine call's seconds over its longest completion), generated tokens per second, peak GPU memory, and the
   attention implementation the model's attention layers ran with during generation (continuous batching switches
   to ``paged|flash_attention_*`` only where ``flash-attn`` or ``kernels`` imports, else ``paged|sdpa``). Random
   weights almost never emit the end-of-turn token, so every completion runs to the budget: the worst case.
4. ``context``: ``hf_continuous`` alone at longer prompts (64 rows of 2,048-token prompts, 32 new tokens, every
   completion to the budget): a prefill-only call and a full call, so the seconds per decoding step at ~2k tokens of
   context set beside the step's show how continuous batching's cost grows with the context. Skipped, with its
   reason, when the estimate from the step says it would end past ``--budget-s``.

``--cpu-check`` runs all four on a CPU at a tiny shape (gloo, 32-token rows, 8 new tokens, float32 where the CPU
has no fast bf16) so that a machine without a GPU can check the script; a test does. Without ``--cpu-check`` it
refuses to run where CUDA is not available (exit code 2). It needs hydra-core and omegaconf (the config is composed
as ``agon.run`` composes it); on a bare GPU image ``tools/gpu_check.sh`` puts the wheels of ``make gpu-wheels`` on
the import path (docs/gpu.md).

Left out on purpose: wandb (not on the bare image), 1,024+ new tokens in a step by default (the decoding-step
seconds and the context part predict them; ``--new-tokens`` measures them), vLLM's speed where it is not installed
(the bare image has none), and more than one process (a world of one checks that the collectives start and take the
trainer's tensors, not their bandwidth).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[2]
REPORT = "bench-gpu.json"
PARTS = ("collectives", "scoring", "step", "context")
ENGINE_NAMES = ("hf_continuous", "hf", "vllm")
TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=151_936)
# the paper preset, on the offline arithmetic task (its prompts are short; the completions are what costs), with a
# small training pool: drawing the default 100,000 problems takes seconds the bench does not need
BASE_OVERRIDES = ["experiment=paper_deepmath", "task=arithmetic", "task.train_size=1000", "logger=none"]
# torch's SDPA ops (the same names on CPU and CUDA, besides the CPU flash kernel's) -> the backend they are
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}
KERNEL_HINTS = ("flash", "fmha", "attention", "sdpa", "cudnn")
HIDDEN_ARGS = ("collectives_child", "device", "shape_json", "lora_rank")
# what decides which attention continuous batching runs (flash_attn or kernels: flash; neither: paged|sdpa), and vLLM
OPTIONAL_MODULES = ("flash_attn", "kernels", "vllm")


# -- the report ------------------------------------------------------------------------------------------------


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Report:
    """The JSON file, rewritten whole (to a temporary name, then renamed) after every change, so that a run killed
    at any point leaves a readable file with everything measured until then."""

    def __init__(self, path: Path, head: dict[str, Any]):
        self.path, self.data, self.t0 = path, dict(head), time.perf_counter()
        self.data["errors"] = []
        self.write()

    def write(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self.t0, 2)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        os.replace(tmp, self.path)

    def run(self, key: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` stored under ``key``; its exception stored instead, the run going on."""
        t0 = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - any failure of one part is a result, not the end of the run
            value = {"error": error_text(exc), "traceback": traceback.format_exc(limit=8)}
            self.data["errors"].append(f"{key}: {error_text(exc)}")
        if isinstance(value, dict):
            value.setdefault("part_s", round(time.perf_counter() - t0, 2))
        self.data[key] = value
        self.write()
        return value


def versions() -> dict[str, Any]:
    import importlib.metadata as md

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "peft", "accelerate", "hydra-core", "omegaconf", "tokenizers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    import importlib.util

    out["importable"] = {m: importlib.util.find_spec(m) is not None for m in OPTIONAL_MODULES}
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
        for key, read in (("cudnn", lambda: torch.backends.cudnn.version()),
                          ("nccl", lambda: __import__("torch.cuda.nccl").cuda.nccl.version())):
            try:  # metadata: never worth losing the run over
                v = read()
                out[key] = ".".join(map(str, v)) if isinstance(v, tuple) else v
            except Exception as exc:  # noqa: BLE001
                out[key] = error_text(exc)
    return out


# -- shared pieces -----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def tokenizer():
    """Qwen3-like tokenizer (``agon.bench.model_shape``); built once per process, it takes seconds."""
    from agon.families import get_family
    from agon.bench.model_shape import build_tokenizer

    return build_tokenizer(get_family("qwen3").shape)


def compose(overrides: list[str]):
    from agon.training.checks import compose_config

    return compose_config([*BASE_OVERRIDES, *overrides])


def random_model(shape: dict | None, dtype: torch.dtype, device: str):
    """Qwen3-0.6B's configuration (``shape`` overriding it) with random weights, frozen, built on ``device`` (random
    init of 0.6B parameters on the GPU takes a fraction of the time it takes on the CPU)."""
    from transformers import AutoModelForCausalLM

    from agon.families import get_family

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(get_family("qwen3").shape_config("0.6b", **(shape or {})),
                                                 dtype=dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def release(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# -- parts 3 and 4: an Agon step per engine, continuous batching at a longer context ----------------------------


def attention_layer(model) -> torch.nn.Module | None:
    """The first attention module of ``model`` that reads its config (each call reads
    ``config._attn_implementation``, which continuous batching switches for the length of a call)."""
    return next((m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "config")), None)


class EngineCalls:
    """Every ``engine.sample`` call of a trainer timed, with the attention implementation its first attention layer
    ran with during the call (a forward pre-hook, active only inside the call: the update's scoring is not counted;
    under CUDA graphs the hook sees the capture, not the replays, so the counts are of calls seen, the names are
    what matters)."""

    def __init__(self, engine, model, device: str):
        self.engine, self.device, self.calls = engine, device, []
        self.attention: dict[str, int] = {}
        self.layer = attention_layer(model)
        self.sample = engine.sample
        engine.sample = self._sample

    def _seen(self, module, _args) -> None:
        name = str(getattr(module.config, "_attn_implementation", None))
        self.attention[name] = self.attention.get(name, 0) + 1

    def _sample(self, prompts, adapter, sampling, *args, **kwargs):
        hook = self.layer.register_forward_pre_hook(self._seen) if self.layer is not None else None
        sync(self.device)
        t0 = time.perf_counter()
        try:
            out = self.sample(prompts, adapter, sampling, *args, **kwargs)
        finally:
            if hook is not None:
                hook.remove()
        sync(self.device)
        lengths = [c.n_tokens for c in out]
        self.calls.append({"adapter": adapter, "rows": len(prompts), "max_new_tokens": sampling.max_new_tokens,
                           "seconds": time.perf_counter() - t0, "generated_tokens": sum(lengths),
                           "longest": max(lengths, default=0)})
        return out

    def reset(self) -> None:
        self.calls, self.attention = [], {}


def decode_step_s(calls: list[dict]) -> float | None:
    """Seconds per decoding step: each call runs as many steps as its longest completion (prefill included)."""
    steps = sum(c["longest"] for c in calls)
    return sum(c["seconds"] for c in calls) / steps if steps else None


def attention_used(seen: dict[str, int]) -> str | None:
    """The attention implementation(s) seen during an engine's calls, most seen first: continuous batching's own
    choice (``paged|sdpa``, ``paged|flash_attention_2``...; transformers after 5.17 may keep plain ``sdpa``)."""
    return "/".join(sorted(seen, key=lambda k: -seen[k])) or None


def vllm_missing(cfg) -> str | None:
    """Why ``generation.engine=vllm`` cannot run here (``agon.engines.vllm_engine.vllm_placement``'s error), or
    None."""
    from agon.engines import EngineError
    from agon.engines.vllm_engine import vllm_placement

    try:
        vllm_placement(cfg)
    except EngineError as exc:
        return str(exc)
    return None


def measure(engine: str, new_tokens: int, prompts: int, generations: int, steps: int, device: str,
            shape: dict | None = None, warmup_tokens: int = 32, dtype: torch.dtype = torch.bfloat16) -> dict:
    """A warm-up step at ``warmup_tokens``, then ``steps`` Agon steps at ``new_tokens`` sampled by ``engine``;
    seconds, seconds per decoding step, tokens per second, peak memory, the attention implementation."""
    import dataclasses

    from agon.models.policies import build_policies
    from agon.records.recorder import Recorder
    from agon.tasks import build_task
    from agon.training.trainer import Trainer

    overrides = [f"generation.engine={engine}", f"trainer.max_new_tokens={new_tokens}",
                 f"trainer.prompts_per_step={prompts}", f"trainer.num_generations={generations}"]
    cfg = compose(overrides)
    head = {"engine": engine, "new_tokens": new_tokens, "prompts_per_step": prompts, "num_generations": generations}
    if engine == "vllm" and (why := vllm_missing(cfg)):
        return head | {"skipped": why}
    model = random_model(shape, dtype, device)
    task = build_task(cfg.task)
    policies = build_policies(cfg, model, tokenizer())
    with tempfile.TemporaryDirectory() as tmp:
        if engine == "vllm":
            # vLLM loads its own copy of the base from a directory: the same random weights, saved
            model.save_pretrained(Path(tmp) / "base")
            tokenizer().save_pretrained(Path(tmp) / "base")
            cfg = compose([*overrides, f"model.path={Path(tmp) / 'base'}", "generation.fallback=null"])
        trainer = Trainer(cfg, policies, task, Recorder(Path(tmp), enabled=False), Path(tmp), log=lambda *_: None)
        calls = EngineCalls(trainer.engine, model, device)
        budget = trainer.sampling
        trainer.sampling = dataclasses.replace(budget, max_new_tokens=warmup_tokens)
        t0 = time.perf_counter()
        trainer.step()  # kernels, the allocator and the tokenizer warm up on a short step
        warmup_s = time.perf_counter() - t0
        trainer.sampling = budget
        calls.reset()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        rows = []
        for _ in range(steps):
            sync(device)
            t0, before = time.perf_counter(), trainer.state.generated_tokens
            m = trainer.step()
            sync(device)
            rows.append({"step_s": time.perf_counter() - t0, "generation_s": m["time/generation_s"],
                         "tokens": m["train/generated_tokens"] - before})
        engine_class = type(trainer.engine).__name__
        trainer.engine.close()
    out = head | {
        "engine_class": engine_class, "warmup_tokens": warmup_tokens, "warmup_step_s": warmup_s,
        "step_s": [r["step_s"] for r in rows], "generation_s": [r["generation_s"] for r in rows],
        "update_s": [r["step_s"] - r["generation_s"] for r in rows],
        "generated_tokens_per_step": [r["tokens"] for r in rows],
        "generated_tokens_per_s": sum(r["tokens"] for r in rows) / sum(r["generation_s"] for r in rows),
        "engine_calls": calls.calls, "decode_step_s": decode_step_s(calls.calls),
        "attention_seen": calls.attention, "attention": attention_used(calls.attention),
    }
    if device == "cuda":
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["peak_gpu_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    del trainer, policies, model, calls
    release(device)
    return out


def long_prompts(n: int, tokens: int, seed: int = 0) -> list[str]:
    """``n`` different prompts of about ``tokens`` tokens each (lines of random sums, a few tokens a line): different
    from their first line, so continuous batching's prefix sharing has nothing to share."""
    import random

    rng = random.Random(seed)
    line_tokens = max(1, len(tokenizer()("123+456=579\n", add_special_tokens=False)["input_ids"]))
    lines = max(1, tokens // line_tokens)
    out = []
    for _ in range(n):
        sums = [(rng.randrange(1000), rng.randrange(1000)) for _ in range(lines)]
        out.append("".join(f"{a}+{b}={a + b}\n" for a, b in sums))
    return out


def context_point(policies, rows: int, prompt_tokens: int, new_tokens: int, device: str) -> dict:
    """``hf_continuous`` on ``rows`` prompts of ``prompt_tokens`` tokens: a call of one new token (the prefill,
    about), then one of ``new_tokens``, every completion to the budget (``ignore_eos``)."""
    from agon.engines import Sampling
    from agon.engines.hf_continuous import HFContinuousEngine

    cfg = compose([])
    t = cfg.trainer
    engine = HFContinuousEngine(policies, cfg)
    calls = EngineCalls(engine, policies.model, device)
    prompts = long_prompts(rows, prompt_tokens)
    lengths = [len(x) for x in policies.prompt_ids(prompts)]
    adapter = policies.adapters[0]

    def sampling(n: int) -> Sampling:
        return Sampling(n, t.temperature, t.top_p, t.top_k, t.generation_batch_tokens, ignore_eos=True)

    engine.sample(prompts[:2], adapter, sampling(2))  # a warm-up call: small, the kernels are already warm
    calls.reset()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    engine.sample(prompts, adapter, sampling(1))
    engine.sample(prompts, adapter, sampling(new_tokens))
    prefill, full = calls.calls
    out = {"rows": rows, "prompt_tokens_mean": sum(lengths) / len(lengths), "new_tokens": new_tokens,
           "prefill_s": prefill["seconds"], "seconds": full["seconds"], "generated_tokens": full["generated_tokens"],
           "decode_step_s": (full["seconds"] - prefill["seconds"]) / max(1, full["longest"] - 1),
           "generated_tokens_per_s": full["generated_tokens"] / full["seconds"],
           "attention_seen": calls.attention, "attention": attention_used(calls.attention)}
    if device == "cuda":
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def context(device: str, shape: dict | None, dtype: torch.dtype, rows: int, prompt_tokens: list[int],
            new_tokens: int, fits: Callable[[int], str | None]) -> dict:
    """``context_point`` at each of ``prompt_tokens``, in order, while ``fits(prompt_tokens)`` has no objection."""
    from agon.models.policies import build_policies

    model = random_model(shape, dtype, device)
    policies = build_policies(compose([]), model, tokenizer())
    points: list[dict] = []
    out = {"engine": "hf_continuous", "points": points}
    for n in prompt_tokens:
        why = fits(n)
        if why:
            points.append({"prompt_tokens": n, "skipped": why})
            continue
        try:
            points.append({"prompt_tokens": n, **context_point(policies, rows, n, new_tokens, device)})
        except Exception as exc:  # noqa: BLE001 - an OOM at a long context is a result; shorter points stand
            points.append({"prompt_tokens": n, "error": error_text(exc), "traceback": traceback.format_exc(limit=8)})
        release(device)
    del policies, model
    release(device)
    return out


# -- part 2: scoring one long micro-batch ------------------------------------------------------------------------


def padded_tokens(widths: list[int], prompt: int, vocab: int, pad: int, seed: int = 0):
    """``Tokens`` of rows ``widths`` long (prompt + completion), prompts a little shorter on each further row,
    left-padded to ``prompt`` and completions right-padded: the layout ``Policies.batch_tensors`` builds."""
    from agon.models.tokens import Tokens

    g = torch.Generator().manual_seed(seed)
    prompts = [max(1, prompt - 16 * i) for i in range(len(widths))]
    completions = [w - p for w, p in zip(widths, prompts)]
    if min(completions) < 1:
        raise ValueError(f"rows {widths} are too short for prompts of {prompts} tokens")
    n, width = len(widths), max(completions)
    p_ids, p_mask = torch.full((n, prompt), pad), torch.zeros((n, prompt), dtype=torch.long)
    c_ids, c_mask = torch.full((n, width), pad), torch.zeros((n, width), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        p_ids[i, prompt - p :] = torch.randint(0, vocab, (p,), generator=g)
        p_mask[i, prompt - p :] = 1
        c_ids[i, :c] = torch.randint(0, vocab, (c,), generator=g)
        c_mask[i, :c] = 1
    return Tokens(p_ids, p_mask, c_ids, c_mask)


def sdpa_backends(prof) -> dict[str, Any]:
    """Which SDPA backends the profiled region ran, from its op names (and, on CUDA, the attention kernels)."""
    ops: dict[str, int] = {}
    kernels: dict[str, int] = {}
    for e in prof.events():
        name = e.name
        if "scaled_dot_product" in name:
            ops[name] = ops.get(name, 0) + 1
        device_type = getattr(e, "device_type", None)
        if device_type is not None and "CUDA" in str(device_type) and any(h in name.lower() for h in KERNEL_HINTS):
            short = name[:120]
            kernels[short] = kernels.get(short, 0) + 1
    backends = sorted({SDPA_OPS[n] for n in ops if n in SDPA_OPS})
    return {"sdpa_backends": backends, "sdpa_ops": ops, "attention_kernels": kernels}


def score_case(policies, tokens, device: str, score_kwargs: dict, profile: bool) -> dict:
    """Forward and backward of ``tokens`` in one micro-batch: a first (warm-up) pass, a timed pass with its peak
    memory, and a profiled pass that names the SDPA backend."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    params = [p for p in policies.model.parameters() if p.requires_grad]

    def one_pass() -> float:
        for p in params:
            p.grad = None
        sync(device)
        t0 = time.perf_counter()
        logps = policies.token_logps(tokens, None, **score_kwargs)
        logps.sum().backward()
        sync(device)
        if not torch.isfinite(logps.detach()).all():
            raise FloatingPointError("non-finite log-probs")
        return time.perf_counter() - t0

    real = int(tokens.prompt_mask.sum() + tokens.completion_mask.sum())
    out: dict[str, Any] = {
        "rows": len(tokens), "row_tokens": [int(p + c) for p, c in tokens.widths()],
        "width": tokens.prompt_ids.size(1) + tokens.completion_ids.size(1), "real_tokens": real,
        "scored_tokens": int(tokens.completion_mask.sum())}
    out["first_pass_s"] = one_pass()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        out["allocated_before_gib"] = torch.cuda.memory_allocated() / 2**30
    out["seconds"] = one_pass()
    out["tokens_per_s"] = real / out["seconds"]
    if device == "cuda":
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["peak_over_model_gib"] = out["peak_gpu_gib"] - out["allocated_before_gib"]
        out["peak_gpu_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    if profile:
        # the op names alone name the backend: where CUDA tracing fails (no CUPTI), a CPU-only trace still does
        tries = [[ProfilerActivity.CPU, ProfilerActivity.CUDA]] if device == "cuda" else []
        for activities in [*tries, [ProfilerActivity.CPU]]:
            try:
                with profiler(activities=activities) as prof:
                    out["profiled_pass_s"] = one_pass()
                out |= sdpa_backends(prof)
                break
            except Exception as exc:  # noqa: BLE001 - the timing above is already measured
                out.setdefault("profile_errors", []).append(error_text(exc))
    for p in params:
        p.grad = None
    return out


def training_rows(solo: int, budget: int, prompt: int) -> list[int]:
    """Row lengths of the first micro-batch ``length_batches`` builds from rows just under ``solo`` tokens (each
    about 1.5% shorter than the one before, prompts as ``padded_tokens`` lays them out) within ``budget``: the widest
    padded micro-batch training makes, since every row of ``solo`` or more goes alone."""
    from agon.models.tokens import length_batches

    gap = max(1, solo // 64)
    lengths = [solo - 1 - gap * i for i in range(max(2, budget // max(1, solo // 2)))]
    lengths = [n for n in lengths if n > prompt]
    widths = [(max(1, prompt - 16 * i), n - max(1, prompt - 16 * i)) for i, n in enumerate(lengths)]
    first = length_batches(widths, budget, None, solo)[0]
    return [lengths[i] for i in sorted(first)]


def chunk_memory(policies, device: str, chunk_tokens: int, dtype: torch.dtype, score_kwargs: dict) -> dict:
    """One chunk of the output head as the trainer runs it (``selective_logps``: checkpointed, the logits recomputed
    in the backward pass), forward and backward on ``chunk_tokens`` hidden states: seconds, and on CUDA its peak
    memory over what was allocated before, against the chunk's float32 logits."""
    from agon.core.scoring import selective_logps

    head = policies._decoder_and_head()[1]
    hidden_size = policies.model.get_base_model().config.get_text_config().hidden_size
    vocab = policies.model.get_base_model().config.get_text_config().vocab_size
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(chunk_tokens, hidden_size, generator=g, device=device, dtype=dtype, requires_grad=True)
    ids = torch.randint(0, vocab, (chunk_tokens,), generator=g, device=device)
    kwargs = {k: v for k, v in score_kwargs.items() if k in ("temperature", "top_k", "top_p")}
    out: dict[str, Any] = {"chunk_tokens": chunk_tokens, "vocab": vocab,
                           "fp32_logits_gib": chunk_tokens * vocab * 4 / 2**30}

    def one_pass() -> float:
        hidden.grad = None
        sync(device)
        t0 = time.perf_counter()
        selective_logps(hidden, ids, head, chunk_tokens=chunk_tokens, **kwargs).sum().backward()
        sync(device)
        return time.perf_counter() - t0

    out["first_pass_s"] = one_pass()
    hidden.grad = None
    release(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    out["seconds"] = one_pass()
    if device == "cuda":
        out["peak_over_before_gib"] = (torch.cuda.max_memory_allocated() - before) / 2**30
        out["peak_over_fp32_logits"] = out["peak_over_before_gib"] / out["fp32_logits_gib"]
    return out


def scoring(device: str, shape: dict | None, width: int, dtype: torch.dtype, profile: bool = True,
            solo: int | None = None, budget: int | None = None, chunks: list[int] | None = None) -> dict:
    """One ``width``-token row alone, then the padded micro-batch training builds of rows under ``solo`` tokens
    within ``budget`` (the preset's ``solo_row_tokens`` and ``scoring_batch_tokens`` by default), forward and
    backward; then one head chunk of each of ``chunks`` tokens (the preset's ``logit_chunk_tokens`` and 512)."""
    from agon.models.policies import build_policies

    cfg = compose([])
    t = cfg.trainer
    solo, budget = solo or t.solo_row_tokens, budget or t.scoring_batch_tokens
    tok = tokenizer()
    model = random_model(shape, dtype, device)
    policies = build_policies(cfg, model, tok)
    accepted = inspect.signature(policies.token_logps).parameters
    # the trainer's scoring settings; top_k and top_p only where this checkout's token_logps takes them
    wanted = dict(temperature=t.temperature, chunk_tokens=t.logit_chunk_tokens, top_k=t.get("top_k", 0),
                  top_p=t.get("top_p", 1.0))
    score_kwargs = {k: v for k, v in wanted.items() if k in accepted}
    prompt = min(128, width // 8)
    vocab = tok.convert_tokens_to_ids("<|endoftext|>")  # regular ids only: the added tokens start there
    out: dict[str, Any] = {
        "dtype": str(dtype).removeprefix("torch."), "lora_rank": cfg.model.lora.rank,
        "gradient_checkpointing": cfg.model.gradient_checkpointing, "score_kwargs": score_kwargs,
        "solo_row_tokens": solo, "scoring_batch_tokens": budget,
        "attn_implementation": getattr(model.config, "_attn_implementation", None), "cases": {}, "logit_chunks": {}}
    cases = {"one_row": lambda: [width], "training_micro_batch": lambda: training_rows(solo, budget, prompt)}
    for name, widths in cases.items():
        rows: list[int] = []
        try:
            rows = widths()
            out["cases"][name] = score_case(policies, padded_tokens(rows, prompt, vocab, tok.pad_token_id),
                                            device, score_kwargs, profile)
        except Exception as exc:  # noqa: BLE001 - an OOM in the padded case must not hide the single row's numbers
            out["cases"][name] = {"row_tokens": rows, "error": error_text(exc),
                                  "traceback": traceback.format_exc(limit=8)}
        release(device)
    for n in chunks or [t.logit_chunk_tokens, 512]:
        try:
            out["logit_chunks"][str(n)] = chunk_memory(policies, device, n, dtype, score_kwargs)
        except Exception as exc:  # noqa: BLE001 - as above
            out["logit_chunks"][str(n)] = {"chunk_tokens": n, "error": error_text(exc),
                                           "traceback": traceback.format_exc(limit=8)}
        release(device)
    del policies, model
    release(device)
    return out


# -- part 1: the collectives, in a child process -----------------------------------------------------------------


def lora_shapes(shape: dict, rank: int) -> list[tuple[int, ...]]:
    """The LoRA weight shapes of one all-linear adapter on a Qwen3 of ``shape``: what ``Policies.parameters``
    returns, without building the model."""
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    linears = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]  # q k v o gate up down
    return [s for _ in range(layers) for i, o in linears for s in ((rank, i), (o, rank))]


def collectives_child(result_path: Path, device: str, shape: dict, rank: int) -> None:
    """Start a one-process group and run every collective of the trainer through ``Ranks``; each result is written
    to ``result_path`` as it comes, with the name of the one under way, so a hang is named by the parent."""
    import torch.distributed as dist

    from agon.core.distributed import Ranks, process_group_backend

    result: dict[str, Any] = {"device": device}

    def save() -> None:
        result_path.write_text(json.dumps(result, indent=2, default=str))

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        result[name] = {"ok": None, "note": "started, never returned"}
        save()
        t0 = time.perf_counter()
        try:
            detail = fn()
            result[name] = {"ok": True, "seconds": time.perf_counter() - t0, **(detail or {})}
        except Exception as exc:  # noqa: BLE001 - each collective's failure is a result
            result[name] = {"ok": False, "seconds": time.perf_counter() - t0, "error": error_text(exc)}
        save()

    backend = process_group_backend(device)
    result["backend"] = backend
    # what accelerate reads to find a launched process; the group itself is started here, before accelerate
    # looks, so PartialState adopts it instead of starting one of its own (OMP_NUM_THREADS: unset, accelerate's
    # CPU path would reset torch's thread count)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="29511", OMP_NUM_THREADS=str(torch.get_num_threads()))

    def init() -> dict:
        if device == "cuda":
            torch.cuda.set_device(0)  # as Ranks.from_env binds each rank to its GPU before starting the group
        dist.init_process_group(backend=backend, store=dist.FileStore(str(result_path.with_name("store")), 1),
                                rank=0, world_size=1)
        from accelerate import PartialState

        state = PartialState(cpu=device == "cpu")
        return {"torch_backend": str(dist.get_backend()), "accelerate_type": str(state.distributed_type),
                "accelerate_processes": state.num_processes, "accelerate_device": str(state.device)}

    attempt("init_process_group", init)
    if not result["init_process_group"]["ok"]:
        return
    dev = torch.device(device)
    # world=2 only gets past Ranks' one-process shortcut (world == 1 returns before any collective); the group
    # really has one process, and accelerate sizes every collective by the group, not by Ranks.world
    ranks = Ranks(rank=0, world=2, device=dev)
    g = torch.Generator().manual_seed(0)
    lora = [torch.randn(s, generator=g).to(dev) for s in lora_shapes(shape, rank)]
    n_lora = sum(t.numel() for t in lora)

    def sum_stats() -> dict:
        stats = torch.tensor([0.25, -1.5, 3.0, 1e-3], dtype=torch.float64)  # what Trainer.update sums
        expected = stats.clone()
        ranks.sum_([stats])
        if stats.device.type != "cpu" or stats.dtype != torch.float64 or not torch.equal(stats, expected):
            raise AssertionError(f"sum_ over one rank changed the statistics: {stats} ({stats.device})")
        return {"tensor": "cpu float64 [4]"}

    def sum_grads() -> dict:
        grads = [t.clone() for t in lora]  # Trainer.reduce_and_clip: every LoRA .grad of one adapter, fp32
        ranks.sum_(grads)
        sync(device)
        if not all(torch.equal(a, b) for a, b in zip(grads, lora)):
            raise AssertionError("sum_ over one rank changed the gradients")
        return {"tensor": f"{device} float32, {len(grads)} tensors, {n_lora:,} values ({4 * n_lora / 2**20:.0f} MiB)"}

    def broadcast_adapter() -> dict:
        # run.build_trainer: both adapters' weights, fp32 (PEFT keeps LoRA weights in fp32 on a bf16 base)
        weights = [t.clone() for t in lora + lora]
        ranks.broadcast_(weights)
        sync(device)
        if not all(torch.equal(a, b) for a, b in zip(weights, lora + lora)):
            raise AssertionError("broadcast_ from rank 0 to itself changed the weights")
        return {"tensor": f"{device} float32, {len(weights)} tensors (two adapters)"}

    def gather_games() -> dict:
        game = {"text": "<think>" + "7+8=15\n" * 200 + "</think> \\boxed{15}", "ids": list(range(4096))}
        got = ranks.gather(game)  # rollout.play_split and Trainer: games, digests, RNG states, metric extremes
        if got != [game]:
            raise AssertionError(f"gather returned {type(got).__name__} of {len(got)}, not [the object]")
        return {"object": "dict of text and 4,096 token ids"}

    def share_path() -> dict:
        got = ranks.share("/runs/agon/2026-01-01")  # run.py: the run directory, the launch time
        if got != "/runs/agon/2026-01-01":
            raise AssertionError(f"share returned {got!r}")
        return {}

    attempt("sum_stats_cpu_float64", sum_stats)
    attempt("sum_grads_fp32", sum_grads)
    attempt("broadcast_adapter", broadcast_adapter)
    attempt("gather_objects", gather_games)
    attempt("share_object", share_path)
    attempt("barrier", lambda: ranks.barrier())
    if device == "cuda":
        def nccl_only() -> dict:
            group = dist.new_group(ranks=[0], backend="nccl")
            dist.all_reduce(torch.zeros(4, dtype=torch.float64), group=group)
            return {"note": "a group of NCCL alone took a CPU tensor"}

        # the trainer's statistics in a group started with plain "nccl" (accelerate's own choice on GPUs): expected
        # to fail, which is why the trainer's group needs "cpu:gloo,cuda:nccl"; not counted in all_ok
        attempt("plain_nccl_with_cpu_tensor", nccl_only)
        result["plain_nccl_with_cpu_tensor"]["expected_ok"] = False
        save()
    dist.destroy_process_group()


def collectives(device: str, shape: dict, rank: int, timeout_s: float) -> dict:
    """``collectives_child`` in a child process, at most ``timeout_s`` seconds; its results, and how it ended."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "collectives.json"
        cmd = [sys.executable, "-m", "agon.bench.gpu", "--collectives-child", str(path), "--device", device,
               "--shape-json", json.dumps(shape), "--lora-rank", str(rank)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
            ended = {"returncode": proc.returncode, "output_tail": (proc.stdout + proc.stderr)[-2000:]}
        except subprocess.TimeoutExpired as exc:
            # what the child printed so far: bytes or str, whichever subprocess kept
            out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                          for x in (exc.stdout, exc.stderr) if x)
            ended = {"returncode": None, "timed_out_after_s": timeout_s, "output_tail": out[-2000:]}
        result = json.loads(path.read_text()) if path.exists() else {}
    checks = {k: v for k, v in result.items() if isinstance(v, dict) and "ok" in v}
    expected_failures = {"plain_nccl_with_cpu_tensor"}
    result["all_ok"] = bool(checks) and all(v["ok"] for k, v in checks.items() if k not in expected_failures) \
        and ended["returncode"] == 0
    return result | {"child": ended}


# -- the command -------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agon.bench.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench-gpu"), help=f"folder for {REPORT}")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    # defaults: (on a GPU, with --cpu-check)
    parser.add_argument("--engines", nargs="+", choices=ENGINE_NAMES,
                        help="the step's engines, in order (hf_continuous hf vllm; hf_continuous hf)")
    parser.add_argument("--new-tokens", type=int, nargs="+", help="the step's completion budgets ([256], [8])")
    parser.add_argument("--prompts", type=int, help="problems per step (8, 2)")
    parser.add_argument("--generations", type=int, help="completions per problem and role (8, 2)")
    parser.add_argument("--steps", type=int, default=1, help="measured steps after the warm-up step")
    parser.add_argument("--warmup-tokens", type=int, help="new tokens of the warm-up step (32, 4)")
    parser.add_argument("--score-tokens", type=int, help="width of the single scored row (16384, 32)")
    parser.add_argument("--solo-tokens", type=int,
                        help="rows of the padded micro-batch stay under it (the preset's solo_row_tokens, 16)")
    parser.add_argument("--batch-tokens", type=int,
                        help="token budget of the padded micro-batch (the preset's scoring_batch_tokens, 64)")
    parser.add_argument("--chunk-tokens", type=int, nargs="+",
                        help="head chunks measured (the preset's logit_chunk_tokens and 512; 64 16)")
    parser.add_argument("--context-tokens", type=int, nargs="+",
                        help="prompt lengths of the context part's points ([2048], [24])")
    parser.add_argument("--context-rows", type=int, help="rows of each context point (64, 2)")
    parser.add_argument("--context-new-tokens", type=int, help="new tokens of each context point (32, 4)")
    parser.add_argument("--budget-s", type=float,
                        help="seconds the whole run should stay within: a context point estimated to end later is "
                             "skipped (345; 0 on a CPU: no limit)")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled pass naming the SDPA backend")
    parser.add_argument("--collectives-timeout", type=float, default=180.0)
    parser.add_argument("--cpu-check", action="store_true",
                        help="run on CPU at a tiny shape, short rows and gloo (checks the script)")
    parser.add_argument("--collectives-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--shape-json", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--lora-rank", type=int, default=16, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # None: the preset's value, read where the part composes its config
    for name, on_gpu, on_cpu in (("engines", list(ENGINE_NAMES), ["hf_continuous", "hf"]), ("new_tokens", [256], [8]),
                                 ("prompts", 8, 2), ("generations", 8, 2), ("warmup_tokens", 32, 4),
                                 ("score_tokens", 16_384, 32), ("solo_tokens", None, 16), ("batch_tokens", None, 64),
                                 ("chunk_tokens", None, [64, 16]), ("context_tokens", [2048], [24]),
                                 ("context_rows", 64, 2), ("context_new_tokens", 32, 4), ("budget_s", 345.0, 0.0)):
        if getattr(args, name) is None:
            setattr(args, name, on_cpu if args.cpu_check else on_gpu)
    if args.collectives_child:
        collectives_child(args.collectives_child, args.device, json.loads(args.shape_json), args.lora_rank)
        return 0
    if not args.cpu_check and not torch.cuda.is_available():
        print("agon.bench.gpu needs a CUDA device; none is visible here (torch.cuda.is_available() is False). "
              "Use --cpu-check to test the script itself on a CPU.", file=sys.stderr)
        return 2

    device = "cpu" if args.cpu_check else "cuda"
    shape = TINY_SHAPE if args.cpu_check else None
    dtype = torch.bfloat16
    if args.cpu_check:
        from agon.models.loading import cpu_has_fast_bf16

        # the path is the same in float32; bf16 matmul without native support is ~90x slower on a CPU
        dtype = torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    threads = torch.get_num_threads()
    if args.cpu_check:
        # the tiny shape's ops are microseconds of work; on a shared 2-core machine each parallel region waited for
        # a descheduled second thread (15 ms per 32x64 matmul measured), one thread runs the check 3-5x faster
        torch.set_num_threads(1)
    try:
        return run(args, device, shape, dtype)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace, device: str, shape: dict | None, dtype: torch.dtype) -> int:
    """The parts ``args.parts`` in order, into ``args.out``; 0 when every one was measured, 1 otherwise."""
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args.out / REPORT, {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (--cpu-check)",
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if device == "cuda" else None,
        "shape": "Qwen3-0.6B" if shape is None else f"Qwen3-0.6B with {shape}",
        "dtype": str(dtype).removeprefix("torch."), "parts": args.parts,
        "args": {k: v for k, v in vars(args).items() if k not in HIDDEN_ARGS}, **versions()})
    print(f"[bench-gpu] {report.data['device']}, torch {torch.__version__}, transformers "
          f"{report.data['transformers']}: {', '.join(args.parts)} -> {report.path}", flush=True)

    from agon.families import get_family

    if "collectives" in args.parts:
        sizes = get_family("qwen3").shape.sizes
        r = report.run("collectives", lambda: collectives(device, {**sizes["0.6b"], **(shape or {})}, 16,
                                                          args.collectives_timeout))
        checks = {k: v.get("ok") for k, v in r.items() if isinstance(v, dict) and "ok" in v}
        if r.get("all_ok") is False:
            bad = [k for k, ok in checks.items() if not ok and r[k].get("expected_ok", True) is not False]
            bad = bad or [f"child exit code {r['child'].get('returncode')}"]
            report.data["errors"].append(f"collectives: not all ok ({', '.join(bad)})")
            report.write()
        print(f"[bench-gpu] collectives ({r.get('backend', '?')}): "
              f"{', '.join(f'{k} {ok_word(v)}' for k, v in checks.items()) or r.get('error', r.get('child'))}",
              flush=True)
    if "scoring" in args.parts:
        r = report.run("scoring", lambda: scoring(device, shape, args.score_tokens, dtype,
                                                  profile=not args.no_profile, solo=args.solo_tokens,
                                                  budget=args.batch_tokens, chunks=args.chunk_tokens))
        for name, c in r.get("cases", {}).items():
            if "error" in c:
                report.data["errors"].append(f"scoring {name}: {c['error']}")
                report.write()
                print(f"[bench-gpu] scoring {name}: FAILED {c['error']}", flush=True)
                continue
            peak = f", peak {c['peak_gpu_gib']:.1f} GiB" if "peak_gpu_gib" in c else ""
            print(f"[bench-gpu] scoring {name} {c['row_tokens']} in width {c['width']}: forward+backward "
                  f"{c['seconds']:.2f} s{peak}, SDPA {'/'.join(c.get('sdpa_backends', [])) or '?'}", flush=True)
        for n, c in r.get("logit_chunks", {}).items():
            if "error" in c:
                report.data["errors"].append(f"scoring logit chunk {n}: {c['error']}")
                report.write()
                print(f"[bench-gpu] logit chunk of {n} tokens: FAILED {c['error']}", flush=True)
                continue
            ratio = f", peak {c['peak_over_fp32_logits']:.2f}x its fp32 logits ({c['fp32_logits_gib']:.2f} GiB)" \
                if "peak_over_fp32_logits" in c else ""
            print(f"[bench-gpu] logit chunk of {n} tokens: forward+backward {c['seconds']:.3f} s{ratio}", flush=True)
        if "error" in r:
            print(f"[bench-gpu] scoring: FAILED {r['error']}", flush=True)
    if "step" in args.parts:
        steps = report.data["step"] = []
        for engine in args.engines:
            for n in args.new_tokens:
                t0 = time.perf_counter()
                try:
                    r = measure(engine, n, args.prompts, args.generations, args.steps, device, shape,
                                args.warmup_tokens, dtype)
                except Exception as exc:  # noqa: BLE001 - one engine's failure is recorded, the next still runs
                    r = {"engine": engine, "new_tokens": n, "error": error_text(exc),
                         "traceback": traceback.format_exc(limit=8)}
                    report.data["errors"].append(f"step {engine} {n}: {error_text(exc)}")
                release(device)  # here, not in the handler: its traceback still holds the failed step's tensors
                r["part_s"] = round(time.perf_counter() - t0, 2)
                steps.append(r)
                report.write()
                print_step(r)
    if "context" in args.parts:
        r = report.run("context", lambda: context(device, shape, dtype, args.context_rows, args.context_tokens,
                                                  args.context_new_tokens, lambda n: too_long(report, args, n)))
        for p in r.get("points", []):
            if "error" in p:
                report.data["errors"].append(f"context {p['prompt_tokens']}: {p['error']}")
                report.write()
            print_context(p)
        if "error" in r:
            print(f"[bench-gpu] context: FAILED {r['error']}", flush=True)
    report.data["finished"] = True
    report.write()
    failed = report.data["errors"]
    for line in failed:
        print(f"[bench-gpu] FAILED {line}", file=sys.stderr)
    print(f"[bench-gpu] written to {report.path} in {report.data['elapsed_s']:.0f} s", flush=True)
    return 1 if failed else 0


def too_long(report: Report, args: argparse.Namespace, prompt_tokens: int) -> str | None:
    """Why a context point at ``prompt_tokens`` would end past ``--budget-s`` (None: it fits, or no budget). The
    estimate: the step's ``hf_continuous`` seconds per decoding step, half of it grown with the context, for the
    point's new tokens, plus 30 s for its warm-up and two prefills (90 s in all without a step to go by)."""
    if not args.budget_s:
        return None
    measured = [s for s in report.data.get("step", [])
                if s.get("engine") == "hf_continuous" and s.get("decode_step_s")]
    # on an H200 with paged|sdpa (docs/gpu.md), 64 rows: 171 ms per decoding step at ~0.6k tokens of context, 385 ms
    # at ~2.1k; 3.6 times the context, 2.3 times the step: about half of the step grows in proportion
    elapsed = time.perf_counter() - report.t0
    if not measured:
        estimate = 90.0
    else:
        s = measured[0]
        short = s["new_tokens"] / 2 + 64  # the step's mean context: its short prompt and half the budget
        long = prompt_tokens + args.context_new_tokens / 2
        per_step = s["decode_step_s"] * (1 + 0.5 * max(0.0, long / short - 1))
        estimate = per_step * args.context_new_tokens + 30.0
    if elapsed + estimate > args.budget_s:
        return (f"estimated {estimate:.0f} s after {elapsed:.0f} s would pass --budget-s {args.budget_s:.0f}; "
                f"rerun with --parts context")
    return None


def print_step(r: dict) -> None:
    where = f"step {r.get('engine')} at {r['new_tokens']} new tokens"
    if "skipped" in r:
        print(f"[bench-gpu] {where}: skipped ({r['skipped'].splitlines()[0][:200]})", flush=True)
    elif "error" in r:
        print(f"[bench-gpu] {where}: FAILED {r['error']}", flush=True)
    else:
        peak = f", peak GPU memory {r['peak_gpu_gib']:.1f} GiB" if "peak_gpu_gib" in r else ""
        per = f", {r['decode_step_s'] * 1e3:.1f} ms per decoding step" if r.get("decode_step_s") else ""
        attention = r.get("attention") or "?"
        print(f"[bench-gpu] {where}, {r['prompts_per_step']} prompts x {r['num_generations']}: "
              f"{sum(r['step_s']) / len(r['step_s']):.1f} s (generation "
              f"{sum(r['generation_s']) / len(r['generation_s']):.1f} s{per}), "
              f"{r['generated_tokens_per_s']:.0f} generated tokens/s{peak}, attention {attention}", flush=True)


def print_context(p: dict) -> None:
    where = f"context hf_continuous, prompts of {p['prompt_tokens']} tokens"
    if "skipped" in p:
        print(f"[bench-gpu] {where}: skipped ({p['skipped']})", flush=True)
    elif "error" in p:
        print(f"[bench-gpu] {where}: FAILED {p['error']}", flush=True)
    else:
        peak = f", peak GPU memory {p['peak_gpu_gib']:.1f} GiB" if "peak_gpu_gib" in p else ""
        print(f"[bench-gpu] {where}, {p['rows']} rows x {p['new_tokens']} new: prefill {p['prefill_s']:.1f} s, "
              f"{p['decode_step_s'] * 1e3:.1f} ms per decoding step, {p['generated_tokens_per_s']:.0f} tokens/s"
              f"{peak}, attention {p.get('attention') or '?'}", flush=True)


def ok_word(ok: bool | None) -> str:
    return {True: "ok", False: "FAILED", None: "HUNG"}[ok]


if __name__ == "__main__":
    sys.exit(main())
