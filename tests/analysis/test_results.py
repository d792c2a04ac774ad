"""The committed results: docs/results.md's tables are what the packed runs in results/ give today.

A change to the packed files, to the analysis code or to the page that makes them disagree fails here, so the
page cannot drift from the runs it reports. Figures are not compared (their bytes depend on matplotlib's version);
they are drawn from the same tables.
"""

from __future__ import annotations

import copy
import functools

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import load_runs
from analysis.claims import CLAIMS, DESCRIPTION, claims_markdown, claims_table, verdict, welch_interval
from analysis.paired import (arm_outcomes, budget_table, eval_curve, on_smallest_design, recap_kind,
                             runs_with_outcomes, write_paired)
from analysis.patterns import solutions, write_patterns
from analysis.tables import (DIAGNOSTIC, equal_generations_markdown, final_rows, generation_runs, paper_reference,
                             two_generations, two_generations_markdown, write_tables)

REPO = Path(__file__).resolve().parents[2]
# results/runs/ is where sweeps write on this machine (ignored by git); a *_pilot directory is a pilot's runs
PACKED = sorted(p.name for p in (REPO / "results").iterdir() if p.is_dir() and p.name != "runs") \
    if (REPO / "results").is_dir() else []
# a *_controls directory is one seed per arm run again with the controls (not a grid: no claims, no cells of seeds)
TASKS = [name for name in PACKED if not name.endswith(("_pilot", "_pick", "_controls"))]
# each packed grid's cells, 3 seeds each: the paper's design on a task, or the exchange ablation (its claims name
# cells by their exchange, analysis/claims.yaml)
CELLS = {"arithmetic_hard": 10, "products": 10, "exchange": 4, "target_sum": 3}


@functools.cache
def _loaded(task: str):
    return load_runs(REPO / "results" / task)


def runs_of(task: str):
    """The packed runs of ``results/<task>``, read once per test session (a grid's records take seconds to parse) and
    copied for each test, so that no test sees another's changes."""
    return copy.deepcopy(_loaded(task))


def test_every_packed_task_has_its_figures_and_a_section_of_the_page():
    assert TASKS == sorted(CELLS) and PACKED == [*TASKS, "target_sum_controls", "target_sum_pick", "target_sum_pilot"]
    page = (REPO / "docs" / "results.md").read_text()
    for task in TASKS:
        for figure in ("accuracy_grid", "claims_forest", "recap_diagnostic", "training_curves"):
            assert f"results/{task}/{figure}.png" in page, (task, figure)
            assert (REPO / "docs" / "results" / task / f"{figure}.png").is_file(), (task, figure)


@pytest.mark.parametrize("task", TASKS)
def test_the_committed_tables_are_what_the_packed_runs_give(task, tmp_path):
    data = runs_of(task)
    # every cell of the grid, 3 seeds each, each run finished
    assert len(data.runs) == 3 * CELLS[task] and (data.runs["status"] == "complete").all()
    assert data.runs.groupby("cell").size().eq(3).all() and data.runs["cell"].nunique() == CELLS[task]
    write_tables(data, tmp_path)
    claims = claims_table(data.runs, evals=data.evals)
    assert not claims.empty
    (tmp_path / "claims.md").write_text(claims_markdown(claims))
    committed = REPO / "docs" / "results" / task
    page = (REPO / "docs" / "results.md").read_text()
    for name in ("table.md", "diagnostic.md", "claims.md", "runs.md"):
        assert (tmp_path / name).read_text() == (committed / name).read_text(), f"docs/results/{task}/{name}"
    # the within-run outcomes and the walls by sign pattern: the target-sum study's (grids packed before them have
    # neither; where one is committed it is what the runs give)
    write_paired(data, tmp_path)
    write_patterns(data, tmp_path)
    if task.startswith("target_sum"):
        assert (committed / "paired.md").is_file() and (committed / "patterns.md").is_file()
    for name in ("paired.md", "patterns.md"):
        if (committed / name).is_file():
            assert (tmp_path / name).read_text() == (committed / name).read_text(), f"docs/results/{task}/{name}"
    # the page quotes the tables as drawn: the results table (less its caption) and the claims, row for row
    table_rows = (tmp_path / "table.md").read_text().split("\n\n", 1)[1].strip()
    assert table_rows in page
    assert (tmp_path / "claims.md").read_text().strip() in page
    if task.startswith("target_sum"):
        # and the study's walls by pattern, arms at equal steps and tokens, and each run's commits and hours
        blocks = [b.strip() for name in ("patterns.md", "paired.md", "runs.md")
                  for b in (tmp_path / name).read_text().split("\n\n")]
        for head in ("| operands | signs |", "| at | arm(s) |", "| cell | seed | status |"):
            assert next(b for b in blocks if b.startswith(head)) in page, head


def test_the_target_sum_pick_runs_curve_is_what_its_packed_run_gives():
    """docs/results.md's pick run (the study's step count): its curve row, recomputed from the packed metrics."""
    data = runs_of("target_sum_pick")
    assert len(data.runs) == 1 and data.runs["method"].iloc[0] == "grpo"
    points = data.steps.dropna(subset=["eval/accuracy"]).drop_duplicates("train/step", keep="last")
    curve = {int(r["train/step"]): r["eval/accuracy"] for _, r in points.iterrows()}
    assert sorted(curve) == list(range(0, 251, 25))
    row = "| GRPO % | " + " | ".join(f"{100 * curve[s]:.1f}" for s in sorted(curve)) + " |"
    assert row in (REPO / "docs" / "results.md").read_text()
    # on one design (the interim one) the first and the last points read otherwise
    run = data.runs.iloc[0]
    one = on_smallest_design(eval_curve(data.steps, "train/step"), data.evals, run).set_index("step")["value"]
    page = " ".join((REPO / "docs" / "results.md").read_text().split())
    assert f"step 0 is {100 * one[0]:.1f}% and step 250 {100 * one[250]:.1f}%, " \
           f"{100 * (one[250] - one[225]):.1f} points above step 225" in page
    # the first 100 steps' gain, on that one design (step 100 is an interim point, as logged)
    assert one[100] == pytest.approx(curve[100])
    assert f"On one design (the first 100 problems x 4 samples, below) it gains {100 * (one[100] - one[0]):.1f} " \
           "points in its first 100 steps" in page
    # the step count was fixed (b0e22c0, its time as the page states it) between step 175's evaluation and 200's
    logged = {m.group(2): m.group(1) for m in re.finditer(r"\[2026-12-04 ([0-9:]{8}),\d+\].*eval step (\d+):",
                                                         (REPO / "results" / "target_sum_pick" /
                                                          "grpo_lr1e-3" / "run.log").read_text())}
    assert logged["175"] < "19:49:55" < logged["200"]
    assert "(b0e22c0, 19:49:55 UTC)" in page
    assert f"step 175's evaluation at {logged['175']} and step 200's at {logged['200']}" in page


def test_the_target_sum_pilot_table_is_what_its_packed_runs_give():
    """docs/results.md's target-sum pilot: each row of its curve table, recomputed from the packed metrics."""
    data = runs_of("target_sum_pilot")
    method = data.runs.set_index("run_id")["method"]
    points = data.steps.dropna(subset=["eval/accuracy"])
    grpo, agon = ({int(r["train/step"]): r for _, r in points[points["run_id"].map(method) == m].iterrows()}
                  for m in ("grpo", "agon"))
    assert max(grpo) == 800 and max(agon) == 400
    agon_columns = ("eval/accuracy", "eval/solo_acc_A", "eval/solo_acc_B", "eval/conversion_rate",
                    "eval/regression_rate", "eval/agree_AB")
    page = (REPO / "docs" / "results.md").read_text()
    for step, g in sorted(grpo.items()):
        cells = [f"{100 * g['eval/accuracy']:.1f}"]
        if step in agon:
            a = agon[step]
            cells += [f"{100 * a[k]:.1f}" for k in agon_columns] + [f"{a['eval/divergence']:+.3f}"]
        else:
            cells += ["-"] * (len(agon_columns) + 1)
        row = f"| {step} | " + " | ".join(cells) + " |"
        assert row in page, row


def test_each_grid_is_judged_on_its_own_claims_and_the_exchange_page_quotes_its_prefix_diagnostic():
    """The paper's claims (cells named by preset) are put to the paper's design and the future-work ones (cells
    named by exchange) to the exchange sweep, never across: axis values are matched among runs launched without a
    preset only. The latent-exchange section quotes the diagnostic's block of prefix conditions as drawn."""
    # the target-sum study's claims (``task: target_sum``) are put to its grid alone, with the paper's claims on
    # its three arms
    general = [c for c in CLAIMS if c.task is None]
    by_preset = {c.text for c in general if "=" not in c.left + (c.right or "")}
    study_arms = {"agon", "cooperative", "grpo"}
    on_study = {c.text for c in general if c.text in by_preset and {c.left, c.right} <= study_arms}
    expected = {"exchange": {c.text for c in general} - by_preset,
                "target_sum": on_study | {c.text for c in CLAIMS if c.task == "target_sum"}}
    for task in TASKS:
        data = runs_of(task)
        judged = set(claims_table(data.runs, evals=data.evals)["claim"])
        assert judged == expected.get(task, by_preset), task
    page = (REPO / "docs" / "results.md").read_text()
    diagnostic = (REPO / "docs" / "results" / "exchange" / "diagnostic.md").read_text()
    prefix_block = diagnostic.split("as key/value prefixes")[1].split("\n\n")[1].strip()
    assert prefix_block.count("latent:") == 6 and prefix_block in page
    assert diagnostic.split("\n\n")[0].strip() in page  # the text-recap block of the same cells


def within_run_se(evals: pd.DataFrame, run_id: str, metric: str, measure: str) -> float:
    """One run's SE of a within-run metric, worked out here from its cascade rows: per problem, the mean over its
    rounds of final minus draft (``paired/cascade_minus_solo``) or the share of its wrong extendable drafts answered
    right minus that of its wrong dead ends (``paired/conversion_gap``, problems with both); the SE is their SD
    over sqrt(P), of the final evaluation's values or of their change since the start."""

    def per_problem(phase: str) -> pd.Series:
        rows = evals[(evals["run_id"] == run_id) & (evals["phase"] == phase) & evals["order"].str.contains(">")]
        rows = rows[rows["step"] == rows["step"].max()]
        rounds = rows.assign(correct=rows["correct"].astype(float)).pivot_table(
            index=["order", "problem_id", "sample"], columns="stage", values="correct", aggfunc="first")
        if metric == "paired/cascade_minus_solo":
            return (rounds["final"] - rounds["draft"]).groupby(level="problem_id").mean()
        drafts = rows[rows["stage"] == "draft"].set_index(["order", "problem_id", "sample"])
        wrong = rounds[rounds["draft"] == 0].assign(kind=[recap_kind(p, drafts.loc[(o, p, k), "answer"])
                                                          for o, p, k in rounds[rounds["draft"] == 0].index])
        rates = wrong[wrong["kind"].isin(["extendable", "dead_end"])].groupby(["problem_id", "kind"])["final"]
        both = rates.mean().unstack().dropna()
        return both["extendable"] - both["dead_end"]

    final = per_problem("final")
    values = final if measure == "final" else (final - per_problem("start")).dropna()
    return float(values.std(ddof=1) / len(values) ** 0.5)


@pytest.mark.parametrize("task", TASKS)
def test_no_pooled_sd_of_a_packed_grid_is_below_one_runs_evaluation_floor(task):
    """Each run's evaluation-sampling SD, worked out here from its own final-evaluation rows (per problem and
    order, the variance of its samples over their count; summed, rooted, over the number of groups): the pooled SD
    of every claim is at least the largest of them among the trained runs (of a within-run claim, the largest of
    the cascades' own SEs, ``within_run_se``). The exchange grid's seeds pool to 0.49 points, under its runs' floors
    of 0.47-0.65, and its intervals use 0.65."""
    data = runs_of(task)
    trained = data.runs[data.runs["method"] != "moa"]
    floors = {}
    for _, run in trained.iterrows():
        rows = final_rows(data.evals, run)
        assert len(rows) == run["eval/n_problems"] * run["eval/samples"] * len(run["headline_orders"])
        for field in ("correct", "tokens"):
            groups = rows.groupby(["problem_id", "order"])[field]
            var = (groups.var(ddof=1) / groups.size()).sum()
            floors.setdefault(field, []).append(var ** 0.5 / groups.ngroups)
    claims = claims_table(data.runs, evals=data.evals)
    for _, row in claims.iterrows():
        if row["match"] != "steps":  # read from the diagnostic, its own floor: the study's equal-generations test
            continue
        if row["metric"].startswith("paired/"):  # a within-run claim's floor: the runs' own SE, by problem
            cascades = trained[trained["method"] == "agon"]
            floor = max(within_run_se(data.evals, run_id, row["metric"], row["measure"])
                        for run_id in cascades["run_id"])
        else:
            floor = max(floors["tokens" if "tokens" in row["metric"] else "correct"])
        assert row["eval_floor"] == pytest.approx(floor), row["claim"]
        assert row["pooled_sd"] >= floor - 1e-12, row["claim"]
        assert row["pooled_sd"] == pytest.approx(max(row["seed_sd"], floor)), row["claim"]
    if task == "exchange":
        final = claims[claims["measure"] == "final"].iloc[0]
        assert final["seed_sd"] < 0.0050 < 0.0064 < final["pooled_sd"] < 0.0066


@pytest.mark.parametrize("task", TASKS)
def test_only_claims_written_before_their_runs_get_verdicts_on_the_packed_grids(task):
    """A claim marked ``written: after`` in claims.yaml is shown with its interval as a description: no verdict,
    no family-wise interval, not counted in k. The exchange grid's six claims were all written after its runs."""
    data = runs_of(task)  # the eval rows give the within-run claims their values
    claims = claims_table(data.runs, evals=data.evals)
    after = claims[claims["written"] == "after"]
    assert not after.empty and set(after["verdict"]) == set(after["fw_verdict"]) == {DESCRIPTION}
    assert after["fw_low"].isna().all() and after["ci_low"].notna().all()
    before = claims[claims["written"] == "before"]
    assert DESCRIPTION not in set(before["verdict"]) and (claims["claims"] == len(before)).all()
    assert len(before) == (0 if task == "exchange" else 7)


def test_the_target_sum_pilots_chance_levels_walls_and_costs_are_what_its_records_give():
    """The pilot's prose: chance levels counted from the held-out problems, the per-pattern table from the final
    evaluations' rows, and the figures quoted from the metrics (groups without reward spread, the compute match,
    the cascade's gap to its adapters, the run times)."""
    data = runs_of("target_sum_pilot")
    page = " ".join((REPO / "docs" / "results.md").read_text().split())  # the prose wraps anywhere
    method = data.runs.set_index("run_id")["method"]
    evals = data.evals.assign(method=data.evals["run_id"].map(method))
    # the final evaluation's final stage (a run packed with its start evaluation's rows holds those too)
    final = evals[(evals["stage"] == "final") & (evals["phase"] == "final")]
    problems = sorted(final["problem_id"].unique())
    chance = {pid: len(solutions(pid)[1]) / 2 ** (solutions(pid)[0] - 1) for pid in problems}
    by_count = {n: [chance[p] for p in problems if solutions(p)[0] == n] for n in (3, 4)}
    assert (f"solves {100 * sum(chance.values()) / len(problems):.1f}% of the {len(problems)} held-out problems: "
            f"{100 * sum(by_count[3]) / len(by_count[3]):.1f}% of the {len(by_count[3])} with 3 operands and "
            f"{100 * sum(by_count[4]) / len(by_count[4]):.1f}% of the {len(by_count[4])} with 4") in page
    # the per-pattern table, row by row, over the problems with one solution
    single = final.assign(pattern=final["problem_id"].map(lambda p: solutions(p)[1]))
    single = single[single["pattern"].map(len) == 1].assign(pattern=lambda f: f["pattern"].str[0])
    single["operands"] = single["problem_id"].map(lambda p: solutions(p)[0])
    single["who"] = single["method"] + ":" + single["order"].replace({"A>B": "cascade", "B>A": "cascade"})
    acc = single.groupby(["operands", "pattern", "who"])["correct"].mean()
    for (n, pattern), rows in single[single["who"] == "grpo:A"].groupby(["operands", "pattern"]):
        cells = [f"{100 * acc[(n, pattern, who)]:.1f}" for who in ("grpo:A", "agon:A", "agon:B", "agon:cascade")]
        row = f"| {n} | `{pattern}` | {rows['problem_id'].nunique()} | {100 / 2 ** (n - 1):.1f} | " + " | ".join(cells)
        assert row + " |" in page, row
    grpo_rows = final[final["method"] == "grpo"]
    for n, share in grpo_rows.groupby(grpo_rows["problem_id"].map(lambda p: solutions(p)[0]))["correct"]:
        assert f"{100 * share.mean():.1f}% of the {n}-operand" in page
    # training rows: groups without reward spread, generated tokens, time
    steps = data.steps.assign(method=data.steps["run_id"].map(method))
    grpo = steps[(steps["method"] == "grpo") & steps["time/step_s"].notna()].set_index("train/step")
    agon = steps[(steps["method"] == "agon") & steps["time/step_s"].notna()].set_index("train/step")
    late = grpo.loc[700:800, "role/drafter/frac_reward_zero_std"].mean()
    early = grpo.loc[1:50, "role/drafter/frac_reward_zero_std"].mean()
    assert f"in steps 700-800, {100 * late:.0f}% of GRPO's groups" in page
    assert f"{100 * early:.0f}% in steps 1-50" in page
    tokens = agon["train/generated_tokens"].max()
    matched = int(grpo.index[grpo["train/generated_tokens"] >= tokens].min())
    assert f"Agon had generated {tokens / 1e6:.2f}M tokens" in page and f"GRPO reached at step {matched}" in page
    hours = [frame["time/step_s"].sum() / 3600 for frame in (agon, grpo)]
    assert f"The steps alone took {hours[0]:.1f} h for Agon (400 steps) and {hours[1]:.1f} h for GRPO" in page
    # the cascade against the mean of its two adapters, paired over problems, at step 400
    agon_final = final[final["method"] == "agon"]
    per = agon_final.groupby(["order", "problem_id"])["correct"].mean().unstack(0)
    gap = (per["A"] + per["B"]) / 2 - (per["A>B"] + per["B>A"]) / 2
    assert f"{100 * gap.mean():.1f} points under the mean of the two (standard error " \
           f"{100 * gap.std(ddof=1) / len(gap) ** 0.5:.1f} points" in page


def test_the_target_sum_studys_prose_is_what_its_records_give():
    """The study's section: chance, the problems with one solution, the cascade's lead taken apart into the drafts'
    accuracy, conversion and regression at the start and the end, where Agon reaches GRPO's tokens, the diagnostic's
    rows at the start and the end, and the hours the runs record."""
    data = runs_of("target_sum")
    page = " ".join((REPO / "docs" / "results.md").read_text().split())
    runs = data.runs
    final = data.evals[(data.evals["stage"] == "final") & (data.evals["phase"] == "final")]
    problems = final["problem_id"].unique()
    chance = sum(len(solutions(p)[1]) / 2 ** (solutions(p)[0] - 1) for p in problems) / len(problems)
    single = sum(len(solutions(p)[1]) == 1 for p in problems)
    assert f"solves {100 * chance:.1f}% of the {len(problems)} held-out problems" in page
    assert f"({single} of the {len(problems)} problems have one)" in page
    agon = runs[runs["experiment"] == "agon"]
    assert len(agon) == 3

    def pct(column: str, frame: pd.DataFrame = agon) -> str:
        return f"{100 * frame[column].mean():.1f}%"

    assert f"went from {pct('eval/conversion_rate_at_start')} to {pct('eval/conversion_rate')}" in page
    assert f"from {pct('eval/regression_rate_at_start')} to {pct('eval/regression_rate')}" in page
    drafts = [agon[[f"eval/solo_acc_{r}{at}" for r in "AB"]].mean(axis=1).to_frame("d") for at in ("_at_start", "")]
    assert f"from {pct('d', drafts[0])} to {pct('d', drafts[1])}, A and B averaged" in page
    # the token count every run reaches (the smallest GRPO total) and the steps at which the cascades reach it
    tokens = runs["train/generated_tokens"].min()
    steps = data.steps.dropna(subset=["train/generated_tokens"])
    reach = [int(steps[(steps["run_id"] == r) & (steps["train/generated_tokens"] >= tokens)]["train/step"].min())
             for r in runs[runs["method"] == "agon"]["run_id"]]
    assert f"({tokens / 1e6:.2f}M generated tokens, which the Agon and cooperative runs reach at steps " \
           f"{min(reach)}-{max(reach)})" in page
    diagnostic = (REPO / "docs" / "results" / "target_sum" / "diagnostic.md").read_text().splitlines()
    quoted = [line for line in diagnostic if re.match(r"\| [^|]+ \| (0|200) \| 3 \|", line)]
    assert len(quoted) == 6 and all(line in page for line in quoted)
    # the diagnostic by seed at step 200: wrong recap minus none, the challengers averaged
    last = data.steps[data.steps["train/step"] == 200].set_index("run_id")
    by_arm = {}
    for _, run in runs.iterrows():
        who = ["A"] if run["method"] == "grpo" else ["A", "B"]
        gap = sum(last.loc[run["run_id"], f"recap/{w}/wrong"] - last.loc[run["run_id"], f"recap/{w}/none"]
                  for w in who) / len(who)
        by_arm.setdefault(run["experiment"], []).append(f"{100 * gap:+.1f}")
    seeds = {arm: ", ".join(v[:-1]) + " and " + v[-1] for arm, v in by_arm.items()}
    grpo = seeds["grpo"].replace("+", "")
    assert f"wrong minus no recap is {grpo} points for GRPO, {seeds['agon']} for Agon" in page
    assert f"and {seeds['cooperative'].replace('+', '')} for the cooperative arm" in page
    assert f"The steps alone took {runs['time/train_s'].sum() / 3600:.1f} hours over the nine runs" in page
    # the claims' commit (its time as the page states it) came before the first launch of any run (run.log)
    starts = {log.parent.name: log.read_text()[1:20] for log in (REPO / "results" / "target_sum").glob("*/run.log")}
    assert len(starts) == 9
    first = min(starts.values())
    assert "committed (6281636, 19:49:21 UTC on 2026-12-04)" in page and first > "2026-12-04 19:49:21"
    assert sorted(k for k, v in starts.items() if v == first) == [f"experiment={arm},seed=0"
                                                                   for arm in ("agon", "cooperative")]
    assert f"(seed 0 of Agon and of cooperative at {first[11:]}, the first line of each run's packed `run.log`" in page
    assert f"the wall hours recorded add up to {runs['time/total_s'].sum() / 3600:.1f}" in page
    # GRPO's adapter against Agon's drafts alone (both at the final evaluation, 300 x 16)
    grpo = runs[runs["experiment"] == "grpo"]["eval/accuracy"].mean()
    drafts = agon[["eval/solo_acc_A", "eval/solo_acc_B"]].mean(axis=1).mean()
    assert f"GRPO's one adapter ends {100 * (grpo - drafts):.1f} points above Agon's drafts alone " \
           f"({100 * grpo:.1f}% against {100 * drafts:.1f}%)" in page


def _flat(text: str) -> str:
    """A page's text with its wrapping undone: the prose wraps anywhere."""
    return " ".join(text.split())


def _readme_results() -> str:
    """The README's "Results in one paragraph", unwrapped."""
    readme = (REPO / "README.md").read_text()
    return _flat(readme.split("## Results in one paragraph", 1)[1].split("\n## ", 1)[0])


def test_the_target_sum_studys_answers_at_two_generations_are_what_its_diagnostic_gives():
    """The study at equal generations per answer (written after its runs): the table of the diagnostic's cross-play
    (``analysis.tables.two_generations``) as drawn, each of its values worked out here from the logged keys, and
    the prose's differences: GRPO's adapter after its own recap against Agon's cascade (Welch over seeds), reading
    the rival's recap against one's own, and GRPO's self-cascade over its own drafts."""
    data = runs_of("target_sum")
    page, readme = _flat((REPO / "docs" / "results.md").read_text()), _readme_results()
    frame = two_generations(data)
    assert two_generations_markdown(frame).strip() in (REPO / "docs" / "results.md").read_text()
    # each value from the logged keys: the cascade (a challenger reads its rival's recap), the self-cascade (its
    # own), and the drafts' share right (the rival's drafts, from the split of the rounds by them)
    diagnosed = data.steps.dropna(subset=["recap/n_wrong"]).set_index(["run_id", "train/step"])
    assert frame.groupby("run_id")["step"].agg(["min", "max"]).eq([0, 200]).all().all()
    method = data.runs.set_index("run_id")["method"]
    for _, row in frame.iterrows():
        logged = diagnosed.loc[(row["run_id"], row["step"])]
        who = "A" if method[row["run_id"]] == "grpo" else "AB"
        rival = {"A": "B", "B": "A"} if who == "AB" else {"A": "A"}
        if row["answer"] == "drafts":
            shares = [(logged[f"recap/{c}/rival"] - logged[f"recap/{c}/rival_wrong"])
                      / (logged[f"recap/{c}/rival_right"] - logged[f"recap/{c}/rival_wrong"]) for c in who]
            expected = sum(shares) / len(shares)
        else:
            orders = [f"{rival[c]}>{c}" if row["answer"] == "rival" else f"{c}>{c}" for c in who]
            expected = sum(logged[f"crossplay/{o}"] for o in orders) / len(orders)
        assert row["value"] == pytest.approx(expected), (row["run_id"], row["step"], row["answer"])
    final = frame[frame["step"] == 200]

    def seeds(arm: str, answer: str) -> np.ndarray:
        rows = final[final["run_id"].str.contains(f"experiment={arm},") & (final["answer"] == answer)]
        assert len(rows) == 3
        return rows.sort_values("seed")["value"].to_numpy()

    grpo, agon = seeds("grpo", "own"), seeds("agon", "rival")
    assert frame[frame["run_id"].str.contains("grpo")]["answer"].isin(["drafts", "own"]).all()
    diff, low, high = welch_interval(grpo, agon)
    assert f"GRPO's adapter after its own recap is {100 * diff:.1f} points above Agon's cascade " \
           f"({100 * grpo.mean():.1f}% against {100 * agon.mean():.1f}%; Welch's interval over seeds " \
           f"[{100 * low:+.1f}, {100 * high:+.1f}])" in page
    assert f"At equal generations per answer GRPO's adapter is {100 * diff:.1f} points ahead" in page
    assert f"GRPO's adapter answering its own recap is {100 * diff:.1f} points ahead of Agon's cascade (post hoc)" \
           in readme
    own, cooperative = seeds("agon", "own"), seeds("cooperative", "rival")
    gain = agon - own
    assert f"Agon's adapters after their own recaps are at {100 * own.mean():.1f}% and the cooperative cascade at " \
           f"{100 * cooperative.mean():.1f}%: reading the rival's recap instead of one's own adds " \
           f"{100 * gain.mean():.1f} points ({100 * gain.min():.1f} to {100 * gain.max():+.1f} by seed)" in page
    drafts = seeds("grpo", "drafts")
    assert f"ends {100 * (grpo.mean() - drafts.mean()):.1f} points above its own drafts when it answers its own " \
           f"recap ({100 * grpo.mean():.1f}% against {100 * drafts.mean():.1f}%" in page


def test_the_target_sum_study_at_equal_generations_falls_back_to_its_diagnostics_cross_play():
    """The study's records are from before the main evaluation played the self-cascades: each arm's answer at two
    generations is the diagnostic's cross-play at step 200 (``two_generations``' cascade for Agon and cooperative,
    its self-cascade for GRPO), 300 x 1 per run, in the equal-generations table and in the claims at equal
    generations, whose floor is the largest binomial SD of one run's number."""
    data = runs_of("target_sum")
    per_run = generation_runs(data).set_index("run_id")
    assert set(per_run["source"]) == {DIAGNOSTIC} and set(per_run["design"]) == {"300 x 1"}
    frame = two_generations(data)
    last = frame[frame["step"] == 200].set_index(["run_id", "answer"])["value"]
    method = data.runs.set_index("run_id")["method"]
    for run_id, row in per_run.iterrows():
        answer = "own" if method[run_id] == "grpo" else "rival"
        assert row["two"] == pytest.approx(last[(run_id, answer)]), run_id
        answers = 300 * len(row["orders"])
        assert row["floor"] == pytest.approx((row["two"] * (1 - row["two"]) / answers) ** 0.5), run_id
    md = equal_generations_markdown(data)
    assert "| GRPO | 3 | 1 | 85.0 | 89.4 | 85.0 | diagnostic cross-play (A>A), 300 x 1 |" in md
    assert "| competitive · visible | 3 | 2 | 81.4 | 86.8 | 86.4 | diagnostic cross-play (A>B, B>A), 300 x 1 |" in md
    claims = claims_table(data.runs, evals=data.evals).set_index("claim")
    grpo = claims.loc["Agon beats GRPO at equal generations (two per answer)"]
    assert (grpo["left_mean"], grpo["right_mean"]) == (pytest.approx(last.xs("rival", level="answer")[
        per_run.index[per_run["cell"] == "competitive · visible"]].mean()), pytest.approx(
        last.xs("own", level="answer")[per_run.index[per_run["cell"] == "GRPO"]].mean()))
    assert grpo["eval_floor"] == pytest.approx(per_run["floor"].max())
    assert grpo["reading"] == "diagnostic cross-play, 300 x 1" and grpo["verdict"] == DESCRIPTION


def test_the_target_sum_studys_bounds_and_what_its_verdicts_lean_on_are_what_its_claims_give():
    """The study's prose around its claims: what the between-arm intervals rule out (their upper ends as shares of
    the other arm's errors, against the paper's), the cascade's lead before training and in the other arms, the
    within-run verdicts on Agon's own seeds (``paired.md``) and what sets the dead-end claim's interval."""
    from scipy import stats

    data = runs_of("target_sum")
    page, readme = _flat((REPO / "docs" / "results.md").read_text()), _readme_results()
    claims = claims_table(data.runs, evals=data.evals).set_index("claim")
    runs = data.runs.set_index("experiment")
    paper = {arm: paper_reference(runs.loc[arm].iloc[0])[0] for arm in ("agon", "cooperative", "grpo")}
    assert paper == {"agon": 0.61, "cooperative": 0.46, "grpo": 0.30}
    # Agon against GRPO and against cooperative at step 200: the upper ends, at 95% and family-wise
    bounds = {}
    for claim, other in (("Agon (competitive, visible) beats vanilla GRPO", "grpo"),
                         ("competitive beats cooperative (visible exchange)", "cooperative")):
        row = claims.loc[claim]
        assert row["verdict"] == row["fw_verdict"] == "unresolved"
        errors = 1 - row["right_mean"]
        share = (paper["agon"] - paper[other]) / (1 - paper[other])
        bounds[other] = (f"{100 * row['ci_high']:.1f}", f"{100 * row['ci_high'] / errors:.0f}%",
                         f"{100 * share:.0f}%", f"{100 * row['fw_high']:.1f}", f"{100 * row['fw_high'] / errors:.0f}%")
        assert row["ci_high"] / errors < share  # at 95% the paper's size is ruled out on both
        assert (row["fw_high"] / errors < share) == (other == "grpo")  # family-wise on GRPO alone
    g, c = bounds["grpo"], bounds["cooperative"]
    assert f"Agon is at most {g[0]} points above GRPO, {g[1]} of GRPO's errors, where the paper's 61% against 30% " \
           f"removes {g[2]} of them (family-wise at most {g[3]} points, {g[4]})" in page
    assert f"Agon is at most {c[0]} points above cooperative, {c[1]} of cooperative's errors, where the paper's " \
           f"61% against 46% removes {c[2]} of them. Family-wise the bound is {c[3]} points, {c[4]}, which does not " \
           "rule out the paper's size" in page
    assert f"Agon is at most {g[0]} points above GRPO, {g[1]} of GRPO's errors, where the paper's 61% vs 30% " \
           f"removes {g[2]}, and at most {c[0]} above cooperative, {c[1]} of its errors against the paper's " \
           f"{c[2]}" in readme
    # every arm within 1.5 points of the others at equal steps and at equal tokens, none resolved
    budget = budget_table(data.steps, data.runs, evals=data.evals)
    differences = budget[budget["kind"] == "difference"]
    assert len(differences) == 6 and (differences["low"] < 0).all() and (differences["high"] > 0).all()
    assert f"The arms end within {100 * differences['value'].abs().max():.1f} points of each other at equal " \
           "steps and at equal tokens" in page
    # the cascade's lead over its drafts: before training, and in the cooperative arm (paired.md's per-arm rows)
    arms = arm_outcomes(runs_with_outcomes(data.runs, data.evals)).set_index(["cell_key", "metric"])
    key = {arm: runs.loc[arm, "cell_key"].iloc[0] for arm in ("agon", "cooperative")}
    lead = {arm: arms.loc[(key[arm], "paired/cascade_minus_solo")] for arm in key}
    start = arms.loc[(key["agon"], "paired/cascade_minus_solo_at_start")]["mean"]
    assert f"the untrained base's cascade led its drafts by {100 * start:.1f} points, the cooperative arm's " \
           f"ends {100 * lead['cooperative']['mean']:.1f} points above its drafts" in page
    assert f"The cascade's {100 * lead['agon']['mean']:.1f}-point lead over its own drafts, the one claim that " \
           f"holds family-wise, was built in before training ({100 * start:.1f} points, which training " \
           "shrank)" in readme
    # the claim that training widens the lead, on Agon's own seeds: unresolved, by how much it misses
    change = arms.loc[(key["agon"], "paired/cascade_minus_solo_change")]
    widens = claims.loc["Agon's training widens its cascade's lead over its own drafts (change since the start)"]
    assert widens["verdict"] == "reversed" and widens["pooled_df"] == 4
    assert verdict("greater", change["low"], change["high"], min_effect=widens["min_effect"]) == "unresolved"
    assert f"on Agon's own three seeds (`paired.md`) the interval is [{100 * change['low']:+.1f}, " \
           f"{100 * change['high']:+.1f}], unresolved (its upper end misses the 1-point minimum effect by " \
           f"{100 * (change['high'] + widens['min_effect']):.1f})" in page
    # the dead-end claim: the SD is the floor either way, the widest run sets the interval, and the t quantile at
    # Agon's own df 2 widens it past 0
    gap = claims.loc["After a dead-end recap Agon's challenger converts less often than after an extendable one"]
    assert gap["verdict"] == "holds" and gap["pooled_df"] == 4 and gap["pooled_sd"] == gap["eval_floor"]
    own = runs_with_outcomes(data.runs, data.evals).set_index("experiment").loc["agon"]
    halves = stats.t.ppf(0.975, own["paired/conversion_gap_df"]) * own["paired/conversion_gap_se"]
    widest = own["seed"].iloc[int(np.argmax(halves))]
    t4, t2 = stats.t.ppf(0.975, 4), stats.t.ppf(0.975, 2)
    pooled, alone = t4 * gap["pooled_sd"] / 3 ** 0.5, t2 * gap["pooled_sd"] / 3 ** 0.5
    assert gap["ci_high"] - gap["difference"] == pytest.approx(halves.max()) and pooled < halves.max() < alone
    by_own = arms.loc[(key["agon"], "paired/conversion_gap")]
    assert by_own["low"] < 0 and by_own["low"] == pytest.approx(gap["difference"] - alone)
    at_start = arms.loc[(key["agon"], "paired/conversion_gap_at_start")]["mean"]
    assert f"it was {100 * at_start:+.1f} at the start, before training" in page
    assert f"through the t quantile, not the SD: the SD is the evaluation floor, {100 * gap['pooled_sd']:.1f} " \
           f"points, either way. Pooled over both arms (df 4, t = {t4:.2f}) the seeds' half-width, t x " \
           f"{100 * gap['pooled_sd']:.1f} / √3 = {100 * pooled:.1f}, is below the widest single run's (seed " \
           f"{widest}'s, ±{100 * halves.max():.1f}), so the interval is that run's" in page
    assert f"On Agon's own seeds (df 2, t = {t2:.2f}) the half-width is {100 * alone:.1f}, and the interval, " \
           f"[{100 * by_own['low']:+.1f}, {100 * by_own['high']:+.1f}] in `paired.md`, includes 0" in page
    # the main table's trace tokens: the gap to GRPO was there at the start; the change since then is the claim's
    traces = claims.loc["Agon's traces get shorter than GRPO's (change since the start)"]
    at = {arm: runs.loc[arm, "eval/final_trace_tokens_at_start"].mean() for arm in ("agon", "grpo")}
    assert f"was there before training: {at['agon']:.1f} tokens against {at['grpo']:.1f} at the start. Since the " \
           f"start Agon's traces changed by {traces['left_mean']:.2f} tokens and GRPO's by " \
           f"{traces['right_mean']:.2f}" in page


def test_the_target_sum_studys_equal_tokens_reading_and_when_it_changed_are_what_its_records_give():
    """The comparison at equal tokens was put on one design after seed 0's runs had finished: the time of that
    commit (110f948) against the runs' logs, and the comparison read the old way (each curve as logged) on seed 0
    and on all three seeds, beside the reading on one design."""
    data = runs_of("target_sum")
    page = _flat((REPO / "docs" / "results.md").read_text())
    ends = {log.parent.name: re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", log.read_text(), re.M)[-1]
            for log in (REPO / "results" / "target_sum").glob("*seed=0/run.log")}
    last = max(ends, key=ends.get)
    assert len(ends) == 3 and last == "experiment=grpo,seed=0" and ends[last] < "2026-12-04 22:35:23"
    assert f"110f948 (22:35:23 UTC), which puts every curve on one design, was committed after the last seed-0 run " \
           f"had finished (GRPO's, {ends[last][11:]} in its `run.log`)" in page

    def agon_minus_grpo(runs: pd.DataFrame, one_design: bool) -> pd.Series:
        budget = budget_table(data.steps, runs, evals=data.evals if one_design else None)
        return budget[(budget["x"] == "train/generated_tokens") & (budget["kind"] == "difference")
                      & budget["left"].str.contains("competitive") & (budget["right"].str.startswith("method=grpo"))
                      ].iloc[0]

    seed0 = data.runs[data.runs["seed"] == 0]
    old, new = agon_minus_grpo(seed0, False), agon_minus_grpo(seed0, True)
    old3, new3 = agon_minus_grpo(data.runs, False), agon_minus_grpo(data.runs, True)
    assert old3["mixed"] > 0 and new3["mixed"] == 0 and new3["value"] > old3["value"]
    assert f"Read that old way Agon − GRPO is {100 * old['value']:.1f} points on seed 0 " \
           f"({100 * new['value']:+.1f} on one design) and {100 * old3['value']:.1f} [{100 * old3['low']:+.1f}, " \
           f"{100 * old3['high']:+.1f}] over the three seeds, against {100 * new3['value']:+.1f} " \
           f"[{100 * new3['low']:+.1f}, {100 * new3['high']:+.1f}] above" in page


def test_the_target_sum_gate_and_wrong_recap_numbers_the_page_and_readme_quote_are_their_records():
    """The gate of the study's base, as its report records it (docs/target-sum-base-2026-12-04.json, the whole
    held-out split at the evaluation's temperature), and the diagnostic's wrong recap against none at step 200."""
    import json

    report = json.loads((REPO / "docs" / "target-sum-base-2026-12-04.json").read_text())
    gate = {k: v["mean"] for k, v in report["gate_300x4"]["by_temperature"]["1"].items() if isinstance(v, dict)}
    page, readme = _flat((REPO / "docs" / "results.md").read_text()), _readme_results()
    assert f"(`bases/{report['base']}`" in page and report["gate_300x4"]["problems"] == 300
    assert f"it is right {100 * gate['right']:.1f}% of the time after a right recap, {100 * gate['dead_end']:.1f}% " \
           f"after a dead end, {100 * gate['extendable']:.1f}% after an extendable one, {100 * gate['solo']:.1f}% " \
           f"alone and {100 * gate['cascade']:.1f}% as its own untrained cascade" in page
    cost = gate["solo"] - gate["dead_end"]
    assert f"after a dead end it is {100 * cost:.1f} points below its own accuracy alone" in page
    assert f"it is right {100 * gate['right']:.0f}% of the time after a right recap, but " \
           f"{100 * gate['dead_end']:.1f}% after a dead end against {100 * gate['solo']:.1f}% alone, so a wrong " \
           f"recap costs it {100 * cost:.0f} points" in readme
    # at step 200: wrong recap minus none, each arm's challengers averaged, then the seeds
    data = runs_of("target_sum")
    last = data.steps[data.steps["train/step"] == 200].set_index("run_id")
    gaps = {}
    for _, run in data.runs.iterrows():
        who = ["A"] if run["method"] == "grpo" else ["A", "B"]
        gaps.setdefault(run["experiment"], []).append(np.mean(
            [last.loc[run["run_id"], f"recap/{w}/wrong"] - last.loc[run["run_id"], f"recap/{w}/none"] for w in who]))
    gap = {arm: 100 * float(np.mean(v)) for arm, v in gaps.items()}
    assert abs(gap["agon"]) < 0.05 and gap["grpo"] < gap["cooperative"] < 0
    level = {(arm, k): 100 * float(np.mean([last.loc[r, [c for c in last.columns if c.startswith("recap/")
                                                          and c.endswith(f"/{k}") and "base" not in c]].mean()
                                            for r in data.runs[data.runs["experiment"] == arm]["run_id"]]))
             for arm in gaps for k in ("wrong", "none")}
    assert f"After a wrong recap it is {-gap['grpo']:.1f} points below its own accuracy with no recap " \
           f"({level['grpo', 'wrong']:.1f}% against {level['grpo', 'none']:.1f}%); Agon's challengers are not below " \
           f"theirs ({level['agon', 'wrong']:.1f}% and {level['agon', 'none']:.1f}%), the cooperative arm's are " \
           f"{-gap['cooperative']:.1f} points below ({level['cooperative', 'wrong']:.1f}% and " \
           f"{level['cooperative', 'none']:.1f}%)" in page
    assert f"its challengers are as accurate after a wrong recap as with none, where GRPO's adapter loses " \
           f"{-gap['grpo']:.1f} points: post hoc, and not separated from cooperative's ({-gap['cooperative']:.1f})" \
           in readme
    runs = data.runs.set_index("experiment")
    assert f"Agon against GRPO ({100 * runs.loc['agon', 'eval/accuracy'].mean():.1f}% vs " \
           f"{100 * runs.loc['grpo', 'eval/accuracy'].mean():.1f}%)" in readme


def _rows(task: str, run: str) -> pd.DataFrame:
    import gzip
    import json

    with gzip.open(REPO / "results" / task / run / "eval.jsonl.gz", "rt") as f:
        return pd.DataFrame([json.loads(line) for line in f])


def test_the_target_sum_controls_tables_and_prose_are_what_their_records_give(tmp_path):
    """The controls re-run (one seed of Agon and of GRPO, every evaluation at equal generations and with the check
    battery): its committed tables are what its packed runs give, the page quotes them, and every number of its prose
    recomputes from the eval rows and metrics: the start evaluations row for row the study's seed 0, the answers at one
    and two generations, a rival's reading against one's own on the same drafts, the leads built in before training
    and the battery after a wrong step against an empty recap."""
    data = load_runs(REPO / "results" / "target_sum_controls")
    assert sorted(data.runs["method"]) == ["agon", "grpo"] and (data.runs["status"] == "complete").all()
    assert set(data.runs["seed"]) == {0} and (data.runs["train/steps"] == 200).all()
    write_tables(data, tmp_path)
    committed = REPO / "docs" / "results" / "target_sum_controls"
    page = (REPO / "docs" / "results.md").read_text()
    section = page[page.index("### The controls, re-run"):page.index("## Latent exchange")]
    prose = " ".join(section.split())  # the prose as one line: its sentences wrap anywhere
    for name in ("generations.md", "battery.md", "table.md", "runs.md"):
        assert (tmp_path / name).read_text() == (committed / name).read_text(), name
    for name in ("generations.md", "battery.md"):
        for block in (tmp_path / name).read_text().split("\n\n"):
            if block.startswith("|"):
                assert block.strip() in section, name
    pct = lambda x: f"{100 * x:.1f}"  # noqa: E731

    # the start evaluations are the study's seed 0, row for row
    keys = ["order", "stage", "problem_id", "sample", "correct", "tokens"]
    for arm, run in (("agon", "eval.every=0,experiment=agon,seed=0"), ("grpo", "eval.every=0,experiment=grpo,seed=0")):
        new, old = _rows("target_sum_controls", run), _rows("target_sum", f"experiment={arm},seed=0")
        new = new[(new["phase"] == "start") & new["order"].isin(set(old["order"]))][keys].reset_index(drop=True)
        old = old[old["phase"] == "start"][keys].reset_index(drop=True)
        assert len(new) == {"agon": 28_800, "grpo": 4_800}[arm] and new.equals(old), arm
    assert "all 28,800 of Agon's rows and 4,800 of GRPO's agree" in prose

    def accuracy(run: str, phase: str, order: str) -> float:
        rows = _rows("target_sum_controls", run)
        return rows[(rows["phase"] == phase) & (rows["order"] == order) & (rows["stage"] == "final")]["correct"].mean()

    agon, grpo = "eval.every=0,experiment=agon,seed=0", "eval.every=0,experiment=grpo,seed=0"
    final = {o: accuracy(agon, "final", o) for o in ("A>B", "B>A", "A>A", "B>B", "A", "B")}
    start = {o: accuracy(agon, "start", o) for o in ("A>B", "B>A", "A", "B")}
    g_final = {o: accuracy(grpo, "final", o) for o in ("A", "A>A")}
    g_start = {o: accuracy(grpo, "start", o) for o in ("A", "A>A")}
    cascade, drafts = (final["A>B"] + final["B>A"]) / 2, (final["A"] + final["B"]) / 2
    summary = data.runs.set_index("method")
    assert summary.loc["agon", "eval/accuracy"] == pytest.approx(cascade)
    assert summary.loc["grpo", "eval/accuracy_two_generations"] == pytest.approx(g_final["A>A"])
    study = runs_of("target_sum").runs
    study_seed0 = {m: study[(study["experiment"] == m) & (study["seed"] == 0)]["eval/accuracy"].iloc[0]
                   for m in ("agon", "grpo")}
    assert (f"They end at {pct(cascade)}% (Agon's cascade; the study's seed 0, {pct(study_seed0['agon'])}%) and "
            f"{pct(g_final['A'])}% (GRPO's adapter; {pct(study_seed0['grpo'])}%)") in prose
    hours = summary["time/total_s"] / 3600
    commits = {c[:7] for c in summary["git_commit"]}
    assert (f"at {commits.pop()}, one torch thread each: {hours['agon']:.2f} wall hours for Agon, "
            f"{hours['grpo']:.2f} for GRPO") in prose and not commits
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"Agon's cascade is {pct(cascade - g_final['A>A'])} points above GRPO's adapter answering its own" in readme
    assert (f"Agon's cascade ends at {pct(cascade)}%, GRPO's adapter answering its own recap at "
            f"{pct(g_final['A>A'])}%: +{pct(cascade - g_final['A>A'])} for Agon") in prose
    assert (f"At one generation Agon's drafts ({pct(drafts)}%) are {pct(g_final['A'] - drafts)} points below GRPO's "
            f"adapter ({pct(g_final['A'])}%)") in prose
    assert (f"by {pct(final['A>B'] - final['A>A'])} points on A's drafts (A>B {pct(final['A>B'])}% against A>A "
            f"{pct(final['A>A'])}%) and {pct(final['B>A'] - final['B>B'])} on B's (B>A {pct(final['B>A'])}%") in prose
    s_cascade, s_drafts = (start["A>B"] + start["B>A"]) / 2, (start["A"] + start["B"]) / 2
    assert (f"by {pct(s_cascade - s_drafts)} points ({pct(s_cascade)}% against {pct(s_drafts)}%) and GRPO's adapter "
            f"answering its own recap led its drafts by {pct(g_start['A>A'] - g_start['A'])} "
            f"({pct(g_start['A>A'])}% against {pct(g_start['A'])}%)") in prose
    assert (f"At step 200 the leads are {pct(cascade - drafts)} and {pct(g_final['A>A'] - g_final['A'])} "
            "points") in prose

    # the battery: after a wrong step every adapter is near a quarter at the start and the end, far below empty
    steps = data.steps[data.steps["battery/n/right"].notna()]
    adapters = [(r, c) for r in data.runs["run_id"] for c in ("A", "B")
                if f"battery/{c}/right" in steps and steps[steps["run_id"] == r][f"battery/{c}/right"].notna().any()]
    assert len(adapters) == 3

    def at(run_id: str, step: int, key: str) -> float:
        rows = steps[(steps["run_id"] == run_id) & (steps["train/step"] == step)]
        return float(rows[key].iloc[0])

    wrong_end = [at(r, 200, f"battery/{c}/wrong_step") for r, c in adapters]
    wrong_start = [at(r, 0, f"battery/{c}/wrong_step") for r, c in adapters]
    empty_end = [at(r, 200, f"battery/{c}/empty") for r, c in adapters]
    assert (f"each adapter is right {round(100 * min(wrong_end))}-{round(100 * max(wrong_end))}% of the time at step "
            f"200, as at the start ({round(100 * min(wrong_start))}-{round(100 * max(wrong_start))}%), far below its "
            f"accuracy after an empty recap ({round(100 * min(empty_end))}-{round(100 * max(empty_end))}%)") in prose
    assert all(w < e - 0.4 for w, e in zip(wrong_end, empty_end))
    gains = {kind: [at(r, 200, f"battery/{c}/{kind}") - at(r, 0, f"battery/{c}/{kind}") for r, c in adapters]
             for kind in ("right", "dead_end", "empty")}
    assert (f"after a right prefix (by {round(100 * min(gains['right']))}-{round(100 * max(gains['right']))} points, "
            f"to 97%), after a dead end (by {round(100 * min(gains['dead_end']))}-"
            f"{round(100 * max(gains['dead_end']))} points) and with no recap (by {round(100 * min(gains['empty']))}-"
            f"{round(100 * max(gains['empty']))} points)") in prose
