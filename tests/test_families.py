"""Each model family at its real layer types, tiny widths: the checkpoint loads as its language model alone, agon's
chunked scoring equals the model's own logits (soft-cap included) in values and LoRA gradients, batching with left
padding changes nothing, both engines that serve it sample, and its chat format gives the tasks a visible part and a
recap, thinking on and off. The checkpoints are the families' offline shapes (``agon.bench.model_shape``) with the real
vocabulary and tokenizer layout, cut to widths of 64 and a handful of layers that keep every layer type: Qwen3.5's
linear and full attention, Gemma 4's sliding and full attention with KV sharing, per-layer inputs and the soft-cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from agon.training.checks import compose_config, validate
from agon.core.config import ConfigError, LoraConfig
from agon.engines import engine_name
from agon.families import FAMILIES, Family, get_family, known_families
from agon.bench.model_shape import ensure_model
from agon.models.policies import Policies
from agon.tasks import Problem, build_task

# family -> (published shape, text-config overrides keeping every layer type of the family at tiny widths)
TINY = {
    "qwen3": ("0.6b", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, intermediate_size=128)),
    "qwen3_5": ("0.8b", dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                             head_dim=32, intermediate_size=128, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=16, linear_value_head_dim=16)),
    # two of the five layers reuse the KV of the last sliding and the last full layer before them
    "gemma4": ("e2b", dict(num_hidden_layers=5, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=16, global_head_dim=32, intermediate_size=128, sliding_window=4,
                           num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                        "sliding_attention", "full_attention"])),
}
FAMILY_NAMES = sorted(TINY)
TEMPERATURE = 0.7
FIXTURE = str(Path(__file__).parent / "tasks" / "fixtures" / "deepmath.parquet")
PROBLEM = Problem("p", "What is 6 times 7?", "42")


def checkpoint(name: str) -> Path:
    """The family's tiny checkpoint (built once per cache; the ``agon_cache`` fixture points the cache)."""
    size, overrides = TINY[name]
    return ensure_model(name, size, "float32", log=lambda *_: None, overrides=overrides)


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family_policies(request, agon_cache):
    """(family, Policies with adapters A and B, both moved off PEFT's zero init) on the family's tiny checkpoint."""
    from transformers import AutoTokenizer

    family = get_family(request.param)
    path = checkpoint(request.param)
    model = family.load(str(path), torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    policies = Policies(model, AutoTokenizer.from_pretrained(path), ["A", "B"],
                        OmegaConf.structured(LoraConfig(rank=4, alpha=8)), family=family)
    policies.perturb("A", 0.05, seed=1)
    policies.perturb("B", 0.05, seed=2)
    return family, policies


def _rollouts(policies: Policies):
    prompts = [policies.render("What is 2+3? " * k, enable_thinking=True) for k in (1, 3, 2)]
    torch.manual_seed(0)
    completions = policies.sample(prompts, "A", max_new_tokens=10, temperature=1.0)
    return policies.batch_tensors(prompts, completions)


def _reference_logps(policies: Policies, batch) -> torch.Tensor:
    """log_softmax(model(...).logits / T) at the completion tokens, [B, T], from the PEFT model's own forward."""
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
    attn = torch.cat([batch.prompt_mask, batch.completion_mask], 1)
    logits = policies.model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                            use_cache=False).logits
    width = batch.prompt_ids.size(1)
    logits = logits[:, width - 1 : -1]
    logps = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / TEMPERATURE, -1)
    return logps.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) * batch.completion_mask


def _values_and_grads(policies: Policies, score) -> tuple[torch.Tensor, list[torch.Tensor]]:
    params = [p for name in ("A", "B") for p in policies.parameters(name)]
    for p in params:
        p.grad = None
    values = score()
    weights = torch.linspace(-1, 1, values.numel()).reshape(values.shape)
    (values * weights).sum().backward()
    grads = [p.grad.clone() for p in params if p.grad is not None]
    return values.detach(), grads


def test_chunked_scoring_equals_the_models_own_logits_values_and_lora_grads(family_policies):
    family, policies = family_policies
    batch = _rollouts(policies)
    with policies.use_adapter("B"):
        ours, our_grads = _values_and_grads(
            policies, lambda: policies.token_logps(batch, temperature=TEMPERATURE, chunk_tokens=7))
        ref, ref_grads = _values_and_grads(policies, lambda: _reference_logps(policies, batch))
    assert batch.completion_mask.sum() >= 10 and len(our_grads) == len(ref_grads) > 0
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(our_grads, ref_grads):
        # float32 gradients reach 25 on Gemma, where two summation orders differ by 1e-5 of the largest: compared
        # at 5e-5 of it here, and to 1e-5 absolute in float64 below
        scale = want.abs().max().clamp(min=1.0)
        torch.testing.assert_close(got / scale, want / scale, atol=5e-5, rtol=0)
    policies.model.double()
    try:
        with policies.use_adapter("B"):
            ours, our_grads = _values_and_grads(
                policies, lambda: policies.token_logps(batch, temperature=TEMPERATURE, chunk_tokens=7))
            ref, ref_grads = _values_and_grads(policies, lambda: _reference_logps(policies, batch))
    finally:
        policies.model.float()
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref, atol=1e-10, rtol=0)
    for got, want in zip(our_grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # left padding and micro-batching change nothing: each row scored alone gives the same numbers
    with torch.no_grad(), policies.use_adapter("A"):
        together = policies.token_logps(batch, temperature=TEMPERATURE)
        alone = torch.cat([policies.token_logps(batch, rows=slice(i, i + 1), temperature=TEMPERATURE)
                           for i in range(len(batch))])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_scoring_without_gemmas_soft_cap_is_wrong(family_policies, monkeypatch):
    """The check above fails when the head drops Gemma 4's final soft-cap (the other families have none)."""
    family, policies = family_policies
    if family.name != "gemma4":
        pytest.skip("only Gemma 4 caps its logits")
    base = policies.model.get_base_model()
    assert base.config.final_logit_softcapping == 30.0
    batch = _rollouts(policies)
    class Uncapped(Family):
        def decoder_and_head(self, base):
            return base.get_decoder(), base.get_output_embeddings()

    original = base.lm_head.weight.detach().clone()  # tied: the embedding changes with it
    with torch.no_grad():
        base.lm_head.weight.mul_(400 / original.abs().max())  # logits well past the cap, as a trained model's
        try:
            ref = _reference_logps(policies, batch)
            capped = policies.token_logps(batch, temperature=TEMPERATURE)
            monkeypatch.setattr(policies, "family", Uncapped())
            uncapped = policies.token_logps(batch, temperature=TEMPERATURE)
        finally:
            base.lm_head.weight.copy_(original)
    torch.testing.assert_close(capped, ref, atol=1e-5, rtol=1e-5)
    assert (uncapped - ref).abs().max() > 1e-2


def test_the_checkpoint_loads_as_its_language_model_alone(family_policies):
    """A multimodal checkpoint's towers are neither loaded nor given a LoRA; every language-model weight is the
    checkpoint's; the LoRA covers the family's own linear layers."""
    from safetensors.torch import load_file

    family, policies = family_policies
    base = policies.model.get_base_model()
    names = [n for n, _ in base.named_parameters()]
    assert not any(part in n for n in names for part in ("vision", "visual", "audio", "embed_vision"))
    saved = load_file(str(checkpoint(family.name) / "model.safetensors"))
    prefix = {"qwen3": "model.", "qwen3_5": "model.language_model.", "gemma4": "model.language_model."}[family.name]
    weights = {n.replace(".base_layer", ""): p for n, p in base.named_parameters() if "lora_" not in n}
    for key, value in saved.items():
        if key.startswith(prefix) and key != "lm_head.weight":
            name = "model." + key[len(prefix):]
            if name in weights:
                assert torch.equal(weights.pop(name), value), name
    assert [n for n in weights if n != "lm_head.weight"] == []  # every weight came from the checkpoint
    targets = {n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n, _ in policies.model.named_parameters()
               if ".lora_A.A." in n}
    want = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    want |= {"qwen3": set(), "qwen3_5": {"in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj"},
             "gemma4": {"per_layer_input_gate", "per_layer_projection", "per_layer_model_projection"}}[family.name]
    assert targets == want


def test_a_gemma_load_that_reads_no_weights_fails(tmp_path, agon_cache):
    """A checkpoint whose keys do not follow Gemma 4's multimodal layout is an error, not a random language model."""
    from safetensors.torch import load_file, save_file

    path = checkpoint("gemma4")
    moved = tmp_path / "moved"
    moved.mkdir()
    for f in path.iterdir():
        if f.name != "model.safetensors":
            (moved / f.name).write_bytes(f.read_bytes())
    weights = load_file(str(path / "model.safetensors"))
    save_file({k.replace("language_model", "text_model"): v for k, v in weights.items()},
              str(moved / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="weights unread"):
        get_family("gemma4").load(str(moved), torch.float32)


def test_both_adapters_sample_and_differ(family_policies):
    family, policies = family_policies
    prompt = policies.render("What is 2+3?", enable_thinking=False)
    outs = {}
    for adapter in ("A", "B"):
        torch.manual_seed(0)
        outs[adapter] = policies.sample([prompt] * 2, adapter, max_new_tokens=6, temperature=1.0)
    assert all(c.n_tokens for cs in outs.values() for c in cs)
    # the adapters are different policies: a random base samples near-uniformly, so compare their log-probs
    batch = policies.batch_tensors([prompt] * 2, outs["A"])
    with torch.no_grad():
        logps = {}
        for adapter in ("A", "B"):
            with policies.use_adapter(adapter):
                logps[adapter] = policies.token_logps(batch)
    assert (logps["A"] - logps["B"]).abs().max() > 1e-3


# -- chat formats and recaps ------------------------------------------------------------------------------------

# family -> (a completion as the family's model writes it with thinking on, the prompt's end with thinking on and
# with it off)
FORMATS = {
    "qwen3": ("<think>\nsix sevens make 42\n</think>\n\nWe multiply: 6*7 = 42. \\boxed{42}<|im_end|>",
              "<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    # the small Qwen3.5 template opens the block itself when thinking is on
    "qwen3_5": ("\nsix sevens make 42\n</think>\n\nWe multiply: 6*7 = 42. \\boxed{42}<|im_end|>",
                "<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    "gemma4": ("<|channel>thought\nsix sevens make 42<channel|>We multiply: 6*7 = 42. \\boxed{42}<turn|>",
               "<|turn>model\n", "<|turn>model\n"),
}


@pytest.fixture(scope="module")
def deepmath():
    from tests.tasks.conftest import compose_task

    t = build_task(compose_task("deepmath_hard", f"source={FIXTURE}", "heldout_size=3"))
    yield t
    t.close()


def test_each_format_gives_a_graded_answer_and_a_recap_without_the_reasoning(family_policies, deepmath):
    family, policies = family_policies
    written, on_end, off_end = FORMATS[family.name]
    tok = policies.tokenizer
    on = policies.render(deepmath.user_message(PROBLEM), enable_thinking=True)
    off = policies.render(deepmath.user_message(PROBLEM), enable_thinking=False)
    assert on.endswith(on_end) and off.endswith(off_end)
    ids = tok.encode(written, add_special_tokens=False)
    assert ids[-1] in policies.end_ids  # the family's end of turn stops every engine
    completion = policies.completion(on, ids)
    assert not completion.truncated
    assert deepmath.recap(completion.text) == "We multiply: 6*7 = 42."
    verdict = deepmath.verify([PROBLEM], [completion.text])[0]
    assert verdict.correct and verdict.format_ok
    # a trace cut inside its reasoning has no visible part: wrong, and nothing to recap
    cut = policies.completion(on, ids[: len(tok.encode(written.split("six")[0], add_special_tokens=False)) + 2])
    assert cut.truncated and deepmath.recap(cut.text) == "" and not deepmath.verify([PROBLEM], [cut.text])[0].format_ok
    # thinking off: the answer alone is the visible part (an empty reasoning block, from the template or the family)
    plain = policies.completion(off, tok.encode("6*7 = 42. \\boxed{42}", add_special_tokens=False))
    assert deepmath.recap(plain.text) == "6*7 = 42." and deepmath.verify([PROBLEM], [plain.text])[0].correct


def test_history_turns_drop_their_reasoning_in_every_template(family_policies):
    family, policies = family_policies
    written = FORMATS[family.name][0]
    if family.name == "qwen3_5":
        written = "<think>" + written
    answer = "We multiply: 6*7 = 42. \\boxed{42}"
    messages = [{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": written.rsplit("<", 1)[0]},
                {"role": "user", "content": "And 6*8?"}]
    text = policies.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert answer in text and "six sevens" not in text


# -- config ------------------------------------------------------------------------------------------------------


def test_every_family_has_a_module_and_every_model_config_a_family():
    assert known_families() == FAMILY_NAMES and set(FAMILIES) == set(FAMILY_NAMES)
    for option in sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "model").glob("*.yaml")):
        model = compose_config([f"model={option}"]).model
        family = get_family(model.family)
        assert model.shape is None or model.shape in family.shape.sizes, option


@pytest.mark.parametrize("option", ["qwen3_5_0.8b", "qwen3_5_2b", "gemma4_e2b", "gemma4_e4b"])
def test_the_paper_recipe_composes_with_every_new_model(option):
    cfg = compose_config(["experiment=paper_deepmath", f"model={option}", "generation.engine=hf"])
    validate(cfg)
    assert cfg.model.family in ("qwen3_5", "gemma4") and cfg.model.lora.rank == 16 and cfg.model.enable_thinking


@pytest.mark.parametrize("option", ["qwen3_5_0.8b", "gemma4_e2b"])
def test_an_engine_that_cannot_serve_the_family_fails_before_loading_naming_the_key(option):
    with pytest.raises(ConfigError, match=r"generation.engine=hf_continuous does not serve model.family="):
        validate(compose_config([f"model={option}", "generation.engine=hf_continuous"]))
    # the paper preset's fallback, used where vLLM is installed nowhere
    nowhere = ["experiment=paper_deepmath", f"model={option}", "generation.vllm.placement=worker",
               "generation.vllm.python=/nonexistent/python"]
    with pytest.raises(ConfigError, match=r"generation.fallback=hf_continuous does not serve"):
        validate(compose_config(nowhere))
    validate(compose_config([*nowhere, "generation.fallback=hf"]))
    # an engine that does not serve the family hands over to a fallback that does, wherever vLLM is
    cfg = compose_config(["experiment=paper_deepmath", f"model={option}", "generation.fallback=hf"])
    validate(cfg)
    assert engine_name(cfg) == ("hf" if option.startswith("qwen3_5") else engine_name(cfg))


def test_vllm_is_refused_for_qwen3_5_before_loading_saying_why():
    """Qwen3.5 through vLLM 0.32 fails at the config check with what was measured (``Qwen3_5.engine_notes``): the
    adapters' keys match no layer of the multimodal checkpoint, and the CPU build imports no Qwen3.5 without
    torchvision and runs its Gated DeltaNet layers in bfloat16 only."""
    with pytest.raises(ConfigError, match=r"^generation.engine=vllm does not serve model.family=qwen3_5 \(Qwen3.5\) "
                                          r"with a LoRA on each adapter \(vLLM 0.32 applies none of the adapters .*"
                                          r"model.language_model.*No module named 'torchvision'.*torchvision::nms.*"
                                          r"'CPU GDN attention requires BF16.'\)\); choose one of \['hf'\]$"):
        validate(compose_config(["model=qwen3_5_0.8b", "generation.engine=vllm"]))


def test_an_unknown_family_names_the_key():
    with pytest.raises(ConfigError, match=r"model.family='mistral' is not valid; choose one of \['gemma4'"):
        validate(compose_config(["model.family=mistral"]))


# -- vLLM (make test-vllm) ---------------------------------------------------------------------------------------

# vLLM's CPU attention takes head sizes of 32 and up: Gemma 4's layer types at the smallest widths it runs
GEMMA_FOR_VLLM = dict(TINY["gemma4"][1], head_dim=32, global_head_dim=64)


@pytest.mark.vllm(seconds=420)
@pytest.mark.usefixtures("bounded")
def test_vllm_serves_gemma4_with_each_adapter_as_the_trainer_scores_it(agon_cache):
    """The multimodal checkpoint served as its language model (``Gemma4.vllm_engine_args``): both adapters load
    (the per-layer projections included), and each adapter's sampled log-probs are the trainer's for that adapter
    (1e-4), not the other's."""
    from transformers import AutoTokenizer

    from agon.engines import Sampling, build_engine
    from tests.test_engines import _trainer_logps

    path = ensure_model("gemma4", "e2b", "float32", log=lambda *_: None, overrides=GEMMA_FOR_VLLM)
    cfg = compose_config(["model=gemma4_e2b", f"model.path={path}", "model.dtype=float32", "model.device=cpu",
                          "model.gradient_checkpointing=false", "model.lora.rank=8", "model.lora.alpha=16",
                          "generation.engine=vllm", "generation.vllm.start_timeout_s=300",
                          "generation.vllm.max_model_len=256", "logger=none"])
    validate(cfg)
    family = get_family("gemma4")
    model = family.load(str(path), torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    policies = Policies(model, AutoTokenizer.from_pretrained(path), ["A", "B"], cfg.model.lora, family=family)
    policies.perturb("A", 0.3, seed=1)
    policies.perturb("B", 0.3, seed=2)
    engine = build_engine(cfg, policies, log=lambda *_: None)
    try:
        prompts = [policies.render(f"What is {i}+{i}?", enable_thinking=True) for i in range(8)]
        sampling = Sampling(max_new_tokens=16, temperature=1.0)
        for adapter, other in (("A", "B"), ("B", "A")):
            completions = engine.sample(prompts, adapter, sampling)
            ours, theirs, mask = _trainer_logps(policies, prompts, completions, adapter, 1.0)
            assert mask.sum() > 50
            assert float((ours - theirs).abs()[mask].max()) < 1e-4, adapter
            wrong, _, _ = _trainer_logps(policies, prompts, completions, other, 1.0)
            assert float((wrong - theirs).abs()[mask].max()) > 1e-2, adapter
    finally:
        engine.close()


@pytest.mark.vllm(seconds=120)
@pytest.mark.usefixtures("bounded")
def test_vllm_cpu_build_cannot_import_qwen3_5_as_its_refusal_says():
    """The measured cause behind refusing Qwen3.5 on vLLM's CPU build, on the installed worker environment: vLLM's
    Qwen3.5 module does not import without torchvision (via transformers' Qwen2-VL image processor). A failure here
    means the cause is gone: try serving Qwen3.5 again and revise ``Qwen3_5.engine_notes``."""
    import subprocess

    from agon.engines.vllm_engine import vllm_build, worker_python

    python = worker_python(compose_config([]).generation.vllm)
    if vllm_build(python) != "cpu":
        pytest.skip(f"the worker's vLLM at {python} is not the CPU build, whose environment has no torchvision")
    out = subprocess.run([python, "-c", "import vllm.model_executor.models.qwen3_5"], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode != 0
    assert "ModuleNotFoundError: No module named 'torchvision'" in out.stderr
    assert "transformers/models/qwen2_vl/image_processing_qwen2_vl.py" in out.stderr
    assert "No module named 'torchvision'" in get_family("qwen3_5").engine_notes["vllm"]
