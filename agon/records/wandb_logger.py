"""W&B mirror of a run's records (``logger=wandb``, the default). The run directory stays the source of truth.

What one run becomes in W&B (the conventions of W&B's own sweep and grouping guides), so that grouping runs by
``group`` then ``job_type`` draws one line per cell with a band over its seeds:
    project   ``logger.project`` ("agon"); entity ``logger.entity`` or W&B's default
    group     ``logger.group`` if set, else the sweep (multirun) name such as ``2026-11-30/10-00-00``,
              else ``experiment``; cells x seeds of one sweep aggregate in one group
    job_type  the cell: the run's overrides without its seed (``exchange=visible,reward=competitive``), ``train``
              for a run without overrides; cut to 64 characters with a hash where longer
    name      the cell's overrides (Hydra's ``override_dirname``, e.g. ``exchange=visible,reward=competitive,seed=1``),
              else the run directory's name
    tags      ``method=..``, ``reward=..``, ``exchange=..``, ``rotation=..``, ``init=..``, ``task=..``, ``model=..``,
              ``seed=..``, ``experiment=..`` (when set), ``span=..`` (latent exchange), and ``logger.tags``
    config    the resolved Hydra config;  dir: the run directory (W&B writes ``<run_dir>/wandb/``)
    history   every ``metrics.jsonl`` row, plotted against ``train/step`` (``define_metric("*", step_metric=...)``)
    tables    sample rollouts at each evaluation under ``rollouts/step_000040`` (one key per step, so none is
              overwritten), at most ``logger.table_rows`` rows
    summary   ``summary.json`` without its ``config`` (already the run's config)
    artifact  the final adapters (``<run_dir>/adapters``) as a ``model`` artifact ``adapters-<run id>``, when the
              summary is written and ``logger.artifacts`` is true (the default)

Mode: ``logger.mode`` if set; else ``WANDB_MODE`` from the environment; else online when an API key is found
(``WANDB_API_KEY``, an identity token file, or a ``~/.netrc`` entry) and offline with a one-line notice when
none is. Offline runs upload later with ``wandb sync <run_dir>/wandb/offline-run-*``. An online start that fails
(unreachable server, timeout after ``WANDB_INIT_TIMEOUT`` or 60 s) warns and falls back to offline, and later
cells of the same process go offline at once; an offline start that fails raises, and ``build_logger`` then
warns and logs locally only. Several runs in one process (Hydra's basic launcher) each get their own run
(``reinit="create_new"``), and each is finished with its exit code, a failed cell's too.

A run directory keeps its W&B run id (``wandb_run_id``), so a resumed run (the same command again, a requeued
SLURM job) continues the same W&B run (``resume="allow"``). It also keeps, in ``wandb_logged.json``, the last
``train/step`` it sent W&B of each kind of row (training, evaluation, rollout table): a resumed run recomputes the
steps after its checkpoint, and sends W&B only rows past those marks, so W&B's history holds each step once
(offline too, where W&B itself cannot know what an earlier process logged). A recomputed row keeps the values W&B
got first; ``metrics.jsonl`` holds the recomputed ones. The same holds for a run that starts over in its directory
(no checkpoint yet, or ``trainer.resume=never``): it continues the directory's W&B run; delete ``wandb_run_id`` and
``wandb_logged.json`` for a W&B run of its own.

Left out on purpose: checkpoints as artifacts (gigabytes per run for what ``trainer.resume`` already covers
locally) and W&B's ``resume_from`` rewind (online only, and it forks the history rather than keeping it).
"""

from __future__ import annotations

import hashlib
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

from agon.records.loggers import Logger, register_logger
from agon.records.run_files import sweep_name

log = logging.getLogger(__name__)

# the config keys that become tags, as (tag prefix, dotted key)
TAG_KEYS = (
    ("method", "method.name"),
    ("reward", "reward.name"),
    ("exchange", "exchange.mode"),
    ("rotation", "rotation.mode"),
    ("init", "init.mode"),
    ("task", "task.name"),
    ("model", "model.name"),
    ("seed", "seed"),
    ("experiment", "experiment"),
)
# what the run has sent W&B: the last train/step of each kind of row (see the module docstring)
LOGGED = "wandb_logged.json"
# W&B's limit on a tag, used for job_type too
MAX_NAME = 64
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
    group, name, _ = _names(cfg, run_dir)
    return group, name


def run_job_type(cfg: DictConfig, run_dir: Path) -> str:
    """The W&B ``job_type`` of a run: its cell (``cell_job_type`` of its overrides), ``train`` for a run whose name
    is not its overrides (a single run's timestamped directory)."""
    _, name, from_overrides = _names(cfg, run_dir)
    return cell_job_type(name) if from_overrides else "train"


def _names(cfg: DictConfig, run_dir: Path) -> tuple[str | None, str, bool]:
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
    name, from_overrides = override_dirname, bool(override_dirname)
    if not name:
        name = run_dir.name
        if sweep_dir is not None:  # a multirun cell dir is <job.num>_<override_dirname>
            name, from_overrides = re.sub(r"^\d+_", "", name) or name, True
    return (str(group) if group else None), name, from_overrides


def _split_overrides(name: str) -> list[str]:
    """``a=1,b=[x,y],c=2`` -> ``["a=1", "b=[x,y]", "c=2"]``: commas inside brackets or quotes stay."""
    parts, depth, quote, current = [], 0, "", ""
    for ch in name:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    return [p for p in [*parts, current] if p]


def _short(text: str) -> str:
    """``text`` if it fits W&B's 64 characters, else its head and a hash of the whole (distinct texts stay
    distinct)."""
    if len(text) <= MAX_NAME:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{text[: MAX_NAME - 9]}~{digest}"


def cell_job_type(name: str) -> str:
    """The W&B ``job_type`` of a run named ``name``: its overrides less the seed (every seed of a cell shares it),
    ``train`` when nothing is left."""
    parts = [p for p in _split_overrides(name) if p.lstrip("+~").split("=", 1)[0] != "seed"]
    return _short(",".join(parts)) if parts else "train"


def run_tags(cfg: DictConfig) -> list[str]:
    tags = []
    for prefix, key in TAG_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None:
            tags.append(f"{prefix}={value}")
    if str(OmegaConf.select(cfg, "exchange.mode", default="")).startswith("latent"):
        tags.append(f"span={OmegaConf.select(cfg, 'exchange.span', default=None)}")
    tags += [str(t) for t in (OmegaConf.select(cfg, "logger.tags", default=None) or [])]
    # W&B rejects tags over 64 characters; keep order, drop repeats
    return list(dict.fromkeys(_short(t) for t in tags))


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


def row_kind(row: Mapping[str, Any]) -> str:
    """``eval`` for an evaluation's metrics row (it holds ``eval/accuracy``, as ``Recorder.resume_from`` tells them
    apart), ``train`` for any other."""
    return "eval" if "eval/accuracy" in row else "train"


class WandbLogger(Logger):
    """Mirrors a Recorder into one W&B run. Construct it through ``build_logger(cfg, run_dir)``.

    With ``run_dir``, rows at or before the ``train/step`` that ``wandb_logged.json`` records for their kind are
    not sent again (a resumed run; the module docstring)."""

    def __init__(self, run: Any, table_rows: int = 16, run_dir: Path | None = None, artifacts: bool = False):
        self.run = run
        self.table_rows = table_rows
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.artifacts = artifacts
        self._finished = False
        self.logged: dict[str, int] = {}
        if self.run_dir is not None and (self.run_dir / LOGGED).exists():
            try:
                self.logged = {k: int(v) for k, v in json.loads((self.run_dir / LOGGED).read_text()).items()}
            except (ValueError, AttributeError):  # a torn file: resend rather than lose rows
                self.logged = {}
        run.define_metric("train/step")
        run.define_metric("*", step_metric="train/step")

    def _new(self, kind: str, step: int) -> bool:
        return step > self.logged.get(kind, -1)

    def _sent(self, kind: str, step: int) -> None:
        self.logged[kind] = step
        if self.run_dir is not None:
            from agon.records.run_files import write_text_atomic

            write_text_atomic(self.run_dir / LOGGED, json.dumps(self.logged, sort_keys=True))

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        row = {k: v for k, v in metrics.items() if v is not None}
        row["train/step"] = step
        kind = row_kind(row)
        if not self._new(kind, step):
            return
        self.run.log(row)
        self._sent(kind, step)

    def log_rollouts(self, rows: list[dict[str, Any]], step: int) -> None:
        rows = rows[: self.table_rows]
        if not rows or not self._new("rollouts", step):
            return
        keys = [c for c in ROLLOUT_COLUMNS if any(c in r for r in rows)]
        keys += [k for k in dict.fromkeys(k for r in rows for k in r) if k not in keys and k != "step"]
        table = wandb.Table(columns=keys, data=[[_cell(r.get(k)) for k in keys] for r in rows])
        self.run.log({"train/step": step, f"rollouts/step_{step:06d}": table})
        self._sent("rollouts", step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({k: v for k, v in summary.items() if k != "config" and v is not None})
        if self.artifacts and self.run_dir is not None:
            self.log_adapters(self.run_dir / "adapters")

    def log_adapters(self, directory: Path) -> None:
        """The final adapters as a ``model`` artifact named after the run (its versions are the run's restarts)."""
        if not directory.is_dir() or not any(directory.iterdir()):
            return
        artifact = wandb.Artifact(f"adapters-{self.run.id}", type="model",
                                  metadata={"run_dir": str(self.run_dir),
                                            "adapters": sorted(p.name for p in directory.iterdir() if p.is_dir())})
        artifact.add_dir(str(directory))
        self.run.log_artifact(artifact, aliases=["final"])

    def finish(self, exit_code: int = 0) -> None:
        from agon.core.preemption import EXIT_CODE

        if not self._finished:
            self._finished = True
            if exit_code == EXIT_CODE:  # stopped by SIGTERM: shown as preempted, resumed under the same id
                self.run.mark_preempting()
            self.run.finish(exit_code=exit_code)


def _init(cfg: DictConfig, run_dir: Path, mode: str | None) -> Any:
    from agon.records.run_files import WANDB_RUN_ID, write_text_atomic

    group, name = run_names(cfg, run_dir)
    job_type = run_job_type(cfg, run_dir)
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
        job_type=job_type,
        tags=run_tags(cfg),
        config=_plain_config(cfg),
        dir=str(run_dir),
        mode=mode,
        reinit="create_new",
        settings=wandb.Settings(init_timeout=_init_timeout()),
    )


def log_reevaluation(cfg: DictConfig, run_dir: Path, summary: dict[str, Any]) -> str | None:
    """``python -m agon.eval``'s results as a W&B run of their own in the run's group: job type ``reeval``, the
    training run's name with `` (reeval)``, its tags plus ``reeval``, the summary (every ``eval/*``, ``crossplay/*``
    and ``recap/*`` number) and the cross-play matrix as a table. A run of its own, not the training run resumed:
    resuming a finished run would reopen it and move its summary. Returns the run's id; None, with a warning, when
    W&B fails (the files in ``reeval/`` are the record)."""
    run_dir = Path(run_dir)
    group, name = run_names(cfg, run_dir)
    mode, notice = resolve_mode(cfg.logger.mode)
    if notice:
        log.warning("%s to %s/reeval/wandb (upload later with `wandb sync`)", notice, run_dir)
    try:
        out = run_dir / "reeval"
        out.mkdir(parents=True, exist_ok=True)
        run = wandb.init(project=cfg.logger.project, entity=cfg.logger.entity, group=group, name=f"{name} (reeval)",
                         job_type="reeval", tags=[*run_tags(cfg), "reeval"], config=_plain_config(cfg),
                         dir=str(out), mode=mode, reinit="create_new",
                         settings=wandb.Settings(init_timeout=_init_timeout()))
        matrix = summary.get("crossplay") or {}
        if matrix:
            run.log({"reeval/crossplay": wandb.Table(columns=["drafter", "answerer", "accuracy"],
                                                     data=[[*k.split(">", 1), v] for k, v in matrix.items()])})
        run.summary.update({k: v for k, v in summary.items()
                            if k not in ("config", "crossplay") and v is not None})
        run.finish()
        return run.id
    except Exception as exc:  # the re-evaluation's files are written already
        warnings.warn(f"W&B: the re-evaluation was not logged ({type(exc).__name__}: {exc})")
        return None


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
    return WandbLogger(run, table_rows=int(cfg.logger.table_rows), run_dir=run_dir,
                       artifacts=bool(OmegaConf.select(cfg, "logger.artifacts", default=True)))
