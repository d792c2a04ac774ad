"""tools/mutation.py's named mutants stay applicable: each patch matches its file's text exactly once and names
test files that exist, so a refactor that moves the text fails here, not silently in the next mutation run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("agon_mutation_tool", ROOT / "tools" / "mutation.py")
mutation = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up
_spec.loader.exec_module(mutation)  # type: ignore[union-attr]


@pytest.mark.parametrize("mutant", mutation.NAMED, ids=lambda m: m.id)
def test_each_named_mutant_applies_once_and_names_tests_that_exist(mutant):
    source = (ROOT / mutant.file).read_text()
    assert source.count(mutant.old) == 1, f"{mutant.id}: its text occurs {source.count(mutant.old)} times"
    assert mutation.mutated_source(mutant, source) != source
    for test in mutant.tests or mutation.TESTS[mutant.file]:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), f"{mutant.id}: no test file {path}"
        assert not name or f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), f"{mutant.id}: no test {name}"


def test_named_mutant_ids_are_unique():
    ids = [m.id for m in mutation.NAMED]
    assert len(ids) == len(set(ids))
