"""``make figures``: the paper's figures and table from a sweep's run directories (or W&B), into ``figures/``.

    python -m analysis.figures                       # the newest multirun under ./multirun
    python -m analysis.figures --runs multirun/2026-11-30/10-00-00 multirun/2026-11-30/11-00-00
    python -m analysis.figures --source wandb --project agon --group 2026-11-30/10-00-00

Writes, each as PNG (300 dpi) and PDF, drawn at the size a paper prints it (one column, 3.3 in, or the full width,
6.9 in; text of 7 pt or more; Okabe-Ito colours, line styles, hatches and markers as a second channel; cells named by
``analysis.labels``):
    accuracy_grid          the 2x2 grid (reward x exchange) of final-stage pass@1, and every cell with the
                           baselines as bars: per-seed points, 95% interval (Student's t over seeds where a cell
                           has several, else a bootstrap over problems), accuracy before training as a tick
    trace_length           final-stage trace length per cell (tokens); a note instead when every cell's length is
                           within 1% of the others
    training_curves        training accuracy (each run smoothed, then the mean over seeds with their range as a
                           band), its difference from GRPO's curve on the same seed (a seed draws the same
                           problems at each step in every cell, so the difference is free of batch difficulty),
                           final-stage trace length over steps, and the held-out evaluations on their own axis
    conversion_regression  conversion P(final right | draft wrong) and regression P(final wrong | draft right)
    recap_diagnostic       the challenger's accuracy given its rival's recap, a correct one, a wrong one and none
                           (``eval.diagnostic``), at the first and the last evaluation; only when runs logged it
    battery                each answerer's accuracy after a recap of each kind of the check battery (a right prefix,
                           a wrong step shown, a dead end, an empty recap; ``battery/<answerer>/<kind>``) at the
                           first and the last evaluation that logged it and the change between them; only when
                           runs logged it
    divergence             the adapters' divergence (``eval/divergence``) at each evaluation; only when runs
                           logged it
    claims_forest          the claims (analysis.claims): each difference with its pooled 95% interval and the
                           family-wise one, the "about equal" band and the side the paper claims; only where the
                           runs hold the cells of a claim
and ``table.csv``, ``table.md``, ``table.tex`` (one column), ``table_full.tex`` (the appendix; all four by
analysis.tables.write_tables, with ``runs.md``: each run's commits and hours, ``diagnostic.md`` and ``battery.md``
where runs logged the diagnostic and the check battery, and ``generations.md``: the arms at equal generations per
answer, where some run has an answer at two generations), ``paired.md``, ``paired.csv``
and ``budget.csv`` where some run has a cascade (analysis.paired: each run's and arm's cascade minus its drafts
and conversion by the recap's kind, the first and the paired conversion gap also at the start and as their change
since then where the runs' rows hold the start evaluation, and the arms at equal steps and equal generated
tokens), and ``claims.md`` (analysis.claims) where the runs hold the cells of a claim. Output is deterministic:
seeded bootstrap, no timestamps in the PDFs.

Left out on purpose: per-seed training curves (three overlapping noisy lines per cell hide more than they show;
the band is their range) and any statistic not in analysis.tables or analysis.claims (a figure draws what a table
states).
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import to_rgb
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from agon.core.methods import METHODS
from analysis.claims import RULES, claims_markdown, claims_table, in_tokens
from analysis.labels import ANSWERER_LABELS, BATTERY_LABELS, cell_label
from analysis.load import Runs, is_ablation, is_baseline, load_runs, newest_multirun
from analysis.paired import eval_curve, on_smallest_design, write_paired
from analysis.patterns import write_patterns
from analysis.tables import (RECAP_SHOWN, battery_kinds, battery_table, battery_values, cell_interval, format_table,
                             recap_values, results_table, write_tables)

# files only, no display (pyplot picks its backend lazily, at the first figure)
matplotlib.use("Agg")

# Okabe & Ito's colour-blind-safe palette (Color Universal Design, 2008), each a fixed meaning across every figure.
# tests/analysis/test_figures_print.py checks every pair a figure draws under simulated deuteranopia and protanopia
# (colorspacious, CAM02-UCS): no two colours closer than CVD_MIN_DISTANCE; line styles, hatches and markers are
# the second channel
OKABE_ITO = {"orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73", "yellow": "#F0E442", "blue": "#0072B2",
             "vermillion": "#D55E00", "purple": "#CC79A7", "black": "#000000"}
REWARD_COLORS = {"competitive": OKABE_ITO["vermillion"], "cooperative": OKABE_ITO["blue"],
                 "paper": OKABE_ITO["orange"]}
# baselines' colours, in the order the registry lists them (self-refine, GRPO, MoA; methods it does not know come
# after); it cycles
BASELINE_COLORS = (OKABE_ITO["purple"], OKABE_ITO["black"], OKABE_ITO["green"], OKABE_ITO["yellow"],
                   OKABE_ITO["sky"])
# a baseline run with other settings beside its plain cell (GRPO at Agon's rollout budget, experiment=grpo_matched,
# beside GRPO) gets a colour of its own, not its method's: dark grey beside GRPO's black first; it cycles
VARIANT_COLORS = ("#555555", OKABE_ITO["yellow"], OKABE_ITO["sky"])
CONVERSION_COLOR, REGRESSION_COLOR = OKABE_ITO["blue"], OKABE_ITO["vermillion"]
# the smallest CAM02-UCS distance allowed between two colours of one figure under full deuteranopia or protanopia
# (a just-noticeable difference is about 1-2; the old red-brown pair was 4.3, Okabe-Ito's closest pair used here 11)
CVD_MIN_DISTANCE = 10.0
# a cell's marker where lines meet (the held-out points), a channel beside colour and line style
CELL_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
GRID_REWARDS, GRID_EXCHANGES = ("competitive", "cooperative"), ("visible", "hidden")
# a paper's two widths (inches): one column and the full text width of a two-column or NeurIPS page
COLUMN_WIDTH, FULL_WIDTH = 3.3, 6.9
# cells whose mean final-stage lengths differ by less than this share are drawn as a note, not as bars
SAME_LENGTH = 0.01
# the smallest text a figure may hold at the size it is printed (points)
MIN_FONT = 7.0
STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 300,
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "figure.titlesize": 8.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.2,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "legend.frameon": False,
    "hatch.linewidth": 0.6,
    "pdf.fonttype": 42,  # TrueType in the PDF: text a journal's checker can read and an editor can change
}


def _lighter(color: str, amount: float = 0.45) -> tuple[float, float, float]:
    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def baseline_colors(methods: Any) -> dict[Any, str]:
    """Each baseline's colour: registered baselines by their place in the registry, so one keeps its colour
    whichever others are loaded; then the unknown methods among ``methods``, in the order given."""
    registered = [name for name, method in METHODS.items() if method.baseline]
    unknown = [m for m in dict.fromkeys(methods) if m not in METHODS]
    return {m: BASELINE_COLORS[i % len(BASELINE_COLORS)] for i, m in enumerate(registered + unknown)}


def cell_colors(runs: pd.DataFrame) -> dict[Any, str]:
    """``baseline_colors`` of the methods in a runs frame, plus a colour per *variant* of a baseline (a baseline cell
    with extra overrides, e.g. ``GRPO [experiment=grpo_matched]``), keyed by its ``cell_key`` in the frame's order.
    Every figure takes its colours from ``data.runs``, not from the cells it draws, so a cell keeps its colour in
    each of them."""
    colors: dict[Any, str] = dict(baseline_colors(runs["method"])) if "method" in runs else {}
    if {"method", "extra", "cell_key"} <= set(runs.columns):
        variants = [r["cell_key"] for _, r in runs.iterrows() if is_baseline(r["method"]) and r["extra"]]
        colors.update({key: VARIANT_COLORS[i % len(VARIANT_COLORS)] for i, key in
                       enumerate(dict.fromkeys(variants))})
    return colors


def cell_style(row: Any, colors: dict[Any, str]) -> dict:
    """Colour, hatch and line style of a cell, the same in every figure: hue = reward (or the baseline's colour in
    ``colors``, from ``baseline_colors``, or its variant's from ``cell_colors``); hidden exchange = lighter, hatched
    ``//``, dashed; latent exchange = hatched ``\\\\`` (its trace span ``\\\\\\``), dash-dot-dotted; fixed
    roles = ``xx``, dotted; symmetric init = ``..``, dash-dotted."""
    if is_baseline(row["method"]):
        color = colors.get(row.get("cell_key"), colors[row["method"]])
        return {"color": color, "hatch": "", "linestyle": "-", "edge": color}
    base = REWARD_COLORS.get(row["reward"], "#555555")
    hidden = row["exchange"] == "hidden"
    latent = str(row["exchange"]).startswith("latent")
    fixed = row["rotation"] == "fixed"
    symmetric = row["init"] == "symmetric"
    linestyle = ":" if fixed else "-." if symmetric else "--" if hidden else (0, (3, 1, 1, 1, 1, 1)) if latent \
        else "-"
    latent_hatch = ("\\\\\\" if row["exchange"] == "latent:trace" else "\\\\") if latent else ""
    return {
        "color": _lighter(base) if hidden else base,
        "hatch": ("//" if hidden else "") + latent_hatch + ("xx" if fixed else "") + (".." if symmetric else ""),
        "linestyle": linestyle,
        # hatches are drawn in the edge colour: white on a full-colour bar, the base colour on a light one
        "edge": base if hidden or not (fixed or symmetric or latent) else "white",
        "line": base,
    }


def _save(fig: plt.Figure, out: Path, name: str) -> list[Path]:
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    fig.savefig(paths[0], bbox_inches="tight", pad_inches=0.02, metadata={"Software": None})
    fig.savefig(paths[1], bbox_inches="tight", pad_inches=0.02,
                metadata={"CreationDate": None, "Creator": None, "Producer": None})
    plt.close(fig)
    return paths


def _tick(row: Any, width: int = 30) -> str:
    """A cell's row label: its human label (``analysis.labels``), wrapped, and its seed count."""
    text = f"{cell_label(row['cell'])} (n={int(row['seeds'])})"
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False))


def _bars(ax: plt.Axes, data: Runs, table: pd.DataFrame, metric: str, eval_column: str, scale: float) -> None:
    """One horizontal bar per cell (mean over seeds), top to bottom in the table's order, its seeds as points, its
    95% interval as an error bar. Horizontal, so that a cell's label reads on one or two lines at any count of
    cells."""
    runs = data.runs[data.runs["status"] == "complete"]
    rng = np.random.default_rng(0)
    colors = cell_colors(data.runs)
    for y, (_, row) in enumerate(table.iterrows()):
        style = cell_style(row, colors)
        cell_runs = runs[runs["cell_key"] == row["cell_key"]]
        values = pd.to_numeric(cell_runs[metric], errors="coerce").dropna()
        if values.empty:
            ax.text(0, y, " n/a", ha="left", va="center", color="0.3")
            continue
        ax.barh(y, values.mean() * scale, height=0.7, color=style["color"], hatch=style["hatch"],
                edgecolor=style["edge"], linewidth=0.6, zorder=2)
        jitter = rng.uniform(-0.12, 0.12, len(values)) if len(values) > 1 else np.zeros(1)
        ax.scatter(values * scale, y + jitter, s=6, color="white", edgecolor="black", zorder=4, linewidths=0.5)
        lo, hi, _ = cell_interval(cell_runs, data.evals, metric, eval_column)
        if not math.isnan(lo):
            mean = values.mean() * scale
            ax.errorbar(mean, y, xerr=[[mean - lo * scale], [hi * scale - mean]], color="black", capsize=2,
                        linewidth=0.8, zorder=3)
    ax.set_yticks(range(len(table)), [_tick(r) for _, r in table.iterrows()])
    ax.set_ylim(len(table) - 0.4, -0.6)
    ax.grid(axis="y", visible=False)


def _hatch_key(table: pd.DataFrame) -> list[Any]:
    """Legend entries for the hatches the table's cells use: a grey swatch with the hatch drawn dark, never an
    empty box."""
    def swatch(hatch: str, label: str) -> Patch:
        return Patch(facecolor="0.8", edgecolor="0.15", hatch=hatch, linewidth=0.6, label=label)

    out = []
    if (table["exchange"] == "hidden").any():
        out.append(swatch("//", "hidden exchange (lighter)"))
    out += [swatch(hatch, f"latent exchange ({span})") for span, hatch in (("recap", "\\\\"), ("trace", "\\\\\\"))
            if (table["exchange"] == f"latent:{span}").any()]
    if (table["rotation"] == "fixed").any():
        out.append(swatch("xx", "fixed roles"))
    if (table["init"] == "symmetric").any():
        out.append(swatch("..", "symmetric init"))
    return out


def accuracy_figure(data: Runs, table: pd.DataFrame) -> plt.Figure:
    """Full width: the 2x2 grid (reward x exchange) as a heat map with its numbers, and every cell as a bar."""
    fig = plt.figure(figsize=(FULL_WIDTH, 1.6 + 0.24 * max(len(table), 4)), layout="constrained")
    grid_ax, bar_ax = fig.subplots(1, 2, width_ratios=[1.0, 1.9])

    # the 2x2 grid: reward (rows) x exchange (columns), the method under study at its default rotation and init
    grid = [not is_baseline(r["method"]) and not is_ablation(r) for _, r in table.iterrows()]
    core = table[pd.Series(grid, index=table.index, dtype=bool)]  # a Series: an empty list would pick columns
    values = np.full((2, 2), np.nan)
    notes = [["not run"] * 2 for _ in range(2)]
    for i, reward in enumerate(GRID_REWARDS):
        for j, exchange in enumerate(GRID_EXCHANGES):
            match = core[(core["reward"] == reward) & (core["exchange"] == exchange) & (core["seeds"] > 0)]
            if match.empty:
                continue
            row = match.iloc[0]
            values[i, j] = row["accuracy"] * 100
            ci = ("" if math.isnan(row["accuracy_ci_low"])
                  else f"\n[{row['accuracy_ci_low'] * 100:.1f}, {row['accuracy_ci_high'] * 100:.1f}]")
            delta = "" if math.isnan(row["delta"]) else f"\nΔ {row['delta'] * 100:+.1f} pts"
            notes[i][j] = f"{values[i, j]:.1f}%{ci}{delta}\nn={int(row['seeds'])}"
    finite = values[np.isfinite(values)]
    vmin, vmax = (max(0.0, finite.min() - 5), min(100.0, finite.max() + 5)) if finite.size else (0.0, 100.0)
    # viridis: ordered in lightness, so it reads the same to every reader and in greyscale
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.92")
    grid_ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax)
    for i in range(2):
        for j in range(2):
            light = np.isfinite(values[i, j]) and (values[i, j] - vmin) / max(vmax - vmin, 1e-9) > 0.6
            grid_ax.text(j, i, notes[i][j], ha="center", va="center", color="black" if light else "white"
                         if np.isfinite(values[i, j]) else "black")
    grid_ax.set_xticks([0, 1], list(GRID_EXCHANGES))
    grid_ax.set_yticks([0, 1], list(GRID_REWARDS), rotation=90, va="center")
    grid_ax.set_xlabel("exchange")
    grid_ax.set_ylabel("reward")
    grid_ax.grid(False)
    for side in ("top", "right", "left", "bottom"):
        grid_ax.spines[side].set_visible(False)
    grid_ax.set_title("(a) Agon's 2x2 grid: pass@1 %,\n95% CI, change since start, seeds")

    # every cell, baselines included
    _bars(bar_ax, data, table, "eval/accuracy", "correct", 100)
    runs = data.runs[data.runs["status"] == "complete"]
    for y, (_, row) in enumerate(table.iterrows()):
        start = pd.to_numeric(runs.loc[runs["cell_key"] == row["cell_key"], "eval/accuracy_at_start"],
                              errors="coerce").dropna()
        if not start.empty:
            bar_ax.plot([start.mean() * 100] * 2, [y - 0.35, y + 0.35], color="black", linestyle=(0, (1.5, 1)),
                        linewidth=1.0, zorder=5)
    bar_ax.set_xlabel("final-stage pass@1 (%)")
    bar_ax.set_xlim(0, min(100, max(10.0, bar_ax.get_xlim()[1] * 1.05)))
    bar_ax.set_title("(b) every cell: mean, seeds, 95% CI")
    fig.legend(
        handles=[
            Line2D([], [], marker="o", linestyle="", markerfacecolor="white", markeredgecolor="black",
                   markersize=3, label="one seed"),
            Line2D([], [], color="black", linewidth=0.8, label="95% CI"),
            Line2D([], [], color="black", linestyle=(0, (1.5, 1)), label="before training"),
            *_hatch_key(table),
        ],
        loc="outside lower center", ncols=4,
    )
    return fig


def trace_length_figure(data: Runs, table: pd.DataFrame) -> plt.Figure:
    """One column: final-stage length per cell. When every cell has the same length (a task whose answers all
    run to one length), a note says so instead of bars that could not differ."""
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 1.0 + 0.24 * max(len(table), 3)), layout="constrained")
    runs = data.runs[data.runs["status"] == "complete"]
    values = pd.to_numeric(runs.get("eval/final_trace_tokens", pd.Series(dtype=float)), errors="coerce")
    means = values.groupby(runs["cell_key"]).mean().dropna() if "cell_key" in runs else values.dropna()
    # cells whose mean lengths lie within 1% of each other: bars that cannot differ to the eye say nothing
    if means.empty or means.max() - means.min() < SAME_LENGTH * max(1.0, abs(means.max())):
        fig.set_size_inches(COLUMN_WIDTH, 0.8)
        ax.axis("off")
        what = ("no run logged a final-stage length" if means.empty else
                f"every cell: {means.min():.1f}–{means.max():.1f} tokens\n(within 1% of each other: the length\n"
                "is set by the task, not by the method)")
        ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes)
        return fig
    _bars(ax, data, table, "eval/final_trace_tokens", "tokens", 1)
    ax.set_xlabel("final-stage completion length (tokens)")
    return fig


def _smooth(series: pd.Series, steps: int) -> pd.Series:
    """A centred rolling mean over a fifth of the run (at least 3 steps): one step's batch of 16 problems is easy or
    hard by chance, and its accuracy moves by more than a run learns in ten steps."""
    window = max(3, steps // 5)
    return series.rolling(window, min_periods=1, center=True).mean()


def _by_seed(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ``_seed``: the run's seed, or its run_id where it has none (W&B runs, hand-made ones), so no
    run is dropped and none pairs with another cell's by accident."""
    seed = rows["seed"] if "seed" in rows else pd.Series(None, rows.index, dtype=object)
    return rows.assign(_seed=seed.astype(object).where(seed.notna(), rows["run_id"]).astype(str))


def seed_curves(steps: pd.DataFrame, cell_key: Any, column: str, scale: float = 1.0) -> pd.DataFrame:
    """A cell's ``column`` over ``train/step``, each run smoothed (``_smooth``): one column per seed, one row per
    step (nan where a seed has no value). Empty when the cell logged none."""
    if column not in steps or "cell_key" not in steps:
        return pd.DataFrame()
    rows = _by_seed(steps[steps["cell_key"] == cell_key].dropna(subset=[column]))
    curves = {}
    for seed, run in rows.groupby("_seed", sort=True):
        series = run.groupby("train/step")[column].mean().astype(float).sort_index() * scale
        curves[seed] = _smooth(series, int(series.index.max()) + 1)
    return pd.DataFrame(curves).sort_index()


def eval_points(steps: pd.DataFrame, cell_key: Any, scale: float = 100.0, runs: pd.DataFrame | None = None,
                evals: pd.DataFrame | None = None) -> pd.DataFrame:
    """A cell's held-out ``eval/accuracy`` at each evaluation step: one column per seed. Given the ``runs`` and their
    ``evals`` rows, a run whose interim evaluations are smaller than its first and last has every point on its
    smallest design (``analysis.paired.on_smallest_design``), so its curve does not step between problem sets."""
    if "eval/accuracy" not in steps or "cell_key" not in steps:
        return pd.DataFrame()
    rows = _by_seed(steps[steps["cell_key"] == cell_key].dropna(subset=["eval/accuracy"]))
    if rows.empty or "run_id" not in rows:
        return rows.pivot_table(index="train/step", columns="_seed", values="eval/accuracy", aggfunc="mean") * scale
    per_run = []
    for run_id, run_rows in rows.groupby("run_id", sort=False):
        curve = eval_curve(run_rows, "train/step")
        run = runs[runs["run_id"] == run_id] if runs is not None and "run_id" in runs else pd.DataFrame()
        if len(run) and evals is not None and "run_id" in evals:  # a curve of one size comes back as it was
            curve = on_smallest_design(curve, evals[evals["run_id"] == run_id], run.iloc[0])
        per_run.append(curve.assign(_seed=run_rows["_seed"].iloc[0]))
    return pd.concat(per_run).pivot_table(index="train/step", columns="_seed", values="value", aggfunc="mean") * scale


def reference_cell(data: Runs) -> Any:
    """The cell_key of the claims' reference (``claims.yaml``: experiment ``grpo``), else of the plain cell of the
    method of that name (runs launched without an experiment); None when neither ran."""
    runs = data.runs
    if "experiment" in runs and (runs["experiment"] == RULES.reference).any():
        return runs.loc[runs["experiment"] == RULES.reference, "cell_key"].iloc[0]
    plain = runs[(runs["method"] == RULES.reference) & (runs["extra"].fillna("") == "")] if "extra" in runs else []
    return plain["cell_key"].iloc[0] if len(plain) else None


def _band(ax: plt.Axes, curves: pd.DataFrame, color: Any, linestyle: Any) -> None:
    """The mean over seeds as a line and the seeds' range as a band (one seed: the line alone)."""
    ax.plot(curves.index, curves.mean(axis=1), color=color, linestyle=linestyle, linewidth=1.2)
    if curves.shape[1] > 1:
        ax.fill_between(curves.index, curves.min(axis=1), curves.max(axis=1), color=color, alpha=0.1, linewidth=0)


def training_curves_figure(data: Runs, table: pd.DataFrame) -> plt.Figure:
    """Full width, four panels: (a) training accuracy, (b) held-out pass@1 at each evaluation (its own axis: a
    held-out point is not a training accuracy), (c) training accuracy minus GRPO's on the same seed, (d) final-stage
    trace length over steps; one legend below for every cell."""
    fig, axes = plt.subplots(2, 2, figsize=(FULL_WIDTH, 4.6 + 0.1 * len(table)), layout="constrained",
                             sharex=True)
    (acc_ax, eval_ax), (diff_ax, len_ax) = axes
    steps = data.steps
    colors = cell_colors(data.runs)
    reference = reference_cell(data)
    ref_acc = seed_curves(steps, reference, "train/accuracy", 100) if reference is not None else pd.DataFrame()
    handles = []
    for k, (_, row) in enumerate(table.iterrows()):
        style = cell_style(row, colors)
        color, linestyle = style.get("line", style["color"]), style["linestyle"]
        marker = CELL_MARKERS[k % len(CELL_MARKERS)]
        acc = seed_curves(steps, row["cell_key"], "train/accuracy", 100)
        length = seed_curves(steps, row["cell_key"], "train/final_trace_tokens")
        evals = eval_points(steps, row["cell_key"], runs=data.runs, evals=data.evals)
        if acc.empty and length.empty and evals.empty:
            continue
        if not acc.empty:
            _band(acc_ax, acc, color, linestyle)
        if not length.empty:
            _band(len_ax, length, color, linestyle)
        if not evals.empty:
            mean = evals.mean(axis=1)
            spread = [mean - evals.min(axis=1), evals.max(axis=1) - mean]
            eval_ax.errorbar(evals.index, mean, yerr=spread, color=color, linestyle=linestyle if len(mean) > 4
                             else "none", marker=marker, markersize=3.5, markeredgecolor="black",
                             markeredgewidth=0.4, linewidth=0.9, elinewidth=0.6, capsize=1.5)
        # paired by seed: the same seed trains on the same problems at each step in every cell
        paired = [s for s in acc.columns if s in ref_acc.columns]
        if paired and row["cell_key"] != reference:
            _band(diff_ax, acc[paired] - ref_acc[paired], color, linestyle)
        incomplete = int(row.get("incomplete", 0) or 0)
        note = f"n={int(row['seeds'])}" + (f", {incomplete} incomplete" if incomplete else "")
        handles.append(Line2D([], [], color=color, linestyle=linestyle, marker=marker, markersize=3.5,
                              markeredgecolor="black", markeredgewidth=0.4,
                              label=f"{cell_label(row['cell'])} ({note})"))
    if not handles:
        for ax in (acc_ax, len_ax):
            ax.text(0.5, 0.5, "no metrics.jsonl rows", ha="center", va="center", transform=ax.transAxes)
    if ref_acc.empty:
        diff_ax.text(0.5, 0.5, "no GRPO cell to compare with", ha="center", va="center", transform=diff_ax.transAxes)
    diff_ax.axhline(0, color="black", linewidth=0.6)
    low, high = acc_ax.get_ylim()
    acc_ax.set_ylim(max(0.0, low), min(100.0, max(high, max(0.0, low) + 10)))
    acc_ax.set_ylabel("training accuracy (%)")
    acc_ax.set_title("(a) training accuracy (smoothed; band: seeds' range)")
    eval_ax.set_ylabel("held-out pass@1 (%)")
    eval_ax.set_title("(b) held-out evaluations (mean; bar: seeds' range)")
    if eval_ax.has_data() is False:
        eval_ax.text(0.5, 0.5, "no evaluations", ha="center", va="center", transform=eval_ax.transAxes)
    diff_ax.set_ylabel("minus GRPO, same seed (points)")
    diff_ax.set_title("(c) training accuracy minus GRPO's")
    len_ax.set_ylabel("final-stage length (tokens)")
    len_ax.set_title("(d) trace length during training")
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (len_ax, diff_ax):
        ax.set_xlabel("training step")
    fig.legend(handles=handles, loc="outside lower center", ncols=2 if len(handles) > 3 else len(handles) or 1)
    return fig


def conversion_figure(data: Runs, table: pd.DataFrame) -> plt.Figure:
    """One column: conversion and regression per cell, as paired horizontal bars (blue, vermillion hatched)."""
    shown = table[table["conversion_rate"].notna() | table["regression_rate"].notna()]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 1.2 + 0.34 * max(len(shown), 2)), layout="constrained")
    runs = data.runs[data.runs["status"] == "complete"]
    rng = np.random.default_rng(0)
    height = 0.38
    for y, (_, row) in enumerate(shown.iterrows()):
        cell_runs = runs[runs["cell_key"] == row["cell_key"]]
        for offset, metric, color, hatch in (
            (-height / 2, "eval/conversion_rate", CONVERSION_COLOR, ""),
            (height / 2, "eval/regression_rate", REGRESSION_COLOR, "////"),
        ):
            values = pd.to_numeric(cell_runs[metric], errors="coerce").dropna() * 100
            if values.empty:
                continue
            ax.barh(y + offset, values.mean(), height=height, color=color, hatch=hatch, edgecolor="white",
                    linewidth=0.0, zorder=2)
            jitter = rng.uniform(-0.06, 0.06, len(values)) if len(values) > 1 else np.zeros(1)
            ax.scatter(values, y + offset + jitter, s=5, color="white", edgecolor="black", zorder=4,
                       linewidths=0.4)
            lo, hi, how = cell_interval(cell_runs, None, metric, "")
            if how == "seeds":
                ax.errorbar(values.mean(), y + offset, xerr=[[values.mean() - lo * 100], [hi * 100 - values.mean()]],
                            color="black", capsize=1.5, linewidth=0.7, zorder=3)
    ax.set_yticks(range(len(shown)), [_tick(r, 24) for _, r in shown.iterrows()])
    ax.set_ylim(len(shown) - 0.4, -0.6)
    ax.grid(axis="y", visible=False)
    if shown.empty:
        ax.text(0.5, 0.5, "no cascade results\n(conversion and regression are null)", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("rate over held-out problems (%)")
    ax.set_xlim(0, min(100.0, max(10.0, ax.get_xlim()[1] * 1.05)))
    fig.legend(
        handles=[
            Patch(facecolor=CONVERSION_COLOR, label="conversion: P(final right | draft wrong)"),
            Patch(facecolor=REGRESSION_COLOR, hatch="////", edgecolor="white",
                  label="regression: P(final wrong | draft right)"),
        ],
        loc="outside lower center", ncols=1,
    )
    return fig


RECAP_COLORS = (OKABE_ITO["blue"], OKABE_ITO["green"], OKABE_ITO["vermillion"], OKABE_ITO["black"])
RECAP_MARKERS = ("o", "^", "v", "s")
# the recap figure is drawn for a page's width (inches) and read there unscaled
PAGE_WIDTH = FULL_WIDTH


def _label(row: Any, width: int = 26) -> str:
    """A cell's label on one or two lines, a named experiment by its name alone (as ``_tick`` does)."""
    return "\n".join(textwrap.wrap(cell_label(row["cell"]), width, break_on_hyphens=False))


def _seed_dots(ax: plt.Axes, values: pd.Series, y: float, color: Any, marker: str) -> None:
    """Each run's value as a faint dot at height ``y``, and their mean as a marker over them."""
    ax.scatter(values, np.full(len(values), y), s=4, color=color, alpha=0.4, linewidths=0, zorder=2)
    ax.scatter([values.mean()], [y], s=16, color=color, marker=marker, edgecolor="black", linewidths=0.4, zorder=3)


def recap_figure(data: Runs, table: pd.DataFrame) -> plt.Figure | None:
    """Per cell (rows), the challenger's accuracy under each recap condition at the first and at the last evaluation
    (two panels side by side, the same axis): a marker per condition at the mean over seeds, the seeds as faint
    dots. A latent-exchange cell gets a second row, the same conditions read as key/value prefixes. Drawn for a
    page's width; None without data."""
    steps = data.steps
    if steps.empty or not any(c.startswith("recap/") for c in steps.columns):
        return None
    shown = [(r, read_as) for _, r in table.iterrows() for read_as in ("recap", "latent")
             if not recap_values(steps, r, "none", "last", read_as).empty]
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 1.2 + 0.36 * max(1, len(shown))), layout="constrained",
                             sharey=True, sharex=True)
    offsets = np.linspace(-0.27, 0.27, len(RECAP_SHOWN))
    for ax, which in zip(axes, ("first", "last")):
        for y, (row, read_as) in enumerate(shown):
            for k, (condition, color, marker) in enumerate(zip(RECAP_SHOWN, RECAP_COLORS, RECAP_MARKERS)):
                values = recap_values(steps, row, condition, which, read_as).dropna() * 100
                if values.empty:
                    continue
                _seed_dots(ax, values, y + offsets[k], color, marker)
        ax.set_title("(a) first evaluation (before training)" if which == "first" else "(b) last evaluation")
        ax.set_xlabel("challenger's accuracy (%)")
        ax.grid(axis="y", visible=False)
        for y in range(len(shown) - 1):
            ax.axhline(y + 0.5, color="0.85", linewidth=0.6, zorder=1)
    # a cell's own row reads the recap as text; its latent row, as key/value states
    labels = [_label(r) + ("\n(as key/value states)" if read_as == "latent" else "") for r, read_as in shown]
    axes[0].set_yticks(range(len(shown)), labels)
    axes[0].set_ylim(len(shown) - 0.5, -0.5)
    fig.legend(handles=[Line2D([], [], marker=m, linestyle="", color=c, markeredgecolor="black",
                               markersize=4, label=RECAP_SHOWN[k])
                        for k, c, m in zip(RECAP_SHOWN, RECAP_COLORS, RECAP_MARKERS)],
               loc="outside lower center", ncols=len(RECAP_SHOWN))
    return fig


# the check battery's kinds of recap, each a colour and a marker (the recap figure's four: right as a correct recap,
# a wrong step as a wrong one, an empty recap as none; a dead end in the fourth)
BATTERY_STYLE = {"right": (OKABE_ITO["green"], "^"), "wrong_step": (OKABE_ITO["vermillion"], "v"),
                 "dead_end": (OKABE_ITO["blue"], "o"), "empty": (OKABE_ITO["black"], "s")}


def battery_figure(data: Runs, table: pd.DataFrame) -> plt.Figure | None:
    """Per cell and answerer (rows), the answerer's accuracy after a recap of each kind of the check battery
    (``analysis.tables.battery_table``) at the first evaluation that logged it, at the last, and the change since
    the first (three panels side by side): a marker per kind at the mean over seeds, the seeds as faint dots; a
    kind the task cannot make is not drawn, nor named in the legend. Drawn for a page's width; None where no run
    logged the battery."""
    steps = data.steps
    frame = battery_table(data, table)
    if frame.empty:
        return None
    shown = list(dict.fromkeys(zip(frame["cell_key"], frame["answerer"])))
    # the kinds some run has a value of: a kind the task never makes would be a legend entry with nothing drawn
    drawn = frame.dropna(subset=["start", "end"], how="all")["kind"]
    kinds = [k for k in battery_kinds(steps) if k in set(drawn)]
    cells = dict(zip(frame["cell_key"], frame["cell"]))
    fig, axes = plt.subplots(1, 3, figsize=(PAGE_WIDTH, 1.3 + 0.36 * len(shown)), layout="constrained", sharey=True)
    offsets = np.linspace(-0.27, 0.27, len(kinds)) if len(kinds) > 1 else np.zeros(1)
    for ax, which in zip(axes, ("first", "last", "change")):
        for y, (key, answerer) in enumerate(shown):
            for k, kind in enumerate(kinds):
                color, marker = BATTERY_STYLE.get(kind, (OKABE_ITO["purple"], "D"))
                column = f"battery/{answerer}/{kind}"
                if which == "change":
                    values = (battery_values(steps, key, column, "last")
                              - battery_values(steps, key, column, "first")).dropna() * 100
                else:
                    values = battery_values(steps, key, column, which).dropna() * 100
                if values.empty:
                    continue
                _seed_dots(ax, values, y + offsets[k], color, marker)
        ax.grid(axis="y", visible=False)
        for y in range(len(shown) - 1):
            ax.axhline(y + 0.5, color="0.85", linewidth=0.6, zorder=1)
    axes[0].set_title("(a) first evaluation")
    axes[1].set_title("(b) last evaluation")
    axes[2].set_title("(c) change since the first")
    axes[0].set_xlabel("answerer's accuracy (%)")
    axes[1].set_xlabel("answerer's accuracy (%)")
    axes[2].set_xlabel("change (points)")
    axes[2].axvline(0, color="black", linewidth=0.8, zorder=1)
    low, high = axes[2].get_xlim()
    reach = max(abs(low), abs(high))
    axes[2].set_xlim(-reach, reach)  # 0 in the middle
    # the accuracy panels on one scale, so a marker's place reads the same in both
    lows, highs = zip(*(ax.get_xlim() for ax in axes[:2]))
    for ax in axes[:2]:
        ax.set_xlim(min(lows), max(highs))
    labels = [_label({"cell": cells[key]}) + f"\n{ANSWERER_LABELS.get(answerer, answerer)}" for key, answerer in shown]
    axes[0].set_yticks(range(len(shown)), labels)
    axes[0].set_ylim(len(shown) - 0.5, -0.5)
    fig.legend(handles=[Line2D([], [], marker=BATTERY_STYLE.get(k, (None, "D"))[1], linestyle="",
                               color=BATTERY_STYLE.get(k, (OKABE_ITO["purple"], None))[0], markeredgecolor="black",
                               markersize=4, label=BATTERY_LABELS.get(k, k)) for k in kinds],
               loc="outside lower center", ncols=len(kinds))
    return fig


def divergence_figure(data: Runs, table: pd.DataFrame) -> plt.Figure | None:
    """One column: the adapters' divergence (``eval/divergence``, in points) at each evaluation, per cell: the mean
    over seeds as a marker with the seeds' range, joined only where there are more than 4 evaluations (a line
    through 3 points draws a course nobody measured). None when no run logged it."""
    steps = data.steps
    if "eval/divergence" not in steps or pd.to_numeric(steps["eval/divergence"], errors="coerce").notna().sum() == 0:
        return None
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 2.2 + 0.16 * len(table)), layout="constrained")
    colors = cell_colors(data.runs)
    handles = []
    for k, (_, row) in enumerate(table.iterrows()):
        rows = steps[steps["cell_key"] == row["cell_key"]]
        values = pd.to_numeric(rows["eval/divergence"], errors="coerce")
        rows = rows.assign(value=values * 100).dropna(subset=["value"])
        if rows.empty:
            continue
        style = cell_style(row, colors)
        color = style.get("line", style["color"])
        marker = CELL_MARKERS[k % len(CELL_MARKERS)]
        by_step = rows.groupby("train/step")["value"]
        mean = by_step.mean()
        ax.errorbar(mean.index, mean.values, yerr=[mean - by_step.min(), by_step.max() - mean], color=color,
                    linestyle=style["linestyle"] if len(mean) > 4 else "none", marker=marker, markersize=3.5,
                    markeredgecolor="black", markeredgewidth=0.4, elinewidth=0.6, capsize=1.5, linewidth=0.9)
        handles.append(Line2D([], [], color=color, linestyle="none", marker=marker, markersize=3.5,
                              markeredgecolor="black", markeredgewidth=0.4, label=cell_label(row["cell"])))
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean(agree AA, BB) − agree AB (points)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.legend(handles=handles, loc="outside lower center", ncols=1)
    return fig


# a verdict's colour in the forest plot; the rest (unresolved, not testable, no margin) grey
VERDICT_COLORS = {"holds": OKABE_ITO["green"], "reversed": OKABE_ITO["vermillion"], "differs": OKABE_ITO["orange"]}
# the side of 0 a claim takes, as a marker right of each row: > (left > right), < (left < right), = (about
# equal); outside the data, so it never hides an interval
PAPER_MARK = {"greater": ">", "smaller": "<", "similar": r"$\approx$"}


def _claim_label(row: Any, several: bool) -> str:
    text = f"{row['claim']} ({row['setting']})" if several else str(row["claim"])
    return "\n".join(textwrap.wrap(text, 40, break_on_hyphens=False))


def claims_forest_figure(claims: pd.DataFrame) -> plt.Figure | None:
    """One row per claim (``analysis.claims.claims_table``): the difference (left minus right, under its measure)
    with its pooled 95% interval (thick) and the family-wise one (thin, the same colour), a line at 0, the "about
    equal" band +-margin shaded on the rows that claim "about equal" (on a "beats" row it would test nothing), and
    right of each row the side claimed (a triangle pointing to it; ``≈`` for "about equal") and the two verdicts
    (for a claim written after its runs, that it is a description: it has no verdict). Accuracy claims in points
    and length claims in tokens get panels of their own. None without claims."""
    if claims.empty:
        return None
    several = "setting" in claims
    panels = [(unit, claims[[in_tokens(m) == unit for m in claims["metric"]]]) for unit in (False, True)]
    panels = [(unit, rows) for unit, rows in panels if not rows.empty]
    heights = [len(rows) + 0.8 for _, rows in panels]
    # narrower than the page by the verdicts written right of the axes, outside the layout
    fig, axes = plt.subplots(len(panels), 1, figsize=(FULL_WIDTH - 1.0, 1.0 + 0.36 * sum(heights)),
                             height_ratios=heights, layout="constrained", squeeze=False)
    for ax, (tokens, rows) in zip(axes[:, 0], panels):
        scale = 1.0 if tokens else 100.0
        edge = ax.get_yaxis_transform()  # x in axes fraction, y in data
        for y, (_, r) in enumerate(rows.iterrows()):
            color = VERDICT_COLORS.get(r["verdict"], "0.45")
            if r["direction"] == "similar" and not math.isnan(r.get("margin", math.nan)):
                m = r["margin"] * scale
                ax.fill_betweenx([y - 0.42, y + 0.42], -m, m, color=OKABE_ITO["blue"], alpha=0.15, linewidth=0,
                                 zorder=1)
            if math.isnan(r["difference"]):
                ax.text(0.5, y, "not testable", transform=edge, ha="center", va="center", color="0.3")
            else:
                # the family-wise interval thin and in the same colour: a lighter tint would be one more colour
                ax.plot([r["fw_low"] * scale, r["fw_high"] * scale], [y, y], color=color, linewidth=0.8,
                        zorder=2, solid_capstyle="butt")
                ax.plot([r["ci_low"] * scale, r["ci_high"] * scale], [y, y], color=color, linewidth=3,
                        zorder=3, solid_capstyle="butt")
                ax.plot([r["difference"] * scale], [y], marker="o", color="white", markeredgecolor=color,
                        markersize=4, zorder=4)
            ax.plot([1.03], [y], marker=PAPER_MARK.get(r["direction"], "x"), color="black", markersize=5,
                    transform=edge, clip_on=False, zorder=5)
            # a claim written after its runs has no verdict to show, only that it describes them
            said = ("description\n(written after its runs)" if r.get("written", "before") != "before" else
                    f"{r['verdict'].split(':')[0]}\nfamily-wise: {r['fw_verdict'].split(':')[0]}")
            ax.text(1.06, y, said, transform=edge, va="center", color=color)
        ax.axvline(0, color="black", linewidth=0.9, zorder=2)
        ax.set_yticks(range(len(rows)), [_claim_label(r, several) for _, r in rows.iterrows()])
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.grid(axis="y", visible=False)
        change = set(rows["measure"]) == {"change"}
        what = "tokens" if tokens else "accuracy points"
        ax.set_xlabel(f"left − right, {what}" + (" (change since the start)" if change else ""))
        low, high = ax.get_xlim()
        reach = max(abs(low), abs(high))
        ax.set_xlim(-reach, reach)  # 0 in the middle: each side as far as the other
    level = f"{100 * claims['level'].iloc[0]:.0f}%"
    fw = f"{100 * claims['fw_level'].iloc[0]:.2f}".rstrip("0").rstrip(".") + "%"
    handles = [
        Line2D([], [], color="0.3", linewidth=3, label=f"{level} interval (pooled SD)"),
        Line2D([], [], color="0.3", linewidth=0.8, label=f"family-wise {fw} (Bonferroni)"),
        Patch(facecolor=OKABE_ITO["blue"], alpha=0.15, label="about equal (±margin)"),
        Line2D([], [], marker=">", linestyle="", color="black", label="side claimed (≈: equal)"),
        *[Line2D([], [], color=c, linewidth=3, label=v) for v, c in VERDICT_COLORS.items()],
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=4)
    return fig


def make_figures(data: Runs, out_dir: str | Path = "figures") -> list[Path]:
    """Every figure (PNG + PDF) and the table (CSV, Markdown, LaTeX) of ``data`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = results_table(data)
    shown = table[table["seeds"] > 0].reset_index(drop=True)
    # the eval rows give each run's evaluation floor, under which no pooled SD may fall
    claims = claims_table(data.runs, evals=data.evals, steps=data.steps)
    paths: list[Path] = []
    with plt.rc_context(STYLE):
        paths += _save(accuracy_figure(data, shown), out, "accuracy_grid")
        paths += _save(trace_length_figure(data, shown), out, "trace_length")
        paths += _save(training_curves_figure(data, table), out, "training_curves")
        paths += _save(conversion_figure(data, shown), out, "conversion_regression")
        for name, fig in (("recap_diagnostic", recap_figure(data, shown)),
                          ("battery", battery_figure(data, shown)),
                          ("divergence", divergence_figure(data, shown)),
                          ("claims_forest", claims_forest_figure(claims))):
            if fig is not None:
                paths += _save(fig, out, name)
    paths += write_tables(data, out)
    # within-run outcomes of the cascades, and the arms at equal steps and tokens: where some run has a cascade
    paths += write_paired(data, out)
    paths += write_patterns(data, out)
    if not claims.empty:
        paths.append(out / "claims.md")
        paths[-1].write_text(claims_markdown(claims))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.figures", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--runs",
        nargs="+",
        help="multirun roots, run dirs or dirs above them (default: the newest multirun under --multirun-dir)",
    )
    parser.add_argument("--multirun-dir", default="multirun", help="where to look for the newest multirun")
    parser.add_argument("--out", default="figures", help="output directory (default: figures)")
    parser.add_argument(
        "--source",
        choices=("local", "wandb"),
        default="local",
        help="local run directories (the record) or the W&B API",
    )
    parser.add_argument("--project", default="agon", help="W&B project (--source wandb)")
    parser.add_argument("--entity", default=None, help="W&B entity (--source wandb)")
    parser.add_argument("--group", default=None, help="W&B group, i.e. the sweep name (--source wandb, --wandb)")
    parser.add_argument("--wandb", action="store_true",
                        help="also log the figures and table to W&B, as a run of the sweep's group that its report "
                             "(python -m analysis.dashboard) shows")
    args = parser.parse_args(argv)

    if args.source == "wandb":
        data = load_runs(
            source="wandb",
            project=args.project,
            entity=args.entity,
            filters={"group": args.group} if args.group else None,
        )
        origin = f"W&B project {args.project}" + (f", group {args.group}" if args.group else "")
    else:
        runs = args.runs
        if not runs:
            newest = newest_multirun(args.multirun_dir)
            if newest is None:
                print(
                    f"no multirun under ./{args.multirun_dir}: run `make sweep` first, or pass RUNS=<dir>",
                    file=sys.stderr,
                )
                return 1
            runs = [newest]
        data = load_runs(runs)
        origin = ", ".join(str(r) for r in runs)
    if data.runs.empty:
        print(f"no runs found in {origin}", file=sys.stderr)
        return 1
    paths = make_figures(data, args.out)
    print(f"{len(data.runs)} runs from {origin}\n")
    print(format_table(results_table(data)))
    print(f"\nwrote {len(paths)} files to {args.out}/: " + ", ".join(p.name for p in paths))
    if args.wandb:
        from agon.records.run_files import sweep_name
        from analysis.dashboard import log_figures

        sweep = Path(args.runs[0]) if args.source == "local" and args.runs and len(args.runs) == 1 else None
        group = args.group or (sweep_name(sweep) if sweep is not None else None)
        if group is None:
            print("--wandb needs --group, or a single sweep in --runs", file=sys.stderr)
            return 1
        run_id = log_figures(paths, group, args.project, args.entity, sweep)
        print(f"figures logged to W&B run {run_id} (group {group}, job type figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
