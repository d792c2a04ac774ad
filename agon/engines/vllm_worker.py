"""vLLM with LoRA slots, driven by ``agon.engines.vllm_engine.VLLMEngine`` in the trainer's process or a worker.

This file imports only the standard library at the top and vLLM inside ``VLLMServer``, so it runs as a script in an
environment that has vLLM and nothing of agon's (``make vllm-install`` builds ``.venv-vllm``: on CPU, vLLM's CPU
build pins an older transformers than agon's). As a worker it is started as ``python vllm_worker.py --fd N``, where
N is one end of a socket pair; requests and replies are pickled plain values (lists, ints, floats, strings), so the
two sides need not share a single package. A request may ask for progress: ``("progress", n)`` messages, one per
finished request, come before its reply. ``stream`` is a conversation: ``("finished", [...])`` messages go out as
requests finish, the caller's ``("add", [...])`` and ``("end", None)`` come in while the engine runs, and the reply
comes once the caller has ended and everything has finished. The worker and what it started die with the trainer
(``_die_with_parent``).

Left out on purpose: an HTTP server (TRL's ``trl vllm-serve``). A worker per trainer process keeps the weights
where the trainer publishes them and needs no ports; tensor parallelism inside one worker is vLLM's own setting.
"""

from __future__ import annotations

import functools
import sys
import time
import traceback
from typing import Any, Callable

# vLLM's settings for a CPU run (the caller passes them only there; kept when the environment already sets them):
# the engine in this process (its LoRA calls then return after loading), no automatic core pinning (it made one
# batch swing from 0.8 s to 31 s on 2 cores). On a GPU nothing is forced: vLLM runs its engine core in a process of
# its own, its supported mode, which returns the GPU's memory when the engine shuts down
CPU_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


class VLLMServer:
    """One vLLM engine over the base model with LoRA enabled. Adapters are loaded by integer id and path: vLLM caches
    an adapter by its id, so a changed adapter must come under a new id (and the old one be removed)."""

    def __init__(self, model: str, dtype: str, max_lora_rank: int, max_loras: int, max_model_len: int, seed: int,
                 enforce_eager: bool, gpu_memory_utilization: float, max_num_seqs: int,
                 external_launcher: bool = False, **engine_args: Any):
        import torch
        from vllm import LLM

        # LLM() lowers torch's thread count and reseeds the global RNG; the trainer's sampling must not notice
        threads, rng = torch.get_num_threads(), torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
        extra = {"distributed_executor_backend": "external_launcher"} if external_launcher else {}
        self.llm = LLM(model=model, dtype=dtype, enable_lora=True, max_lora_rank=max_lora_rank, max_loras=max_loras,
                       max_model_len=max_model_len, seed=seed, enforce_eager=enforce_eager,
                       gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
                       logprobs_mode="processed_logprobs", **extra, **engine_args)
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng)
        self.adapters: dict[int, Any] = {}

    def describe(self) -> dict[str, Any]:
        """The versions and platform of this process: vLLM may live in an environment of its own (``.venv-vllm``)."""
        import platform

        import torch
        import vllm
        from vllm.platforms import current_platform

        device = current_platform.device_type
        name = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else platform.processor()
        return {"vllm": vllm.__version__, "vllm_build": "cpu" if current_platform.is_cpu() else device,
                "torch": torch.__version__, "python": platform.python_version(), "device": name or device,
                "transformers": _version("transformers")}

    def add_adapter(self, name: str, lora_id: int, path: str) -> None:
        """Load the adapter at ``path`` under ``lora_id`` now (not at its first request), so errors show here."""
        from vllm.lora.request import LoRARequest

        request = LoRARequest(name, lora_id, path)
        self.llm.llm_engine.add_lora(request)
        self.adapters[lora_id] = request

    def remove_adapter(self, lora_id: int) -> None:
        self.llm.llm_engine.remove_lora(lora_id)
        self.adapters.pop(lora_id, None)

    def loaded(self) -> list[int]:
        return sorted(self.llm.llm_engine.list_loras())

    def generate(self, prompt_ids: list[list[int]], max_tokens: list[int], lora_id: int | None, temperature: float,
                 top_p: float, top_k: int, stop_token_ids: list[int], ignore_eos: bool,
                 progress: Callable[[int], object] | None = None) -> list[tuple[list[int], list[float]]]:
        """(token ids, their log-probs after temperature) per prompt. Every request of one call uses one adapter
        (``None``: the base): vLLM gives an adapter-less request batched beside LoRA requests the last adapter.
        ``progress(n)``: told as each request finishes (through vLLM's own progress bar hook, drawn nowhere)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(max_tokens=n, temperature=temperature, top_p=top_p, top_k=top_k, logprobs=0,
                                 stop_token_ids=[] if ignore_eos else stop_token_ids, ignore_eos=ignore_eos,
                                 detokenize=False, skip_special_tokens=False) for n in max_tokens]
        lora = None if lora_id is None else self.adapters[lora_id]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params,
                                    lora_request=lora, use_tqdm=_reporting_bar(progress) if progress else False)
        out = []
        for request in outputs:
            c = request.outputs[0]
            out.append((list(c.token_ids), [step[t].logprob for t, step in zip(c.token_ids, c.logprobs)]))
        return out


    def stream(self, requests: list[tuple], temperature: float, top_p: float, top_k: int, stop_token_ids: list[int],
               ignore_eos: bool, take: Callable[[bool], list[tuple[str, Any]]],
               give: Callable[[list[tuple[int, list[int], list[float]]]], object]) -> None:
        """Sample ``requests`` and every request the caller adds while they run, each the moment it arrives.

        A request is ``(key, prompt ids, max tokens, lora id or None, seed or None)``. Between engine steps,
        ``take(block)`` returns the caller's messages: ``("add", [requests])`` or ``("end", None)`` (nothing more
        will come once what runs has finished); it blocks only when nothing runs. ``give`` is told each step's
        finished requests as ``(key, token ids, log-probs)``. Requests of several adapters share the engine's
        batches (vLLM's multi-LoRA scheduling); a seed makes what a request draws its own, whatever it is batched
        with."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine

        def add(batch: list[tuple]) -> None:
            for key, ids, max_tokens, lora_id, seed in batch:
                params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                        logprobs=0, stop_token_ids=[] if ignore_eos else stop_token_ids,
                                        ignore_eos=ignore_eos, detokenize=False, skip_special_tokens=False,
                                        seed=seed, output_kind=RequestOutputKind.FINAL_ONLY)
                engine.add_request(f"agon-{key}", TokensPrompt(prompt_token_ids=ids), params,
                                   lora_request=None if lora_id is None else self.adapters[lora_id])

        add(requests)
        running, ended = len(requests), False
        while not (ended and running == 0):
            for kind, batch in take(running == 0):
                if kind == "add":
                    add(batch)
                    running += len(batch)
                elif kind == "end":
                    ended = True
                else:  # the caller closes the engine (it failed while we streamed): no one awaits the rest
                    raise SystemExit(0)
            if running == 0:
                continue
            finished = []
            for output in engine.step():
                if output.finished:
                    c = output.outputs[0]
                    logps = [step[t].logprob for t, step in zip(c.token_ids, c.logprobs)]
                    finished.append((int(output.request_id.split("-")[1]), list(c.token_ids), logps))
            if finished:
                running -= len(finished)
                give(finished)


def _reporting_bar(report: Callable[[int], object]) -> Callable[..., Any]:
    """A progress-bar factory for vLLM's ``use_tqdm`` whose bar draws into a buffer and passes each update on."""
    import io

    from tqdm import tqdm

    class Reporting(tqdm):
        def update(self, n: float | None = 1) -> bool | None:
            report(int(n or 0))
            return super().update(n)

    return functools.partial(Reporting, file=io.StringIO(), mininterval=3600)


def _version(package: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def serve(fd: int) -> None:
    """Answer ``(method, kwargs)`` requests on the socket ``fd`` until it closes: ``("ok", result)`` or
    ``("error", traceback)``. The first request must be ``("init", kwargs of VLLMServer)``."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    server: VLLMServer | None = None
    while True:
        try:
            method, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        if method in ("add", "end"):  # a stream's late messages, after it failed: nothing left to take them
            continue
        try:
            if method == "init":
                t0 = time.time()
                server = VLLMServer(**kwargs)
                result: Any = {"seconds": time.time() - t0, **server.describe()}
            elif method == "stream":  # ("finished", [...]) to the caller as requests finish; its messages between
                result = server.stream(**kwargs, take=functools.partial(_messages, conn),  # type: ignore[union-attr]
                                       give=lambda batch: conn.send(("finished", batch)))
            elif method == "close":
                conn.send(("ok", None))
                return
            else:
                if kwargs.pop("stream_progress", False):  # ("progress", n) messages before the reply
                    kwargs["progress"] = lambda n: conn.send(("progress", n))
                result = getattr(server, method)(**kwargs)
            conn.send(("ok", result))
        except Exception:  # the caller raises it with the worker's traceback
            conn.send(("error", traceback.format_exc()))


def _messages(conn: Any, block: bool) -> list[tuple[str, Any]]:
    """The caller's messages waiting on ``conn`` (at least one when ``block``)."""
    out = [conn.recv()] if block else []
    while conn.poll(0):
        out.append(conn.recv())
    return out


def _die_with_parent(parent: int) -> None:
    """End this worker and every process it started (vLLM's engine core, a process of its own on a GPU) when the
    trainer ends, however it ends: the worker leads a process group of its own (the trainer starts it in a new
    session), and kills that whole group on SIGTERM, which the kernel sends when the trainer dies
    (``PR_SET_PDEATHSIG``), and when a thread that watches the parent sees it gone (a death before the signal was
    set up, or a main thread busy in C code that would run the handler late). A SIGTERM while the trainer lives
    (SLURM's preemption signals every process of the job) is the trainer's to act on: it closes the engine."""
    import os
    import signal
    import threading

    def end(*_: Any) -> None:
        if os.getpgid(0) == os.getpid():  # only a group of our own: never the trainer's
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def terminated(*_: Any) -> None:
        if parent <= 0 or os.getppid() != parent:  # the trainer is gone (the kernel reparents before it signals)
            end()
        print("[worker] SIGTERM while the trainer lives: left to the trainer", file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, terminated)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        end()

    if parent > 0:  # started by agon's engine, which names itself
        threading.Thread(target=watch, daemon=True, name="agon-parent-watch").start()


if __name__ == "__main__":
    _die_with_parent(int(sys.argv[sys.argv.index("--parent") + 1]) if "--parent" in sys.argv else -1)
    serve(int(sys.argv[sys.argv.index("--fd") + 1]))
