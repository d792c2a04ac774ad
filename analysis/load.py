"""Run directories (or W&B runs) -> three tidy pandas frames.

``load_runs(path)`` accepts a multirun root (holding ``multirun.yaml``), a single run directory, or any directory
above several of them, and returns ``Runs(runs, steps, evals)``:

    runs    one row per run: ``run_id``, ``run_dir``, ``sweep``, ``status`` ("complete" when ``summary.json``
            exists, else "incomplete"), the axes ``method reward exchange rotation init task model experiment
            seed``, ``method_label``, ``overrides``, ``extra`` (overrides that are not an axis or the seed, less
            those every loaded run shares), the cell's ``cell`` label and ``cell_key``, ``headline_orders``,
            ``git_commit``, ``git_dirty`` and ``launches`` (None where the run did not record them),
            ``diagnostic_samples`` (``eval.diagnostic_samples`` of its config; None without one), and every
            numeric value of ``summary.json`` under its own name (``eval/accuracy``, ...), and each
            ``eval/*`` value of the evaluation before training as ``<key>_at_start``
            (``eval/final_trace_tokens_at_start``; ``start_metrics``). ``model`` is the run's ``model_label``
            ("Qwen3-0.6B", "Gemma 4 E2B", "tiny (offline)"), else ``model.name``
    steps   one row per (run, ``train/step``) from ``metrics.jsonl`` (a step's training and evaluation rows
            merged), with ``run_id``, ``cell``, ``cell_key``, ``seed``
    evals   the rows of ``eval.jsonl`` (problem x sample x order x stage) with ``run_id``, ``cell``, ``cell_key``

A *cell* is one point of the design: the axes that apply to the run's method plus any extra overrides, seeds
pooled. Axes that do not apply to a method (e.g. the reward of vanilla GRPO) hold "-" and are left out of its cell,
so baselines launched with different defaults still pool. What applies, the method's label and whether it is a
baseline come from the method itself, never from a table here: ``summary.json``'s ``method_axes`` and
``method_label`` (written by the run), else the method registered in ``agon.core.methods.METHODS`` (runs written before
those keys existed), else every axis and the bare name (a method this process has not imported, e.g. one
registered in a user's script: nothing is pooled that might differ).

A cell's label names only what sets it apart: for the method under study (``baseline`` False) the grid's reward
and exchange, then rotation and init when not at their default (``competitive · visible · fixed roles``); for a
baseline its label, then any applicable axis not at its default (``self-refine · hidden``). Defaults are the
config schema's (``agon.core.config``).

What a run directory holds and how to read it is ``agon.records.run_files``; nothing here reads a file by its own rules.

``load_runs(source="wandb", project=..., filters=...)`` builds the same frames from ``wandb.Api().runs``
(history instead of ``metrics.jsonl``; ``evals`` is empty, since per-problem rows are local only).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from agon.core.config import ExchangeConfig, InitConfig, RewardConfig, RotationConfig, exchange_name
from agon.core.methods import AXES as METHOD_AXES
from agon.core.methods import METHODS
from agon.records.run_files import (CONFIG, EVAL, METRICS, OVERRIDES, SUMMARY, SWEEP_MARKER, is_run_dir, read_json,
                                    read_jsonl, read_yaml, sweep_name)

AXES = ("method", *METHOD_AXES, "task", "model")
# where each axis lives in the resolved config
AXIS_KEYS = {
    "method": "method.name",
    "reward": "reward.name",
    "exchange": "exchange.mode",
    "rotation": "rotation.mode",
    "init": "init.mode",
    "task": "task.name",
    "model": "model.name",
}
# each method axis's value when not overridden, from the config schema (a cell names only what differs)
DEFAULTS = {
    "reward": RewardConfig().name,
    "exchange": ExchangeConfig().mode,
    "rotation": RotationConfig().mode,
    "init": InitConfig().mode,
}
# the 2x2 grid's axes: the method under study names them in every cell; its other axes make an ablation when not
# at their default
GRID_AXES = ("reward", "exchange")
# how a label shows a value: "fixed roles", "symmetric init"
LABEL_SUFFIX = {"rotation": " roles", "init": " init"}
# override keys that never split cells (the seed pools; the rest do not change results)
POOLED_OVERRIDES = ("seed", "logger", "output_dir", "progress")
# override keys an axis's value already holds (a latent cell's span is in its exchange: latent:trace)
AXIS_OVERRIDES = ("exchange.mode", "exchange.span")
NA = "-"
# canonical order of config values in tables and figures (methods come in the registry's order)
ORDER = {
    "reward": ("competitive", "cooperative", "paper"),
    # latent exchange names its span (agon.models.latent.exchange_name)
    "exchange": ("visible", "hidden", "latent:recap", "latent:trace"),
    "rotation": ("alternate", "fixed"),
    "init": ("divergent", "symmetric"),
}
# summary.json numbers every runs frame has (NaN where a run lacks them), so consumers need no column checks
SUMMARY_NUMBERS = (
    "eval/accuracy",
    "eval/accuracy_at_start",
    "eval/final_trace_tokens",
    "eval/cascade_acc_AB",
    "eval/cascade_acc_BA",
    "eval/solo_acc_A",
    "eval/solo_acc_B",
    "eval/conversion_rate",
    "eval/regression_rate",
    "eval/n_problems",
    "eval/samples",
    "train/steps",
    "train/generated_tokens",
    "time/total_s",
)
SKIP_DIRS = {"wandb", "checkpoints", "adapters", ".hydra", "__pycache__", ".git"}


@dataclass
class RunRecord:
    """Everything read about one run, before it becomes frame rows."""

    run_id: str
    run_dir: str | None = None
    sweep: str | None = None
    summary: dict | None = None
    config: dict | None = None
    overrides: list[str] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)


@dataclass
class Runs:
    runs: pd.DataFrame
    steps: pd.DataFrame
    evals: pd.DataFrame


# ---------------------------------------------------------------------------------------------------------------
# local files


def find_run_dirs(path: str | Path) -> list[Path]:
    """Run directories at or below ``path``, sorted (multirun cells by job number)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no such directory: {path}")
    if is_run_dir(path) and not (path / SWEEP_MARKER).exists():
        return [path]
    found = []
    for root, dirs, _ in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        here = Path(root)
        if here != path and is_run_dir(here):
            found.append(here)
            dirs[:] = []

    def key(p: Path) -> tuple:
        head = p.name.split("_", 1)[0]
        return (str(p.parent), int(head) if head.isdigit() else math.inf, p.name)

    return sorted(found, key=key)


def read_run_dir(run_dir: Path, root: Path | None = None) -> RunRecord:
    """One run directory as a RunRecord (missing files give empty parts)."""
    run_dir = Path(run_dir)
    sweep_dir = next((p for p in (run_dir.parent, run_dir.parent.parent) if (p / SWEEP_MARKER).exists()), None)
    sweep = sweep_name(sweep_dir) if sweep_dir is not None else None
    run_id = f"{sweep}/{run_dir.name}" if sweep else str(run_dir.relative_to(root) if root else run_dir.name)
    summary = read_json(run_dir / SUMMARY)
    config = read_yaml(run_dir / CONFIG)
    overrides = read_yaml(run_dir / OVERRIDES) or []
    return RunRecord(
        run_id=run_id,
        run_dir=str(run_dir),
        sweep=sweep,
        summary=summary if isinstance(summary, dict) else None,
        config=config if isinstance(config, dict) else None,
        overrides=[str(o) for o in overrides],
        metrics=read_jsonl(run_dir / METRICS),
        evals=read_jsonl(run_dir / EVAL),
    )


# ---------------------------------------------------------------------------------------------------------------
# W&B


def read_wandb_runs(
    project: str = "agon",
    entity: str | None = None,
    filters: dict | None = None,
    api: Any = None,
) -> list[RunRecord]:
    """W&B runs as RunRecords: config, summary, ``history`` as metric rows, group as sweep, name as overrides."""
    if api is None:
        import wandb

        api = wandb.Api(timeout=30)
    records = []
    for run in api.runs(f"{entity}/{project}" if entity else project, filters=filters or {}):
        summary = dict(run.summary._json_dict if hasattr(run.summary, "_json_dict") else run.summary)
        metrics = []
        for row in run.scan_history():
            row = {k: v for k, v in row.items() if not k.startswith("_") and not isinstance(v, dict)}
            if row.get("train/step") is not None:
                metrics.append(row)
        name = getattr(run, "name", "") or ""
        records.append(
            RunRecord(
                run_id=str(run.id),
                sweep=getattr(run, "group", None),
                # a final summary was written only if the run reached write_summary
                summary=summary if "method" in summary else None,
                config=dict(run.config),
                overrides=[o for o in name.split(",") if "=" in o],
                metrics=metrics,
            )
        )
    return records


# ---------------------------------------------------------------------------------------------------------------
# frames


def _select(config: dict | None, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _applicable(method: Any, summary: dict) -> tuple[str, ...]:
    """The ablation axes that change what ``method`` does: as the run recorded them, else as the registered method
    says (a run from before summary.json held them), else all (unknown here: keep every axis, pool nothing)."""
    recorded = summary.get("method_axes")
    if isinstance(recorded, (list, tuple)):
        return tuple(recorded)
    registered = METHODS.get(method)
    return registered.axes if registered is not None else METHOD_AXES


def _method_label(method: Any, summary: dict) -> str:
    registered = METHODS.get(method)
    return summary.get("method_label") or (registered.label if registered is not None else str(method))


def is_baseline(method: Any) -> bool:
    """Whether ``method`` is compared against rather than studied (``Method.baseline``). A method this process does
    not know counts as one: it gets a baseline's colour and stays out of the 2x2 grid rather than claim a place."""
    registered = METHODS.get(method)
    return registered.baseline if registered is not None else True


def is_ablation(row: Any) -> bool:
    """Whether a cell sets an axis outside the 2x2 grid (rotation, init) that applies to its method to a value
    other than the default."""
    return any(row[axis] not in (NA, None, DEFAULTS[axis]) for axis in METHOD_AXES if axis not in GRID_AXES)


def _cell_label(row: dict, with_method: bool) -> str:
    """``competitive · visible · fixed roles`` for the method under study (the grid's axes always, the others when
    not at their default; its label first only when ``with_method``); ``self-refine · hidden`` for a baseline
    (its label, then every axis not at its default). Axes that do not apply ("-") or are unknown are not shown."""
    baseline = is_baseline(row["method"])
    parts = [row["method_label"]] if baseline or with_method else []
    for axis in METHOD_AXES:
        value = row[axis]
        if value not in (NA, None) and (value != DEFAULTS[axis] or (not baseline and axis in GRID_AXES)):
            parts.append(f"{value}{LABEL_SUFFIX.get(axis, '')}")
    label = " · ".join(parts) or row["method_label"]
    return f"{label} [{row['extra']}]" if row["extra"] else label


def start_metrics(rec: RunRecord) -> dict[str, Any]:
    """The ``eval/*`` numbers of the run's evaluation before training, as ``agon.run`` reads them back on a resume:
    the first metrics row at ``train/step`` 0 that holds ``eval/accuracy``. Empty when the run did not evaluate at
    the start (its summary.json has no ``eval/accuracy_at_start``): an untrained method's (MoA) only evaluation at
    step 0 is then its final one, which is not a start. The ``steps`` frame cannot give this, since it keeps the
    last value per step, and an untrained run evaluates twice at step 0."""
    if rec.summary is not None and rec.summary.get("eval/accuracy_at_start") is None:
        return {}
    row = next((r for r in rec.metrics if r.get("train/step") == 0 and "eval/accuracy" in r), None)
    if row is None:
        return {}
    return {k: v for k, v in row.items() if k.startswith("eval/") and (_number(v) or v is None)}


def _model_label(model: dict) -> str:
    """``agon.run.model_label`` of a run's resolved ``model`` config; its name where the family is not known here."""
    from omegaconf import OmegaConf

    from agon.run import model_label

    try:
        return model_label(OmegaConf.create(model))
    except (KeyError, ValueError):  # a family registered by a plugin this process did not import
        return str(model["name"])


def _run_row(rec: RunRecord) -> dict:
    summary, config = rec.summary or {}, rec.config or {}
    axes = {}
    for axis in AXES:
        value = summary.get(axis)
        axes[axis] = value if value is not None else _select(config, AXIS_KEYS[axis])
    if summary.get("exchange") is None and axes["exchange"] == "latent":  # runs whose summary is not written yet
        axes["exchange"] = exchange_name("latent", _select(config, "exchange.span") or ExchangeConfig().span)
    # the model as the run named it ("Qwen3-0.6B", "Gemma 4 E2B", "tiny (offline)"); runs from before summary.json
    # held model_label keep model.name
    if summary.get("model_label"):
        axes["model"] = summary["model_label"]
    elif rec.summary is None and isinstance(config.get("model"), dict) and config["model"].get("name"):
        # a run still training, named as its summary will name it: it joins its cell, not a row of its own
        axes["model"] = _model_label(config["model"])
    applicable = _applicable(axes["method"], summary)
    for axis in METHOD_AXES:
        if axis not in applicable:
            axes[axis] = NA
    seed = summary.get("seed", config.get("seed"))
    experiment = summary.get("experiment", config.get("experiment"))
    extra = {o for o in rec.overrides
             if _override_key(o) not in set(AXIS_KEYS) | set(POOLED_OVERRIDES) | set(AXIS_OVERRIDES)}
    row: dict[str, Any] = {
        "run_id": rec.run_id,
        "run_dir": rec.run_dir,
        "sweep": rec.sweep,
        "status": "complete" if rec.summary is not None else "incomplete",
        **axes,
        "method_label": _method_label(axes["method"], summary),
        "experiment": experiment,
        "seed": seed,
        "overrides": summary.get("overrides", ",".join(rec.overrides)),
        "extra": extra,  # a set until frames() removes the overrides every run shares
        "headline_orders": summary.get("eval/headline_orders"),
        # the code it ran: the commit, and each launch's (agon.run.code_version) where the run recorded them
        "git_commit": summary.get("git_commit"),
        "git_dirty": summary.get("git_dirty"),
        "launches": summary.get("launches"),
        # the diagnostic's samples per problem: the size of its cross-play, from which analysis.tables reads the
        # answers at two generations of runs from before the evaluation played them (packed runs keep their config
        # in summary.json alone)
        "diagnostic_samples": next((v for v in (_select(config, "eval.diagnostic_samples"),
                                                _select(summary.get("config"), "eval.diagnostic_samples"))
                                    if _number(v)), None),
    }
    for key, value in summary.items():
        if key not in row and (_number(value) or value is None) and "/" in key:
            row[key] = value
    # summary.json's own eval/accuracy_at_start wins over the one read back here (they are the same number)
    for key, value in start_metrics(rec).items():
        row.setdefault(f"{key}_at_start", value)
    return row


def cell_sort_key(row: Any) -> tuple:
    """Order cells: methods in the registry's order (unknown ones last), each method's cells before its ablations;
    config values in ORDER's order."""

    def rank(axis: str) -> int:
        value = row[axis]
        order = tuple(METHODS) if axis == "method" else ORDER.get(axis, ())
        return order.index(value) if value in order else len(order)

    return (
        rank("method"),
        str(row["method"]),  # unknown methods: each one's cells together
        int(is_ablation(row)),
        rank("reward"),
        rank("exchange"),
        rank("rotation"),
        rank("init"),
        str(row["task"]),
        str(row["model"]),
        str(row.get("extra", "")),
    )


def _drop_plain_experiments(run_rows: list[dict]) -> None:
    """A named experiment whose cell the axes already tell apart adds nothing to the cell's name, so its override
    leaves ``extra``; one sharing its axes with another experiment (``grpo_matched`` beside ``grpo``: only the
    group size differs) keeps it, except the experiment named after its method (``grpo``), which is the plain one.
    A sweep's own cell option (``cell=``, sweeps/cell/; ``exchange_cell=``, sweeps/exchange_cell/) is read the
    same way."""
    for key in ("experiment", "cell", "exchange_cell"):
        def named(r: dict, key: str = key) -> str | None:
            return next((o for o in r["extra"] if _override_key(o) == key), None)

        by_axes: dict[tuple, set[str]] = {}
        for r in run_rows:
            if named(r):
                by_axes.setdefault(tuple(r[a] for a in AXES), set()).add(named(r))
        for r in run_rows:
            override = named(r)
            if override and (len(by_axes[tuple(r[a] for a in AXES)]) == 1 or
                             override.split("=", 1)[1] == r["method"]):
                r["extra"] = r["extra"] - {override}


def frames(records: Iterable[RunRecord]) -> Runs:
    """RunRecords -> Runs(runs, steps, evals)."""
    records = list(records)
    run_rows = [_run_row(r) for r in records]
    # overrides every run shares (e.g. debug=smoke on the whole sweep) split no cells: keep only the differences
    shared = set.intersection(*(r["extra"] for r in run_rows)) if run_rows else set()
    settings = {(r["task"], r["model"]) for r in run_rows if r["task"] is not None or r["model"] is not None}
    # several methods under study loaded: their cells would read alike, so each names its method
    studied = {r["method"] for r in run_rows if not is_baseline(r["method"])}
    _drop_plain_experiments(run_rows)
    for r in run_rows:
        r["extra"] = ",".join(sorted(r["extra"] - shared))
        r["cell"] = _cell_label(r, with_method=len(studied) > 1)
        if len(settings) > 1:  # several settings loaded: say which in the label
            r["cell"] += f" ({r['task']}, {r['model']})"
        r["cell_key"] = "|".join(f"{a}={r[a]}" for a in AXES) + (f"|{r['extra']}" if r["extra"] else "")
    runs = pd.DataFrame(run_rows)
    for key in SUMMARY_NUMBERS:
        if key not in runs:
            runs[key] = math.nan
        runs[key] = pd.to_numeric(runs[key], errors="coerce")
    step_parts, eval_parts = [], []
    for rec, row in zip(records, run_rows):
        ident = {"run_id": rec.run_id, "cell": row["cell"], "cell_key": row["cell_key"], "seed": row["seed"]}
        if rec.metrics:
            m = pd.DataFrame([r for r in rec.metrics if r.get("train/step") is not None])
            if not m.empty:
                m = m.groupby("train/step", sort=True).last().reset_index()  # last non-null value per key
                step_parts.append(m.assign(**ident))
        if rec.evals:
            eval_parts.append(pd.DataFrame(rec.evals).assign(**ident))
    steps = pd.concat(step_parts, ignore_index=True) if step_parts else pd.DataFrame(columns=["run_id", "train/step"])
    evals = pd.concat(eval_parts, ignore_index=True) if eval_parts else pd.DataFrame(columns=["run_id", "problem_id"])
    if not runs.empty:
        order = sorted(range(len(runs)), key=lambda i: (cell_sort_key(runs.iloc[i]), str(runs.iloc[i]["seed"])))
        runs = runs.iloc[order].reset_index(drop=True)
    return Runs(runs=runs, steps=steps, evals=evals)


def load_runs(
    paths: str | Path | Iterable[str | Path] | None = None,
    source: str = "local",
    project: str = "agon",
    entity: str | None = None,
    filters: dict | None = None,
    api: Any = None,
) -> Runs:
    """Load runs into tidy frames (see the module docstring).

    :param paths: a multirun root, a run directory, a directory above several, or a list of these (local source)
    :param source: "local" (run directories, the record) or "wandb" (the W&B API)
    :param project: W&B project (source="wandb")
    :param entity: W&B entity (source="wandb"); None means the API's default
    :param filters: W&B MongoDB-style run filters, e.g. ``{"group": "2026-11-30/10-00-00"}`` (source="wandb")
    :param api: a ``wandb.Api``-like object (tests pass a stand-in)
    """
    if source == "wandb":
        return frames(read_wandb_runs(project, entity, filters, api))
    if source != "local":
        raise ValueError(f"source={source!r}: choose 'local' or 'wandb'")
    if paths is None:
        raise ValueError("source='local' needs a path")
    if isinstance(paths, (str, Path)):
        paths = [paths]
    records, seen = [], set()
    for path in paths:
        path = Path(path)
        for run_dir in find_run_dirs(path):
            if run_dir.resolve() not in seen:
                seen.add(run_dir.resolve())
                records.append(read_run_dir(run_dir, root=path))
    return frames(records)


def newest_multirun(base: str | Path = "multirun") -> Path | None:
    """The newest multirun root under ``base`` by modification time of its ``multirun.yaml`` (written at launch)."""
    roots = [p.parent for p in Path(base).glob(f"**/{SWEEP_MARKER}")] if Path(base).is_dir() else []
    return max(roots, key=lambda p: (p / SWEEP_MARKER).stat().st_mtime, default=None)
