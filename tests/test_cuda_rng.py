"""The CUDA generator's state, which exists only on a GPU: an evaluation forks it, a checkpoint saves it, a resume
restores it, and starting vLLM puts it back.

On a GPU the training run samples from the CUDA generator of its own device. Three places must keep that stream
whole: the evaluation (``agon.game.cascade.forked_rng``: it reseeds every generator for its chunks, and only the run's
device's is forked, so that a rank never initialises the other ranks' GPUs), the checkpoint (``Trainer._rng_state``
and ``load_checkpoint``: the device's state saved beside the CPU's and put back on the same device) and the vLLM
worker (``VLLMServer``: ``LLM()`` reseeds the global generators). Every other resume test runs on the CPU, where no
CUDA state exists, so a bug in any of these passes them all.

Here the CPU tests replace ``torch.cuda``'s generator functions at that boundary by ``FakeDevices``: two devices with
a state each, the run on device 1 (so that "the current device" and "device 0" differ), a draw that moves a
device's state as a sample would, and a record of which devices were read. The real evaluation, trainer and vLLM
server code runs against it (vLLM itself, absent here, is replaced by an ``LLM`` that reseeds as vLLM's does). The
``gpu``-marked test checks the same on a real CUDA device where one exists.

Left out on purpose: several ranks each restoring their own device's state (test_distributed runs ranks on gloo, on
CPU, where there is none), and the samples a real GPU's kernels draw (the fake counts draws, not kernels).
"""

from __future__ import annotations

import hashlib
import sys
import types

import pytest
import torch

from agon.game.cascade import evaluate, forked_rng
from agon.records.recorder import Recorder
from agon.tasks import build_task
from agon.training.trainer import Trainer


def _seeded(seed: int) -> torch.Tensor:
    return torch.tensor(list(hashlib.sha256(f"seed {seed}".encode()).digest()), dtype=torch.uint8)


class FakeDevices:
    """``torch.cuda``'s generator functions on a machine with ``count`` CUDA devices, the current one ``current``:
    one state per device (a byte tensor, as torch's), ``manual_seed_all`` as ``torch.manual_seed`` calls it, and
    ``draw``: a sample from a device's generator, which moves its state."""

    def __init__(self, count: int = 2, current: int = 1):
        self.states = {i: _seeded(1000 + i) for i in range(count)}
        self.current = current
        self.read: list[int] = []  # every device whose state was read (fork_rng and checkpoints read them)
        self.reseeded = 0

    def index(self, device=None) -> int:
        if device is None or isinstance(device, str) and device == "cuda":
            return self.current
        if isinstance(device, int):
            return device
        device = torch.device(device)
        return self.current if device.index is None else device.index

    def get_rng_state(self, device="cuda") -> torch.Tensor:
        self.read.append(self.index(device))
        return self.states[self.index(device)].clone()

    def set_rng_state(self, new_state: torch.Tensor, device="cuda") -> None:
        self.states[self.index(device)] = new_state.clone()

    def manual_seed_all(self, seed: int) -> None:
        self.reseeded += 1
        for i in self.states:
            self.states[i] = _seeded(seed)

    def manual_seed(self, seed: int) -> None:
        self.states[self.current] = _seeded(seed)

    def draw(self, device=None) -> int:
        i = self.index(device)
        value = int(self.states[i][0])
        self.states[i] = torch.tensor(list(hashlib.sha256(bytes(self.states[i].tolist())).digest()), dtype=torch.uint8)
        return value

    def snapshot(self) -> dict[int, torch.Tensor]:
        return {i: s.clone() for i, s in self.states.items()}


def same(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[i], b[i]) for i in a)


@pytest.fixture
def devices(monkeypatch) -> FakeDevices:
    """CUDA present, as far as the code under test asks: two devices, the run on device 1."""
    fake = FakeDevices()
    for name in ("get_rng_state", "set_rng_state", "manual_seed_all", "manual_seed"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(fake.states))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: fake.current)
    return fake


# ---------------------------------------------------------------------------------------------------------------
# an evaluation in the middle of a run


@pytest.mark.parametrize("current", [0, 1])
def test_a_forked_block_leaves_the_current_devices_generator_where_it_was_and_reads_no_other(devices, current):
    """Inside: a reseed (as each evaluation chunk does) and draws. After it the run's device draws what it would have
    drawn without the block; no other device's state was read (forking every device would initialise every GPU of
    the machine in each rank)."""
    devices.current = current
    before = devices.snapshot()
    straight = FakeDevices(current=current)
    straight.states = devices.snapshot()
    want = [straight.draw() for _ in range(3)]
    with forked_rng():
        torch.manual_seed(7)
        devices.draw()
        moved = not torch.equal(devices.states[current], before[current])
    assert moved  # the block did move the generator: restoring it is what is tested
    assert torch.equal(devices.states[current], before[current])
    assert [devices.draw() for _ in range(3)] == want
    assert set(devices.read) == {current}


def test_an_evaluation_on_the_tiny_model_leaves_the_cuda_generator_of_the_runs_device_where_it_was(
        devices, small_cfg, policies):
    """The real evaluation (agon.game.cascade.evaluate), which reseeds the generators for each chunk: the device's
    state after it is the state before it, and only the run's device was forked."""
    small_cfg.eval.max_new_tokens = 8  # what is sampled does not matter here, only that the chunk reseeds
    task = build_task(small_cfg.task)
    problems = list(task.heldout_problems())[:1]
    devices.draw()  # a run that has sampled already
    before = devices.snapshot()[devices.current]
    cpu = torch.get_rng_state()
    evaluate(policies, task, small_cfg, problems, step=1, phase="train", samples=1)
    assert devices.reseeded >= 1  # the evaluation did move the generators: restoring them is what is tested
    assert torch.equal(devices.states[devices.current], before)
    assert torch.equal(torch.get_rng_state(), cpu)
    assert set(devices.read) == {devices.current}


# ---------------------------------------------------------------------------------------------------------------
# a checkpoint and its resume


def _trainer(cfg, policies, run_dir) -> Trainer:
    return Trainer(cfg, policies, build_task(cfg.task), Recorder(run_dir), run_dir, log=lambda *_: None)


def test_a_resume_restores_the_cuda_generator_on_the_runs_device_so_the_next_draws_are_the_uninterrupted_runs(
        devices, small_cfg, policies, tmp_path):
    """Saved at a step: the run's device's state goes into the checkpoint (per rank, beside the CPU's). The run
    goes on drawing; a relaunch reseeds everything (agon.run seeds at start), then loads the checkpoint: the run's
    device draws what the uninterrupted run drew after the checkpoint, and device 0 (another rank's) is left
    alone."""
    trainer = _trainer(small_cfg, policies, tmp_path / "run")
    devices.draw()
    devices.draw(device=0)
    saved_state = devices.snapshot()
    checkpoint = trainer.save_checkpoint()
    rngs = torch.load(checkpoint / "state.pt", weights_only=False)["rng"]
    assert torch.equal(rngs[0]["cuda"], saved_state[devices.current])
    straight = [devices.draw() for _ in range(3)]

    torch.manual_seed(123)  # the relaunch's own seed: the checkpoint's state must win
    devices.draw(device=0)
    other = devices.states[0].clone()
    resumed = _trainer(small_cfg, policies, tmp_path / "run")
    resumed.load_checkpoint(checkpoint)
    assert torch.equal(devices.states[devices.current], saved_state[devices.current])
    assert torch.equal(devices.states[0], other)  # restored where it was saved from, nowhere else
    assert [devices.draw() for _ in range(3)] == straight


def test_a_checkpoint_saved_without_cuda_resumes_on_a_machine_with_it_leaving_its_generator_alone(
        devices, small_cfg, policies, tmp_path, monkeypatch):
    """A run checkpointed on a CPU machine (no CUDA state in it) and resumed on a GPU: no error, and the device's
    generator keeps the state the relaunch seeded."""
    with monkeypatch.context() as cpu_only:
        cpu_only.setattr(torch.cuda, "is_available", lambda: False)
        checkpoint = _trainer(small_cfg, policies, tmp_path / "run").save_checkpoint()
    assert "cuda" not in torch.load(checkpoint / "state.pt", weights_only=False)["rng"][0]
    torch.manual_seed(5)
    seeded = devices.snapshot()
    _trainer(small_cfg, policies, tmp_path / "run").load_checkpoint(checkpoint)
    assert same(devices.snapshot(), seeded)


# ---------------------------------------------------------------------------------------------------------------
# starting vLLM


def test_starting_the_vllm_worker_puts_the_cuda_generator_back(devices, monkeypatch):
    """vLLM's LLM() seeds the global generators with its own seed (replaced here by an LLM that does just that, as
    vLLM is not installed in agon's environment): the trainer's CUDA stream on the run's device, and the CPU's,
    come back as they were."""
    from agon.engines.vllm_worker import VLLMServer

    class LLM:
        def __init__(self, seed: int, **_):
            torch.manual_seed(seed)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    devices.draw()
    before, cpu = devices.snapshot(), torch.get_rng_state()
    VLLMServer("tiny", "float32", 8, 2, 256, seed=0, enforce_eager=True, gpu_memory_utilization=0.5,
               max_num_seqs=4)
    assert devices.reseeded == 1
    assert torch.equal(devices.states[devices.current], before[devices.current])
    assert torch.equal(torch.get_rng_state(), cpu)


# ---------------------------------------------------------------------------------------------------------------
# on a real GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_an_evaluation_and_a_resume_keep_the_cuda_stream(small_cfg, policies, tmp_path):
    """The same on a real device: the evaluation in the middle (the tiny model on the CPU, its chunks reseeding
    every generator) leaves the CUDA stream where it was, and a resume restores it so that the next CUDA sample is
    the uninterrupted run's."""
    task = build_task(small_cfg.task)
    torch.cuda.manual_seed(11)
    torch.randn(4, device="cuda")  # a run that has sampled already
    state = torch.cuda.get_rng_state()
    want = torch.randn(8, device="cuda")
    torch.cuda.set_rng_state(state)
    evaluate(policies, task, small_cfg, list(task.heldout_problems())[:2], step=1, phase="train", samples=1)
    assert torch.equal(torch.cuda.get_rng_state(), state)
    assert torch.equal(torch.randn(8, device="cuda"), want)

    torch.cuda.set_rng_state(state)
    checkpoint = _trainer(small_cfg, policies, tmp_path / "run").save_checkpoint()
    straight = torch.randn(8, device="cuda")
    torch.manual_seed(123)
    _trainer(small_cfg, policies, tmp_path / "run").load_checkpoint(checkpoint)
    assert torch.equal(torch.randn(8, device="cuda"), straight)
