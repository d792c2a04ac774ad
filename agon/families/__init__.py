"""What a model family is, in one place: how its checkpoint loads as a text-only causal LM, how its hidden states
become the logits its own forward returns, how it writes its reasoning block and ends its turn, which generation
engines serve it with a LoRA on each adapter, and its published shapes for offline checks.

The core never compares a family's name. ``Policies`` asks the family registered under ``model.family``
(``get_family``) to load the base, to give the output head that scoring runs in chunks, for the tokens that end a
turn, and to put a completion in agon's canonical form, ``<think>reasoning</think>visible text``, which every task's
verifier and recap read (``agon.tasks.text``). ``agon.bench.model_shape`` builds a family's offline checkpoint from the
family's ``Shape``, at fewer layers as the family allows (``cut_layers``: a cut keeps the layer structure
transformers needs, a depth that cannot is refused naming ``smallest_cut``); the config check asks the family whether
the chosen engine serves it.

Adding a family is one module here, ``agon/families/<name>.py``, whose subclass is registered with
``register_family``, and one YAML file in ``conf/model/`` that sets ``family: <name>``; ``get_family`` imports the
module the first time the name is asked for, so no core module changes:

    @register_family
    class Mistral(Family):
        name, label = "mistral", "Mistral"
        think_open, think_close = "[THINK]", "[/THINK]"

Left out on purpose: the vision and audio towers of multimodal checkpoints (agon trains on text; ``load`` keeps
the language model alone where transformers can) and per-family prompt wording (the task's config holds it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

import torch

from agon.core.registry import Registry
from agon.tasks.text import THINK_CLOSE, THINK_OPEN

Head = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Shape:
    """A family's published shapes and tokenizer layout, for building a random-weight checkpoint offline
    (``agon.bench.model_shape``). Each value is taken from the checkpoints' own config and tokenizer files."""

    # size name -> the checkpoint's config.json as keyword arguments of ``config_class`` (text_config nested)
    sizes: dict[str, dict]
    # (content, id, special) of every added token, at its real id; ``special``: decode(skip_special_tokens) drops it
    added_tokens: list[tuple[str, int, bool]]
    # the tokenizer's length (regular entries fill every id the added tokens leave free)
    vocab_size: int
    eos_token: str
    pad_token: str
    bos_token: str | None
    # a chat template that renders what agon uses of the real one the same way
    chat_template: str
    # the checkpoint's generation_config.json
    generation: dict
    # tokens the tokenizer lists as additional special tokens
    extra_special: list[str] = field(default_factory=list)
    # pre-tokenizer split (byte-level BPE on top); None: the Qwen-style default of agon.bench.model_shape
    pretokenize_regex: str | None = None
    model_max_length: int = 131_072


class Family:
    """A model family. Subclasses set the class attributes and override what differs; ``register_family`` adds an
    instance to ``FAMILIES``."""

    # the value of model.family
    name: ClassVar[str]
    # how tables and figures name it
    label: ClassVar[str]
    # the reasoning block as this family's models write it
    think_open: ClassVar[str] = THINK_OPEN
    think_close: ClassVar[str] = THINK_CLOSE
    # tokens besides the tokenizer's end of sequence that end the assistant's turn (those in the vocabulary count)
    end_of_turn: ClassVar[tuple[str, ...]] = ()
    # generation engines that serve this family with a LoRA on each adapter (the rest fail at the config check)
    engines: ClassVar[tuple[str, ...]] = ("hf", "hf_continuous", "vllm")
    # why an engine is missing from ``engines``, for the error message
    engine_notes: ClassVar[dict[str, str]] = {}
    # every layer full attention over one cache of keys and values, so a prefix of key/value states is all a later
    # token reads of earlier ones (exchange=latent, agon.models.latent); None: yes, else why not
    latent_exchange_refused: ClassVar[str | None] = None
    # packages whose kernels this family's layers need on a GPU, else transformers runs a slow PyTorch reference
    # path; the config check refuses a CUDA run without them unless generation.allow_slow (agon.training.preflight)
    fast_kernels: ClassVar[dict[str, str]] = {}
    # extra keyword arguments of vLLM's ``LLM`` for this family (plain values: they travel to the worker)
    vllm_engine_args: ClassVar[dict[str, Any]] = {}
    # what ``model_shape`` builds offline; None: the family has no offline shape
    shape: ClassVar[Shape | None] = None

    # -- loading ---------------------------------------------------------------------------------------------------

    def load(self, source: str, dtype: torch.dtype) -> Any:
        """The checkpoint at ``source`` as a text-only causal LM (``from_pretrained``), weights in ``dtype``."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(source, dtype=dtype)

    def context_length(self, config: Any) -> int | None:
        """Positions the model has (prompt plus completion), from its config (a multimodal one: its text part)."""
        return getattr(config.get_text_config(), "max_position_embeddings", None)

    # -- logits ----------------------------------------------------------------------------------------------------

    def decoder_and_head(self, base: Any) -> tuple[Any, Head]:
        """The decoder stack (final norm included) and a head, hidden [n, H] -> logits [n, V], equal to the logits of
        the model's own forward: the output embedding (tied or not), then the final soft-cap where the config has
        one (Gemma's ``tanh(x / cap) * cap``)."""
        head = base.get_output_embeddings()
        cap = getattr(base.config.get_text_config(), "final_logit_softcapping", None)
        return base.get_decoder(), (lambda h: torch.tanh(head(h) / cap) * cap) if cap else head

    # -- turns -----------------------------------------------------------------------------------------------------

    def end_of_turn_ids(self, tokenizer: Any, generation_config: Any = None) -> set[int]:
        """The tokens that end a completion, the same for every engine: the tokenizer's end of sequence, this
        family's ``end_of_turn`` tokens, and every ``eos_token_id`` of the model's generation config (vLLM stops on
        all of them, so ``generate`` must too)."""
        ends = {tokenizer.eos_token_id}
        for token in self.end_of_turn:
            found = tokenizer.convert_tokens_to_ids(token)
            if isinstance(found, int) and found != tokenizer.unk_token_id:
                ends.add(found)
        configured = getattr(generation_config, "eos_token_id", None)
        listed = configured if isinstance(configured, (list, tuple)) else [] if configured is None else [configured]
        ends |= set(listed)
        return {int(t) for t in ends if t is not None}

    def canonical(self, text: str) -> str:
        """The assistant's turn (what the template opened plus the decoded completion) in agon's form,
        ``<think>reasoning</think>visible``, which the tasks read. The default renames this family's markers."""
        if (self.think_open, self.think_close) == (THINK_OPEN, THINK_CLOSE):
            return text
        return text.replace(self.think_open, THINK_OPEN).replace(self.think_close, THINK_CLOSE)

    # -- offline shape ---------------------------------------------------------------------------------------------

    # what a cut (``cut_layers``) keeps so the family's layers stay valid, for the error that refuses a depth
    cut_rule: ClassVar[str] = "its first layers (all alike)"

    def shape_config(self, size: str, **overrides: Any) -> Any:
        """The config of a published ``size`` (``shape.sizes``) with ``overrides`` on its text part
        (``shape_text``)."""
        raise NotImplementedError(f"model family {self.name!r} has no offline shape")

    def shape_text(self, size: str, overrides: dict[str, Any]) -> dict[str, Any]:
        """The published text config of ``size`` with ``overrides`` on it. A depth override alone is a cut
        (``cut_layers``: the family's layer structure kept, a depth it does not allow refused); overrides that list
        ``layer_types`` themselves bring a layer structure of their own (the tests' tiny models), taken as given."""
        published = self.shape.sizes[size]
        depth = overrides.get("num_hidden_layers", published["num_hidden_layers"])
        if depth == published["num_hidden_layers"] or "layer_types" in overrides:
            return {**published, **overrides}
        return {**published, **self.cut_layers(size, depth), **overrides}

    def cut_depths(self, size: str) -> list[int]:
        """The depths ``cut_layers`` allows for the published ``size``, ascending, the published depth last. The
        default, for a family whose layers are all alike: any."""
        return list(range(1, self.shape.sizes[size]["num_hidden_layers"] + 1))

    def smallest_cut(self, size: str) -> int:
        """The fewest decoder layers a cut of ``size`` keeps (``make smoke-real ARGS="--layers N"``)."""
        return self.cut_depths(size)[0]

    def cut_layers(self, size: str, layers: int) -> dict[str, Any]:
        """Text-config overrides (for ``shape_config``) keeping ``layers`` of the published ``size``'s decoder layers
        at its width and vocabulary, the family's layer structure valid (``cut_structure``). A depth outside
        ``cut_depths`` raises a one-line ``ValueError`` naming the smallest valid one, before anything is built."""
        depths = self.cut_depths(size)
        if layers not in depths:
            raise ValueError(f"{self.label} {size} cannot be cut to {layers} layers; the smallest valid cut is "
                             f"{depths[0]} (valid: {_listing(depths)}): a cut keeps {self.cut_rule}")
        return {"num_hidden_layers": layers, **self.cut_structure(size, layers)}

    def cut_structure(self, size: str, layers: int) -> dict[str, Any]:
        """The text-config fields besides the depth that a cut to an allowed depth sets. The default: the first
        ``layers`` entries of ``layer_types`` where the config lists them (a plain prefix)."""
        types = self.shape.sizes[size].get("layer_types")
        return {"layer_types": list(types[:layers])} if types else {}

    def shape_model(self, config: Any, dtype: torch.dtype) -> Any:
        """A random-weight model of ``config`` as the checkpoint holds it (multimodal where it is)."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def layer_period(types: Sequence[str]) -> int:
    """The length of the shortest block of layer types that ``types`` repeats whole (its own length if none)."""
    n = len(types)
    return next(p for p in range(1, n + 1) if n % p == 0 and all(t == types[i % p] for i, t in enumerate(types)))


def _listing(depths: list[int]) -> str:
    """``1 to 28`` for a run of depths, else ``10, 15, 20, 25, 30 or 35``."""
    if depths == list(range(depths[0], depths[-1] + 1)) and len(depths) > 2:
        return f"{depths[0]} to {depths[-1]}"
    return " or ".join(filter(None, [", ".join(map(str, depths[:-1])), str(depths[-1])]))


FAMILIES: Registry[Family] = Registry("model.family")


def register_family(cls: type[Family]) -> type[Family]:
    FAMILIES.register(cls.name)(cls())
    return cls


def get_family(name: str) -> Family:
    """The family registered under ``name``, importing ``agon.families.<name>`` on first use; a name with no such
    module raises a ``KeyError`` naming ``model.family`` and the families there are."""
    if name not in FAMILIES:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    return FAMILIES.get_or_raise(name)


def known_families() -> list[str]:
    """Every family with a module here (imported, so registered)."""
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        get_family(info.name)
    return sorted(FAMILIES)
