"""``make bench``'s equal-work accounting: the Agon-vs-GRPO comparison at tiny settings, end to end through the CLI.

The test world answers in fewer than 40 tokens, so a budget of 40 shows whether the end of turn really was
suppressed: without it most completions stop early and the token counts fall short of the budget.
"""

from __future__ import annotations

import json

import pytest

from agon.bench import ratios as bench
from tests.conftest import TEST_WORLD

PROMPTS, GENERATIONS, BUDGET = 2, 2, 40
ARGS = ["--only", "agon-vs-grpo", "--agon-vs-grpo-steps", "2", "--agon-vs-grpo-warmup", "1", *TEST_WORLD,
        f"trainer.prompts_per_step={PROMPTS}", f"trainer.num_generations={GENERATIONS}",
        f"trainer.max_new_tokens={BUDGET}"]


def test_agon_vs_grpo_equal_work(agon_cache, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main([*ARGS, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["equal_work"] is True
    pair = report["agon_vs_grpo"]
    role = PROMPTS * GENERATIONS * BUDGET  # one role's completions, every one at the budget
    assert pair["budget_tokens_per_role"] == role
    assert pair["grpo"]["completion_tokens"] == [role, role]
    assert pair["grpo"]["draft_tokens"] == [role, role]
    assert pair["agon"]["completion_tokens"] == [2 * role, 2 * role]
    assert pair["agon"]["draft_tokens"] == pair["agon"]["challenge_tokens"] == [role, role]
    assert pair["unequal_work"] == []
    for side in ("grpo", "agon"):
        for key in ("step_s", "generation_s", "update_s"):
            assert len(pair[side][key]) == 2
            assert pair[side][f"median_{key}"] == pair[side][key][1]  # the warm-up step is left out
        assert all(u == s - g for s, g, u in zip(pair[side]["step_s"], pair[side]["generation_s"],
                                                 pair[side]["update_s"]))
    assert set(pair["ratio_agon_over_grpo"]) == {"step", "generation", "update", "step_per_token"}
    step = pair["agon"]["median_step_s"] / pair["grpo"]["median_step_s"]
    assert pair["ratio_agon_over_grpo"]["step"] == step
    assert pair["ratio_agon_over_grpo"]["step_per_token"] == pytest.approx(step / 2)  # twice the tokens
    assert pair["target_step_per_token"] == 1.0
    # compared with the committed baseline, in the report and on the console
    moved = report["against_baseline"]["agon_over_grpo_step_per_token"]
    assert moved["baseline"] == bench._read_baseline()["agon_over_grpo_step_per_token"]["value"]
    assert moved["moved"] in ("within noise", "worse", "better")
    assert pair["setup"]["max_new_tokens"] == BUDGET and pair["setup"]["ignore_eos"] is True
    assert "trl" not in report and "scoring_memory" not in report  # --only ran one part
    printed = capsys.readouterr().out
    assert f"{role} (drafts)" in printed and f"{2 * role} (drafts + challenges)" in printed
    assert "UNEQUAL WORK" not in printed


def test_stopping_early_is_unequal_work(agon_cache, tmp_path, capsys, monkeypatch):
    """With the end of turn left in place, completions stop short of the budget: the bench must say so and fail."""
    monkeypatch.setattr(bench, "_budgeted", lambda sampling: sampling)
    out = tmp_path / "bench.json"
    assert bench.main([*ARGS, "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["equal_work"] is False and report["agon_vs_grpo"]["unequal_work"]
    assert "UNEQUAL WORK: GRPO wrote" in capsys.readouterr().out


def test_unequal_work_names_each_short_step():
    assert bench.unequal_work("TRL", [64, 64], 64) == []
    assert bench.unequal_work("TRL", [64, 50, 64], 64) == ["TRL wrote 50 completion tokens at step 2, expected 64"]


def test_the_engines_part_is_skipped_with_the_reason_where_vllm_is_nowhere_unless_asked_for(tmp_path, monkeypatch):
    from agon.bench.ratios import engines_side_by_side
    from agon.engines import EngineError

    monkeypatch.delenv("AGON_VLLM_PYTHON", raising=False)
    missing = [f"generation.vllm.python={tmp_path / 'none' / 'python'}", "generation.vllm.placement=worker"]
    assert "make vllm-install" in engines_side_by_side(overrides=missing, required=False)["skipped"]
    with pytest.raises(EngineError, match="generation.engine=vllm"):
        engines_side_by_side(overrides=missing, required=True)


def test_length_skew_scores_the_same_rows_both_ways_and_computes_fewer_tokens_by_length(tmp_path, capsys):
    """A small length-skewed batch (2 long rows of 256 tokens among 10): both sides give one gradient, and the
    contiguous side computes the short rows next to a long one at the long row's width."""
    out = tmp_path / "bench.json"
    args = ["--only", "length-skew", "--skew-rounds", "1", "--skew-rows", "10", "--skew-long-rows", "2",
            "--skew-long-tokens", "256", "--out", str(out)]
    assert bench.main(args) == 0
    report = json.loads(out.read_text())
    skew = report["length_skew"]
    assert report["equal_work"] is True and skew["unequal_work"] == []
    assert skew["setup"]["budget"] == 1024 and skew["setup"]["solo"] == 128
    # the long rows alone, first; the eight short rows together
    assert skew["micro_batches"]["by_length"] == [1, 1, 8]
    assert sum(skew["micro_batches"]["contiguous"]) == 10 and len(skew["micro_batches"]["contiguous"]) < 10
    rows_tokens, computed = skew["setup"]["rows_tokens"], skew["computed_tokens"]
    assert rows_tokens < computed["by_length"] < 1.2 * rows_tokens
    assert computed["contiguous"] > 1.5 * computed["by_length"]
    assert skew["grad_max_rel_diff"] < 1e-4
    for side in ("contiguous", "by_length"):
        assert len(skew["seconds"][side]) == 2 and skew["median_s"][side] == skew["seconds"][side][1]
        assert skew["memory"][side]["peak_gib"] > skew["memory"][side]["update_gib"] >= 0
    ratio = skew["ratio_by_length_over_contiguous"]
    assert ratio["seconds"] == skew["median_s"]["by_length"] / skew["median_s"]["contiguous"]
    assert set(ratio) == {"seconds", "peak_memory", "update_memory"}
    assert "gradients agree" in capsys.readouterr().out


def test_latent_vs_visible_reports_ratios_of_seconds_and_peak_memory_on_equal_work(agon_cache, tmp_path, capsys):
    """Both sides write every completion to its budget (twice one role's tokens a step), the latent side's
    challengers read prefixes (the drafters' prompts and reasoning), and the ratios are latent over visible."""
    out = tmp_path / "bench.json"
    args = ["--only", "latent", "--latent-steps", "2", "--latent-span", "trace", *TEST_WORLD,
            f"trainer.prompts_per_step={PROMPTS}", f"trainer.num_generations={GENERATIONS}",
            f"trainer.max_new_tokens={BUDGET}", "--out", str(out)]
    assert bench.main(args) == 0
    report = json.loads(out.read_text())
    latent = report["latent_vs_visible"]
    role = PROMPTS * GENERATIONS * BUDGET
    assert report["equal_work"] is True and latent["unequal_work"] == []
    for side in ("visible", "latent"):
        assert latent[side]["completion_tokens"] == [2 * role, 2 * role]
        assert latent[side]["median_step_s"] == latent[side]["step_s"][1]  # the warm-up step is left out
        assert latent["memory"][side]["peak_gib"] > latent["memory"][side]["steps_gib"] >= 0
    # a trace prefix holds at least the drafter's prompt for every challenge
    assert all(n > PROMPTS * GENERATIONS * 5 for n in latent["latent"]["prefix_tokens"])
    ratio = latent["ratio_latent_over_visible"]
    assert set(ratio) == {"step", "generation", "update", "peak_memory"}
    assert ratio["step"] == latent["latent"]["median_step_s"] / latent["visible"]["median_step_s"]
    assert ratio["peak_memory"] == latent["memory"]["latent"]["peak_gib"] / latent["memory"]["visible"]["peak_gib"]
    assert "latent/vis" in capsys.readouterr().out


def test_a_ratio_beyond_its_noise_is_said_to_have_moved_and_one_within_it_is_not():
    """The comparison itself, on numbers worked out by hand: 10% noise around 1.0, lower is better."""
    baseline = {"agon_over_grpo_step_per_token": {"value": 1.0, "noise": 0.10},
                "trl_over_agon_step": {"value": 2.0, "noise": 0.10}}
    report = {"agon_vs_grpo": {"ratio_agon_over_grpo": {"step_per_token": 1.25}},
              "trl": {"speedup_trl_over_agon": 2.1}, "scoring_peak_ratio_selective_over_full": 0.3}
    rows = bench.against_baseline(report, baseline)
    assert rows["agon_over_grpo_step_per_token"]["moved"] == "worse"  # +25%, and lower is better
    assert rows["trl_over_agon_step"]["moved"] == "within noise"  # +5%
    assert rows["scoring_peak_selective_over_full"]["moved"] == "new"  # no baseline for it
    report["trl"]["speedup_trl_over_agon"] = 1.5  # TRL's step no longer as much slower: agon lost its lead
    assert bench.against_baseline(report, baseline)["trl_over_agon_step"]["moved"] == "worse"
