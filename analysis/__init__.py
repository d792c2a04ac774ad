"""Run directories (the record) or W&B runs -> pandas frames -> the paper's figures and tables.

    from analysis import load_runs, cells_table, format_table
    data = load_runs("multirun/2026-11-30/10-00-00")   # Runs(runs, steps, evals)
    print(format_table(cells_table(data.runs)))

``python -m analysis.figures`` (``make figures``) writes every figure and the table; see docs/analysis.md.
"""

from analysis.load import Runs, find_run_dirs, load_runs, newest_multirun
from analysis.tables import cells_table, format_table, results_table, sweep_table

__all__ = [
    "Runs",
    "cells_table",
    "find_run_dirs",
    "format_table",
    "load_runs",
    "newest_multirun",
    "results_table",
    "sweep_table",
]
