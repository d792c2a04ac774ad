"""Read back what an offline W&B run wrote: the records of its ``.wandb`` file, decoded with W&B's own protobuf types.

wandb 0.31 ships no reader for the file (its Go core writes it), so the framing is read here: the LevelDB log
format W&B uses (a 7-byte header ``:W&B``, 0xBEE1, version 0; then 32 KiB blocks of chunks, each ``crc32c (4) |
length (2, little-endian) | type (1: full, 2: first, 3: middle, 4: last) | data``, a block's last < 7 bytes zero
padding). Each assembled chunk is one ``wandb_internal_pb2.Record``. Checksums are not verified: a test reads a file
W&B has just written, and a torn record fails to parse anyway.

Left out on purpose: anything but the records tests look at (the run, history rows, summary, artifacts).
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from wandb.proto import wandb_internal_pb2 as pb

HEADER = 7
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[pb.Record]:
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B log")
    out, pos, pending = [], HEADER, b""
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:  # the block's tail is padding
            pos += left_in_block
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if kind == 0 and length == 0:  # zero padding
            pos += left_in_block
            continue
        if pos + 7 + length > len(data):  # a chunk W&B is still writing
            break
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            pending = chunk
        elif kind == FIRST:
            pending = chunk
            continue
        elif kind == MIDDLE:
            pending += chunk
            continue
        elif kind == LAST:
            pending += chunk
        record = pb.Record()
        record.ParseFromString(pending)
        out.append(record)
        pending = b""
    return out


class OfflineRun:
    """Every ``offline-run-*`` of a run directory (a resumed run has one per process) read as one run."""

    def __init__(self, run_dir: Path, timeout: float = 20.0):
        files = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
        assert files, f"no offline W&B run under {run_dir}"
        deadline = time.monotonic() + timeout
        while True:  # W&B's service writes the exit record shortly after finish() returns
            try:
                self.records = [r for f in files for r in records(f)]
            except DecodeError:  # read while a record was half written: read again
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            if sum(r.HasField("exit") for r in self.records) == len(files) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.files = files
        runs = [r.run for r in self.records if r.HasField("run")]
        self.run = runs[-1]
        self.history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in r.history.item} for r in self.records if r.HasField("history")]
        self.summary: dict[str, Any] = {}
        for r in self.records:
            if r.HasField("summary"):
                for item in r.summary.update:
                    self.summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        self.artifacts = [r.artifact for r in self.records if r.HasField("artifact")]

    @property
    def keys(self) -> set[str]:
        return {k for row in self.history for k in row}

    def steps(self, key: str) -> list[Any]:
        """``train/step`` of every history row that holds ``key``, in the order logged."""
        return [row.get("train/step") for row in self.history if key in row]


# ---------------------------------------------------------------------------------------------------------------
# a sweep of the test world logged offline: two cells (exchange visible and hidden) x two seeds

SWEEP_NAME = "2026-12-01/09-00-00"
CELLS = ("exchange=hidden", "exchange=visible")
SEEDS = (0, 1)


def offline_env(tmp_path: Path, monkeypatch: Any) -> None:
    """W&B offline, silent, with no key, identity, server or netrc of this machine's, its files under ``tmp_path``."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))


def shared_sweep(tmp_path_factory: Any) -> Path:
    """``offline_sweep`` in the folder every pytest-xdist worker of this session shares (the parent of a worker's
    base temp), so that the test files reading it build it once between them, not once per worker."""
    import os

    base = tmp_path_factory.getbasetemp()
    return offline_sweep((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "wandb_sweep")


def offline_sweep(base: Path) -> Path:
    """``<base>/multirun/2026-12-01/09-00-00`` with the four runs of ``CELLS`` x ``SEEDS`` trained by ``agon.run``
    with ``logger=wandb`` offline (an interim evaluation and the diagnostic at each, so every panel has data). Built
    once per ``base`` under a file lock: a second caller, in this process or another, waits and finds it done."""
    import fcntl

    sweep = Path(base) / "multirun" / SWEEP_NAME
    sweep.mkdir(parents=True, exist_ok=True)
    with open(Path(base) / "sweep.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (sweep / "done").exists():
            _train_sweep(Path(base), sweep)
    return sweep


def _train_sweep(base: Path, sweep: Path) -> None:
    import os

    from agon.run import run
    from tests.conftest import SMALL_RUN, TEST_WORLD, compose_config

    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_SILENT", "WANDB_DIR", "WANDB_CONFIG_DIR",
                                            "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_API_KEY")}
    os.environ.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        os.environ[var] = str(Path(base) / "wandb_home")
    os.environ.pop("WANDB_API_KEY", None)
    try:
        for cell in CELLS:
            for seed in SEEDS:
                overrides = [cell, f"seed={seed}"]
                cfg = compose_config([*TEST_WORLD, *SMALL_RUN, "logger=wandb", "eval.every=1",
                                      "eval.diagnostic=true", *overrides])
                cfg.output_dir = str(sweep / ",".join(overrides))
                run(cfg)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    (sweep / "done").write_text("")
