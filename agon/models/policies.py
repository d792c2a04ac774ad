"""One frozen base model, LoRA adapters on it, and the three things done with them: switch, sample, score.

``Policies`` owns the PEFT model. Adapters are switched with ``use_adapter(name)``, a context manager that restores
the previous adapter on exit; ``None`` disables every adapter, which is the base model and the free KL reference.
PEFT's ``set_adapter`` turns ``requires_grad`` off for every other adapter; Agon trains two adapters in one step,
so this module keeps every LoRA weight trainable and the base frozen itself, and each adapter has its own optimizer.
The base weights never change: only LoRA parameters are ever given to an optimizer, and every adapter's LoRA weights
are float32 whatever the base's dtype (``agon.models.lora``).

``sample`` renders chat prompts, generates with the KV cache (``model.generate``) and cuts each completion after its
first end-of-turn token. ``token_logps`` recomputes per-token log-probabilities with the same position ids
generation used (left padding counted out), from the decoder's hidden states through ``scoring.selective_logps``,
so no ``[b, T, V]`` tensor is ever built.

Work is bounded by tokens, not rows (``agon.models.tokens``): a generation call holds at most ``batch_tokens``
tokens of prompt plus ``max_new_tokens``, and a row whose prompt leaves less than ``max_new_tokens`` of the model's
context is sampled alone with the room left, and one with no room is not sampled at all; both are marked
``context_limited``.

Under ``exchange=latent`` (``agon.models.latent``) a challenger's rows carry a prefix of token ids whose key/value
states, computed under the drafter's adapter without a graph (``prefix_cache``), precede the prompt: ``sample`` hands
them to ``generate`` as a prefilled cache, ``token_logps`` reads them through a cache that is never extended, and
positions continue across the prefix in both, so sampling and scoring read the same prefix. Budgets count the prefix's
tokens.

``sample`` is the ``hf`` engine; ``agon.engines`` puts vLLM behind the same call and builds its completions with
``completion``. Processes are the trainer's business: every rank holds its own ``Policies`` on its own device
(``load_base(device=...)``). Left out on purpose, each in a module beside this one: loading the base (``loading``),
the LoRA weights' dtype (``lora``), completions and token budgets (``tokens``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import random
import warnings
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from agon.core.scoring import selective_logps
from agon.families import Family, get_family
from agon.models.latent import Prefixes, checkpointing_reads_cache, fixed_cache, left_pad, positions
from agon.models.lora import check_lora_float32, lora_parameters, lora_to_float32
from agon.models.tokens import Completion, Tokens, render_chat, token_batches


def build_policies(cfg: Any, model, tokenizer, task: Any = None) -> "Policies":
    """The run's adapters on ``model``, initialised as ``cfg.init`` says: ``divergent`` gives B's ``lora_B`` a
    seeded Gaussian perturbation (seed ``init.seed + seed``), ``symmetric`` leaves both at PEFT's zero init,
    ``split`` (not the paper's) trains each adapter on its own half of ``task``'s worked solutions
    (``split_init``). Without ``task`` (adapters about to be loaded) ``split`` leaves them at zero."""
    from agon.families import get_family
    from agon.core.methods import get_method

    policies = Policies(model, tokenizer, get_method(cfg.method.name).adapters, cfg.model.lora,
                        cfg.model.gradient_checkpointing, get_family(cfg.model.family))
    if "B" in policies.adapters and cfg.init.mode == "divergent":
        policies.perturb("B", cfg.init.std, seed=cfg.init.seed + cfg.seed)
    if cfg.init.mode == "split" and task is not None:
        split_init(policies, task, cfg)
    return policies


def split_half(problem_id: str, halves: int = 2) -> int:
    """Which half of the training pool a problem is in: a stable hash of its id (the same on every machine)."""
    return zlib.crc32(problem_id.encode()) % halves


def split_init(policies: "Policies", task: Any, cfg: Any) -> dict[str, float]:
    """Each adapter (the k-th of n) trained ``init.steps`` supervised steps (AdamW, ``init.lr``, ``init.batch_size``
    problems each, seeded by ``init.seed + seed``) on the worked solutions of the problems ``split_half`` puts in
    part k of n: the same data distribution, different data, so the adapters start with blind spots of their own.
    Not the paper's init (an ablation for a testbed where A and B otherwise act as one policy). {adapter: last
    loss}."""
    from agon.models.world import supervised_loss

    pool = [p for p in task.train_problems() if task.worked_solution(p) is not None]
    if not pool:
        raise ValueError(f"init=split needs worked solutions, and task {task.cfg.name!r} has none")
    rng = random.Random(cfg.init.seed + cfg.seed)
    losses = {}
    for k, name in enumerate(policies.adapters):
        half = [p for p in pool if split_half(p.id, len(policies.adapters)) == k]
        opt = torch.optim.AdamW(policies.parameters(name), lr=cfg.init.lr)
        with policies.use_adapter(name):  # the model stays in train mode, as Policies keeps it
            for _ in range(cfg.init.steps):
                batch = [half[rng.randrange(len(half))] for _ in range(cfg.init.batch_size)]
                pairs = [(policies.render(task.user_message(p), system=task.cfg.system_prompt,
                                          enable_thinking=cfg.model.enable_thinking),
                          task.worked_solution(p) + policies.tokenizer.eos_token) for p in batch]
                loss = supervised_loss(policies.model, policies.tokenizer, pairs)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses[name] = float(loss)
        policies.mark_updated(name)
    return losses


class Policies:
    """A frozen base with named LoRA adapters (``A``, optionally ``B``) and helpers to sample and score them."""

    def __init__(self, model, tokenizer, adapters: Sequence[str], lora: Any, gradient_checkpointing: bool = False,
                 family: Family | None = None):
        from peft import LoraConfig, get_peft_model

        # how the base's family writes its turns and computes its logits (Qwen3's when not given)
        self.family = family or get_family("qwen3")
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules),
            task_type="CAUSAL_LM",
        )
        self.tokenizer = tokenizer
        tokenizer.padding_side = "left"  # generation appends to the right end of every row
        self.adapters = tuple(adapters)
        with warnings.catch_warnings():
            # PEFT reads transformers' deprecated is_gradient_checkpointing (a FutureWarning on every run that agon
            # cannot act on; PEFT's own fix is pending)
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            self.model = get_peft_model(model, config, adapter_name=self.adapters[0])
        for name in self.adapters[1:]:
            self.model.add_adapter(name, config)
        # get_peft_model upcasts its adapter to float32 over a bfloat16 base, but add_adapter only does from PEFT
        # 0.19 on: without this, adapter B would train in bfloat16 and lose most of its updates to rounding
        lora_to_float32(self.model)
        check_lora_float32(self.model, self.adapters)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.model.enable_input_require_grads()
        self._activate(self.adapters[0])
        # from_pretrained leaves eval mode; gradient checkpointing engages only in train mode (sample() switches)
        self.model.train()
        # the longest sequence the model has positions for (prompt plus completion)
        self.context: int | None = self.family.context_length(self.model.config)
        # a count per adapter of the changes to its weights: an engine holding a copy republishes a changed one
        self.revisions = dict.fromkeys(self.adapters, 0)
        self.end_ids = self.family.end_of_turn_ids(tokenizer, getattr(self.model, "generation_config", None))

    # -- adapters ------------------------------------------------------------------------------------------------

    def parameters(self, adapter: str) -> list[torch.nn.Parameter]:
        """The LoRA weights of one adapter (what its optimizer updates)."""
        return [p for _, p in lora_parameters(self.model, adapter)]

    def lora_state(self, adapter: str) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in lora_parameters(self.model, adapter)}

    def _activate(self, name: str) -> None:
        self.model.set_adapter(name)
        # set_adapter froze every other adapter; both train in one step, so undo that (the base stays frozen)
        for n, p in self.model.named_parameters():
            p.requires_grad_("lora_" in n)

    @property
    def active(self) -> str:
        return self.model.active_adapter

    @contextlib.contextmanager
    def use_adapter(self, name: str | None) -> Iterator[None]:
        """Run the block with adapter ``name`` active (``None``: the base model); restores the previous one."""
        previous = self.active
        try:
            if name is None:
                with self.model.disable_adapter():
                    yield
            else:
                self._activate(name)
                yield
        finally:
            self._activate(previous)

    def mark_updated(self, adapter: str) -> None:
        """Record that ``adapter``'s weights changed (an optimizer step, a load, a perturbation)."""
        self.revisions[adapter] += 1

    def digest(self) -> str:
        """sha256 of every adapter's weights (names and bytes): equal digests, bitwise-equal adapters."""
        h = hashlib.sha256()
        for name in self.adapters:
            for key, value in sorted(self.lora_state(name).items()):
                h.update(key.encode())
                h.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def divergence(self, a: str = "A", b: str = "B") -> float:
        """Sum over LoRA modules of ||dW_a - dW_b||_F / (||dW_a||_F + ||dW_b||_F): 0 identical, 1 unrelated or
        opposed. With dW = s B A (rank r), every norm comes from r x r products (B_a^T B_b and A_a A_b^T), never
        from the [out, in] deltas themselves, so it costs nothing next to a step even at Qwen3's widths."""
        num = den = 0.0
        with torch.no_grad():
            for module in self.model.modules():
                if not (hasattr(module, "lora_A") and a in module.lora_A and b in module.lora_A):
                    continue
                A = {n: module.lora_A[n].weight.double() for n in (a, b)}  # [r, in]
                B = {n: module.lora_B[n].weight.double() * module.scaling[n] for n in (a, b)}  # [out, r]

                def inner(x: str, y: str) -> torch.Tensor:  # <dW_x, dW_y>_F = tr((B_x^T B_y)(A_y A_x^T))
                    return ((B[x].T @ B[y]) * (A[x] @ A[y].T)).sum()

                aa, bb, ab = inner(a, a), inner(b, b), inner(a, b)
                num += float((aa + bb - 2 * ab).clamp(min=0).sqrt())
                den += float(aa.clamp(min=0).sqrt() + bb.clamp(min=0).sqrt())
        return num / den if den > 0 else 0.0

    def perturb(self, adapter: str, std: float, seed: int) -> None:
        """Seeded Gaussian noise on ``adapter``'s ``lora_B`` (PEFT's init leaves it zero, even 'gaussian')."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if "lora_B" in n and n.endswith(f".{adapter}.weight"):
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * std)
        self.mark_updated(adapter)

    def save_adapters(self, directory: Path, names: Sequence[str] | None = None) -> None:
        """Each adapter (or each of ``names``) in ``directory/<name>`` (PEFT's format: ``load_adapter``, vLLM)."""
        for name in names or self.adapters:
            self.model.save_pretrained(str(directory), selected_adapters=[name])
            # PEFT nests non-default adapters under their name and writes the first at the top; normalise
            top = directory / "adapter_model.safetensors"
            if top.exists():
                (directory / name).mkdir(parents=True, exist_ok=True)
                top.replace(directory / name / "adapter_model.safetensors")
                (directory / "adapter_config.json").replace(directory / name / "adapter_config.json")

    def load_adapters(self, directory: Path) -> None:
        """Copy saved LoRA weights into the existing adapters (same names, same shapes)."""
        from safetensors.torch import load_file

        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name in self.adapters:
                saved = load_file(str(directory / name / "adapter_model.safetensors"))
                for key, value in saved.items():
                    target = key.replace(".weight", f".{name}.weight")
                    if target not in params:
                        raise KeyError(f"saved adapter {name} has {key}, which this model lacks")
                    params[target].copy_(value)
                self.mark_updated(name)

    # -- prompts and sampling ------------------------------------------------------------------------------------

    def render(self, user: str, system: str | None = None, enable_thinking: bool = True) -> str:
        return render_chat(self.tokenizer, user, system, enable_thinking)

    def _cut(self, ids: list[int]) -> tuple[tuple[int, ...], bool]:
        for i, t in enumerate(ids):
            if t in self.end_ids:
                return tuple(ids[: i + 1]), False
        # no end of turn: generate pads a row only after its end of turn, so every token here was sampled (a pad
        # token among them included) and counts
        return tuple(ids), True

    @torch.no_grad()
    def sample(
        self,
        prompts: Sequence[str],
        adapter: str | None,
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = 0,
        batch_tokens: int = 262_144,
        ignore_eos: bool = False,
        on_sampled: Callable[[int], object] | None = None,
        prefixes: Prefixes | None = None,
    ) -> list[Completion]:
        """One completion per prompt (repeat prompts for a group), sampled with ``adapter`` active; ``on_sampled(n)``
        hears of each ``generate`` call's ``n`` completions as it returns (a progress bar).

        ``prefixes`` (``exchange=latent``): each prompt is read after its row's prefix, the key/value states of the
        prefix ids under ``prefixes.adapter`` (``agon.models.latent``), the prompt's positions continuing the prefix's.
        Each ``generate`` call holds at most ``batch_tokens`` tokens (rows x (prefix + prompt + max_new_tokens),
        each part padded to its widest), and the prefix counts against the model's context.
        ``ignore_eos`` (as vLLM's): generation does not stop at the end of turn, so every completion is
        ``max_new_tokens`` of work (benchmarks that must do equal work); the turn's text, which the verifier and the
        recap read, still ends at the first end-of-turn token, and the tokens after it are kept and scored.
        """
        lengths = [len(x) for x in self.prompt_ids(prompts)]
        before = [0] * len(prompts) if prefixes is None else [len(x) for x in prefixes.ids]
        room = self.room([a + b for a, b in zip(before, lengths)], max_new_tokens)
        out: list[Completion | None] = [None] * len(prompts)
        fits = [i for i, r in enumerate(room) if r == max_new_tokens]
        was_training = self.model.training
        self.model.eval()

        def prefix(rows: Sequence[int]) -> Prefixes | None:
            return None if prefixes is None else prefixes[rows]

        with self.use_adapter(adapter):
            widths = [(before[i], lengths[i], max_new_tokens) if prefixes is not None else (lengths[i], max_new_tokens)
                      for i in fits]
            for part in token_batches(widths, batch_tokens):
                rows = fits[part]
                for i, c in zip(rows, self._generate([prompts[i] for i in rows], max_new_tokens, temperature,
                                                     top_p, top_k, ignore_eos, prefix(rows))):
                    out[i] = c
                if on_sampled is not None:
                    on_sampled(len(rows))
            for i, r in enumerate(room):  # prompts too close to the end of the context: alone, with the room left
                if r == max_new_tokens:
                    continue
                none = Completion("", (), truncated=True)  # the prompt alone filled the context
                c = self._generate([prompts[i]], r, temperature, top_p, top_k, ignore_eos, prefix([i]))[0] \
                    if r > 0 else none
                out[i] = dataclasses.replace(c, context_limited=True)
                if on_sampled is not None:
                    on_sampled(1)
        self.model.train(was_training)
        return out  # type: ignore[return-value]

    def prompt_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]

    def room(self, prompt_lengths: Sequence[int], max_new_tokens: int) -> list[int]:
        """Tokens each prompt may have sampled: ``max_new_tokens``, or less where the model's context ends first."""
        if self.context is None:
            return [max_new_tokens] * len(prompt_lengths)
        return [min(max_new_tokens, self.context - n) for n in prompt_lengths]

    def completion(self, prompt: str, ids: Sequence[int], ignore_eos: bool = False,
                   logps: Sequence[float] | None = None) -> Completion:
        """The ``Completion`` of the tokens sampled after ``prompt`` (by any engine): cut after the first end of turn
        (all kept under ``ignore_eos``), the text as the verifier reads it."""
        cut, truncated = self._cut(list(ids))
        text = self.tokenizer.decode(cut, skip_special_tokens=False)
        if ignore_eos:
            cut, truncated = tuple(ids), True
        for end in self.end_ids:  # the end-of-turn token is not part of the answer text
            text = text.replace(self.tokenizer.convert_ids_to_tokens(end), "")
        opening = next((o for o in self._turn_openings if prompt.endswith(o)), "")
        return Completion(text=self.family.canonical(opening + text), token_ids=cut, truncated=truncated,
                          logps=None if logps is None else tuple(logps[: len(cut)]))

    @functools.cached_property
    def _turn_openings(self) -> tuple[str, ...]:
        """Openings of the assistant's turn that the chat template writes into the prompt, from the family's
        reasoning opener on (Qwen3 with thinking off closes an empty block there; some templates open one). Longest
        first."""
        found = set()
        for thinking in (True, False):
            user = [{"role": "user", "content": "x"}]
            closed = self.tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=False,
                                                        enable_thinking=thinking)
            suffix = render_chat(self.tokenizer, "x", None, thinking)[len(closed):]
            if self.family.think_open in suffix:
                found.add(suffix[suffix.index(self.family.think_open):])
        return tuple(sorted(found, key=len, reverse=True))

    def _generate(self, prompts: list[str], max_new_tokens: int, temperature: float, top_p: float,
                  top_k: int, ignore_eos: bool = False, prefixes: Prefixes | None = None) -> list[Completion]:
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        if prefixes is not None and not prefixes.empty:
            # generate takes the whole sequence, prefix included, and runs only what its cache does not hold: the
            # prompt, under the active adapter; positions come from the whole mask, so the prompt continues at P
            s_ids, s_mask = left_pad(prefixes.ids, self.tokenizer.pad_token_id)
            enc = {"input_ids": torch.cat([s_ids, enc["input_ids"]], 1),
                   "attention_mask": torch.cat([s_mask, enc["attention_mask"]], 1),
                   self._cache_kwarg: self.prefix_cache(s_ids, s_mask, prefixes)}
        enc = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in enc.items()}
        # temperature 0 is greedy decoding (vLLM's convention); top_k 0 disables top-k (None would mean 50)
        how = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k) if temperature > 0 else \
            dict(do_sample=False)
        gen = self.model.generate(
            **enc,
            **how,
            max_new_tokens=max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            # None: no stopping criterion on the end of turn (sampling itself is unchanged)
            eos_token_id=None if ignore_eos else sorted(self.end_ids),
        )
        return [self.completion(prompt, row, ignore_eos)
                for prompt, row in zip(prompts, gen[:, enc["input_ids"].shape[1]:].tolist())]

    # -- the latent prefix (exchange=latent) ---------------------------------------------------------------------

    @functools.cached_property
    def _cache_kwarg(self) -> str:
        """What this transformers calls the cache argument of a forward: ``cache`` (5.x), ``past_key_values``
        before."""
        import inspect

        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"

    @functools.cached_property
    def think_close_ids(self) -> tuple[int, ...]:
        """The family's end of the reasoning block (``</think>``) as this tokenizer writes it (one token for Qwen3's
        vocabulary): where the ``trace`` span ends."""
        return tuple(self.prompt_ids([self.family.think_close])[0])

    @contextlib.contextmanager
    def adapter_weights(self, adapter: str | None, state: dict[str, torch.Tensor] | None) -> Iterator[None]:
        """Run the block with ``adapter``'s LoRA weights replaced by ``state`` (``lora_state``'s names), restored on
        exit; nothing when either is None. Without a graph only: a pass that trains must see the live weights."""
        if adapter is None or state is None:
            yield
            return
        params = dict(lora_parameters(self.model, adapter))
        live = {n: params[n].data for n in state}
        try:
            for n, value in state.items():
                params[n].data = value.to(params[n].device)
            yield
        finally:
            for n, value in live.items():
                params[n].data = value

    @torch.no_grad()
    def prefix_cache(self, ids: torch.Tensor, mask: torch.Tensor, prefixes: Prefixes, fixed: bool = False) -> Any:
        """The key/value states of left-padded prefix rows (ids and mask [b, S]) under ``prefixes.adapter`` (with
        ``prefixes.weights`` when given), each row's real tokens at positions 0..len-1: a transformers cache that
        ``generate`` extends, or with ``fixed`` one that every pass reads unchanged
        (``agon.models.latent.fixed_cache``). Computed without a graph and in eval mode (no LoRA dropout): a constant
        of the challenger's update, the same at sampling and at scoring."""
        decoder, _ = self._decoder_and_head()
        was_training = self.model.training
        self.model.eval()
        try:
            with self.use_adapter(prefixes.adapter), self.adapter_weights(prefixes.adapter, prefixes.weights):
                out = decoder(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                              position_ids=positions(mask).to(self.device), use_cache=True)
        finally:
            self.model.train(was_training)
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        return fixed_cache(cache) if fixed else cache

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- scoring -------------------------------------------------------------------------------------------------

    def batch_tensors(self, prompts: Sequence[str], completions: Sequence[Completion],
                      prefixes: Sequence[Sequence[int]] | None = None) -> Tokens:
        """Left-padded prompts and right-padded completions as tensors: ids and masks [B, P] and [B, T]; with
        ``prefixes`` (each row's latent prefix ids) also those, left-padded, [B, S]."""
        enc = self.tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
        width = max(1, max(c.n_tokens for c in completions))
        ids = torch.full((len(completions), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(completions), width), dtype=torch.long)
        for i, c in enumerate(completions):
            ids[i, : c.n_tokens] = torch.tensor(c.token_ids, dtype=torch.long)
            mask[i, : c.n_tokens] = 1
        if prefixes is None:
            return Tokens(enc["input_ids"], enc["attention_mask"], ids, mask)
        return Tokens(enc["input_ids"], enc["attention_mask"], ids, mask,
                      *left_pad(prefixes, self.tokenizer.pad_token_id))

    def _decoder_and_head(self):
        """The base's decoder stack (final norm included) and its output head as the family computes its logits, run
        apart so that the head sees a chunk of tokens at a time. LoRA layers inside the decoder still apply, as does
        ``disable_adapter``."""
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return self.family.decoder_and_head(base)

    def token_logps(self, batch: Tokens, rows: slice | None = None, temperature: float = 1.0,
                    chunk_tokens: int = 512, top_k: int = 0, top_p: float = 1.0,
                    prefixes: Prefixes | None = None) -> torch.Tensor:
        """Log-probabilities of the completion tokens under the active adapter, [b, T] for the selected rows (0 on
        padding), from logits divided by the sampling temperature (as TRL does), so they are the sampler's
        probabilities. The selected rows are cut to their own widest prefix, prompt and completion first, so a
        micro-batch of short completions pays for its own length, and a selection left with no padding (one row, or
        rows of equal lengths) runs without an attention mask; the output head sees ``chunk_tokens`` tokens at a
        time. When ``batch`` has prefixes (``exchange=latent``), ``prefixes`` says whose they are (its adapter and
        weights; its ids are unused, the batch's are read): their key/value states are computed first, without a
        graph (``prefix_cache``), and the prompt and completion read them with positions continuing theirs."""
        hidden, c_ids, scored = self._completion_states(batch, rows, prefixes)
        values = selective_logps(hidden[scored], c_ids[scored], self._decoder_and_head()[1], temperature,
                                 chunk_tokens, top_k, top_p)
        out = torch.zeros(scored.shape, dtype=values.dtype, device=self.device).masked_scatter(scored, values)
        return torch.nn.functional.pad(out, (0, batch.completion_ids.size(1) - out.size(1)))

    def completion_logits(self, batch: Tokens, rows: slice | None = None,
                          prefixes: Prefixes | None = None) -> torch.Tensor:
        """[b, width, V] logits at the positions that predict each completion token (width: the selection's widest
        completion), as ``token_logps`` computes them before the temperature. Builds the vocabulary-wide tensor:
        for checks on small batches, never in training."""
        hidden, _, _ = self._completion_states(batch, rows, prefixes)
        return self._decoder_and_head()[1](hidden)

    def _completion_states(self, batch: Tokens, rows: slice | None,
                           prefixes: Prefixes | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(hidden [b, width, H] that predict the completion tokens, completion ids [b, width], scored [b, width]
        bool), on the model's device, for the selected rows cut to their own widths."""
        part = batch[rows or slice(None)]
        p_ids, p_mask, c_ids, c_mask = part.prompt_ids, part.prompt_mask, part.completion_ids, part.completion_mask
        first = int(p_mask.any(0).int().argmax())  # columns before it are left padding in every row
        width = max(1, int(c_mask.sum(1).max()))
        p_ids, p_mask, c_ids, c_mask = p_ids[:, first:], p_mask[:, first:], c_ids[:, :width], c_mask[:, :width]
        s_ids, s_mask = part.prefix_ids, part.prefix_mask
        if s_mask is not None and s_mask.any():
            if prefixes is None:
                raise ValueError("these rows have latent prefixes: say whose they are (prefixes=Prefixes(adapter))")
            s_first = int(s_mask.any(0).int().argmax())
            s_ids, s_mask = s_ids[:, s_first:], s_mask[:, s_first:]
        else:
            s_ids = s_mask = None  # no prefix in any selected row: the plain pass
        ids = torch.cat([p_ids, c_ids], dim=1).to(self.device)
        attn = torch.cat([p_mask, c_mask] if s_mask is None else [s_mask, p_mask, c_mask], dim=1)
        # generation numbers positions from the first real token; do the same so the ratio starts at exactly 1
        # (after a prefix of P tokens the prompt's first token is at P, as when the two are written out as one)
        position_ids = positions(attn)[:, attn.size(1) - ids.size(1):].to(self.device)
        # nothing padded (a solo row of length_batches): no mask at all, so attention is plain causal and SDPA can
        # take its flash path. transformers 5 drops an all-ones mask itself, but only after reading it back from the
        # device; the check here is on the CPU copy
        mask = None if bool(attn.all()) else attn.to(self.device)
        decoder, _ = self._decoder_and_head()
        if s_mask is None:
            # no KV cache: scoring is one pass, and a cache of the whole sequence would only cost memory
            hidden = decoder(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                             use_cache=False).last_hidden_state
        else:
            cache = self.prefix_cache(s_ids, s_mask, prefixes, fixed=True)  # type: ignore[arg-type]
            with checkpointing_reads_cache(decoder):
                hidden = decoder(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False,
                                 **{self._cache_kwarg: cache}).last_hidden_state
        hidden = hidden[:, p_ids.size(1) - 1 : -1]  # [b, width, H]: the states that predict the completion tokens
        return hidden, c_ids.to(self.device), c_mask.bool().to(self.device)
