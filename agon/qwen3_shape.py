"""Qwen3's shape, offline: a randomly initialised model with Qwen3's exact configuration and a tokenizer that behaves
like Qwen3's, saved with ``save_pretrained`` so the framework loads it through ``model.path=<dir>`` exactly as it
would load a real checkpoint. It is for measuring what depends on the shape alone (memory, step time, sequence
lengths, the id layout the code relies on) on machines that cannot reach a model hub; its outputs are noise.

The tokenizer is a byte-level BPE with Qwen3's pre-tokenizer regex (digits split one by one), 151,643 regular
entries (the 256 byte symbols, merges learned from a small procedural English/maths corpus, then deterministic
synthetic merges of existing pairs to fill the id space) and Qwen3's 26 added tokens at Qwen3's ids. The chat
template is written here; it reproduces what the project uses of Qwen3's (ChatML turns, history assistant turns
cut to the text after their last ``</think>``, the empty think block when ``enable_thinking`` is false).

Left out on purpose: Qwen3's learned merges and weights (not reachable offline), the NFC normalizer (so any
Unicode string round-trips through encode/decode, where Qwen3 composes decomposed characters first), and the
template's tool calls, ``reasoning_content`` and kept reasoning of the turns after the last user message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

# bump when the tokenizer, the template, the corpus or the saved files change, so stale caches are not reused
SHAPE_VERSION = 1
REGULAR_VOCAB = 151_643
_COMMON = dict(vocab_size=151_936, head_dim=128, max_position_embeddings=40_960, rope_theta=1_000_000.0,
               rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151_643, eos_token_id=151_645,
               hidden_act="silu", attention_bias=False, use_sliding_window=False)
SHAPES: dict[str, dict] = {
    "0.6b": dict(_COMMON, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, max_window_layers=28),
    "1.7b": dict(_COMMON, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, max_window_layers=28),
    "4b": dict(_COMMON, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, max_window_layers=36),
}
# (content, special) in id order from 151643; the tool and think tags are added but not special, as in Qwen3, so
# decode(skip_special_tokens=True) keeps them
ADDED_TOKENS: list[tuple[str, bool]] = [(f"<|{t}|>", True) for t in (
    "endoftext im_start im_end object_ref_start object_ref_end box_start box_end quad_start quad_end vision_start "
    "vision_end vision_pad image_pad video_pad").split()] + [("<tool_call>", False), ("</tool_call>", False)] + [
    (f"<|{t}|>", True) for t in "fim_prefix fim_middle fim_suffix fim_pad repo_name file_sep".split()] + [
    (t, False) for t in ("<tool_response>", "</tool_response>", "<think>", "</think>")]
# Qwen3's pre-tokenizer: contractions, letter runs with one leading non-letter, single digits, punctuation runs
PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (  # history assistant turns keep only their answer; `is false` leaves undefined and None alone
    r"{%- for m in messages -%}{%- set content = m['content'] if m['content'] is string else '' -%}"
    r"{%- if m['role'] == 'assistant' and '</think>' in content -%}"
    r"{%- set content = content.split('</think>')[-1].lstrip('\n') -%}{%- endif -%}"
    r"{{- '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' -}}{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
    r"{%- if enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}{%- endif -%}"
)
GENERATION = dict(do_sample=True, temperature=0.6, top_p=0.95, top_k=20, bos_token_id=151_643,
                  eos_token_id=[151_645, 151_643], pad_token_id=151_643)
MARKER = "shape.json"  # written last: its presence marks a complete directory

_WORDS = (
    "the of and to a in is that for it as with be on by this are from at or an which we can so if then not all one "
    "two three four five ten each every some there their its has have was were will would should must may also "
    "when where how what why because since therefore thus hence let find compute show prove given suppose assume "
    "number numbers real roots root sum product value values function functions equation equations solution prime "
    "integer integers positive negative even odd divisible remainder factor factors polynomial degree coefficient "
    "triangle circle square angle side sides area length radius point points line lines probability expected "
    "sequence series limit derivative integral matrix vector set sets graph answer final step reason carefully "
    "first second next last total least greatest minimum maximum distinct possible ways order pairs digits base "
    "problem case cases condition true false only exactly more less than equal greater between both either other "
    "time people students books apples money rate speed distance hours minutes days year work water box boxes "
    "please put your you our within into out about after before over under use using write need same new like "
    "array string strings character characters input output query queries test tests element elements index "
    "operation operations contains print consists separated single space following example note such any most "
    "he she they them his her who been had did does do said made make know think see come get take go good great "
    "world state program important changes result results large small long little old high different group"
).split()
# English-like words built from common morphemes, so the merges include sub-word pieces for unseen words
_MORPHEMES = [p.split() for p in (
    "re un in con com de dis pre pro ex en im per sub inter trans over out up",
    ("form port struct duct tract spect mit press pos vers ject mod nat gen val act cept fer stand cal sign rect "
     "plic mark train test count load point play turn work man hand ord pen tain vid sent"),
    "s ed ing er ers ly tion tions sion ment ments ness able al ous ive ity ize ic ist ance ence ful less ure ate")]
_CODE = ["def {w}({v}):", "    return {v} + {a}", "for {v} in range({a}):", "if {v} == {a}:", "import {w}",
         "{v} = [{a}, {b}]", "print({v})", "self.{w} = {v}", "        {v} += {a}  # {w}", "class {W}:",
         "while {v} < {a}:", "n = int(input())", "x, y = map(int, input().split())", "return {v}[{a}:]"]
_LATEX = [r"\frac{{{a}}}{{{b}}}", r"\boxed{{{a}}}", r"x^{a} + y^{b}", r"\sqrt{{{a}}}", r"{a} \cdot {b}",
          r"\sum_{{i=1}}^{{{a}}} i^{b}", r"\int_0^{a} x^{b} \, dx", r"f(x)=x^{a}-{b}x+1", r"a_{{n+1}} = {a}a_n",
          r"\binom{{{a}}}{{{b}}}", r"x \le {a}", r"y \ge {b}", r"\pi r^{a}", r"\left( {a}, {b} \right)",
          r"\log_{a} {b}", r"{a} \equiv {b} \pmod{{7}}", r"\angle ABC = {a}^\circ", r"\{{1, 2, \dots, {a}\}}"]


def qwen3_config(shape: str, **overrides: Any):
    """``Qwen3Config`` of a published Qwen3 shape (``SHAPES``), with ``overrides`` applied over it."""
    from transformers import Qwen3Config

    return Qwen3Config(**{**SHAPES[shape], **overrides})


def _word(rng: random.Random) -> str:
    if rng.random() < 0.7:
        return rng.choice(_WORDS)
    pre, root, suf = _MORPHEMES
    word = (rng.choice(pre) if rng.random() < 0.4 else "") + rng.choice(root)
    return word + "".join(rng.choices(suf, k=rng.choice([0, 1, 1, 2])))


def _corpus(n: int = 1200, seed: int = 0) -> list[str]:
    """About 300 KB of deterministic English-like prose with numbers and LaTeX, and some Python: the text the merges
    are learned on."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.1:
            out.append("\n".join(rng.choice(_CODE).format(w=rng.choice(_WORDS), W=rng.choice(_WORDS).capitalize(),
                                                          v=rng.choice("abijknxy"), a=rng.randint(0, 99),
                                                          b=rng.randint(0, 9)) for _ in range(rng.randint(3, 10))))
            continue
        parts = []
        for _ in range(rng.randint(2, 5)):
            words = [_word(rng) for _ in range(rng.randint(5, 14))]
            for _ in range(rng.randint(0, 2)):  # inline maths and plain numbers, as in worked solutions
                a, b = rng.randint(0, 120), rng.randint(1, 30)
                item = rng.choice([f"${rng.choice(_LATEX).format(a=a, b=b)}$", f"{a}.{b}", f"({a}, {b})",
                                   str(rng.randint(0, 10 ** rng.randint(1, 6))), f"{a} + {b} = {a + b}"])
                words.insert(rng.randrange(len(words) + 1), item)
            parts.append(" ".join(words).capitalize() + rng.choice([".", ".", ",", "?", ":"]))
        out.append(" ".join(parts) + rng.choice(["\n", "\n\n", " "]))
    return out


def _byte_symbols() -> list[str]:
    """The 256 byte-level symbols in GPT-2/Qwen order: printable Latin-1 bytes as themselves, the rest shifted."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    rest = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(rest)}
    return [table[b] for b in printable + rest]


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def bpe_tables() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The regular vocabulary (151,643 entries) and its merges, in order. Deterministic: the trainer breaks count ties
    by symbol ids, and the synthetic merges come from a seeded RNG. Needs only ``tokenizers``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = _pre_tokenizer()
    learner.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=20_000, min_frequency=2, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    merges = [tuple(m) for m in json.loads(learner.to_str())["model"]["merges"]]
    vocab = {s: i for i, s in enumerate(_byte_symbols())}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    # fill the id space with merges of a pair already in the vocabulary; appending to the merge list in order keeps
    # every rule's parts older than its result, as BPE requires. They rarely fire on real text (ranked last).
    tokens, learned, added = list(vocab), len(vocab), {t for t, _ in ADDED_TOKENS}
    rng = random.Random(0)
    while len(vocab) < REGULAR_VOCAB:
        a, b = tokens[rng.randrange(len(tokens))], tokens[rng.randrange(learned)]
        if len(a + b) > 16 or a + b in vocab or a + b in added:
            continue
        vocab[a + b] = len(vocab)
        tokens.append(a + b)
        merges.append((a, b))
    return vocab, merges


def build_tokenizer():
    """Qwen3-like ``PreTrainedTokenizerFast``: 151,643 byte-level BPE entries, then the added tokens at Qwen3's ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab, merges = bpe_tables()
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    core.pre_tokenizer = _pre_tokenizer()
    core.decoder = decoders.ByteLevel()
    for content, special in ADDED_TOKENS:  # one at a time, so each takes the next id
        core.add_tokens([AddedToken(content, special=special, normalized=False)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=131_072,
        clean_up_tokenization_spaces=False,
        additional_special_tokens=[t for t, _ in ADDED_TOKENS[1:14]],  # Qwen3's list: im_start .. video_pad
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


# ---------------------------------------------------------------------------------------------------------------
# cache


def model_key(shape: str, dtype: str, seed: int, overrides: dict | None = None) -> str:
    """Hash of everything that shapes the saved directory (the corpus's code is covered by ``SHAPE_VERSION``)."""
    tokenizer = [REGULAR_VOCAB, PRETOKENIZE_REGEX, ADDED_TOKENS, CHAT_TEMPLATE, _WORDS, _MORPHEMES, _CODE, _LATEX]
    blob = json.dumps({"v": SHAPE_VERSION, "config": {**SHAPES[shape], **(overrides or {})}, "dtype": dtype,
                       "seed": seed, "tokenizer": tokenizer, "generation": GENERATION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_model(shape: str = "0.6b", dtype: str = "bfloat16", seed: int = 0, log=print,
                 overrides: dict | None = None) -> Path:
    """Directory of a random-init Qwen3 of ``shape`` (config, safetensors weights in ``dtype``, Qwen3's generation
    config, the tokenizer), building it on first use. ``overrides`` change config fields (tests use a tiny shape)."""
    from agon.world import build_once, cache_root  # here: it imports torch, which bpe_tables does not need

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        t0 = time.time()
        tokenizer = build_tokenizer()
        config = qwen3_config(shape, **(overrides or {}))
        torch.manual_seed(seed)
        # constructed directly in the target dtype: a float32 model would double the peak (2.4 GB for 0.6b)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        model.generation_config = GenerationConfig(**GENERATION)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        n = sum(p.numel() for p in model.parameters())
        (tmp / MARKER).write_text(json.dumps({"version": SHAPE_VERSION, "shape": shape, "dtype": dtype, "seed": seed,
                                              "overrides": overrides or {}, "parameters": n}))
        log(f"[qwen3_shape] {n:,} parameters in {dtype}, built in {time.time() - t0:.1f}s")

    final = cache_root() / f"qwen3-{shape}-random-{model_key(shape, dtype, seed, overrides)}"
    return build_once(final, build, MARKER, log, what=f"a random Qwen3-{shape}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.6b")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    t0 = time.time()
    path = ensure_model(args.shape, args.dtype, args.seed, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"[qwen3_shape] ready in {time.time() - t0:.1f}s, peak RSS {peak:.2f} GiB", file=sys.stderr)
    print(path)  # alone on stdout, so scripts can take it: model.path=$(python -m agon.qwen3_shape)


if __name__ == "__main__":
    main()
