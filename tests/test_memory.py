"""The update's GPU memory (``agon.training.memory``) and the start-up check on it (``preflight.check_memory``): the
model reproduces the H200 check's measured peaks, the paper recipe fits an 80 GB card for Qwen3-0.6B and 4B, a
setting that does not is refused before anything loads with the numbers and the settings that fit, and
``python -m agon.estimate`` prints the same line for a card named with ``--device``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agon.core.config import ConfigError
from agon.estimate import main as estimate_main
from agon.training.estimate import GPUS
from agon.training.memory import update_memory
from agon.training.preflight import check_memory
from tests.conftest import compose_config

ROOT = Path(__file__).parents[1]
H200_CHECK = ROOT / "docs" / "gpu-h200-2026-12-04.json"
H100 = GPUS["H100"].memory_gib


def _paper(*overrides: str):
    return compose_config(["experiment=paper_deepmath", *overrides])


def test_the_model_reproduces_the_h200_checks_two_measured_peaks_over_the_weights():
    """Qwen3-0.6B's two scoring cases on the H200 (a 16,384-token row alone, a micro-batch of 8 rows of 8,191): what
    the model puts over the weights (checkpointed inputs, head chunk, recompute) is the measured peak over the model
    within 0.3 GiB."""
    report = json.loads(H200_CHECK.read_text())["runs"][0]["report"]
    scoring = report["scoring"]
    chunk = scoring["score_kwargs"]["chunk_tokens"]
    for name, case in scoring["cases"].items():
        tokens = case["rows"] * case.get("width", case["real_tokens"])
        cfg = _paper("model=qwen3_0.6b", f"trainer.max_new_tokens={tokens // 4}")
        est = update_memory(cfg, scoring_batch_tokens=tokens, logit_chunk_tokens=chunk)
        over = est.inputs + est.head_chunk + est.recompute
        assert est.tokens == tokens
        assert over == pytest.approx(case["peak_over_model_gib"], abs=0.3), (name, over, case["peak_over_model_gib"])


def test_the_paper_recipe_fits_an_80_gb_card_beside_vllms_share_for_qwen3_0_6b_and_4b():
    for model in ("qwen3_0.6b", "qwen3_4b"):
        line = check_memory(_paper(f"model={model}"), H100, "an H100")
        assert line is not None and "leaving 35.8" in line, line
    # the 4B update's parts: 4.02B bf16 weights, two rank-16 adapters, 36 layers of 2,560 over 65,536 tokens
    est = update_memory(_paper("model=qwen3_4b"))
    assert est.weights == pytest.approx(7.49, abs=0.01) and est.inputs == pytest.approx(11.25, abs=0.01)
    assert 31 < est.needed < 35.8


def test_a_setting_whose_update_does_not_fit_is_refused_with_the_numbers_and_the_settings_that_do():
    """Qwen3-4B with the head chunk of 4,096 the paper preset had: 37.6 GiB against 35.8 left on an H100. The
    message names both, each part, and two ways out, each of which then passes."""
    cfg = _paper("model=qwen3_4b", "trainer.logit_chunk_tokens=4096")
    with pytest.raises(ConfigError) as refused:
        check_memory(cfg, H100, "an H100")
    message = str(refused.value)
    assert "needs about 37.6 GiB" in message and "leaving 35.8" in message and "a 4,096-token head chunk 9.9" in message
    assert "trainer.logit_chunk_tokens=2048 (about 31.9 GiB)" in message
    assert "generation.vllm.gpu_memory_utilization=0.52" in message and "trainer.check_memory=false" in message
    check_memory(_paper("model=qwen3_4b", "trainer.logit_chunk_tokens=2048"), H100, "an H100")
    check_memory(_paper("model=qwen3_4b", "trainer.logit_chunk_tokens=4096",
                        "generation.vllm.gpu_memory_utilization=0.52"), H100, "an H100")
    assert check_memory(_paper("model=qwen3_4b", "trainer.logit_chunk_tokens=4096", "trainer.check_memory=false"),
                        H100, "an H100") is None
    # without vLLM on the card the trainer has all of it
    check_memory(_paper("model=qwen3_4b", "trainer.logit_chunk_tokens=4096", "generation.engine=hf"), H100)


def test_when_neither_setting_fits_the_message_says_what_would():
    """Qwen3-4B on a 24 GB card beside vLLM's 0.55: no chunk or micro-batch fits what is left, and no share of at
    least 0.3 leaves enough: a larger GPU or a smaller model."""
    with pytest.raises(ConfigError, match="Set a larger GPU or a smaller model"):
        check_memory(_paper("model=qwen3_4b"), 24.0, "a 24 GB card")


def test_nothing_is_checked_on_a_cpu_or_for_a_model_without_a_published_shape():
    assert check_memory(_paper("model=qwen3_4b", "model.device=cpu")) is None
    assert check_memory(compose_config([]), H100) is None  # the offline world
    assert update_memory(compose_config(["model.name=someone/their-model", "model.shape=null"])) is None


def test_the_estimate_prints_the_memory_line_for_the_card_it_plans_on(capsys):
    assert estimate_main(["experiment=paper_deepmath", "model=qwen3_4b", "trainer.logit_chunk_tokens=4096",
                          "--gpu-check", str(H200_CHECK), "--device", "H100"]) == 0
    out = capsys.readouterr().out
    assert "memory: refused at the start: Qwen/Qwen3-4B's update needs about 37.6 GiB" in out, out
    assert estimate_main(["experiment=paper_deepmath", "model=qwen3_4b", "trainer.logit_chunk_tokens=4096",
                          "--gpu-check", str(H200_CHECK)]) == 0
    assert "memory: Qwen/Qwen3-4B's update needs about 37.6 GiB" in capsys.readouterr().out  # the H200 holds it
