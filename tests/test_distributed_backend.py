"""The process group of a multi-process run: every tensor a collective is handed is on a device the GPU group
serves, and the group waits ``trainer.ddp_timeout``.

On GPUs the group starts with ``process_group_backend("cuda")``, NCCL for CUDA tensors and gloo for CPU ones; NCCL
alone (accelerate's choice) fails the first collective handed a CPU tensor ("No backend type associated with device
type cpu"), and runs on CPUs, on gloo alone, which serves both, cannot show it. So a real two-process run on the CPU
(a training step, a checkpoint, two evaluations; ``accelerate launch`` as in tests/test_distributed.py) records, in
each rank, every call to torch.distributed's collectives: the devices of the tensors it was handed, where in agon
it came from, and the group's timeout then. The test checks each device against the device types the GPU backend
serves, as torch reads a backend string, and checks NCCL alone the same way: that check must fail on the trainer's
CPU loss statistics, or the first could not fail either.

What a CPU run cannot show: which tensors a GPU run would hold on the GPU. Here all are on the CPU, so the test says
that the GPU group serves every collective that a run makes with a CPU tensor; a CUDA tensor (the gradients) NCCL
serves in either group. Object collectives and barriers are handed no tensor: torch picks for them a device their
group serves. The single-process path, which starts no group at all, is tested in tests/test_distributed.py.

Run as ``python -m tests.test_distributed_backend <dir> <overrides>``, this module is one rank of that run.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
# every collective of torch.distributed; the object ones pickle what they are handed onto a device torch picks
OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                      "send_object_list", "recv_object_list")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv",
               "isend", "irecv", "batch_isend_irecv", "barrier", "monitored_barrier", "all_reduce_coalesced",
               "all_gather_coalesced") + OBJECT_COLLECTIVES
TIMEOUT_S = 1234


def served_device_types(backend: str) -> set[str]:
    """The device types a group started with ``backend`` serves, read as torch reads it: "cpu:gloo,cuda:nccl" the
    devices it names, one backend alone those torch lists for it (NCCL: CUDA only)."""
    if ":" in backend:
        return {pair.split(":")[0].strip() for pair in backend.split(",")}
    return set(dist.Backend.backend_capability[backend.lower()])


def unserved(calls: list[dict[str, Any]], backend: str) -> list[dict[str, Any]]:
    """The recorded calls handed a tensor on a device that a group started with ``backend`` does not serve."""
    served = served_device_types(backend)
    return [c for c in calls if not set(c["devices"]) <= served]


# --- one rank of the run (python -m tests.test_distributed_backend) ---------------------------------------------


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _caller() -> str:
    """Where the collective was called from: the innermost frame outside torch, accelerate, this module and
    agon/core/distributed.py (the ``Ranks`` methods every collective of agon goes through)."""
    conduits = {Path(__file__).resolve(), ROOT / "agon" / "core" / "distributed.py"}
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if path in conduits or "site-packages" in path.parts:
            continue
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        return f"{where}:{frame.lineno}"
    return "?"


def _group_timeouts() -> list[float]:
    """The timeout of each backend of the default group, in seconds (private: torch has no public getter)."""
    group = dist.group.WORLD
    return sorted({group._get_backend(d).options._timeout.total_seconds() for d in group._device_types})


def _recording(name: str, function: Callable, calls: list[dict[str, Any]]) -> Callable:
    signature = inspect.signature(function)

    @functools.wraps(function)
    def record(*args: Any, **kwargs: Any) -> Any:
        if name in OBJECT_COLLECTIVES:
            # their objects are pickled onto a device torch picks for the group, unless one is named
            device = signature.bind(*args, **kwargs).arguments.get("device")
            tensors, devices = [], {torch.device(device).type} if device is not None else set()
        else:
            tensors = _tensors([*args, *kwargs.values()])
            devices = {t.device.type for t in tensors}
        calls.append({"op": name, "devices": sorted(devices), "dtypes": sorted({str(t.dtype) for t in tensors}),
                      "site": _caller(), "backend": dist.get_backend(), "timeout_s": _group_timeouts()})
        return function(*args, **kwargs)

    return record


def _rank_main(directory: Path, overrides: list[str]) -> None:
    """Record every collective of ``python -m agon.run <overrides>`` on this rank into ``<dir>/rank<R>.json``, and
    whether the process group is still started when the run returns."""
    calls: list[dict[str, Any]] = []
    # replaced on the module before agon and accelerate load: both call them as torch.distributed.<name>, while
    # torch's own object collectives call the unwrapped ones inside (their tensors are torch's choice, not ours)
    for name in COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, _recording(name, getattr(dist, name), calls))
    torch.set_num_threads(1)
    sys.argv = ["agon.run", *overrides]
    try:
        # as `python -m agon.run` runs it: Hydra finds conf/ next to the file of a task function in __main__
        runpy.run_module("agon.run", run_name="__main__", alter_sys=True)
    finally:
        rank = int(os.environ["RANK"])
        (directory / f"rank{rank}.json").write_text(json.dumps({"calls": calls, "group_left": dist.is_initialized()}))


# --- the test -----------------------------------------------------------------------------------------------------


@pytest.mark.long
def test_every_collective_of_a_run_is_served_by_the_gpu_group_and_waits_the_configured_timeout(agon_cache,
                                                                                                 tmp_path):
    from agon.core.config import TrainerConfig
    from agon.core.distributed import process_group_backend
    from tests.conftest import SMALL_RUN, TEST_WORLD
    from tests.test_distributed import launch

    assert TIMEOUT_S != TrainerConfig.ddp_timeout  # or the timeout read back could be the default
    overrides = TEST_WORLD + SMALL_RUN + [
        "trainer.max_steps=1", "trainer.prompts_per_step=4", "trainer.checkpoint_every=1", "eval.n_problems=2",
        "logger=none", f"output_dir={tmp_path / 'run'}", f"trainer.ddp_timeout={TIMEOUT_S}"]
    launch(["tests.test_distributed_backend", str(tmp_path), *overrides], cwd=tmp_path)

    for rank in (0, 1):
        recorded = json.loads((tmp_path / f"rank{rank}.json").read_text())
        calls = recorded["calls"]
        # the CPU run's own group: gloo alone, as the code starts it for CPUs
        assert {c["backend"] for c in calls} == {process_group_backend("cpu")}
        # and the run ends it: a gloo rank that exits with its group started aborts now and then (SIGABRT)
        assert not recorded["group_left"]
        # every kind of collective the run makes was recorded, so the checks below cover each of them
        assert {"all_reduce", "broadcast", "all_gather_object", "broadcast_object_list", "barrier"} <= {
            c["op"] for c in calls}, calls
        statistics = [c for c in calls if c["op"] == "all_reduce" and c["dtypes"] == ["torch.float64"]
                      and c["site"].startswith("agon/training/trainer.py")]
        assert statistics, "the trainer's loss statistics were not all-reduced: the check below would miss them"

        gpu_backend = process_group_backend("cuda")
        assert unserved(calls, gpu_backend) == [], f"{gpu_backend} does not serve: {unserved(calls, gpu_backend)}"
        # what accelerate starts on GPUs: the same check finds the CPU statistics (and every CPU tensor) unserved
        assert statistics[0] in unserved(calls, "nccl")

        # the launch time is shared before Hydra composes the config: the default timeout; then the configured one,
        # in every later collective, the last (the barrier before the group ends) included
        first, *rest = calls
        assert first["site"].startswith("agon/run.py") and first["timeout_s"] == [TrainerConfig.ddp_timeout]
        assert {t for c in rest for t in c["timeout_s"]} == {TIMEOUT_S}
        assert rest[-1]["op"] == "barrier" and rest[-1]["site"].startswith("agon/run.py")


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]), sys.argv[2:])
