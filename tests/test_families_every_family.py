"""Every model family's guards, limits and config reads, for every family in the registry (``agon.families``).

Two classes of bug are caught here for every family at once, so a family added tomorrow is covered the day it is
registered:

- a guard or limit of one family tested on one family only: the latent exchange refused where the layers keep more
  than keys and values, each engine refused where it does not serve the family, the context the model has;
- a value read from the top level of a model config where a multimodal checkpoint keeps it in a nested text config
  (Gemma 4's and Qwen3.5's ``text_config``): the context length and the final logit soft-cap, read from the
  checkpoint's own multimodal config, not only from the text-only model agon loads.

The truth each guard is held to comes from the family's published shapes (its layer types, KV sharing, context),
not from the guard's own declaration.
"""

from __future__ import annotations

import pytest
import torch

from agon.training.checks import compose_config, validate
from agon.core.config import ConfigError
from agon.engines import ENGINES
from agon.families import get_family, known_families

FAMILIES = known_families()
SIZED = [(name, size) for name in FAMILIES if get_family(name).shape for size in get_family(name).shape.sizes]


def _text(config):
    return config.get_text_config()


def _only_full_attention(config) -> bool:
    """Every layer full attention over one cache of keys and values: no sliding window, no linear attention, no
    layer reading another's keys and values (what a latent prefix of key/value states can describe)."""
    text = _text(config)
    types = set(getattr(text, "layer_types", None) or ["full_attention"])
    return (types == {"full_attention"} and not getattr(text, "num_kv_shared_layers", 0)
            and not getattr(text, "use_sliding_window", False))


@pytest.mark.parametrize("name", FAMILIES)
def test_the_latent_exchange_is_refused_exactly_for_families_whose_layers_keep_more_than_keys_and_values(name):
    """Catches a family that loses its refusal of ``exchange=latent`` (or one refused without cause): the config
    check refuses the latent exchange for a family iff some published size has a layer that is not plain full
    attention, read from the shape's own config."""
    family = get_family(name)
    assert family.shape is not None, f"{name}: a family without an offline shape has nothing to hold its guards to"
    plain = all(_only_full_attention(family.shape_config(size)) for size in family.shape.sizes)
    cfg = compose_config([f"model.family={name}", "generation.engine=hf", "exchange=latent"])
    if plain:
        validate(cfg)
    else:
        with pytest.raises(ConfigError, match=f"exchange.mode=latent does not serve model.family={name}"):
            validate(cfg)
    validate(compose_config([f"model.family={name}", "generation.engine=hf", "exchange=visible"]))


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_each_engine_is_refused_for_each_family_it_does_not_serve_and_only_those(name, engine):
    """Catches the engine guard applied to one family only: for every (family, engine) pair the config check
    accepts exactly the engines the family serves, naming the key and the family when it refuses."""
    family = get_family(name)
    overrides = [f"model.family={name}", f"generation.engine={engine}", "generation.fallback=null",
                 "generation.vllm.placement=inprocess"]
    cfg = compose_config(overrides)
    if engine in family.engines:
        try:
            validate(cfg)
        except ConfigError as exc:  # refused for something else (vLLM not installed here): not the family guard
            assert f"model.family={name}" not in str(exc), exc
    else:
        with pytest.raises(ConfigError, match=f"generation.engine={engine} does not serve model.family={name}"):
            validate(cfg)


@pytest.mark.parametrize("name,size", SIZED)
def test_the_context_is_the_text_configs_for_the_multimodal_config_too(name, size, tmp_path):
    """Catches the context read from the top level of a model config: a multimodal checkpoint (Gemma 4, Qwen3.5)
    keeps ``max_position_embeddings`` in its ``text_config``, and a top-level read finds none, which turns every
    context check off. Checked on the checkpoint's own (multimodal) config, on its text part, and through
    ``load_tokenizer``, which reads ``config.json`` before any weight loads (the config check's context)."""
    from agon.models.loading import load_tokenizer
    from agon.models.world import build_tokenizer

    family = get_family(name)
    config = family.shape_config(size)
    want = family.shape.sizes[size]["max_position_embeddings"]
    assert family.context_length(config) == want
    assert family.context_length(_text(config)) == want
    config.save_pretrained(tmp_path)
    build_tokenizer().save_pretrained(tmp_path)
    model = compose_config([f"model.family={name}", f"model.path={tmp_path}"]).model
    assert load_tokenizer(model)[1] == want


# family -> text-config overrides of a random model small enough to build in a second, every layer type kept
TINY = {
    "qwen3": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  intermediate_size=64, vocab_size=512),
    "qwen3_5": dict(num_hidden_layers=4, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                    intermediate_size=64, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                    linear_value_head_dim=8, vocab_size=512, pad_token_id=0, eos_token_id=1),
    "gemma4": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                   global_head_dim=16, intermediate_size=64, sliding_window=4, num_kv_shared_layers=0,
                   hidden_size_per_layer_input=4, vocab_size=512, vocab_size_per_layer_input=512,
                   layer_types=["sliding_attention", "full_attention"]),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_the_head_equals_the_multimodal_models_own_logits_soft_cap_included(name):
    """Catches the soft-cap (or any head setting) read from the top level of a multimodal config: on the model as
    the checkpoint holds it (vision and audio towers, ``text_config`` nested), the family's decoder and head give
    the model's own logits. The head's weights are scaled so the logits pass Gemma 4's cap of 30, where a head
    without the cap differs by tens."""
    family = get_family(name)
    assert name in TINY, f"{name}: add the tiny overrides of its text config here"
    size = next(iter(family.shape.sizes))
    torch.manual_seed(0)
    model = family.shape_model(family.shape_config(size, **TINY[name]), torch.float32).eval()
    with torch.no_grad():
        head = model.get_output_embeddings()
        head.weight.mul_(60 / head.weight.abs().max())
        ids = torch.randint(5, 500, (2, 6))
        want = model(input_ids=ids).logits
        decoder, head_fn = family.decoder_and_head(model)
        got = head_fn(decoder(input_ids=ids).last_hidden_state)
    assert float(want.abs().max()) > 5, "premise: logits large enough for a cap to matter"
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    cap = getattr(_text(model.config), "final_logit_softcapping", None)
    if cap:
        assert float(want.abs().max()) <= cap
