"""Every family's cut to fewer layers (``Family.cut_layers``; ``make smoke-real ARGS="--layers N"``) at its exact
published width, for every family in the registry, so a family added tomorrow is covered the day it is registered.

A plain cut to the first N layers broke two families inside transformers: Qwen3.5 at 2 layers kept two linear-
attention layers and no attention layer for the cache to count positions on, and Gemma 4 E2B at 4 layers left its
KV-sharing layers a type with no layer owning keys and values. Here, for every published shape, the smallest cut the
family allows keeps the width and vocabulary, a prefix of the layer pattern, every kind of layer the shape has (each
with the published layer's weights' shapes), and a cache that builds; every depth below it, or between the allowed
ones, is refused in one line naming the smallest. Then the smallest cut of each family's smallest shape runs at
exact width on CPU: greedy ``generate`` with its cache gives the logits of the full forward, and agon's own path
(``Policies``: the family's chat template, sampling, scoring) backpropagates into every LoRA weight.

Left out on purpose: the save and load of the checkpoint (``make smoke-real`` itself, and the families' tests at
tiny widths, ``tests/test_families.py``), and any check of what random weights generate.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, DynamicCache

from agon.core.config import LoraConfig
from agon.families import Family, get_family, known_families

FAMILIES = [name for name in known_families() if get_family(name).shape]
SIZED = [(name, size) for name in FAMILIES for size in get_family(name).shape.sizes]
# a cut over this many parameters takes over 15 s on a 2-core CPU, most of it drawing the random weights
# (Qwen3.5-0.8B's 4 layers: 337M, 16-37 s; Gemma 4 E2B's 10: 1.6B, about a minute and 8 GiB), so its end-to-end run is
# make test-full's
SLOW_PARAMETERS = 250_000_000


def _smallest_size(family: Family) -> str:
    """The published shape of the narrowest width."""
    return min(family.shape.sizes, key=lambda size: family.shape.sizes[size]["hidden_size"])


def _text(family: Family, size: str, **overrides: Any) -> Any:
    return family.shape_config(size, **overrides).get_text_config()


def _meta_model(text: Any) -> Any:
    """The language model agon loads (the text part of a multimodal checkpoint), on the meta device."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(text)


def _layer_kinds(text: Any) -> dict[tuple[str, bool], tuple]:
    """(layer type, reads another layer's keys and values) -> the (name, shape) of the weights of each layer of that
    kind, from the model of ``text`` on the meta device: what a kind of layer is, as the weights see it."""
    layers = _meta_model(text).get_decoder().layers
    types = getattr(text, "layer_types", None) or ["full_attention"] * len(layers)
    modes = getattr(text, "kv_sharing_modes", None) or [None] * len(layers)
    kinds: dict[tuple[str, bool], set[tuple]] = {}
    for layer, kind, mode in zip(layers, types, modes):
        weights = tuple(sorted((name, tuple(p.shape)) for name, p in layer.named_parameters()))
        kinds.setdefault((kind, mode == "reuse"), set()).add(weights)
    assert all(len(shapes) == 1 for shapes in kinds.values()), f"layers of one kind differ: {kinds}"
    return {kind: shapes.pop() for kind, shapes in kinds.items()}


def _cache_counts_positions(text: Any) -> None:
    """transformers' cache of this config builds and counts positions (it needs an attention layer to)."""
    assert DynamicCache(config=text).get_seq_length() == 0


@pytest.mark.parametrize("name,size", SIZED)
def test_the_smallest_cut_keeps_the_width_the_layer_pattern_and_every_kind_of_layer(name, size):
    """Catches a cut that breaks the family's layer structure: the smallest cut's config is the published one but
    for the fields the cut sets (the depth, the layer types, the KV sharing), its layer types are the published
    pattern's first N, its layers are of every kind the published model has (type, and owning or reusing keys and
    values), each with the published weights' shapes, and transformers builds its cache. ``shape_config`` with the
    depth alone (what ``ensure_model``'s callers pass) makes the same cut."""
    family = get_family(name)
    n = family.smallest_cut(size)
    overrides = family.cut_layers(size, n)
    cut, full = _text(family, size, **overrides), _text(family, size)
    assert cut.num_hidden_layers == n <= full.num_hidden_layers
    # the per-layer fields (layer types; Gemma 4's per_layer_config, its full-attention head width) are compared below
    kept = set(overrides) | {"layer_types", "per_layer_config"}
    assert {k: v for k, v in cut.to_dict().items() if k not in kept} == \
        {k: v for k, v in full.to_dict().items() if k not in kept}
    assert list(cut.layer_types) == list(full.layer_types[:n])
    assert _layer_kinds(cut) == _layer_kinds(full)
    _cache_counts_positions(cut)
    assert _text(family, size, num_hidden_layers=n).to_dict() == cut.to_dict()


@pytest.mark.parametrize("name,size", SIZED)
def test_every_allowed_depth_is_valid_and_every_other_is_refused_in_one_line_naming_the_smallest(name, size):
    """Catches a depth the family cannot run let through (the failure comes later, inside transformers, after the
    model is built) or a refusal that does not say what to ask for: every depth from 0 to one past the published
    depth is either allowed, and then builds a config whose cache counts positions with every layer type kept, or
    refused with a one-line ``ValueError`` naming the smallest valid cut, through ``cut_layers`` and through
    ``shape_config``'s depth override alike. The published depth is allowed and its cut is the published config."""
    family = get_family(name)
    depths, smallest = family.cut_depths(size), family.smallest_cut(size)
    full = _text(family, size)
    assert depths == sorted(depths) and depths[0] == smallest and depths[-1] == full.num_hidden_layers
    assert _text(family, size, **family.cut_layers(size, depths[-1])).to_dict() == full.to_dict()
    for n in range(depths[-1] + 2):
        if n in depths:
            text = _text(family, size, **family.cut_layers(size, n))
            assert set(text.layer_types) == set(full.layer_types)
            _cache_counts_positions(text)
            continue
        for refuse in (lambda: family.cut_layers(size, n), lambda: family.shape_config(size, num_hidden_layers=n)):
            with pytest.raises(ValueError, match=f"smallest valid cut is {smallest} ") as err:
                refuse()
            assert "\n" not in str(err.value) and f"cut to {n} layers" in str(err.value)


@pytest.mark.parametrize("model,layers,smallest", [("qwen3_5_0.8b", 2, 4), ("gemma4_e2b", 4, 10)])
def test_smoke_real_refuses_the_reported_cuts_in_one_line_before_building_anything(model, layers, smallest,
                                                                                    monkeypatch, capsys):
    """Catches ``make smoke-real ARGS="--layers N"`` building a model it cannot run (the two cuts reported in 10 s
    failures inside transformers): it exits with argparse's status 2 and one line naming the smallest valid cut,
    and no checkpoint is built."""
    from agon.bench import model_shape
    from agon.bench import smoke_real

    def build(*args, **kwargs):
        raise AssertionError("a checkpoint was built")

    monkeypatch.setattr(model_shape, "ensure_model", build)
    with pytest.raises(SystemExit) as exit_:
        smoke_real.main(["--model", model, "--layers", str(layers)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and f"--layers {layers}" in err and f"smallest valid cut is {smallest} " in err


def _slow(name: str) -> bool:
    """Whether the smallest cut of the family's narrowest shape has over ``SLOW_PARAMETERS`` parameters. A cut that
    does not build is not slow: its test stays in the fast suite, where it fails at once (and collection goes on)."""
    family = get_family(name)
    size = _smallest_size(family)
    try:
        text = _text(family, size, **family.cut_layers(size, family.smallest_cut(size)))
        return sum(p.numel() for p in _meta_model(text).parameters()) > SLOW_PARAMETERS
    except Exception:  # noqa: BLE001 (whatever transformers raises for a broken cut, the test below reports)
        return False


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if _slow(name) else [])
                                  for name in FAMILIES])
def test_the_smallest_cut_at_exact_width_generates_with_its_cache_and_trains_a_lora(name):
    """Catches a cut that builds but does not run: the smallest cut of the family's narrowest shape, at its exact
    width and vocabulary with random weights in float32 on CPU, as the language model agon loads. Greedy ``generate``
    with its cache gives, token by token, the logits of one forward over the whole sequence (each layer kind's
    cache: sliding, linear-attention state, reused keys and values), and agon's path (the family's template,
    ``Policies.sample``, ``token_logps``) backpropagates into every LoRA weight of an adapter on every linear layer."""
    from agon.bench.model_shape import build_tokenizer
    from agon.models.policies import Policies

    family = get_family(name)
    size = _smallest_size(family)
    text = _text(family, size, **family.cut_layers(size, family.smallest_cut(size)))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(text, dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    prompt = torch.randint(0, text.vocab_size, (2, 8))
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        whole = model(input_ids=out.sequences, use_cache=False).logits[:, prompt.size(1) - 1 : -1]
    torch.testing.assert_close(torch.stack(out.logits, 1), whole, atol=1e-3, rtol=1e-3)

    policies = Policies(model, build_tokenizer(family.shape), ["A"],
                        OmegaConf.structured(LoraConfig(rank=4, alpha=8)), family=family)
    policies.perturb("A", 0.05, seed=1)  # lora_B off PEFT's zero init, so lora_A's gradient is not zero too
    prompts = [policies.render("What is 2+3?")] * 2
    completions = policies.sample(prompts, "A", max_new_tokens=4, temperature=1.0)
    batch = policies.batch_tensors(prompts, completions)
    with policies.use_adapter("A"):
        policies.token_logps(batch).sum().backward()
    grads = [p.grad for p in policies.parameters("A")]
    assert len(grads) > 0 and all(g is not None and bool(torch.isfinite(g).all()) and bool(g.any()) for g in grads)
