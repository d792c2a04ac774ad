"""The ``hf_continuous`` engine: transformers' continuous batching (``generate_batch``) on the trainer's model.

A paged KV cache that a finished row hands to a waiting one, so long, uneven completions do not hold a call to its
longest row. Left out on purpose: latent prefixes (its paged cache takes no external key/value states) and the
sampler's log-probs (``generate_batch`` reports none, so no importance-sampling correction applies).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from agon.engines.base import Engine, EngineError, OnSampled, Sampling, register_engine
from agon.models.latent import Prefixes
from agon.models.tokens import Completion


@register_engine("hf_continuous")
class HFContinuousEngine(Engine):
    """transformers' continuous batching (``generate_batch``) on the trainer's model, the active adapter switched per
    call: a paged KV cache that a finished row hands to a waiting one, so a call costs about its total tokens, not
    its rows times the longest row (``generate`` runs every row of a batch until the last one ends). The fallback of
    the paper presets where vLLM is not installed; its sampler reports no log-probs (no correction applies). Its
    paged cache takes no external key/value states: no latent exchange."""

    def sample(self, prompts: Sequence[str], adapter: str | None, sampling: Sampling,
               on_sampled: OnSampled = None, prefixes: Prefixes | None = None) -> list[Completion]:
        from transformers import GenerationConfig

        self._refuse(prefixes)
        p = self.policies
        ids = p.prompt_ids(prompts)
        room = p.room([len(x) for x in ids], sampling.max_new_tokens)
        out = [Completion("", (), truncated=True, context_limited=True)] * len(prompts)
        sampled = sampling.temperature > 0
        for budget in sorted({r for r in room if r > 0}):  # one call per budget: the rows near the context's end
            rows = [i for i, r in enumerate(room) if r == budget]
            config = GenerationConfig(
                do_sample=sampled, max_new_tokens=budget, pad_token_id=p.tokenizer.pad_token_id,
                # -1 is continuous batching's "never stop" (as generate's None)
                eos_token_id=-1 if sampling.ignore_eos else sorted(p.end_ids),
                **(dict(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
                   if sampled else {}))
            # continuous batching sizes its paged cache from free memory, 80-90% of it (107 GiB of an H200 for 64 rows
            # of 1k tokens, measured; 12 GB of a CPU host for 48 rows of the test world): bound it by the pages these
            # rows fill, at most the token budget's (generation_batch_tokens, the KV cache a call may hold), never
            # fewer than the longest row's (rows beyond it wait for a finished row's pages)
            from transformers import ContinuousBatchingConfig

            paging = {"continuous_batching_config": (cb := ContinuousBatchingConfig())}
            pages = [-(-(len(ids[i]) + budget) // cb.page_size) for i in rows]  # each row's, rounded up
            cb.num_blocks = max(max(pages), min(sum(pages), -(-sampling.batch_tokens // cb.page_size)))
            was_training = p.model.training
            p.model.eval()
            try:
                with p.use_adapter(adapter):
                    results = list(p.model.generate_batch([ids[i] for i in rows], generation_config=config,
                                                          max_new_tokens=budget, **paging).values())
            finally:
                p.model.train(was_training)
            failed = [r.error for r in results if r.error is not None]
            if len(results) != len(rows) or failed:
                raise EngineError(f"transformers' continuous batching returned {len(results)} of {len(rows)} "
                                  f"completions ({len(failed)} failed: {failed[:1]})")
            for i, result in zip(rows, results):
                c = p.completion(prompts[i], result.generated_tokens, sampling.ignore_eos)
                out[i] = dataclasses.replace(c, context_limited=budget < sampling.max_new_tokens)
            if on_sampled is not None:
                on_sampled(len(rows))
        if on_sampled is not None and len(prompts) - sum(r > 0 for r in room):
            on_sampled(len(prompts) - sum(r > 0 for r in room))  # the prompts that left no room: done, unsampled
        return out

