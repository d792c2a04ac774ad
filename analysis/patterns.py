"""Target sum's chance level and its walls by sign pattern, for every target-sum table ``make figures`` writes.

A problem ``7?3?5?2=7`` has ``n`` operands and ``2^(n - 1)`` sign patterns, of which ``solutions`` reach its
target. Chance is the share of a problem's patterns that do (what a pattern drawn at random scores), averaged over
the problems evaluated, by operand count and over all. A wall is a pattern the trained runs rarely find: over the
problems with a single solution, grouped by operand count and that solution's pattern, each arm's accuracy at its
final evaluation (the mean over seeds of each run's share right in its headline orders: the cascade for Agon's arms,
the one adapter for GRPO's) beside the pattern's chance, 1 / 2^(n - 1); for a cascade arm also its drafts alone (the
draft stage of the same rounds). ``patterns.md`` and ``patterns.csv`` hold both.

Left out on purpose: problems with two or more solutions (a right answer does not name one pattern) and the
interim evaluations (their rows are not packed).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.load import Runs
from analysis.paired import is_target_sum
from analysis.tables import final_evaluation, headline_rows

# the per-pattern table's columns before the arms'
KEYS = ("operands", "pattern", "problems", "chance")


def solutions(problem_id: str) -> tuple[int, list[str]]:
    """(operand count, the sign patterns that reach the target, ``+`` before ``-``) of ``7?3?5?2=7``."""
    from agon.tasks.target_sum import chain_value, parse

    operands, target = parse(problem_id)
    patterns = ["".join(signs) for signs in itertools.product("+-", repeat=len(operands) - 1)
                if chain_value(signs, operands) == target]
    return len(operands), patterns


def chance_table(problem_ids: Any) -> pd.DataFrame:
    """One row per operand count, and one for all (``operands`` "all") where there are several: ``problems`` and
    ``chance``, the mean over the problems of the share of their sign patterns that solve them."""
    rows = []
    for pid in dict.fromkeys(problem_ids):
        n, patterns = solutions(pid)
        rows.append({"operands": n, "chance": len(patterns) / 2 ** (n - 1)})
    frame = pd.DataFrame(rows, columns=["operands", "chance"])
    if frame.empty:
        return pd.DataFrame(columns=["operands", "problems", "chance"])
    by_count = frame.groupby("operands")["chance"].agg(problems="size", chance="mean").reset_index()
    if len(by_count) == 1:
        return by_count
    overall = pd.DataFrame([{"operands": "all", "problems": len(frame), "chance": frame["chance"].mean()}])
    return pd.concat([by_count, overall], ignore_index=True)


def pattern_table(runs: pd.DataFrame, evals: pd.DataFrame, arm: str = "cell_key") -> pd.DataFrame:
    """One row per (operand count, single solution's pattern): ``operands``, ``pattern``, ``problems``, ``chance``,
    then per arm (in the runs' order) ``<arm>`` (its final answers' accuracy, the mean over its runs) and, for a
    cascade arm, ``<arm> drafts`` (the draft stage's); fractions. Empty without target-sum runs' final rows."""
    per_run = []
    for _, run in runs.iterrows():
        if not is_target_sum(run):
            continue
        rows = final_evaluation(evals, run["run_id"])
        if rows.empty:
            continue
        finals = headline_rows(rows, run)
        drafts = rows[(rows["stage"] == "draft") & rows["order"].isin(finals["order"].unique())]
        for what, part in (("final", finals), ("draft", drafts)):
            if len(part):
                per_run.append(part.assign(arm=run[arm], run_id=run["run_id"], what=what))
    if not per_run:
        return pd.DataFrame()
    rows = pd.concat(per_run, ignore_index=True)
    shape = {pid: solutions(pid) for pid in rows["problem_id"].unique()}
    rows = rows[rows["problem_id"].map(lambda p: len(shape[p][1]) == 1)]
    rows = rows.assign(operands=rows["problem_id"].map(lambda p: shape[p][0]),
                       pattern=rows["problem_id"].map(lambda p: shape[p][1][0]))
    # each run's share right per pattern, then the mean over an arm's runs
    run_means = rows.groupby(["operands", "pattern", "arm", "what", "run_id"], sort=False)["correct"].mean()
    means = run_means.groupby(level=["operands", "pattern", "arm", "what"], sort=False).mean()
    keys = rows.groupby(["operands", "pattern"])["problem_id"].nunique().rename("problems").reset_index()
    keys["chance"] = 1 / 2 ** (keys["operands"] - 1)
    table = keys.sort_values(["operands", "pattern"], key=lambda c: c.map(_pattern_order) if c.name == "pattern"
                             else c).reset_index(drop=True)
    for key in dict.fromkeys(runs[arm]):
        for what, suffix in (("final", ""), ("draft", " drafts")):
            if what == "draft" and not _is_cascade(rows, key):
                continue
            column = [means.get((n, p, key, what)) for n, p in zip(table["operands"], table["pattern"])]
            if any(v is not None for v in column):
                table[f"{key}{suffix}"] = [float("nan") if v is None else v for v in column]
    return table


def _pattern_order(pattern: str) -> str:
    """``+`` before ``-``, as the search enumerates them."""
    return pattern.replace("+", "0").replace("-", "1")


def _is_cascade(rows: pd.DataFrame, key: Any) -> bool:
    return bool(rows.loc[rows["arm"] == key, "order"].astype(str).str.contains(">", regex=False).any())


def patterns_markdown(chance: pd.DataFrame, table: pd.DataFrame, label: dict[Any, str]) -> str:
    """``patterns.md``: the chance levels, then the per-pattern table in percent."""
    lines = ["Chance: the share of a problem's sign patterns that reach its target, averaged over the problems "
             "evaluated (a pattern drawn at random)", "", "| operands | problems | chance % |", "|---|--:|--:|"]
    # itertuples keeps each column's dtype (iterrows makes a row of one operand count all floats: "4.0")
    lines += [f"| {r.operands} | {int(r.problems)} | {100 * r.chance:.1f} |" for r in chance.itertuples()]
    arms = [c for c in table.columns if c not in KEYS]
    lines += ["", "Accuracy at the final evaluation by the sign pattern of the problem's only solution (problems "
              "with one solution; the mean over each arm's runs; chance is one pattern in 2^(operands - 1))", "",
              "| operands | signs | problems | chance % | " + " | ".join(f"{title_of(c, label)} %" for c in arms)
              + " |",
              "|--:|:--|--:|--:|" + "--:|" * len(arms)]
    for _, r in table.iterrows():
        cells = ["-" if pd.isna(r[c]) else f"{100 * r[c]:.1f}" for c in arms]
        lines.append(f"| {r['operands']} | `{r['pattern']}` | {int(r['problems'])} | {100 * r['chance']:.1f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_patterns(data: Runs, out_dir: str | Path) -> list[Path]:
    """``patterns.md`` and ``patterns.csv`` (the per-pattern table, fractions, the arms by their labels) into
    ``out_dir`` for the complete target-sum runs; nothing without any."""
    if data.evals is None or data.evals.empty or "run_id" not in data.evals:
        return []
    runs = data.runs[data.runs["status"] == "complete"] if "status" in data.runs else data.runs
    table = pattern_table(runs, data.evals)
    if table.empty:
        return []
    target_sum = [r["run_id"] for _, r in runs.iterrows() if is_target_sum(r)]
    chance = chance_table(pd.concat([final_evaluation(data.evals, r) for r in target_sum])["problem_id"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    label = dict(zip(runs["cell_key"], runs["cell"]))
    paths = [out / "patterns.md", out / "patterns.csv"]
    paths[0].write_text(patterns_markdown(chance, table, label))
    table.rename(columns=lambda c: c if c in KEYS else title_of(c, label)).to_csv(paths[1], index=False)
    return paths


def title_of(column: str, label: dict[Any, str]) -> str:
    """A per-arm column's name with the arm's label in place of its key."""
    key, drafts = (column[: -len(" drafts")], " drafts") if column.endswith(" drafts") else (column, "")
    return f"{label.get(key, key)}{drafts}"
