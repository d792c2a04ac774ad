"""Qwen3 (0.6B, 1.7B, 4B; the offline world is Qwen3-shaped too): ChatML turns ending in ``<|im_end|>``, reasoning
in ``<think>...</think>``, thinking on by default, and the template writing an empty ``<think>\\n\\n</think>\\n\\n``
into the prompt when ``enable_thinking`` is false. Tied embeddings, no logit soft-cap: the base class's loading and
head are Qwen3's. vLLM serves it with LoRA on every linear layer.

The offline shape: Qwen3's 151,643 regular entries and its 26 added tokens at ids 151,643-151,668 (the tool and
think tags added but not special, so ``decode(skip_special_tokens=True)`` keeps them), the published configs of
``Qwen/Qwen3-{0.6B,1.7B,4B}``, and a chat template reproducing what agon uses of Qwen3's (history assistant turns
cut to the text after their last ``</think>``). Left out: the template's tool calls and ``reasoning_content``.
"""

from __future__ import annotations

from typing import Any

from agon.families import Family, Shape, register_family

_COMMON = dict(vocab_size=151_936, head_dim=128, max_position_embeddings=40_960, rope_theta=1_000_000.0,
               rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151_643, eos_token_id=151_645,
               hidden_act="silu", attention_bias=False, use_sliding_window=False)
_SPECIAL = [f"<|{t}|>" for t in ("endoftext im_start im_end object_ref_start object_ref_end box_start box_end "
                                 "quad_start quad_end vision_start vision_end vision_pad image_pad video_pad").split()]
_ADDED = [(t, True) for t in _SPECIAL] + [("<tool_call>", False), ("</tool_call>", False)] + [
    (f"<|{t}|>", True) for t in "fim_prefix fim_middle fim_suffix fim_pad repo_name file_sep".split()] + [
    (t, False) for t in ("<tool_response>", "</tool_response>", "<think>", "</think>")]
# ChatML turns, history assistant turns keeping only their answer, then the assistant's opening (Qwen3.5 shares it)
CHATML_TURNS = (
    r"{%- for m in messages -%}{%- set content = m['content'] if m['content'] is string else '' -%}"
    r"{%- if m['role'] == 'assistant' and '</think>' in content -%}"
    r"{%- set content = content.split('</think>')[-1].lstrip('\n') -%}{%- endif -%}"
    r"{{- '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' -}}{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
)
# `is false` leaves undefined and None alone: thinking is on unless switched off
CHAT_TEMPLATE = CHATML_TURNS + (
    r"{%- if enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}{%- endif -%}"
)

SHAPE = Shape(
    sizes={
        "0.6b": dict(_COMMON, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                     num_key_value_heads=8, max_window_layers=28),
        "1.7b": dict(_COMMON, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                     num_key_value_heads=8, max_window_layers=28),
        "4b": dict(_COMMON, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                   num_key_value_heads=8, max_window_layers=36),
    },
    added_tokens=[(t, 151_643 + i, special) for i, (t, special) in enumerate(_ADDED)],
    vocab_size=151_669, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
    chat_template=CHAT_TEMPLATE,
    generation=dict(do_sample=True, temperature=0.6, top_p=0.95, top_k=20, bos_token_id=151_643,
                    eos_token_id=[151_645, 151_643], pad_token_id=151_643),
    extra_special=_SPECIAL[1:],  # Qwen3's list: im_start .. video_pad
)


@register_family
class Qwen3(Family):
    name, label = "qwen3", "Qwen3"
    end_of_turn = ("<|im_end|>",)
    shape = SHAPE

    def shape_config(self, size: str, **overrides: Any) -> Any:
        from transformers import Qwen3Config

        return Qwen3Config(**self.shape_text(size, overrides))
