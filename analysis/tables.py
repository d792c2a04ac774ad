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

The arms at equal generations per answer (``generation_runs``, ``equal_generations``, ``generation_differences``;
``generations.md``): per cell at its final evaluation the headline's drafters alone (one generation), the headline at
two (``eval/accuracy_two_generations``: a cascade's headline, a one-generation method's self-cascade on the same
drafts) and the headline at equal steps, and each pair of cells' difference at two generations. Runs from before the
main evaluation played the self-cascades fall back to the diagnostic's cross-play at the final evaluation, and the
table says which source each cell's number came from. The check battery (``battery_table``, ``battery.md``): each
answerer's accuracy after a recap of each kind of ``agon.tasks.BATTERY_KINDS`` at the first and the last evaluation
that logged it, and the change between them.

Left out on purpose: an interval on a cell's own number at two generations (the claims, ``match: generations``, put
the differences that matter), and a difference of two cells whose numbers come from different sources (another
design on other drafts: the table shows it without an interval).
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

from agon.tasks import BATTERY_KINDS
from analysis.labels import ANSWERER_LABELS, BATTERY_LABELS, cell_label
from analysis.load import NA, Runs, load_runs
from analysis.stats import pooled_interval, pooled_sd

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


def eval_floor(rows: pd.DataFrame, field: str) -> float:
    """The evaluation-sampling SD of one run's final value: ``rows`` are its final evaluation's graded samples
    (``final_rows``), ``field`` the one the metric averages. With G (problem, order) groups of k_g samples and
    unbiased variances s_g^2, sqrt(sum_g s_g^2 / k_g) / G: the SD of the mean over its samples with the problems held
    fixed, as every run of a grid evaluates the same problems. Groups of one sample add nothing (no variance to
    estimate); nan without rows. ``analysis.claims`` floors its pooled SDs with it."""
    if rows.empty or field not in rows:
        return math.nan
    keys = [k for k in ("problem_id", "order") if k in rows]
    values = pd.to_numeric(rows[field], errors="coerce").astype(float)
    groups = values.groupby([rows[k] for k in keys]) if keys else values.groupby(np.zeros(len(values)))
    var, count = groups.var(ddof=1).fillna(0.0), groups.size()
    return float(math.sqrt(float((var / count).sum())) / len(count))


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


def diagnostic_pairs(run: Any, frame: pd.DataFrame, logged: list[str]) -> dict[str, list[str]]:
    """The diagnostic's cross-play orders of ``run`` (a runs row; ``frame``, its steps or runs frame, names the
    adapters that logged the recap diagnostic; ``logged``, the ``crossplay/`` keys that hold its values) that take
    two generations each: ``rival`` (each challenger after its rival's recap: the run's cascade) and ``own`` (each
    after its own recap). A single adapter reads its own recap, so its ``rival`` would be its ``own`` and is left
    out. Empty where no challenger answered its own drafts."""
    who = [c for c in challengers(run, frame) if f"crossplay/{c}>{c}" in logged]
    if not who:
        return {}
    adapters = sorted({c.split("/")[1].split(">")[0] for c in logged} - {"base"})
    pairs = {"rival": [f"{_rival(c, adapters)}>{c}" for c in who], "own": [f"{c}>{c}" for c in who]}
    if pairs["rival"] == pairs["own"]:
        del pairs["rival"]
    return pairs


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
        pairs = diagnostic_pairs(run, steps, logged)
        if rows.empty or not pairs:
            continue
        who = [o.split(">")[1] for o in pairs["own"]]
        for _, row in rows.sort_values("train/step").iterrows():
            values = {"drafts": (float(np.mean([drafts_right(row, c) for c in who])), "")}
            for answer, orders in pairs.items():
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


# ---------------------------------------------------------------------------------------------------------------
# equal generations per answer: the main evaluation's eval/accuracy_two_generations, the diagnostic's cross-play
# for runs from before it

# where an arm's answers at two generations come from
MAIN, DIAGNOSTIC = "main evaluation", "diagnostic cross-play"
GENERATION_COLUMNS = ["cell_key", "cell", "run_id", "seed", "generations", "one", "two", "headline", "source",
                      "orders", "design", "floor"]


def _value(run: Any, key: str) -> float:
    """A run's number under ``key``; nan where it has none (runs from before the key existed)."""
    value = run.get(key)
    try:
        return math.nan if value is None else float(value)
    except (TypeError, ValueError):
        return math.nan


def _headline(run: Any) -> list[str]:
    orders = run.get("headline_orders")
    return [str(o) for o in orders] if isinstance(orders, (list, tuple)) else []


def two_generation_orders(run: Any) -> list[str]:
    """The orders of a run's main evaluation whose mean is its answer at two generations
    (``eval/accuracy_two_generations``): its headline orders where they are cascades, else each solo order's
    self-cascade (GRPO's ``A`` -> ``A>A``), as ``agon.game.cascade.summarise`` averages them."""
    return [o if ">" in o else f"{o}>{o}" for o in _headline(run)]


def one_generation(run: Any) -> float:
    """A run's headline drafters alone: ``eval/accuracy_one_generation``, or for runs from before it the mean of
    ``eval/solo_acc_<drafter>`` over the headline's drafters (the same evaluation's numbers, the same mean)."""
    logged = _value(run, "eval/accuracy_one_generation")
    if not math.isnan(logged):
        return logged
    drafters = list(dict.fromkeys(o.split(">")[0] for o in _headline(run)))
    values = [_value(run, f"eval/solo_acc_{d}") for d in drafters]
    return float(np.mean(values)) if values and not any(math.isnan(v) for v in values) else math.nan


def generations_per_answer(run: Any) -> float:
    """``eval/generations``, or for runs from before it 2 where the headline has a cascade, else 1."""
    logged = _value(run, "eval/generations")
    if not math.isnan(logged) or not _headline(run):
        return logged
    return 2.0 if any(">" in o for o in _headline(run)) else 1.0


def diagnostic_two_generations(run: Any, frame: pd.DataFrame) -> tuple[float, list[str]]:
    """(value, orders): a run's answer at two generations read from the recap diagnostic's cross-play in its runs
    row (the summary's ``crossplay/*``: its final evaluation's diagnostic; ``frame``, the runs frame): its cascade
    (``diagnostic_pairs``' ``rival``: the same orders as its headline) where it has one, else its self-cascade
    (``own``). (nan, []) without the diagnostic."""
    logged = [c for c in frame.columns if c.startswith("crossplay/") and not pd.isna(_value(run, c))]
    pairs = diagnostic_pairs(run, frame, logged)
    orders = pairs.get("rival") or pairs.get("own") or []
    return (float(np.mean([_value(run, f"crossplay/{o}") for o in orders])) if orders else math.nan), orders


def _design(problems: float, samples: Any) -> str:
    def count(value: Any) -> str:
        return "?" if value is None or pd.isna(value) else f"{int(value)}"

    return f"{count(problems)} x {count(samples)}"


def generation_runs(data: Runs) -> pd.DataFrame:
    """One row per complete run at its final evaluation: ``generations`` (per answer of its headline,
    ``generations_per_answer``), ``one`` (``one_generation``), ``two`` (the headline at two generations per
    answer), ``headline`` (``eval/accuracy``, at equal steps), ``source`` of ``two`` with its ``orders`` and
    ``design`` (problems x samples), and ``floor``: the SD of ``two`` over the run's own samples.

    ``two`` is ``eval/accuracy_two_generations`` of the main evaluation (``MAIN``) where every run of the cell logged
    it, else for every run of the cell the diagnostic's cross-play (``DIAGNOSTIC``, ``diagnostic_two_generations``):
    the seeds of one cell are never averaged over two designs. The floor of a main-evaluation number is
    ``eval_floor`` of the rows it averages (``two_generation_orders``; nan without eval rows); of a
    diagnostic number, which is logged without its rows, the binomial SD sqrt(p (1 - p) / n) over its n answers
    (problems x diagnostic samples x orders), which counts the problems' spread too (as ``analysis.paired`` does for
    interim evaluations whose rows are not packed)."""
    done = data.runs[data.runs["status"] == "complete"] if "status" in data.runs else data.runs
    # frames from analysis.load name cells by cell_key; a frame built by hand, by experiment
    cell = "cell_key" if "cell_key" in done else "experiment"
    evals = data.evals if data.evals is not None else pd.DataFrame()
    out, index = [], []
    for _, group in done.groupby(cell, sort=False):
        main = pd.Series([_value(r, "eval/accuracy_two_generations") for _, r in group.iterrows()], dtype=float)
        on_main = bool(len(group)) and bool(main.notna().all())
        for (i, run), logged in zip(group.iterrows(), main):
            index.append(i)
            row = {"cell_key": run[cell], "cell": run.get("cell", run[cell]), "run_id": run.get("run_id"),
                   "seed": run.get("seed"), "generations": generations_per_answer(run), "one": one_generation(run),
                   "headline": _value(run, "eval/accuracy")}
            if on_main:
                orders = two_generation_orders(run)
                rows = final_evaluation(evals, run.get("run_id")) if "run_id" in evals else evals.iloc[:0]
                rows = rows[(rows["stage"] == "final") & rows["order"].isin(orders)] if len(rows) else rows
                row.update(two=logged, source=MAIN, orders=orders, floor=eval_floor(rows, "correct"),
                           design=_design(_value(run, "eval/n_problems"), run.get("eval/samples")))
            else:
                value, orders = diagnostic_two_generations(run, data.runs)
                n = _value(run, "eval/n_problems") * _value(run, "diagnostic_samples") * len(orders)
                floor = math.sqrt(value * (1 - value) / n) if n > 0 and not math.isnan(value) else math.nan
                row.update(two=value, source=DIAGNOSTIC if orders else "", orders=orders, floor=floor,
                           design=_design(_value(run, "eval/n_problems"), run.get("diagnostic_samples")))
            out.append(row)
    # indexed as ``data.runs``, so that a caller can put the numbers back beside the runs
    return pd.DataFrame(out, columns=GENERATION_COLUMNS, index=pd.Index(index))


def equal_generations(per_run: pd.DataFrame) -> pd.DataFrame:
    """One row per cell of ``generation_runs``: seeds, and the mean over them of generations, one, two and
    headline, with the cell's source, orders and design. Empty where no run has a number at two generations."""
    columns = ["cell_key", "cell", "seeds", "generations", "one", "two", "headline", "source", "orders", "design"]
    if per_run.empty or per_run["two"].isna().all():
        return pd.DataFrame(columns=columns)
    rows = []
    for key, group in per_run.groupby("cell_key", sort=False):
        designs = sorted(set(group["design"]))
        rows.append({"cell_key": key, "cell": group["cell"].iloc[0], "seeds": len(group),
                     **{c: float(group[c].mean()) for c in ("generations", "one", "two", "headline")},
                     "source": group["source"].iloc[0], "orders": group["orders"].iloc[0],
                     "design": ", ".join(designs)})
    return pd.DataFrame(rows, columns=columns)


def generation_differences(per_run: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Each pair of cells (in ``generation_runs``' order) at two generations per answer: left minus right, Student's
    t with the seeds' SD pooled over every cell that has a number (``analysis.stats``), raised to the largest
    per-run floor where it lies below it. A pair whose numbers come from different sources (one cell's runs from
    before the main evaluation played the self-cascades) gets its difference and no interval: its two numbers
    are read on different drafts and designs. Columns: left, right (cell keys), seeds, difference, low, high,
    pooled_sd, seed_sd, floor, same_source."""
    columns = ["left", "right", "seeds", "difference", "low", "high", "pooled_sd", "seed_sd", "floor", "same_source"]
    rows = per_run.dropna(subset=["two"])
    if rows.empty:
        return pd.DataFrame(columns=columns)
    cells = {key: group for key, group in rows.groupby("cell_key", sort=False)}
    seed_sd, df = pooled_sd([g["two"].to_numpy(float) for g in cells.values()])
    floor = float(rows["floor"].max()) if rows["floor"].notna().any() else math.nan
    sd = seed_sd if math.isnan(floor) or math.isnan(seed_sd) else max(seed_sd, floor)
    out = []
    keys = list(cells)
    for i, left in enumerate(keys):
        for right in keys[i + 1:]:
            a, b = cells[left]["two"].to_numpy(float), cells[right]["two"].to_numpy(float)
            same = cells[left]["source"].iloc[0] == cells[right]["source"].iloc[0]
            diff, low, high = pooled_interval(a, b, sd, df, level) if same else (float(a.mean() - b.mean()),
                                                                               math.nan, math.nan)
            out.append({"left": left, "right": right, "seeds": f"{len(a)} vs {len(b)}", "difference": diff,
                        "low": low, "high": high, "pooled_sd": sd, "seed_sd": seed_sd, "floor": floor,
                        "same_source": same})
    return pd.DataFrame(out, columns=columns)


def _pct(value: float, signed: bool = False) -> str:
    if value is None or pd.isna(value):
        return NA
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def equal_generations_markdown(data: Runs, level: float = 0.95) -> str:
    """``generations.md``: per cell at its final evaluation, mean over its seeds, one generation per answer, two,
    and the headline at equal steps, with where its number at two generations comes from; then each pair of cells'
    difference at two generations (``generation_differences``) and how its interval was formed. Empty where no run
    has a number at two generations."""
    per_run = generation_runs(data)
    arms = equal_generations(per_run)
    if arms.empty:
        return ""
    label = dict(zip(arms["cell_key"], arms["cell"]))
    lines = ["Each cell at its final evaluation, mean over its seeds: its headline's drafters alone (one generation "
             "per answer: `eval/accuracy_one_generation`, or the mean of `eval/solo_acc_<drafter>` over them in runs "
             "from before it), its headline at two generations per answer (`eval/accuracy_two_generations`: a "
             "cascade's headline itself, a one-generation headline's self-cascade on the very same drafts, GRPO's "
             "A>A) and its headline as logged at equal steps (`eval/accuracy`), with the generations per answer "
             "that headline takes. Where a cell's runs are from before the main evaluation played the self-cascades, "
             "its number at two generations is the recap diagnostic's cross-play at the final evaluation "
             "(`analysis.tables.two_generations`: the same orders on the diagnostic's own drafts, at its own size), "
             "as the last column says.", "",
             "| cell | seeds | generations per answer | one generation % | two generations % | headline % (equal "
             "steps) | two generations from |",
             "|:--|--:|--:|--:|--:|--:|:--|"]
    for _, arm in arms.iterrows():
        source = (f"{arm['source']} ({', '.join(sorted(arm['orders']))}), {arm['design']}" if arm["source"]
                  else "none (no self-cascade and no diagnostic)")
        generations = NA if pd.isna(arm["generations"]) else f"{arm['generations']:g}"
        lines.append(f"| {arm['cell']} | {arm['seeds']} | {generations} | {_pct(arm['one'])} | {_pct(arm['two'])} | "
                     f"{_pct(arm['headline'])} | {source} |")
    differences = generation_differences(per_run, level)
    if not differences.empty:
        pct = f"{100 * level:g}%"
        lines += ["", f"| at two generations per answer | seeds | difference [{pct} CI] |", "|:--|:--|--:|"]
        for _, d in differences.iterrows():
            interval = (" (numbers from different sources: no interval)" if not d["same_source"]
                        else "" if pd.isna(d["low"]) else f" [{_pct(d['low'], True)}, {_pct(d['high'], True)}]")
            lines.append(f"| {label[d['left']]} − {label[d['right']]} | {d['seeds']} | "
                         f"{_pct(d['difference'], True)}{interval} |")
        first = differences.iloc[0]

        def points(value: float) -> str:
            return "n/a" if pd.isna(value) else f"{100 * value:.1f}"

        used = ("no SD over seeds to compare" if pd.isna(first["seed_sd"]) else "no floor" if pd.isna(first["floor"])
                else "the floor used" if first["floor"] > first["seed_sd"] else "the seeds' SD used")
        lines += ["", "Intervals: Student's t with the seeds' SD pooled over every cell above "
                  f"({points(first['seed_sd'])} points), never below the largest SD of one run's number over its own "
                  f"samples ({points(first['floor'])} points: of the main evaluation, over its samples with its "
                  "problems held fixed; of the diagnostic, logged without its rows, the binomial SD over its "
                  f"answers): {points(first['pooled_sd'])} points, {used}."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# the check battery (eval.diagnostic: battery/<answerer>/<kind>, battery/n/<kind>)

# the answerers of the battery's key family (``battery/n/<kind>`` are counts, not an answerer)
BATTERY_COUNT = "n"
BATTERY_COLUMNS = ["cell_key", "cell", "answerer", "kind", "seeds", "n_start", "n_end", "start", "end", "change",
                   "end_by_seed"]


def has_battery(steps: pd.DataFrame) -> bool:
    """Whether some run logged a number of the check battery (``battery/<answerer>/<kind>``)."""
    return any(c.startswith("battery/") and not c.startswith(f"battery/{BATTERY_COUNT}/")
               and pd.to_numeric(steps[c], errors="coerce").notna().any() for c in steps.columns)


def battery_kinds(steps: pd.DataFrame) -> list[str]:
    """The kinds of recap the runs logged, in ``agon.tasks.BATTERY_KINDS``' order, any other after them."""
    logged = {c.split("/")[2] for c in steps.columns if c.startswith("battery/") and c.count("/") == 2}
    return [k for k in BATTERY_KINDS if k in logged] + sorted(logged - set(BATTERY_KINDS))


def battery_answerers(steps: pd.DataFrame) -> list[str]:
    """The answerers the runs logged the battery for: the adapters, then the base."""
    logged = {c.split("/")[1] for c in steps.columns if c.startswith("battery/") and c.count("/") == 2}
    return sorted(logged - {BATTERY_COUNT}, key=lambda a: (a == "base", a))


def _battery_rows(steps: pd.DataFrame, cell_key: Any) -> pd.DataFrame:
    """A cell's steps rows that hold the battery (the diagnosed evaluations)."""
    rows = steps[steps["cell_key"] == cell_key] if "cell_key" in steps else steps.iloc[:0]
    columns = [c for c in rows.columns if c.startswith("battery/")]
    return rows.dropna(subset=columns, how="all") if columns else rows.iloc[:0]


def battery_values(steps: pd.DataFrame, cell_key: Any, key: str, which: str) -> pd.Series:
    """Per run of the cell, ``key`` (``battery/<answerer>/<kind>`` or ``battery/n/<kind>``) at its ``first`` or
    ``last`` evaluation that logged the battery; nan where the task could not make the kind (runs that logged no
    battery are left out)."""
    rows = _battery_rows(steps, cell_key)
    out = {}
    for run_id, run_rows in rows.groupby("run_id", sort=False):
        at = run_rows["train/step"].min() if which == "first" else run_rows["train/step"].max()
        value = run_rows[run_rows["train/step"] == at][key] if key in run_rows else pd.Series(dtype=float)
        out[run_id] = float(pd.to_numeric(value, errors="coerce").mean()) if len(value) else math.nan
    return pd.Series(out, dtype=float)


def battery_table(data: Runs, table: pd.DataFrame) -> pd.DataFrame:
    """Per cell of ``table`` (``results_table``'s rows), answerer and kind of recap, the answerer's accuracy on the
    challenge prompt after a recap of that kind at the first evaluation that logged the battery (``start``), at the
    last (``end``) and their difference (``change``, per run, then the mean), each the mean over the cell's seeds,
    ``end_by_seed`` each seed's end; ``n_start`` and ``n_end`` the rows that kind could be made for
    (``battery/n/<kind>``, mean over seeds; 0 with nan values where the task cannot make it). Empty where no run
    logged the battery."""
    steps = data.steps
    if steps.empty or not has_battery(steps):
        return pd.DataFrame(columns=BATTERY_COLUMNS)
    kinds, answerers = battery_kinds(steps), battery_answerers(steps)
    seed_of = data.runs.set_index("run_id")["seed"] if "seed" in data.runs else pd.Series(dtype=object)
    out = []
    for _, row in table.iterrows():
        rows = _battery_rows(steps, row["cell_key"])
        if rows.empty:
            continue
        for answerer in answerers:
            keys = [f"battery/{answerer}/{k}" for k in kinds]
            if not any(k in rows and pd.to_numeric(rows[k], errors="coerce").notna().any() for k in keys):
                continue  # this cell's runs have no such answerer (GRPO has no B)
            for kind, key in zip(kinds, keys):
                start, end = (battery_values(steps, row["cell_key"], key, w) for w in ("first", "last"))
                counts = [battery_values(steps, row["cell_key"], f"battery/{BATTERY_COUNT}/{kind}", w)
                          for w in ("first", "last")]
                out.append({"cell_key": row["cell_key"], "cell": row["cell"], "answerer": answerer, "kind": kind,
                            "seeds": len(end), "n_start": counts[0].mean(),
                            "n_end": counts[1].mean(), "start": start.mean(), "end": end.mean(),
                            "change": (end - start).mean(),
                            "end_by_seed": {seed_of.get(r, r): v for r, v in end.items()}})
    return pd.DataFrame(out, columns=BATTERY_COLUMNS)


def battery_markdown(frame: pd.DataFrame) -> str:
    """``battery.md``: one row per cell, answerer and kind of ``battery_table``, in percent: the accuracy at the
    start, each seed's and the mean at the end, the change since the start in points, with the rows each kind could
    be made for. Empty without the battery."""
    if frame.empty:
        return ""
    # seeds in numeric order where they are numbers (seed 10 after seed 2)
    seeds = sorted({s for by_seed in frame["end_by_seed"] for s in by_seed},
                   key=lambda s: (isinstance(s, str), 0 if isinstance(s, str) else s, str(s)))
    lines = ["The check battery (`battery/<answerer>/<kind>`, `eval.diagnostic`): each answerer's accuracy on the "
             "challenge prompt after a recap of a known kind (a right prefix, a recap showing a wrong step, a dead "
             "end, an empty recap), at the first evaluation that logged it (start) and the last (end), mean over "
             "seeds; n is the number of rows the task could make that kind for at the start and at the end "
             "(`battery/n/<kind>`), 0 (and no accuracy) where it makes none.", "",
             "| cell | answerer | recap | n start | n end | seeds | start % | "
             + "".join(f"seed {s} end % | " for s in seeds) + "end % | change |",
             "|:--|:--|:--|--:|--:|--:|--:|" + "--:|" * len(seeds) + "--:|--:|"]

    def count(value: float) -> str:
        return NA if pd.isna(value) else f"{value:.0f}"

    for _, r in frame.iterrows():
        by_seed = [_pct(r["end_by_seed"].get(s, math.nan)) for s in seeds]
        lines.append(f"| {r['cell']} | {ANSWERER_LABELS.get(r['answerer'], r['answerer'])} | "
                     f"{BATTERY_LABELS.get(r['kind'], r['kind'])} | {count(r['n_start'])} | {count(r['n_end'])} | "
                     f"{r['seeds']} | {_pct(r['start'])} | " + "".join(f"{v} | " for v in by_seed)
                     + f"{_pct(r['end'])} | {_pct(r['change'], True)} |")
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
    ``diagnostic.md`` where runs logged the recap diagnostic, ``battery.md`` where they logged the check battery,
    ``generations.md`` where some run has an answer at two generations (its main evaluation's self-cascade, or the
    diagnostic's cross-play), and ``runs.md`` (each run's commits and hours)."""
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
    battery = battery_markdown(battery_table(data, table))
    if battery:
        paths.append(out / "battery.md")
        paths[-1].write_text(battery)
    generations = equal_generations_markdown(data)
    if generations:
        paths.append(out / "generations.md")
        paths[-1].write_text(generations)
    if not data.runs.empty:
        paths.append(out / "runs.md")
        paths[-1].write_text(runs_markdown(data))
    return paths


def sweep_table(path: str | Path) -> str:
    """The per-cell table of the runs under ``path`` (a multirun root), ready to print at the end of a sweep."""
    return format_table(cells_table(load_runs(path).runs))
