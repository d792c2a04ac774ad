"""One frozen base model, LoRA adapters on it, and the three things done with them: switch, sample, score.

``Policies`` owns the PEFT model. Adapters are switched with ``use_adapter(name)``, a context manager that restores
the previous adapter on exit; ``None`` disables every adapter, which is the base model and the free KL reference.
PEFT's ``set_adapter`` turns ``requires_grad`` off for every other adapter; Agon trains two adapters in one step,
so this module keeps every LoRA weight trainable and the base frozen itself, and each adapter has its own optimizer.
The base weights never change: only LoRA parameters are ever given to an optimizer.

``sample`` renders chat prompts, generates with the KV cache (``model.generate``) in batches, and cuts each
completion after its first end-of-turn token. ``token_logps`` recomputes per-token log-probabilities with the same
position ids generation used (left padding counted out).

Left out on purpose: vLLM and multi-process sharding (``accelerate``); the same interface is the place to add them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """A model that is neither on the hub (reachable) nor in a local directory."""


@dataclass(frozen=True)
class Completion:
    text: str
    # completion token ids, up to and including the end-of-turn token when one was produced
    token_ids: tuple[int, ...]
    # True when generation hit max_new_tokens before the end-of-turn token
    truncated: bool

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


def load_base(model_cfg: Any, task_cfg: Any = None, log=print):
    """(model, tokenizer) from the offline world (``name: tiny``), a local path, or the hub."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model_cfg.name == "tiny" and not model_cfg.path:
        from agon.world import ensure_world

        source = str(ensure_world(model_cfg, task_cfg, log=log))
    else:
        source = model_cfg.path or model_cfg.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[model_cfg.dtype])
    except OSError as exc:
        raise ModelLoadError(
            f"could not load model {source!r}: not reachable on the hub and not in the local cache ({exc}). "
            f"Download it where there is network (e.g. `hf download {model_cfg.name} --local-dir DIR`) and pass "
            f"model.path=DIR."
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer


def adapter_names(method: str) -> list[str]:
    """Agon trains two adapters; every other method one (moa's stays untouched: the base)."""
    return ["A", "B"] if method == "agon" else ["A"]


def build_policies(cfg: Any, model, tokenizer) -> "Policies":
    """The run's adapters on ``model``, initialised as ``cfg.init`` says: ``divergent`` gives B's ``lora_B`` a
    seeded Gaussian perturbation (seed ``init.seed + seed``), ``symmetric`` leaves both at PEFT's zero init."""
    policies = Policies(model, tokenizer, adapter_names(cfg.method.name), cfg.model.lora,
                        cfg.model.gradient_checkpointing)
    if "B" in policies.adapters and cfg.init.mode == "divergent":
        policies.perturb("B", cfg.init.std, seed=cfg.init.seed + cfg.seed)
    return policies


class Policies:
    """A frozen base with named LoRA adapters (``A``, optionally ``B``) and helpers to sample and score them."""

    def __init__(self, model, tokenizer, adapters: Sequence[str], lora: Any, gradient_checkpointing: bool = False):
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules),
            task_type="CAUSAL_LM",
        )
        self.tokenizer = tokenizer
        self.adapters = tuple(adapters)
        self.model = get_peft_model(model, config, adapter_name=self.adapters[0])
        for name in self.adapters[1:]:
            self.model.add_adapter(name, config)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.model.enable_input_require_grads()
        self._activate(self.adapters[0])
        self.end_ids = {tokenizer.eos_token_id}
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
            self.end_ids.add(im_end)

    # -- adapters ------------------------------------------------------------------------------------------------

    def parameters(self, adapter: str) -> list[torch.nn.Parameter]:
        """The LoRA weights of one adapter (what its optimizer updates)."""
        return [p for n, p in self.model.named_parameters() if "lora_" in n and n.endswith(f".{adapter}.weight")]

    def lora_state(self, adapter: str) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.model.named_parameters()
                if "lora_" in n and n.endswith(f".{adapter}.weight")}

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

    def perturb(self, adapter: str, std: float, seed: int) -> None:
        """Seeded Gaussian noise on ``adapter``'s ``lora_B`` (PEFT's init leaves it zero, even 'gaussian')."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if "lora_B" in n and n.endswith(f".{adapter}.weight"):
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * std)

    def save_adapters(self, directory: Path) -> None:
        """Each adapter in ``directory/<name>`` (PEFT's format, loadable with ``load_adapter``)."""
        for name in self.adapters:
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

    # -- prompts and sampling ------------------------------------------------------------------------------------

    def render(self, user: str, system: str | None = None, enable_thinking: bool = True) -> str:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
        )

    def _cut(self, ids: list[int]) -> tuple[tuple[int, ...], bool]:
        for i, t in enumerate(ids):
            if t in self.end_ids:
                return tuple(ids[: i + 1]), False
        pad = self.tokenizer.pad_token_id
        while ids and ids[-1] == pad and pad not in self.end_ids:
            ids = ids[:-1]
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
        batch_size: int = 512,
    ) -> list[Completion]:
        """One completion per prompt (repeat prompts for a group), sampled with ``adapter`` active."""
        out: list[Completion] = []
        was_training = self.model.training
        self.model.eval()
        with self.use_adapter(adapter):
            for start in range(0, len(prompts), batch_size):
                chunk = list(prompts[start : start + batch_size])
                enc = self.tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
                enc = {k: v.to(self.device) for k, v in enc.items()}
                gen = self.model.generate(
                    **enc,
                    do_sample=True,
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    top_k=top_k,  # 0 disables top-k (None would fall back to the model's default of 50)
                    pad_token_id=self.tokenizer.pad_token_id,
                    eos_token_id=sorted(self.end_ids),
                )
                width = enc["input_ids"].shape[1]
                for row in gen[:, width:].tolist():
                    ids, truncated = self._cut(row)
                    text = self.tokenizer.decode(ids, skip_special_tokens=False)
                    for end in self.end_ids:  # the end-of-turn token is not part of the answer text
                        text = text.replace(self.tokenizer.convert_ids_to_tokens(end), "")
                    out.append(Completion(text=text, token_ids=ids, truncated=truncated))
        self.model.train(was_training)
        return out

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- scoring -------------------------------------------------------------------------------------------------

    def batch_tensors(self, prompts: Sequence[str], completions: Sequence[Completion]) -> dict[str, torch.Tensor]:
        """Left-padded prompts and right-padded completions as tensors: ids and masks [B, P] and [B, T]."""
        enc = self.tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
        width = max(1, max(c.n_tokens for c in completions))
        ids = torch.full((len(completions), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(completions), width), dtype=torch.long)
        for i, c in enumerate(completions):
            ids[i, : c.n_tokens] = torch.tensor(c.token_ids, dtype=torch.long)
            mask[i, : c.n_tokens] = 1
        return {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"],
                "completion_ids": ids, "completion_mask": mask}

    def token_logps(self, batch: dict[str, torch.Tensor], rows: slice | None = None,
                    temperature: float = 1.0) -> torch.Tensor:
        """Log-probabilities of the completion tokens under the active adapter, [b, T] for the selected rows, from
        logits divided by the sampling temperature (as TRL does), so they are the sampler's probabilities."""
        rows = rows or slice(None)
        p_ids, p_mask = batch["prompt_ids"][rows], batch["prompt_mask"][rows]
        c_ids, c_mask = batch["completion_ids"][rows], batch["completion_mask"][rows]
        ids = torch.cat([p_ids, c_ids], dim=1).to(self.device)
        attn = torch.cat([p_mask, c_mask], dim=1).to(self.device)
        # generation numbers positions from the first real token; do the same so the ratio starts at exactly 1
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits
        logits = logits[:, p_ids.shape[1] - 1 : -1].float() / temperature  # [b, T, V]
        return torch.log_softmax(logits, dim=-1).gather(-1, c_ids.to(self.device).unsqueeze(-1)).squeeze(-1)
