"""A model family's shape, offline: a randomly initialised checkpoint with the family's exact configuration and a
tokenizer that behaves like the family's, saved with ``save_pretrained`` so the framework loads it through
``model.path=<dir>`` exactly as it would load a real checkpoint. It is for measuring what depends on the shape alone
(memory, step time, sequence lengths, the id layout the code relies on) on machines that cannot reach a model hub;
its outputs are noise. What a shape is comes from the family (``agon.families``: ``Family.shape``,
``shape_config``, ``shape_model``); this module builds and caches it.

The tokenizer is a byte-level BPE with Qwen's pre-tokenizer regex (digits split one by one) unless the family gives
its own: merges learned from a small procedural English/maths/code corpus, then deterministic synthetic merges of
existing pairs, filling every id the family's added tokens leave free up to the real vocabulary size. The added
tokens (turn markers, reasoning markers, image and audio placeholders) sit at their real ids, and the chat template
is the family's own rendering of what the project uses of the real one.

Left out on purpose: the real merges and weights (not reachable offline), normalizers (so any Unicode string
round-trips through encode/decode), SentencePiece's byte fallback (Gemma), and the templates' tool calls and images.

    python -m agon.bench.model_shape --model qwen3_0.6b     # prints the directory, for model.path=
    python -m agon.bench.model_shape --model gemma4_e2b --layers 10    # its first 10 of 35 layers, KV sharing kept

``--layers N`` cuts the depth as the family keeps its layers valid (``Family.cut_layers``: Qwen3.5 whole repeats of
its linear/full pattern, Gemma 4 whole sliding/full repeats with KV sharing scaled); a depth the family does not
allow is refused in one line naming the smallest valid one.
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

from agon.families import Family, Shape, get_family, known_families

# bump when the tokenizer builder, the corpus or the saved files change, so stale caches are not reused
SHAPE_VERSION = 3
# Qwen's regular vocabulary and pre-tokenizer: contractions, letter runs with one leading non-letter, single digits,
# punctuation runs
QWEN_REGULAR = 151_643
QWEN_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
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


def _pre_tokenizer(regex: str = QWEN_PRETOKENIZE):
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def bpe_tables(size: int = QWEN_REGULAR,
               added: frozenset[str] = frozenset()) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """``size`` regular entries (token -> rank) and their merges, in order; no entry equals one of ``added``.
    Deterministic: the trainer breaks count ties by symbol ids, and the synthetic merges come from a seeded RNG. The
    first entries do not depend on ``size``. Needs only ``tokenizers``."""
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
    tokens, learned = list(vocab), len(vocab)
    rng = random.Random(0)
    while len(vocab) < size:
        a, b = tokens[rng.randrange(len(tokens))], tokens[rng.randrange(learned)]
        if len(a + b) > 16 or a + b in vocab or a + b in added:
            continue
        vocab[a + b] = len(vocab)
        tokens.append(a + b)
        merges.append((a, b))
    return vocab, merges


def build_tokenizer(shape: Shape):
    """A ``PreTrainedTokenizerFast`` of ``shape``: regular byte-level BPE entries at every id the added tokens leave
    free below ``shape.vocab_size``, the added tokens at their real ids, the family's chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    taken = {i for _, i, _ in shape.added_tokens}
    free = [i for i in range(shape.vocab_size) if i not in taken]
    ranked, merges = bpe_tables(len(free), frozenset(t for t, _, _ in shape.added_tokens))
    vocab = {token: free[rank] for token, rank in ranked.items()}
    # added tokens among the regular ids are entries of the model's vocabulary, as in SentencePiece (Gemma); those
    # after every regular id are added tokens proper, as in Qwen's BPE. Either way add_tokens then keeps their ids
    vocab.update({content: i for content, i, _ in shape.added_tokens if i < len(free)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    core.pre_tokenizer = _pre_tokenizer(shape.pretokenize_regex or QWEN_PRETOKENIZE)
    core.decoder = decoders.ByteLevel()
    for content, i, special in sorted(shape.added_tokens, key=lambda t: t[1]):
        core.add_tokens([AddedToken(content, special=special, normalized=False)])
        if core.token_to_id(content) != i:
            raise ValueError(f"added token {content!r} took id {core.token_to_id(content)}, not its id {i}")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=shape.eos_token, pad_token=shape.pad_token, bos_token=shape.bos_token,
        model_max_length=shape.model_max_length, clean_up_tokenization_spaces=False,
        additional_special_tokens=list(shape.extra_special))
    tok.chat_template = shape.chat_template
    return tok


# ---------------------------------------------------------------------------------------------------------------
# cache


def model_key(family: Family, size: str, dtype: str, seed: int, overrides: dict | None = None) -> str:
    """Hash of everything that shapes the saved directory (the corpus's code is covered by ``SHAPE_VERSION``)."""
    shape = family.shape
    corpus = [QWEN_PRETOKENIZE, _WORDS, _MORPHEMES, _CODE, _LATEX]
    blob = json.dumps({"v": SHAPE_VERSION, "family": family.name, "size": shape.sizes[size],
                       "overrides": overrides or {}, "dtype": dtype, "seed": seed, "corpus": corpus,
                       "shape": repr(shape)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_model(family: str = "qwen3", size: str = "0.6b", dtype: str = "bfloat16", seed: int = 0, log=print,
                 overrides: dict | None = None) -> Path:
    """Directory of a random-init checkpoint of ``family`` at ``size`` (config, safetensors weights in ``dtype``, the
    generation config, the tokenizer), building it on first use. ``overrides`` change fields of the text config
    (tests use tiny widths; the smoke run cuts the depth, ``Family.cut_layers``); a depth the family does not allow
    raises before anything is built."""
    from agon.models.world import build_once, cache_root  # here: it imports torch, which bpe_tables does not need

    fam = get_family(family)
    if fam.shape is None or size not in fam.shape.sizes:
        known = sorted(fam.shape.sizes) if fam.shape else []
        raise KeyError(f"model family {family!r} has no offline shape {size!r}; shapes: {known}")
    config = fam.shape_config(size, **(overrides or {}))

    def build(tmp: Path) -> None:
        import torch
        from transformers import GenerationConfig

        t0 = time.time()
        tokenizer = build_tokenizer(fam.shape)
        torch.manual_seed(seed)
        # constructed directly in the target dtype: a float32 model would double the peak (2.4 GB for Qwen3-0.6B)
        model = fam.shape_model(config, getattr(torch, dtype))
        model.generation_config = GenerationConfig(**fam.shape.generation)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        n = sum(p.numel() for p in model.parameters())
        (tmp / MARKER).write_text(json.dumps({"version": SHAPE_VERSION, "family": family, "size": size,
                                              "dtype": dtype, "seed": seed, "overrides": overrides or {},
                                              "parameters": n}))
        log(f"[model_shape] {family} {size}: {n:,} parameters in {dtype}, built in {time.time() - t0:.1f}s")

    final = cache_root() / f"{family}-{size}-random-{model_key(fam, size, dtype, seed, overrides)}"
    return build_once(final, build, MARKER, log, what=f"a random {fam.label} {size}")


def model_shape_of(model_name: str) -> tuple[str, str]:
    """(family, shape) of a ``conf/model`` option, from its YAML (``family`` and ``shape`` keys)."""
    from agon.training.checks import compose_config

    model = compose_config([f"model={model_name}"]).model
    if not model.shape:
        raise KeyError(f"model={model_name} names no offline shape (model.shape is null)")
    return model.family, model.shape


def layers_help() -> str:
    """``--layers``' help (here and in ``agon.bench.smoke_real``), with every shape's smallest valid cut."""
    smallest = ", ".join(f"{name} {size} {get_family(name).smallest_cut(size)}" for name in known_families()
                         if get_family(name).shape for size in get_family(name).shape.sizes)
    return ("keep only the first N decoder layers, cut as the model's family keeps its layers valid "
            f"(Family.cut_layers: whole layer patterns, full attention and KV sharing kept); smallest N: {smallest}")


def cut_overrides(parser: argparse.ArgumentParser, family: str, size: str, layers: int | None) -> dict | None:
    """The text-config overrides of ``--layers`` (None: the published depth); a depth the family does not allow
    ends the program with argparse's one-line error naming the smallest valid one, before anything is built."""
    if layers is None:
        return None
    try:
        return get_family(family).cut_layers(size, layers)
    except ValueError as exc:
        parser.exit(2, f"{parser.prog}: error: --layers {layers}: {exc}\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3_0.6b", help="a conf/model option with a shape (model.shape)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=None, metavar="N", help=layers_help())
    args = parser.parse_args(argv)
    t0 = time.time()
    family, size = model_shape_of(args.model)
    overrides = cut_overrides(parser, family, size, args.layers)
    path = ensure_model(family, size, args.dtype, args.seed, log=lambda msg: print(msg, file=sys.stderr, flush=True),
                        overrides=overrides)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"[model_shape] ready in {time.time() - t0:.1f}s, peak RSS {peak:.2f} GiB", file=sys.stderr)
    print(path)  # alone on stdout, so scripts can take it: model.path=$(python -m agon.bench.model_shape)


if __name__ == "__main__":
    main()
