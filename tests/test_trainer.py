"""The step loop on the test world, checked against values: which adapter each reward moves, the update against a
plain reference (micro-batches, several iterations, KL), the per-adapter clip, non-finite steps, and bitwise resume.

Every test here runs real ``Trainer`` steps on a base that answers about a quarter of its problems right, and
asserts first that the step carried signal (rewards spread within groups, weights moved), so none of them can pass
on updates that do nothing.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from agon.core.grpo import group_advantages, masked_mean, policy_loss
from agon.core.methods import Turn, get_method
from agon.models.policies import Policies
from agon.records.recorder import Recorder
from agon.core.rewards import compute_rewards
from agon.training.role_batch import RoleBatch
from agon.records.run_files import read_jsonl
from agon.tasks import Verdict, build_task
from agon.training.trainer import Trainer, TrainingError
from tests.conftest import base_state


def test_rotation_schedule():
    agon = get_method("agon")
    assert [agon.turn("alternate", s) for s in range(4)] == [Turn("A", "B"), Turn("B", "A")] * 2
    assert {agon.turn("fixed", s) for s in range(4)} == {Turn("A", "B")}
    assert get_method("self_refine").turn("alternate", 1) == Turn("A", "A")
    assert get_method("grpo").turn("alternate", 1) == Turn("A", False)
    with pytest.raises(NotImplementedError, match="does not train"):
        get_method("moa").turn("alternate", 0)


def _policies(tiny_base, adapters=("A", "B")) -> Policies:
    cfg, (model, tok) = tiny_base
    p = Policies(copy.deepcopy(model), tok, list(adapters), cfg.model.lora)
    if "B" in adapters:
        p.perturb("B", 0.02, seed=0)
    return p


def _trainer(cfg, policies, run_dir) -> Trainer:
    return Trainer(cfg, policies, build_task(cfg.task), Recorder(run_dir), run_dir, log=lambda *_: None)


def _moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(before[n], p) for n, p in after.items())


def test_one_step_moves_both_adapters_and_not_the_base(step_cfg, policies, tmp_path):
    trainer = _trainer(step_cfg, policies, tmp_path)
    base, before = base_state(policies), {a: policies.lora_state(a) for a in ("A", "B")}
    metrics = trainer.step()
    for role in ("drafter", "challenger"):
        assert metrics[f"role/{role}/frac_reward_zero_std"] < 1, f"no {role} group had a reward spread"
    for a in ("A", "B"):
        assert _moved(before[a], policies.lora_state(a)), f"adapter {a} did not move"
        assert metrics[f"adapter/{a}/grad_norm"] > 0
    assert all(torch.equal(base[n], p) for n, p in base_state(policies).items())
    assert metrics["train/drafter"] == "A" and trainer.state.step == 1
    rows = step_cfg.trainer.prompts_per_step * step_cfg.trainer.num_generations
    assert metrics["train/generated_tokens"] == trainer.state.generated_tokens == pytest.approx(
        rows * (metrics["role/drafter/completion_tokens"] + metrics["role/challenger/completion_tokens"]))
    for key in ("role/drafter/accuracy", "role/challenger/reward/conversion", "train/divergence",
                "role/challenger/clip_ratio/low", "time/step_s", "train/generated_tokens"):
        assert key in metrics, key
    assert read_jsonl(tmp_path / "metrics.jsonl")[-1]["train/step"] == 1


@pytest.mark.parametrize("exchange", ["visible", "hidden", "latent"])
def test_the_exchange_mode_is_what_a_training_challenger_reads(step_cfg, policies, tmp_path, monkeypatch, exchange):
    """A training step's challengers read ``exchange.mode``'s prompt: the problem and its drafter's recap
    (visible), or the drafter's own plain prompt (hidden; latent, after the drafter's states of its recap's tokens,
    ``exchange.span``'s default). The game is caught on its way out of the real rollout."""
    import agon.training.trainer
    from agon.models.latent import SPANS
    from agon.game.rollout import render

    games = []
    real = agon.training.trainer.play_split
    monkeypatch.setattr(agon.training.trainer, "play_split", lambda *a, **k: games.append(real(*a, **k)) or games[-1])
    step_cfg.exchange.mode = exchange
    trainer = _trainer(step_cfg, policies, tmp_path)
    trainer.step()
    (game, _), = games
    assert sum(bool(r.recap) for r in game.rounds) > len(game.rounds) // 2, "premise: drafts carry recaps"
    for r in game.rounds:
        message = (trainer.task.challenge_message(r.problem, r.recap) if exchange == "visible"
                   else trainer.task.user_message(r.problem))
        assert r.challenge.prompt == render(policies, trainer.task, step_cfg.model, message)
        assert (r.challenge.prompt == r.draft.prompt) is (exchange != "visible")
        span = SPANS[step_cfg.exchange.span](policies, trainer.task, r.draft.prompt, r.draft.completion)
        assert r.challenge.prefix == (span if exchange == "latent" else ())


def test_step_metrics_are_the_games_own_rates(step_cfg, policies, tmp_path):
    """Accuracy, conversion, regression, lengths and rewards as logged equal their definitions on the game."""
    from agon.game.rollout import play

    trainer = _trainer(step_cfg, policies, tmp_path)
    game = play(policies, trainer.task, step_cfg.model, trainer.next_problems(), drafter="A", challenger="B",
                exchange="visible", group_size=4, sampling=trainer.sampling)
    rr = compute_rewards(game.outcome(), step_cfg.reward)
    m = trainer._metrics(game, {"drafter": rr.drafter, "challenger": rr.challenger}, game.outcome())
    a = [float(r.draft.verdict.correct) for r in game.rounds]
    b = [float(r.challenge.verdict.correct) for r in game.rounds]
    assert 0 < sum(a) < len(a) and 0 < sum(b) < len(b)
    after_wrong = [bi for ai, bi in zip(a, b) if not ai]
    after_right = [1 - bi for ai, bi in zip(a, b) if ai]
    assert m["train/conversion_rate"] == pytest.approx(sum(after_wrong) / len(after_wrong))
    assert m["train/regression_rate"] == pytest.approx(sum(after_right) / len(after_right))
    assert m["role/drafter/accuracy"] == pytest.approx(sum(a) / len(a))
    assert m["train/accuracy"] == m["role/challenger/accuracy"] == pytest.approx(sum(b) / len(b))
    tokens = [r.challenge.completion.n_tokens for r in game.rounds]
    assert m["train/final_trace_tokens"] == m["role/challenger/completion_tokens"] == pytest.approx(
        sum(tokens) / len(tokens))
    assert m["role/challenger/reward/mean"] == pytest.approx(float(rr.challenger.total.mean()))
    assert m["role/challenger/reward/conversion"] == pytest.approx(
        float(rr.challenger.components["conversion"].mean()))
    # a rate with no draft to condition on is null, not NaN: every draft right, then every draft wrong
    for right in (True, False):
        rounds = [replace(r, draft=replace(r.draft, verdict=Verdict(right, True, "ok" if right else "wrong")))
                  for r in game.rounds]
        same = replace(game, rounds=rounds)
        rr = compute_rewards(same.outcome(), step_cfg.reward)
        m = trainer._metrics(same, {"drafter": rr.drafter, "challenger": rr.challenger}, same.outcome())
        assert (m["train/conversion_rate"] is None) is right and (m["train/regression_rate"] is None) is not right


# cooperative with correct_weight 0 pays the drafter the challenger's correctness and the challenger nothing;
# competitive with only the conversion bonus pays the challenger b * (1 - a) and the drafter nothing
ONLY_DRAFTER_PAID = {"name": "cooperative", "correct_weight": 0.0, "team_weight": 1.0, "conversion_bonus": 0.0}
ONLY_CHALLENGER_PAID = {"name": "competitive", "correct_weight": 0.0, "conversion_bonus": 1.0, "format_weight": 0.0}


@pytest.mark.parametrize("step", [0, 1])
@pytest.mark.parametrize("reward,paid", [(ONLY_DRAFTER_PAID, "drafter"), (ONLY_CHALLENGER_PAID, "challenger")])
def test_each_roles_reward_moves_the_adapter_that_played_it_and_only_that_one(step_cfg, policies, tmp_path,
                                                                               reward, paid, step):
    for key, value in reward.items():
        step_cfg.reward[key] = value
    trainer = _trainer(step_cfg, policies, tmp_path)
    trainer.state.step = step  # step 0: A drafts, B challenges; step 1: the other way round
    drafter, challenger = ("A", "B") if step == 0 else ("B", "A")
    adapter_of = {"drafter": drafter, "challenger": challenger}
    unpaid = "challenger" if paid == "drafter" else "drafter"
    before = {a: policies.lora_state(a) for a in ("A", "B")}
    metrics = trainer.step()
    assert metrics["train/drafter"] == drafter
    assert metrics[f"role/{paid}/frac_reward_zero_std"] < 1 and metrics[f"role/{unpaid}/frac_reward_zero_std"] == 1
    assert _moved(before[adapter_of[paid]], policies.lora_state(adapter_of[paid]))
    assert not _moved(before[adapter_of[unpaid]], policies.lora_state(adapter_of[unpaid]))


def reference_update(policies: Policies, game, rewards, t, optimizers) -> dict[str, float]:
    """One GRPO update written out plainly: whole batches (no micro-batches), old and reference log-probs taken
    before the first pass, both roles' losses summed into their adapters' gradients, then per adapter a clip and a
    step. Built only from ``grpo``'s pure functions, which tests/test_grpo.py checks against TRL. Returns each
    role's loss, clip ratios and KL of the last pass, over the whole batch. A latent challenger's rows are scored
    after their prefixes under the drafter's weights as they were before the first pass, kept whatever the count of
    passes."""
    from agon.models.latent import Prefixes

    prepared, stats = [], {}
    as_sampled = Prefixes(game.drafter, (), weights=policies.lora_state(game.drafter))
    for role, adapter in (("drafter", game.drafter), ("challenger", game.challenger)):
        attempts = game.attempts(role)
        latent = any(a.prefix for a in attempts)
        batch = policies.batch_tensors([a.prompt for a in attempts], [a.completion for a in attempts],
                                       [a.prefix for a in attempts] if latent else None)
        prefixes = as_sampled if latent else None
        adv = group_advantages(rewards[role].total, game.group_ids(), t.scale_rewards, t.adv_eps).advantages
        with torch.no_grad():
            with policies.use_adapter(adapter):
                old = policies.token_logps(batch, temperature=t.temperature, prefixes=prefixes)
            with policies.use_adapter(None):
                ref = policies.token_logps(batch, temperature=t.temperature, prefixes=prefixes)
        prepared.append((role, adapter, batch, adv, old, ref, prefixes))
    for _ in range(t.num_iterations):
        for opt in optimizers.values():
            opt.zero_grad(set_to_none=True)
        for role, adapter, batch, adv, old, ref, prefixes in prepared:
            mask = batch.completion_mask.float()
            with policies.use_adapter(adapter):
                logps = policies.token_logps(batch, temperature=t.temperature, prefixes=prefixes)
            loss, terms = policy_loss(logps, old, adv, mask, loss_type=t.loss_type, epsilon=t.epsilon,
                                      epsilon_high=t.epsilon_high, beta=t.beta, ref_logps=ref if t.beta else None,
                                      use_bias_correction_kl=t.use_bias_correction_kl,
                                      max_completion_length=t.max_new_tokens)
            loss.backward()
            stats |= {f"role/{role}/loss": loss.item(),
                      f"role/{role}/clip_ratio/low": masked_mean(terms.low_clipped.float(), mask),
                      f"role/{role}/clip_ratio/high": masked_mean(terms.high_clipped.float(), mask)}
            if t.beta:
                stats[f"role/{role}/kl"] = masked_mean(terms.kl.detach(), mask)
        for name, opt in optimizers.items():
            torch.nn.utils.clip_grad_norm_(policies.parameters(name), t.max_grad_norm)
            opt.step()
    return stats


UPDATE_CASES = {
    "plain": {},
    "micro_batches": {"micro_batch_size": 4},
    "two_iterations": {"num_iterations": 2},
    "kl_to_the_base": {"beta": 0.1},
    "kl_micro_batches_two_iterations": {"beta": 0.1, "micro_batch_size": 4, "num_iterations": 2},
    "grpo_loss_micro_batches": {"loss_type": "grpo", "micro_batch_size": 8},
    "dr_grpo_loss_epsilon_high": {"loss_type": "dr_grpo", "epsilon_high": 0.28, "num_iterations": 2},
    "self_refine": {"method": "self_refine"},
    # the challenger reads the drafter's states: micro-batches of rows with prefixes of their own lengths, the
    # reference pass after the same prefix, and from the second pass the drafter's weights as sampled
    "latent_recap": {"exchange": "latent", "micro_batch_size": 4},
    "latent_trace_kl_two_iterations": {"exchange": "latent", "span": "trace", "beta": 0.1, "num_iterations": 2},
}


@pytest.mark.parametrize("case", list(UPDATE_CASES))
def test_the_update_equals_a_plain_reference(step_cfg, tiny_base, tmp_path, case):
    """Trainer.update == reference_update on twin adapters, gradients and weights, with the clip active."""
    overrides = dict(UPDATE_CASES[case])
    method = overrides.pop("method", "agon")
    exchange, span = overrides.pop("exchange", "visible"), overrides.pop("span", "recap")
    step_cfg.method.name = method
    t = step_cfg.trainer
    # a clip far below the raw gradient norm, so every update is clipped and a missing or shared clip shows. With 8
    # problems most groups can have no reward spread, and then a second iteration's gradient was seen at 0.0046:
    # 1e-4 keeps the clip active on any batch that has a gradient at all
    t.max_grad_norm = 1e-4
    for key, value in overrides.items():
        t[key] = value
    adapters = get_method(method).adapters
    torch.manual_seed(0)
    ours, twin = _policies(tiny_base, adapters), _policies(tiny_base, adapters)
    with torch.no_grad():  # PEFT draws lora_A from the global RNG: make the twin start from the same weights
        for a in adapters:
            for p, q in zip(twin.parameters(a), ours.parameters(a), strict=True):
                p.copy_(q)
    trainer = _trainer(step_cfg, ours, tmp_path)
    turn = get_method(method).turn("alternate", 0)
    from agon.game.rollout import play

    game = play(ours, trainer.task, step_cfg.model, trainer.next_problems(), drafter=turn.drafter,
                challenger=turn.challenger,
                exchange=exchange, group_size=t.num_generations, sampling=trainer.sampling, span=span)
    assert any(a.prefix for a in game.attempts("challenger")) is (exchange == "latent")
    rewards = compute_rewards(game.outcome(), step_cfg.reward)
    rewards = {"drafter": rewards.drafter, "challenger": rewards.challenger}
    assert any(not group_advantages(rewards[r].total, game.group_ids()).zero_std.all() for r in rewards)

    stats = trainer.update(game, rewards)
    optimizers = {a: torch.optim.AdamW(twin.parameters(a), lr=t.learning_rate, weight_decay=t.weight_decay)
                  for a in adapters}
    expected = reference_update(twin, game, rewards, t, optimizers)

    for a in adapters:
        assert stats[f"adapter/{a}/grad_norm"] > 2 * t.max_grad_norm, stats  # the clip must be active
        grads = [p.grad for p in ours.parameters(a)]
        # clipped per adapter: each adapter's own gradient norm is the clip, whatever the other's was (torch scales by
        # max_norm / (norm + 1e-6), which is 2e-4 short of max_norm at a raw norm of 0.005)
        raw = stats[f"adapter/{a}/grad_norm"]
        torch.testing.assert_close(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])),
                                   torch.tensor(t.max_grad_norm * raw / (raw + 1e-6)), rtol=1e-5, atol=0)
        for g, h in zip(grads, [p.grad for p in twin.parameters(a)]):
            torch.testing.assert_close(g, h, rtol=1e-4, atol=2e-5 * t.max_grad_norm)
        # Adam turns a gradient entry near zero into a step of any size up to lr, so rounding noise in such an
        # entry (micro-batches sum in another order) moves the weight by a fraction of lr: compare at 1% of lr
        for (n, x), (_, y) in zip(ours.lora_state(a).items(), twin.lora_state(a).items()):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-2 * t.learning_rate, msg=f"{case}: {n}")
    # the logged loss, clip ratios and KL are the whole batch's, however it was split
    assert set(expected) <= set(stats)
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
    if t.num_iterations > 1:
        assert any(expected[f"role/{r}/clip_ratio/{side}"] > 0 for r in rewards for side in ("low", "high"))


def test_non_finite_gradients_skip_the_whole_update_and_then_abort(step_cfg, policies, tmp_path):
    step_cfg.trainer.max_bad_steps = 2
    trainer = _trainer(step_cfg, policies, tmp_path)
    poisoned = policies.parameters("B")[0]

    def poison():
        return poisoned.register_hook(lambda g: torch.full_like(g, float("nan")))

    hook = poison()
    before = {a: policies.lora_state(a) for a in ("A", "B")}
    metrics = trainer.step()
    assert metrics["train/skipped"] == 1.0 and trainer.state.bad_steps == 1
    # A's gradient was finite, but a step is all or nothing: neither adapter moved
    assert not any(_moved(before[a], policies.lora_state(a)) for a in ("A", "B"))
    hook.remove()
    metrics = trainer.step()  # a good step resets the count
    assert "train/skipped" not in metrics and trainer.state.bad_steps == 0
    hook = poison()
    trainer.step()
    assert trainer.state.bad_steps == 1
    kept = {a: policies.lora_state(a) for a in ("A", "B")}
    with pytest.raises(TrainingError, match="max_bad_steps"):
        trainer.step()
    hook.remove()
    for a in ("A", "B"):
        assert not _moved(kept[a], policies.lora_state(a))
        assert all(torch.isfinite(p).all() for p in policies.parameters(a))


def test_verifier_failures_are_counted_per_role_and_in_total(step_cfg, policies, tmp_path):
    from tests.test_rollout import FlakyVerifierTask

    trainer = Trainer(step_cfg, policies, FlakyVerifierTask(step_cfg.task, fail_rows={1, 6, 7}), Recorder(tmp_path),
                      tmp_path, log=lambda *_: None)
    metrics = trainer.step()
    assert metrics["role/drafter/verifier_failures"] == 3 and metrics["role/challenger/verifier_failures"] == 0
    assert metrics["verifier/failures_total"] == trainer.state.verifier_failures == 3
    # a failed row is not scored as wrong: accuracy is over the rows the verifier could score, NaN rows as 0
    assert read_jsonl(tmp_path / "metrics.jsonl")[-1]["verifier/failures_total"] == 3


def test_k_steps_then_resume_then_k_more_equal_2k_straight_bitwise(step_cfg, tiny_base, tmp_path):
    """Weights that moved, both optimizers' state, the RNG and the data position all come back exactly."""
    def fresh(path):
        p = _policies(tiny_base)
        return _trainer(step_cfg, p, path), p

    torch.manual_seed(0)
    straight, p1 = fresh(tmp_path / "straight")
    init = {a: p1.lora_state(a) for a in ("A", "B")}
    straight_metrics = [straight.step() for _ in range(4)]
    straight_rng = torch.get_rng_state()

    torch.manual_seed(0)
    first, _ = fresh(tmp_path / "resumed")
    for _ in range(2):
        first.step()
    ckpt = first.save_checkpoint()
    assert (tmp_path / "resumed" / "checkpoints" / "latest").read_text() == ckpt.name
    torch.manual_seed(123)  # whatever the RNG holds now, the checkpoint's state must win
    second, p2 = fresh(tmp_path / "resumed")
    second.load_checkpoint(ckpt)
    for name, opt in second.optimizers.items():
        assert opt.state, f"optimizer {name} came back empty"
    resumed_metrics = [second.step() for _ in range(2)]

    assert second.state.step == straight.state.step == 4 and second.state.cursor == straight.state.cursor
    for a in ("A", "B"):
        assert _moved(init[a], p1.lora_state(a)), f"adapter {a} never moved: the comparison would be empty"
        for (n, x), (_, y) in zip(p1.lora_state(a).items(), p2.lora_state(a).items()):
            assert torch.equal(x, y), n
        for s, r in zip(straight.optimizers[a].state.values(), second.optimizers[a].state.values()):
            assert all(torch.equal(s[k], r[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    for s, r in zip(straight_metrics[2:], resumed_metrics):
        assert s["train/accuracy"] == r["train/accuracy"] and s["role/drafter/reward/mean"] == r[
            "role/drafter/reward/mean"]
    assert torch.equal(torch.get_rng_state(), straight_rng)
    steps = [r["train/step"] for r in read_jsonl(tmp_path / "resumed" / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4]


def test_divergence_is_zero_for_twins_and_one_for_opposites(policies):
    """||dW_A - dW_B|| / (||dW_A|| + ||dW_B||) summed over modules: 0 for equal adapters, 1 for dW_B = -dW_A."""
    policies.perturb("A", 1e-4, seed=1)  # small deltas: the ratio must not depend on their scale
    a_weights = {n.replace(".A.weight", ""): p for n, p in policies.model.named_parameters()
                 if "lora_" in n and n.endswith(".A.weight")}
    with torch.no_grad():
        for n, p in policies.model.named_parameters():
            if "lora_" in n and n.endswith(".B.weight"):
                p.copy_(a_weights[n.replace(".B.weight", "")])
    assert policies.divergence() == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():  # negate B's lora_B: dW_B = B_B A_B = -dW_A
        for n, p in policies.model.named_parameters():
            if "lora_B" in n and n.endswith(".B.weight"):
                p.neg_()
    assert policies.divergence() == pytest.approx(1.0, abs=1e-6)


# -- micro-batches by length ----------------------------------------------------------------------------------------

# completion lengths of a length-skewed batch: three long rows among short ones, in no order
SKEWED = [6, 180, 3, 9, 120, 2, 7, 200, 5, 4]
# a budget that holds the short rows together, and solo rows from 100 tokens (the long three)
SKEWED_BUDGET, SKEWED_SOLO = 400, 100


def _skewed_batch(policies: Policies, adapter: str = "B") -> RoleBatch:
    """Random completion tokens (so every row scores differently) under prompts of several lengths."""
    from agon.models.tokens import Completion

    gen = torch.Generator().manual_seed(0)
    vocab = len(policies.tokenizer)
    completions = [Completion("", tuple(torch.randint(5, vocab, (n,), generator=gen).tolist()), True)
                   for n in SKEWED]
    prompts = [policies.render(q) for q in ("1+2", "12+30-4", "3+3+3", "40-1", "2+2+2+2")] * 2
    tokens = policies.batch_tensors(prompts, completions)
    n = len(SKEWED)
    return RoleBatch(role="drafter", adapter=adapter, tokens=tokens, advantages=torch.randn(n, generator=gen),
                     group_ids=torch.arange(n) // 2, batch_tokens=float(tokens.completion_mask.sum()), batch_rows=n,
                     frac_zero_std=0.0)


def _row_by_row(policies: Policies, batch: RoleBatch, adapter: str | None, t) -> torch.Tensor:
    """[b, T] each row's log-probs scored alone, the reference a permutation cannot fool."""
    with torch.no_grad(), policies.use_adapter(adapter):
        return torch.cat([policies.token_logps(batch.tokens, slice(i, i + 1), t.temperature, t.logit_chunk_tokens,
                                               t.top_k, t.top_p) for i in range(len(batch))])


def test_old_and_ref_logps_come_back_in_the_batchs_row_order(step_cfg, policies, tmp_path):
    """Micro-batches sorted by length permute the rows; Trainer._logps must put every row back in its place."""
    t = step_cfg.trainer
    t.scoring_batch_tokens, t.solo_row_tokens = SKEWED_BUDGET, SKEWED_SOLO
    policies.perturb("B", 0.02, seed=0)
    trainer = _trainer(step_cfg, policies, tmp_path)
    batch = _skewed_batch(policies)
    parts = list(batch.micro_batches(SKEWED_BUDGET, t.micro_batch_size, SKEWED_SOLO))
    assert [len(mb) for mb in parts] == [1, 1, 1, 7]
    assert not torch.equal(torch.cat([mb.rows for mb in parts]), torch.arange(len(batch)))
    for adapter in ("B", None):
        torch.testing.assert_close(trainer._logps(batch, adapter), _row_by_row(policies, batch, adapter, t),
                                   atol=1e-5, rtol=1e-5)


def test_the_gradient_of_a_length_skewed_batch_does_not_depend_on_how_it_is_cut(step_cfg, policies, tmp_path):
    """The loss is normalised by the whole batch's tokens and rows: sorted micro-batches with solo long rows give the
    gradient, loss and clip ratios of the same batch in one micro-batch, up to the order of float sums. Old and
    reference log-probs off the current policy make the ratio clip and the KL count, so a row paired with another
    row's old or reference log-probs changes the gradient."""
    t = step_cfg.trainer
    t.beta = 0.1
    policies.perturb("B", 0.02, seed=0)
    trainer = _trainer(step_cfg, policies, tmp_path)
    batch = _skewed_batch(policies)
    gen = torch.Generator().manual_seed(1)
    old = _row_by_row(policies, batch, "B", t) + 0.3 * torch.randn(batch.mask.shape, generator=gen) * batch.mask
    batch = replace(batch, old_logps=old, ref_logps=_row_by_row(policies, batch, None, t))
    grads, stats = {}, {}
    for name, budget, solo in (("one", 10**6, 10**6), ("by_length", SKEWED_BUDGET, SKEWED_SOLO)):
        t.scoring_batch_tokens, t.solo_row_tokens = budget, solo
        assert len(list(batch.micro_batches(budget, t.micro_batch_size, solo))) == (1 if name == "one" else 4)
        for p in policies.parameters("B"):
            p.grad = None
        stats[name] = trainer.loss_backward(batch)
        grads[name] = [p.grad.clone() for p in policies.parameters("B")]
    scale = max(float(g.abs().max()) for g in grads["one"])
    assert scale > 0 and stats["one"]["clip_ratio/low"] + stats["one"]["clip_ratio/high"] > 0
    for g, h in zip(grads["one"], grads["by_length"], strict=True):
        torch.testing.assert_close(h, g, rtol=1e-4, atol=1e-5 * scale)
    for key, value in stats["one"].items():
        assert stats["by_length"][key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
