"""Latent exchange (``exchange=latent``, ``agon/models/latent.py``) on the test world and on Qwen3-shaped completions.

What is checked, value by value:
- exactness: with A and B holding the same weights, the challenger's logits after the latent prefix are those of the
  prefix, prompt and completion written out as one sequence (float32, 1e-5), for rows of different prefix lengths
  batched together (an empty prefix among them); greedy sampling after the prefix picks the argmax of what scoring
  computes, so sampler and trainer read the same prefix;
- whose states: with different adapters, the prefix's keys and values are the drafter's adapter's own, row by row
  (and not the challenger's), whichever adapter is active when they are computed;
- spans: the final answer (a boxed answer; a fenced code block for code tasks) is never in the prefix, for either
  span, with several ``</think>``, thinking switched off, and a reasoning block that never closed (empty prefix);
- training: a latent step moves the challenger's adapter, and the challenger's loss alone gives the drafter's adapter
  no gradient at all; with several passes the prefix stays the drafter's as sampled;
- budgets: every generate call and every scoring micro-batch counts the prefix's tokens;
- the config check refuses engines that cannot read a prefix (naming both keys) before any model loads.
"""

from __future__ import annotations

import copy

import pytest
import torch

from agon.training.checks import validate
from agon.core.config import ConfigError
from agon.engines import EngineError, Sampling
from agon.engines.hf_continuous import HFContinuousEngine
from agon.models.latent import SPANS, Prefixes, reasoning_end
from agon.models.policies import Policies
from agon.models.tokens import Completion, Tokens
from agon.records.recorder import Recorder
from agon.game.rollout import play, render
from agon.tasks import build_task
from agon.tasks.text import visible_text
from agon.training.trainer import Trainer
from tests.conftest import compose_config

GREEDY = Sampling(max_new_tokens=32, temperature=0.0)


def _twins(policies: Policies) -> Policies:
    """A nudged off the base, B a copy of A: one policy under two names."""
    policies.perturb("A", 0.05, seed=3)
    with torch.no_grad():
        for a, b in zip(policies.parameters("A"), policies.parameters("B"), strict=True):
            b.copy_(a)
    return policies


def _latent_game(cfg, policies, span: str, problems: int = 4, group_size: int = 2, sampling=GREEDY):
    task = build_task(cfg.task)
    torch.manual_seed(0)
    game = play(policies, task, cfg.model, list(task.train_problems())[:problems], drafter="A", challenger="B",
                exchange="latent", group_size=group_size, sampling=sampling, span=span)
    return task, game


def _challenger_tokens(policies: Policies, game) -> Tokens:
    attempts = game.attempts("challenger")
    return policies.batch_tensors([a.prompt for a in attempts], [a.completion for a in attempts],
                                  [a.prefix for a in attempts])


def _written_out(policies: Policies, game) -> Tokens:
    """The challenger's rows with each prefix written into the prompt: prefix ids then prompt ids, one sequence."""
    attempts = game.attempts("challenger")
    whole = [list(a.prefix) + policies.prompt_ids([a.prompt])[0] for a in attempts]
    from agon.models.latent import left_pad

    ids, mask = left_pad(whole, policies.tokenizer.pad_token_id)
    plain = policies.batch_tensors([a.prompt for a in attempts], [a.completion for a in attempts])
    return Tokens(ids, mask, plain.completion_ids, plain.completion_mask)


@pytest.mark.parametrize("span", ["recap", "trace"])
def test_with_equal_adapters_the_latent_prefix_reads_as_the_sequence_written_out_whole(small_cfg, policies, span):
    policies = _twins(policies)
    _, game = _latent_game(small_cfg, policies, span, problems=6, sampling=Sampling(32, 1.0))
    lengths = {len(a.prefix) for a in game.attempts("challenger")}
    assert len(lengths) > 1 and max(lengths) > 0, f"premise: prefixes of several lengths, got {lengths}"
    latent = _challenger_tokens(policies, game)
    assert latent.prefix_ids is not None and latent.prefix_ids.size(1) == max(lengths)
    with torch.no_grad():
        with policies.use_adapter("B"):
            got = policies.completion_logits(latent, prefixes=Prefixes("A", ()))
        with policies.use_adapter("A"):
            expected = policies.completion_logits(_written_out(policies, game))
    scored = latent.completion_mask[:, : got.size(1)].bool()
    torch.testing.assert_close(got[scored], expected[scored], rtol=1e-5, atol=1e-5)
    # and it is not the plain prompt's: the prefix is read
    with torch.no_grad(), policies.use_adapter("B"):
        plain = Tokens(latent.prompt_ids, latent.prompt_mask, latent.completion_ids, latent.completion_mask)
        without = policies.completion_logits(plain)
    assert (without[scored] - expected[scored]).abs().max() > 1e-2


@pytest.mark.parametrize("span", ["recap", "trace"])
def test_greedy_sampling_after_the_prefix_picks_what_scoring_after_it_ranks_first(small_cfg, tiny_base, span):
    """Sampler and trainer read the same prefix: each greedy token is the argmax of the scored logits (A and B
    different, so a prefix computed under the wrong adapter, or at the wrong positions, would show)."""
    cfg, (model, tokenizer) = tiny_base
    torch.manual_seed(0)
    policies = Policies(copy.deepcopy(model), tokenizer, ["A", "B"], cfg.model.lora)
    policies.perturb("A", 0.05, seed=3)
    policies.perturb("B", 0.05, seed=4)
    _, game = _latent_game(small_cfg, policies, span)
    tokens = _challenger_tokens(policies, game)
    assert tokens.prefix_mask.any()
    with torch.no_grad(), policies.use_adapter("B"):
        logits = policies.completion_logits(tokens, prefixes=Prefixes("A", ()))
        other = policies.completion_logits(tokens, prefixes=Prefixes("B", ()))
    scored = tokens.completion_mask[:, : logits.size(1)].bool()
    picked = tokens.completion_ids[:, : logits.size(1)]
    assert torch.equal(logits.argmax(-1)[scored], picked[scored])
    assert not torch.equal(other.argmax(-1)[scored], picked[scored]), "the drafter's adapter should matter"


def test_the_prefix_states_are_the_drafters_own_and_not_the_challengers(small_cfg, tiny_base):
    cfg, (model, tokenizer) = tiny_base
    torch.manual_seed(0)
    policies = Policies(copy.deepcopy(model), tokenizer, ["A", "B"], cfg.model.lora)
    policies.perturb("A", 0.05, seed=3)
    policies.perturb("B", 0.05, seed=4)
    rows = [(29, 21, 28, 37, 25), (26, 19), (), (3, 29, 21, 28, 37, 25, 35, 25)]
    from agon.models.latent import left_pad

    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    decoder, _ = policies._decoder_and_head()
    policies.model.eval()
    with policies.use_adapter("B"):  # the challenger is active; the prefix must still be A's
        cache = policies.prefix_cache(ids, mask, Prefixes("A", tuple(rows)))
    for i, row in enumerate(rows):
        if not row:
            continue
        alone = {}
        for adapter in ("A", "B"):
            with torch.no_grad(), policies.use_adapter(adapter):
                out = decoder(input_ids=torch.tensor([row]), use_cache=True)
            alone[adapter] = out.cache if hasattr(out, "cache") else out.past_key_values
        for layer, a, b in zip(cache.layers, alone["A"].layers, alone["B"].layers, strict=True):
            for got, own, rival in ((layer.keys, a.keys, b.keys), (layer.values, a.values, b.values)):
                mine = got[i, :, ids.size(1) - len(row):]  # [kv_heads, len, head_dim], the row's real columns
                torch.testing.assert_close(mine, own[0], rtol=1e-5, atol=1e-5)
                assert (mine - rival[0]).abs().max() > 1e-3
    assert not any(t.requires_grad for layer in cache.layers for t in (layer.keys, layer.values))


# ---------------------------------------------------------------------------------------------------------------
# spans: the final answer is never in the prefix


def _spans(policies, task, prompt: str, completion: Completion) -> dict[str, tuple[int, ...]]:
    return {name: SPANS[name](policies, task, prompt, completion) for name in SPANS}


def _check_spans(policies, task, prompt: str, completion: Completion, answer: str) -> dict[str, str]:
    """Both spans of one draft, checked: the recap span is the recap's tokens, the trace span the prompt and the
    completion through the last </think>. The final answer (the last occurrence of ``answer``, which is in the visible
    text) is in neither: the recap's text lacks it, and it lies in the tokens after the trace (the reasoning may
    write the same text before committing to it: that is reasoning, and stays in the trace). The decoded spans."""
    tok = policies.tokenizer
    spans = _spans(policies, task, prompt, completion)
    recap = task.recap(completion.text)
    assert spans["recap"] == tuple(policies.prompt_ids([recap])[0] if recap else ())
    whole = tuple(policies.prompt_ids([prompt])[0]) + completion.token_ids
    trace = spans["trace"]
    assert whole[: len(trace)] == trace
    decoded = {name: tok.decode(list(ids)) for name, ids in spans.items()}
    assert decoded["trace"].endswith("</think>")
    after = tok.decode(list(whole[len(trace):]))
    full = decoded["trace"] + after
    assert full == tok.decode(list(whole)) and full.rindex(answer) >= len(decoded["trace"])
    assert answer not in decoded["recap"]
    assert visible_text(completion.text).strip() in after
    return decoded


def test_on_the_test_world_neither_span_holds_the_boxed_answer(small_cfg, policies):
    task, game = _latent_game(small_cfg, policies, "trace", problems=6, group_size=2, sampling=Sampling(32, 1.0))
    checked = 0
    for r in game.rounds:
        d = r.draft
        if visible_text(d.completion.text) is None:
            assert _spans(policies, task, d.prompt, d.completion) == {"recap": (), "trace": ()}
            continue
        box = d.completion.text[d.completion.text.rindex("\\boxed{"):]
        decoded = _check_spans(policies, task, d.prompt, d.completion, box)
        assert "\\boxed{" not in decoded["recap"]
        assert r.challenge.prefix == SPANS["trace"](policies, task, d.prompt, d.completion)
        checked += 1
    assert checked >= len(game.rounds) // 2


@pytest.fixture(scope="module")
def qwen3_policies():
    """Policies on a tiny random Qwen3-shaped model with Qwen3's tokenizer (</think> one added token)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agon.families import get_family
    from agon.bench.model_shape import build_tokenizer

    family = get_family("qwen3")
    tokenizer = build_tokenizer(family.shape)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    lora = compose_config([]).model.lora
    return Policies(model, tokenizer, ["A", "B"], lora, family=family)


REASONING = "<think>\n6*7 = 42, so maybe \\boxed{42}? Check: 7+7+7+7+7+7 = 42.\n</think>\n\n"
MATH_CASES = {
    "boxed": REASONING + "So $6 \\cdot 7 = 42$.\n\n\\boxed{42}",
    # several </think>: the visible text, and so the answer, is after the last
    "two_closings": "<think>\nfirst try</think> no wait\n</think>\n\nIt is \\boxed{42}",
}
CODE = ("<think>\nread two ints, print the sum\n</think>\n\nA helper first:\n```python\ndef add(a, b):\n"
        "    return a + b\n```\nThe program:\n```python\nprint(sum(map(int, input().split())))\n```\n")


def _draft(policies: Policies, prompt: str, text: str) -> Completion:
    """The completion a model writing ``text`` (and the end of turn) after ``prompt`` would give."""
    ids = policies.prompt_ids([text])[0] + [policies.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return policies.completion(prompt, ids)


@pytest.mark.parametrize("case", list(MATH_CASES))
def test_a_boxed_answer_is_in_neither_span(qwen3_policies, case):
    from tests.tasks.conftest import compose_task

    p = qwen3_policies
    task = build_task(compose_task("arithmetic"))
    prompt = p.render("What is 6 times 7?")
    decoded = _check_spans(p, task, prompt, _draft(p, prompt, MATH_CASES[case]), "\\boxed{42}")
    assert "boxed" not in decoded["recap"]


def test_the_final_code_block_is_in_neither_span_and_an_earlier_one_stays_in_the_recap(qwen3_policies):
    from agon.tasks.codecontests import CodeContestsTask

    p = qwen3_policies
    task = object.__new__(CodeContestsTask)  # strip_answer and recap read nothing of a loaded dataset
    prompt = p.render("Print the sum of two integers.")
    decoded = _check_spans(p, task, prompt, _draft(p, prompt, CODE), "print(sum(map(int, input().split())))")
    assert "def add(a, b)" in decoded["recap"] and "print(" not in decoded["recap"]


def test_thinking_off_traces_the_prompt_through_its_closed_block_and_an_unclosed_block_gives_no_prefix(
        qwen3_policies):
    from tests.tasks.conftest import compose_task

    p = qwen3_policies
    task = build_task(compose_task("arithmetic"))
    off = p.render("What is 6 times 7?", enable_thinking=False)
    assert off.rstrip().endswith("</think>")
    draft = _draft(p, off, "It is \\boxed{42}")
    spans = _spans(p, task, off, draft)
    assert p.tokenizer.decode(list(spans["trace"])) == off.rstrip()
    assert spans["recap"] == tuple(p.prompt_ids(["It is"])[0])
    on = p.render("What is 6 times 7?")
    cut = _draft(p, on, "<think>\n6*7 = \\boxed{42} and on and on")
    assert _spans(p, task, on, cut) == {"recap": (), "trace": ()}
    assert reasoning_end((1, 2, 3, 9, 4, 9), (9,)) == 6 and reasoning_end((1, 2), (9,)) == 0


# ---------------------------------------------------------------------------------------------------------------
# the game, training, budgets


def test_a_latent_challenger_reads_the_plain_prompt_after_its_drafters_span(small_cfg, policies):
    for span in ("recap", "trace"):
        task, game = _latent_game(small_cfg, policies, span)
        for r in game.rounds:
            assert r.challenge.prompt == r.draft.prompt == render(policies, task, small_cfg.model,
                                                                  task.user_message(r.problem))
            assert r.challenge.prefix == SPANS[span](policies, task, r.draft.prompt, r.draft.completion)
            assert not r.draft.prefix


def _trainer(cfg, policies, run_dir) -> Trainer:
    return Trainer(cfg, policies, build_task(cfg.task), Recorder(run_dir), run_dir, log=lambda *_: None)


@pytest.mark.parametrize("span", ["recap", "trace"])
def test_a_latent_step_moves_the_challenger_and_no_gradient_reaches_the_drafter_through_the_prefix(
        step_cfg, policies, tmp_path, span):
    """The challenger's loss alone, backward: every LoRA weight of the drafter's adapter is still without a gradient
    (they all require one: Policies keeps both adapters trainable), the challenger's has one. The advantages are set
    apart from zero, so the check does not rest on the test world's rewards: after a trace prefix, which its base
    never saw, the challenger is hardly ever right. Then a whole latent step (recap, where rewards spread) moves B."""
    from dataclasses import replace

    from agon.core.rewards import compute_rewards
    from agon.training.role_batch import role_batches

    step_cfg.exchange.mode, step_cfg.exchange.span = "latent", span
    policies.perturb("B", 0.02, seed=0)
    trainer = _trainer(step_cfg, policies, tmp_path)
    t = step_cfg.trainer
    game = play(policies, trainer.task, step_cfg.model, trainer.next_problems(), drafter="A", challenger="B",
                exchange="latent", group_size=t.num_generations, sampling=trainer.sampling, span=span)
    assert any(a.prefix for a in game.attempts("challenger"))
    rr = compute_rewards(game.outcome(), step_cfg.reward)
    batches = {b.role: b for b in role_batches(policies, game, {"drafter": rr.drafter, "challenger": rr.challenger},
                                               slice(None), t.scale_rewards, t.adv_eps)}
    challenger = batches["challenger"]
    assert challenger.prefixes == Prefixes("A", ()) and batches["drafter"].prefixes is None
    assert challenger.tokens.prefix_mask.any() and all(p.requires_grad for p in policies.parameters("A"))
    challenger = replace(challenger, advantages=torch.linspace(-1, 1, len(challenger)))
    for opt in trainer.optimizers.values():
        opt.zero_grad(set_to_none=True)
    trainer.loss_backward(challenger)
    assert all(p.grad is None for p in policies.parameters("A")), "a gradient reached the drafter's adapter"
    assert sum(float(p.grad.abs().sum()) for p in policies.parameters("B")) > 0
    if span == "trace":
        return
    before = {a: policies.lora_state(a) for a in ("A", "B")}
    metrics = trainer.step()  # step 0: A drafts, B challenges after A's states
    assert metrics["adapter/B/grad_norm"] > 0
    assert any(not torch.equal(before["B"][n], p) for n, p in policies.lora_state("B").items())


def test_with_several_passes_the_prefix_stays_the_drafters_as_sampled(step_cfg, policies, tmp_path):
    """From the second pass the drafter has stepped: scoring with its weights as sampled (what the trainer keeps for
    num_iterations > 1) gives the first pass's log-probs exactly, its new weights would not."""
    step_cfg.exchange.mode, step_cfg.exchange.span = "latent", "trace"
    trainer = _trainer(step_cfg, policies, tmp_path)
    _, game = _latent_game(step_cfg, policies, "trace")
    tokens = _challenger_tokens(policies, game)
    kept = policies.lora_state("A")
    with torch.no_grad(), policies.use_adapter("B"):
        first = trainer._score(tokens, Prefixes("A", ()))
    policies.perturb("A", 0.05, seed=9)  # the drafter's own update
    with torch.no_grad(), policies.use_adapter("B"):
        as_sampled = trainer._score(tokens, Prefixes("A", (), weights=kept))
        moved = trainer._score(tokens, Prefixes("A", ()))
    assert torch.equal(as_sampled, first)
    assert (moved - first).abs().max() > 1e-4
    assert all(torch.equal(policies.lora_state("A")[n], p) for n, p in policies.lora_state("A").items())


def test_every_generate_call_and_scoring_micro_batch_counts_the_prefix(small_cfg, policies, monkeypatch):
    from agon.models.tokens import length_batches

    calls = []
    real = Policies._generate

    def spy(self, prompts, max_new_tokens, *args):
        prefixes = args[-1] if args and isinstance(args[-1], Prefixes) else None
        widest_prefix = max((len(x) for x in prefixes.ids), default=0) if prefixes else None
        widest_prompt = max(len(x) for x in self.prompt_ids(prompts))
        calls.append((len(prompts), widest_prefix, widest_prompt, max_new_tokens))
        return real(self, prompts, max_new_tokens, *args)

    monkeypatch.setattr(Policies, "_generate", spy)
    budget = 300
    _, game = _latent_game(small_cfg, policies, "trace", problems=4, group_size=2,
                           sampling=Sampling(32, 1.0, batch_tokens=budget))
    challenges = [c for c in calls if c[1] is not None]
    assert len(challenges) > 1 and sum(c[0] for c in challenges) == len(game.rounds)
    for rows, prefix, prompt, new in challenges:
        assert rows == 1 or rows * (prefix + prompt + new) <= budget, (rows, prefix, prompt, new)
    tokens = _challenger_tokens(policies, game)
    widths = tokens.widths()
    assert [w[0] for w in widths] == [len(a.prefix) for a in game.attempts("challenger")]
    for part in length_batches(widths, budget=200):
        assert len(part) == 1 or len(part) * sum(max(widths[i][k] for i in part) for k in range(3)) <= 200


def test_engines_that_cannot_read_a_prefix_are_refused_before_any_model_loads_naming_both_keys(policies):
    for engine in ("vllm", "hf_continuous"):
        with pytest.raises(ConfigError) as raised:
            validate(compose_config([f"generation.engine={engine}", "exchange=latent"]))
        assert f"generation.engine={engine}" in str(raised.value) and "exchange.mode=latent" in str(raised.value)
    # a family whose layers keep more than keys and values
    with pytest.raises(ConfigError, match="exchange.mode=latent"):
        validate(compose_config(["model=qwen3_5_0.8b", "exchange=latent"]))
    with pytest.raises(ConfigError, match="exchange.span"):
        validate(compose_config(["exchange=latent", "exchange.span=answer"]))
    validate(compose_config(["exchange=latent", "exchange.span=trace"]))
    # and at run time, the engine itself says so rather than sample without the prefix
    with pytest.raises(EngineError, match="exchange.mode=latent"):
        HFContinuousEngine(policies).sample(["x"], "B", GREEDY, prefixes=Prefixes("A", ((1, 2),)))


def test_under_gradient_checkpointing_the_prefix_is_kept_and_the_gradient_is_the_same(small_cfg, tiny_base):
    """transformers drops a cache in checkpointed layers; the read-only prefix is kept (its replay in the backward
    reads the same states), so log-probs and the challenger's gradient equal those without checkpointing."""
    cfg, (model, tokenizer) = tiny_base
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        policies = Policies(copy.deepcopy(model), tokenizer, ["A", "B"], cfg.model.lora, checkpointing)
        policies.perturb("A", 0.05, seed=3)
        policies.perturb("B", 0.05, seed=4)
        _, game = _latent_game(small_cfg, policies, "trace")
        tokens = _challenger_tokens(policies, game)
        with policies.use_adapter("B"):
            logps = policies.token_logps(tokens, prefixes=Prefixes("A", ()))
            logps.sum().backward()
        results.append((logps.detach(), [p.grad.clone() for p in policies.parameters("B")]))
        assert all(p.grad is None for p in policies.parameters("A"))
    (plain, plain_grads), (checkpointed, checkpointed_grads) = results
    torch.testing.assert_close(checkpointed, plain, rtol=1e-5, atol=1e-5)
    for a, b in zip(checkpointed_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_cascade_plays_both_orders_with_the_drafters_prefix(small_cfg, policies):
    from agon.game.cascade import evaluate

    small_cfg.exchange.mode, small_cfg.exchange.span = "latent", "recap"
    policies.perturb("B", 0.02, seed=0)
    task = build_task(small_cfg.task)
    result = evaluate(policies, task, small_cfg, list(task.heldout_problems())[:3], step=0, phase="final",
                      samples=2)
    # the self-cascades read their own drafts' spans, as the cross cascades do
    assert set(result.games) == {"A>B", "B>A", "A>A", "B>B"}
    for order, game in result.games.items():
        assert (game.drafter, game.challenger) == tuple(order.split(">"))
        assert any(r.challenge.prefix for r in game.rounds)
        for r in game.rounds:
            assert r.challenge.prompt == r.draft.prompt
            assert r.challenge.prefix == SPANS["recap"](policies, task, r.draft.prompt, r.draft.completion)
