"""LoRA weights on a PEFT model: which parameters they are, and the float32 they must be in.

Every adapter's LoRA weights are float32 whatever the base's dtype (``lora_to_float32``, checked at start-up by
``check_lora_float32``): PEFT before 0.19 left an adapter made by ``add_adapter`` in the base's bfloat16, where most
updates of size lr x weight round away at lr 1e-5. Left out on purpose: switching adapters and their optimizers
(``agon.models.policies``).
"""

from __future__ import annotations

from typing import Sequence

import torch


class AdapterDtypeError(RuntimeError):
    """An adapter whose LoRA weights are not float32 (a bfloat16 adapter loses most updates to rounding)."""


def lora_parameters(model: torch.nn.Module, adapter: str | None = None) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of every LoRA weight of ``model``, or of one ``adapter``'s."""
    return [(n, p) for n, p in model.named_parameters()
            if "lora_" in n and (adapter is None or n.endswith(f".{adapter}.weight"))]


def lora_to_float32(model: torch.nn.Module) -> None:
    """Cast every LoRA weight of ``model`` to float32 in place (the base keeps its dtype). Before any optimizer holds
    them: a parameter's ``data`` is replaced, which an optimizer's existing state would not follow."""
    for _, p in lora_parameters(model):
        if p.dtype != torch.float32:
            p.data = p.data.float()


def check_lora_float32(model: torch.nn.Module, adapters: Sequence[str]) -> None:
    """Raise ``AdapterDtypeError`` unless every adapter in ``adapters`` has LoRA weights and all are float32."""
    found = {name: sorted({str(p.dtype) for _, p in lora_parameters(model, name)}) for name in adapters}
    wrong = {name: dtypes for name, dtypes in found.items() if dtypes != ["torch.float32"]}
    if wrong:
        raise AdapterDtypeError(
            f"LoRA weights must be float32 in every adapter, found {found}: an adapter in bfloat16 rounds most "
            f"updates away and trains differently from the others (PEFT < 0.19 leaves add_adapter's adapter in the "
            f"base's dtype; Policies casts them with lora_to_float32)")
