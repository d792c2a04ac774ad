"""The model's context under ``exchange=latent``: a challenger's prompt is read after its latent prefix (the
drafter's key/value states), so the prefix's tokens take positions of the context as the prompt's do
(``Policies.sample``; ``agon.models.latent``).

A room computed from the prompt alone lets a challenger with a long prefix sample past the model's last position:
no error on a model with rotary positions, only positions it was never trained on. Here the context is short and
the prefixes long, so prompt plus budget fits and prefix plus prompt plus budget does not.
"""

from __future__ import annotations

from agon.models.latent import Prefixes
from agon.models.world import build_tokenizer
from tests.test_scoring import _policies


def test_a_long_prefix_takes_its_positions_from_the_challengers_room():
    """Catches a context or token budget computed without the latent prefix: with a context of 64, a prompt of
    under 20 tokens and 24 new tokens fit alone; after a 40-token prefix only the room left is sampled (flagged
    ``context_limited``), after a 4-token prefix the whole budget, and after a prefix that fills the context
    nothing."""
    context, new = 64, 24
    policies = _policies(vocab=len(build_tokenizer()), max_positions=context)
    assert policies.context == context
    prompt = policies.render("1+2+3")
    n = len(policies.prompt_ids([prompt])[0])
    assert n + new <= context - 4, f"premise: the prompt and its budget fit the context without a prefix ({n})"
    short, long, full = (4, 40, context - n + 1)
    ids = tuple(tuple(range(10, 10 + k)) for k in (short, long, full))
    out = policies.sample([prompt] * 3, "B", max_new_tokens=new, temperature=1.0, ignore_eos=True,
                          prefixes=Prefixes("A", ids))
    assert not out[0].context_limited and out[0].n_tokens == new
    assert out[1].context_limited and out[1].n_tokens == context - long - n
    assert out[2].context_limited and out[2].n_tokens == 0
