"""Hydra callback that prints the per-cell table when a multirun ends.

Enable it in ``conf/config.yaml`` (or from the command line with ``+hydra.callbacks.sweep_table._target_=...``)::

    hydra:
      callbacks:
        sweep_table:
          _target_: analysis.callbacks.SweepTable

With Hydra's basic launcher every cell has finished (or failed) by ``on_multirun_end``; cells that wrote no
``summary.json`` count as incomplete. The table is also written to ``<sweep dir>/cells.md``. Under a multi-process
launch (torchrun, accelerate) every rank runs the callback; only rank 0 (``RANK`` unset counts as 0) prints and
writes, so the table appears once and ranks do not race on the file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepTable(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if int(os.environ.get("RANK", "0")) != 0:
            return
        from analysis.load import load_runs
        from analysis.tables import cells_table, format_table

        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            text = format_table(cells_table(load_runs(sweep_dir).runs))
        except Exception as exc:  # noqa: BLE001  (a table must never fail the sweep)
            log.warning("no sweep table for %s (%s: %s)", sweep_dir, type(exc).__name__, exc)
            return
        (sweep_dir / "cells.md").write_text(f"```\n{text}\n```\n")
        print(f"\nsweep {sweep_dir}: one row per cell (figures: make figures RUNS={sweep_dir})\n{text}", flush=True)
