"""The run's processes: which one this is, its device, and the few collectives training needs, through accelerate.

``accelerate launch --multi_gpu --num_processes N -m agon.run ...`` (or ``torchrun``, or ``make run-ddp``) starts N
processes; each builds ``Ranks.from_env`` and from then on:

- plays its contiguous share of each step's problems (``split``: whole GRPO groups per rank);
- sends its games to every other rank (``gather``, pickled objects: text and token ids, small next to the model),
  so that rewards, advantages, metrics and evaluation summaries are computed on the whole batch, identically on
  every rank;
- sums the LoRA gradients of its rows into every rank (``sum_``, one flat all-reduce per adapter and step). The loss
  of each row is already divided by the whole batch's normaliser (tokens for dapo, rows for grpo and dr_grpo), so
  the sum is the one-process gradient of the whole batch, and every rank then takes the same optimizer step:
  adapters stay identical without ever being broadcast again.

This is data parallelism as DDP does it (same replicas, gradients all-reduced once per step) but without the DDP
wrapper: two adapters take turns in one module, gradient checkpointing re-enters the forward, and a role's rows may
leave the other adapter unused, all of which DDP's per-backward hooks handle badly; one explicit reduction after
both roles' backward passes is also the fewest collectives.

The process group is started here, not by accelerate, for two reasons. On GPUs accelerate picks NCCL alone, which
serves only CUDA tensors, while some of what the ranks exchange stays on the CPU (the trainer's loss statistics,
float64); so the group gets NCCL for CUDA tensors and gloo for CPU ones (``process_group_backend``), and gloo alone
on CPUs. And NCCL gives up on a collective after 10 minutes, while one rank's share of an evaluation can take hours
longer than another's: the group waits ``trainer.ddp_timeout`` instead. accelerate then finds the group started and
starts none of its own; its state (rank, device) and its collectives work on this one.

With one process (the default) nothing here imports accelerate or touches ``torch.distributed``: every method is
the identity.

Left out on purpose: sharded models (FSDP, DeepSpeed ZeRO); the adapters are small, and the frozen base is
replicated. Several nodes work as far as accelerate does, but only one has been tested.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence, TypeVar

import torch

T = TypeVar("T")


def process_group_backend(device_type: str) -> str:
    """The process group's backend for ranks whose model is on ``device_type``: on GPUs NCCL for CUDA tensors and
    gloo for CPU ones (NCCL serves only CUDA tensors; verl starts its groups the same way), gloo alone on CPUs."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def _set_group_timeout(timeout_s: float) -> None:
    """Make every later collective of the started process group wait up to ``timeout_s`` for the other ranks."""
    # private, but torch's one call that changes a started group's timeout on each of its backends (gloo and NCCL
    # alike): the group starts before Hydra composes the config that holds trainer.ddp_timeout
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timedelta(seconds=timeout_s))


def launched_world_size() -> int:
    """Processes the launcher started (``WORLD_SIZE``, set by accelerate launch and torchrun); 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One flat tensor of them all, so one collective serves every tensor."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive parts of ``flat`` back into ``tensors``, in place."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    # where this rank's model lives; None: leave it to model.device
    device: torch.device | None = None

    @classmethod
    def from_env(cls, device_choice: str = "auto", timeout_s: float | None = None) -> "Ranks":
        """This process's place, from the launcher's environment; a single process without it. ``device_choice`` is
        ``model.device``: ``cpu`` keeps every rank on the CPU (gloo), otherwise each rank takes its local GPU.
        ``timeout_s``: how long a collective waits for the other ranks (``trainer.ddp_timeout``). The first call
        starts the process group (None: the config's default timeout); a later one returns the same place and sets
        the timeout, if given."""
        if launched_world_size() == 1:
            return cls()
        import torch.distributed as dist
        from accelerate import PartialState

        on_cpu = device_choice == "cpu" or not torch.cuda.is_available()
        if dist.is_initialized():
            if timeout_s is not None:
                _set_group_timeout(timeout_s)
        else:
            if not on_cpu:
                # NCCL binds each rank to the current device: this rank's own GPU, as PartialState will choose it
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            if timeout_s is None:
                from agon.core.config import TrainerConfig

                timeout_s = TrainerConfig.ddp_timeout
            # before PartialState, which starts no group of its own when one exists
            dist.init_process_group(backend=process_group_backend("cpu" if on_cpu else "cuda"),
                                    timeout=timedelta(seconds=timeout_s))
        state = PartialState(cpu=on_cpu)
        if device_choice == "cpu" and state.device.type != "cpu":
            raise RuntimeError("model.device=cpu with several processes on a machine with GPUs: hide them "
                               "(CUDA_VISIBLE_DEVICES=) so that every rank uses the CPU and gloo")
        device = torch.device("cpu") if state.device.type == "cpu" else state.device
        return cls(state.process_index, state.num_processes, device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def split(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous share of ``items`` (sizes differ by at most one; concatenated in rank order, the
        shares are ``items`` again)."""
        n = len(items)
        return list(items[self.rank * n // self.world : (self.rank + 1) * n // self.world])

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        from accelerate.utils import gather_object

        return gather_object([obj])

    def sum_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each tensor by its sum over the ranks, in place, with one all-reduce for all of them."""
        if self.world == 1 or not tensors:
            return
        from accelerate.utils import reduce

        _unflatten_into(reduce(_flatten(tensors), reduction="sum"), tensors)

    def broadcast_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Overwrite each tensor with rank 0's, in place (adapters at start: PEFT draws lora_A from each process's
        own RNG)."""
        if self.world == 1 or not tensors:
            return
        from accelerate.utils import broadcast

        _unflatten_into(broadcast(_flatten(tensors), from_process=0), tensors)

    def share(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (a path, a timestamp)."""
        if self.world == 1:
            return obj
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([obj], from_process=0)[0]

    def barrier(self) -> None:
        if self.world > 1:
            from accelerate import PartialState

            PartialState().wait_for_everyone()

    def close(self) -> None:
        """End the process group once every rank has reached this call. torch asks each process to before it exits:
        a gloo rank that exits without it aborts now and then as the interpreter shuts down (SIGABRT, "terminate
        called without an active exception", pytorch/pytorch#190489), failing a run that had finished. Call it on
        the way out of a run that succeeded only: after a failure the other ranks may never reach it."""
        if self.world == 1:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            self.barrier()
            dist.destroy_process_group()
