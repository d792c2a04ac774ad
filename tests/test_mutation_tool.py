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


def test_a_mutation_run_never_runs_this_file_unless_told_to():
    """This file fails on any edit of a line a named mutant patches, so in a mutation run it would report every
    named mutant "killed" for a reason that is not behaviour: a run leaves it out by default, also when the whole
    suite is named (``--tests tests``) or a mutant names it, and ``--exclude`` with no path puts it back."""
    me = "tests/test_mutation_tool.py"
    m = mutation.Mutant("x", "agon/core/grpo.py", "", "a", "b", tests=[me, "tests/test_grpo.py"])
    assert me in mutation.EXCLUDED
    assert mutation.pytest_targets(m) == ["tests/test_grpo.py", f"--ignore={me}"]
    assert mutation.pytest_targets(m, ["tests"]) == ["tests", f"--ignore={me}"]
    assert mutation.pytest_targets(m, ["tests"], ()) == ["tests"]
    plain = mutation.Mutant("y", "agon/core/grpo.py", "", "a", "b")
    assert mutation.pytest_targets(plain)[:-1] == mutation.TESTS["agon/core/grpo.py"]


def test_pytest_ignores_the_excluded_file_when_the_suite_is_named(tmp_path):
    """The ``--ignore`` a run passes keeps pytest from collecting the file from a folder it is told to run."""
    import subprocess

    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_mutation_tool.py").write_text("def test_fails():\n    assert False\n")
    (tests / "test_other.py").write_text("def test_passes():\n    pass\n")
    m = mutation.Mutant("x", "agon/core/grpo.py", "", "a", "b")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *mutation.pytest_targets(m, ["tests"])], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout
