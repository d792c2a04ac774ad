"""Everything a run writes: its files and its logger, behind one object that a non-zero rank can silence.

The files are the JSONL records and ``summary.json`` of ``agon.records.run_files`` (which says what a run directory
holds). Lines are flushed and fsynced as they are written, so a crash loses at most the line being written; a torn last
line is dropped on reopen. On resume every record keeps only what the checkpoint covers, so nothing is logged twice:
the steps after it go, and so does the final evaluation when the checkpoint is the run's last step (it runs again).
A run with no checkpoint to resume starts its records over. Either way summary.json goes until the run writes it
again, so a directory never holds a summary of records it no longer has. Loggers (W&B and friends) are looked up by
name in ``LOGGERS``; a logger that fails is switched off with a warning and the local files go on.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from agon.records import run_files
from agon.records.loggers import LOGGERS, Logger
from agon.records.run_files import jsonable, read_jsonl, write_json_atomic, write_text_atomic


# a role's metrics that are also logged per adapter (``per_adapter``)
ADAPTER_METRICS = ("accuracy", "reward/mean", "completion_tokens", "entropy", "kl", "loss", "clip_ratio/region_mean",
                   "advantages/std")


def per_adapter(metrics: dict[str, Any], players: dict[str, str | None]) -> dict[str, Any]:
    """``role/<role>/<m>`` of a step again as ``adapter/<name>/<role>/<m>`` for the adapter ``players`` says played
    the role (``ADAPTER_METRICS`` only; the base model, None, has none). Under ``rotation=alternate`` the roles
    swap adapters every step, so a ``role/drafter/*`` curve jumps between A and B; an ``adapter/A/drafter/*`` curve
    follows A alone (a point every other step)."""
    out = {}
    for role, adapter in players.items():
        if adapter is None:
            continue
        for name in ADAPTER_METRICS:
            value = metrics.get(f"role/{role}/{name}")
            if value is not None:
                out[f"adapter/{adapter}/{role}/{name}"] = value
    return out


def build_logger(cfg: DictConfig, run_dir: Path) -> Logger:
    """The logger named by ``cfg.logger.name``; a failing one becomes the null logger with a warning."""
    name = cfg.logger.name
    if name == "wandb" and "wandb" not in LOGGERS:
        import agon.records.wandb_logger  # noqa: F401  (registers "wandb"; imported lazily, wandb is slow to import)
    factory = LOGGERS.get_or_raise(name)
    try:
        return factory(cfg, run_dir)
    except Exception as exc:  # the run must go on with its local files
        warnings.warn(f"logger {name!r} failed to start ({type(exc).__name__}: {exc}); logging locally only")
        return Logger()


class JsonlFile:
    def __init__(self, path: Path):
        self.path = path
        if path.exists():  # drop a torn last line left by a crash, so appends start on a fresh line
            rows = read_jsonl(path)
            raw = path.read_text()
            if raw and not raw.endswith("\n"):
                self._rewrite(rows)
        self._fh = open(path, "a")

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        write_text_atomic(self.path, "".join(json.dumps(row) + "\n" for row in rows))

    def keep(self, wanted: Callable[[dict[str, Any]], bool]) -> None:
        """Keep only the rows ``wanted`` accepts (resume: the others are about to be recomputed)."""
        self._fh.close()
        self._rewrite([r for r in read_jsonl(self.path) if wanted(r)])
        self._fh = open(self.path, "a")

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        self._fh.write("".join(json.dumps(jsonable(r)) + "\n" for r in rows))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


class Recorder:
    """The run's files and logger. ``enabled=False`` (any rank but 0) makes every method a no-op."""

    def __init__(self, run_dir: Path, logger: Logger | None = None, enabled: bool = True):
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.logger = logger or Logger()
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = JsonlFile(self.run_dir / run_files.METRICS)
        self._eval = JsonlFile(self.run_dir / run_files.EVAL)
        self._samples = JsonlFile(self.run_dir / run_files.SAMPLES)

    def _mirror(self, method: str, *args: Any) -> None:
        try:
            getattr(self.logger, method)(*args)
        except Exception as exc:
            warnings.warn(f"logger failed in {method} ({type(exc).__name__}: {exc}); logging locally only")
            self.logger = Logger()

    def resume_from(self, step: int, redone: str | None = None) -> None:
        """Forget the records about to be recomputed: those of steps after ``step`` and those of the evaluation at
        ``step`` whose phase is ``redone`` (``final``, or ``train``: an interim evaluation a kill cut short). ``step=-1``
        forgets them all (no checkpoint: the run starts over). The summary goes too: a run that resumes writes it
        again, and a stale one would make it look finished after a kill."""
        if not self.enabled:
            return
        (self.run_dir / run_files.SUMMARY).unlink(missing_ok=True)

        def kept(key: str, redo: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
            return lambda row: row[key] < step or (row[key] == step and not (redone and redo(row)))

        # an evaluation's metrics row is the one with eval/accuracy; its eval and sample rows name their phase
        self._metrics.keep(kept("train/step", lambda row: "eval/accuracy" in row))
        self._eval.keep(kept("step", lambda row: row.get("phase") == redone))
        self._samples.keep(kept("step", lambda row: row.get("phase") == redone))

    def evaluated(self, step: int) -> bool:
        """Whether an evaluation at ``step`` ended: its metrics row, an evaluation's last record, is written."""
        return self.enabled and any(row["train/step"] == step and "eval/accuracy" in row
                                    for row in read_jsonl(self._metrics.path))

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        if self.enabled:
            row = {"train/step": step, **metrics}
            self._metrics.write([row])
            self._mirror("log_metrics", jsonable(row), step)

    def log_eval_rows(self, rows: list[dict[str, Any]]) -> None:
        if self.enabled:
            self._eval.write(rows)

    def log_rollouts(self, rows: list[dict[str, Any]], step: int, mirror: bool = False) -> None:
        """Rollouts go to samples.jsonl; with ``mirror`` also to the logger (a table at each evaluation)."""
        if self.enabled:
            self._samples.write([{"step": step, **r} for r in rows])
            if mirror:
                self._mirror("log_rollouts", jsonable(rows), step)

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.enabled:
            write_json_atomic(self.run_dir / run_files.SUMMARY, summary)
            self._mirror("log_summary", jsonable(summary))

    def close(self, exit_code: int = 0) -> None:
        if self.enabled:
            for f in (self._metrics, self._eval, self._samples):
                f.close()
        self._mirror("finish", exit_code)
