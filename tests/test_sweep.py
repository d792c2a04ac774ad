"""The command users type, as they type it: the 2x2 multirun, four cells, one table at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SMALL_RUN, TEST_WORLD


@pytest.mark.long
def test_the_2x2_multirun_writes_every_cell_and_prints_one_table(tmp_path, agon_cache):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "agon.run", "-m", "reward=competitive,cooperative", "exchange=visible,hidden",
           *TEST_WORLD, *[o for o in SMALL_RUN if not o.startswith("progress")], "trainer.max_steps=1", "logger=none",
           f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "AGON_CACHE": str(agon_cache), "WANDB_MODE": "disabled"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-3000:]
    cells = sorted(p.name for p in sweep.iterdir() if (p / "summary.json").exists())
    assert len(cells) == 4, cells
    # this many overrides make a name past the file system's limit: it is cut, with a hash, not refused
    assert all(len(c) < 180 for c in cells)
    combos = set()
    for cell in cells:
        summary = json.loads((sweep / cell / "summary.json").read_text())
        assert summary["method"] == "agon" and summary["train/steps"] == 1
        assert (sweep / cell / ".hydra" / "config.yaml").exists()
        combos.add((summary["reward"], summary["exchange"]))
    assert combos == {(r, e) for r in ("competitive", "cooperative") for e in ("visible", "hidden")}
    # the sweep ends with one table holding the four cells
    assert (sweep / "cells.md").exists()
    table = (sweep / "cells.md").read_text()
    assert table.count("competitive") >= 2 and table.count("cooperative") >= 2
    assert "one row per cell" in out.stdout


@pytest.mark.slow
def test_default_run_learns(tmp_path):
    """`make run`'s job: held-out accuracy rises by at least 5 points (minutes; the real default sizes)."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "agon.run", "logger=none", "progress=false",
                          f"output_dir={tmp_path / 'run'}"], capture_output=True, text=True, env=env, timeout=1800,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval/n_problems"] >= 200 and summary["eval/samples"] >= 4
    assert summary["eval/accuracy"] >= summary["eval/accuracy_at_start"] + 0.05
