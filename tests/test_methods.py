"""The method registry: a method defined in this file alone runs end to end, and no other module knows a method
by its name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from agon.training.checks import validate
from agon.core.config import ConfigError
from agon.core.methods import AXES, METHODS, Evaluation, Method, Turn, get_method, register_method
from agon.run import run
from agon.records.run_files import read_json, read_jsonl
from tests.conftest import SMALL_RUN, TEST_WORLD, compose_config

ROOT = Path(__file__).resolve().parents[1]


class Relay(Method):
    """A toy method: B always drafts and A always answers; deployed as B>A, plus A alone on the side."""

    name, label, adapters, baseline = "relay", "relay", ("A", "B"), True
    axes = ("exchange",)

    def turn(self, rotation: str, step: int) -> Turn:
        return Turn("B", "A")

    def evaluation(self, rotation: str) -> Evaluation:
        return Evaluation([("B", "A"), ("A", False)], ["B>A"])


@pytest.fixture
def relay():
    register_method(Relay)
    try:
        yield get_method("relay")
    finally:
        METHODS.pop("relay")


def test_a_method_registered_here_runs_end_to_end(relay, agon_cache, tmp_path):
    cfg = compose_config(TEST_WORLD + SMALL_RUN + ["logger=none", "method.name=relay", "eval.n_problems=4"])
    cfg.output_dir = str(tmp_path / "run")
    summary = run(cfg)
    run_dir = Path(cfg.output_dir)
    assert summary["train/steps"] == 2 and summary["eval/headline_orders"] == ["B>A"]
    assert read_json(run_dir / "summary.json")["method_axes"] == ["exchange"]
    assert summary["method_label"] == "relay"
    # the turn it declared: B drafted every step
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "train/drafter" in r]
    assert [r["train/drafter"] for r in steps] == ["B", "B"]
    # the evaluation it declared: B>A and A alone, and the headline is B>A's final answers; at equal generations
    # each drafter's drafts are read again by itself and by the other (B>B; A>A, A>B on A's solo drafts)
    final = [r for r in read_jsonl(run_dir / "eval.jsonl") if r["phase"] == "final" and r["stage"] == "final"]
    assert {r["order"] for r in final} == {"B>A", "A", "B", "B>B", "A>A", "A>B"}
    assert relay.evaluation("alternate").reads() == [("B", "B"), ("A", "A"), ("A", "B")]
    cascade = [float(r["correct"]) for r in final if r["order"] == "B>A"]
    assert summary["eval/accuracy"] == pytest.approx(sum(cascade) / len(cascade))
    assert (run_dir / "adapters" / "B" / "adapter_model.safetensors").exists()


def test_an_unknown_method_fails_before_any_model_loads():
    cfg = compose_config(["method.name=relay"])
    with pytest.raises(ConfigError, match=r"method.name='relay'.*'agon'"):
        validate(cfg)


def test_registration_checks_the_axes_and_the_name():
    class Bad(Method):
        name, label, axes = "bad", "bad", ("temperature",)

    with pytest.raises(ValueError, match="unknown axes"):
        register_method(Bad)
    assert "bad" not in METHODS
    with pytest.raises(ValueError, match="already registered"):
        register_method(type("Again", (Method,), {"name": "agon", "label": "x"}))


def test_every_registered_method_declares_a_consistent_evaluation():
    for method in METHODS.values():
        assert set(method.axes) <= set(AXES)
        for rotation in ("alternate", "fixed"):
            evaluation = method.evaluation(rotation)
            players = {p for pair in evaluation.plays for p in pair if p not in (None, False)}
            assert players <= set(method.adapters), method.name
            if method.trains:
                turn = method.turn(rotation, 0)
                assert {turn.drafter, turn.challenger} - {None, False} <= set(method.adapters), method.name


def test_no_module_but_the_registry_knows_a_method_by_name():
    """Names of methods appear in agon/ and analysis/ code only in agon/core/methods.py (the issue's git grep)."""
    out = subprocess.run(["git", "grep", "-n", "-E", r"\"(agon|grpo|self_refine|moa)\"", "--", "agon", "analysis"],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        pytest.skip("not a git checkout")
    allowed = [
        r"^agon/core/methods\.py:",
        r'^agon/core/config\.py:\d+:    name: str = "agon"',  # the schema's default of method.name: a config
        r'^agon/bench/streamed\.py:\d+:STUDIED, BASELINE = "agon", "grpo"',  # the two sides the bench compares
        r"^agon/core/grpo\.py:\d+:@register_loss\(\"grpo\"\)",  # the loss type named after GRPO, not the method
        r'project: str = "agon"', r'default="agon"', r'\("agon"\)', r'project = "agon"',  # W&B's project name
        r'Path.home\(\) / ".cache" / "agon"',  # the model cache directory
    ]
    stray = [line for line in out.stdout.splitlines() if not any(re.search(a, line) for a in allowed)]
    assert not stray, "\n".join(stray)
