"""The sweep's W&B report (``analysis.dashboard``), built offline for a two-cell, two-seed sweep of the test world
logged with ``logger=wandb`` offline: every chart's key is in the runs' W&B history (decoded from their ``.wandb``
files), the definition validates against wandb-workspaces' own models, and nothing reaches a server."""

from __future__ import annotations

import json

import pytest
import wandb
import wandb_workspaces.reports.v2 as wr
from wandb_workspaces.reports.v2 import internal

import analysis.dashboard as dashboard
from tests.wandb_records import CELLS, SEEDS, SWEEP_NAME, OfflineRun, shared_sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, agon_cache):
    return shared_sweep(tmp_path_factory)


@pytest.fixture(autouse=True)
def no_server(monkeypatch, tmp_path):
    """No key, and W&B's API unusable: building and writing the report must need neither."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))

    def refuse(*args, **kwargs):
        raise AssertionError("the dashboard contacted W&B")

    monkeypatch.setattr(wandb, "Api", refuse)


def _runsets(node):
    """Every run set of a stored report (they sit inside its panel grids)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "runSets":
                yield from value
            else:
                yield from _runsets(value)
    elif isinstance(node, list):
        for value in node:
            yield from _runsets(value)


def _history_keys(sweep) -> set[str]:
    return {k for cell in CELLS for seed in SEEDS for k in OfflineRun(sweep / f"{cell},seed={seed}").keys}


def test_every_chart_draws_keys_the_runs_logged_to_wandb(sweep):
    built = dashboard.build(sweep)
    assert built.missing == []
    history = _history_keys(sweep)
    assert built.keys() <= history, sorted(built.keys() - history)
    # what a researcher opens it for is there
    for title in ("held-out pass@1 (headline)", "conversion and regression", "final-stage trace length (tokens)",
                  "reward per role", "accuracy per adapter and role", "entropy per adapter and role (mean -log p "
                  "of sampled tokens)", "gradient norm per adapter (before clipping)", "clipped fraction",
                  "advantages", "throughput (completion tokens per second of generation)",
                  "cross-play: drafter > answerer", "recap diagnostic: challenger given a recap"):
        assert built.panels.get(title), title
    assert "crossplay/A>B" in built.panels["cross-play: drafter > answerer"]


def test_a_renamed_metric_is_reported_missing(sweep, monkeypatch):
    panels = dict(dashboard.SECTIONS)
    panels["Training"] = [*panels["Training"], dashboard.Panel("renamed", ["adapter/A/drafter/acc"])]
    monkeypatch.setattr(dashboard, "SECTIONS", panels)
    assert dashboard.build(sweep).missing == ["adapter/A/drafter/acc"]
    assert dashboard.main([str(sweep), "--offline"]) == 1


def test_the_definition_validates_and_groups_by_cell_with_a_band_over_seeds(sweep, capsys):
    assert dashboard.main([str(sweep), "--offline"]) == 0
    printed = capsys.readouterr().out
    assert "--publish" in printed and "wandb sync" in printed
    text = (sweep / dashboard.REPORT_FILE).read_text()
    spec = internal.ReportViewspec.model_validate_json(text)  # W&B's own model of a saved report
    report = wr.Report._from_model(spec)
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    assert grids and all(len(g.runsets) == 1 for g in grids)
    runset = grids[0].runsets[0]
    assert SWEEP_NAME in str(runset.filters) and "Group" in str(runset.filters)
    # grouped by job type (the cell): W&B stores it as the run attribute jobType
    grouping = [rs["grouping"] for rs in _runsets(json.loads(text))]
    assert grouping and all(g == [{"section": "run", "name": "jobType"}] for g in grouping), grouping
    lines = [p for g in grids for p in g.panels if isinstance(p, wr.LinePlot)]
    assert lines and all(p.groupby_aggfunc == "mean" and p.groupby_rangefunc == "minmax" for p in lines)
    drawn = {m.name if hasattr(m, "name") else str(m) for p in lines for m in p.y}
    assert drawn <= _history_keys(sweep)
    # the tables of results and claims are in the report as text
    assert "claims" in text.lower() and "competitive" in text
    # the claims' intervals have the evaluation floor under their pooled SD, as make figures's claims.md does
    assert "no evaluation floor" not in text
    assert "The recap diagnostic and cross-play, per cell" in text  # diagnostic.md, the sweep ran eval.diagnostic


def test_make_figures_attaches_its_figures_to_the_sweeps_report(sweep, tmp_path, monkeypatch):
    """``python -m analysis.figures --runs <sweep> --wandb``: a W&B run of the sweep's group, job type figures,
    holding every figure; the report then shows exactly those keys."""
    from analysis.figures import main as figures_main

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    out = tmp_path / "figures"
    try:
        assert figures_main(["--runs", str(sweep), "--out", str(out), "--wandb"]) == 0
        offline = OfflineRun(out)
        assert offline.run.run_group == SWEEP_NAME and offline.run.job_type == "figures"
        assert "figures/accuracy_grid/_type" in offline.keys and "figures/table/_type" in offline.keys
        built = dashboard.build(sweep)
        assert "figures/accuracy_grid" in built.panels["figures"]
        assert {f"{k}/_type" for k in built.panels["figures"]} <= offline.keys
        media = [p for b in built.report.blocks if isinstance(b, wr.PanelGrid) for p in b.panels
                 if isinstance(p, wr.MediaBrowser)]
        assert len(media) == 1 and media[0].media_keys == built.panels["figures"]
    finally:
        (sweep / dashboard.FIGURES_FILE).unlink(missing_ok=True)
        # the W&B run was in this process: its service (wandb-core, a child process) would outlive the test, and the
        # sandbox's tests count every child process of the session as one a program left behind
        wandb.teardown()


def test_the_report_names_the_check_battery_and_the_keys_at_equal_generations(tmp_path):
    """A copy of the analysis fixture's grid sweep whose last evaluation also logged the check battery and the
    numbers at one and two generations per answer: the report draws the battery as a family of bars (its counts,
    ``battery/n/*``, left out, as the recap family leaves out ``recap/n_wrong``) and the equal-generation keys
    among the held-out evaluation's lines."""
    import shutil

    from tests.analysis.test_analysis import GRID

    sweep = tmp_path / "2026-11-30" / "10-00-00"
    shutil.copytree(GRID, sweep)
    extra = {"eval/accuracy_one_generation": 0.5, "eval/accuracy_two_generations": 0.75,
             "eval/cascade_acc_AA": 0.6, "eval/cascade_acc_BB": 0.7, "eval/generations": 2,
             "battery/A/right": 0.9, "battery/B/wrong_step": 0.3, "battery/base/empty": 0.5,
             "battery/n/right": 4.0, "battery/n/wrong_step": 4.0, "battery/n/empty": 4.0}
    for metrics in sweep.glob("*/metrics.jsonl"):
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        last = max(r["train/step"] for r in rows)
        rows.append({"train/step": last, **extra})
        metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    built = dashboard.build(sweep)
    assert built.panels["check battery: answerer after a recap of each kind"] == [
        "battery/A/right", "battery/B/wrong_step", "battery/base/empty"]
    assert built.panels["equal generations: one and two per answer, self-cascades"] == [
        "eval/accuracy_one_generation", "eval/accuracy_two_generations", "eval/cascade_acc_AA",
        "eval/cascade_acc_BB"]
    text = json.dumps(built.definition())
    assert "battery/B/wrong_step" in text and "eval/accuracy_two_generations" in text
    assert "battery/n/right" not in text
    # and the check battery's table beside the recap diagnostic's
    assert "The check battery, per cell and answerer" in text
