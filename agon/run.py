"""Entry point: ``python -m agon.run [overrides]`` (``-m`` for a sweep). Compose, validate, train, evaluate, write.

The config is checked (``agon.training.checks``) before any model loads. Each run writes into its Hydra output
directory (what it holds: ``agon.records.run_files``); the recorder is closed in ``finally`` so a failing cell of a
multirun still finishes its W&B run and the next cell starts clean. A user error (``USER_ERRORS``: a config value, a
model that cannot load, an engine that cannot start) ends a single run with its message on one line, ``error:
<message>``, and exit code 1; ``HYDRA_FULL_ERROR=1`` shows its traceback, and a sweep reports it as Hydra does.
SIGTERM (a preemption, ``scancel``) stops it cleanly: a submitit job is requeued, any other exits with code 143, and
the same command resumes it (``agon.core.preemption``).

Several processes: ``accelerate launch --multi_gpu --num_processes N -m agon.run [overrides]`` (``make run-ddp``).
Every rank composes the same config; rank 0's launch time names the output directory of all of them, and rank 0
alone writes files, checkpoints and W&B (``agon.core.distributed`` says how the work is shared).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from agon.records import run_files
from agon.training.checks import check_overrides, typed, validate
from agon.core.config import (CONF_DIR, LAUNCH_TIME_ENV, ConfigError, exchange_name, register_configs, resume_mode,
                              to_plain)
from agon.core.distributed import Ranks, launched_world_size
from agon.engines import EngineError
from agon.models.loading import ModelLoadError
from agon.core.rewards import describe_reward, reward_summary
from agon.core import preemption

LOG = logging.getLogger("agon")


def say(message: str) -> None:
    """One line of the run's story: to the ``agon`` logger under Hydra (the console and the run directory's
    ``run.log``, conf/hydra/job_logging/agon.yaml), printed where Hydra configured nothing (a run called in-process
    by a test or a tool)."""
    from hydra.core.hydra_config import HydraConfig

    LOG.info(message) if HydraConfig.initialized() else print(message, flush=True)


PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "hydra-core", "omegaconf", "wandb", "datasets",
            "math-verify", "reasoning-gym", "tokenizers", "vllm")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _git_commit() -> str | None:
    return _git("rev-parse", "HEAD")


def code_version() -> dict[str, Any]:
    """The code this process runs, read as it starts (a commit made while a run trains is not the code it ran):
    the checkout's commit, and whether its tracked files differ from it (``None`` for both outside a checkout)."""
    commit = _git_commit()
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _run_dir(cfg: DictConfig) -> Path:
    if cfg.output_dir:
        return Path(cfg.output_dir)
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def _overrides() -> str:
    from hydra.core.hydra_config import HydraConfig

    try:
        return HydraConfig.get().job.override_dirname
    except ValueError:  # called outside Hydra (tests)
        return ""


@contextlib.contextmanager
def _main_first(ranks: Ranks):
    """Rank 0 runs the block first (building the offline world, filling dataset caches), then the others."""
    if not ranks.is_main:
        ranks.barrier()
    yield
    if ranks.is_main:
        ranks.barrier()


def build_trainer(cfg: DictConfig, run_dir: Path, recorder: Any, ranks: Ranks = Ranks(),
                  log: Any = say) -> Any:
    """The ``Trainer`` that ``run`` trains, on this rank: the task, the base checked against the model's context and
    loaded (rank 0 first), the method's adapters (rank 0's on every rank), each rank then seeded for its own samples,
    and the sampling engine. The caller closes ``trainer.engine`` and ``trainer.task``; the task is closed here when
    building fails."""
    from agon.models.loading import load_base, load_tokenizer
    from agon.models.policies import build_policies
    from agon.training.preflight import check_context
    from agon.tasks import build_task
    from agon.training.trainer import Trainer

    task = None
    try:
        with _main_first(ranks):
            task = build_task(cfg.task)
            check_context(cfg, task, *load_tokenizer(cfg.model))
            model, tokenizer = load_base(cfg.model, cfg.task, device=ranks.device)
        policies = build_policies(cfg, model, tokenizer, task)
        if ranks.world > 1:
            ranks.broadcast_([p for name in policies.adapters for p in policies.parameters(name)])
            torch.manual_seed(cfg.seed + ranks.rank)  # each rank samples its own completions
        return Trainer(cfg, policies, task, recorder, run_dir, log=log, ranks=ranks)
    except BaseException:
        if task is not None:
            task.close()
        raise


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train and evaluate one configuration; returns the summary written to ``summary.json``."""
    from agon.training.cores import start_threads
    from agon.training.estimate import estimate
    from agon.core.methods import get_method
    from agon.training.preflight import check_engine, check_memory, check_sources
    from agon.records.recorder import Recorder, build_logger
    from agon.training.trainer import pause_point

    cfg = typed(cfg)  # the task's settings through its kind's schema (plugins imported first)
    validate(cfg)
    check_engine(cfg)  # before the hub probe: it reads only what is installed here
    check_memory(cfg)  # on a GPU: the first update must fit beside vLLM's share
    check_sources(cfg, log=say)
    if not cfg.progress:  # no bar at all, the libraries' own (loading weights) included
        import huggingface_hub.utils
        import transformers

        transformers.utils.logging.disable_progress_bar()
        huggingface_hub.utils.disable_progress_bars()
    t0, code = time.time(), code_version()
    method = get_method(cfg.method.name)
    resume = resume_mode(cfg.trainer.resume)
    out_dir = _run_dir(cfg)
    done = finished_summary(out_dir, cfg) if resume == "auto" else None
    if done is not None:  # a sweep launched again, a requeued job that had finished: nothing to redo
        say(f"[agon] skipped: {out_dir} already holds this run's summary.json (trainer.resume=never trains it "
            f"again)")
        return done
    if resume == "auto":  # before any model loads, and before a resume forgets the records after its checkpoint
        check_checkpoint(out_dir, cfg)
    ranks = Ranks.from_env(cfg.model.device, cfg.trainer.ddp_timeout)
    start_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # the cores this process may use, not all it sees
    # what the cell starts with, before anything loads: a sweep's next cell must find what the first did
    memory_at_start, children_at_start = memory_in_use(ranks.device)
    run_dir = Path(ranks.share(str(out_dir)))
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    recorder = Recorder(run_dir, build_logger(cfg, run_dir) if ranks.is_main else None, enabled=ranks.is_main)
    trainer, exit_code = None, 1
    if ranks.is_main:  # the cell's full reward: a preset's weights are not visible in its name
        say(f"[agon] {cfg.method.name}, reward {describe_reward(cfg.reward)}, exchange "
            f"{exchange_name(cfg.exchange.mode, cfg.exchange.span)}, rotation {cfg.rotation.mode}, init "
            f"{cfg.init.mode}")
    try:
        trainer = build_trainer(cfg, run_dir, recorder, ranks, log=say if ranks.is_main else _quiet)
        if ranks.is_main:  # whatever the engine: a run that will take weeks says so before its first step
            say(estimate(cfg, trainer).line())
        resumed = resume == "auto" and trainer.resume_latest()
        trainer.begin_launch(code, started=t0)  # after the resume, which restores the launches before it
        if resumed:
            start = _start_metrics(run_dir)
        else:  # from step 0: whatever ran here before goes, its checkpoints first (killed between the two, a run
            # that had finished keeps its records and summary, and is still finished)
            trainer.discard_checkpoints()
            if resume == "never":
                trainer.discard_eval_parts()
            recorder.resume_from(-1)
            start = trainer.evaluate("start").metrics if cfg.eval.at_start else {}
        trains = method.trains and cfg.method.train
        if trains:
            trainer.train(progress=cfg.progress and ranks.is_main, on_eval=_trial_reporter(cfg, ranks))
        # committed before the final evaluation, which moves no weight, only the RNG: a run killed during it runs it
        # again from the same state, and a run extended later continues as if it had never evaluated
        if trains and trainer.state.step and trainer.committed_step() != trainer.state.step:
            trainer.save_checkpoint()
        final = trainer.evaluate("final").metrics
        if ranks.is_main:
            trainer.policies.save_adapters(run_dir / run_files.ADAPTERS)
        summary = {
            **final,
            "eval/accuracy_at_start": start.get("eval/accuracy"),
            "train/steps": trainer.state.step,
            "train/generated_tokens": trainer.state.generated_tokens,
            "train/verifier_failures": trainer.state.verifier_failures,
            "train/warnings": trainer.state.warnings,
            # one per process: equal, or adapter_digests would have stopped the run
            "train/adapter_sha256": trainer.adapter_digests(),
            "train/processes": ranks.world,
            "memory/at_start_gib": memory_at_start, "memory/child_processes_at_start": children_at_start,
            "time/train_s": trainer.state.train_seconds,
            # wall seconds of every launch whose work the run kept (a resumed run's too), and of this launch alone
            "time/total_s": trainer.wall_seconds(),
            "time/launch_s": time.time() - t0,
            "method": cfg.method.name, "reward": cfg.reward.name, "reward_weights": reward_summary(cfg.reward),
            "exchange": exchange_name(cfg.exchange.mode, cfg.exchange.span),
            "rotation": cfg.rotation.mode, "init": cfg.init.mode, "task": cfg.task.name, "model": cfg.model.name,
            # how tables and figures name the base model (analysis/load.py; model.name for runs without it)
            "model_label": model_label(cfg.model),
            # what analysis/ needs to name and pool the cell: the axes that change what this method does
            "method_axes": list(method.axes), "method_label": method.label,
            "experiment": cfg.experiment, "seed": cfg.seed, "overrides": _overrides(),
            # the code as this launch started, and every kept launch's (a run resumed on other code shows it)
            "git_commit": code["git_commit"], "git_dirty": code["git_dirty"], "launches": trainer.state.launches,
            # the trainer's environment; the engine's own (vLLM in .venv-vllm: its version, torch, build, device)
            "versions": _versions(), "engine": trainer.engine.describe(), "config": to_plain(cfg),
        }
        recorder.write_summary(summary)
        trainer.discard_eval_parts()
        pause_point("summary", trainer.state.step)
        if ranks.is_main:
            _report(summary)
        exit_code = 0
        return summary
    except preemption.Preempted:  # W&B keeps the run as preempting, not failed
        exit_code = preemption.EXIT_CODE
        raise
    finally:
        recorder.close(exit_code)
        if trainer is not None:
            trainer.engine.close()
            trainer.task.close()
            if ranks.world > 1 and not torch.distributed.is_initialized() and exit_code == 0:
                # the sweep's next cell would start a group of its own, or hang waiting for one
                raise RuntimeError("closing the sampling engine ended the process group of this launch")
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def memory_in_use(device: torch.device | None) -> tuple[float, int]:
    """(GiB, child processes) in use as a cell starts: on a GPU, the device's memory in use by every process (what
    an engine starting now could not take); on a CPU, the resident memory of this process and its children."""
    import psutil

    children = psutil.Process().children(recursive=True)
    if (device.type == "cuda") if device is not None else torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(device)
        return (total - free) / 2**30, len(children)
    rss = 0
    for p in [psutil.Process(), *children]:
        with contextlib.suppress(psutil.Error):
            rss += p.memory_info().rss
    return rss / 2**30, len(children)


def model_label(model: Any) -> str:
    """The base model as tables and figures name it: the family's label and the published shape, upper-cased
    ("Qwen3-0.6B", "Qwen3.5-2B", "Gemma 4 E2B": a hyphen after a one-word label, a space after one with a space,
    as the model cards write them); "tiny (offline)" for the offline world; ``model.name`` for a model with no
    shape (a hub name agon has no shape for)."""
    from agon.families import get_family

    if model.name == "tiny":
        return "tiny (offline)"
    shape = model.get("shape")
    if not shape:
        return str(model.name)
    label = get_family(model.family).label
    return f"{label}{' ' if ' ' in label else '-'}{str(shape).upper()}"


def _trial_reporter(cfg: DictConfig, ranks: Ranks) -> Any:
    """For a cell that is an Optuna trial (``tune.trial``, set by agon.training.tune's sweeper): report each evaluation
    to its study, and stop the run on every rank when the pruner says so. None otherwise."""
    if cfg.tune.trial is None:
        return None
    from agon.training.tune import TrialReporter

    reporter = TrialReporter.from_config(cfg) if ranks.is_main else None

    def report(result: Any, step: int) -> None:
        import optuna

        pruned = None
        if reporter is not None:
            try:
                reporter.report(result.metrics["eval/accuracy"], step)
            except optuna.TrialPruned as exc:
                pruned = str(exc)
        pruned = ranks.share(pruned)
        if pruned:
            raise optuna.TrialPruned(pruned)

    return report


# keys that say where and how a run is shown, not what it computes: a finished run is the same run without them (a
# sweep cell's folder leaves them out of its name: conf/config.yaml's exclude_keys), where an Optuna study lives too
PRESENTATION_KEYS = ("output_dir", "progress", "logger", "trainer.resume", "plugins", "tune.storage", "tune.study")


# schema_defaults' answers by task kind. A dict, not functools.cache: submitit pickles this module's functions by
# value when it runs as __main__ (python -m agon.run), and a cache wrapper pickles by a name its job cannot find
_SCHEMA_DEFAULTS: dict[str | None, dict[str, Any]] = {}


def schema_defaults(task_kind: str | None) -> dict[str, Any]:
    """Every key's default as the typed schema gives it, dotted (``Config``'s fields, the task's through its kind's
    schema): what a key is when nobody sets it. Read only: one dict per task kind."""
    import dataclasses
    import typing

    from agon.core.config import TASK_SCHEMAS, Config

    if task_kind in _SCHEMA_DEFAULTS:
        return _SCHEMA_DEFAULTS[task_kind]
    hints, tree = typing.get_type_hints(Config), {}
    for f in dataclasses.fields(Config):
        schema = TASK_SCHEMAS.get(str(task_kind)) if f.name == "task" else hints[f.name]
        if dataclasses.is_dataclass(schema):
            tree[f.name] = OmegaConf.to_container(OmegaConf.structured(schema))
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            tree[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return _SCHEMA_DEFAULTS.setdefault(task_kind, run_files.flatten(tree))


def config_differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """The dotted keys in which a launch's resolved config ``ours`` differs from a recorded one ``theirs``, less
    ``PRESENTATION_KEYS``. A key added to agon after ``theirs`` was written differs unless ``ours`` holds it at its
    default and that default is off (allow_slow false, params {}): it then changes nothing that run computed. At any
    other value (generation.vllm.request_seeds false, whose default is true) it may have."""

    def comparable(config: dict[str, Any]) -> dict[str, Any]:
        flat = run_files.flatten(config)
        return {k: v for k, v in flat.items() if not any(k == p or k.startswith(p + ".") for p in PRESENTATION_KEYS)}

    ours, theirs = comparable(ours), comparable(theirs)
    defaults = schema_defaults(ours.get("task.kind"))
    added = {k for k in ours.keys() - theirs.keys()
             if ours[k] in (None, False, {}, []) and k in defaults and defaults[k] == ours[k]
             and type(defaults[k]) is type(ours[k])}
    return sorted(k for k in ours.keys() | theirs.keys()
                  if (ours.get(k) != theirs.get(k) or k not in theirs) and k not in added)


def finished_summary(run_dir: Path, cfg: DictConfig) -> dict[str, Any] | None:
    """The summary.json of this configuration's finished run in ``run_dir``, or None when it has none or when only
    ``trainer.max_steps`` or ``eval.*`` changed (a finished run extended, or evaluated again: it resumes from its
    last checkpoint); a ConfigError when the directory holds the finished run of another configuration."""
    path = run_dir / run_files.SUMMARY
    if not path.exists():
        return None
    summary = run_files.read_json(path)
    differ = config_differences(to_plain(cfg), summary.get("config", {}))
    if all(k == "trainer.max_steps" or k.startswith("eval.") for k in differ) and differ:
        return None
    if differ:
        raise ConfigError(f"{run_dir} already holds a finished run of another configuration ({', '.join(differ[:8])}"
                          f"{' ...' if len(differ) > 8 else ''} differ): choose another output directory, or pass "
                          f"trainer.resume=never to train into it again")
    return summary


# how the trainer's passes are cut to fit its memory, not what they compute (the same update up to the order of float
# sums): the settings a relaunch after an out-of-memory changes, so a checkpoint resumes across them
MEMORY_KEYS = ("trainer.micro_batch_size", "trainer.scoring_batch_tokens", "trainer.solo_row_tokens",
               "trainer.logit_chunk_tokens", "trainer.generation_batch_tokens", "trainer.check_memory",
               "model.gradient_checkpointing")


def check_checkpoint(run_dir: Path, cfg: DictConfig) -> None:
    """A ConfigError when the checkpoint ``checkpoints/latest`` names was written by a run of another configuration:
    one that differs in more than its length (``trainer.max_steps``), its evaluation (``eval.*``), the engine's
    resources (``cascade.RESOURCE_KEYS``) and the trainer's memory cuts (``MEMORY_KEYS``: a relaunch after an
    out-of-memory), as a resume would train on from it under settings it was not trained with. A checkpoint written
    before checkpoints kept their config is resumed as it is."""
    from agon.game.cascade import RESOURCE_KEYS

    root = run_dir / run_files.CHECKPOINTS
    latest = root / "latest"
    saved = run_files.read_json(root / latest.read_text().strip() / run_files.CHECKPOINT_CONFIG) \
        if latest.exists() else None
    if not isinstance(saved, dict):
        return
    resources = {f"generation.{k}" for k in RESOURCE_KEYS["generation"]} | {
        f"generation.vllm.{k}" for k in RESOURCE_KEYS["vllm"]} | set(MEMORY_KEYS)
    differ = [k for k in config_differences(to_plain(cfg), saved)
              if k != "trainer.max_steps" and not k.startswith("eval.") and k not in resources]
    if differ:
        raise ConfigError(f"{run_dir} holds the checkpoint of a run of another configuration ({', '.join(differ[:8])}"
                          f"{' ...' if len(differ) > 8 else ''} differ): launch it as it was to resume it, choose "
                          f"another output directory, or pass trainer.resume=never to train into it again")


def _quiet(*_: Any) -> None:
    pass


def _start_metrics(run_dir: Path) -> dict[str, Any]:
    """The evaluation before training, as the interrupted run logged it."""
    rows = run_files.read_jsonl(run_dir / run_files.METRICS)
    rows = [r for r in rows if r["train/step"] == 0 and "eval/accuracy" in r]
    return rows[0] if rows else {}


def _report(s: dict[str, Any]) -> None:
    def pct(key: str) -> str:
        return "n/a" if s.get(key) is None else f"{100 * s[key]:.1f}%"

    say(f"[agon] {s['method']} {s['overrides'] or '(defaults)'}: accuracy {pct('eval/accuracy_at_start')} -> "
        f"{pct('eval/accuracy')} on {s['eval/n_problems']} problems x {s['eval/samples']} samples; "
        f"at one and two generations per answer {pct('eval/accuracy_one_generation')} and "
        f"{pct('eval/accuracy_two_generations')}; A {pct('eval/solo_acc_A')}, B {pct('eval/solo_acc_B')}, "
        f"conversion {pct('eval/conversion_rate')}, regression {pct('eval/regression_rate')}; "
        f"{s['train/steps']} steps in {s['time/total_s']:.0f}s")


# errors whose message says all a user needs (a config value, a model that cannot load, an engine that cannot
# start): a single run prints the message alone, not a traceback
USER_ERRORS = (ConfigError, ModelLoadError, EngineError)


class _Reported(BaseException):
    """A user error of a single run on its way to ``main``, which prints its message: Hydra's handlers catch
    Exception and print a traceback, but let this pass (skipping their job-end and run-end callbacks; agon's one
    callback, the sweep table, acts at the end of a sweep)."""


# agon's schema and resolvers, for agon's app alone (agon.core.config says why not on import)
register_configs()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig) -> float | None:
    OmegaConf.set_readonly(cfg, True)
    try:
        with preemption.stop_on_sigterm():
            return run(cfg)["eval/accuracy"]
    except preemption.Preempted:
        preemption.requeue()  # a submitit job is requeued here and exits
        raise
    except USER_ERRORS as exc:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        # a sweep goes on to its other cells and fails at the end, as Hydra does; HYDRA_FULL_ERROR=1 asks for the
        # whole traceback, as it does of Hydra
        if HydraConfig.get().mode != RunMode.RUN or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        raise _Reported(str(exc)) from exc


def main() -> None:
    ranks = Ranks()
    if launched_world_size() > 1:
        # before Hydra names the output directory: every rank takes rank 0's launch time, so all name the same one
        ranks = Ranks.from_env()
        os.environ[LAUNCH_TIME_ENV] = str(ranks.share(os.environ.get(LAUNCH_TIME_ENV) or time.time()))
        if not ranks.is_main:  # rank 0 writes .hydra/ and the log; the others would only write them again
            sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    try:
        check_overrides(sys.argv[1:])  # a mistyped option or key: one line with the closest name, before Hydra
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    try:
        hydra_main()
    except _Reported as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except preemption.Preempted as exc:
        print(f"[agon] {exc}; the same command resumes it", file=sys.stderr, flush=True)
        sys.exit(preemption.EXIT_CODE)
    # after every cell of a sweep, which all share the one group (a failed run leaves by sys.exit, skipping this)
    ranks.close()


if __name__ == "__main__":
    main()
