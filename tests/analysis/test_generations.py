"""The arms at equal generations per answer (``analysis.tables.generation_runs`` and ``generations.md``), claims
matched on steps, tokens or generations (``analysis.claims``), and the check battery (``battery.md`` and the
``battery`` figure), on runs built by hand where every number a wrong reading would pick differs from the right one.

The study by hand (``study``): Agon, cooperative and GRPO on target sum, 3 seeds each, final evaluation 300 x 16:

    arm          headline (steps)   two generations          self-cascades         one generation
    agon         .80 .81 .82        = headline (A>B, B>A)    A>A .60-.62, B>B .64   .70
    cooperative  .78 .79 .80        = headline               A>A .50, B>B .50       .69
    grpo         .70 .71 .72 (A)    A>A .90 .91 .92          A>A (the same)         = headline

so at equal generations Agon - GRPO is .81 - .91 = -.10, at equal steps .81 - .71 = +.10; reading Agon's own
self-cascade (.61) or GRPO's headline (.71) gives neither. Runs from before the main evaluation played the
self-cascades (``old=True``) have none of those keys, and the diagnostic's cross-play at the final evaluation
(300 problems x 1 sample) in their place: Agon's A>B .85 and B>A .87 (its cascade, .86), its A>A and B>B .50;
GRPO's A>A .93.
"""

from __future__ import annotations

import math
from importlib import resources

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import yaml

from agon.core.methods import METHODS
from analysis.claims import CLAIMS, Claim, claims_markdown, claims_table, parse_claims
from analysis.load import RunRecord, frames
from analysis.paired import budget_table
from analysis.tables import (DIAGNOSTIC, MAIN, battery_markdown, battery_table, equal_generations,
                             equal_generations_markdown, generation_differences, generation_runs, results_table,
                             write_tables)

HEADLINE = {"agon": [0.80, 0.81, 0.82], "cooperative": [0.78, 0.79, 0.80], "grpo": [0.70, 0.71, 0.72]}
GRPO_SELF = [0.90, 0.91, 0.92]
AT_GENERATIONS = Claim("Agon beats GRPO at equal generations", "agon", "grpo", "greater", "after",
                       match="generations")
AT_STEPS = Claim("Agon beats GRPO", "agon", "grpo", "greater", "before")


def _final(experiment: str, seed: int, old: bool) -> dict:
    """One run's final-evaluation numbers (the module docstring's table)."""
    headline = HEADLINE[experiment][seed]
    grpo = experiment == "grpo"
    out = {"eval/accuracy": headline, "eval/n_problems": 300, "eval/samples": 16, "eval/solo_acc_A": 0.70,
           "eval/headline_orders": ["A"] if grpo else ["A>B", "B>A"]}
    if grpo:
        out["eval/solo_acc_A"] = headline
    else:
        out.update({"eval/solo_acc_B": 0.70 if experiment == "agon" else 0.68, "eval/cascade_acc_AB": headline,
                    "eval/cascade_acc_BA": headline})
    if old:  # the diagnostic's cross-play in their place
        crossplay = {"A>A": 0.93} if grpo else {"A>B": 0.85, "B>A": 0.87, "A>A": 0.50, "B>B": 0.50}
        out.update({f"crossplay/{o}": v for o, v in crossplay.items()})
        for adapter in ("A",) if grpo else ("A", "B"):
            out.update({f"recap/{adapter}/{c}": 0.5 for c in ("rival", "rival_right", "rival_wrong", "none")})
        out["recap/n_wrong"] = 300.0
        return out
    two = GRPO_SELF[seed] if grpo else headline
    out.update({"eval/generations": 1 if grpo else 2, "eval/accuracy_two_generations": two,
                "eval/accuracy_one_generation": out["eval/solo_acc_A"] if grpo else
                (out["eval/solo_acc_A"] + out["eval/solo_acc_B"]) / 2,
                "eval/cascade_acc_AA": two if grpo else 0.60 + 0.01 * seed})
    if not grpo:
        out["eval/cascade_acc_BB"] = 0.64 if experiment == "agon" else 0.50
        if experiment == "cooperative":
            out["eval/cascade_acc_AA"] = 0.50
    return out


def record(experiment: str, seed: int, old: bool = False, battery: list[dict] | None = None,
           task: str = "target_sum") -> RunRecord:
    """A run as ``agon.run`` writes it: its summary (the final evaluation's numbers, the config's diagnostic
    samples), an evaluation row at step 0 and at step 200 (``battery``: more keys for rows at steps 0, 100, 200)."""
    method = "grpo" if experiment == "grpo" else "agon"
    final = _final(experiment, seed, old)
    summary = {"method": method, "reward": "cooperative" if experiment == "cooperative" else "competitive",
               "exchange": "visible", "rotation": "alternate", "init": "divergent", "task": task,
               "model": "tiny", "model_label": "tiny (offline)", "experiment": experiment, "seed": seed,
               "method_axes": list(METHODS[method].axes), "method_label": METHODS[method].label,
               "config": {"eval": {"diagnostic_samples": 1}}, **final}
    logged = {k: v for k, v in final.items() if not isinstance(v, list)}
    start = {k: v - 0.1 if k.startswith("eval/") and "acc" in k else v for k, v in logged.items()}
    summary["eval/accuracy_at_start"] = start["eval/accuracy"]
    metrics = [{"train/step": 0, **start}, {"train/step": 200, **logged}]
    if battery:
        metrics = [{**row, **extra} for row, extra in zip([metrics[0], {"train/step": 100}, metrics[1]], battery)]
    return RunRecord(run_id=f"{experiment}/{seed}", summary=summary,
                     overrides=[f"experiment={experiment}", f"seed={seed}"], metrics=metrics)


def study(old: set[str] = frozenset(), **kwargs):
    """The three arms x 3 seeds; the arms in ``old`` from before the main evaluation played the self-cascades."""
    return frames([record(e, s, e in old, **kwargs) for e in HEADLINE for s in range(3)])


# ---------------------------------------------------------------------------------------------------------------
# the equal-generations table


def test_the_equal_generations_table_reads_grpos_self_cascade_and_agons_headline():
    data = study()
    arms = equal_generations(generation_runs(data)).set_index("cell")
    agon, cooperative, grpo = (arms.loc[c] for c in ("competitive · visible", "cooperative · visible", "GRPO"))
    assert agon["two"] == pytest.approx(0.81) and agon["headline"] == pytest.approx(0.81)
    assert grpo["two"] == pytest.approx(0.91) and grpo["headline"] == pytest.approx(0.71)  # A>A, not A
    assert cooperative["two"] == pytest.approx(0.79)
    assert (agon["one"], grpo["one"]) == (pytest.approx(0.70), pytest.approx(0.71))
    assert (agon["generations"], grpo["generations"]) == (2, 1)
    assert set(arms["source"]) == {MAIN} and set(arms["design"]) == {"300 x 16"}
    assert grpo["orders"] == ["A>A"] and agon["orders"] == ["A>B", "B>A"]
    differences = generation_differences(generation_runs(data)).set_index(["left", "right"])
    keys = dict(zip(arms.index, arms["cell_key"]))
    diff = differences.loc[(keys["competitive · visible"], keys["GRPO"])]
    assert diff["difference"] == pytest.approx(-0.10) and diff["low"] < -0.10 < diff["high"]
    md = equal_generations_markdown(data)
    assert "| GRPO | 3 | 1 | 71.0 | 91.0 | 71.0 | main evaluation (A>A), 300 x 16 |" in md
    assert "| competitive · visible | 3 | 2 | 70.0 | 81.0 | 81.0 | main evaluation (A>B, B>A), 300 x 16 |" in md
    assert "| competitive · visible − GRPO | 3 vs 3 | -10.0 [" in md


def test_runs_from_before_the_self_cascades_fall_back_to_the_diagnostics_cross_play():
    """Agon's cascade in the diagnostic (.85 and .87: .86), never its own recap's .50; GRPO's A>A .93; each with the
    binomial SD over its 300 x 1 answers per order as its floor, and the source named in the table."""
    data = study(old={"agon", "cooperative", "grpo"})
    per_run = generation_runs(data)
    assert set(per_run["source"]) == {DIAGNOSTIC} and set(per_run["design"]) == {"300 x 1"}
    arms = equal_generations(per_run).set_index("cell")
    assert arms.loc["competitive · visible", "two"] == pytest.approx(0.86)
    assert arms.loc["GRPO", "two"] == pytest.approx(0.93)
    # one generation from the same evaluation's solo accuracies; generations from the headline's orders
    assert arms.loc["competitive · visible", "one"] == pytest.approx(0.70)
    assert arms.loc["GRPO", "one"] == pytest.approx(0.71)
    assert (arms.loc["competitive · visible", "generations"], arms.loc["GRPO", "generations"]) == (2, 1)
    floors = per_run.set_index("cell")["floor"]
    assert floors["GRPO"].iloc[0] == pytest.approx(math.sqrt(0.93 * 0.07 / 300))
    assert floors["competitive · visible"].iloc[0] == pytest.approx(math.sqrt(0.86 * 0.14 / 600))
    md = equal_generations_markdown(data)
    assert "| GRPO | 3 | 1 | 71.0 | 93.0 | 71.0 | diagnostic cross-play (A>A), 300 x 1 |" in md
    assert "diagnostic cross-play (A>B, B>A), 300 x 1 |" in md


def test_a_pair_of_arms_read_from_different_sources_gets_no_interval():
    data = study(old={"grpo"})
    md = equal_generations_markdown(data)
    assert "| competitive · visible − GRPO | 3 vs 3 | -12.0 (numbers from different sources: no interval) |" in md
    assert "| competitive · visible − cooperative · visible | 3 vs 3 | +2.0 [" in md


def test_no_table_without_an_answer_at_two_generations(tmp_path):
    records = [record(e, 0) for e in HEADLINE]
    for r in records:  # neither the self-cascades nor the diagnostic
        r.summary = {k: v for k, v in r.summary.items() if k != "eval/accuracy_two_generations"}
    data = frames(records)
    assert equal_generations_markdown(data) == ""
    assert not (tmp_path / "generations.md").exists() and "generations.md" not in [
        p.name for p in write_tables(data, tmp_path)]
    assert "generations.md" in [p.name for p in write_tables(study(), tmp_path / "with")]


# ---------------------------------------------------------------------------------------------------------------
# claims name their match


def test_a_claim_at_equal_generations_reads_the_self_cascade_of_one_adapter_and_the_headline_of_a_cascade():
    data = study()
    table = claims_table(data.runs, claims=[AT_STEPS, AT_GENERATIONS]).set_index("claim")
    steps, generations = table.loc[AT_STEPS.text], table.loc[AT_GENERATIONS.text]
    assert (steps["left_mean"], steps["right_mean"]) == (pytest.approx(0.81), pytest.approx(0.71))
    assert (generations["left_mean"], generations["right_mean"]) == (pytest.approx(0.81), pytest.approx(0.91))
    assert generations["difference"] == pytest.approx(-0.10) and steps["difference"] == pytest.approx(0.10)
    assert (steps["match"], generations["match"]) == ("steps", "generations")
    assert generations["reading"] == "main evaluation, 300 x 16" and steps["reading"] == ""
    md = claims_markdown(claims_table(data.runs, claims=[AT_STEPS, AT_GENERATIONS]))
    assert "| Agon beats GRPO | before | agon vs grpo | steps | 3 vs 3 | 81.0 vs 71.0 |" in md
    assert ("| Agon beats GRPO at equal generations | after | agon vs grpo | generations (main evaluation, 300 x 16) "
            "| 3 vs 3 | 91.0" not in md)
    assert ("| Agon beats GRPO at equal generations | after | agon vs grpo | generations (main evaluation, 300 x 16) "
            "| 3 vs 3 | 81.0 vs 91.0 |") in md
    assert "At equal generations (`generations`)" in md


def test_a_claim_at_equal_generations_falls_back_to_the_diagnostic_and_never_mixes_sources():
    old = claims_table(study(old={"agon", "cooperative", "grpo"}).runs, claims=[AT_GENERATIONS]).iloc[0]
    assert (old["left_mean"], old["right_mean"]) == (pytest.approx(0.86), pytest.approx(0.93))
    assert old["reading"] == "diagnostic cross-play, 300 x 1"
    # the pool's floor: the largest binomial SD of one run's number, GRPO's .93 over 300 answers (above a cascade's
    # .86 over its 600: two orders)
    assert old["eval_floor"] == pytest.approx(math.sqrt(0.93 * 0.07 / 300))
    assert old["eval_floor"] > math.sqrt(0.86 * 0.14 / 600)
    mixed = claims_table(study(old={"grpo"}).runs, claims=[AT_GENERATIONS]).iloc[0]
    assert math.isnan(mixed["difference"]) and mixed["verdict"].startswith("not testable")
    assert "diagnostic cross-play and main evaluation" in mixed["verdict"]


def test_a_change_claim_at_equal_generations_needs_the_main_evaluation_at_the_start():
    claim = Claim("gains more at equal generations", "agon", "grpo", "greater", "after", measure="change",
                  match="generations")
    new = claims_table(study().runs, claims=[claim]).iloc[0]
    assert new["difference"] == pytest.approx(0.0)  # every start is its final minus .1
    old = claims_table(study(old={"agon", "cooperative", "grpo"}).runs, claims=[claim]).iloc[0]
    assert old["verdict"].startswith("not testable") and "at the start" in old["verdict"]


def test_a_claim_at_equal_tokens_reads_each_curve_as_the_budget_table_does():
    """Two runs' curves (test_paired's): at 2,000 generated tokens, where both end or pass, agon reads .5 and grpo
    .2 + .2 x 2/3; without the steps frame no claim at equal tokens is put."""
    rows = [("r1", 0, math.nan, 0.1), ("r1", 50, 1000, 0.3), ("r1", 100, 2000, 0.5),
            ("r2", 0, math.nan, 0.2), ("r2", 50, 3000, 0.4), ("r2", 100, 6000, 0.6), ("r2", 150, 9000, 0.7)]
    steps = pd.DataFrame([{"run_id": r, "train/step": s, "train/generated_tokens": t, "eval/accuracy": a,
                           "eval/n_problems": 100, "eval/samples": 4} for r, s, t, a in rows])
    runs = pd.DataFrame({"run_id": ["r1", "r2"], "experiment": ["agon", "grpo"], "method": ["agon", "grpo"],
                         "status": "complete", "eval/accuracy": [0.5, 0.7]})
    claim = Claim("Agon beats GRPO at equal tokens", "agon", "grpo", "greater", "after", match="tokens")
    row = claims_table(runs, claims=[claim], steps=steps).iloc[0]
    budget = budget_table(steps, runs.assign(cell_key=runs["experiment"]))
    read = budget[(budget["x"] == "train/generated_tokens") & (budget["kind"] == "arm")].set_index("left")
    assert row["left_mean"] == pytest.approx(read.loc["agon", "value"]) == pytest.approx(0.5)
    assert row["right_mean"] == pytest.approx(read.loc["grpo", "value"]) == pytest.approx(0.2 + 0.2 * 2 / 3)
    assert row["eval_floor"] == pytest.approx(read.loc["agon", "floor"])
    assert row["reading"] == "at 2,000 generated tokens" and row["match"] == "tokens"
    assert claims_table(runs, claims=[claim]).empty


def test_every_claim_names_its_match_and_a_match_is_checked_when_the_file_is_read():
    raw = yaml.safe_load(resources.files("analysis").joinpath("claims.yaml").read_text())
    assert all(c.get("match") in ("steps", "tokens", "generations") for c in raw["claims"])
    assert {c.match for c in CLAIMS if c.metric.startswith("paired/")} == {"steps"}
    added = {c.text: c for c in CLAIMS if c.match == "generations"}
    assert set(added) == {"Agon beats GRPO at equal generations (two per answer)",
                          "Agon beats cooperative at equal generations (two per answer)"}
    assert {(c.left, c.right, c.written, c.task) for c in added.values()} == {
        ("agon", "grpo", "after", "target_sum"), ("agon", "cooperative", "after", "target_sum")}
    base = {k: v for k, v in raw.items() if k != "claims"}
    for bad, why in (({"match": "flops"}, "match must be one of"),
                     ({"match": "generations", "metric": "eval/final_trace_tokens"}, "compares two cells"),
                     ({"match": "tokens", "measure": "change"}, "reads a final value")):
        claim = {"text": "x", "left": "agon", "right": "grpo", "direction": "greater", "written": "after", **bad}
        with pytest.raises(ValueError, match=why):
            parse_claims({**base, "claims": [claim]})
    with pytest.raises(ValueError, match="compares two cells"):
        parse_claims({**base, "claims": [{"text": "x", "cell": "agon", "than": 0.0, "direction": "greater",
                                          "written": "after", "metric": "paired/cascade_minus_solo",
                                          "match": "generations"}]})


def test_the_target_sum_claims_at_equal_generations_are_descriptions():
    data = study()
    table = claims_table(data.runs).set_index("claim")
    for text in ("Agon beats GRPO at equal generations (two per answer)",
                 "Agon beats cooperative at equal generations (two per answer)"):
        assert table.loc[text, "verdict"] == "description (written after its runs)"
    assert table.loc["Agon beats GRPO at equal generations (two per answer)", "difference"] == pytest.approx(-0.10)
    assert table.loc["Agon beats cooperative at equal generations (two per answer)", "difference"] == \
        pytest.approx(0.02)
    # put to target sum alone
    other = frames([record(e, s, task="arithmetic") for e in HEADLINE for s in range(3)])
    assert not claims_table(other.runs)["match"].eq("generations").any()


# ---------------------------------------------------------------------------------------------------------------
# the check battery

# per step (0, 100, 200): each answerer's accuracy after a recap of each kind; target sum makes no dead end for
# these rows (nan, n 0); the interim evaluation is smaller (n 100)
BATTERY = {"right": (0.90, 0.92, 0.96), "wrong_step": (0.30, 0.40, 0.50), "dead_end": (math.nan,) * 3,
           "empty": (0.50, 0.60, 0.70)}
COUNTS = {"right": (300, 100, 300), "wrong_step": (280, 90, 280), "dead_end": (0, 0, 0), "empty": (300, 100, 300)}


def battery_rows(adapters: tuple[str, ...], shift: float = 0.0) -> list[dict]:
    rows = []
    for i in range(3):
        row = {f"battery/n/{k}": float(n[i]) for k, n in COUNTS.items()}
        for answerer in (*adapters, "base"):
            # the base is not trained: its accuracies stay at the start's
            at = 0 if answerer == "base" else i
            row.update({f"battery/{answerer}/{k}": v[at] + (shift if answerer != "base" and at else 0.0)
                        for k, v in BATTERY.items()})
        rows.append(row)
    return rows


def battery_study():
    return frames([record(e, s, battery=battery_rows(("A",) if e == "grpo" else ("A", "B"), 0.01 * s))
                   for e in HEADLINE for s in range(3)])


def test_the_battery_table_gives_each_answers_accuracy_at_the_start_and_the_end_with_its_counts():
    data = battery_study()
    frame = battery_table(data, results_table(data)).set_index(["cell", "answerer", "kind"])
    assert list(frame.index.get_level_values("kind").unique()) == ["right", "wrong_step", "dead_end", "empty"]
    row = frame.loc[("competitive · visible", "B", "wrong_step")]
    # seeds end at .50, .51, .52: mean .51; start .30 for all
    assert (row["start"], row["end"], row["change"]) == (pytest.approx(0.30), pytest.approx(0.51),
                                                         pytest.approx(0.21))
    assert (row["n_start"], row["n_end"], row["seeds"]) == (280, 280, 3)
    assert row["end_by_seed"] == {0: pytest.approx(0.50), 1: pytest.approx(0.51), 2: pytest.approx(0.52)}
    base = frame.loc[("GRPO", "base", "empty")]
    assert base["start"] == base["end"] == pytest.approx(0.50) and base["change"] == pytest.approx(0.0)
    dead = frame.loc[("competitive · visible", "A", "dead_end")]
    assert math.isnan(dead["end"]) and dead["n_end"] == 0
    assert ("GRPO", "B", "right") not in frame.index  # one adapter
    md = battery_markdown(battery_table(data, results_table(data)))
    assert ("| competitive · visible | adapter B | wrong step shown | 280 | 280 | 3 | 30.0 | 50.0 | 51.0 | 52.0 | "
            "51.0 | +21.0 |") in md
    assert "| GRPO | adapter A | dead end | 0 | 0 | 3 | - | - | - | - | - | - |" in md


def test_the_battery_is_drawn_and_written_where_runs_logged_it_and_nowhere_else(tmp_path):
    from analysis.figures import PAGE_WIDTH, battery_figure, make_figures
    from tests.analysis.test_figures_print import colours, cvd_distance

    import analysis.figures as figures

    data = battery_study()
    fig = battery_figure(data, results_table(data))
    # rows: Agon's and cooperative's A, B and base, GRPO's A and base; three panels; the legend names the 3 kinds
    # drawn (the task made no dead end: nothing drawn, nothing named)
    assert len(fig.axes) == 3 and len(fig.axes[0].get_yticklabels()) == 8
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["right prefix", "wrong step shown", "empty recap"]
    assert fig.get_size_inches()[0] == PAGE_WIDTH <= 7.0
    texts = [t for t in fig.findobj(plt.Text) if t.get_visible() and t.get_text().strip()]
    assert min(t.get_fontsize() for t in texts) >= figures.MIN_FONT
    found = sorted(colours(fig))
    assert all(cvd_distance(a, b) >= figures.CVD_MIN_DISTANCE for i, a in enumerate(found) for b in found[i + 1:]
               if not (max(a) - min(a) < 0.08 and max(b) - min(b) < 0.08))
    plt.close(fig)
    names = [p.name for p in make_figures(data, tmp_path / "with")]
    assert {"battery.png", "battery.pdf", "battery.md", "generations.md"} <= set(names)
    plain = study()
    assert battery_figure(plain, results_table(plain)) is None
    assert not {"battery.md"} & {p.name for p in write_tables(plain, tmp_path / "without")}
    assert battery_markdown(battery_table(plain, results_table(plain))) == ""
