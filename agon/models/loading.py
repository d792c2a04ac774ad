"""Loading the frozen base: from the offline world, a local path or the hub, onto the device the run asks for.

``load_base`` returns (model, tokenizer) with every base weight frozen; ``load_tokenizer`` reads the tokenizer and
the context length without loading weights, for the checks before the model loads; ``model_source`` says where the
weights come from (the offline world is built on first use). A model that is neither reachable nor on disk is a
``ModelLoadError`` that says how to fetch it. Left out on purpose: adapters (``agon.models.policies``) and
processes: every rank calls ``load_base(device=...)`` for its own device.
"""

from __future__ import annotations

from typing import Any

import torch

from agon.families import get_family

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """A model that is neither on the hub (reachable) nor in a local directory."""



def _load_error(source: str, model_cfg: Any, exc: Exception) -> ModelLoadError:
    return ModelLoadError(
        f"could not load model {source!r}: not reachable on the hub and not in the local cache ({exc}). "
        f"Download it where there is network (e.g. `hf download {model_cfg.name} --local-dir DIR`) and pass "
        f"model.path=DIR.")


def load_tokenizer(model_cfg: Any) -> tuple[Any, int | None]:
    """(tokenizer, context length in positions) without loading weights, for checks before the model loads."""
    if model_cfg.name == "tiny" and not model_cfg.path:
        from agon.models.world import build_tokenizer

        return build_tokenizer(), model_cfg.tiny.max_position
    from transformers import AutoConfig, AutoTokenizer

    source = model_cfg.path or model_cfg.name
    try:
        return (AutoTokenizer.from_pretrained(source),
                get_family(model_cfg.family).context_length(AutoConfig.from_pretrained(source)))
    except OSError as exc:
        raise _load_error(source, model_cfg, exc) from None


def model_source(model_cfg: Any, task_cfg: Any = None, log=print) -> str:
    """Where the base's weights come from: the offline world's directory (built on first use), ``model.path``, or
    the hub name."""
    if model_cfg.name == "tiny" and not model_cfg.path:
        from agon.models.world import ensure_world

        return str(ensure_world(model_cfg, task_cfg, log=log))
    return model_cfg.path or model_cfg.name


def load_base(model_cfg: Any, task_cfg: Any = None, log=print, device: str | torch.device | None = None):
    """(model, tokenizer) from the offline world (``name: tiny``), a local path, or the hub, on ``device``
    (default: ``model.device``, where ``auto`` is the GPU when there is one). The model is the language model
    alone, as ``model.family`` loads it: a multimodal checkpoint's towers never reach the device."""
    from transformers import AutoTokenizer

    source = model_source(model_cfg, task_cfg, log)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = get_family(model_cfg.family).load(source, DTYPES[model_cfg.dtype])
    except OSError as exc:
        raise _load_error(source, model_cfg, exc) from None
    device = device or resolve_device(model_cfg.device)
    model.to(device)
    if str(device) == "cpu" and model_cfg.dtype == "bfloat16" and not cpu_has_fast_bf16():
        log("[agon] model.dtype=bfloat16 on a CPU without native bfloat16 matmul: torch falls back to a kernel "
            "about 90x slower than float32 here. Set model.dtype=float32 to run on this CPU.")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (oneDNN's check: AVX-512 or AMX). Without it a bfloat16 matmul
    takes torch's fallback kernel: 90x slower than float32 on a 2-core AVX2 EPYC (512x1024 @ 1024x3072)."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_device(choice: str) -> str:
    """``model.device``: ``auto`` is cuda when available, else cpu; anything else as given."""
    return ("cuda" if torch.cuda.is_available() else "cpu") if choice == "auto" else choice

