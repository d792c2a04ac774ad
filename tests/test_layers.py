"""agon's layers (``[tool.importlinter]`` in pyproject.toml): the folders' contract holds on the package, and an
import that runs the wrong way breaks it, so the check that `make test` runs can fail. Also that the folders are
what `ls agon/` shows: the layers, the entry points, nothing else."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
LINT = str(Path(sys.executable).parent / "lint-imports")
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
# the contract over agon's folders, and those over the modules inside one folder (agon's or analysis's)
FOLDERS = next(c for c in CONTRACTS if c["type"] == "layers" and "containers" not in c)
INSIDE = [c for c in CONTRACTS if "containers" in c]
# the modules agon keeps at its top: the entry points
ENTRY_POINTS = {"__init__.py", "run.py", "eval.py", "bases.py", "estimate.py"}


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(root)})


def test_the_layers_hold_on_agon():
    kept = _lint(ROOT)
    assert kept.returncode == 0 and f"{len(CONTRACTS)} kept, 0 broken" in kept.stdout, kept.stdout[-3000:]


@pytest.mark.parametrize("module, imported, broken", [
    # the bottom layer reaching for the trainer
    ("core/config.py", "agon.training.trainer", "agon.core.config -> agon.training.trainer"),
    # the core reaching for a measurement tool
    ("models/policies.py", "agon.bench.model_shape", "agon.models.policies -> agon.bench.model_shape"),
    # siblings of one layer: the records and the model families
    ("records/recorder.py", "agon.families", "agon.records.recorder -> agon.families"),
    # one engine importing another (each is on the interface alone)
    ("engines/hf.py", "agon.engines.vllm_engine", "agon.engines.hf -> agon.engines.vllm_engine"),
    # within a folder: the plain data reaching for the policies that use it
    ("models/tokens.py", "agon.models.policies", "agon.models.tokens -> agon.models.policies"),
    # the library reaching for the figures
    ("game/cascade.py", "analysis.tables", "agon.game.cascade -> analysis.tables"),
    # the circle the statistics were moved out of: paired reading claims, which reads paired
    ("../analysis/paired.py", "analysis.claims", "analysis.paired -> analysis.claims"),
])
def test_an_import_the_wrong_way_breaks_them(tmp_path, module, imported, broken):
    for package in ("agon", "analysis"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / "agon" / module
    path.write_text(path.read_text() + f"\n\ndef _upward():\n    import {imported}\n\n    return {imported}\n")
    result = _lint(tmp_path)
    assert result.returncode != 0 and broken in result.stdout, result.stdout[-3000:]


def test_agon_shows_its_layers_as_folders():
    """`ls agon/`: a folder per layer the contract names, the entry points, and nothing else; every folder a layer."""
    layers = {part.strip().removeprefix("agon.") for layer in FOLDERS["layers"] for part in layer.split("|")}
    folders = {p.name for p in (ROOT / "agon").iterdir() if p.is_dir() and p.name != "__pycache__"}
    modules = {p.name for p in (ROOT / "agon").iterdir() if p.suffix == ".py"}
    entry = {"run", "eval", "bases", "estimate"}
    assert folders == {name for name in layers if "." not in name and name not in entry}
    assert modules == ENTRY_POINTS
    assert {f"{name}.py" for name in entry} <= modules


def test_every_module_of_a_folder_with_an_order_is_in_it():
    """A folder's own contract names every module in it, so a module added later has a place in the order."""
    assert {c["containers"][0] for c in INSIDE} >= {"agon.core", "agon.models", "agon.engines", "analysis"}
    for contract in INSIDE:
        (container,) = contract["containers"]
        named = {m.strip() for layer in contract["layers"] for m in layer.split("|")}
        present = {p.stem for p in (ROOT / container.replace(".", "/")).glob("*.py") if not p.stem.startswith("__")}
        assert named == present, (container, named ^ present)
        assert all(re.fullmatch(r"\w+", m) for m in named)
