"""Loggers: mirrors of a run's records (W&B and friends), looked up by name in ``LOGGERS``.

The base ``Logger`` does nothing (the null object), so the recorder can call it unconditionally. A logger module
registers itself with ``register_logger`` when imported; ``agon.records.recorder.build_logger`` imports the W&B one
only when it is asked for, since wandb is slow to import.
"""

from __future__ import annotations

from abc import ABC
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from agon.core.registry import Registry


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
