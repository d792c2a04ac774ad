"""``make bench``'s equal-work accounting: the Agon-vs-GRPO comparison at tiny settings, end to end through the CLI.

The test world answers in fewer than 40 tokens, so a budget of 40 shows whether the end of turn really was
suppressed: without it most completions stop early and the token counts fall short of the budget.

The ``streamed`` part's pieces (the length budgets, the engine that imposes them, the critical path) are checked on a
fake engine; the part itself runs on vLLM at a tiny size (marker ``vllm``: ``make test-vllm``).
"""

from __future__ import annotations

import json

import pytest

from agon.bench import ratios as bench
from agon.engines import Engine, Sampling
from agon.models.tokens import Completion
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


@pytest.mark.parametrize("part", ["engines", "streamed"])
def test_a_vllm_part_is_skipped_with_the_reason_where_vllm_is_nowhere_unless_asked_for(part, tmp_path, monkeypatch):
    from agon.bench.ratios import engines_side_by_side
    from agon.bench.streamed import streamed_vs_two_stage
    from agon.engines import EngineError

    measure = {"engines": engines_side_by_side, "streamed": streamed_vs_two_stage}[part]
    monkeypatch.delenv("AGON_VLLM_PYTHON", raising=False)
    missing = [f"generation.vllm.python={tmp_path / 'none' / 'python'}", "generation.vllm.placement=worker"]
    assert "make vllm-install" in measure(overrides=missing, required=False)["skipped"]
    with pytest.raises(EngineError, match="generation.engine=vllm"):
        measure(overrides=missing, required=True)


@pytest.mark.long
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


@pytest.mark.long
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


# -- streamed: streamed rounds against two-stage rounds on vLLM ------------------------------------------------------


def test_length_budgets_put_a_tenth_at_the_cap_fall_off_geometrically_below_it_and_follow_the_seed():
    from agon.bench.streamed import length_budget

    cap, n = 128, 20_000
    budgets = [length_budget(seed, cap) for seed in range(n)]
    assert all(1 <= b <= cap for b in budgets)
    assert 0.09 < budgets.count(cap) / n < 0.11
    # P(budget >= x) = 0.1^(x / cap): half the cap or more for sqrt(0.1) of the rows
    assert 0.30 < sum(b >= cap // 2 for b in budgets) / n < 0.34
    assert 0.36 * cap < sum(budgets) / n < 0.42 * cap
    assert budgets == [length_budget(seed, cap) for seed in range(n)]  # the seed alone decides
    assert len(set(budgets[:100])) > 30
    assert {length_budget(seed, 1) for seed in range(100)} == {1}


class _Immediate(Engine):
    """A fake engine: each request finishes the moment it starts, at its budget. ``streams``: one at a time, ``then``
    told of each as it finishes (as a continuously batching engine would); else the base class's waves."""

    def __init__(self, streams: bool):
        super().__init__(None)  # type: ignore[arg-type]
        self.streams_now = streams
        self.calls: list[tuple[str, list, Sampling]] = []

    def generate(self, requests, sampling, on_sampled=None):
        self.calls.append(("generate", list(requests), sampling))
        return [Completion("", tuple(range(min(r.max_new_tokens, sampling.max_new_tokens))), True) for r in requests]

    def stream(self, requests, sampling, then=None, on_sampled=None):
        if not self.streams_now:
            return super().stream(requests, sampling, then, on_sampled)
        self.calls.append(("stream", list(requests), sampling))
        queue, done = list(requests), []
        while len(done) < len(queue):
            done.append(Completion("", tuple(range(queue[len(done)].max_new_tokens)), True))
            queue += then([(len(done) - 1, done[-1])]) if then else []
        return done


def _answer_each_draft(requests):
    """A ``then`` that answers every finished draft (adapter A) with a challenge of B seeded as the game seeds it."""
    from agon.engines import Request
    from agon.game.rollout import derive_seed

    def then(finished):
        return [Request("c", "B", derive_seed(requests[k].seed, "challenge")) for k, _ in finished
                if k < len(requests)]

    return then


@pytest.mark.parametrize("streaming", [True, False])
def test_the_budgeted_engine_gives_every_request_its_seeds_budget_and_no_stop_at_the_end_of_turn(streaming):
    from agon.bench.streamed import BudgetedEngine, critical_path, length_budget, rounds
    from agon.engines import Request, Sampling
    from agon.game.rollout import derive_seed

    inner = _Immediate(streams=streaming)
    engine = BudgetedEngine(inner)
    engine.streaming = streaming
    cap = 64
    drafts = [Request("d", "A", seed) for seed in range(40)]
    out = engine.stream(drafts, Sampling(max_new_tokens=cap, temperature=1.0), _answer_each_draft(drafts))
    challenges = [derive_seed(seed, "challenge") for seed in range(40)]
    assert [c.n_tokens for c in out] == [length_budget(s, cap) for s in [*range(40), *challenges]]
    assert all(sampling.ignore_eos and sampling.max_new_tokens == cap for _, _, sampling in inner.calls)
    assert all(r.max_new_tokens == length_budget(r.seed, cap) for _, requests, _ in inner.calls for r in requests)
    longest = max(length_budget(s, cap) for s in range(40))
    if streaming:  # one call, each challenge starting where its own draft ended
        assert [kind for kind, _, _ in inner.calls] == ["stream"] and len(engine.calls) == 1
        assert critical_path(engine.calls) == max(length_budget(s, cap) + length_budget(c, cap)
                                                  for s, c in zip(range(40), challenges))
    else:  # two waves, each a call of its own
        assert [kind for kind, _, _ in inner.calls] == ["generate", "generate"] and len(engine.calls) == 2
        assert critical_path(engine.calls) == longest + max(length_budget(c, cap) for c in challenges)
    draft_tokens, pairs = rounds([r for call in engine.calls for r in call])
    assert sorted(draft_tokens) == sorted(length_budget(s, cap) for s in range(40)) and len(pairs) == 40
    with pytest.raises(ValueError, match="seed"):
        engine.generate([Request("d", "A")], Sampling(max_new_tokens=cap, temperature=1.0))


def test_two_stages_play_a_wave_of_both_adapters_one_adapter_at_a_time():
    """Hidden exchange puts drafts and challenges in one wave; two stages play it as the two calls it was."""
    from agon.bench.streamed import BudgetedEngine
    from agon.engines import Request, Sampling

    inner = _Immediate(streams=True)
    engine = BudgetedEngine(inner)
    engine.streaming = False
    wave = [Request("d", "A", 1), Request("c", "B", 2), Request("d", "A", 3), Request("c", "B", 4)]
    out = engine.stream(wave, Sampling(max_new_tokens=32, temperature=1.0))
    assert [[r.seed for r in requests] for _, requests, _ in inner.calls] == [[1, 3], [2, 4]]
    assert [[r.seed for r in call] for call in engine.calls] == [[1, 3], [2, 4]]
    assert [c.n_tokens for c in out] == [call_row.budget for call_row in sorted(
        (r for call in engine.calls for r in call), key=lambda r: r.seed)]
    engine.streaming = True
    engine.stream(wave, Sampling(max_new_tokens=32, temperature=1.0))
    assert [r.seed for r in inner.calls[-1][1]] == [1, 2, 3, 4]  # streamed: one call of both


@pytest.mark.vllm(seconds=420)
def test_the_streamed_part_times_six_sides_and_an_evaluation_on_the_same_rows(agon_cache, tmp_path, capsys, bounded):
    """At a tiny size: every ratio and critical path reported, each side's tokens its budgets, streamed and two-stage
    writing the same tokens (and rows) at every step and evaluation, an Agon step's drafts the GRPO step's budgets."""
    out = tmp_path / "bench.json"
    args = ["--only", "streamed", "--streamed-steps", "2", "--streamed-eval-rounds", "1", "trainer.prompts_per_step=2",
            "trainer.num_generations=2", "trainer.max_new_tokens=32", "eval.n_problems=2", "eval.samples=2",
            "--out", str(out)]
    assert bench.main(args) == 0
    report = json.loads(out.read_text())
    r = report["streamed"]
    assert report["equal_work"] is True and r["unequal_work"] == []
    methods, modes = ("grpo", "visible", "hidden"), ("streamed", "two_stage")
    assert set(r["sides"]) == {f"{method}_{mode}" for method in methods for mode in modes}
    for side in r["sides"].values():
        assert side["rows_tokens"] == side["budget_tokens"] == side["completion_tokens"] and len(side["step_s"]) == 2
        assert side["median_step_s"] == side["step_s"][1]  # the warm-up step is left out
    for method in methods:
        streamed, two_stage = (r["sides"][f"{method}_{mode}"] for mode in modes)
        assert streamed["completion_tokens"] == two_stage["completion_tokens"]
    assert set(r["ratios"]) == {"visible_over_grpo", "hidden_over_grpo", "parts", "grpo_streamed_over_two_stage",
                                "eval_two_stage_over_streamed"}
    assert r["ratios"]["visible_over_grpo"]["streamed"] == (r["sides"]["visible_streamed"]["median_step_s"]
                                                            / r["sides"]["grpo_streamed"]["median_step_s"])
    paths = r["critical_path"]
    for name in r["sides"]:
        assert paths["steps"][name]["median_played"] >= paths["steps"][name]["median_longest_draft"] > 0
    # two stages: every draft, then every challenge; streamed: one call, each challenge where its draft ended
    assert paths["steps"]["visible_two_stage"]["median_played"] >= paths["steps"]["visible_streamed"]["median_played"]
    assert paths["evaluation"]["streamed"]["calls"] == 1 and paths["evaluation"]["two_stage"]["calls"] == 4
    assert r["evaluation"]["tokens"]["streamed"] == r["evaluation"]["tokens"]["two_stage"]
    assert all(all(same) for same in r["same_rows"].values())
    assert set(report["against_baseline"]) >= {"streamed_visible_over_grpo_step", "streamed_eval_speedup"}
    printed = capsys.readouterr().out
    assert "Agon visible / GRPO" in printed and "Agon hidden / GRPO" in printed and "UNEQUAL WORK" not in printed
