"""GPU checks on the real shapes (randomly initialised: no hub). Skipped on machines without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_agon_step_on_qwen3_0_6b_shape(tmp_path):
    """One Agon step, bf16 with gradient checkpointing and micro-batches, on a random model of Qwen3-0.6B's shape:
    it runs within memory, the base does not change, and the pair of r=8 adapters stays under 2% of the base.
    (A random model is never right, so its advantages are zero and the adapters need not move.)"""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agon.models import world
    from agon.models.policies import build_policies
    from agon.records.recorder import Recorder
    from agon.tasks import build_task
    from agon.training.trainer import Trainer
    from tests.conftest import compose_config

    cfg = compose_config(["model=qwen3_0.6b", "logger=none", "trainer.prompts_per_step=4",
                          "trainer.num_generations=4", "trainer.micro_batch_size=8", "trainer.max_new_tokens=32",
                          "model.lora.rank=8", "model.lora.alpha=16"])
    tok = world.build_tokenizer()
    shape = Qwen3Config(vocab_size=len(tok), hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                        eos_token_id=2, pad_token_id=0)
    model = Qwen3ForCausalLM(shape).to(device="cuda", dtype=torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    cfg.task = compose_config().task  # the built-in task: no hub
    policies = build_policies(cfg, model, tok)
    base_n = sum(p.numel() for n, p in policies.model.named_parameters() if "lora_" not in n)
    lora_n = sum(p.numel() for a in ("A", "B") for p in policies.parameters(a))
    assert lora_n / base_n < 0.02
    base = {n: p.detach().clone() for n, p in policies.model.named_parameters() if "lora_" not in n}
    trainer = Trainer(cfg, policies, build_task(cfg.task), Recorder(tmp_path), tmp_path, log=lambda *_: None)
    metrics = trainer.step()
    assert torch.cuda.max_memory_allocated() < 40 * 2**30
    assert metrics["train/generated_tokens"] > 0
    assert all(torch.equal(base[n], p) for n, p in policies.model.named_parameters() if "lora_" not in n)
