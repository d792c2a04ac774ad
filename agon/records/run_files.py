"""What a run directory holds, and how to read it back: the one definition ``agon`` and ``analysis`` share.

    metrics.jsonl         one JSON line per step, append-only, ``train/step`` the key (W&B mirrors it)
    eval.jsonl            one row per problem x sample x order x stage of every evaluation
    samples.jsonl         rollouts: draft, recap, challenge and their rewards
    summary.json          final metrics, the method's axes, git commit, package versions (written atomically)
    run.log               agon's log lines with their time, appended by each launch (conf/hydra/job_logging)
    adapters/<name>/      each adapter at the end, in PEFT's format
    checkpoints/step_N/   adapters, optimizers, RNGs, the data position and the config; ``checkpoints/latest``
                          names the newest
    reeval/               what ``python -m agon.eval`` writes (the same files, plus crossplay.csv)
    .hydra/config.yaml    the composed config (Hydra writes it); ``.hydra/overrides.yaml`` the command line's overrides

Names of the metrics are listed in docs/metrics.md. Readers skip what a crash can leave behind: a torn last JSONL
line, an unparsable or missing file (an empty result, never an exception). A JSONL file may also be stored
gzip-compressed beside its name (``metrics.jsonl.gz``: results kept in the repository, ``analysis.pack``).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

METRICS = "metrics.jsonl"
EVAL = "eval.jsonl"
SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
# agon's log lines with their time (conf/hydra/job_logging/agon.yaml names it after the job, agon.run)
RUN_LOG = "run.log"
ADAPTERS = "adapters"
CHECKPOINTS = "checkpoints"
# in each checkpoint: the resolved config of the run that wrote it (agon.run.check_checkpoint)
CHECKPOINT_CONFIG = "config.json"
# the committed chunks of an evaluation in progress (agon.game.cascade.PartStore), removed once it is logged
EVAL_PARTS = "eval_parts"
# the W&B run's id, so that a resumed run logs into the same W&B run
WANDB_RUN_ID = "wandb_run_id"
REEVAL = "reeval"
CONFIG = os.path.join(".hydra", "config.yaml")
OVERRIDES = os.path.join(".hydra", "overrides.yaml")
# a directory holding any of these is a run directory
MARKERS = (SUMMARY, METRICS, METRICS + ".gz", CONFIG)
# written by Hydra when a multirun starts, at the sweep's root
SWEEP_MARKER = "multirun.yaml"


def engine_log(rank: int) -> str:
    """The log a rank's sampling engine keeps of itself (vLLM's worker), appended at each launch."""
    return f"engine_rank{rank}.log"


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as {"a.b.c": leaf}, the dotted keys of a config."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out |= flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def jsonable(value: Any) -> Any:
    """``value`` with tensors and numpy scalars as Python numbers and non-finite floats as None (JSON's null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return jsonable(value.item())
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSONL file, or of ``<path>.gz`` when only that exists (a torn last line from a
    crash is skipped)."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    if path.exists():
        text = path.read_text()
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_json(path: Path) -> Any:
    """A JSON file's content, or None when it is missing or unparsable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_yaml(path: Path) -> Any:
    """A YAML file's content, or None when it is missing or unparsable."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file in the same directory, fsync, then rename over ``path``: a reader sees the
    old content or the new, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON, written atomically (``write_text_atomic``)."""
    write_text_atomic(path, json.dumps(jsonable(obj), indent=2, sort_keys=True))


def is_run_dir(path: Path) -> bool:
    return any((Path(path) / f).exists() for f in MARKERS)


def sweep_name(sweep_dir: Path) -> str:
    """A sweep's name: ``multirun/2026-11-30/10-00-00`` -> ``2026-11-30/10-00-00`` (the parts after ``multirun``, or
    ``<date>/<time>`` in Hydra's layout under any base directory), else the directory's name."""
    parts = Path(sweep_dir).resolve().parts
    if "multirun" in parts:
        rest = parts[len(parts) - parts[::-1].index("multirun") :]
        if rest:
            return "/".join(rest)
    if len(parts) > 1 and re.fullmatch(r"\d{4}-\d{2}-\d{2}", parts[-2]):
        return "/".join(parts[-2:])
    return Path(sweep_dir).name
