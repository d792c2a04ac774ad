"""Everything a run writes: its files and its logger, behind one object that a non-zero rank can silence.

Files in the run directory (DESIGN.md section 2, names in docs/metrics.md):
    metrics.jsonl   one JSON line per step, append-only, ``train/step`` the key; the record W&B mirrors
    eval.jsonl      one row per problem x sample x order x stage of every evaluation
    samples.jsonl   rollouts: draft, recap, challenge and their rewards
    summary.json    final metrics, git commit, package versions (written atomically)

Lines are flushed and fsynced as they are written, so a crash loses at most the line being written; a torn last
line is dropped on reopen. On resume, ``metrics.jsonl`` keeps only steps up to the checkpoint's step, so no step is
logged twice. Loggers (W&B and friends) are looked up by name in ``LOGGERS``; a logger that fails is switched off
with a warning and the local files go on.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import warnings
from abc import ABC
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from agon.registry import Registry


class Logger(ABC):
    """A mirror of the run's records. The default methods do nothing (the null object)."""

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:  # noqa: B027
        pass

    def log_rollouts(self, rows: list[dict[str, Any]], step: int) -> None:  # noqa: B027
        pass

    def log_summary(self, summary: dict[str, Any]) -> None:  # noqa: B027
        pass

    def finish(self, exit_code: int = 0) -> None:  # noqa: B027
        pass


LoggerFactory = Callable[[DictConfig, Path], Logger]
LOGGERS: Registry[LoggerFactory] = Registry("logger.name")
register_logger = LOGGERS.register


@register_logger("none")
def _null_logger(cfg: DictConfig, run_dir: Path) -> Logger:
    return Logger()


def build_logger(cfg: DictConfig, run_dir: Path) -> Logger:
    """The logger named by ``cfg.logger.name``; a failing one becomes the null logger with a warning."""
    name = cfg.logger.name
    if name == "wandb" and "wandb" not in LOGGERS:
        import agon.wandb_logger  # noqa: F401  (registers "wandb"; imported lazily, wandb is slow to import)
    factory = LOGGERS.get_or_raise(name)
    try:
        return factory(cfg, run_dir)
    except Exception as exc:  # the run must go on with its local files
        warnings.warn(f"logger {name!r} failed to start ({type(exc).__name__}: {exc}); logging locally only")
        return Logger()


def sweep_name(sweep_dir: Path) -> str:
    """A sweep's name: ``multirun/2026-11-30/10-00-00`` -> ``2026-11-30/10-00-00`` (the parts after ``multirun``, or
    ``<date>/<time>`` in Hydra's layout under any base directory), else the directory's name."""
    parts = Path(sweep_dir).resolve().parts
    if "multirun" in parts:
        rest = parts[len(parts) - parts[::-1].index("multirun") :]
        if rest:
            return "/".join(rest)
    if len(parts) > 1 and re.fullmatch(r"\d{4}-\d{2}-\d{2}", parts[-2]):
        return "/".join(parts[-2:])
    return Path(sweep_dir).name


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _jsonable(value.item())
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to a temporary file in the same directory, fsync, then rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_jsonable(obj), f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSONL file (a torn last line from a crash is skipped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


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
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        with os.fdopen(fd, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def truncate_after(self, key: str, last: int) -> None:
        """Keep rows whose ``key`` is at most ``last`` (resume: the steps after the checkpoint will be redone)."""
        self._fh.close()
        self._rewrite([r for r in read_jsonl(self.path) if r.get(key, -1) <= last])
        self._fh = open(self.path, "a")

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        self._fh.write("".join(json.dumps(_jsonable(r)) + "\n" for r in rows))
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
        self._metrics = JsonlFile(self.run_dir / "metrics.jsonl")
        self._eval = JsonlFile(self.run_dir / "eval.jsonl")
        self._samples = JsonlFile(self.run_dir / "samples.jsonl")

    def _mirror(self, method: str, *args: Any) -> None:
        try:
            getattr(self.logger, method)(*args)
        except Exception as exc:
            warnings.warn(f"logger failed in {method} ({type(exc).__name__}: {exc}); logging locally only")
            self.logger = Logger()

    def resume_from(self, step: int) -> None:
        """Forget records of steps after ``step`` (they are about to be recomputed)."""
        if self.enabled:
            self._metrics.truncate_after("train/step", step)
            self._eval.truncate_after("step", step)
            self._samples.truncate_after("step", step)

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        if self.enabled:
            row = {"train/step": step, **metrics}
            self._metrics.write([row])
            self._mirror("log_metrics", _jsonable(row), step)

    def log_eval_rows(self, rows: list[dict[str, Any]]) -> None:
        if self.enabled:
            self._eval.write(rows)

    def log_rollouts(self, rows: list[dict[str, Any]], step: int, mirror: bool = False) -> None:
        """Rollouts go to samples.jsonl; with ``mirror`` also to the logger (a table at each evaluation)."""
        if self.enabled:
            self._samples.write([{"step": step, **r} for r in rows])
            if mirror:
                self._mirror("log_rollouts", _jsonable(rows), step)

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.enabled:
            write_json_atomic(self.run_dir / "summary.json", summary)
            self._mirror("log_summary", _jsonable(summary))

    def close(self, exit_code: int = 0) -> None:
        if self.enabled:
            for f in (self._metrics, self._eval, self._samples):
                f.close()
        self._mirror("finish", exit_code)
