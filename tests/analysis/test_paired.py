"""analysis.paired: the within-run outcomes of a cascade (cascade minus solo, conversion by the recap's kind) with
intervals clustered by problem, the arm's interval over seeds and its floors, the arms at equal steps and generated
tokens, the within-run claims of claims.yaml, and the target-sum pilot's packed run read through them."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from agon.tasks.target_sum import parse
from analysis import load_runs
from analysis.claims import CLAIMS, Claim, claims_markdown, claims_table, parse_claims
from analysis.paired import (
    arm_interval,
    arm_outcomes,
    budget_table,
    cascade_minus_solo,
    cascade_pairs,
    common_reach,
    conversion_by_kind,
    eval_curve,
    final_evaluation,
    on_smallest_design,
    paired_change,
    paired_markdown,
    read_curve,
    recap_kind,
    run_outcomes,
    runs_with_outcomes,
    start_evaluation,
)

REPO = Path(__file__).resolve().parents[2]
PILOT = REPO / "results" / "target_sum_pilot"
STUDY = {"a": "Agon's cascade beats its own drafts (target sum, after training)",
         "b": "Agon's cascade gains more over its drafts than the cooperative one's",
         "c": "After a dead-end recap Agon's challenger converts less often than after an extendable one",
         # the same two on what training adds: the untrained base's cascade already beats its drafts
         "a_change": "Agon's training widens its cascade's lead over its own drafts (change since the start)",
         "b_change": "Agon's cascade lead grows more than the cooperative one's (change since the start)"}


def cascade_rows(rounds: list[tuple[str, str, int, bool, bool, str | None]], phase: str = "final",
                 step: int = 800) -> pd.DataFrame:
    """Eval rows of one run's evaluation (``phase`` at ``step``; the final one by default) as agon.game.cascade writes
    them: per (order, problem, sample, draft correct, final correct, the draft's boxed answer) a draft row, a final
    row and the drafter's solo row."""
    rows = []
    for order, problem, sample, draft, final, answer in rounds:
        base = {"step": step, "phase": phase, "problem_id": problem, "sample": sample}
        rows += [{**base, "order": order, "stage": "draft", "correct": draft, "answer": answer},
                 {**base, "order": order, "stage": "final", "correct": final, "answer": None},
                 {**base, "order": order[0], "stage": "final", "correct": draft, "answer": answer}]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------------
# one run


def test_the_paired_interval_is_clustered_by_problem():
    """8 samples of 2 problems: on p the cascade turns all 4 wrong drafts right (+1 each), on q it changes nothing
    (0). Per problem the mean differences are 1 and 0: SE = SD(1, 0) / sqrt(2) = 0.5 with 1 df, not the per-sample
    SD(1,1,1,1,0,0,0,0) / sqrt(8) = 0.189 (which would treat a problem's samples as independent)."""
    rounds = [("A>B", "p", i, False, True, None) for i in range(4)]
    rounds += [("A>B", "q", i, True, True, None) for i in range(4)]
    out = cascade_minus_solo(cascade_pairs(cascade_rows(rounds)))
    per_sample = np.std([1] * 4 + [0] * 4, ddof=1) / math.sqrt(8)
    assert out["paired/A>B/cascade"] == 1.0 and out["paired/A>B/solo"] == 0.5
    assert out["paired/A>B/cascade_minus_solo"] == pytest.approx(0.5)
    assert out["paired/A>B/cascade_minus_solo_se"] == pytest.approx(0.5)
    assert out["paired/A>B/cascade_minus_solo_se"] != pytest.approx(per_sample)
    half = stats.t.ppf(0.975, 1) * 0.5
    assert out["paired/A>B/cascade_minus_solo_df"] == 1
    assert (out["paired/A>B/cascade_minus_solo_low"], out["paired/A>B/cascade_minus_solo_high"]) == (
        pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    # pooled over the orders: B>A on p changes nothing either; per problem (4 x 1 + 4 x 0) / 8 and 0
    both = cascade_minus_solo(cascade_pairs(cascade_rows(
        rounds + [("B>A", "p", i, True, True, None) for i in range(4)])))
    assert both["paired/cascade_minus_solo"] == pytest.approx(4 / 12)
    assert both["paired/both/problems"] == 2 and both["paired/A>B/problems"] == 2


def test_a_run_without_a_cascade_has_no_within_run_outcome():
    grpo = pd.DataFrame({"step": 800, "phase": "final", "order": "A", "stage": "final", "problem_id": "7?3?5?2=7",
                         "sample": [0, 1], "correct": [True, False], "answer": ["7+3-5+2", "7+3+5+2"]})
    assert cascade_pairs(grpo).empty and run_outcomes(grpo, target_sum=True) == {}


def test_the_recap_kind_of_hand_checked_drafts():
    """7?3?5?2=7. Prefix ++: 7+3+5 = 15, then 15+2 = 17 or 15-2 = 13, neither 7: a dead end. Prefix +-: 7+3-5 = 5,
    5+2 = 7: live (the right chain's, extendable after a wrong last sign). Prefix -+: 7-3+5 = 9, 9-2 = 7: live.
    Prefix --: 7-3-5 = -1, then 1 or -3: a dead end."""
    q = "7?3?5?2=7"
    assert recap_kind(q, "7+3+5+2") == recap_kind(q, "7+3+5-2") == "dead_end"
    assert recap_kind(q, "7+3-5-2") == "extendable"  # wrong in its last sign only
    assert recap_kind(q, "7+3-5+2") == "extendable"  # the right chain: its prefix is live too
    assert recap_kind(q, "7-3+5+2") == "extendable" and recap_kind(q, "7-3-5+2") == "dead_end"
    assert recap_kind(q, "7+3+5") == recap_kind(q, "7+3+5+2+1") == recap_kind(q, "7+4+5+2") == "wrong_numbers"
    assert recap_kind(q, None) == recap_kind(q, math.nan) == recap_kind(q, "7+3-5+2=7") == "no_answer"
    # 2?1?2?1=4 (a pilot problem): 2+1+2 = 5, 5-1 = 4: live; 2+1-2 = 1, 1+-1 = 2 or 0: a dead end
    assert recap_kind("2?1?2?1=4", "2+1+2+1") == "extendable" and recap_kind("2?1?2?1=4", "2+1-2-1") == "dead_end"


def test_the_recap_kind_agrees_with_the_tasks_own_kinds():
    """Every chain of a few 4-operand problems: a prefix the task calls right or extendable reads extendable, one it
    calls a dead end reads dead_end."""
    from agon.training.checks import compose_config
    from agon.tasks import Problem, build_task

    task = build_task(compose_config(["task=target_sum", "task.train_size=10"]).task)
    for q in ("7?3?5?2=7", "2?1?2?1=4", "9?1?1?4=3", "5?5?5?5=0"):
        kinds = task.recap_kinds(Problem(q, q, None))
        operands = parse(q)[0]
        for signs in itertools.product("+-", repeat=3):
            chain = str(operands[0]) + "".join(s + str(x) for s, x in zip(signs, operands[1:]))
            want = "dead_end" if tuple(signs[:-1]) in kinds["dead_end"] else "extendable"
            assert recap_kind(q, chain) == want, (q, chain)


def test_conversion_by_kind_by_hand():
    """Two problems, both orders. 7?3?5?2=7: wrong dead-end drafts 3 (1 converted), wrong extendable drafts 2 (2
    converted), a right draft answered wrong. 2?1?2?1=4: a dead end (not converted), an extendable draft
    (converted), a draft with no answer (converted), a right draft kept. Paired by problem: (2/2 - 1/3) and
    (1/1 - 0/1), mean 5/6 over 2 problems; over all rows 3/3 - 1/4 = .75."""
    q, r = "7?3?5?2=7", "2?1?2?1=4"
    rounds = [("A>B", q, 0, False, True, "7+3+5+2"), ("A>B", q, 1, False, False, "7+3+5-2"),
              ("B>A", q, 0, False, False, "7-3-5+2"), ("A>B", q, 2, False, True, "7+3-5-2"),
              ("B>A", q, 1, False, True, "7-3+5+2"), ("B>A", q, 2, True, False, "7+3-5+2"),
              ("A>B", r, 0, False, False, "2+1-2-1"), ("A>B", r, 1, False, True, "2+1+2+1"),
              ("B>A", r, 0, False, True, None), ("B>A", r, 1, True, True, "2+1+2-1")]
    out = conversion_by_kind(cascade_pairs(cascade_rows(rounds)))
    assert (out["paired/wrong_drafts/dead_end"], out["paired/conversion/dead_end"]) == (4, 0.25)
    assert (out["paired/wrong_drafts/extendable"], out["paired/conversion/extendable"]) == (3, 1.0)
    assert (out["paired/wrong_drafts/no_answer"], out["paired/conversion/no_answer"]) == (1, 1.0)
    assert out["paired/wrong_drafts/wrong_numbers"] == 0 and math.isnan(out["paired/conversion/wrong_numbers"])
    assert (out["paired/right_drafts"], out["paired/regression"]) == (2, 0.5)
    gaps = [1 - 1 / 3, 1 - 0]
    assert out["paired/conversion_gap"] == pytest.approx(5 / 6) and out["paired/conversion_gap_problems"] == 2
    assert out["paired/conversion_gap_se"] == pytest.approx(np.std(gaps, ddof=1) / math.sqrt(2))
    assert out["paired/conversion_gap_all"] == pytest.approx(0.75)
    # the same drafts at the start, three finals wrong there: q's dead ends 0/3 and extendables 1/2 (gap .5), r's
    # 0/1 and 0/1 (gap 0). The gap's change per problem: 2/3 - 1/2 and 1 - 0
    flipped = {("A>B", q, 0), ("B>A", q, 1), ("A>B", r, 1)}
    start = cascade_rows([(o, p, i, d, f and (o, p, i) not in flipped, a) for o, p, i, d, f, a in rounds],
                         "start", 0)
    changed = run_outcomes(cascade_rows(rounds), target_sum=True, start=start)
    assert changed["paired/conversion_gap_at_start"] == pytest.approx(0.25)
    changes = [2 / 3 - 1 / 2, 1.0]
    assert changed["paired/conversion_gap_change"] == pytest.approx(np.mean(changes))
    assert changed["paired/conversion_gap_change_se"] == pytest.approx(np.std(changes, ddof=1) / math.sqrt(2))
    assert changed["paired/conversion_gap_change_problems"] == 2 and changed["paired/conversion_gap_change_df"] == 1


def test_the_change_since_the_start_by_hand():
    """Start (step 0) and final (step 800) of one run, one order, 2 samples a problem. p: drafts wrong, wrong;
    cascade right, wrong at the start (+.5), right, right at the final (+1): change +.5. q: +0 at the start, +.5 at
    the final: +.5. r: +.5 at the start, 0 at the final: -.5. s: at the final only (+1), left out of the change.
    The final: (1 + .5 + 0 + 1) / 4; the start: +1/3 over p, q, r; the change: mean (.5, .5, -.5) = 1/6, SE
    SD(.5, .5, -.5) / sqrt 3, 2 df."""
    start = cascade_rows([("A>B", "p", 0, False, True, None), ("A>B", "p", 1, False, False, None),
                          ("A>B", "q", 0, True, True, None), ("A>B", "q", 1, False, False, None),
                          ("A>B", "r", 0, False, True, None), ("A>B", "r", 1, True, True, None)], "start", 0)
    final = cascade_rows([("A>B", "p", 0, False, True, None), ("A>B", "p", 1, False, True, None),
                          ("A>B", "q", 0, False, True, None), ("A>B", "q", 1, True, True, None),
                          ("A>B", "r", 0, True, True, None), ("A>B", "r", 1, False, False, None),
                          ("A>B", "s", 0, False, True, None), ("A>B", "s", 1, False, True, None)])
    evals = pd.concat([start, final], ignore_index=True)
    assert len(start_evaluation(evals)) == len(start) and len(final_evaluation(evals)) == len(final)
    out = run_outcomes(final_evaluation(evals), target_sum=False, start=start_evaluation(evals))
    assert out["paired/cascade_minus_solo"] == pytest.approx(2.5 / 4)  # the final's, over p, q, r and s
    assert out["paired/cascade_minus_solo_at_start"] == pytest.approx(1 / 3)
    changes = [0.5, 0.5, -0.5]
    se = np.std(changes, ddof=1) / math.sqrt(3)
    assert out["paired/cascade_minus_solo_change"] == pytest.approx(1 / 6)
    assert out["paired/cascade_minus_solo_change_se"] == pytest.approx(se)
    assert out["paired/cascade_minus_solo_change_df"] == 2 and out["paired/cascade_minus_solo_change_problems"] == 3
    assert out["paired/cascade_minus_solo_change_high"] == pytest.approx(1 / 6 + stats.t.ppf(0.975, 2) * se)
    # the two evaluations' samples are independent: the per-problem change carries both evaluations' noise
    assert paired_change(pd.Series({"p": 0.5, "q": 0.5}), pd.Series({"p": 0.0, "q": 0.5, "x": 1.0}))[""] == 0.25
    # without start rows: no change, and nan in a runs frame beside a run that has one
    assert not any(k.endswith(("_at_start", "_change")) for k in run_outcomes(final, target_sum=False))
    runs = pd.DataFrame({"run_id": ["with", "without"], "task": "arithmetic"})
    frame = runs_with_outcomes(runs, pd.concat([evals.assign(run_id="with"), final.assign(run_id="without")]))
    assert frame.loc[0, "paired/cascade_minus_solo_change"] == pytest.approx(1 / 6)
    assert math.isnan(frame.loc[1, "paired/cascade_minus_solo_change"])
    assert frame.loc[1, "paired/cascade_minus_solo"] == pytest.approx(2.5 / 4)


def test_the_start_evaluation_is_never_read_as_the_final_one():
    """A run's rows: two start evaluations (the earliest is the run's), an interim one and a final one. The final is
    the final's rows alone; without a final, the interim's; with the start's alone, none."""
    rounds = [("A>B", "p", 0, False, True, None)]
    first, again = cascade_rows(rounds, "start", 0), cascade_rows(rounds, "start", 0).assign(correct=True)
    interim, final = cascade_rows(rounds, "train", 400), cascade_rows(rounds, "final", 800)
    evals = pd.concat([first, again, interim, final], ignore_index=True)
    assert set(final_evaluation(evals)["phase"]) == {"final"}
    start = start_evaluation(evals)
    assert len(start) == 3 and not start["correct"].iloc[0] and set(start["phase"]) == {"start"}
    assert set(final_evaluation(pd.concat([first, interim]))["phase"]) == {"train"}
    assert final_evaluation(first).empty and start_evaluation(final).empty
    from analysis.tables import final_rows

    run = {"run_id": "r", "headline_orders": ["A>B"]}
    assert set(final_rows(evals.assign(run_id="r"), run)["phase"]) == {"final"}
    assert final_rows(first.assign(run_id="r"), run).empty


# ---------------------------------------------------------------------------------------------------------------
# the target-sum pilot's packed runs


def test_the_pilot_reproduces_its_summary():
    """results/target_sum_pilot/agon: the module's cascade and solo accuracies are the run's own summary numbers
    (eval/cascade_acc_AB .2842 is B's answers after A's recaps; eval/solo_acc_A .3683 is A's drafts of the same
    rounds, which agon.game.cascade also writes as order A), and so are the regression and the conversion pooled over the
    kinds; the interval is the per-problem SD of the paired differences over sqrt(300)."""
    data = load_runs(PILOT)
    agon = data.runs[data.runs["method"] == "agon"].iloc[0]
    rows = final_evaluation(data.evals, agon["run_id"])
    out = run_outcomes(rows, target_sum=True)
    assert agon["eval/cascade_acc_AB"] == pytest.approx(0.2842, abs=1e-4)
    assert agon["eval/solo_acc_A"] == pytest.approx(0.3683, abs=1e-4)
    assert out["paired/A>B/cascade"] == pytest.approx(agon["eval/cascade_acc_AB"])
    assert out["paired/A>B/solo"] == pytest.approx(agon["eval/solo_acc_A"])
    assert out["paired/B>A/cascade"] == pytest.approx(agon["eval/cascade_acc_BA"])
    assert out["paired/B>A/solo"] == pytest.approx(agon["eval/solo_acc_B"])
    assert out["paired/both/cascade"] == pytest.approx(agon["eval/accuracy"])
    assert out["paired/regression"] == pytest.approx(agon["eval/regression_rate"])
    wrong = sum(out[f"paired/wrong_drafts/{k}"] for k in ("dead_end", "extendable", "wrong_numbers", "no_answer"))
    converted = sum(out[f"paired/wrong_drafts/{k}"] * out[f"paired/conversion/{k}"]
                    for k in ("dead_end", "extendable", "wrong_numbers", "no_answer"))
    assert converted / wrong == pytest.approx(agon["eval/conversion_rate"])
    # the cascade answers worse than A drafted: -8.4 points [-12.1, -4.8] over 300 problems
    pairs = cascade_pairs(rows)
    ab = pairs[pairs["order"] == "A>B"]
    per_problem = (ab["final"].astype(float) - ab["draft"].astype(float)).groupby(ab["problem_id"]).mean()
    assert out["paired/A>B/cascade_minus_solo"] == pytest.approx(0.2842 - 0.3683, abs=1e-4)
    assert out["paired/A>B/cascade_minus_solo_se"] == pytest.approx(per_problem.std(ddof=1) / math.sqrt(300))
    assert out["paired/A>B/cascade_minus_solo_high"] < 0
    # GRPO's run has no cascade: its within-run columns are empty, not an error
    with_outcomes = runs_with_outcomes(data.runs, data.evals).set_index("method")
    assert math.isnan(with_outcomes.loc["grpo", "paired/cascade_minus_solo"])
    assert with_outcomes.loc["agon", "paired/cascade_minus_solo"] == pytest.approx(out["paired/cascade_minus_solo"])


def test_make_figures_writes_the_pilots_paired_table(tmp_path):
    from analysis.paired import write_paired

    data = load_runs(PILOT)
    paths = write_paired(data, tmp_path)
    assert [p.name for p in paths] == ["paired.md", "paired.csv", "budget.csv"]
    md = (tmp_path / "paired.md").read_text()
    assert "| competitive · visible | 0 | 28.4 | 36.8 | -8.4 [-12.1, -4.8] |" in md
    assert "| GRPO | 0 | - | - | - | - | - | - | - | - | - | - | - | - | - | - |" in md
    budget = pd.read_csv(tmp_path / "budget.csv")
    # equal steps: the last step both reach (Agon ran 400, GRPO 800); equal tokens: Agon's 400 steps generated
    # 6,923,228 tokens, which GRPO reached between its steps 750 and 800
    steps = budget[(budget["x"] == "train/step") & (budget["kind"] == "arm")].set_index("left")["value"]
    assert budget.loc[budget["x"] == "train/step", "at"].iloc[0] == 400
    assert steps["GRPO"] == pytest.approx(0.413333, abs=1e-6) and steps["competitive · visible"] == pytest.approx(
        0.299583, abs=1e-6)
    assert budget.loc[budget["x"] == "train/generated_tokens", "at"].iloc[0] == 6_923_228


# ---------------------------------------------------------------------------------------------------------------
# the runs of an arm


def test_an_arms_interval_is_never_below_one_runs_evaluation():
    """Three seeds that agree to 0.01 point, each run's SE 1.2 points at most: the SD is raised to 1.2 points
    (t_2 x .012 / sqrt 3 = 2.98 points, wider than one run's 1.97 x 1.2 = 2.36). With eight seeds that agree
    exactly, t_7 x .01 / sqrt 8 = 0.84 points would be narrower than one run's interval: the run's 1.97 points
    stand."""
    out = arm_interval([0.050, 0.0501, 0.0502], [0.010, 0.012, 0.011], [299] * 3)
    assert out["floor"] == 0.012 and out["seed_sd"] == pytest.approx(0.0001)
    half = stats.t.ppf(0.975, 2) * 0.012 / math.sqrt(3)
    assert (out["low"], out["high"]) == (pytest.approx(0.0501 - half), pytest.approx(0.0501 + half))
    many = arm_interval([0.05] * 8, [0.01] * 8, [299] * 8)
    run_half = stats.t.ppf(0.975, 299) * 0.01
    assert stats.t.ppf(0.975, 7) * 0.01 / math.sqrt(8) < run_half
    assert (many["low"], many["high"]) == (pytest.approx(0.05 - run_half), pytest.approx(0.05 + run_half))
    # seeds that spread more than the floor keep their own SD
    wide = arm_interval([0.0, 0.05, 0.10], [0.01] * 3, [299] * 3)
    assert wide["high"] - 0.05 == pytest.approx(stats.t.ppf(0.975, 2) * 0.05 / math.sqrt(3))
    # one seed: its own interval
    one = arm_interval([0.05], [0.01], [299])
    assert one["high"] - 0.05 == pytest.approx(run_half) and math.isnan(one["seed_sd"])


def test_arm_outcomes_pools_the_seeds_of_each_arm():
    runs = pd.DataFrame({"cell_key": ["agon"] * 3 + ["grpo"] * 3,
                         "paired/cascade_minus_solo": [0.05, 0.0501, 0.0502, math.nan, math.nan, math.nan],
                         "paired/cascade_minus_solo_se": [0.010, 0.012, 0.011, math.nan, math.nan, math.nan],
                         "paired/cascade_minus_solo_df": [299.0] * 3 + [math.nan] * 3,
                         "paired/conversion/dead_end": [0.1, 0.2, 0.3, math.nan, math.nan, math.nan]})
    arms = arm_outcomes(runs).set_index(["cell_key", "metric"])
    row = arms.loc[("agon", "paired/cascade_minus_solo")]
    assert row["seeds"] == 3 and row["floor"] == 0.012 and row["mean"] == pytest.approx(0.0501)
    assert arms.loc[("agon", "paired/conversion/dead_end"), "mean"] == pytest.approx(0.2)
    assert "grpo" not in arms.index.get_level_values(0)  # no cascade: no row, and no error


# ---------------------------------------------------------------------------------------------------------------
# equal steps and equal generated tokens


def curve_steps() -> pd.DataFrame:
    """Two runs' steps frames: r1 evaluates at steps 0, 50, 100 (tokens -, 1000, 2000; accuracy .1, .3, .5 on
    100 x 4), r2 at 0, 50, 100, 150 (tokens -, 3000, 6000, 9000; .2, .4, .6, .7)."""
    rows = [("r1", 0, math.nan, 0.1), ("r1", 50, 1000, 0.3), ("r1", 100, 2000, 0.5),
            ("r2", 0, math.nan, 0.2), ("r2", 50, 3000, 0.4), ("r2", 100, 6000, 0.6), ("r2", 150, 9000, 0.7)]
    return pd.DataFrame([{"run_id": r, "train/step": s, "train/generated_tokens": t, "eval/accuracy": a,
                          "eval/n_problems": 100, "eval/samples": 4} for r, s, t, a in rows])


def test_curves_are_read_at_equal_tokens_by_linear_interpolation():
    steps = curve_steps()
    curves = {r: eval_curve(g, "train/generated_tokens") for r, g in steps.groupby("run_id")}
    assert list(curves["r1"]["train/generated_tokens"]) == [0, 1000, 2000]  # none generated before training
    assert common_reach(curves.values(), "train/generated_tokens") == 2000
    value, sd = read_curve(curves["r2"], "train/generated_tokens", 2000)
    # between (0, .2) and (3000, .4): .2 + .2 x 2000 / 3000; the binomial SD the larger of the two points'
    assert value == pytest.approx(0.2 + 0.2 * 2 / 3)
    assert sd == pytest.approx(math.sqrt(0.4 * 0.6 / 400))
    assert read_curve(curves["r2"], "train/generated_tokens", 3000)[0] == pytest.approx(0.4)
    assert math.isnan(read_curve(curves["r1"], "train/generated_tokens", 2500)[0])  # past its last evaluation
    runs = pd.DataFrame({"run_id": ["r1", "r2"], "cell_key": ["agon", "grpo"], "status": "complete"})
    table = budget_table(steps, runs)
    tokens = table[(table["x"] == "train/generated_tokens") & (table["kind"] == "arm")].set_index("left")
    assert tokens.loc["agon", "value"] == pytest.approx(0.5) and tokens.loc["grpo", "value"] == pytest.approx(
        0.2 + 0.2 * 2 / 3)
    on_steps = table[(table["x"] == "train/step") & (table["kind"] == "difference")].iloc[0]
    assert on_steps["at"] == 100 and on_steps["value"] == pytest.approx(0.5 - 0.6)
    assert math.isnan(on_steps["low"])  # one seed an arm: no seeds' SD to pool


def test_the_equal_budget_interval_pools_the_seeds_and_keeps_the_binomial_floor():
    """Two arms of two seeds, read at step 100: agon .5, .5 and grpo .6, .62; the seeds pool to SD .01 (sums of
    squares 0 + .0002 over df 2), under the largest binomial SD of the evaluations read (agon's sqrt(.5 x .5 / 400)
    = .025), which the interval uses."""
    steps = curve_steps()
    more = steps.assign(run_id=steps["run_id"] + "b")
    more.loc[(more["run_id"] == "r2b") & (more["train/step"] == 100), "eval/accuracy"] = 0.62
    runs = pd.DataFrame({"run_id": ["r1", "r1b", "r2", "r2b"], "cell_key": ["agon", "agon", "grpo", "grpo"]})
    table = budget_table(pd.concat([steps, more]), runs)
    row = table[(table["x"] == "train/step") & (table["kind"] == "difference")].iloc[0]
    floor = math.sqrt(0.5 * 0.5 / 400)
    assert row["floor"] == pytest.approx(floor) and row["pooled_sd"] == pytest.approx(floor)
    half = stats.t.ppf(0.975, 2) * floor * math.sqrt(1 / 2 + 1 / 2)
    assert (row["value"], row["high"] - row["value"]) == (pytest.approx(-0.11), pytest.approx(half))


def test_arms_read_between_designs_are_compared_on_the_smallest_one():
    """Agon's curve reaches GRPO's last token count at an interim evaluation (2 problems x 1 sample), GRPO's at its
    final one (3 x 2), whose first 2 problems' sample 0 are all right but whose 6 rows are half right: at equal
    tokens GRPO reads 1.0, on Agon's design, not the logged 0.5 of other problems; at equal steps both are read at
    their final evaluations, of one size, as logged. Without the rows the point stays as logged, and is counted."""
    def run(run_id: str, tokens: list[float], accuracy: list[float]) -> list[dict]:
        sizes = [(3, 2), (2, 1), (3, 2)]
        return [{"run_id": run_id, "train/step": s, "train/generated_tokens": t, "eval/accuracy": a,
                 "eval/n_problems": p, "eval/samples": k}
                for s, t, a, (p, k) in zip([0, 50, 100], tokens, accuracy, sizes)]
    steps = pd.DataFrame(run("agon", [math.nan, 2000, 4000], [0.5, 0.6, 0.7])
                         + run("grpo", [math.nan, 1000, 2000], [0.5, 0.5, 0.5]))
    runs = pd.DataFrame({"run_id": ["agon", "grpo"], "cell_key": ["agon", "grpo"], "status": "complete"})
    final = pd.DataFrame({"run_id": "grpo", "step": 100, "phase": "final", "order": "A", "stage": "final",
                          "problem_id": ["p1", "p1", "p2", "p2", "p3", "p3"], "sample": [0, 1] * 3,
                          "correct": [1, 0, 1, 0, 0, 0]})
    assert final["correct"].mean() == 1 / 3 and final[final["sample"] == 0]["correct"].iloc[:2].mean() == 1.0
    table = budget_table(steps, runs, evals=final).set_index(["x", "kind", "left"]).sort_index()
    tokens = table.xs(("train/generated_tokens", "arm"))
    assert tokens.loc["grpo", "value"] == 1.0 and tokens.loc["agon", "value"] == pytest.approx(0.6)
    assert tokens.loc["grpo", "floor"] == pytest.approx(math.sqrt(0.6 * 0.4 / 2))  # the 2 x 1 design's SD
    assert tokens.loc["grpo", "mixed"] == 0
    on_steps = table.xs(("train/step", "arm"))
    assert on_steps.loc["grpo", "value"] == 0.5 and on_steps.loc["agon", "value"] == 0.7  # both final: as logged
    # a point recomputed on the smallest design carries that design: its n, problems and samples
    curve = on_smallest_design(eval_curve(steps[steps["run_id"] == "grpo"], "train/step"), final, runs.iloc[1])
    assert curve.set_index("step").loc[100, ["value", "n", "problems", "samples"]].tolist() == [1.0, 2, 2, 1]
    bare = budget_table(steps, runs).set_index(["x", "kind", "left"]).sort_index()
    assert bare.loc[("train/generated_tokens", "arm", "grpo"), "value"] == 0.5
    assert bare.loc[("train/generated_tokens", "arm", "grpo"), "mixed"] == 1  # grpo's final, read at 2000


# ---------------------------------------------------------------------------------------------------------------
# within-run claims


def study_runs(agon: list[float], cooperative: list[float], se: float = 0.005, gap: float = 0.2,
               task: str = "target_sum") -> pd.DataFrame:
    """A runs frame of the target-sum study by hand: agon, cooperative, grpo, one run per value, with each run's
    within-run cascade-minus-solo (its SE ``se``, 299 df) and conversion gap (``gap``, SE .02, 150 df)."""
    rows = []
    for experiment, method, values in (("agon", "agon", agon), ("cooperative", "agon", cooperative),
                                       ("grpo", "grpo", [math.nan] * 3)):
        for seed, value in enumerate(values):
            cascade = not math.isnan(value)
            rows.append({"experiment": experiment, "method": method, "seed": seed, "status": "complete",
                         "task": task, "model": "tiny (offline)", "run_id": f"{experiment}/{seed}",
                         "eval/accuracy": 0.3 + 0.01 * seed, "eval/accuracy_at_start": 0.1,
                         "paired/cascade_minus_solo": value,
                         "paired/cascade_minus_solo_se": se if cascade else math.nan,
                         "paired/cascade_minus_solo_df": 299.0 if cascade else math.nan,
                         "paired/conversion_gap": gap + 0.01 * seed if cascade else math.nan,
                         "paired/conversion_gap_se": 0.02 if cascade else math.nan,
                         "paired/conversion_gap_df": 150.0 if cascade else math.nan})
    return pd.DataFrame(rows)


def test_the_study_claims_are_fixed_before_its_runs_and_put_to_target_sum_alone():
    study = {c.text: c for c in CLAIMS if c.task == "target_sum" and c.match == "steps"}
    assert set(study) == set(STUDY.values()) and {c.written for c in study.values()} == {"before"}
    # the claims at equal generations came after the study's runs (docs/results.md had read them post hoc)
    assert {c.written for c in CLAIMS if c.task == "target_sum" and c.match != "steps"} == {"after"}
    a, b, c = (study[STUDY[k]] for k in "abc")
    assert (a.left, a.right, a.than, a.metric, a.direction) == ("agon", None, 0.0, "paired/cascade_minus_solo",
                                                                "greater")
    assert (b.left, b.right, b.than, b.metric) == ("agon", "cooperative", None, "paired/cascade_minus_solo")
    assert (c.left, c.than, c.metric, c.direction) == ("agon", 0.0, "paired/conversion_gap", "greater")
    assert a.measure == b.measure == c.measure == "final"
    # the change since the start of a and b, each listed right after the claim on the final it qualifies
    a_change, b_change = study[STUDY["a_change"]], study[STUDY["b_change"]]
    assert (a_change.left, a_change.right, a_change.than, a_change.metric, a_change.measure, a_change.direction) == (
        "agon", None, 0.0, "paired/cascade_minus_solo", "change", "greater")
    assert (b_change.left, b_change.right, b_change.than, b_change.metric, b_change.measure,
            b_change.direction) == ("agon", "cooperative", None, "paired/cascade_minus_solo", "change", "greater")
    texts = [claim.text for claim in CLAIMS]
    assert texts.index(STUDY["a_change"]) == texts.index(STUDY["a"]) + 1
    assert texts.index(STUDY["b_change"]) == texts.index(STUDY["b"]) + 1
    # the paper's two claims on these cells are not repeated: they are put to the study's runs as they stand
    table = claims_table(study_runs([0.05, 0.06, 0.055], [0.02, 0.025, 0.03])).set_index("claim")
    assert {"Agon (competitive, visible) beats vanilla GRPO", "competitive beats cooperative (visible exchange)",
            *STUDY.values()} == set(table.index)
    assert set(table["claims"]) == {5}  # Bonferroni over the five written before that can be judged
    # runs without a start evaluation's rows: the change claims are not testable, and not counted in k
    assert table.loc[STUDY["a_change"], "verdict"] == ("not testable: 3 run(s) have no paired/cascade_minus_solo "
                                                       "at the start")
    assert table.loc[STUDY["b_change"], "verdict"].startswith("not testable: 6 run(s)")
    # on another task the study's claims are not put
    other = claims_table(study_runs([0.05, 0.06, 0.055], [0.02, 0.025, 0.03], task="products"))
    assert not set(STUDY.values()) & set(other["claim"]) and len(other) == 2


def test_a_within_run_claim_gets_its_verdict():
    """Agon's cascade beats its drafts by 5.5 points on seeds that agree to 0.5 point, each run's SE 0.5: the
    interval lies beyond the 1-point minimum effect (holds); at 0.25 points with SE 0.1 it lies within it
    (negligible); at -5.5 points beyond it on the other side (reversed)."""
    text = STUDY["a"]
    holds = claims_table(study_runs([0.05, 0.06, 0.055], [0.02, 0.025, 0.03])).set_index("claim").loc[text]
    assert holds["verdict"] == "holds" and holds["difference"] == pytest.approx(0.055)
    assert holds["right"] == "0" and holds["right_mean"] == 0.0 and holds["seeds"] == "3"
    assert holds["pooled_cells"] == 2  # agon and cooperative: GRPO has no cascade
    # the pooled SD over agon's and cooperative's seeds (.005 each, df 4) with the floor .005: t_4 x .005 / sqrt 3
    half = stats.t.ppf(0.975, 4) * 0.005 / math.sqrt(3)
    run_half = stats.t.ppf(0.975, 299) * 0.005
    assert holds["ci_high"] - holds["difference"] == pytest.approx(max(half, run_half))
    negligible = claims_table(study_runs([0.002, 0.003, 0.0025], [0.002, 0.003, 0.0025], se=0.001))
    assert negligible.set_index("claim").loc[text, "verdict"] == "negligible"
    reversed_ = claims_table(study_runs([-0.05, -0.06, -0.055], [0.02, 0.025, 0.03]))
    assert reversed_.set_index("claim").loc[text, "verdict"] == "reversed"
    # agon gains 3 points more over its drafts than cooperative: b holds
    assert holds.name == text
    table = claims_table(study_runs([0.05, 0.06, 0.055], [0.02, 0.025, 0.03])).set_index("claim")
    assert table.loc[STUDY["b"], "difference"] == pytest.approx(0.03) and table.loc[STUDY["b"], "verdict"] == "holds"
    # c: a 21-point gap, each run's SE 2 points: holds beyond the 2 points of claims.yaml
    assert table.loc[STUDY["c"], "min_effect"] == 0.02 and table.loc[STUDY["c"], "verdict"] == "holds"


def test_a_within_run_interval_is_never_narrower_than_one_of_its_runs():
    """Seeds that agree exactly and a run SE of 2 points: the pooled SD is raised to the floor (t_4 x .02 / sqrt 3
    = 3.2 points); with many seeds the t over seeds would shrink under one run's 1.97 x 2 = 3.9 points, which
    stands."""
    many = [0.05] * 12
    runs = study_runs(many[:3], many[:3], se=0.02)
    first = runs[runs["experiment"] == "agon"].iloc[[0]]
    extra = pd.concat([first.assign(seed=s, run_id=f"agon/{s}") for s in range(3, 12)])
    table = claims_table(pd.concat([runs, extra], ignore_index=True)).set_index("claim")
    row = table.loc[STUDY["a"]]
    run_half = stats.t.ppf(0.975, 299) * 0.02
    assert stats.t.ppf(0.975, row["pooled_df"]) * 0.02 / math.sqrt(12) < run_half
    assert row["ci_high"] - row["difference"] == pytest.approx(run_half)
    fw = stats.t.ppf(1 - (1 - row["fw_level"]) / 2, 299) * 0.02
    assert row["fw_high"] - row["difference"] == pytest.approx(fw)


def test_within_run_claims_are_computed_from_eval_rows():
    """Without the paired columns in the runs frame, claims_table works them out from the eval rows: Agon's
    cascade turns every wrong draft right on 300 problems x 2 orders, where a third of the drafts were right (+66.7
    points); without eval rows there is no within-run claim."""
    runs = study_runs([0.0] * 3, [0.0] * 3)
    runs = runs[[c for c in runs.columns if not c.startswith("paired/")]]
    rows = []
    for run_id in runs.loc[runs["experiment"] == "agon", "run_id"]:
        # problem i: 1 + 1 + 1 + i; a third of the drafts right, every final right
        rounds = [(o, f"1?1?1?{i}={i + 3}", 0, i % 3 == 0, True, None) for i in range(1, 301)
                  for o in ("A>B", "B>A")]
        rows.append(cascade_rows(rounds).assign(run_id=run_id))
    evals = pd.concat(rows, ignore_index=True)
    table = claims_table(runs, evals=evals).set_index("claim")
    row = table.loc[STUDY["a"]]
    assert row["left_mean"] == pytest.approx(2 / 3) and row["verdict"] == "holds"
    assert STUDY["a"] not in set(claims_table(runs)["claim"])
    md = claims_markdown(claims_table(runs, evals=evals))
    assert f"| {STUDY['a']} | before | agon (within run) | steps | 3 | +66.7 vs +0.0 |" in md
    assert "- Within-run claims (paired/cascade_minus_solo; analysis.paired): one cell's mean" in md


def study_evals(finals: dict[str, int], problems: int = 100, samples: int = 10) -> pd.DataFrame:
    """Eval rows of the study's agon and cooperative runs (3 seeds each) at the start (step 0) and the final (step
    800). On each problem's 2 orders x ``samples`` rounds, the first k drafts are wrong and every final is right:
    a cascade k / 20 points over its drafts. At the start k = 1 (+5 points, the untrained base's lead); at the final
    k = ``finals[experiment]``, one more on every tenth problem and one fewer on the next (so that the problems
    spread: each run's SE of its change 0.22 points)."""
    parts = []
    for experiment, k in finals.items():
        for seed in range(3):
            for phase, step, base in (("start", 0, 1), ("final", 800, k)):
                rounds = []
                for i in range(problems):
                    wrong = base + (i % 10 == 0) - (i % 10 == 1) if phase == "final" else base
                    rounds += [(order, f"1?1?1?{i}={i + 3}", j, 2 * j + o >= wrong, True, None)
                               for j in range(samples) for o, order in enumerate(("A>B", "B>A"))]
                parts.append(cascade_rows(rounds, phase, step).assign(run_id=f"{experiment}/{seed}"))
    return pd.concat(parts, ignore_index=True)


def test_a_change_claim_is_judged_on_the_change_since_the_start():
    """The base's cascade leads its drafts by 5 points before training. Trained to +5 points: claim a still holds
    (the lead was there all along), its change is 0 within the 1-point minimum effect (negligible), and so is the
    gap between the arms' changes. Trained to +15 points against the cooperative arm's +5: the change (+10) holds,
    and so does Agon's lead over the cooperative one's."""
    runs = study_runs([0.0] * 3, [0.0] * 3)
    runs = runs[[c for c in runs.columns if not c.startswith("paired/")]]
    same = claims_table(runs, evals=study_evals({"agon": 1, "cooperative": 1})).set_index("claim")
    assert same.loc[STUDY["a"], "left_mean"] == pytest.approx(0.05) and same.loc[STUDY["a"], "verdict"] == "holds"
    flat = same.loc[STUDY["a_change"]]
    assert flat["measure"] == "change" and flat["difference"] == pytest.approx(0.0, abs=1e-12)
    se = math.sqrt(20 * 0.05**2 / 99) / 10  # SD of the per-problem changes (ten +.05, ten -.05) over sqrt 100
    assert flat["eval_floor"] == pytest.approx(se) and flat["ci_high"] == pytest.approx(stats.t.ppf(0.975, 99) * se)
    assert flat["verdict"] == flat["fw_verdict"] == "negligible"
    assert same.loc[STUDY["b_change"], "verdict"] == "negligible"
    assert set(same["claims"]) == {6}  # the change claims now count in k: a, a_change, b, b_change, d, e
    grown = claims_table(runs, evals=study_evals({"agon": 3, "cooperative": 1})).set_index("claim")
    row = grown.loc[STUDY["a_change"]]
    assert row["left_mean"] == pytest.approx(0.10) and row["verdict"] == row["fw_verdict"] == "holds"
    assert grown.loc[STUDY["b_change"], "difference"] == pytest.approx(0.10)
    assert grown.loc[STUDY["b_change"], "verdict"] == "holds"
    md = claims_markdown(claims_table(runs, evals=study_evals({"agon": 3, "cooperative": 1})))
    assert f"| {STUDY['a_change']} | before | agon (within run) | steps | 3 | change +10.0 vs +0.0 |" in md
    assert "on the change in paired/cascade_minus_solo" in md


def test_paired_markdown_shows_the_start_and_the_change_beside_the_final():
    """Where the runs have start rows, the per-run and per-arm tables give cascade minus solo at the start and its
    change beside the final; without, the columns are not there."""
    runs = study_runs([0.0] * 3, [0.0] * 3)
    runs = runs[[c for c in runs.columns if not c.startswith("paired/")]].assign(cell_key=lambda f: f["experiment"])
    evals = study_evals({"agon": 3, "cooperative": 1})
    frame = runs_with_outcomes(runs, evals)
    md = paired_markdown(frame, arm_outcomes(frame), pd.DataFrame(), {"agon": "Agon"})
    header = md.split("\n")[2]
    assert "| both − solo | both − solo at start | both − solo change | conv. dead end % (n) |" in header
    assert "| ext − dead, paired (problems) | ext − dead at start | ext − dead change | ext − dead, all |" in header
    agon = next(line for line in md.split("\n") if line.startswith("| Agon | 0 |"))
    cells = [c.strip() for c in agon.strip("|").split("|")]
    assert cells[8].startswith("+15.0 [") and cells[9].startswith("+5.0 [") and cells[10].startswith("+10.0 [")
    assert next(line for line in md.split("\n") if line.startswith("| Agon | 3 |")).count("+10.0 [") == 1
    assert "- At start: the same at the evaluation before training; change: final minus start" in md
    # the final evaluation's rows alone: the table as before
    plain = runs_with_outcomes(runs, evals[evals["phase"] == "final"])
    assert "at start" not in paired_markdown(plain, arm_outcomes(plain), pd.DataFrame(), {})


def test_a_claim_names_two_cells_or_one_cell_and_a_number():
    base = {"equivalence": {"eval/accuracy": 0.02}, "min_effect": {"eval/accuracy": 0.01}, "level": 0.95,
            "reference": "grpo"}
    claims, _ = parse_claims({**base, "claims": [{"text": "t", "cell": "agon", "than": 0.0, "direction": "greater",
                                                  "written": "before", "task": "target_sum"}]})
    assert claims == (Claim("t", "agon", None, "greater", "before", than=0.0, task="target_sum"),)
    for bad in ({"text": "t", "cell": "agon", "direction": "greater", "written": "before"},
                {"text": "t", "left": "a", "right": "b", "than": 0.0, "direction": "greater", "written": "before"}):
        with pytest.raises(ValueError, match="two cells"):
            parse_claims({**base, "claims": [bad]})


def test_paired_markdown_shows_a_dash_where_a_run_has_no_cascade():
    runs = study_runs([0.05, 0.06, 0.055], [0.02, 0.025, 0.03]).assign(cell_key=lambda f: f["experiment"])
    md = paired_markdown(runs, arm_outcomes(runs), pd.DataFrame(), {"agon": "Agon"})
    assert "| grpo | 0 | - | - | - | - | - | - | - |" in md
    assert "| Agon | 3 |" in md and "+5.5 [" in md


def test_the_paper_claims_put_to_the_study_compare_its_arms_at_equal_steps():
    """Claims d and e of the study (competitive beats cooperative, Agon beats GRPO) are the paper's claims on final
    accuracy, at equal steps only while every arm of the target-sum sweep trains for the one trainer.max_steps the
    sweep sets: no preset of its arms sets its own."""
    import yaml

    sweep = yaml.safe_load((REPO / "sweeps" / "results_target_sum.yaml").read_text())
    assert isinstance(sweep["trainer"]["max_steps"], int)
    assert "trainer.max_steps" not in str(sweep["hydra"]["sweeper"]["params"])
    for experiment in ("agon", "cooperative", "grpo"):
        preset = yaml.safe_load((REPO / "conf" / "experiment" / f"{experiment}.yaml").read_text())
        assert "max_steps" not in str(preset.get("trainer", {})), experiment
    texts = {c.text for c in CLAIMS if c.task is None and c.left == "agon" and c.right in ("cooperative", "grpo")
             and c.metric == "eval/accuracy" and c.measure == "final" and c.written == "before"}
    assert texts == {"Agon (competitive, visible) beats vanilla GRPO",
                     "competitive beats cooperative (visible exchange)"}
