"""The front page says only what the code says: short, every page and target it names exists, and every number it
states is read here from where it comes from."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) < 200


def test_every_page_folder_and_make_target_it_names_exists():
    for path in set(re.findall(r"`((?:docs|conf|sweeps|tests|tools|agon|bases)/[\w./*-]+)`", README)):
        if "*" in path or "<" in path:
            assert list(ROOT.glob(path)), path
        elif not path.endswith("default.yaml"):  # conf/local/default.yaml is the user's own, git-ignored
            assert (ROOT / path).exists(), path
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M))
    assert set(re.findall(r"`make ([a-z-]+)", README)) <= targets


def test_the_numbers_it_states_are_the_codes():
    from agon.training.checks import compose_config

    shipped = json.loads((ROOT / "bases" / "manifest.json").read_text())
    assert "the four shipped offline worlds" in README and len(shipped) == 4
    reward = compose_config(["experiment=paper_deepmath"]).reward
    assert "correctness 2, conversion 1, format 0.5" in README
    assert (reward.correct_weight, reward.conversion_bonus, reward.format_weight) == (2, 1, 0.5)
    grid = compose_config(["experiment=paper_deepmath", "reward=cooperative"]).reward
    assert grid.correct_weight == 2 and grid.format_weight == 0.5  # "the paper's cooperative twin"
