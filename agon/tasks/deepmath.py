"""DeepMath-103K (``zwhe99/DeepMath-103K``): hard competition math with verified final answers.

Problems come from the hub through ``datasets`` or from a local copy with the same columns (``question``,
``final_answer``, ``difficulty``, ``topic``): a parquet or JSONL file, or a directory of them. Only those four
columns are read (the R1 traces are most of the 5 GB). Problems below ``task.min_difficulty`` are dropped,
duplicates of a question are dropped, and a seeded held-out split of ``task.heldout_size`` problems is taken out
of the pool; train and held-out never share a question. Grading is ``agon.tasks.math_verifier`` (math-verify in
worker processes with an outer deadline).
"""

from __future__ import annotations

import glob
import hashlib
import logging
import math
import os
import random
from typing import Any, Sequence

from agon.tasks import Problem, Task, Verdict, register_task

log = logging.getLogger(__name__)

HUB_ID = "zwhe99/DeepMath-103K"
COLUMNS = ("question", "final_answer", "difficulty", "topic")
_EXTS = (".parquet", ".jsonl", ".json", ".jsonl.gz", ".json.gz")


class DatasetUnavailableError(RuntimeError):
    """The dataset could not be loaded from the hub and no local copy was given."""


def looks_like_path(source: str) -> bool:
    return source.startswith(("/", ".", "~")) or source.endswith(_EXTS) or os.sep + os.sep in source


def _data_files(path: str, split: str | None) -> list[str]:
    if os.path.isfile(path):
        return [path]
    files = sorted(
        f for ext in _EXTS for f in glob.glob(os.path.join(path, "**", "*" + ext), recursive=True)
    )
    if split:
        # a hub snapshot keeps splits apart by file name (data/train-00000-of-00010.parquet)
        named = [f for f in files if os.path.basename(f).startswith((split + "-", split + "."))]
        files = named or files
    parquet = [f for f in files if f.endswith(".parquet")]
    return parquet or files


def load_table(
    source: str,
    *,
    what: str,
    hub_id: str,
    columns: Sequence[str],
    split: str = "train",
    example: str = "/path/to/file.parquet",
) -> Any:
    """A ``datasets.Dataset`` with ``columns`` from a local file/directory or a hub id.

    A hub id that cannot be reached (offline, no cache) raises one ``DatasetUnavailableError`` that names the
    dataset and how to point the task at a local copy.
    """
    import datasets

    path = os.path.expanduser(source)
    if os.path.exists(path):
        files = _data_files(path, split if os.path.isdir(path) else None)
        if not files:
            raise FileNotFoundError(f"task.source={source!r} holds no parquet or JSONL files for {what}")
        fmt = "parquet" if all(f.endswith(".parquet") for f in files) else "json"
        kwargs = {"columns": list(columns)} if fmt == "parquet" else {}
        ds = datasets.load_dataset(fmt, data_files=files, split="train", **kwargs)
    elif looks_like_path(source):
        raise FileNotFoundError(f"task.source={source!r}: no such file or directory (a local copy of {what})")
    else:
        try:
            ds = datasets.load_dataset(source, split=split, columns=list(columns))
        except Exception as e:  # offline, unreachable, gated, not cached: one clear message
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise DatasetUnavailableError(
                f"could not load {what} from the hub id {source!r} (split {split!r}): {type(e).__name__}: {first}\n"
                f"Download it where the hub is reachable (e.g. `hf download {hub_id} --repo-type "
                f"dataset --local-dir DIR`) and point the task at the local copy: task.source={example} "
                f"(a parquet or JSONL file, or a directory of them, with columns {', '.join(columns)})."
            ) from None
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise ValueError(f"task.source={source!r} lacks columns {missing} needed for {what} (has {ds.column_names})")
    extra = [c for c in ds.column_names if c not in columns]
    return ds.remove_columns(extra) if extra else ds


def stable_id(prefix: str, text: str) -> str:
    return f"{prefix}-{hashlib.sha1(text.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


def split_heldout(problems: list[Problem], heldout_size: int, seed: int, key: str) -> tuple[list, list]:
    """(train, heldout): a seeded shuffle of the problems sorted by id, the first ``heldout_size`` held out."""
    if heldout_size < 0:
        raise ValueError(f"task.heldout_size={heldout_size} must be >= 0")
    if heldout_size >= len(problems):
        raise ValueError(
            f"task.heldout_size={heldout_size} leaves no training problems: only {len(problems)} pass the "
            f"filters ({key}); lower task.heldout_size or loosen the filters"
        )
    ordered = sorted(problems, key=lambda p: p.id)
    random.Random(seed).shuffle(ordered)
    return ordered[heldout_size:], ordered[:heldout_size]


@register_task("deepmath")
class DeepMathTask(Task):
    def __init__(self, cfg: Any):
        super().__init__(cfg)
        ds = load_table(cfg.source, what="DeepMath-103K", hub_id=HUB_ID, columns=COLUMNS, split="train")
        seen: set[str] = set()
        problems: list[Problem] = []
        n_rows = 0
        for row in ds:
            n_rows += 1
            d = row["difficulty"]
            if d is None or (isinstance(d, float) and math.isnan(d)) or float(d) < cfg.min_difficulty:
                continue
            q, a = (row["question"] or "").strip(), row["final_answer"]
            if not q or a is None or not str(a).strip():
                continue
            pid = stable_id("deepmath", q)
            if pid in seen:
                continue
            seen.add(pid)
            problems.append(Problem(pid, q, str(a).strip(), {"difficulty": float(d), "topic": row["topic"]}))
        self._train, self._heldout = split_heldout(
            problems, cfg.heldout_size, cfg.split_seed, f"task.min_difficulty={cfg.min_difficulty}"
        )
        log.info(
            "deepmath: %d rows, %d with difficulty >= %g; %d train, %d held out",
            n_rows, len(problems), cfg.min_difficulty, len(self._train), len(self._heldout),
        )
        self._verifier = None

    def train_problems(self) -> Sequence[Problem]:
        return self._train

    def heldout_problems(self) -> Sequence[Problem]:
        return self._heldout

    @property
    def verifier(self):
        if self._verifier is None:
            from agon.tasks.math_verifier import MathVerifier

            self._verifier = MathVerifier(workers=self.cfg.verify_workers, timeout_s=self.cfg.verify_timeout_s)
        return self._verifier

    def verify(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        got = self.verifier.verify([p.answer for p in problems], completions)
        return [Verdict(v.correct, v.format_ok, v.status, v.detail) for v in got]

    def close(self) -> None:
        if self._verifier is not None:
            self._verifier.close()
            self._verifier = None
