"""The install is pinned: every package constraints.txt names is installed at that version (``make install`` passes
it to pip as constraints; torch is chosen by machine and left out), and the file is one ``make lock`` writes."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

LOCK = Path(__file__).parents[1] / "constraints.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)$")


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            m = PIN.match(line.strip())
            assert m, f"constraints.txt: {line!r} is not a name==version pin"
            pins[m.group(1)] = m.group(2)
    return pins


def test_the_lock_pins_versions_and_leaves_torch_to_the_machine():
    pins = _pins()
    assert len(pins) > 50 and "torch" not in {n.lower() for n in pins} and "agon" not in pins
    for name in ("transformers", "peft", "trl", "hydra-core", "accelerate", "datasets", "math-verify", "optuna"):
        assert any(n.lower().replace("_", "-") == name for n in pins), f"{name} is not pinned"


def test_every_pinned_package_is_installed_at_its_pinned_version():
    wrong = {}
    for name, version in _pins().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong[name] = (version, installed)
    assert not wrong, f"installed versions differ from constraints.txt (pinned, installed): {wrong}; run make install"


# -- agon as a wheel -------------------------------------------------------------------------------------------

ROOT = Path(__file__).parents[1]


def test_the_wheel_lists_every_package_of_the_source_tree():
    """pyproject.toml names its packages (the config, sweeps and shipped worlds are mapped into the package, which
    automatic discovery cannot see): a package added to the source tree must be added there too."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("agon", "analysis", "hydra_plugins")
             for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts}
    assert found <= listed, sorted(found - listed)


@pytest.mark.long
def test_a_wheel_installed_in_a_fresh_venv_runs_from_a_folder_with_no_source_tree(tmp_path, agon_cache):
    """Built with ``pip wheel``, installed without its dependencies into a new environment that reads the ones this
    environment already has (no index, no network): from an empty folder the console script composes the config
    (which ships inside the package) and runs the test world, whose base ships in the wheel too."""
    import os
    import subprocess
    import sys
    import sysconfig
    import zipfile

    from tests.conftest import TEST_WORLD

    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    wheel = next(wheels.glob("agon-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "agon/conf/config.yaml" in names and "agon/sweeps/grid_2x2.yaml" in names
    assert "agon/shipped_bases/manifest.json" in names
    # every layer's folder, the vLLM worker script its engine starts by path, and `python -m agon.bench`
    layers = ("core", "tasks", "families", "records", "models", "engines", "game", "training", "bench")
    assert {f"agon/{layer}/__init__.py" for layer in layers} <= set(names), sorted(names)
    assert {"agon/engines/vllm_worker.py", "agon/bench/__main__.py"} <= set(names)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this environment's packages, as a path and not a site dir: its .pth files (agon's editable install) stay off
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    env = {**os.environ, "AGON_CACHE": str(agon_cache), "WANDB_MODE": "disabled", "PYTHONPATH": ""}
    where = subprocess.run([str(python), "-c", "import agon; print(agon.__file__)"], cwd=empty, capture_output=True,
                           text=True, env=env).stdout
    assert where.startswith(str(venv)), where  # the wheel's agon, not the checkout's
    agon = str(venv / "bin" / "agon")
    job = subprocess.run([agon, "experiment=paper_deepmath", "--cfg", "job", "-p", "reward"], cwd=empty,
                         capture_output=True, text=True, env=env, timeout=300)
    assert job.returncode == 0 and "correct_weight: 2.0" in job.stdout, job.stderr[-2000:]
    run = subprocess.run([agon, *TEST_WORLD, "logger=none", "progress=false", "trainer.max_steps=1",
                          "trainer.prompts_per_step=2", "trainer.num_generations=2", "trainer.max_new_tokens=16",
                          "eval.n_problems=2", "eval.samples=2", "hydra.run.dir=run"], cwd=empty, capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert (empty / "run" / "summary.json").exists() and "[eval] eval final" in run.stdout
