"""Per-cell tables: the sweep summary printed after a multirun, and the paper table (CSV, Markdown, LaTeX).

``cells_table(runs)`` pools the complete runs of each cell (seeds) into one row: mean accuracy at start and at the
end, their difference, conversion and regression rates and final-stage trace length, and where the runs logged
them the adapters' agreement and divergence (``eval/agree_AB``, ``eval/agree_AA``, ``eval/agree_BB``,
``eval/divergence``; runs from before those metrics existed have none, and then no column shows them).
``results_table`` adds a 95% interval of the accuracy (Student's t over seeds where a cell has several, else a
bootstrap over problems of its one run) and the paper's reported values where the cell matches one (``PAPER``,
read from ``paper_results.yaml``, the data file that cites them). Fractions stay fractions in the frames; the text
formats show percentages. ``two_generations`` reads the recap diagnostic's answers that take two generations each
(drafts, then an answer after a recap), GRPO's adapter answering its own recap among them.
"""

from __future__ import annotations

import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from analysis.labels import cell_label
from analysis.load import NA, Runs, load_runs

# summary.json key -> cells_table column
METRICS = {
    "eval/accuracy_at_start": "accuracy_at_start",
    "eval/accuracy": "accuracy",
    "eval/conversion_rate": "conversion_rate",
    "eval/regression_rate": "regression_rate",
    "eval/final_trace_tokens": "final_trace_tokens",
}
# the two adapters' agreement: P(a draft by A and one by B to the same problem give the same final answer), the
# same for two drafts of one adapter, and divergence = mean(agree_AA, agree_BB) - agree_AB (0 when A and B act as
# one policy). Shown only when some run has a divergence: the results packed before it existed have none
AGREEMENT = ("eval/divergence", "eval/agree_AB", "eval/agree_AA", "eval/agree_BB")
AGREEMENT_COLUMNS = ("divergence", "agree_AB", "agree_self")
AXIS_COLUMNS = ["method", "reward", "exchange", "rotation", "init"]
PERCENT_COLUMNS = (
    "accuracy_at_start",
    "accuracy",
    "delta",
    "conversion_rate",
    "regression_rate",
    "accuracy_ci_low",
    "accuracy_ci_high",
    "paper_accuracy",
    "agree_AB",
    "agree_self",
)
# differences of two fractions, shown in signed points
SIGNED_COLUMNS = ("delta", "divergence")
TEXT_COLUMNS = ("cell", "method", "reward", "exchange", "rotation", "init", "task", "model", "extra", "ci_over")
HEADERS = {
    "cell": "cell",
    "seeds": "seeds",
    "incomplete": "incomplete",
    "accuracy_at_start": "acc@start %",
    "accuracy": "acc %",
    "delta": "delta",
    "accuracy_ci_low": "95% CI low",
    "accuracy_ci_high": "95% CI high",
    "ci_over": "CI over",
    "conversion_rate": "conversion %",
    "regression_rate": "regression %",
    "final_trace_tokens": "trace tokens",
    "divergence": "divergence",
    "agree_AB": "agree A·B %",
    "agree_self": "agree self %",
    "paper_accuracy": "paper acc %",
    "paper_trace_tokens": "paper tokens",
    "paper_setting": "paper setting",
}


def _paper_results() -> tuple[str, list[tuple[dict[str, Any], float, float | None]]]:
    """(the paper's setting, [(what a cell must match, reported pass@1, reported trace tokens)]) from
    ``paper_results.yaml``, which says where each number comes from."""
    data = yaml.safe_load(resources.files("analysis").joinpath("paper_results.yaml").read_text())
    return data["setting"], [
        (r["match"], float(r["pass_at_1"]), None if r["tokens"] is None else float(r["tokens"]))
        for r in data["results"]
    ]


PAPER_SETTING, PAPER = _paper_results()


def _model_size(model: Any) -> str:
    """``qwen3_0.6b`` -> ``0.6b``, ``Qwen/Qwen3-14B`` or ``Qwen3-14B`` -> ``14b``; "" when the name has no
    parameter count. Gemma's E2B/E4B are effective sizes, not parameter counts: ``Gemma 4 E2B`` has none."""
    match = re.search(r"(?<![a-z\d.])(\d+(?:\.\d+)?)b(?![a-z])", str(model).lower())
    return f"{match.group(1)}b" if match else ""


def paper_reference(row: Any) -> tuple[float, float | None, str] | None:
    """``(paper pass@1, paper trace tokens, setting note)`` for a cell the paper reports, else None.

    The paper's Agon uses the competitive reward; ``reward=paper`` (a weighted form of it,
    ``conf/reward/paper.yaml``) matches too.
    """
    values = {k: row.get(k) for k in ("method", "reward", "exchange", "rotation", "init")}
    if values["reward"] == "paper":
        values["reward"] = "competitive"
    values["model_size"] = _model_size(row.get("model"))
    for match, accuracy, tokens in PAPER:
        if all(values.get(k) == v for k, v in match.items()):
            same_task = str(row.get("task", "")).startswith("deepmath")
            size = match.get("model_size", "0.6b")
            same = same_task and values["model_size"] == size
            model = "Qwen3-4B" if size == "4b" else "Qwen3-0.6B"
            note = "same setting" if same else f"reported on {model}, DeepMath-hard: a different model/task"
            return accuracy, tokens, note
    return None


# ---------------------------------------------------------------------------------------------------------------
# statistics


def bootstrap_ci(values: Any, level: float = 0.95, n_resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean; (nan, nan) for fewer than two values. Deterministic (seeded)."""
    x = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))], float)
    if len(x) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_resamples, len(x)))].mean(axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def t_interval(values: Any, level: float = 0.95, bounds: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float]:
    """Student's t interval of the mean, clipped to ``bounds``; (nan, nan) for fewer than two values. The interval
    over a handful of seeds: a bootstrap of 3 values never leaves their range, so it claims far more than 3 seeds
    can show (at 3 seeds t is 4.30, not 1.96)."""
    from scipy import stats

    x = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))], float)
    if len(x) < 2:
        return math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(max(bounds[0], x.mean() - half)), float(min(bounds[1], x.mean() + half))


def final_evaluation(evals: pd.DataFrame, run_id: Any | None = None) -> pd.DataFrame:
    """The rows of one run's final evaluation, both stages: ``evals`` holds eval.jsonl rows (of the run ``run_id``
    where it has a ``run_id`` column and one is given), of phase ``final`` where there are any (else of any phase but
    ``start``: the evaluation before training is never read as the final one), at the largest step (an extended run
    keeps the final evaluation of its shorter self). ``final_rows`` and ``analysis.paired`` read it through this."""
    rows = evals
    if run_id is not None and "run_id" in rows:
        rows = rows[rows["run_id"] == run_id]
    if rows.empty:
        return rows
    if "phase" in rows:
        rows = rows[rows["phase"] == "final"] if (rows["phase"] == "final").any() else rows[rows["phase"] != "start"]
    if "step" in rows and len(rows):
        rows = rows[rows["step"] == rows["step"].max()]
    return rows


def final_rows(evals: pd.DataFrame, run: Any) -> pd.DataFrame:
    """Final-stage eval rows of one run's last evaluation (``final_evaluation``: the evaluation before training,
    which ``analysis.pack`` keeps beside the final one, is never read as a final), in the orders its headline
    accuracy averages."""
    rows = final_evaluation(evals, run["run_id"]) if "run_id" in evals else evals.iloc[:0]
    return headline_rows(rows, run)


def headline_rows(rows: pd.DataFrame, run: Any) -> pd.DataFrame:
    """The final-stage rows of one evaluation's ``rows`` in the orders ``run``'s headline accuracy averages (its
    ``headline_orders``; without them, the cascade orders, or every order where there is no cascade)."""
    if rows.empty:
        return rows
    rows = rows[rows["stage"] == "final"]
    orders = run.get("headline_orders")
    if not isinstance(orders, (list, tuple)) or not orders:
        cascades = [o for o in rows["order"].unique() if ">" in str(o)]
        orders = cascades or list(rows["order"].unique())
    return rows[rows["order"].isin(list(orders))]


def per_problem(evals: pd.DataFrame, run: Any, column: str = "correct") -> pd.Series:
    """Per-problem mean of ``column`` (correctness or tokens) over samples and headline orders of one run."""
    rows = final_rows(evals, run)
    if rows.empty:
        return pd.Series(dtype=float)
    return rows.groupby("problem_id")[column].mean().astype(float)


def cell_interval(runs: pd.DataFrame, evals: pd.DataFrame, metric: str, eval_column: str) -> tuple[float, float, str]:
    """95% interval of a cell's ``metric``: Student's t over seeds if it has several runs, else a bootstrap over its
    run's problems."""
    values = runs[metric].dropna() if metric in runs else pd.Series(dtype=float)
    if len(values) >= 2:  # accuracies and rates lie in [0, 1], lengths in [0, inf)
        return (*t_interval(values, bounds=(0.0, 1.0 if eval_column == "correct" else math.inf)), "seeds")
    if len(runs) == 1 and evals is not None and not evals.empty:
        lo, hi = bootstrap_ci(per_problem(evals, runs.iloc[0], eval_column))
        if not math.isnan(lo):
            return lo, hi, "problems"
    return math.nan, math.nan, ""


# ---------------------------------------------------------------------------------------------------------------
# tables


def cells_table(runs: pd.DataFrame | Runs) -> pd.DataFrame:
    """One row per cell from the complete runs: axes, seed count, mean metrics over seeds (fractions).

    Columns: cell, method, reward, exchange, rotation, init, [task, model, extra when they vary or are set],
    seeds, [incomplete: runs without summary.json, when any], accuracy_at_start, accuracy, delta,
    conversion_rate, regression_rate, final_trace_tokens, [divergence, agree_AB, agree_self: when some run logged
    ``eval/divergence`` or the agreements; agree_self is each run's mean of agree_AA and agree_BB].
    Axes that do not apply to a method hold "-". Rows come in the order of ``analysis.load.cell_sort_key``.
    """
    if isinstance(runs, Runs):
        runs = runs.runs
    columns = ["cell", *AXIS_COLUMNS, "seeds", *METRICS.values()]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    runs = runs.copy()
    for key in METRICS:
        if key not in runs:
            runs[key] = np.nan
        runs[key] = pd.to_numeric(runs[key], errors="coerce")
    rows = []
    for key, group in runs.groupby("cell_key", sort=False):
        done = group[group["status"] == "complete"]
        first = group.iloc[0]
        row = {c: first[c] for c in ["cell", *AXIS_COLUMNS, "task", "model", "extra"]}
        row["cell_key"] = key
        row["seeds"] = len(done)
        row["incomplete"] = len(group) - len(done)
        for src, dst in METRICS.items():
            row[dst] = done[src].mean() if len(done) else math.nan
        row["delta"] = (done["eval/accuracy"] - done["eval/accuracy_at_start"]).mean() if len(done) else math.nan
        row.update(_agreement(done))
        rows.append(row)
    table = pd.DataFrame(rows)
    keep = ["cell", *AXIS_COLUMNS]
    for optional in ("task", "model"):
        if table[optional].nunique(dropna=False) > 1:
            keep.append(optional)
    if (table["extra"].fillna("") != "").any():
        keep.append("extra")
    keep.append("seeds")
    if table["incomplete"].any():
        keep.append("incomplete")
    keep += ["accuracy_at_start", "accuracy", "delta", "conversion_rate", "regression_rate", "final_trace_tokens"]
    if has_agreement(runs):
        keep += list(AGREEMENT_COLUMNS)
    return table[keep + ["cell_key"]].reset_index(drop=True).rename_axis(None)


def has_agreement(runs: pd.DataFrame) -> bool:
    """Whether some run has a divergence (a number, not only nulls). It needs two drafts per problem from each
    adapter; a run of one sample per problem has agree_AB alone, which says nothing without the adapters' own
    agreement to compare it with, so it shows no column."""
    key = AGREEMENT[0]
    return key in runs and bool(pd.to_numeric(runs[key], errors="coerce").notna().any())


def _agreement(done: pd.DataFrame) -> dict[str, float]:
    """A cell's mean over seeds of divergence, agree_AB and agree_self (each run's mean of agree_AA and agree_BB);
    nan where its runs logged none (GRPO has one adapter)."""
    def column(key: str) -> pd.Series:
        return pd.to_numeric(done[key], errors="coerce") if key in done else pd.Series(math.nan, done.index)

    own = pd.concat([column("eval/agree_AA"), column("eval/agree_BB")], axis=1).mean(axis=1)
    return {"divergence": column("eval/divergence").mean(), "agree_AB": column("eval/agree_AB").mean(),
            "agree_self": own.mean()}


def results_table(data: Runs) -> pd.DataFrame:
    """``cells_table`` plus the accuracy's 95% interval and the paper's values where the cell matches."""
    table = cells_table(data.runs)
    if table.empty:
        return table
    runs = data.runs[data.runs["status"] == "complete"]
    lows, highs, over, paper_acc, paper_tok, paper_note = [], [], [], [], [], []
    for _, row in table.iterrows():
        cell_runs = runs[runs["cell_key"] == row["cell_key"]]
        lo, hi, how = cell_interval(cell_runs, data.evals, "eval/accuracy", "correct")
        lows.append(lo)
        highs.append(hi)
        over.append(how)
        first = cell_runs.iloc[0] if len(cell_runs) else row
        ref = paper_reference(first)
        paper_acc.append(ref[0] if ref else math.nan)
        paper_tok.append(ref[1] if ref and ref[1] is not None else math.nan)
        paper_note.append(ref[2] if ref else "")
    at = table.columns.get_loc("delta") + 1
    table.insert(at, "accuracy_ci_low", lows)
    table.insert(at + 1, "accuracy_ci_high", highs)
    table.insert(at + 2, "ci_over", over)
    table["paper_accuracy"] = paper_acc
    table["paper_trace_tokens"] = paper_tok
    table["paper_setting"] = paper_note
    return table


def _fmt(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NA
    if column in SIGNED_COLUMNS:
        return f"{100 * value:+.1f}"
    if column in PERCENT_COLUMNS:
        return f"{100 * value:.1f}"
    if column in ("final_trace_tokens", "paper_trace_tokens"):
        return f"{value:.1f}" if value < 100 else f"{value:,.0f}"
    return str(value)


HIDDEN = ("cell_key", "paper_setting")


def _display(
    df: pd.DataFrame, star: bool = False, label: bool = False
) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, formatted rows and column names. ``label``: the cell's label instead of its axis columns;
    ``star``: paper values reported in another setting get a ``*``."""
    drop = set(HIDDEN) | (set(AXIS_COLUMNS) if label else {"cell"})
    cols = [c for c in df.columns if c not in drop]
    header = [HEADERS.get(c, c) for c in cols]
    body = []
    for _, row in df.iterrows():
        cells = [_fmt(c, row[c]) for c in cols]
        other = str(row.get("paper_setting") or "") not in ("", "same setting")
        if star and other:
            cells = [v + "*" if c.startswith("paper_") and v != NA else v for c, v in zip(cols, cells)]
        body.append(cells)
    return header, body, cols


def format_table(df: pd.DataFrame) -> str:
    """A cells or results table as aligned plain text (percentages with one decimal, "-" where not applicable)."""
    if df.empty:
        return "(no runs)"
    header, body, cols = _display(df, star=True)
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
    left = [c in TEXT_COLUMNS for c in cols]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if text else c.rjust(w) for c, w, text in zip(cells, widths, left)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in body)])


def _caption(data: Runs) -> str:
    runs = data.runs
    tasks = sorted({str(t) for t in runs.get("task", pd.Series(dtype=str)).dropna()})
    models = sorted({str(m) for m in runs.get("model", pd.Series(dtype=str)).dropna()})
    text = (
        f"Final-stage pass@1 on task {', '.join(tasks) or '?'} with model {', '.join(models) or '?'}, "
        "mean over seeds; delta = accuracy after training minus before; 95% interval: Student's t over seeds "
        "where a cell has several, else a percentile bootstrap over held-out problems; "
        "conversion = P(final right | draft wrong), regression = P(final wrong | draft right); "
        "trace tokens = final-stage completion length. "
        f"Paper values are as reported ({PAPER_SETTING}; Agon on 0.6B also beats GRPO on 4B, 59%)."
    )
    if has_agreement(runs):
        text += (
            " agree A·B = P(drafts by A and by B to the same problem give the same answer), agree self = the same "
            "for two drafts of one adapter (mean of A's and B's); divergence = agree self minus agree A·B, in "
            "points (0 when A and B act as one policy)."
        )
    if not all(t.startswith("deepmath") for t in tasks):
        text += (
            " Marked *: reported on a different model and task; absolute numbers are not comparable with this "
            "run's task, only the ordering of cells is."
        )
    return text


def to_markdown(table: pd.DataFrame, caption: str = "") -> str:
    """A pipe table (GitHub Markdown) with the caption above it."""
    header, body, cols = _display(table, star=True, label=True)
    align = [":--" if c in TEXT_COLUMNS else "--:" for c in cols]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return (f"{caption}\n\n" if caption else "") + "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("_", r"\_"),
        ("#", r"\#"),
        ("$", r"\$"),
        ("{", r"\{"),
        ("}", r"\}"),
        ("~", r"\textasciitilde{}"),
        ("^", r"\^{}"),
    ):
        text = text.replace(a, b)
    return text.replace("·", r"$\cdot$")


# the one-column table (``table.tex``): the columns a reader compares, the rest in the appendix table
COMPACT_HEADERS = ("cell", "$n$", r"pass@1 \% [95\% CI]", r"$\Delta$", r"conv.\ / regr.\ \%", "tokens",
                   r"paper \%")


def _compact_rows(table: pd.DataFrame) -> list[list[str]]:
    rows = []
    for _, row in table.iterrows():
        def f(column: str) -> str:
            return _fmt(column, row.get(column, math.nan))

        ci = "" if f("accuracy_ci_low") == NA else f" [{f('accuracy_ci_low')}, {f('accuracy_ci_high')}]"
        other = str(row.get("paper_setting") or "") not in ("", "same setting")
        paper = f("paper_accuracy")
        rows.append([
            _latex_escape(cell_label(row["cell"])), str(int(row["seeds"])), f("accuracy") + ci, f("delta"),
            f"{f('conversion_rate')} / {f('regression_rate')}", f("final_trace_tokens"),
            paper + (r"$^{*}$" if other and paper != NA else ""),
        ])
    return rows


def to_latex(table: pd.DataFrame, caption: str = "") -> str:
    r"""The one-column booktabs table (``tab:agon-cells``): cell, seeds, pass@1 with its interval, change since the
    start, conversion / regression, trace tokens, the paper's value; 7 columns, ``\footnotesize``, the cell's name
    in a ragged 2.6 cm column (needs ``\usepackage{booktabs,array}``). ``to_latex_full`` has every column."""
    out = [r"\begin{table}[t]", r"\centering", r"\footnotesize", r"\setlength{\tabcolsep}{3pt}",
           r"\begin{tabular}{@{}>{\raggedright\arraybackslash}p{2.6cm}rrrrrr@{}}", r"\toprule",
           " & ".join(COMPACT_HEADERS) + r" \\", r"\midrule"]
    out += [" & ".join(r) + r" \\" for r in _compact_rows(table)]
    out += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        out.append(rf"\caption{{{_latex_escape(caption).replace('Marked *', r'Marked $^{*}$')} The appendix table "
                   r"(Table~\ref{tab:agon-cells-full}) has every column.}")
    out += [r"\label{tab:agon-cells}", r"\end{table}"]
    return "\n".join(out) + "\n"


def to_latex_full(table: pd.DataFrame, caption: str = "") -> str:
    """Every column, for the appendix: a full-width booktabs ``table*`` with the label ``tab:agon-cells-full``."""
    header, body, cols = _display(table, star=True, label=True)
    spec = "".join("l" if c in TEXT_COLUMNS else "r" for c in cols)
    out = [r"\begin{table*}[t]", r"\centering", r"\scriptsize", rf"\begin{{tabular}}{{{spec}}}", r"\toprule"]
    out.append(" & ".join(_latex_escape(h) for h in header) + r" \\")
    out.append(r"\midrule")
    out += [" & ".join(_latex_escape(c).replace("*", r"$^{*}$") for c in r) + r" \\" for r in body]
    out += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        out.append(rf"\caption{{{_latex_escape(caption).replace('Marked *', r'Marked $^{*}$')}}}")
    out += [r"\label{tab:agon-cells-full}", r"\end{table*}"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# the recap diagnostic (eval.diagnostic: agon.game.diagnostic.diagnose)

RECAP_SHOWN = {"rival": "rival's recap", "correct": "correct recap", "wrong": "wrong recap", "none": "no recap"}


def challengers(row: Any, steps: pd.DataFrame) -> list[str]:
    """The adapters that answer in a cell's training: B alone under fixed roles, else every adapter it logged."""
    logged = {c.split("/")[1] for c in steps.columns if c.startswith("recap/") and c.count("/") == 2}
    logged = sorted(logged - {"base"})
    return ["B"] if row.get("rotation") == "fixed" and "B" in logged else logged


def recap_values(steps: pd.DataFrame, row: Any, condition: str, which: str | int,
                 read_as: str = "recap") -> pd.Series:
    """Per run, the challengers' mean accuracy under ``condition`` at the run's ``first`` or ``last`` diagnostic,
    or at a given step (runs that logged none there are left out). ``read_as``: ``recap`` (the text recap on the
    visible prompt) or ``latent`` (the same condition as a key/value prefix, logged by latent-exchange runs)."""
    rows = steps[steps["cell_key"] == row["cell_key"]]
    columns = [f"{read_as}/{a}/{condition}" for a in challengers(row, steps)]
    columns = [c for c in columns if c in rows]
    if not columns:
        return pd.Series(dtype=float)
    rows = rows.dropna(subset=columns, how="all")
    out = {}
    for run_id, run_rows in rows.groupby("run_id"):
        at = {"first": run_rows["train/step"].min(), "last": run_rows["train/step"].max()}.get(which, which)
        if not (run_rows["train/step"] == at).any():
            continue
        out[run_id] = float(run_rows[run_rows["train/step"] == at][columns].mean(axis=1).mean())
    return pd.Series(out, dtype=float)


def diagnostic_tables(data: Runs, table: pd.DataFrame) -> str:
    """Markdown: per cell and evaluation step, the challengers' accuracy under each recap condition (mean over
    seeds); for latent-exchange cells the same conditions read as key/value prefixes; then the cross-play matrix
    of each cell at its last evaluation. Empty without the diagnostic."""
    steps = data.steps
    if steps.empty or not any(c.startswith("recap/") for c in steps.columns):
        return ""
    conditions = ["rival", "rival_right", "rival_wrong", "correct", "wrong", "none"]
    header = ["| cell | step | seeds | " + " | ".join(conditions) + " |", "|---" * (3 + len(conditions)) + "|"]
    lines, latent_lines, crossplay = list(header), [], []
    for _, row in table.iterrows():
        rows = steps[steps["cell_key"] == row["cell_key"]]
        if rows.empty or "recap/n_wrong" not in rows:
            continue
        diagnosed = rows.dropna(subset=["recap/n_wrong"])["train/step"]
        for step in sorted(diagnosed.unique()):
            for read_as, out in (("recap", lines), ("latent", latent_lines)):
                cells = [recap_values(steps, row, c, int(step), read_as) for c in conditions]
                if read_as == "latent" and all(v.dropna().empty for v in cells):
                    continue  # not a latent-exchange cell: its challenger never reads states
                out.append(f"| {row['cell']} | {int(step)} | {len(cells[0])} | " + " | ".join(
                    "n/a" if v.dropna().empty else f"{100 * v.mean():.1f}" for v in cells) + " |")
        last = rows[rows["train/step"] == diagnosed.max()]
        pairs = sorted(c for c in last.columns if c.startswith("crossplay/") and last[c].notna().any())
        if pairs:
            names = sorted({p.split("/")[1].split(">")[0] for p in pairs}, key=lambda n: (n == "base", n))
            crossplay.append(f"\n{row['cell']} (step {int(last['train/step'].max())}, rows draft, columns answer)\n")
            crossplay.append("| drafter | " + " | ".join(names) + " |")
            crossplay.append("|---" * (1 + len(names)) + "|")
            for d in names:
                crossplay.append(f"| {d} | " + " | ".join(
                    f"{100 * last[f'crossplay/{d}>{a}'].mean():.1f}" for a in names) + " |")
    if latent_lines:
        # under exchange=latent the same conditions again, read as the rival adapter's key/value states of the span
        lines += ["", "The same conditions as key/value prefixes (latent exchange: the rival adapter's states of the "
                  "span; none = the plain prompt)", "", *header, *latent_lines]
    return "\n".join(lines + crossplay) + "\n"


# the diagnostic's answers at two generations each (draft, then an answer after its recap), in the order
# ``two_generations_markdown`` lists them
TWO_GENERATIONS = ("drafts", "rival", "own")


def _rival(adapter: str, adapters: list[str]) -> str:
    """The adapter whose recap ``adapter`` reads in the diagnostic: the other one, else its own (a single adapter)."""
    others = [a for a in adapters if a != adapter]
    return others[0] if others else adapter


def drafts_right(row: Any, challenger: str) -> float:
    """The share of right drafts among the rival's drafts that ``challenger`` answered in a diagnostic ``row`` (one
    steps row): ``recap/<c>/rival`` is p x ``rival_right`` + (1 - p) x ``rival_wrong``, so p follows from the three
    (1 where no draft was wrong, 0 where none was right)."""
    key = f"recap/{challenger}"
    rival, right, wrong = (row.get(f"{key}/{k}", math.nan) for k in ("rival", "rival_right", "rival_wrong"))
    if pd.isna(wrong):
        return 1.0 if not pd.isna(right) else math.nan
    if pd.isna(right):
        return 0.0
    return float((rival - wrong) / (right - wrong)) if right != wrong else math.nan


def two_generations(data: Runs) -> pd.DataFrame:
    """Answers that take two generations each, from the recap diagnostic's cross-play (``crossplay/<d>><a>``: on
    its problems x samples, each drafter's drafts sampled once and read by every answerer, under the run's
    exchange: under ``hidden`` the answerer does not read the recap, under ``latent`` it reads states): per run and
    diagnosed step, ``drafts`` (the share right of the drafts its challengers answer, ``drafts_right``), ``rival``
    (each challenger answering its rival's recap, ``A>B`` and ``B>A`` averaged: the run's cascade) and ``own`` (each
    answering its own recap, ``A>A`` and ``B>B``). A single adapter (GRPO) reads its own recap, so its ``rival`` is
    its ``own`` and is left out: its ``A>A`` is the one answer of GRPO's adapter that takes as many generations as
    a cascade's. Columns: cell_key, cell, run_id, seed, step, answer, orders, value. Empty without the diagnostic."""
    columns = ["cell_key", "cell", "run_id", "seed", "step", "answer", "orders", "value"]
    steps = data.steps
    if steps.empty or "recap/n_wrong" not in steps:
        return pd.DataFrame(columns=columns)
    done = data.runs[data.runs["status"] == "complete"] if "status" in data.runs else data.runs
    out = []
    for _, run in done.iterrows():
        rows = steps[(steps["run_id"] == run["run_id"])].dropna(subset=["recap/n_wrong"])
        logged = [c for c in rows.columns if c.startswith("crossplay/") and rows[c].notna().any()]
        who = [c for c in challengers(run, steps) if f"crossplay/{c}>{c}" in logged]
        if rows.empty or not who:
            continue
        adapters = sorted({c.split("/")[1].split(">")[0] for c in logged} - {"base"})
        pairs = {"rival": [f"{_rival(c, adapters)}>{c}" for c in who], "own": [f"{c}>{c}" for c in who]}
        for _, row in rows.sort_values("train/step").iterrows():
            values = {"drafts": (float(np.mean([drafts_right(row, c) for c in who])), "")}
            for answer, orders in pairs.items():
                if answer == "rival" and orders == pairs["own"]:
                    continue
                values[answer] = float(np.mean([row[f"crossplay/{o}"] for o in orders])), ", ".join(sorted(orders))
            for answer, (value, orders) in values.items():
                out.append({"cell_key": run["cell_key"], "cell": run["cell"], "run_id": run["run_id"],
                            "seed": run["seed"], "step": int(row["train/step"]), "answer": answer, "orders": orders,
                            "value": value})
    return pd.DataFrame(out, columns=columns)


def two_generations_markdown(frame: pd.DataFrame) -> str:
    """Markdown of ``two_generations``: one row per cell and answer, its mean over seeds at the first diagnosed step
    (``at start``), each seed's value at its run's last, and their mean (``final``), in percent."""
    if frame.empty:
        return ""
    first = frame[frame["step"] == frame.groupby("run_id")["step"].transform("min")]
    last = frame[frame["step"] == frame.groupby("run_id")["step"].transform("max")]
    seeds = sorted(last["seed"].unique())
    lines = ["| cell | answer | seeds | at start % | " + " | ".join(f"seed {s} %" for s in seeds) + " | final % |",
             "|:--|:--|--:|--:|" + "--:|" * len(seeds) + "--:|"]
    for (key, answer), group in last.groupby(["cell_key", "answer"], sort=False):
        orders = group["orders"].iloc[0]
        label = {"drafts": "its drafts", "rival": "after its rival's recap", "own": "after its own recap"}[answer]
        start = first[(first["cell_key"] == key) & (first["answer"] == answer)]["value"]
        by_seed = group.groupby("seed")["value"].mean()
        cells = [f"{100 * by_seed[s]:.1f}" if s in by_seed else "-" for s in seeds]
        lines.append(f"| {group['cell'].iloc[0]} | {label}{f' ({orders})' if orders else ''} | {len(group)} | "
                     f"{100 * start.mean():.1f} | " + " | ".join(cells) + f" | {100 * group['value'].mean():.1f} |")
    return "\n".join(lines) + "\n"


def _commits(run: Any) -> tuple[str, str]:
    """A run's commits and when they were read: "launch" (each launch's, in order, ``+dirty`` where the checkout
    had uncommitted changes) or "finish" (``git_commit`` alone, read as the summary was written: runs from before
    launches were recorded); ("-", "-") where it recorded neither."""
    launches = run.get("launches")
    if isinstance(launches, list) and launches:
        seen: dict[str, bool] = {}
        for launch in launches:
            commit = str(launch.get("git_commit") or "?")[:7]
            seen[commit] = seen.get(commit, False) or bool(launch.get("git_dirty"))
        return ", ".join(c + ("+dirty" if dirty else "") for c, dirty in seen.items()), "launch"
    commit = run.get("git_commit")
    return (str(commit)[:7], "finish") if isinstance(commit, str) and commit else ("-", "-")


def runs_markdown(data: Runs) -> str:
    """``runs.md``: one row per run, the code it ran and what it cost: cell, seed, status, steps, commits (read at
    each launch or at the finish, ``_commits``), launches kept, the hours of its steps (``time/train_s``) and of
    its wall time (``time/total_s``)."""
    lines = ["Each run: the commit(s) it ran at, read as each launch started (`launch`; `+dirty` where the checkout "
             "had uncommitted changes) or, by runs from before launches were recorded, as its summary was written "
             "(`finish`: the checkout's commit when it finished); the launches kept through its checkpoints; the "
             "hours its steps took (`time/train_s`) and its wall hours (`time/total_s`: the kept launches summed; "
             "a run read at its finish counts only the launch that finished it)", "",
             "| cell | seed | status | steps | commit | read at | launches | steps h | wall h |",
             "|:--|--:|:--|--:|:--|:--|--:|--:|--:|"]

    def hours(value: Any) -> str:
        return "-" if value is None or pd.isna(value) else f"{value / 3600:.2f}"

    for _, run in data.runs.iterrows():
        commits, read = _commits(run)
        launches = run.get("launches")
        kept = str(len(launches)) if isinstance(launches, list) and launches else "-"
        steps = run.get("train/steps")
        lines.append(f"| {run['cell']} | {run['seed']} | {run['status']} | "
                     f"{'-' if steps is None or pd.isna(steps) else int(steps)} | {commits} | {read} | {kept} | "
                     f"{hours(run.get('time/train_s'))} | {hours(run.get('time/total_s'))} |")
    return "\n".join(lines) + "\n"


def write_tables(data: Runs, out_dir: str | Path) -> list[Path]:
    """``table.csv`` (full precision, fractions), ``table.md`` and ``table.tex`` (percentages) into ``out_dir``,
    ``diagnostic.md`` where runs logged the recap diagnostic, and ``runs.md`` (each run's commits and hours)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = results_table(data)
    caption = _caption(data)
    paths = [out / "table.csv", out / "table.md", out / "table.tex", out / "table_full.tex"]
    table.drop(columns=["cell_key"], errors="ignore").to_csv(paths[0], index=False)
    paths[1].write_text(to_markdown(table, caption))
    paths[2].write_text(to_latex(table, caption))
    paths[3].write_text(to_latex_full(table, caption))
    diagnostic = diagnostic_tables(data, table)
    if diagnostic:
        paths.append(out / "diagnostic.md")
        paths[-1].write_text(diagnostic)
    if not data.runs.empty:
        paths.append(out / "runs.md")
        paths[-1].write_text(runs_markdown(data))
    return paths


def sweep_table(path: str | Path) -> str:
    """The per-cell table of the runs under ``path`` (a multirun root), ready to print at the end of a sweep."""
    return format_table(cells_table(load_runs(path).runs))
