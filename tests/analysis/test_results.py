"""The committed results: docs/results.md's tables are what the packed runs in results/ give today.

A change to the packed files, to the analysis code or to the page that makes them disagree fails here, so the
page cannot drift from the runs it reports. Figures are not compared (their bytes depend on matplotlib's version);
they are drawn from the same tables.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from analysis import load_runs
from analysis.claims import CLAIMS, DESCRIPTION, claims_markdown, claims_table
from analysis.paired import eval_curve, on_smallest_design, recap_kind, write_paired
from analysis.patterns import solutions, write_patterns
from analysis.tables import final_rows, write_tables

REPO = Path(__file__).resolve().parents[2]
# results/runs/ is where sweeps write on this machine (ignored by git); a *_pilot directory is a pilot's runs
PACKED = sorted(p.name for p in (REPO / "results").iterdir() if p.is_dir() and p.name != "runs") \
    if (REPO / "results").is_dir() else []
TASKS = [name for name in PACKED if not name.endswith(("_pilot", "_pick"))]
# each packed grid's cells, 3 seeds each: the paper's design on a task, or the exchange ablation (its claims name
# cells by their exchange, analysis/claims.yaml)
CELLS = {"arithmetic_hard": 10, "products": 10, "exchange": 4, "target_sum": 3}


def test_every_packed_task_has_its_figures_and_a_section_of_the_page():
    assert TASKS == sorted(CELLS) and PACKED == [*TASKS, "target_sum_pick", "target_sum_pilot"]
    page = (REPO / "docs" / "results.md").read_text()
    for task in TASKS:
        for figure in ("accuracy_grid", "claims_forest", "recap_diagnostic", "training_curves"):
            assert f"results/{task}/{figure}.png" in page, (task, figure)
            assert (REPO / "docs" / "results" / task / f"{figure}.png").is_file(), (task, figure)


@pytest.mark.parametrize("task", TASKS)
def test_the_committed_tables_are_what_the_packed_runs_give(task, tmp_path):
    data = load_runs(REPO / "results" / task)
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
    data = load_runs(REPO / "results" / "target_sum_pick")
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
    # the step count was fixed (b0e22c0, its time as the page states it) between step 175's evaluation and 200's
    logged = {m.group(2): m.group(1) for m in re.finditer(r"\[2026-12-04 ([0-9:]{8}),\d+\].*eval step (\d+):",
                                                         (REPO / "results" / "target_sum_pick" /
                                                          "grpo_lr1e-3" / "run.log").read_text())}
    assert logged["175"] < "19:49:55" < logged["200"]
    assert "(b0e22c0, 19:49:55 UTC)" in page
    assert f"step 175's evaluation at {logged['175']} and step 200's at {logged['200']}" in page


def test_the_target_sum_pilot_table_is_what_its_packed_runs_give():
    """docs/results.md's target-sum pilot: each row of its curve table, recomputed from the packed metrics."""
    data = load_runs(REPO / "results" / "target_sum_pilot")
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
        data = load_runs(REPO / "results" / task)
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
    data = load_runs(REPO / "results" / task)
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
    data = load_runs(REPO / "results" / task)  # the eval rows give the within-run claims their values
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
    data = load_runs(REPO / "results" / "target_sum_pilot")
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
    data = load_runs(REPO / "results" / "target_sum")
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
    assert f"wrong minus no recap is {seeds['grpo'].replace('+', '')} points for GRPO, {seeds['agon']} for Agon" in page
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
