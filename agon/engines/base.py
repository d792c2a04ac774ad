"""The interface every sampling engine implements, and the registry ``generation.engine`` names one from.

An engine answers one call, ``sample(prompts, adapter, sampling) -> [Completion]``: every prompt sampled once with
``adapter`` (``None``: the base), each completion with its token ids and, where the engine gives them, the sampled
tokens' log-probabilities after temperature. ``Sampling`` is what a call asks for; ``EngineError`` is what an engine
raises when it cannot start or answer. The engines themselves live one to a module beside this one and register
here; ``agon.engines`` picks one for a run.

Rounds of the game are played through ``stream(requests, sampling, then)``: ``Request``s of any adapters, each with
its own seed, and ``then``, told of finished requests, answering with the requests they lead to (a draft's
challenge). The default here plays waves, every request of a wave before the next (two stages, the ``hf`` engines);
an engine that batches continuously (``streams``: vLLM) submits each follow-up the moment its request finishes, so
the challenger's tail overlaps the drafter's. Left out on purpose: anything one engine needs and another does not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Sequence

from agon.core.distributed import Ranks
from agon.core.registry import Registry
from agon.models.latent import Prefixes
from agon.models.policies import Policies
from agon.models.tokens import Completion


class EngineError(RuntimeError):
    """The engine cannot start or answer (vLLM missing, a worker that died, an adapter vLLM refused)."""


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    # 0 is greedy decoding
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    # most tokens one generate call holds: rows x (prompt + max_new_tokens) (hf; vLLM schedules its own batches)
    batch_tokens: int = 262_144
    # do not stop at the end of turn: every completion runs to max_new_tokens (benchmarks that must do equal work);
    # the text the verifier and the recap read still ends at the first end of turn
    ignore_eos: bool = False

    @classmethod
    def from_config(cls, node: Any) -> "Sampling":
        """From a config node with max_new_tokens, temperature, top_p, top_k and generation_batch_tokens
        (``trainer`` or ``eval``)."""
        return cls(node.max_new_tokens, node.temperature, node.top_p, node.top_k, node.generation_batch_tokens)


# told the number of completions each time some are sampled (a progress bar's update)
OnSampled = Callable[[int], object] | None


@dataclass(frozen=True)
class Request:
    """One completion to sample: its prompt, the adapter that writes it (``None``: the base), and its own seed, so
    that what it draws does not depend on what shared its batch or on where a relaunch resumed (engines with
    ``seeded`` requests; the others draw from their own stream)."""

    prompt: str
    adapter: str | None
    seed: int | None = None
    # its own budget of new tokens, at most the call's ``Sampling.max_new_tokens`` (None: that budget)
    max_new_tokens: int | None = None


# told the finished requests, as (index, completion) in index order; returns the requests they lead to, which take the
# next indices (a draft's challenge)
Then = Callable[[list[tuple[int, Completion]]], Sequence[Request]]


class Engine:
    """Samples completions of the adapters of ``policies``; ``close`` frees what it holds."""

    # reads a latent prefix of key/value states before each prompt (exchange=latent, agon.models.latent); the config
    # check refuses exchange=latent with an engine that does not
    latent_prefix: ClassVar[bool] = False
    # submits a follow-up the moment the request it follows finishes, into the call that is running (``stream``)
    streams: ClassVar[bool] = False
    # a request's seed decides what it draws (``Request.seed``)
    seeded: ClassVar[bool] = False

    def __init__(self, policies: Policies, cfg: Any = None, ranks: Ranks = Ranks(), log: Callable = print):
        self.policies = policies

    def sample(self, prompts: Sequence[str], adapter: str | None, sampling: Sampling,
               on_sampled: OnSampled = None, prefixes: Prefixes | None = None) -> list[Completion]:
        """One completion per prompt; ``on_sampled(n)`` as the engine's own batches of ``n`` return (all of them
        together, for an engine that returns them at once). ``prefixes``: each prompt read after its row's latent
        prefix (``latent_prefix`` engines only)."""
        raise NotImplementedError

    def generate(self, requests: Sequence[Request], sampling: Sampling, on_sampled: OnSampled = None
                 ) -> list[Completion]:
        """One completion per request, in order. This default makes one ``sample`` call per adapter and budget, in
        the order they first appear (an engine that batches several adapters together overrides it)."""
        out: list[Completion | None] = [None] * len(requests)
        groups: dict[tuple[str | None, int | None], list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.adapter, r.max_new_tokens), []).append(i)
        for (adapter, budget), rows in groups.items():
            call = sampling if budget is None else \
                replace(sampling, max_new_tokens=min(budget, sampling.max_new_tokens))
            for i, c in zip(rows, self.sample([requests[i].prompt for i in rows], adapter, call, on_sampled)):
                out[i] = c
        return out  # type: ignore[return-value]

    def stream(self, requests: Sequence[Request], sampling: Sampling, then: Then | None = None,
               on_sampled: OnSampled = None) -> list[Completion]:
        """Every request and every request ``then`` leads to, sampled; completions in index order (``requests``
        first, then each follow-up in the order ``then`` returned it). This default plays waves: every request of a
        wave in one ``generate``, ``then`` told of all of them at once, its answers the next wave."""
        done: list[Completion] = []
        wave = list(requests)
        while wave:
            start = len(done)
            done.extend(self.generate(wave, sampling, on_sampled))
            wave = list(then(list(enumerate(done[start:], start)))) if then is not None else []
        return done

    def _refuse(self, prefixes: Prefixes | None) -> None:
        """An ``EngineError`` when there is a prefix to read and this engine cannot read one."""
        if prefixes is not None and not prefixes.empty and not self.latent_prefix:
            name = next((k for k, v in ENGINES.items() if v is type(self)), type(self).__name__)
            raise EngineError(f"generation.engine={name} takes no external key/value states, so it cannot play "
                              f"exchange.mode=latent; sample with generation.engine=hf")

    def describe(self) -> dict[str, Any]:
        """What samples the run, for its ``summary.json``: the engine's name, and for an engine in another process
        the versions and platform that process runs (not those of the trainer's environment)."""
        return {"name": next((k for k, v in ENGINES.items() if v is type(self)), type(self).__name__)}

    def keep_log(self, path: Any) -> None:
        """Where a log of the engine's own (vLLM's worker: its KV capacity, its compile and graph times) is kept
        when it closes; engines without one keep nothing."""

    def close(self) -> None:
        pass


ENGINES: Registry[type[Engine]] = Registry("generation.engine")
register_engine = ENGINES.register
