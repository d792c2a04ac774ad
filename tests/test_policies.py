"""Adapters on one frozen base: switching, isolation of updates, init, sampling with the updated weights."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import base_state


def test_use_adapter_restores_the_previous_adapter(policies):
    assert policies.active == "A"
    with policies.use_adapter("B"):
        assert policies.active == "B"
        with policies.use_adapter(None):
            pass
        assert policies.active == "B"
    assert policies.active == "A"
    try:
        with policies.use_adapter("B"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert policies.active == "A"


def test_both_adapters_stay_trainable_and_the_base_frozen(policies):
    with policies.use_adapter("B"):  # PEFT's set_adapter alone would freeze A here
        assert all(p.requires_grad for p in policies.parameters("A"))
        assert all(p.requires_grad for p in policies.parameters("B"))
    assert not any(p.requires_grad for n, p in policies.model.named_parameters() if "lora_" not in n)


def test_divergent_init_perturbs_only_b(policies):
    policies.perturb("B", std=0.02, seed=0)
    a_b = [p for n, p in policies.model.named_parameters() if "lora_B" in n and n.endswith(".A.weight")]
    b_b = [p for n, p in policies.model.named_parameters() if "lora_B" in n and n.endswith(".B.weight")]
    assert a_b and all(torch.count_nonzero(p) == 0 for p in a_b)
    assert all(torch.count_nonzero(p) > 0 for p in b_b)
    assert policies.divergence() == 1.0  # A's delta is zero, so the two are as far apart as can be


def test_perturbation_is_seeded(tiny_base):
    import copy

    from agon.models.policies import Policies

    cfg, (model, tok) = tiny_base
    one = Policies(copy.deepcopy(model), tok, ["A", "B"], cfg.model.lora)
    two = Policies(copy.deepcopy(model), tok, ["A", "B"], cfg.model.lora)
    one.perturb("B", 0.02, seed=3)
    two.perturb("B", 0.02, seed=3)
    for (n, p), (_, q) in zip(one.lora_state("B").items(), two.lora_state("B").items()):
        if "lora_B" in n:
            assert torch.equal(p, q)


def _lora_b_nonzero(policies, name):
    return [bool(torch.count_nonzero(p)) for n, p in policies.lora_state(name).items() if "lora_B" in n]


def test_init_modes_at_step_zero_as_a_run_builds_them(tiny_base):
    """divergent: A's lora_B zero and B's not; symmetric: both zero (through the run's own builder)."""
    import copy

    from agon.models.policies import build_policies
    from tests.conftest import TEST_WORLD, compose_config

    _, (model, tok) = tiny_base
    div = build_policies(compose_config(TEST_WORLD + ["init=divergent"]), copy.deepcopy(model), tok)
    assert not any(_lora_b_nonzero(div, "A")) and all(_lora_b_nonzero(div, "B"))
    sym = build_policies(compose_config(TEST_WORLD + ["init=symmetric"]), copy.deepcopy(model), tok)
    assert not any(_lora_b_nonzero(sym, "A")) and not any(_lora_b_nonzero(sym, "B"))
    solo = build_policies(compose_config(TEST_WORLD + ["method=grpo"]), copy.deepcopy(model), tok)
    assert solo.adapters == ("A",)


def test_split_init_trains_each_adapter_on_its_own_half(tiny_base):
    """init=split: each adapter trained init.steps steps of init.batch_size problems at init.lr, on the problems
    split_half puts in its half only; the base untouched; the same seed gives bitwise the same adapters, and a
    changed key changes them. Without a task (adapters about to be loaded) it trains nothing."""
    import copy

    import agon.models.world
    from agon.models.policies import build_policies, split_half
    from agon.tasks import build_task
    from tests.conftest import TEST_WORLD, compose_config

    cfg0, (model, tok) = tiny_base
    cfg = compose_config(TEST_WORLD + ["init=split", "init.steps=3", "init.batch_size=4", "init.lr=1e-2"])
    task = build_task(cfg.task)
    seen: list[list[str]] = []
    real = agon.models.world.supervised_loss

    def recording(model, tokenizer, pairs):  # the real loss, recording which problems each step trained on
        seen.append([prompt for prompt, _ in pairs])
        return real(model, tokenizer, pairs)

    agon.models.world.supervised_loss = recording
    torch.manual_seed(0)  # LoRA's own init draws from the global generator, which a run seeds first
    try:
        split = build_policies(cfg, copy.deepcopy(model), tok, task)
    finally:
        agon.models.world.supervised_loss = real
    assert [len(s) for s in seen] == [4] * 6  # 3 steps x 4 problems, A's then B's
    pool = {p.id: p for p in task.train_problems()}
    for k, steps in enumerate((seen[:3], seen[3:])):
        ids = [next(i for i in pool if f"u{pool[i].question}<" in prompt) for step in steps for prompt in step]
        assert {split_half(i) for i in ids} == {k}
    assert all(_lora_b_nonzero(split, "A")) and all(_lora_b_nonzero(split, "B"))
    assert split.revisions == {"A": 1, "B": 1}
    torch.manual_seed(0)
    again = build_policies(cfg, copy.deepcopy(model), tok, task)
    assert again.digest() == split.digest()
    for override in ("init.lr=1e-3", "init.steps=2", "init.batch_size=2"):
        other = compose_config(TEST_WORLD + ["init=split", "init.steps=3", "init.batch_size=4", "init.lr=1e-2",
                                             override])
        torch.manual_seed(0)
        assert build_policies(other, copy.deepcopy(model), tok, task).digest() != split.digest(), override
    untrained = build_policies(cfg, copy.deepcopy(model), tok)
    assert not any(_lora_b_nonzero(untrained, "A")) and not any(_lora_b_nonzero(untrained, "B"))
    base = base_state(untrained)
    assert base.keys() == base_state(split).keys()
    assert all(torch.equal(base[n], p) for n, p in base_state(split).items())


def test_update_of_one_adapter_leaves_the_other_and_the_base_bitwise_unchanged(policies):
    policies.perturb("B", 0.02, seed=0)
    base, b_before, a_before = base_state(policies), policies.lora_state("B"), policies.lora_state("A")
    opt = torch.optim.AdamW(policies.parameters("A"), lr=1e-2)
    batch = policies.tokenizer(["<|im_start|>u1+2<|im_end|><|im_start|>a<think>1+2=3"], return_tensors="pt")
    with policies.use_adapter("A"):
        loss = policies.model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    opt.step()
    assert any(not torch.equal(a_before[n], p) for n, p in policies.lora_state("A").items())
    assert all(torch.equal(b_before[n], p) for n, p in policies.lora_state("B").items())
    assert all(torch.equal(base[n], p) for n, p in base_state(policies).items())


def test_sampling_uses_the_updated_adapter(policies):
    """Train A (only A) toward one completion; sampling with A must show it at once, with B or the base not.

    A low sampling temperature turns "the target is now the most likely continuation" into what is sampled."""
    prompt = policies.render("12+7")
    target = "7777777"
    before = policies.sample([prompt] * 4, "A", max_new_tokens=8, temperature=1.0)
    enc = policies.tokenizer([prompt + target], return_tensors="pt", add_special_tokens=False)
    labels = enc["input_ids"].clone()
    labels[:, : len(policies.tokenizer(prompt, add_special_tokens=False)["input_ids"])] = -100
    opt = torch.optim.Adam(policies.parameters("A"), lr=5e-2)
    with policies.use_adapter("A"):
        for _ in range(40):
            opt.zero_grad()
            policies.model(**enc, labels=labels).loss.backward()
            opt.step()
    after = policies.sample([prompt] * 4, "A", max_new_tokens=8, temperature=0.01)
    others = policies.sample([prompt] * 4, "B", max_new_tokens=8, temperature=0.01)
    others += policies.sample([prompt] * 4, None, max_new_tokens=8, temperature=0.01)
    assert all(c.text.startswith(target) for c in after), [c.text for c in after]
    assert not any(c.text.startswith(target) for c in before + others)


def test_logps_match_the_sampler(policies):
    """Recomputed log-probs of sampled tokens equal generate's own scores (same positions, same temperature)."""
    prompts = [policies.render("5+5"), policies.render("12+30-4")]  # different lengths: left padding
    enc = policies.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad(), policies.use_adapter("A"):
        out = policies.model.generate(**enc, do_sample=True, max_new_tokens=6, temperature=0.8, top_k=0,
                                      output_scores=True, return_dict_in_generate=True,
                                      pad_token_id=policies.tokenizer.pad_token_id, eos_token_id=[])
    gen = out.sequences[:, enc["input_ids"].shape[1]:]
    scores = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
    from agon.models.tokens import Completion

    comps = [Completion("", tuple(r.tolist()), True) for r in gen]
    with torch.no_grad(), policies.use_adapter("A"):
        ours = policies.token_logps(policies.batch_tensors(prompts, comps), temperature=0.8)
    torch.testing.assert_close(ours, scores, atol=1e-4, rtol=1e-4)


def test_adapters_round_trip_through_disk(policies, tmp_path):
    policies.perturb("B", 0.05, seed=1)
    with torch.no_grad():
        for p in policies.parameters("A"):
            p.add_(0.01)
    saved = {n: policies.lora_state(n) for n in ("A", "B")}
    policies.save_adapters(tmp_path)
    assert (tmp_path / "A" / "adapter_model.safetensors").exists()
    assert (tmp_path / "B" / "adapter_config.json").exists()
    with torch.no_grad():
        for name in ("A", "B"):
            for p in policies.parameters(name):
                p.zero_()
    policies.load_adapters(tmp_path)
    for name in ("A", "B"):
        for n, p in policies.lora_state(name).items():
            assert torch.equal(saved[name][n], p)


def test_a_finished_completion_keeps_every_token_through_its_end_of_turn(policies):
    """The token ids trained on are exactly what was sampled, up to and including the one end-of-turn token."""
    finished = policies.sample([policies.render("2+4-3")] * 8, "A", max_new_tokens=32, temperature=1.0)
    assert all(not c.truncated for c in finished)
    for c in finished:
        assert c.token_ids[-1] in policies.end_ids and not set(c.token_ids[:-1]) & policies.end_ids
        assert policies.tokenizer.decode(c.token_ids[:-1]) == c.text
        assert c.text.startswith("<think>") and c.text.endswith("}")
    cut = policies.sample([policies.render("2+4-3")] * 4, "A", max_new_tokens=5, temperature=1.0)
    assert all(c.truncated and c.n_tokens == 5 and not set(c.token_ids) & policies.end_ids for c in cut)


def test_a_hub_model_loads_from_its_local_path_and_fails_clearly_without_one(tiny_base, tmp_path):
    from agon.models.loading import ModelLoadError, load_base
    from tests.conftest import TEST_WORLD, compose_config

    _, (model, tok) = tiny_base
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    cfg = compose_config(TEST_WORLD + ["model=qwen3_0.6b", f"model.path={tmp_path}", "model.dtype=float32"])
    loaded, _ = load_base(cfg.model, cfg.task, log=lambda *_: None)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), loaded.parameters(), strict=True))
    cfg.model.path = None  # the hub name alone, and no hub here (HF_HUB_OFFLINE=1)
    with pytest.raises(ModelLoadError, match=f"{cfg.model.name}.*model.path="):
        load_base(cfg.model, cfg.task, log=lambda *_: None)



@pytest.mark.parametrize("fast", [True, False], ids=["native_bf16", "fallback_bf16"])
def test_bfloat16_on_a_cpu_without_native_bf16_names_the_setting_to_change(tiny_base, tmp_path, monkeypatch, fast):
    """On a CPU whose bfloat16 matmul is torch's fallback (90x slower than float32 on an AVX2 EPYC), loading in
    bfloat16 says so once and names model.dtype=float32; where bfloat16 is native it says nothing."""
    import agon.models.loading
    from tests.conftest import TEST_WORLD, compose_config

    _, (model, tok) = tiny_base
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    monkeypatch.setattr(agon.models.loading, "cpu_has_fast_bf16", lambda: fast)
    cfg = compose_config(TEST_WORLD + ["model=qwen3_0.6b", f"model.path={tmp_path}", "model.dtype=bfloat16",
                                       "model.device=cpu"])
    said: list[str] = []
    loaded, _ = agon.models.loading.load_base(cfg.model, cfg.task, log=said.append)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    assert len([m for m in said if "model.dtype=float32" in m]) == (0 if fast else 1)


def test_a_truncated_completion_keeps_every_sampled_token_even_a_pad(policies):
    """generate pads a row only after its end of turn: a row cut at the budget was sampled in full, pad tokens too."""
    pad, end = policies.tokenizer.pad_token_id, min(policies.end_ids)
    assert pad not in policies.end_ids
    assert policies._cut([5, pad, pad]) == ((5, pad, pad), True)
    assert policies._cut([5, end, pad, pad]) == ((5, end), False)


def test_ignore_eos_runs_every_completion_to_the_budget_and_ends_the_text_at_the_turn(policies):
    """Benchmarks' equal work: 24 tokens in every row, yet the text (what the verifier and the recap read) is what
    the model wrote up to its first end of turn, which the test world writes well before 24 tokens."""
    prompts = [policies.render("1+2+3")] * 6
    torch.manual_seed(0)
    full = policies.sample(prompts, "A", max_new_tokens=24, temperature=1.0, ignore_eos=True)
    assert all(c.n_tokens == 24 and c.truncated for c in full)
    ends = [next((i for i, t in enumerate(c.token_ids) if t in policies.end_ids), None) for c in full]
    assert all(e is not None and e < 23 for e in ends), ends  # each turn ended early, and sampling went on
    for c, end in zip(full, ends):
        assert c.text == policies.tokenizer.decode(c.token_ids[:end]), c.text


# -- float32 adapters over a bfloat16 base ------------------------------------------------------------------------


def _lora_dtypes(model, adapter: str) -> set[torch.dtype]:
    from agon.models.lora import lora_parameters

    return {p.dtype for _, p in lora_parameters(model, adapter)}


@pytest.mark.parametrize("peft_casts_added_adapters", [True, False], ids=["peft_now", "peft_before_0_19"])
def test_every_adapter_is_float32_over_a_bfloat16_base(tiny_base, monkeypatch, peft_casts_added_adapters):
    """get_peft_model upcasts its adapter; PEFT before 0.19 left add_adapter's in the base's bfloat16 (replayed here
    with PEFT's own switch), where lr 1e-5 updates round away. Policies makes both float32 either way."""
    import copy
    import functools

    import peft

    from agon.models.policies import Policies
    from agon.models.tokens import Completion

    cfg, (model, tok) = tiny_base
    if not peft_casts_added_adapters:
        monkeypatch.setattr(peft.PeftModel, "add_adapter",
                            functools.partialmethod(peft.PeftModel.add_adapter, autocast_adapter_dtype=False))
    policies = Policies(copy.deepcopy(model).to(torch.bfloat16), tok, ["A", "B"], cfg.model.lora)
    for adapter in ("A", "B"):
        assert _lora_dtypes(policies.model, adapter) == {torch.float32}, adapter
        assert all(p.dtype == torch.float32 for p in policies.parameters(adapter))
    assert {p.dtype for n, p in policies.model.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    # float32 adapters on a bfloat16 base still score and backpropagate
    batch = policies.batch_tensors([policies.render("1+2")], [Completion("", (5, 6, 7), True)])
    with policies.use_adapter("B"):
        policies.token_logps(batch).sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in policies.parameters("B"))


def test_lora_to_float32_upcasts_adapters_peft_left_in_bfloat16_and_the_check_names_them(tiny_base):
    import copy

    from peft import LoraConfig, get_peft_model

    from agon.models.lora import AdapterDtypeError, check_lora_float32, lora_to_float32

    cfg, (model, _) = tiny_base
    targets = cfg.model.lora.target_modules
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets if isinstance(targets, str) else list(targets),
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(copy.deepcopy(model).to(torch.bfloat16), config, adapter_name="A",
                                autocast_adapter_dtype=False)
    peft_model.add_adapter("B", config, autocast_adapter_dtype=False)
    assert _lora_dtypes(peft_model, "A") == _lora_dtypes(peft_model, "B") == {torch.bfloat16}
    with pytest.raises(AdapterDtypeError, match="'A': \\['torch.bfloat16'\\]"):
        check_lora_float32(peft_model, ["A", "B"])
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    lora_to_float32(peft_model)
    assert _lora_dtypes(peft_model, "A") == _lora_dtypes(peft_model, "B") == {torch.float32}
    for n, p in peft_model.named_parameters():  # bfloat16 -> float32 is exact; the base is untouched
        assert torch.equal(p.detach(), before[n].to(p.dtype)) and (p.dtype == torch.bfloat16) == ("lora_" not in n)
    check_lora_float32(peft_model, ["A", "B"])
    with pytest.raises(AdapterDtypeError, match="'C': \\[\\]"):  # an adapter with no LoRA weights at all
        check_lora_float32(peft_model, ["A", "C"])


# -- no attention mask where nothing is padded ---------------------------------------------------------------------


def test_an_unpadded_row_is_scored_without_an_attention_mask_and_scores_as_in_a_padded_batch(policies):
    """A solo row (what length_batches gives a long row) reaches the decoder with no mask, so SDPA's causal path can
    run; a padded selection keeps its mask. Both give the row the same log-probs."""
    from agon.models.tokens import Completion

    prompts = [policies.render("1+2+3"), policies.render("12+30-4")]
    completions = [Completion("", tuple(range(5, 45)), True), Completion("", (8, 9, 10), True)]
    batch = policies.batch_tensors(prompts, completions)
    masks: list = []
    decoder, _ = policies._decoder_and_head()
    hook = decoder.register_forward_pre_hook(lambda m, args, kw: masks.append(kw.get("attention_mask")),
                                             with_kwargs=True)
    try:
        with torch.no_grad(), policies.use_adapter("A"):
            both = policies.token_logps(batch)
            alone = [policies.token_logps(batch, slice(i, i + 1)) for i in range(2)]
    finally:
        hook.remove()
    assert masks[0] is not None and masks[0].shape == (2, batch.prompt_ids.size(1) + 40)
    assert masks[1] is None and masks[2] is None
    torch.testing.assert_close(torch.cat(alone), both, atol=1e-5, rtol=1e-5)
