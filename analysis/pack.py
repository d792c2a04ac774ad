"""Pack a sweep's results for the repository: ``python -m analysis.pack <sweep dir> <dest>``.

Copies what the tables and figures read, and nothing a run needs to continue: for each run directory below the
sweep, ``summary.json``, ``.hydra/config.yaml``, ``.hydra/overrides.yaml`` and ``run.log`` (a few KB: when each
launch started and what it resumed from, the one record of that for runs from before ``summary.json`` held each
launch's commit and time) as they are, ``metrics.jsonl`` gzip-compressed, and the rows of ``eval.jsonl`` from the
evaluation before training (phase ``start``, the earliest where there are several) and from the final evaluation
(phase ``final``, at the run's last step), in that order, gzip-compressed (every evaluation's headline numbers are
in ``metrics.jsonl``; the start's rows give the within-run outcomes their change since the start,
``analysis.paired``); and the sweep's ``multirun.yaml``. ``analysis.load`` reads the packed directory as it reads
the sweep (``agon.records.run_files.read_jsonl`` falls back to the ``.gz``), so ``make figures RUNS=<dest>`` redraws the
figures from it.

Left out on purpose: checkpoints, adapters, ``samples.jsonl``, W&B files (hundreds of MB per sweep, and not
needed to redraw anything) and the interim evaluations' rows (phase ``train``: their numbers are in
``metrics.jsonl``). Runs without ``summary.json`` are packed too, and show as incomplete. Everything that reads
packed rows for a final number filters phase ``final`` (``analysis.tables.final_rows``,
``analysis.tables.final_evaluation``), and never falls back to the start's rows.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

from agon.records.run_files import CONFIG, EVAL, METRICS, OVERRIDES, RUN_LOG, SUMMARY, SWEEP_MARKER, read_jsonl
from analysis.load import find_run_dirs


def _gzip_lines(rows: list[dict], path: Path) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    # mtime=0: packing the same rows twice gives the same bytes, so a re-pack shows no change in git
    path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))


def start_rows(rows: list[dict]) -> list[dict]:
    """The rows of a run's evaluation before training (phase ``start``), of the earliest one where there are
    several: those at the smallest step, the first row of each (order, stage, problem, sample) in file order."""
    start = [r for r in rows if r.get("phase") == "start"]
    first = min((r.get("step", 0) for r in start), default=0)
    seen: set[tuple] = set()
    out = []
    for r in start:
        key = tuple(r.get(k) for k in ("order", "stage", "problem_id", "sample"))
        if r.get("step", 0) == first and key not in seen:
            seen.add(key)
            out.append(r)
    return out


def final_rows(rows: list[dict]) -> list[dict]:
    """The rows of a run's final evaluation: phase ``final`` at the largest step (an extended run keeps the final
    evaluation of its shorter self: the last one is the run's). Without any, the rows at the largest step of the
    others but the start's (a run that stopped before its final evaluation), never the start's."""
    final = [r for r in rows if r.get("phase") == "final"] or [r for r in rows if r.get("phase") != "start"]
    last = max((r.get("step", 0) for r in final), default=0)
    return [r for r in final if r.get("step", 0) == last]


def pack_run(run_dir: Path, dest: Path) -> int:
    """One run directory into ``dest``; the bytes written."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in (SUMMARY, CONFIG, OVERRIDES, RUN_LOG):
        if (run_dir / name).exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run_dir / name, dest / name)
    _gzip_lines(read_jsonl(run_dir / METRICS), dest / f"{METRICS}.gz")
    rows = read_jsonl(run_dir / EVAL)
    _gzip_lines(start_rows(rows) + final_rows(rows), dest / f"{EVAL}.gz")
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def pack(sweep_dir: Path, dest: Path) -> int:
    """Every run directory below ``sweep_dir`` into the same place below ``dest``; the bytes written."""
    sweep_dir, dest = Path(sweep_dir), Path(dest)
    runs = find_run_dirs(sweep_dir)
    if not runs:
        raise FileNotFoundError(f"no run directories below {sweep_dir}")
    total = 0
    for marker in sweep_dir.rglob(SWEEP_MARKER):
        target = dest / marker.relative_to(sweep_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(marker, target)
        total += target.stat().st_size
    for run_dir in runs:
        total += pack_run(run_dir, dest / run_dir.relative_to(sweep_dir))
    print(f"packed {len(runs)} runs from {sweep_dir} into {dest}: {total / 1e6:.2f} MB")
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.pack", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="a sweep directory (hydra.sweep.dir) or any run directory")
    parser.add_argument("dest", type=Path, help="where the packed copy goes (e.g. results/arithmetic_hard)")
    args = parser.parse_args(argv)
    pack(args.sweep_dir, args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
