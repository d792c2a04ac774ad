"""Gemma 4 (E2B, E4B): turns ``<|turn>role ... <turn|>``, the assistant's role named ``model``, reasoning in a
thought channel ``<|channel>thought\\n...<channel|>``, thinking switched on by ``<|think|>`` at the top of a system
turn (``enable_thinking``; off by default), a final logit soft-cap of 30, tied embeddings, and a multimodal
checkpoint (vision and audio towers beside the language model).

Loading: the language model alone, ``Gemma4ForCausalLM`` over the checkpoint's ``text_config``, its weights read
from ``model.language_model.*`` by ``from_pretrained``'s ``key_mapping``. The towers' weights are skipped at load
time, so they never take CPU or GPU memory and no LoRA is placed on them. transformers maps no prefix itself: a
plain ``Gemma4ForCausalLM.from_pretrained`` of the multimodal checkpoint leaves every weight random, so ``load``
raises if any weight of the language model was not read.

The chat format: the E2B/E4B template writes nothing for a turn with thinking off (the 26B/31B one closes an empty
thought channel in the prompt, which ``Policies`` would keep as the turn's opening). Gemma 4's response format makes
the thought channel optional, so a completion without one is all visible text: ``canonical`` gives it an empty
reasoning block. An opened channel that never closes is a truncated trace and has no visible part, as for Qwen3.

The offline shape: the published ``text_config`` of ``google/gemma-4-E2B-it`` and ``-E4B-it`` (from Google's
conversion script: layer pattern, KV sharing, per-layer inputs, double-wide MLP on E2B), small vision and audio
towers (they are not what is measured), the 262,144-entry vocabulary with Gemma 4's control tokens at their ids, and
a template that renders what agon uses of the E2B/E4B one. A cut to fewer layers (``cut_layers``) keeps whole
repeats of the sliding/full pattern (transformers makes the last layer full attention) and the published share of
them reusing keys and values, at least one repeat owning and one reusing: 10 layers at the fewest on E2B, 12 on E4B.
Left out: tool calls, images and audio in prompts, and SentencePiece's byte fallback (the offline tokenizer is
byte-level BPE).
"""

from __future__ import annotations

from typing import Any

import torch

from agon.families import Family, Shape, layer_period, register_family
from agon.tasks.text import THINK_CLOSE, THINK_OPEN

# the published text configs; the rest (head_dim 256, sliding window 512, soft-cap, RoPE, vocabulary) is common
_TEXT = dict(vocab_size=262_144, vocab_size_per_layer_input=262_144, hidden_size_per_layer_input=256, head_dim=256,
             global_head_dim=512, sliding_window=512, final_logit_softcapping=30.0, max_position_embeddings=131_072,
             hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
             attention_k_eq_v=False,
             pad_token_id=0, eos_token_id=1, bos_token_id=2,
             rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                 "rope_theta": 1_000_000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})
SIZES = {
    "e2b": dict(_TEXT, hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8,
                num_key_value_heads=1, num_kv_shared_layers=20, use_double_wide_mlp=True,
                layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7),
    "e4b": dict(_TEXT, hidden_size=2560, intermediate_size=10240, num_hidden_layers=42, num_attention_heads=8,
                num_key_value_heads=2, num_kv_shared_layers=18, use_double_wide_mlp=False,
                layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 7),
}
# the towers of the offline checkpoint: present, so the text-only load is exercised, but small
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
               head_dim=16)
_AUDIO = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, output_proj_dims=32,
              subsampling_conv_channels=[8, 4])
# (content, id, special): the control tokens at Gemma 4's ids
ADDED = [("<pad>", 0, True), ("<eos>", 1, True), ("<bos>", 2, True), ("<unk>", 3, True),
         ("<|tool>", 46, True), ("<tool|>", 47, True), ("<|tool_call>", 48, True), ("<tool_call|>", 49, True),
         ("<|tool_response>", 50, True), ("<tool_response|>", 51, True), ('<|"|>', 52, True),
         ("<|think|>", 98, True), ("<|channel>", 100, True), ("<channel|>", 101, True),
         ("<|turn>", 105, True), ("<turn|>", 106, True),
         ("<|image>", 255_999, True), ("<|audio>", 256_000, True), ("<|image|>", 258_880, True),
         ("<|audio|>", 258_881, True), ("<image|>", 258_882, True), ("<audio|>", 258_883, True),
         ("<|video|>", 258_884, True)]
# the E2B/E4B template, for what agon renders: one system turn (opened by <|think|> when thinking is on), user and
# model turns with trimmed content, history model turns without their thought channel, then `<|turn>model\n`
CHAT_TEMPLATE = (
    r"{%- set enable_thinking = enable_thinking | default(false) -%}{{- bos_token -}}"
    r"{%- set loop_messages = messages -%}{%- set has_system = messages and messages[0]['role'] == 'system' -%}"
    r"{%- if enable_thinking or has_system -%}{{- '<|turn>system\n' -}}"
    r"{%- if enable_thinking -%}{{- '<|think|>\n' -}}{%- endif -%}"
    r"{%- if has_system -%}{{- messages[0]['content'] | trim -}}{%- set loop_messages = messages[1:] -%}{%- endif -%}"
    r"{{- '<turn|>\n' -}}{%- endif -%}"
    r"{%- for m in loop_messages -%}{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    r"{%- set content = m['content'] if m['content'] is string else '' -%}"
    r"{%- if role == 'model' -%}{%- set ns = namespace(result='') -%}"
    r"{%- for part in content.split('<channel|>') -%}"
    r"{%- set ns.result = ns.result + (part.split('<|channel>')[0] if '<|channel>' in part else part) -%}"
    r"{%- endfor -%}{%- set content = ns.result -%}{%- endif -%}"
    r"{{- '<|turn>' + role + '\n' + content | trim + '<turn|>\n' -}}{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|turn>model\n' -}}{%- endif -%}"
)
SHAPE = Shape(
    sizes=SIZES, added_tokens=ADDED, vocab_size=262_144, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>",
    chat_template=CHAT_TEMPLATE,
    # the model card's sampling; the turn ends on <eos>, <turn|> or <|tool_response>
    generation=dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=64, bos_token_id=2, pad_token_id=0,
                    eos_token_id=[1, 106, 50]),
    extra_special=[t for t, i, _ in ADDED if i > 3],
)
# the thought channel as the model writes it, and its bare form
CHANNEL_OPEN, THOUGHT, CHANNEL_CLOSE = "<|channel>", "<|channel>thought\n", "<channel|>"


@register_family
class Gemma4(Family):
    name, label = "gemma4", "Gemma 4"
    think_open, think_close = CHANNEL_OPEN, CHANNEL_CLOSE
    end_of_turn = ("<turn|>",)
    engines = ("hf", "vllm")
    latent_exchange_refused = "its sliding-window layers and shared key/value layers keep states a plain prefix of " \
                              "keys and values does not describe"
    # vLLM serves the checkpoint as its language model, as agon trains it: the multimodal class would need
    # torchvision and image/audio limits of 0, and the adapters' module names are the text model's
    vllm_engine_args = {"hf_overrides": {"architectures": ["Gemma4ForCausalLM"]}}
    engine_notes = {"hf_continuous": "transformers' continuous batching reads one head_dim for every layer, and "
                                     "Gemma 4's full-attention layers have their own; use hf"}
    shape = SHAPE
    cut_rule = ("whole repeats of its sliding/full pattern (the last layer full attention), at least one owning its "
                "keys and values and one reusing them")

    def load(self, source: str, dtype: torch.dtype) -> Any:
        from transformers import AutoConfig, Gemma4ForCausalLM
        from transformers.utils import logging

        config = AutoConfig.from_pretrained(source)
        if config.model_type != "gemma4":  # a text-only checkpoint loads as it is
            return super().load(source, dtype)
        verbosity = logging.get_verbosity()
        logging.set_verbosity_error()  # its report lists every tower weight as unexpected; missing ones are checked
        try:
            model, info = Gemma4ForCausalLM.from_pretrained(
                source, config=config.get_text_config(), dtype=dtype, output_loading_info=True,
                key_mapping={r"^model\.language_model\.": "model."})
        finally:
            logging.set_verbosity(verbosity)
        missing = [k for k in info["missing_keys"] if k != "lm_head.weight"]  # the head is tied to the embedding
        if missing:
            raise RuntimeError(f"loading the language model of {source} left {len(missing)} weights unread "
                               f"(first: {missing[:3]}): the checkpoint's layout is not Gemma 4's")
        return model

    def canonical(self, text: str) -> str:
        if CHANNEL_OPEN not in text and CHANNEL_CLOSE not in text:
            return THINK_OPEN + THINK_CLOSE + text  # no thought channel: the whole turn is visible
        return text.replace(THOUGHT, THINK_OPEN).replace(CHANNEL_OPEN, THINK_OPEN).replace(CHANNEL_CLOSE, THINK_CLOSE)

    def cut_depths(self, size: str) -> list[int]:
        # whole repeats of the pattern, so the last layer is full attention as transformers requires; two at least
        # where the size shares KV, so a cut keeps both an owning and a reusing layer of each type
        published = SIZES[size]
        period = layer_period(published["layer_types"])
        first = 2 * period if published["num_kv_shared_layers"] else period
        return list(range(first, published["num_hidden_layers"] + 1, period))

    def cut_structure(self, size: str, layers: int) -> dict[str, Any]:
        # transformers' rule (Gemma4TextConfig.kv_sharing_modes): the last num_kv_shared_layers layers reuse the KV
        # of the last earlier layer of their type, so every type must have a layer before them. The reusing layers
        # here are the published share (E2B 4 of 7 repeats, E4B 3 of 7) of whole repeats, at least one, and at
        # least one repeat owns its KV: every type has an owner, and every kind of layer the size has is kept
        # (on E2B the reusing layers' double-wide MLP too)
        published = SIZES[size]
        period = layer_period(published["layer_types"])
        repeats, total = layers // period, published["num_hidden_layers"] // period
        share = round(published["num_kv_shared_layers"] / period * repeats / total)
        shared = min(max(share, 1), repeats - 1) if published["num_kv_shared_layers"] else 0
        return {"layer_types": published["layer_types"][:layers], "num_kv_shared_layers": shared * period}

    def shape_config(self, size: str, **overrides: Any) -> Any:
        from transformers import Gemma4Config

        text = self.shape_text(size, overrides)
        return Gemma4Config(text_config=text, vision_config=_VISION, audio_config=_AUDIO, tie_word_embeddings=True,
                            eos_token_id=[1, 106])

    def shape_model(self, config: Any, dtype: torch.dtype) -> Any:
        from transformers import Gemma4ForConditionalGeneration

        return Gemma4ForConditionalGeneration._from_config(config, dtype=dtype)
