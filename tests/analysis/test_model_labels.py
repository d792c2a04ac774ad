"""Models named readably in tables and figures: the run records ``model_label`` in summary.json ("Qwen3-0.6B",
"Qwen3.5-2B", "Gemma 4 E2B", "tiny (offline)"); runs from before it keep ``model.name``; sizes read from a label
are parameter counts only (Gemma's E2B/E4B are effective sizes)."""

from __future__ import annotations

import pytest

from agon.run import model_label
from analysis import results_table
from analysis.load import RunRecord, frames
from analysis.tables import _model_size, paper_reference
from tests.conftest import compose_config

LABELS = {
    "tiny": "tiny (offline)",
    "qwen3_0.6b": "Qwen3-0.6B",
    "qwen3_1.7b": "Qwen3-1.7B",
    "qwen3_4b": "Qwen3-4B",
    "qwen3_5_0.8b": "Qwen3.5-0.8B",
    "qwen3_5_2b": "Qwen3.5-2B",
    "gemma4_e2b": "Gemma 4 E2B",
    "gemma4_e4b": "Gemma 4 E4B",
}


@pytest.mark.parametrize("option,label", LABELS.items())
def test_every_model_config_has_a_readable_label(option, label):
    assert model_label(compose_config([f"model={option}"]).model) == label


def test_a_model_with_no_shape_is_named_by_its_hub_name():
    model = compose_config(["model=qwen3_0.6b", "model.name=org/Some-Model", "model.shape=null"]).model
    assert model_label(model) == "org/Some-Model"


def _record(run_id: str, method: str, model: str, **extra) -> RunRecord:
    summary = {"method": method, "reward": "paper", "exchange": "visible", "rotation": "alternate",
               "init": "divergent", "task": "deepmath_hard", "model": model, "seed": 0, "eval/accuracy": 0.5,
               **extra}  # fmt: skip
    return RunRecord(run_id=run_id, summary=summary, overrides=["experiment=paper_deepmath"])


def test_the_model_axis_is_the_recorded_label_else_the_model_name():
    runs = frames([
        _record("new", "agon", "Qwen/Qwen3-0.6B", model_label="Qwen3-0.6B"),
        _record("gemma", "grpo", "google/gemma-4-E4B-it", model_label="Gemma 4 E4B"),
        _record("old", "grpo", "Qwen/Qwen3-4B"),  # written before summary.json held model_label
    ]).runs.set_index("run_id")  # fmt: skip
    assert runs.loc["new", "model"] == "Qwen3-0.6B"
    assert runs.loc["gemma", "model"] == "Gemma 4 E4B"
    assert runs.loc["old", "model"] == "Qwen/Qwen3-4B"


def test_a_run_still_training_is_named_as_its_summary_will_name_it():
    """No summary.json yet: the model label comes from the run's config, so the run joins its cell's row."""
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(compose_config(["experiment=target_sum"]), resolve=True)
    done = _record("done", "agon", "tiny", model_label="tiny (offline)")
    running = RunRecord(run_id="running", config=config)
    runs = frames([done, running]).runs.set_index("run_id")
    assert runs.loc["running", "model"] == runs.loc["done", "model"] == "tiny (offline)"
    assert runs.loc["running", "status"] == "incomplete"


def test_tables_name_the_model_by_its_label():
    data = frames([
        _record("agon", "agon", "Qwen/Qwen3-0.6B", model_label="Qwen3-0.6B"),
        _record("grpo", "grpo", "Qwen/Qwen3-4B", model_label="Qwen3-4B"),
    ])  # fmt: skip
    table = results_table(data)
    assert set(table["model"]) == {"Qwen3-0.6B", "Qwen3-4B"}
    assert not any("Qwen/" in str(c) for c in table["cell"])
    # the paper's scaling claim: GRPO on Qwen3-4B (59%) is read off the label's size
    grpo = table[table["method"] == "grpo"].iloc[0]
    assert (grpo["paper_accuracy"], grpo["paper_setting"]) == (0.59, "same setting")


@pytest.mark.parametrize("model,size", [
    ("qwen3_0.6b", "0.6b"), ("Qwen/Qwen3-14B", "14b"), ("Qwen3-0.6B", "0.6b"), ("Qwen3-4B", "4b"),
    ("Qwen3.5-2B", "2b"), ("Qwen/Qwen3.5-0.8B", "0.8b"), ("tiny", ""), ("tiny (offline)", ""),
    # effective sizes, not parameter counts
    ("Gemma 4 E2B", ""), ("Gemma 4 E4B", ""), ("google/gemma-4-E4B-it", ""), ("gemma4_e2b", ""),
])  # fmt: skip
def test_model_size_reads_parameter_counts_only(model, size):
    assert _model_size(model) == size


def test_gemma_e4b_is_not_the_papers_4b():
    base = {"method": "grpo", "reward": "-", "exchange": "-", "rotation": "-", "init": "-", "task": "deepmath_hard"}
    assert paper_reference({**base, "model": "Qwen3-4B"})[:2] == (0.59, None)
    gemma = paper_reference({**base, "model": "Gemma 4 E4B"})
    assert gemma[0] == 0.30 and "different" in gemma[2]
