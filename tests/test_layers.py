"""agon's layers (``[tool.importlinter]`` in pyproject.toml): the contract holds on the package, and a new upward
import breaks it, so the check that `make test` runs can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
LINT = str(Path(sys.executable).parent / "lint-imports")


def _lint(root: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--config", str(config), "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(root)})


def test_the_layers_hold_and_an_upward_import_breaks_them(tmp_path):
    kept = _lint(ROOT, ROOT / "pyproject.toml")
    assert kept.returncode == 0 and "1 kept, 0 broken" in kept.stdout, kept.stdout[-3000:]
    shutil.copytree(ROOT / "agon", tmp_path / "agon", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    config = tmp_path / "agon" / "config.py"  # the bottom layer reaching for the trainer
    config.write_text(config.read_text() + "\n\ndef _upward():\n    from agon.trainer import Trainer\n\n"
                                            "    return Trainer\n")
    broken = _lint(tmp_path, tmp_path / "pyproject.toml")
    assert broken.returncode != 0 and "agon.config -> agon.trainer" in broken.stdout, broken.stdout[-3000:]
