"""A sweep's W&B report, defined in code with W&B's own library (``wandb-workspaces``: ``reports.v2``).

    python -m analysis.dashboard multirun/2026-11-30/10-00-00          # offline: writes <sweep>/wandb_report.json
    python -m analysis.dashboard multirun/2026-11-30/10-00-00 --publish  # saves it to W&B, prints its URL
    make dashboard RUNS=multirun/2026-11-30/10-00-00

The report shows the sweep's runs (W&B ``group`` = the sweep, as ``agon.records.wandb_logger`` names it) grouped by
``job_type`` (the cell), so every chart draws one line per cell, the mean over its seeds with their range as a band:

    Held-out evaluation   pass@1, the cascades and each adapter alone, one and two generations per answer and
                          the self-cascades, conversion and regression, trace length
    Training              reward, accuracy, per adapter (``adapter/A/*``, ``adapter/B/*``: accuracy, reward,
                          entropy per role, gradient norm), advantages, clipped fraction, importance-sampling ratio
                          and sampler mismatch (vLLM), KL (beta != 0), divergence of the adapters
    Systems               tokens per second, step and generation time, peak GPU memory
    Diagnostics           cross-play, the recap diagnostic and the check battery at the last evaluation, as bars
                          per cell
    Results and claims    the results table, the claims with their intervals, the arms at equal generations,
                          the diagnostic and the check battery (``analysis.tables``, ``analysis.claims``), as
                          Markdown written from the sweep's run directories
    Figures               ``make figures``' figures, once logged with ``--wandb`` (below)

Every chart names metric keys that the sweep's runs logged: ``PANELS`` lists each key, and a key that can be absent
for a reason (``OPTIONAL``: vLLM only, CUDA only, beta != 0, the diagnostic off, a one-adapter method) is dropped
when no run has it; any other missing key is reported (``Dashboard.missing``) and the command fails, so a renamed
metric cannot leave an empty chart. The keys come from the run directories' ``metrics.jsonl``, which W&B mirrors
row for row.

Offline (no W&B login, or ``--offline``), the report's full definition (W&B's ``ReportViewspec``, the JSON the W&B
app stores) goes to ``<sweep>/wandb_report.json``, and the command says how to publish it. With a login,
``--publish`` (the default when an API key is found) saves it in the project and prints its URL.

``python -m analysis.figures --runs <sweep> --wandb`` logs the paper's figures and table as a run of the sweep's
group (job type ``figures``, ``log_figures``) and records their keys in ``<sweep>/wandb_figures.json``; the report
then shows them in a section of its own.

Left out on purpose: a saved workspace (a report is shareable and versioned, a workspace is per user).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agon.records.run_files import sweep_name

ROLES = ("drafter", "challenger")
ADAPTERS = ("A", "B")
REPORT_FILE = "wandb_report.json"
# written into a sweep by ``log_figures``: the W&B keys of the figures it logged, for the report to show them
FIGURES_FILE = "wandb_figures.json"
FIGURES_JOB = "figures"


def _per(template: str, **axes: tuple[str, ...]) -> list[str]:
    """``template`` formatted for every combination of ``axes`` (``_per("adapter/{a}/grad_norm", a=ADAPTERS)``)."""
    keys = [template]
    for name, values in axes.items():
        keys = [k.replace("{" + name + "}", v) for k in keys for v in values]
    return keys


@dataclass(frozen=True)
class Panel:
    title: str
    keys: list[str]
    # line: over train/step, a band over seeds; bar: each cell's value at its last evaluation
    kind: str = "line"
    # a key that starts with one of these is a family (crossplay/...): every key of it the runs logged is drawn
    prefix: str = ""
    # keys of a family that are counts, not accuracies: left out of its bars
    counts: tuple[str, ...] = ("/n_wrong",)


SECTIONS: dict[str, list[Panel]] = {
    "Held-out evaluation": [
        Panel("held-out pass@1 (headline)", ["eval/accuracy"]),
        Panel("cascades and each adapter alone",
              ["eval/cascade_acc_AB", "eval/cascade_acc_BA", "eval/solo_acc_A", "eval/solo_acc_B"]),
        # arms with one and two generations per answer compared at equal ones: the headline's drafters alone, the
        # headline at two (a one-generation method's self-cascade), and each adapter answering its own drafts
        Panel("equal generations: one and two per answer, self-cascades",
              ["eval/accuracy_one_generation", "eval/accuracy_two_generations", "eval/cascade_acc_AA",
               "eval/cascade_acc_BB"]),
        Panel("conversion and regression", ["eval/conversion_rate", "eval/regression_rate"]),
        Panel("final-stage trace length (tokens)", ["eval/final_trace_tokens", "train/final_trace_tokens"]),
    ],
    "Training": [
        Panel("reward per role", _per("role/{r}/reward/mean", r=ROLES)),
        Panel("training accuracy", ["train/accuracy", *_per("role/{r}/accuracy", r=ROLES)]),
        Panel("accuracy per adapter and role", _per("adapter/{a}/{r}/accuracy", a=ADAPTERS, r=ROLES)),
        Panel("reward per adapter and role", _per("adapter/{a}/{r}/reward/mean", a=ADAPTERS, r=ROLES)),
        Panel("completion length per adapter and role",
              _per("adapter/{a}/{r}/completion_tokens", a=ADAPTERS, r=ROLES)),
        Panel("entropy per adapter and role (mean -log p of sampled tokens)",
              _per("adapter/{a}/{r}/entropy", a=ADAPTERS, r=ROLES)),
        Panel("gradient norm per adapter (before clipping)", _per("adapter/{a}/grad_norm", a=ADAPTERS)),
        Panel("KL to the base per adapter", _per("adapter/{a}/{r}/kl", a=ADAPTERS, r=ROLES)),
        Panel("advantages", _per("role/{r}/advantages/mean", r=ROLES) + _per("role/{r}/advantages/std", r=ROLES)),
        Panel("clipped fraction", _per("role/{r}/clip_ratio/region_mean", r=ROLES)
              + _per("role/{r}/clip_ratio/low", r=ROLES) + _per("role/{r}/clip_ratio/high", r=ROLES)),
        Panel("importance-sampling ratio (vLLM correction)",
              _per("role/{r}/sampling/importance_sampling_ratio/mean", r=ROLES)
              + _per("role/{r}/sampling/importance_sampling_ratio/min", r=ROLES)
              + _per("role/{r}/sampling/importance_sampling_ratio/max", r=ROLES)),
        Panel("sampler mismatch |log p trainer - log p sampler|",
              _per("role/{r}/sampling/sampling_logp_difference/mean", r=ROLES)),
        Panel("groups without reward spread, truncated completions",
              _per("role/{r}/frac_reward_zero_std", r=ROLES) + _per("role/{r}/truncated_ratio", r=ROLES)),
        Panel("divergence of the adapters", ["train/divergence", "eval/divergence"]),
    ],
    "Systems": [
        Panel("throughput (completion tokens per second of generation)", ["time/tokens_per_s"]),
        Panel("step and generation time (s)", ["time/step_s", "time/generation_s"]),
        Panel("peak GPU memory (GiB)", ["perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"]),
    ],
    "Diagnostics (last evaluation)": [
        Panel("cross-play: drafter > answerer", [], kind="bar", prefix="crossplay/"),
        Panel("recap diagnostic: challenger given a recap", [], kind="bar", prefix="recap/"),
        Panel("check battery: answerer after a recap of each kind", [], kind="bar", prefix="battery/",
              counts=("battery/n/",)),
    ],
}
# keys a run of this code may lack, and why; any other key of PANELS missing from a sweep is an error
OPTIONAL = {
    "sampling/": "only with an engine that reports its log-probs (generation.engine=vllm)",
    "perf/": "only on a CUDA device",
    "/kl": "only with trainer.beta != 0",
    "eval/cascade_acc": "only for a method with a cascade",
    "eval/accuracy_one_generation": "only in runs since each evaluation reads its arms at equal generations",
    "eval/accuracy_two_generations": "only in runs since each evaluation reads its arms at equal generations, and "
                                     "for one-generation methods only with eval.equal_generations",
    "eval/solo_acc_B": "only for a method with two adapters",
    "eval/conversion_rate": "only for a method with a cascade",
    "eval/regression_rate": "only for a method with a cascade",
    "divergence": "only for a method with two adapters",
    "adapter/B/": "only for a method with two adapters",
    "/challenger/": "only for a method with a challenger",
    "role/challenger/": "only for a method with a challenger",
}


def optional(key: str) -> str | None:
    """Why ``key`` may be missing, or None when it must be there."""
    return next((why for part, why in OPTIONAL.items() if part in key), None)


@dataclass
class Dashboard:
    """A sweep's report (``report``) and what building it found: the keys each chart draws, and the required keys
    that no run logged (``missing``; empty for a sweep of this code)."""

    report: Any
    panels: dict[str, list[str]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def keys(self) -> set[str]:
        return {k for keys in self.panels.values() for k in keys}

    def definition(self) -> dict[str, Any]:
        """The report as W&B stores it (``ReportViewspec``), with no server contacted (the runsets carry no
        project until published, which is when W&B looks the project up)."""
        return json.loads(self.report._to_model().model_dump_json(by_alias=True, exclude_none=True))


def logged_keys(sweep: str | Path) -> set[str]:
    """Every metric key the sweep's runs wrote to ``metrics.jsonl`` (what W&B's history holds)."""
    from analysis.load import load_runs

    steps = load_runs(sweep).steps
    return {c for c in steps.columns if steps[c].notna().any()}


def _markdown(sweep: Path) -> tuple[str, str, str, str, str]:
    """The results table, the claims, the diagnostic tables (cascades, cross-play, recap), the check battery and the
    arms at equal generations of the sweep, as ``make figures`` writes them (``table.md``, ``claims.md``,
    ``diagnostic.md``, ``battery.md``, ``generations.md``; "" for the last three where the runs logged none)."""
    from analysis.claims import claims_markdown, claims_table
    from analysis.load import load_runs
    from analysis.tables import (_caption, battery_markdown, battery_table, diagnostic_tables,
                                 equal_generations_markdown, results_table, to_markdown)

    data = load_runs(sweep)
    results = results_table(data)
    claims = claims_table(data.runs, evals=data.evals, steps=data.steps)
    return (to_markdown(results, _caption(data)),
            claims_markdown(claims) if not claims.empty else "No claim of analysis/claims.yaml has both of its "
            "cells in this sweep.",
            diagnostic_tables(data, results), battery_markdown(battery_table(data, results)),
            equal_generations_markdown(data))


def build(sweep: str | Path, group: str | None = None, project: str = "agon", entity: str | None = None,
          title: str | None = None) -> Dashboard:
    """The report of the sweep at ``sweep`` (a multirun root): charts of the keys its runs logged, the runs of W&B
    group ``group`` (default: the sweep's name, as the logger sets it) grouped by job type (the cell)."""
    import wandb_workspaces.reports.v2 as wr

    sweep = Path(sweep)
    group = group or sweep_name(sweep)
    logged = logged_keys(sweep)
    dashboard = Dashboard(report=None)
    # no entity or project on the runset until it is published: with them W&B's library looks the project up
    runset = wr.Runset(name=f"sweep {group}", filters=f"Group == '{group}'", groupby=["JobType"])
    blocks: list[Any] = [
        wr.P(f"Sweep {group}: every chart draws one line per cell (W&B job type), the mean over its seeds with "
             "their range as a band, against train/step. Built by `python -m analysis.dashboard` from the sweep's "
             "run directories."),
    ]
    for section, panels in SECTIONS.items():
        charts = []
        for panel in panels:
            if panel.prefix:
                keys = sorted(k for k in logged if k.startswith(panel.prefix)
                              and not any(c in k for c in panel.counts))
            else:
                keys = [k for k in panel.keys if k in logged]
                dashboard.missing += [k for k in panel.keys if k not in logged and optional(k) is None]
            if not keys:
                continue
            dashboard.panels[panel.title] = keys
            if panel.kind == "bar":
                charts.append(wr.BarPlot(title=panel.title, metrics=keys, orientation="h", groupby_aggfunc="mean",
                                         groupby_rangefunc="minmax", layout=wr.Layout(w=24, h=8)))
            else:
                charts.append(wr.LinePlot(title=panel.title, x="train/step", y=keys, groupby_aggfunc="mean",
                                          groupby_rangefunc="minmax", smoothing_factor=0.0,
                                          layout=wr.Layout(w=8, h=6)))
        if charts:
            blocks += [wr.H2(section), wr.PanelGrid(runsets=[runset], panels=charts)]
    figures_file = sweep / FIGURES_FILE
    if figures_file.exists():  # make figures --wandb logged them: a run of the group with job type "figures"
        keys = json.loads(figures_file.read_text())["keys"]
        dashboard.panels["figures"] = keys
        figures_runs = wr.Runset(name=f"figures of {group}",
                                 filters=f"Group == '{group}' and JobType == '{FIGURES_JOB}'")
        blocks += [wr.H2("Figures (make figures --wandb)"),
                   wr.PanelGrid(runsets=[figures_runs], panels=[
                       wr.MediaBrowser(title="the paper's figures", media_keys=keys, num_columns=1,
                                       layout=wr.Layout(w=24, h=12))])]
    table, claims, diagnostic, battery, generations = _markdown(sweep)
    blocks += [wr.H2("Results (make figures' table.md)"), wr.MarkdownBlock(table),
               wr.H2("Claims, with pooled and family-wise intervals"), wr.MarkdownBlock(claims)]
    for title, text in (("The arms at equal generations per answer", generations),
                        ("The recap diagnostic and cross-play, per cell", diagnostic),
                        ("The check battery, per cell and answerer", battery)):
        if text:
            blocks += [wr.H2(title), wr.MarkdownBlock(text)]
    dashboard.report = wr.Report(project=project, entity=entity or "", title=title or f"agon sweep {group}",
                                 description=f"cells of sweep {group}, mean and range over seeds",
                                 blocks=blocks, width="fluid")
    return dashboard


def log_figures(paths: list[Path], group: str, project: str = "agon", entity: str | None = None,
                sweep: str | Path | None = None) -> str:
    """``make figures``' figures (PNG) and results table as a W&B run of the sweep's group, job type ``figures``
    (online with a login, else offline with the usual notice), so the sweep's report shows them. With ``sweep``,
    the keys go to ``<sweep>/wandb_figures.json``, where ``build`` finds them. Returns the run's id."""
    import pandas as pd
    import wandb

    from agon.records.wandb_logger import resolve_mode

    paths = [Path(p) for p in paths]
    out = paths[0].parent
    mode, notice = resolve_mode(None)
    if notice:
        print(f"{notice} (upload later with `wandb sync {out}/wandb/offline-run-*`)", file=sys.stderr)
    run = wandb.init(project=project, entity=entity, group=group, job_type=FIGURES_JOB, name=f"figures {group}",
                     dir=str(out), mode=mode, reinit="create_new")
    row = {f"figures/{p.stem}": wandb.Image(str(p)) for p in paths if p.suffix == ".png"}
    table = out / "table.csv"
    if table.exists():
        frame = pd.read_csv(table)
        # empty cells as None: a column keeps its one type (W&B's table refuses "" among numbers)
        row["figures/table"] = wandb.Table(dataframe=frame.astype(object).where(frame.notna(), None))
    run.log(row)
    run.finish()
    if sweep is not None:
        keys = sorted(k for k in row if k != "figures/table")
        (Path(sweep) / FIGURES_FILE).write_text(json.dumps({"group": group, "run": run.id, "keys": keys}) + "\n")
    return run.id


def write_offline(dashboard: Dashboard, sweep: str | Path) -> Path:
    path = Path(sweep) / REPORT_FILE
    path.write_text(json.dumps(dashboard.definition(), indent=1, sort_keys=True) + "\n")
    return path


def publish(dashboard: Dashboard, project: str, entity: str | None) -> str:
    """Save the report to W&B (needs a login) and return its URL."""
    import wandb

    entity = entity or wandb.Api().default_entity
    report = dashboard.report
    report.entity, report.project = entity, project
    for block in report.blocks:
        for runset in getattr(block, "runsets", []):
            runset.entity, runset.project = entity, project
    report.save()
    return report.url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.dashboard", description=__doc__.split("\n")[0])
    parser.add_argument("sweep", nargs="?", help="a multirun root whose runs logged with logger=wandb (default: the "
                        "newest under ./multirun)")
    parser.add_argument("--group", default=None, help="the W&B group (default: the sweep's name)")
    parser.add_argument("--project", default="agon")
    parser.add_argument("--entity", default=None)
    parser.add_argument("--title", default=None)
    parser.add_argument("--allow-missing", action="store_true",
                        help="draw what there is for runs of older code that lacked some metrics")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--publish", action="store_true", help="save the report to W&B (default with an API key)")
    how.add_argument("--offline", action="store_true", help=f"only write <sweep>/{REPORT_FILE}")
    args = parser.parse_args(argv)

    from agon.records.wandb_logger import has_api_key
    from analysis.load import newest_multirun

    if args.sweep is None:
        newest = newest_multirun("multirun")
        if newest is None:
            print("no multirun under ./multirun: pass the sweep's directory", file=sys.stderr)
            return 1
        args.sweep = str(newest)
    dashboard = build(args.sweep, args.group, args.project, args.entity, args.title)
    if dashboard.missing and not args.allow_missing:
        print("metrics the dashboard draws but no run logged (renamed?): " + ", ".join(dashboard.missing),
              file=sys.stderr)
        print("(runs of older code: --allow-missing)", file=sys.stderr)
        return 1
    path = write_offline(dashboard, args.sweep)
    print(f"{len(dashboard.panels)} charts; report definition written to {path}")
    if args.publish or (not args.offline and has_api_key()):
        print(f"report saved: {publish(dashboard, args.project, args.entity)}")
    else:
        print("to publish it: upload the runs (wandb sync <sweep>/*/wandb/offline-run-*), log in (wandb login), "
              f"then python -m analysis.dashboard {args.sweep} --publish")
    return 0


if __name__ == "__main__":
    sys.exit(main())
