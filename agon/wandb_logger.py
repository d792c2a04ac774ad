"""W&B mirror of a run's records (``logger=wandb``, the default). The run directory stays the source of truth.

What one run becomes in W&B (the conventions of W&B's own sweep and grouping guides):
    project   ``logger.project`` ("agon"); entity ``logger.entity`` or W&B's default
    group     ``logger.group`` if set, else the sweep (multirun) name such as ``2026-11-30/10-00-00``,
              else ``experiment``; cells x seeds of one sweep aggregate in one group
    name      the cell's overrides (Hydra's ``override_dirname``, e.g. ``exchange=visible,reward=competitive``),
              else the run directory's name
    job_type  ``train``
    tags      ``method=..``, ``reward=..``, ``exchange=..``, ``rotation=..``, ``init=..``, ``task=..``, and
              ``logger.tags``
    config    the resolved Hydra config;  dir: the run directory (W&B writes ``<run_dir>/wandb/``)
    history   every ``metrics.jsonl`` row, plotted against ``train/step`` (``define_metric("*", step_metric=...)``)
    tables    sample rollouts at each evaluation under ``rollouts/step_000040`` (one key per step, so none is
              overwritten), at most ``logger.table_rows`` rows
    summary   ``summary.json`` without its ``config`` (already the run's config)

Mode: ``logger.mode`` if set; else ``WANDB_MODE`` from the environment; else online when an API key is found
(``WANDB_API_KEY``, an identity token file, or a ``~/.netrc`` entry) and offline with a one-line notice when
none is. Offline runs upload later with ``wandb sync <run_dir>/wandb/offline-run-*``. An online start that fails
(unreachable server, timeout after ``WANDB_INIT_TIMEOUT`` or 60 s) warns and falls back to offline, and later
cells of the same process go offline at once; an offline start that fails raises, and ``build_logger`` then
warns and logs locally only. Several runs in one process (Hydra's basic launcher) each get their own run
(``reinit="create_new"``), and each is finished with its exit code, a failed cell's too.

A run directory keeps its W&B run id (``wandb_run_id``), so a resumed run (the same command again, a requeued
SLURM job) continues the same W&B run (``resume="allow"``); its steps after the checkpoint are logged again.

Left out on purpose: uploading checkpoints as artifacts.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import re
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import wandb
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agon.loggers import Logger, register_logger
from agon.run_files import sweep_name

log = logging.getLogger(__name__)

# the config keys that become tags, as (tag prefix, dotted key)
TAG_KEYS = (
    ("method", "method.name"),
    ("reward", "reward.name"),
    ("exchange", "exchange.mode"),
    ("rotation", "rotation.mode"),
    ("init", "init.mode"),
    ("task", "task.name"),
)
# rollout columns shown first in the W&B table; any other key follows in first-seen order
ROLLOUT_COLUMNS = (
    "problem_id",
    "problem",
    "drafter",
    "draft",
    "recap",
    "challenge",
    "draft_correct",
    "challenge_correct",
    "drafter_reward",
    "challenger_reward",
)
DEFAULT_INIT_TIMEOUT_S = 60.0
# modes that never reach a server (dryrun: W&B's old name for offline)
OFFLINE_MODES = ("offline", "disabled", "dryrun")
# set after an online start failed in this process: later cells go offline without waiting for the timeout again
_online_failed = False


# ---------------------------------------------------------------------------------------------------------------
# naming


def _hydra_config() -> Any | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get() if HydraConfig.initialized() else None
    except (ImportError, ValueError):
        return None


def run_names(cfg: DictConfig, run_dir: Path) -> tuple[str | None, str]:
    """The W&B ``(group, name)`` of a run: see the module docstring."""
    hc = _hydra_config()
    sweep_dir: Path | None = None
    override_dirname = ""
    if hc is not None:
        override_dirname = str(OmegaConf.select(hc, "job.override_dirname", default="") or "")
        if str(OmegaConf.select(hc, "mode", default="")).endswith("MULTIRUN"):
            sweep_dir = Path(str(hc.sweep.dir))
    if sweep_dir is None and (run_dir.parent / "multirun.yaml").exists():
        sweep_dir = run_dir.parent
    group = OmegaConf.select(cfg, "logger.group", default=None)
    if not group and sweep_dir is not None:
        group = sweep_name(sweep_dir)
    if not group:
        group = OmegaConf.select(cfg, "experiment", default=None)
    name = override_dirname
    if not name:
        name = run_dir.name
        if sweep_dir is not None:  # a multirun cell dir is <job.num>_<override_dirname>
            name = re.sub(r"^\d+_", "", name) or name
    return (str(group) if group else None), name


def run_tags(cfg: DictConfig) -> list[str]:
    tags = []
    for prefix, key in TAG_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None:
            tags.append(f"{prefix}={value}")
    tags += [str(t) for t in (OmegaConf.select(cfg, "logger.tags", default=None) or [])]
    # W&B rejects tags over 64 characters; keep order, drop repeats
    return list(dict.fromkeys(t[:64] for t in tags))


# ---------------------------------------------------------------------------------------------------------------
# mode


def has_api_key(environ: Mapping[str, str] | None = None) -> bool:
    """Whether W&B would find credentials without prompting: env key, identity token file, or a netrc entry."""
    env = os.environ if environ is None else environ
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = env.get("NETRC") or str(Path(env.get("HOME") or Path.home()) / ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(cfg_mode: str | None, environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """``(mode for wandb.init, notice or None)``. ``None`` as mode lets W&B decide from its settings files
    (online unless ``wandb offline`` was run)."""
    env = os.environ if environ is None else environ
    if cfg_mode:
        return cfg_mode, None
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"], None
    if has_api_key(env):
        return None, None
    return "offline", "W&B: no API key (WANDB_API_KEY or ~/.netrc) and no WANDB_MODE; logging offline"


def _init_timeout() -> float:
    try:
        return float(os.environ.get("WANDB_INIT_TIMEOUT", DEFAULT_INIT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_INIT_TIMEOUT_S


def _plain_config(cfg: DictConfig) -> dict:
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:  # an interpolation that only resolves inside Hydra: log it unresolved
        warnings.warn(f"W&B: config does not resolve ({exc}); logging it unresolved")
        return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------------------
# the logger


def _cell(value: Any) -> Any:
    """A W&B table cell: scalars as they are, anything else as JSON text."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return json.dumps(value)


class WandbLogger(Logger):
    """Mirrors a Recorder into one W&B run. Construct it through ``build_logger(cfg, run_dir)``."""

    def __init__(self, run: Any, table_rows: int = 16):
        self.run = run
        self.table_rows = table_rows
        self._finished = False
        run.define_metric("train/step")
        run.define_metric("*", step_metric="train/step")

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        row = {k: v for k, v in metrics.items() if v is not None}
        row["train/step"] = step
        self.run.log(row)

    def log_rollouts(self, rows: list[dict[str, Any]], step: int) -> None:
        rows = rows[: self.table_rows]
        if not rows:
            return
        keys = [c for c in ROLLOUT_COLUMNS if any(c in r for r in rows)]
        keys += [k for k in dict.fromkeys(k for r in rows for k in r) if k not in keys and k != "step"]
        table = wandb.Table(columns=keys, data=[[_cell(r.get(k)) for k in keys] for r in rows])
        self.run.log({"train/step": step, f"rollouts/step_{step:06d}": table})

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({k: v for k, v in summary.items() if k != "config" and v is not None})

    def finish(self, exit_code: int = 0) -> None:
        if not self._finished:
            self._finished = True
            self.run.finish(exit_code=exit_code)


def _init(cfg: DictConfig, run_dir: Path, mode: str | None) -> Any:
    from agon.run_files import WANDB_RUN_ID, write_text_atomic

    group, name = run_names(cfg, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    id_file = run_dir / WANDB_RUN_ID
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
    write_text_atomic(id_file, run_id)
    return wandb.init(
        id=run_id,
        resume="allow",
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        group=group,
        name=name,
        job_type="train",
        tags=run_tags(cfg),
        config=_plain_config(cfg),
        dir=str(run_dir),
        mode=mode,
        reinit="create_new",
        settings=wandb.Settings(init_timeout=_init_timeout()),
    )


@register_logger("wandb")
def wandb_logger(cfg: DictConfig, run_dir: Path) -> WandbLogger:
    """Start the run's W&B mirror; falls back to offline when an online start fails (see the module docstring)."""
    global _online_failed
    run_dir = Path(run_dir)
    mode, notice = resolve_mode(cfg.logger.mode)
    if mode not in OFFLINE_MODES and _online_failed:
        mode, notice = "offline", "W&B: an earlier online start in this process failed; logging offline"
    if notice:
        log.warning("%s to %s/wandb (upload later with `wandb sync`)", notice, run_dir)
    try:
        run = _init(cfg, run_dir, mode)
    except Exception as exc:
        if mode in OFFLINE_MODES:
            raise
        _online_failed = True
        warnings.warn(
            f"W&B online start failed ({type(exc).__name__}: {exc}); logging offline to {run_dir}/wandb "
            "(upload later with `wandb sync`)"
        )
        run = _init(cfg, run_dir, "offline")
    return WandbLogger(run, table_rows=int(cfg.logger.table_rows))
