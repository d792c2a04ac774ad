"""The ``hf`` engine: transformers' ``generate`` on the trainer's own PEFT model, the active adapter switched per
call (``Policies.sample``). The default and the offline world's engine: nothing to publish, the adapters sampled are
the ones being trained, and the only engine that reads a latent prefix (``exchange=latent``) as a prefilled cache.
"""

from __future__ import annotations

from typing import Sequence

from agon.engines.base import Engine, OnSampled, Sampling, register_engine
from agon.models.latent import Prefixes
from agon.models.tokens import Completion


@register_engine("hf")
class HFEngine(Engine):
    """transformers' ``generate`` on the trainer's model, the active adapter switched per call; reads a latent prefix
    as a prefilled cache (``Policies.sample``)."""

    latent_prefix = True

    def sample(self, prompts: Sequence[str], adapter: str | None, sampling: Sampling,
               on_sampled: OnSampled = None, prefixes: Prefixes | None = None) -> list[Completion]:
        return self.policies.sample(prompts, adapter, max_new_tokens=sampling.max_new_tokens,
                                    temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                    batch_tokens=sampling.batch_tokens, ignore_eos=sampling.ignore_eos,
                                    on_sampled=on_sampled, prefixes=prefixes)

