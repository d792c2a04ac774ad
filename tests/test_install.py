"""The install is pinned: every package constraints.txt names is installed at that version (``make install`` passes
it to pip as constraints; torch is chosen by machine and left out), and the file is one ``make lock`` writes."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

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
