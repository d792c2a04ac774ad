"""Model shapes offline: each family's tokenizer ids and template, the published parameter counts, the cached round
trip (Qwen3's in detail; Qwen3.5's and Gemma 4's ids and templates as their checkpoints have them)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch

from agon.bench import model_shape
from agon.families import get_family

QWEN3 = get_family("qwen3")

TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "<think>\none plus one\n</think>\n\n\\boxed{2}"},
            {"role": "user", "content": "2+2?"}]
HISTORY = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n"
           "<|im_start|>assistant\n\\boxed{2}<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n")


@pytest.fixture(scope="module")
def tok():
    return model_shape.build_tokenizer(QWEN3.shape)  # ~5 s, shared by the module's tests


def _fingerprint(vocab: dict[str, int], merges: list) -> str:
    return hashlib.sha256(json.dumps([sorted(vocab.items()), [list(m) for m in merges]]).encode()).hexdigest()


def test_added_tokens_sit_at_qwen3_ids(tok):
    assert len(tok) == 151_669 and tok.backend_tokenizer.get_vocab_size(with_added_tokens=False) == 151_643
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_pad|>": 151654,
                "<tool_call>": 151657, "</tool_call>": 151658, "<|fim_prefix|>": 151659, "<|file_sep|>": 151664,
                "<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667, "</think>": 151668}
    assert {t: tok.convert_tokens_to_ids(t) for t in expected} == expected
    assert [tok.convert_tokens_to_ids(t) for t, _, _ in QWEN3.shape.added_tokens] == list(range(151643, 151669))
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.bos_token) == ("<|im_end|>", 151645, 151643, None)
    assert tok("hi").input_ids == tok("hi", add_special_tokens=False).input_ids  # nothing added, no bos
    # the byte symbols come first, in GPT-2/Qwen order: printable bytes as themselves, then the rest shifted past 255
    assert tok.convert_ids_to_tokens([0, 1, 187, 188, 220, 255]) == ["!", '"', "ÿ", "Ā", "Ġ", "Ń"]


def test_think_tags_are_added_but_not_special(tok):
    ids = tok.encode("<think>\nx\n</think>\n\ny<|im_end|><|endoftext|>")
    assert ids[0] == 151667 and 151668 in ids and ids[-2:] == [151645, 151643]
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>\n\ny"


@pytest.mark.parametrize("text", ["Let $f(x)=x^3-3x+1$, so \\frac{1}{2} + \\boxed{42}.",
                                  "héllo wörld 日本語 🙂 e\u0301 \t\r\n  tabs\tand  spaces ,. 's",
                                  "def f(n):\n    return n ** 2  # comment\n", "\x00\x7f\u200b\U0010ffff"])
def test_encode_decode_round_trips(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_digits_are_single_tokens_and_text_merges(tok):
    ids = tok.encode("12345 the number")
    assert tok.convert_ids_to_tokens(ids) == ["1", "2", "3", "4", "5", "Ġthe", "Ġnumber"]


def test_template_renders_thinking_on_and_off(tok):
    on = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    off = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    plain = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    none = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=None)
    assert on == plain == none == HISTORY + "<|im_start|>assistant\n"
    assert off == HISTORY + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.apply_chat_template(MESSAGES[1:2], tokenize=False) == "<|im_start|>user\n1+1?<|im_end|>\n"


def test_vocabulary_is_deterministic_across_processes(tok):
    # a fresh process draws fresh hash seeds (Python's and the Rust trainer's), so equal tables mean determinism
    code = ("import hashlib, json; from agon.bench.model_shape import bpe_tables; v, m = bpe_tables(); "
            "print(hashlib.sha256(json.dumps([sorted(v.items()), [list(p) for p in m]]).encode()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    model = json.loads(tok.backend_tokenizer.to_str())["model"]
    assert out.stdout.strip() == _fingerprint(model["vocab"], model["merges"])
    assert {t: i for t, i in tok.get_vocab().items() if i < 151_643} == model["vocab"]


def test_published_parameter_count():
    config = QWEN3.shape_config("0.6b")
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(config)
    # the same count from the shape: tied embedding, per layer q/k/v/o + q/k norms + MLP + two norms, final norm
    d, v, ff, layers, q, kv, hd = 1024, 151_936, 3072, 28, 16, 8, 128
    per_layer = d * q * hd + 2 * d * kv * hd + q * hd * d + 2 * hd + 3 * d * ff + 2 * d
    assert v * d + layers * per_layer + d == 596_049_920
    assert sum(p.numel() for p in model.parameters()) == 596_049_920  # parameters() counts the tied weight once
    assert config.rope_parameters["rope_theta"] == 1e6 and config.max_position_embeddings == 40_960
    for shape, (hidden, layers_, heads) in {"1.7b": (2048, 28, 16), "4b": (2560, 36, 32)}.items():
        c = QWEN3.shape_config(shape)
        assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.vocab_size) == (hidden, layers_, heads,
                                                                                              151_936)


def test_tiny_shape_round_trips_through_the_cache(tmp_path, monkeypatch, tok):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("AGON_CACHE", str(tmp_path))
    path = model_shape.ensure_model(overrides=TINY, log=lambda *_: None)
    assert path.parent == tmp_path and path.name.startswith("qwen3-0.6b-random-")
    assert model_shape.ensure_model(overrides=TINY, log=lambda *_: None) == path  # cached: no second build
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    model = AutoModelForCausalLM.from_pretrained(path)
    loaded = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.dtype == torch.bfloat16
    assert model.config.hidden_size == 64 and model.config.vocab_size == 151_936
    assert model.generation_config.eos_token_id == [151645, 151643] and model.generation_config.top_k == 20
    assert len(loaded) == len(tok) and loaded.get_vocab() == tok.get_vocab()
    assert loaded.chat_template == tok.chat_template == QWEN3.shape.chat_template
    assert loaded.decode(loaded.encode("<think>x</think>"), skip_special_tokens=True) == "<think>x</think>"
    ids = loaded.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape[-1] == 151_936 and torch.isfinite(logits).all()


def test_a_partial_directory_and_a_killed_build_are_replaced(tmp_path, monkeypatch, tok):
    monkeypatch.setenv("AGON_CACHE", str(tmp_path))
    monkeypatch.setattr(model_shape, "build_tokenizer", lambda shape: tok)  # the same tables, not rebuilt
    overrides = {**TINY, "num_hidden_layers": 1}
    stale = tmp_path / f"qwen3-0.6b-random-{model_shape.model_key(QWEN3, '0.6b', 'bfloat16', 0, overrides)}"
    stale.mkdir()
    (stale / "config.json").write_text("{half")  # as a killed build might leave it
    leftover = tmp_path / f".{stale.name}.killed"
    leftover.mkdir()
    path = model_shape.ensure_model(overrides=overrides, log=lambda *_: None)
    assert path == stale and (path / model_shape.MARKER).exists() and not leftover.exists()
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 1


def test_weights_are_seeded(tmp_path, monkeypatch, tok):
    from safetensors.torch import load_file

    monkeypatch.setattr(model_shape, "build_tokenizer", lambda shape: tok)
    weights = []
    for cache, seed in (("a", 0), ("b", 0), ("c", 1)):
        monkeypatch.setenv("AGON_CACHE", str(tmp_path / cache))
        path = model_shape.ensure_model(overrides=TINY, seed=seed, log=lambda *_: None)
        weights.append(load_file(str(path / "model.safetensors")))
    key = "model.layers.0.self_attn.q_proj.weight"
    a, b, c = weights
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a[key], c[key]) and a[key].dtype == torch.bfloat16


# -- the other families ------------------------------------------------------------------------------------------


def test_qwen3_5_tokenizer_ids_and_small_model_template():
    tok = model_shape.build_tokenizer(get_family("qwen3_5").shape)
    ids = {"<|endoftext|>": 248_044, "<|im_start|>": 248_045, "<|im_end|>": 248_046, "<|vision_start|>": 248_053,
           "<|vision_end|>": 248_054, "<|image_pad|>": 248_056, "<|video_pad|>": 248_057, "<think>": 248_068,
           "</think>": 248_069}
    assert {t: tok.convert_tokens_to_ids(t) for t in ids} == ids and len(tok) == 248_070
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    user = [{"role": "user", "content": "Hi"}]
    render = lambda **kw: tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True, **kw)  # noqa
    # the small models think only when asked
    assert render() == render(enable_thinking=False) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" \
        "<think>\n\n</think>\n\n"
    assert render(enable_thinking=True) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_gemma4_tokenizer_ids_and_e2b_template():
    tok = model_shape.build_tokenizer(get_family("gemma4").shape)
    ids = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<|tool_response>": 50, "<|think|>": 98, "<|channel>": 100,
           "<channel|>": 101, "<|turn>": 105, "<turn|>": 106, "<|image>": 255_999, "<|audio>": 256_000,
           "<|image|>": 258_880, "<|video|>": 258_884}
    assert {t: tok.convert_tokens_to_ids(t) for t in ids} == ids and len(tok) == 262_144
    assert tok.convert_ids_to_tokens(107) not in dict.fromkeys(ids)  # regular entries fill the gaps
    assert tok.decode(tok.encode("héllo 12 <|channel>x<channel|>", add_special_tokens=False)) == \
        "héllo 12 <|channel>x<channel|>"
    user = [{"role": "user", "content": "Hi"}]
    render = lambda msgs=user, **kw: tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)  # noqa
    # the renderings of the real E2B/E4B template: nothing added with thinking off, <|think|> in a system turn on
    assert render() == render(enable_thinking=False) == "<bos><|turn>user\nHi<turn|>\n<|turn>model\n"
    assert render(enable_thinking=True) == "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n" \
        "<|turn>model\n"
    history = [*user, {"role": "assistant", "content": "<|channel>thought\nabc<channel|>Hello"},
               {"role": "user", "content": "Q2"}]
    assert render(history) == ("<bos><|turn>user\nHi<turn|>\n<|turn>model\nHello<turn|>\n<|turn>user\nQ2<turn|>\n"
                               "<|turn>model\n")


@pytest.mark.parametrize("family,size,parameters",
                         [("qwen3_5", "0.8b", 752_393_024), ("gemma4", "e2b", 4_628_569_344)])
def test_the_language_models_parameter_counts(family, size, parameters):
    """The text parts of the published shapes: Qwen3.5-0.8B's 0.75B (0.8B with its vision tower) and Gemma 4
    E2B's 4.6B (5.1B with its towers, 2.3B without the per-layer embeddings)."""
    from transformers import AutoModelForCausalLM

    config = get_family(family).shape_config(size).get_text_config()
    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    assert n == pytest.approx(parameters, rel=1e-3)
