"""The settings map (``tests/settings_map.py``) against the typed config: every key has an entry, every entry is a
key, no key is in two places, every test named exists (found in its file's syntax tree, as pytest would collect
it) and mentions the key it stands for, and nothing is left pending. The checks are one pure function, so the last
test here can feed it a map with each kind of mistake and see each one named.

``python -m pytest tests/test_settings_map.py -k "not pending"`` checks a map that is still being filled in.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from functools import cache
from pathlib import Path
from typing import Any, Mapping

from agon.core import config
from tests import settings_map

ROOT = Path(__file__).resolve().parents[1]


def _leaves(prefix: str, schema: type) -> list[str]:
    """Dotted keys of every field of ``schema`` that holds a value, nested dataclasses walked into."""
    hints = typing.get_type_hints(schema)
    out = []
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(hints[f.name]):
            out += _leaves(f"{prefix}{f.name}.", hints[f.name])
        else:
            out.append(prefix + f.name)
    return out


def config_keys() -> set[str]:
    """Every key of the config: ``Config``'s own fields (a group's through its field), the task families' through
    ``TASK_SCHEMAS``, and the Optuna sweeper's under ``hydra.sweeper``. The fields every task family shares are
    ``task.<key>``, each family's own ``task.<kind>.<key>``."""
    from hydra_plugins.agon_optuna_sweeper.optuna_sweeper import OptunaSweeperConfig

    keys = {k for k in _leaves("", config.Config) if k != "task"}
    schemas = dict(config.TASK_SCHEMAS)
    shared = set.intersection(*({f.name for f in dataclasses.fields(s)} for s in schemas.values()))
    for kind, schema in schemas.items():
        for key in _leaves("", schema):
            keys.add(f"task.{key}" if key.split(".")[0] in shared else f"task.{kind}.{key}")
    return keys | set(_leaves("hydra.sweeper.", OptunaSweeperConfig))


@cache
def _tests_in(path: Path) -> dict[str, str]:
    """``name`` and ``Class::name`` of every test function in ``path``, each with its source (decorators too: a
    parametrized test names its settings there)."""
    source = path.read_text()
    lines = source.splitlines()
    out = {}

    def add(node: ast.AST, name: str) -> None:
        first = min([d.lineno for d in node.decorator_list] + [node.lineno])
        out[name] = "\n".join(lines[first - 1 : node.end_lineno])

    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            add(node, node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    add(item, f"{node.name}::{item.name}")
    return out


def test_source(node_id: str, root: Path = ROOT) -> str | None:
    """The source of the test ``tests/x.py::test_y`` (or ``tests/x.py::TestZ::test_y``), None when there is none."""
    path, sep, name = node_id.partition("::")
    if not sep or not path.endswith(".py") or not (root / path).is_file():
        return None
    return _tests_in((root / path).resolve()).get(name)


test_source.__test__ = False  # a helper, not a test


def problems(keys: set[str], computed: Mapping[str, tuple[str, ...]], not_computed: Mapping[str, str],
             pending: set[str], unnamed: Mapping[tuple[str, str], str], root: Path = ROOT) -> list[tuple[str, str]]:
    """(kind, message) of every mistake in a map: ``missing`` (a key with no entry), ``unknown`` (an entry for no
    key), ``twice`` (a key in two places), ``no_test`` (an entry naming a test that does not exist, or none),
    ``lazy`` (a test whose source does not mention its key's last component, with no reason in ``unnamed``),
    ``reason`` (an empty reason, or one in ``unnamed`` for a pair the map does not have)."""
    out: list[tuple[str, str]] = []
    places = {"COMPUTED": set(computed), "NOT_COMPUTED": set(not_computed), "PENDING": set(pending)}
    mapped = set().union(*places.values())
    out += [("missing", f"{k}: no entry in COMPUTED, NOT_COMPUTED or PENDING") for k in sorted(keys - mapped)]
    out += [("unknown", f"{k}: in the map but not a key of agon/core/config.py") for k in sorted(mapped - keys)]
    for k in sorted(mapped):
        where = [name for name, ks in places.items() if k in ks]
        if len(where) > 1:
            out.append(("twice", f"{k}: in {' and '.join(where)}"))
    for key, tests in sorted(computed.items()):
        if not tests:
            out.append(("no_test", f"{key}: names no test"))
        last = key.rsplit(".", 1)[-1]
        for node in tests:
            source = test_source(node, root)
            if source is None:
                out.append(("no_test", f"{key}: {node} does not exist"))
            elif last not in source and not unnamed.get((key, node), "").strip():
                out.append(("lazy", f"{key}: {node} never mentions {last!r} (say why in UNNAMED, or name a test "
                                    f"that sets it)"))
    for key, why in sorted(not_computed.items()):
        if not why.strip():
            out.append(("reason", f"{key}: NOT_COMPUTED without a reason"))
    for (key, node), why in sorted(unnamed.items()):
        if node not in computed.get(key, ()) or not why.strip():
            out.append(("reason", f"UNNAMED[{key!r}, {node!r}]: no such entry in COMPUTED, or no reason"))
    return out


def _found(kind: str) -> list[str]:
    return [m for k, m in problems(config_keys(), settings_map.COMPUTED, settings_map.NOT_COMPUTED,
                                   settings_map.PENDING, settings_map.UNNAMED) if k == kind]


def test_every_config_key_is_in_the_map():
    assert len(config_keys()) > 100  # the walk reached into every group
    assert _found("missing") == []


def test_every_key_in_the_map_is_a_config_key():
    assert _found("unknown") == []


def test_no_key_is_in_two_places():
    assert _found("twice") == []


def test_every_test_the_map_names_exists():
    assert _found("no_test") == []


def test_every_test_the_map_names_mentions_its_key_or_says_why():
    assert _found("lazy") == [] and _found("reason") == []


def test_no_key_is_pending():
    """The share of keys that change a run with a test behind them must be all of them."""
    print(settings_map.summary())
    assert not settings_map.PENDING, f"{settings_map.summary()}: {sorted(settings_map.PENDING)}"


def test_the_checks_name_each_kind_of_mistake(tmp_path):
    keys = {"trainer.epsilon", "trainer.beta", "model.lora.rank", "output_dir", "seed"}
    epsilon = "tests/test_grpo.py::test_loss_equals_trl"
    computed: dict[str, Any] = {
        "trainer.epsilon": (epsilon,),  # fine: the test sets it
        "trainer.beta": ("tests/test_grpo.py::test_no_such_test", "tests/no_such_file.py::test_x", "no-separator"),
        "model.lora.rnak": (epsilon,),  # a typo: no such key
        "seed": (),
        "output_dir": (epsilon,),  # also in NOT_COMPUTED below
    }
    # a test that exists but never mentions the key: a lazy pointer, unless a reason is given
    lazy = "tests/test_world.py::test_tokenizer_round_trips_text_and_keeps_specials_whole"
    computed["trainer.epsilon"] += (lazy,)
    found = problems(keys, computed, {"output_dir": "a path", "seed": " "}, set(), {("trainer.beta", epsilon): "x"})
    assert ("missing", "model.lora.rank: no entry in COMPUTED, NOT_COMPUTED or PENDING") in found
    assert ("unknown", "model.lora.rnak: in the map but not a key of agon/core/config.py") in found
    assert ("twice", "output_dir: in COMPUTED and NOT_COMPUTED") in found
    assert ("twice", "seed: in COMPUTED and NOT_COMPUTED") in found
    assert ("no_test", "seed: names no test") in found
    assert {m for k, m in found if k == "no_test" and m.startswith("trainer.beta")} == {
        f"trainer.beta: {n} does not exist" for n in computed["trainer.beta"]}
    assert {m.split(" (")[0] for k, m in found if k == "lazy"} == {
        f"trainer.epsilon: {lazy} never mentions 'epsilon'", f"model.lora.rnak: {epsilon} never mentions 'rnak'"}
    assert {m for k, m in found if k == "reason"} == {
        "seed: NOT_COMPUTED without a reason",
        "UNNAMED['trainer.beta', 'tests/test_grpo.py::test_loss_equals_trl']: no such entry in COMPUTED, or no "
        "reason"}
    # with its reason the lazy pointer passes; a class's test is found by Class::name
    assert not [m for k, m in problems(keys, computed, {}, set(), {("trainer.epsilon", lazy): "why"})
                if k == "lazy" and m.startswith("trainer.epsilon")]
    assert test_source("tests/test_settings_map.py::test_the_checks_name_each_kind_of_mistake") is not None
    assert test_source("tests/test_settings_map.py::Nope::test_the_checks_name_each_kind_of_mistake") is None
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_c.py").write_text(
        "import pytest\n\nclass TestLoss:\n    @pytest.mark.parametrize('epsilon', [0.1])\n"
        "    def test_clip(self, epsilon):\n        pass\n")
    node = "tests/test_c.py::TestLoss::test_clip"
    assert "parametrize('epsilon'" in test_source(node, tmp_path)
    assert problems({"trainer.epsilon"}, {"trainer.epsilon": (node,)}, {}, set(), {}, tmp_path) == []
    # the walk: the task families' own keys, the sweeper's, a nested dataclass's
    walked = config_keys()
    assert {"task.heldout_size", "task.arithmetic.max_operand", "task.reasoning_gym.train_size",
            "task.codecontests.sandbox.allow_unsafe", "hydra.sweeper.n_trials", "model.lora.rank",
            "generation.vllm.max_num_seqs", "tune.trial", "seed"} <= walked
    assert not {"task", "task.max_operand", "task.arithmetic.heldout_size", "model.lora", "generation"} & walked
