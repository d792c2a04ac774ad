"""The interface every sampling engine implements, and the registry ``generation.engine`` names one from.

An engine answers one call, ``sample(prompts, adapter, sampling) -> [Completion]``: every prompt sampled once with
``adapter`` (``None``: the base), each completion with its token ids and, where the engine gives them, the sampled
tokens' log-probabilities after temperature. ``Sampling`` is what a call asks for; ``EngineError`` is what an engine
raises when it cannot start or answer. The engines themselves live one to a module beside this one and register
here; ``agon.engines`` picks one for a run. Left out on purpose: anything one engine needs and another does not.
"""

from __future__ import annotations

from dataclasses import dataclass
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


class Engine:
    """Samples completions of the adapters of ``policies``; ``close`` frees what it holds."""

    # reads a latent prefix of key/value states before each prompt (exchange=latent, agon.models.latent); the config
    # check refuses exchange=latent with an engine that does not
    latent_prefix: ClassVar[bool] = False

    def __init__(self, policies: Policies, cfg: Any = None, ranks: Ranks = Ranks(), log: Callable = print):
        self.policies = policies

    def sample(self, prompts: Sequence[str], adapter: str | None, sampling: Sampling,
               on_sampled: OnSampled = None, prefixes: Prefixes | None = None) -> list[Completion]:
        """One completion per prompt; ``on_sampled(n)`` as the engine's own batches of ``n`` return (all of them
        together, for an engine that returns them at once). ``prefixes``: each prompt read after its row's latent
        prefix (``latent_prefix`` engines only)."""
        raise NotImplementedError

    def _refuse(self, prefixes: Prefixes | None) -> None:
        """An ``EngineError`` when there is a prefix to read and this engine cannot read one."""
        if prefixes is not None and not prefixes.empty and not self.latent_prefix:
            name = next((k for k, v in ENGINES.items() if v is type(self)), type(self).__name__)
            raise EngineError(f"generation.engine={name} takes no external key/value states, so it cannot play "
                              f"exchange.mode=latent; sample with generation.engine=hf")

    def close(self) -> None:
        pass


ENGINES: Registry[type[Engine]] = Registry("generation.engine")
register_engine = ENGINES.register
