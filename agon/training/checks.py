"""The config check: everything between a composed config and a run that may start, in one place.

``compose_config`` composes the root config as ``python -m agon.run`` does; ``typed`` merges the task's settings
into the schema of its kind (``agon.core.config.TASK_SCHEMAS``) after importing the ``plugins`` that register more of
them; ``validate`` checks what a type cannot express (values in range, names that must exist in a registry, pairs
that cannot work together) and names the full key in every message; ``check_overrides`` catches a mistyped option or
key on the command line before Hydra composes anything, with the closest name.

This module sits above the registries it reads (engines, families, methods, rewards, losses, tasks); the schemas
themselves, ``agon.core.config``, import nothing of agon. Left out on purpose: checks that need the model or the data
(``agon.training.preflight`` does those, still before any weights load).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from agon.core.config import (CONF_DIR, DTYPES, EXCHANGES, INITS, PLACEMENTS, RESUMES, ROTATIONS, SCALE_REWARDS,
                              TASK_SCHEMAS, WARM_STARTS, Config, ConfigError, did_you_mean, register_configs)


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The root config composed with ``overrides``, as ``python -m agon.run`` would (for tools and tests that build a
    run in-process; Hydra's own ``hydra.*`` settings are not part of it)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return typed(compose(config_name="config", overrides=list(overrides)))


def import_plugins(cfg: Any) -> None:
    """Import the modules ``plugins`` names and those of the ``agon.plugins`` entry points, so that the tasks,
    rewards, methods and model families they register are known before any name is checked."""
    import importlib
    import importlib.metadata

    names = list(cfg.get("plugins") or [])
    names += [ep.value for ep in importlib.metadata.entry_points(group="agon.plugins")]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"plugins: cannot import {name!r} ({exc})") from None


def typed(cfg: DictConfig) -> DictConfig:
    """``cfg`` with ``task`` merged into the schema of its kind (``TASK_SCHEMAS``): defaults filled, and an unknown
    key or a value of the wrong type a ConfigError naming ``task.<key>``. Read-only when ``cfg`` was."""
    from omegaconf.errors import OmegaConfBaseException

    import_plugins(cfg)
    kind = cfg.task.get("kind")
    if kind not in TASK_SCHEMAS:
        from agon.tasks import load_task_kind

        load_task_kind(str(kind))  # a built-in kind registers its schema when its module loads
    schema = TASK_SCHEMAS.get(kind)
    if schema is None:
        raise ConfigError(f"task.kind={kind!r} is not valid; choose one of {sorted(TASK_SCHEMAS)}"
                          f"{did_you_mean(str(kind), TASK_SCHEMAS)}")
    try:
        task = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.to_container(cfg.task, resolve=False))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
        hint = did_you_mean(str(key).split(".")[-1], list(OmegaConf.structured(schema))) if key else ""
        raise ConfigError(f"task.{key}: {str(exc).splitlines()[0]} (task.kind={kind}){hint}") from None
    readonly = OmegaConf.is_readonly(cfg)
    out = OmegaConf.merge(cfg, {})  # a copy with the same flags
    OmegaConf.set_readonly(out, False)
    with open_dict(out):
        out.task = task
    OmegaConf.set_readonly(out, readonly)
    return out


def check_overrides(argv: Sequence[str]) -> None:
    """A ConfigError, before Hydra composes anything, for a command-line override that names an option a group does
    not have or a key the config does not have, with the closest one ("did you mean"). Groups found only in another
    config directory (``--config-dir``, ``hydra.searchpath``) and ``+``/``~``/``hydra.`` overrides are left to
    Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    words = [a for a in argv if "=" in a and not a.startswith("-")]
    dirs = [CONF_DIR] + [Path(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a in ("--config-dir", "-cd")]
    if any(w.startswith("hydra.searchpath") for w in words):
        return
    try:
        overrides = OverridesParser.create().parse_overrides(words)
    except OverrideParseException:
        return  # Hydra says what is wrong with the syntax
    keys = {k for k in _dotted(Config) if k != "task"} | {f"task.{k}" for s in TASK_SCHEMAS.values() for k in
                                                          _dotted(s)}
    for o in overrides:
        key = o.get_key_element()
        if o.is_add() or o.is_delete() or o.is_force_add() or key.startswith("hydra") or "@" in key:
            continue
        options = sorted({p.stem for d in dirs for p in (d / key).glob("*.yaml")}) if any(
            (d / key).is_dir() for d in dirs) else None
        if options is not None:
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            for value in values:
                if value not in options and value != "null":
                    raise ConfigError(f"{key}={value} is not an option of {key}{did_you_mean(value, options)}; "
                                      f"choose one of {options}")
        elif key not in keys and not any(k.startswith(key + ".") for k in keys) and \
                not (key.startswith("task.") and any(w.startswith("plugins") for w in words)):  # a plugin's task
            raise ConfigError(f"{key} is not a key of the config{did_you_mean(key, keys)}")


def _dotted(schema: type, prefix: str = "") -> list[str]:
    """The dotted keys of a dataclass schema, nested ones included (``trainer.learning_rate``)."""
    import dataclasses
    import typing

    out = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        out.append(prefix + f.name)
        if dataclasses.is_dataclass(hints.get(f.name)):
            out += _dotted(hints[f.name], f"{prefix}{f.name}.")
    return out


def _one_of(key: str, value: Any, allowed: tuple[str, ...] | list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of {sorted(allowed)}"
                          f"{did_you_mean(str(value), allowed)}")


def _check_warm_start(task: Any) -> None:
    if task.kind == "reasoning_gym":
        _one_of("task.warm_start", task.warm_start, WARM_STARTS)
    if task.kind == "target_sum":
        if not 2 <= task.min_terms <= task.max_terms:
            raise ConfigError(f"task.min_terms={task.min_terms} must be at least 2 and at most task.max_terms "
                              f"({task.max_terms})")
        for key in ("warm_start_wrong_recaps", "warm_start_reuse", "warm_start_challenges"):
            if not 0 <= task[key] <= 1:
                raise ConfigError(f"task.{key}={task[key]} must be a share between 0 and 1")
    if task.kind != "arithmetic":
        return
    lo = task.warm_start_min_terms if task.warm_start_min_terms is not None else task.min_terms
    hi = task.warm_start_max_terms if task.warm_start_max_terms is not None else task.max_terms
    for key, a, b in (("task.min_terms", task.min_terms, task.max_terms), ("task.warm_start_min_terms", lo, hi)):
        if not 2 <= a <= b:
            raise ConfigError(f"{key}={a} must be at least 2 and at most the matching max_terms ({b})")


def _check_family(cfg: DictConfig) -> None:
    """``model.family`` names a family, and the engine the run will sample with serves it."""
    from agon.engines import engine_name
    from agon.families import get_family, known_families

    try:
        family = get_family(cfg.model.family)  # imported, so registered, before engine_name asks
    except KeyError:
        raise ConfigError(f"model.family={cfg.model.family!r} is not valid; choose one of {known_families()}")
    name = engine_name(cfg)
    if name not in family.engines:
        key = "generation.engine" if name == cfg.generation.engine else "generation.fallback"
        why = family.engine_notes.get(name, "")
        raise ConfigError(f"{key}={name} does not serve model.family={family.name} ({family.label}) with a LoRA on "
                          f"each adapter{' (' + why + ')' if why else ''}; choose one of {list(family.engines)}")


def _check_latent(cfg: DictConfig) -> None:
    """``exchange.span`` names a span, and under ``exchange.mode=latent`` the engine reads an external prefix of
    key/value states and the family's layers are all full attention (``agon.models.latent``)."""
    from agon.engines import ENGINES
    from agon.families import FAMILIES
    from agon.models.latent import SPANS

    _one_of("exchange.span", cfg.exchange.span, list(SPANS))
    if cfg.exchange.mode != "latent":
        return
    # a fallback only replaces vllm, or an engine the family does not serve, and neither passes this check
    name = cfg.generation.engine
    if not ENGINES.get_or_raise(name).latent_prefix:
        raise ConfigError(f"generation.engine={name} cannot play exchange.mode=latent: it takes no external key/value "
                          f"states (it keeps its own paged cache); set generation.engine=hf, or another exchange.mode")
    family = FAMILIES.get(cfg.model.family)
    if family is not None and family.latent_exchange_refused:
        raise ConfigError(f"exchange.mode=latent does not serve model.family={family.name}: "
                          f"{family.latent_exchange_refused}")


def _check_ranges(cfg: DictConfig) -> None:
    """Every value with a valid range inside it, named in full when it is not (a negative learning rate trains the
    wrong way without an error; a top_p of 1.5 samples as 1)."""
    t, e, m = cfg.trainer, cfg.eval, cfg.model
    positive = [("trainer.learning_rate", t.learning_rate), ("trainer.adv_eps", t.adv_eps),
                ("trainer.max_grad_norm", t.max_grad_norm), ("model.lora.alpha", m.lora.alpha),
                ("trainer.solo_row_tokens", t.solo_row_tokens), ("generation.vllm.max_num_seqs",
                                                                 cfg.generation.vllm.max_num_seqs),
                ("generation.vllm.start_timeout_s", cfg.generation.vllm.start_timeout_s),
                ("task.heldout_size", cfg.task.heldout_size), ("init.lr", cfg.init.lr),
                ("init.batch_size", cfg.init.batch_size)]
    for key, value in positive:
        if not value > 0:
            raise ConfigError(f"{key}={value} must be > 0")
    not_negative = [("trainer.weight_decay", t.weight_decay), ("trainer.beta", t.beta), ("init.std", cfg.init.std),
                    ("init.steps", cfg.init.steps), ("trainer.top_k", t.top_k), ("eval.top_k", e.top_k),
                    ("model.top_k", m.top_k), ("trainer.checkpoint_every", t.checkpoint_every),
                    ("trainer.checkpoint_minutes", t.checkpoint_minutes), ("trainer.warn_after_steps",
                                                                           t.warn_after_steps),
                    ("trainer.max_bad_steps", t.max_bad_steps)]
    for key, value in not_negative:
        if value < 0:
            raise ConfigError(f"{key}={value} must be >= 0")
    shares = [("model.lora.dropout", m.lora.dropout), ("trainer.warn_zero_std_ratio", t.warn_zero_std_ratio),
              ("trainer.warn_truncated_ratio", t.warn_truncated_ratio),
              ("trainer.warn_importance_ratio", t.warn_importance_ratio)]
    for key, value in shares:
        if not 0 <= value <= 1:
            raise ConfigError(f"{key}={value} must be a share between 0 and 1")
    for key, value in (("trainer.top_p", t.top_p), ("eval.top_p", e.top_p), ("model.top_p", m.top_p)):
        if not 0 < value <= 1:
            raise ConfigError(f"{key}={value} must be a probability in (0, 1]")
    for key in ("correct_weight", "conversion_bonus", "length_tiebreak", "team_weight", "format_weight"):
        if not math.isfinite(cfg.reward[key]):
            raise ConfigError(f"reward.{key}={cfg.reward[key]} must be a finite number")


def validate(cfg: DictConfig) -> None:
    """Checks that need more than one key or a registry. Raises ConfigError naming the full key."""
    from agon.core.distributed import launched_world_size
    from agon.engines import ENGINES
    from agon.core.grpo import LOSSES, SAMPLER_CORRECTIONS
    from agon.core.methods import METHODS
    from agon.core.rewards import REWARD_MODES
    from agon.tasks import TASKS

    t, e = cfg.trainer, cfg.eval
    _one_of("method.name", cfg.method.name, list(METHODS))
    _one_of("reward.name", cfg.reward.name, list(REWARD_MODES))
    _one_of("exchange.mode", cfg.exchange.mode, EXCHANGES)
    _one_of("rotation.mode", cfg.rotation.mode, ROTATIONS)
    _one_of("init.mode", cfg.init.mode, INITS)
    _one_of("trainer.loss_type", t.loss_type, list(LOSSES))
    _one_of("trainer.scale_rewards", t.scale_rewards, SCALE_REWARDS)
    _one_of("model.dtype", cfg.model.dtype, DTYPES)
    _one_of("task.kind", cfg.task.kind, list(TASKS))
    _one_of("generation.engine", cfg.generation.engine, list(ENGINES))
    _check_family(cfg)
    _check_latent(cfg)
    if cfg.generation.fallback is not None:
        _one_of("generation.fallback", cfg.generation.fallback, [n for n in ENGINES if n != "vllm"])
    _one_of("generation.vllm.placement", cfg.generation.vllm.placement, PLACEMENTS)
    _one_of("trainer.vllm_importance_sampling_mode", t.vllm_importance_sampling_mode, SAMPLER_CORRECTIONS)
    if not 0 < cfg.generation.vllm.gpu_memory_utilization <= 1:
        raise ConfigError(f"generation.vllm.gpu_memory_utilization={cfg.generation.vllm.gpu_memory_utilization} "
                          "must be in (0, 1]")
    if t.num_generations < 2:
        raise ConfigError(
            f"trainer.num_generations={t.num_generations}: a GRPO group needs at least 2 completions per problem"
        )
    for key, value in (
        ("trainer.max_steps", t.max_steps),
        ("trainer.prompts_per_step", t.prompts_per_step),
        ("trainer.max_new_tokens", t.max_new_tokens),
        ("trainer.num_iterations", t.num_iterations),
        ("eval.n_problems", e.n_problems),
        ("eval.samples", e.samples),
        ("eval.diagnostic_samples", e.diagnostic_samples),
        ("eval.chunk_problems", e.chunk_problems),
        ("trainer.scoring_batch_tokens", t.scoring_batch_tokens),
        ("trainer.generation_batch_tokens", t.generation_batch_tokens),
        ("trainer.logit_chunk_tokens", t.logit_chunk_tokens),
        ("eval.generation_batch_tokens", e.generation_batch_tokens),
        ("eval.max_new_tokens", e.max_new_tokens),
        ("model.lora.rank", cfg.model.lora.rank),
        # the newest checkpoint is the one a resume reads
        ("trainer.keep_checkpoints", t.keep_checkpoints),
    ):
        if value < (0 if key == "trainer.max_steps" else 1):
            raise ConfigError(f"{key}={value} must be positive")
    for key, value in (("eval.interim_problems", e.interim_problems), ("eval.interim_samples", e.interim_samples)):
        if value is not None and value < 1:
            raise ConfigError(f"{key}={value} must be positive (or null: the full evaluation's)")
    _check_ranges(cfg)
    if t.ddp_timeout < 1:
        raise ConfigError(f"trainer.ddp_timeout={t.ddp_timeout} must be a positive number of seconds")
    if t.micro_batch_size is not None and t.micro_batch_size < 1:
        raise ConfigError(f"trainer.micro_batch_size={t.micro_batch_size} must be positive (or null)")
    for key, budget, new in (("trainer.generation_batch_tokens", t.generation_batch_tokens, t.max_new_tokens),
                             ("eval.generation_batch_tokens", e.generation_batch_tokens, e.max_new_tokens)):
        if budget < new:
            raise ConfigError(f"{key}={budget} cannot hold one completion of {key.split('.')[0]}.max_new_tokens="
                              f"{new}; raise it to at least a few times that")
    if t.temperature <= 0:
        raise ConfigError(f"trainer.temperature={t.temperature} must be > 0 (sampling is required for GRPO groups)")
    if e.temperature <= 0:
        raise ConfigError(f"eval.temperature={e.temperature} must be > 0")
    if cfg.model.temperature <= 0:  # the model card's, which trainer and eval read unless set apart
        raise ConfigError(f"model.temperature={cfg.model.temperature} must be > 0")
    if t.epsilon <= 0 or (t.epsilon_high is not None and t.epsilon_high <= 0):
        raise ConfigError("trainer.epsilon and trainer.epsilon_high must be > 0")
    if e.every < 0:
        raise ConfigError(f"eval.every={e.every} must be >= 0")
    _check_warm_start(cfg.task)
    if e.diagnostic and launched_world_size() > 1:
        raise ConfigError("eval.diagnostic=true runs in one process; launch without accelerate or set it false")
    _one_of("trainer.resume", str(t.resume).lower(), RESUMES)
    world = launched_world_size()
    if t.prompts_per_step % world:
        raise ConfigError(f"trainer.prompts_per_step={t.prompts_per_step} must be a multiple of the {world} processes "
                          "launched (each plays whole groups of an equal share)")
    if cfg.exchange.mode == "visible" and "{recap}" not in cfg.task.challenge_template:
        raise ConfigError("task.challenge_template must contain {recap} under exchange=visible")


