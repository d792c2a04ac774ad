"""``make figures``: the paper's figures and table from a sweep's run directories (or W&B), into ``figures/``.

    python -m analysis.figures                       # the newest multirun under ./multirun
    python -m analysis.figures --runs multirun/2026-11-30/10-00-00 multirun/2026-11-30/11-00-00
    python -m analysis.figures --source wandb --project agon --group 2026-11-30/10-00-00

Writes, each as PNG and PDF:
    accuracy_grid          the 2x2 grid (reward x exchange) of final-stage pass@1, and every cell with the
                           baselines as bars: per-seed points, 95% interval (Student's t over seeds where a cell
                           has several, else a bootstrap over problems), accuracy before training as a tick
    trace_length           final-stage trace length per cell (tokens)
    training_curves        training accuracy and final-stage trace length over steps, one line per cell
    conversion_regression  conversion P(final right | draft wrong) and regression P(final wrong | draft right)
    recap_diagnostic       the challenger's accuracy given its rival's recap, a correct one, a wrong one and none
                           (``eval.diagnostic``), at the first and the last evaluation; only when runs logged it
and ``table.csv``, ``table.md``, ``table.tex`` (analysis.tables.write_tables), and ``claims.md`` (analysis.claims)
where the runs hold the cells of a claim. Output is deterministic: seeded
bootstrap, no timestamps in the PDFs.
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

from agon.methods import METHODS
from analysis.claims import claims_markdown, claims_table
from analysis.load import Runs, is_ablation, is_baseline, load_runs, newest_multirun
from analysis.tables import RECAP_SHOWN, cell_interval, format_table, recap_values, results_table, write_tables

# files only, no display (pyplot picks its backend lazily, at the first figure)
matplotlib.use("Agg")

REWARD_COLORS = {"competitive": "#c44e52", "cooperative": "#4c72b0", "paper": "#dd8452"}
# baselines' colours, in the order the registry lists them (methods it does not know come after); it cycles
BASELINE_COLORS = ("#937860", "#7f7f7f", "#8172b3", "#da8bc3", "#ccb974", "#64b5cd")
CONVERSION_COLOR, REGRESSION_COLOR = "#55a868", "#c44e52"
GRID_REWARDS, GRID_EXCHANGES = ("competitive", "cooperative"), ("visible", "hidden")
STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "hatch.linewidth": 0.8,
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


def cell_style(row: Any, colors: dict[Any, str]) -> dict:
    """Colour, hatch and line style of a cell, the same in every figure: hue = reward (or the baseline's colour in
    ``colors``, from ``baseline_colors``); hidden exchange = lighter, hatched ``//``, dashed; fixed roles = ``xx``,
    dotted; symmetric init = ``..``, dash-dotted."""
    if is_baseline(row["method"]):
        color = colors[row["method"]]
        return {"color": color, "hatch": "", "linestyle": "-", "edge": color}
    base = REWARD_COLORS.get(row["reward"], "#555555")
    hidden = row["exchange"] == "hidden"
    fixed = row["rotation"] == "fixed"
    symmetric = row["init"] == "symmetric"
    linestyle = ":" if fixed else "-." if symmetric else "--" if hidden else "-"
    return {
        "color": _lighter(base) if hidden else base,
        "hatch": ("//" if hidden else "") + ("xx" if fixed else "") + (".." if symmetric else ""),
        "linestyle": linestyle,
        # hatches are drawn in the edge colour: white on a full-colour bar, the base colour on a light one
        "edge": base if hidden or not (fixed or symmetric) else "white",
        "line": base,
    }


def _save(fig: plt.Figure, out: Path, name: str) -> list[Path]:
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    fig.savefig(paths[0], bbox_inches="tight", metadata={"Software": None})
    fig.savefig(paths[1], bbox_inches="tight", metadata={"CreationDate": None, "Creator": None, "Producer": None})
    plt.close(fig)
    return paths


def _setting(data: Runs) -> str:
    runs = data.runs
    tasks = ", ".join(sorted({str(t) for t in runs["task"].dropna()})) or "?"
    models = ", ".join(sorted({str(m) for m in runs["model"].dropna()})) or "?"
    return f"task: {tasks} · model: {models}"


def _tick(row: Any) -> str:
    """A cell's x tick label: one line per part of its label, long parts wrapped."""
    # a named experiment shows by its name alone: "[experiment=grpo_matched]" would not fit under one bar
    cell = str(row["cell"]).replace("[experiment=", "[")
    parts = cell.replace(" [", " · [").replace(" (", " · (").replace(",", ", ").split(" · ")
    lines = [line for part in parts for line in textwrap.wrap(part, 14, break_on_hyphens=False)]
    return "\n".join([*lines, f"(n={int(row['seeds'])})"])


def _bars(ax: plt.Axes, data: Runs, table: pd.DataFrame, metric: str, eval_column: str, scale: float) -> None:
    """One bar per cell (mean over seeds), its seeds as points, its 95% interval as an error bar."""
    runs = data.runs[data.runs["status"] == "complete"]
    rng = np.random.default_rng(0)
    colors = baseline_colors(table["method"])
    for x, (_, row) in enumerate(table.iterrows()):
        style = cell_style(row, colors)
        cell_runs = runs[runs["cell_key"] == row["cell_key"]]
        values = pd.to_numeric(cell_runs[metric], errors="coerce").dropna()
        if values.empty:
            ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=8, color="0.4")
            continue
        ax.bar(
            x,
            values.mean() * scale,
            width=0.7,
            color=style["color"],
            hatch=style["hatch"],
            edgecolor=style["edge"],
            linewidth=1.0,
            zorder=2,
        )
        jitter = rng.uniform(-0.12, 0.12, len(values)) if len(values) > 1 else np.zeros(1)
        ax.scatter(x + jitter, values * scale, s=18, color="black", zorder=4, linewidths=0)
        lo, hi, _ = cell_interval(cell_runs, data.evals, metric, eval_column)
        if not math.isnan(lo):
            mean = values.mean() * scale
            ax.errorbar(
                x,
                mean,
                yerr=[[mean - lo * scale], [hi * scale - mean]],
                color="black",
                capsize=4,
                linewidth=1.2,
                zorder=3,
            )
    ax.set_xticks(range(len(table)), [_tick(r) for _, r in table.iterrows()], fontsize=8)
    ax.set_xlim(-0.6, len(table) - 0.4)


def accuracy_figure(data: Runs, table: pd.DataFrame) -> plt.Figure:
    fig = plt.figure(figsize=(max(11.0, 5.5 + 0.95 * len(table)), 5.0), layout="constrained")
    grid_ax, bar_ax = fig.subplots(1, 2, width_ratios=[1.3, max(1.6, 0.4 * len(table))])

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
            ci = (
                ""
                if math.isnan(row["accuracy_ci_low"])
                else (f"\nCI {row['accuracy_ci_low'] * 100:.1f}–{row['accuracy_ci_high'] * 100:.1f}")
            )
            delta = "" if math.isnan(row["delta"]) else f"\nΔ {row['delta'] * 100:+.1f} pts"
            notes[i][j] = f"{values[i, j]:.1f}%{ci}{delta}\nn={int(row['seeds'])}"
    finite = values[np.isfinite(values)]
    vmin, vmax = (max(0.0, finite.min() - 5), min(100.0, finite.max() + 5)) if finite.size else (0.0, 100.0)
    masked = np.ma.masked_invalid(values)
    cmap = plt.get_cmap("YlGn").with_extremes(bad="0.92")
    image = grid_ax.imshow(masked, cmap=cmap, vmin=vmin, vmax=vmax)
    for i in range(2):
        for j in range(2):
            dark = np.isfinite(values[i, j]) and (values[i, j] - vmin) / max(vmax - vmin, 1e-9) > 0.6
            grid_ax.text(j, i, notes[i][j], ha="center", va="center", fontsize=9, color="white" if dark else "black")
    grid_ax.set_xticks([0, 1], [f"exchange:\n{e}" for e in GRID_EXCHANGES])
    grid_ax.set_yticks([0, 1], [f"reward:\n{r}" for r in GRID_REWARDS])
    grid_ax.grid(False)
    for side in ("top", "right", "left", "bottom"):
        grid_ax.spines[side].set_visible(False)
    grid_ax.set_title("2x2 grid: pass@1, 95% CI,\nchange since start (Δ), seeds (n)")
    fig.colorbar(image, ax=grid_ax, shrink=0.6, label="pass@1 (%)")

    # every cell, baselines included
    _bars(bar_ax, data, table, "eval/accuracy", "correct", 100)
    runs = data.runs[data.runs["status"] == "complete"]
    for x, (_, row) in enumerate(table.iterrows()):
        start = pd.to_numeric(
            runs.loc[runs["cell_key"] == row["cell_key"], "eval/accuracy_at_start"], errors="coerce"
        ).dropna()
        if not start.empty:
            bar_ax.plot(
                [x - 0.35, x + 0.35],
                [start.mean() * 100] * 2,
                color="0.25",
                linestyle=(0, (2, 1.5)),
                linewidth=1.4,
                zorder=5,
            )
    bar_ax.set_ylabel("final-stage pass@1 (%)")
    bar_ax.set_ylim(0, min(100, max(10.0, (bar_ax.get_ylim()[1]) * 1.08)))
    bar_ax.set_title("Every cell and baseline (CI over seeds where n>1, else over problems)")
    bar_ax.legend(
        handles=[
            Line2D([], [], marker="o", linestyle="", color="black", markersize=4, label="one seed"),
            Line2D([], [], color="black", marker="_", markersize=8, label="95% CI (t over seeds)"),
            Line2D([], [], color="0.25", linestyle=(0, (2, 1.5)), label="before training"),
            *[
                Patch(facecolor=color, label=f"{reward} reward")
                for reward, color in REWARD_COLORS.items()
                if (table["reward"] == reward).any()
            ],
            *(
                [Patch(facecolor="white", edgecolor="0.3", hatch="//", label="hidden exchange")]
                if (table["exchange"] == "hidden").any()
                else []
            ),
            *(
                [Patch(facecolor="white", edgecolor="0.3", hatch="xx", label="fixed roles")]
                if (table["rotation"] == "fixed").any()
                else []
            ),
            *(
                [Patch(facecolor="white", edgecolor="0.3", hatch="..", label="symmetric init")]
                if (table["init"] == "symmetric").any()
                else []
            ),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
    )
    fig.suptitle(f"Cascade accuracy after training ({_setting(data)})")
    return fig


def trace_length_figure(data: Runs, table: pd.DataFrame) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(max(6.0, 1.25 * len(table) + 1.5), 4.2), layout="constrained")
    _bars(ax, data, table, "eval/final_trace_tokens", "tokens", 1)
    ax.set_ylabel("final-stage completion length (tokens)")
    ax.set_title(
        f"Final-stage trace length after training ({_setting(data)})\n"
        "bars: mean over seeds · points: seeds · error bars: 95% CI",
        fontsize=10,
    )
    return fig


def _smooth(series: pd.Series, steps: int) -> pd.Series:
    window = max(1, steps // 10)
    return series.rolling(window, min_periods=1, center=True).mean()


def training_curves_figure(data: Runs, table: pd.DataFrame) -> plt.Figure:
    fig, (acc_ax, len_ax) = plt.subplots(1, 2, figsize=(12, 4.4), layout="constrained", sharex=True)
    steps = data.steps
    handles = []
    colors = baseline_colors(table["method"])
    for _, row in table.iterrows():
        style = cell_style(row, colors)
        rows = steps[steps["cell_key"] == row["cell_key"]] if "cell_key" in steps else steps.iloc[:0]
        if rows.empty:
            continue
        color = style.get("line", style["color"])
        for ax, column, scale in ((acc_ax, "train/accuracy", 100), (len_ax, "train/final_trace_tokens", 1)):
            if column not in rows:
                continue
            per_step = rows.dropna(subset=[column]).groupby("train/step")[column].mean() * scale
            if per_step.empty:
                continue
            n = int(per_step.index.max()) + 1
            if len(per_step) > 15:
                ax.plot(per_step.index, per_step.values, color=color, alpha=0.2, linewidth=0.8)
            ax.plot(
                per_step.index, _smooth(per_step, n).values, color=color, linestyle=style["linestyle"], linewidth=1.8
            )
        if "eval/accuracy" in rows:
            ev = rows.dropna(subset=["eval/accuracy"]).groupby("train/step")["eval/accuracy"].mean() * 100
            acc_ax.scatter(ev.index, ev.values, color=color, edgecolor="black", s=28, zorder=4, linewidths=0.6)
        incomplete = int(row.get("incomplete", 0) or 0)
        note = f"n={int(row['seeds'])}" + (f", {incomplete} incomplete" if incomplete else "")
        handles.append(
            Line2D([], [], color=color, linestyle=style["linestyle"], linewidth=1.8, label=f"{row['cell']} ({note})")
        )
    if not handles:
        for ax in (acc_ax, len_ax):
            ax.text(0.5, 0.5, "no metrics.jsonl rows", ha="center", va="center", transform=ax.transAxes)
    handles.append(
        Line2D(
            [], [], marker="o", linestyle="", color="white", markeredgecolor="black", label="held-out eval (pass@1)"
        )
    )
    low, high = acc_ax.get_ylim()
    acc_ax.set_ylim(max(0.0, low), min(100.0, max(high, max(0.0, low) + 10)))
    acc_ax.set_ylabel("accuracy of final-stage completions (%)")
    acc_ax.set_title("Training accuracy (mean over seeds; smoothed)")
    len_ax.set_ylabel("final-stage completion length (tokens)")
    len_ax.set_title("Final-stage trace length during training")
    for ax in (acc_ax, len_ax):
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    len_ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    fig.suptitle(f"Training curves ({_setting(data)})")
    return fig


def conversion_figure(data: Runs, table: pd.DataFrame) -> plt.Figure:
    shown = table[table["conversion_rate"].notna() | table["regression_rate"].notna()]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(shown) + 2), 4.2), layout="constrained")
    runs = data.runs[data.runs["status"] == "complete"]
    rng = np.random.default_rng(0)
    width = 0.38
    for x, (_, row) in enumerate(shown.iterrows()):
        cell_runs = runs[runs["cell_key"] == row["cell_key"]]
        for offset, metric, color, hatch in (
            (-width / 2, "eval/conversion_rate", CONVERSION_COLOR, ""),
            (width / 2, "eval/regression_rate", REGRESSION_COLOR, "\\\\"),
        ):
            values = pd.to_numeric(cell_runs[metric], errors="coerce").dropna() * 100
            if values.empty:
                continue
            ax.bar(x + offset, values.mean(), width=width, color=color, hatch=hatch, edgecolor="white", zorder=2)
            ax.text(
                x + offset,
                1,
                f"{values.mean():.1f}",
                ha="center",
                va="bottom",
                fontsize=7,
                zorder=5,
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
            )
            jitter = rng.uniform(-0.06, 0.06, len(values)) if len(values) > 1 else np.zeros(1)
            ax.scatter(x + offset + jitter, values, s=14, color="black", zorder=4, linewidths=0)
            lo, hi, how = cell_interval(cell_runs, None, metric, "")
            if how == "seeds":
                ax.errorbar(
                    x + offset,
                    values.mean(),
                    yerr=[[values.mean() - lo * 100], [hi * 100 - values.mean()]],
                    color="black",
                    capsize=3,
                    linewidth=1.0,
                    zorder=3,
                )
    ax.set_xticks(range(len(shown)), [_tick(r) for _, r in shown.iterrows()], fontsize=8)
    if shown.empty:
        ax.text(
            0.5,
            0.5,
            "no cascade results (conversion and regression are null)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    ax.set_ylabel("rate over held-out problems (%)")
    ax.set_ylim(0, min(100.0, max(10.0, ax.get_ylim()[1] * 1.25)))
    ax.set_title(
        f"Conversion and regression in the cascade ({_setting(data)})\n"
        "points: seeds · error bars: 95% t interval over seeds (cells with several)",
        fontsize=10,
    )
    ax.legend(
        handles=[
            Patch(facecolor=CONVERSION_COLOR, label="conversion  P(final right | draft wrong)"),
            Patch(
                facecolor=REGRESSION_COLOR,
                hatch="\\\\",
                edgecolor="white",
                label="regression  P(final wrong | draft right)",
            ),
        ],
        loc="upper right",
        fontsize=8,
    )
    return fig


RECAP_COLORS = ("#8172b3", "#55a868", "#c44e52", "#b0b0b0")


def recap_figure(data: Runs, table: pd.DataFrame) -> plt.Figure | None:
    """Grouped bars per cell: the recap conditions at the first and at the last evaluation; None without data."""
    steps = data.steps
    if steps.empty or not any(c.startswith("recap/") for c in steps.columns):
        return None
    shown = [r for _, r in table.iterrows() if not recap_values(steps, r, "none", "last").empty]
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 2.2 * len(shown) + 2), 4.4), layout="constrained", sharey=True)
    rng = np.random.default_rng(0)
    width = 0.8 / len(RECAP_SHOWN)
    for ax, which in zip(axes, ("first", "last")):
        for x, row in enumerate(shown):
            for k, (condition, color) in enumerate(zip(RECAP_SHOWN, RECAP_COLORS)):
                values = recap_values(steps, row, condition, which).dropna() * 100
                if values.empty:
                    continue
                at = x - 0.4 + width * (k + 0.5)
                ax.bar(at, values.mean(), width=width, color=color, zorder=2)
                jitter = rng.uniform(-width / 4, width / 4, len(values)) if len(values) > 1 else np.zeros(1)
                ax.scatter(at + jitter, values, s=10, color="black", zorder=4, linewidths=0)
        ax.set_xticks(range(len(shown)), [_tick(r) for r in shown], fontsize=8)
        ax.set_title("first evaluation (before training)" if which == "first" else "last evaluation")
    axes[0].set_ylabel("challenger's accuracy (%)")
    axes[1].legend(handles=[Patch(facecolor=c, label=RECAP_SHOWN[k]) for k, c in zip(RECAP_SHOWN, RECAP_COLORS)],
                   loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    fig.suptitle(f"What the challenger does with a recap ({_setting(data)}); bars: mean over seeds, points: seeds")
    return fig


def make_figures(data: Runs, out_dir: str | Path = "figures") -> list[Path]:
    """Every figure (PNG + PDF) and the table (CSV, Markdown, LaTeX) of ``data`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = results_table(data)
    shown = table[table["seeds"] > 0].reset_index(drop=True)
    paths: list[Path] = []
    with plt.rc_context(STYLE):
        paths += _save(accuracy_figure(data, shown), out, "accuracy_grid")
        paths += _save(trace_length_figure(data, shown), out, "trace_length")
        paths += _save(training_curves_figure(data, table), out, "training_curves")
        paths += _save(conversion_figure(data, shown), out, "conversion_regression")
        recap = recap_figure(data, shown)
        if recap is not None:
            paths += _save(recap, out, "recap_diagnostic")
    paths += write_tables(data, out)
    claims = claims_table(data.runs)
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
    parser.add_argument("--group", default=None, help="W&B group, i.e. the sweep name (--source wandb)")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
