"""``trainer.*`` and ``eval.*`` settings observed where they act, for the keys no other test moved (the settings map,
``tests/settings_map.py``, names the test of every key).

Each test sets its keys away from their defaults (``TrainerConfig``, ``EvalConfig``) and checks the effect on what
the key changes: the advantages the loss weighs, the clipped loss and its KL term, the weights after a step, the
forward and ``generate`` calls, and the evaluations a run writes. The performance knobs (``micro_batch_size``,
``scoring_batch_tokens``, ``solo_row_tokens``, ``logit_chunk_tokens``, ``generation_batch_tokens``) change how, not
what, is computed: their tests show every call within its bound, the bound binding (the default would break it),
and the update equal to the one computed without the bound.
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from agon.core.config import EvalConfig, TrainerConfig
from agon.engines.hf import HFEngine
from agon.core.grpo import group_advantages, masked_mean, policy_loss
from agon.models.policies import Policies
from agon.records.recorder import Recorder
from agon.core.rewards import RoleRewards, compute_rewards
from agon.training.role_batch import RoleBatch, role_batches
from agon.game.rollout import Game, play
from agon.run import run
from agon.records.run_files import read_jsonl
from agon.tasks import build_task
from agon.training.trainer import Trainer
from tests.conftest import SMALL_RUN, TEST_WORLD, RecordingEngine, compose_config

ADAPTERS = ("A", "B")


def _trainer(cfg: Any, policies: Policies, run_dir: Path, engine: HFEngine | None = None) -> Trainer:
    return Trainer(cfg, policies, build_task(cfg.task), Recorder(run_dir), run_dir, log=lambda *_: None,
                   engine=engine)


def _played(trainer: Trainer) -> tuple[Game, dict[str, RoleRewards]]:
    """One step's game (A drafts, B challenges) on the trainer's next problems, and both roles' rewards."""
    game = play(trainer.policies, trainer.task, trainer.cfg.model, trainer.next_problems(), drafter="A",
                challenger="B", exchange="visible", group_size=trainer.t.num_generations, sampling=trainer.sampling)
    rewards = compute_rewards(game.outcome(), trainer.cfg.reward)
    return game, {"drafter": rewards.drafter, "challenger": rewards.challenger}


@pytest.fixture(scope="module")
def played(tiny_base, tmp_path_factory) -> tuple[Game, dict[str, RoleRewards]]:
    """One step's game on the test world (step_cfg's eight problems x four) and its rewards, played once for the
    tests that only update on it: an update reads what was played, not who played it."""
    cfg = compose_config(TEST_WORLD + SMALL_RUN + ["logger=none", "trainer.prompts_per_step=8",
                                                   "trainer.num_generations=4"])
    _, (model, tokenizer) = tiny_base
    policies = Policies(copy.deepcopy(model), tokenizer, list(ADAPTERS), cfg.model.lora)
    torch.manual_seed(int(os.environ.get("AGON_TEST_SEED", "0")))  # as conftest's ``seeded``, once for the module
    return _played(_trainer(cfg, policies, tmp_path_factory.mktemp("played")))


def _spread(game: Game, rewards: dict[str, RoleRewards]) -> bool:
    """Every role has some group whose rewards differ: the update has a signal in each."""
    return all(not group_advantages(r.total, game.group_ids()).zero_std.all() for r in rewards.values())


# -- the optimizer ----------------------------------------------------------------------------------------------


def test_weight_decay_shrinks_every_lora_weight_by_lr_times_decay_on_top_of_the_same_step(step_cfg, policies,
                                                                                           played, tmp_path):
    """AdamW decays each weight by lr x weight_decay of itself before its Adam step; the gradient is that of the
    same weights, so twin adapters updated on one game with and without decay differ by exactly -lr x wd x w."""
    assert TrainerConfig.weight_decay == 0.0
    policies.perturb("B", 0.02, seed=0)
    twin = copy.deepcopy(policies)
    plain = _trainer(step_cfg, policies, tmp_path / "plain")
    game, rewards = played
    assert _spread(game, rewards), "no reward spread: the step would move nothing but the decay"
    before = {a: policies.lora_state(a) for a in ADAPTERS}
    plain.update(game, rewards)
    decayed_cfg = copy.deepcopy(step_cfg)
    decayed_cfg.trainer.weight_decay = 0.25
    _trainer(decayed_cfg, twin, tmp_path / "decayed").update(game, rewards)
    shrink = step_cfg.trainer.learning_rate * 0.25
    for a in ADAPTERS:
        after, decayed = policies.lora_state(a), twin.lora_state(a)
        assert any(not torch.equal(before[a][n], after[n]) for n in after), f"adapter {a} did not move"
        assert max(float(w.abs().max()) for w in before[a].values()) * shrink > 1e-5  # the decay is visible
        for n, w in before[a].items():
            torch.testing.assert_close(decayed[n] - after[n], -shrink * w, rtol=0, atol=1e-7, msg=n)


# -- the advantages and the loss -------------------------------------------------------------------------------


def _first_pass_grads_by_hand(policies: Policies, game: Game, rewards: dict[str, RoleRewards], t: Any,
                              scale_rewards: str, adv_eps: float) -> dict[str, list[torch.Tensor]]:
    """Each adapter's gradient of its role's loss in the first pass over the game (old log-probs the current ones),
    from advantages computed here with ``group_advantages`` (checked by hand in test_grpo.py)."""
    for a in ADAPTERS:
        for p in policies.parameters(a):
            p.grad = None
    for role, adapter in (("drafter", game.drafter), ("challenger", game.challenger)):
        attempts = game.attempts(role)
        tokens = policies.batch_tensors([a.prompt for a in attempts], [a.completion for a in attempts])
        adv = group_advantages(rewards[role].total, game.group_ids(), scale_rewards, adv_eps).advantages
        with policies.use_adapter(adapter):
            logps = policies.token_logps(tokens, None, t.temperature)
        loss, _ = policy_loss(logps, logps.detach(), adv, tokens.completion_mask.float(), loss_type=t.loss_type,
                              epsilon=t.epsilon, max_completion_length=t.max_new_tokens)
        loss.backward()
    return {a: [p.grad.clone() for p in policies.parameters(a)] for a in ADAPTERS}


def _relative_gap(x: list[torch.Tensor], y: list[torch.Tensor]) -> float:
    gap = torch.stack([(a - b).norm() for a, b in zip(x, y)]).norm()
    return float(gap / torch.stack([a.norm() for a in x]).norm())


def test_scale_rewards_and_adv_eps_set_the_advantages_the_gradient_weighs(step_cfg, policies, played, tmp_path):
    """Trainer.update's gradient (no clip) equals the first-pass gradient of advantages computed at the configured
    ``scale_rewards`` and ``adv_eps``, and each setting gives its own gradient, so one read as another shows."""
    t = step_cfg.trainer
    assert (TrainerConfig.scale_rewards, TrainerConfig.adv_eps, t.num_iterations, t.beta) == ("group", 1e-4, 1, 0)
    t.max_grad_norm = 1e6  # the raw gradient, to compare with the one computed here
    policies.perturb("B", 0.02, seed=0)
    game, rewards = played
    assert _spread(game, rewards)
    expected: dict[tuple[str, float], dict[str, list[torch.Tensor]]] = {}
    # not adv_eps=0.5: a group with one right answer of four has std 0.5, so its advantages would equal scale=none's
    for scale, eps in (("group", 1e-4), ("batch", 1e-4), ("none", 1e-4), ("group", 0.3)):
        t.scale_rewards, t.adv_eps = scale, eps
        ours = copy.deepcopy(policies)
        _trainer(step_cfg, ours, tmp_path / f"{scale}-{eps}").update(game, rewards)
        expected[scale, eps] = _first_pass_grads_by_hand(copy.deepcopy(policies), game, rewards, t, scale, eps)
        for a in ADAPTERS:
            want = expected[scale, eps][a]
            scale_of = max(float(g.abs().max()) for g in want)
            assert scale_of > 0, (scale, eps, a)
            for g, h in zip([p.grad for p in ours.parameters(a)], want, strict=True):
                torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-5 * scale_of, msg=f"{scale}, {eps}, {a}")
    settings = list(expected)
    for i, x in enumerate(settings):  # apart by far more than the tolerance above, for each adapter
        for y in settings[i + 1:]:
            for a in ADAPTERS:
                assert _relative_gap(expected[x][a], expected[y][a]) > 0.01, (x, y, a)


# the keys of the clipped loss; each case moves some of them away from their defaults
LOSS_KEYS = ("loss_type", "epsilon", "epsilon_high", "beta", "use_bias_correction_kl")
LOSS_CASES = {
    "epsilon": {"epsilon": 0.05},
    "epsilon_high": {"epsilon_high": 0.5},
    "asymmetric_clip": {"epsilon": 0.1, "epsilon_high": 0.4},
    "kl_with_bias_correction": {"beta": 0.2},
    "kl_without_bias_correction": {"beta": 0.2, "use_bias_correction_kl": False},
    "grpo_loss": {"loss_type": "grpo"},
    "dr_grpo_loss": {"loss_type": "dr_grpo"},
}


def _perturbed_batch(policies: Policies, game: Game, rewards: dict[str, RoleRewards], t: Any) -> RoleBatch:
    """The challenger's rows with old log-probs off the current policy (ratios from about 0.5 to 2, so both clip
    bounds bind) and the base's as the reference (B is perturbed, so the KL is not 0)."""
    batch = next(b for b in role_batches(policies, game, rewards, slice(None), "group", 1e-4) if b.adapter == "B")
    with torch.no_grad():
        with policies.use_adapter("B"):
            current = policies.token_logps(batch.tokens, None, t.temperature)
        with policies.use_adapter(None):
            ref = policies.token_logps(batch.tokens, None, t.temperature)
    noise = 0.35 * torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(0))
    return replace(batch, old_logps=current + noise * batch.mask, ref_logps=ref)


def _loss_by_hand(policies: Policies, batch: RoleBatch, t: Any, values: dict[str, Any]
                  ) -> tuple[dict[str, float], list[torch.Tensor]]:
    """policy_loss over the whole batch at ``values`` of LOSS_KEYS: the loss, clip ratios and KL as the trainer logs
    them, and the adapter's gradient."""
    for p in policies.parameters("B"):
        p.grad = None
    with policies.use_adapter("B"):
        logps = policies.token_logps(batch.tokens, None, t.temperature)
    beta = values["beta"]
    loss, terms = policy_loss(logps, batch.old_logps, batch.advantages, batch.mask, loss_type=values["loss_type"],
                              epsilon=values["epsilon"], epsilon_high=values["epsilon_high"], beta=beta,
                              ref_logps=batch.ref_logps if beta else None,
                              use_bias_correction_kl=values["use_bias_correction_kl"],
                              max_completion_length=t.max_new_tokens, num_items_in_batch=batch.batch_tokens,
                              batch_rows=batch.batch_rows)
    loss.backward()
    stats = {"loss": loss.item(), "clip_ratio/low": masked_mean(terms.low_clipped.float(), batch.mask),
             "clip_ratio/high": masked_mean(terms.high_clipped.float(), batch.mask),
             "kl": masked_mean(terms.kl.detach(), batch.mask) if terms.kl is not None else 0.0}
    return stats, [p.grad.clone() for p in policies.parameters("B")]


def _differ(x: dict[str, float], y: dict[str, float]) -> bool:
    return any(abs(x[k] - y[k]) > 1e-3 * max(abs(x[k]), abs(y[k]), 1e-3) for k in x)


@pytest.mark.parametrize("case", list(LOSS_CASES))
def test_the_clip_the_kl_and_the_loss_type_are_those_of_the_config(step_cfg, policies, played, tmp_path, case):
    """Trainer.loss_backward on a batch whose ratios spread past both clip bounds equals policy_loss at the
    configured ``loss_type``, ``epsilon``, ``epsilon_high``, ``beta`` and ``use_bias_correction_kl`` (loss, clip
    ratios, KL, gradient), and differs from it with any one key of the case at its default, or with epsilon and
    epsilon_high swapped: each key reaches the loss as itself."""
    t = step_cfg.trainer
    defaults = {k: getattr(TrainerConfig, k) for k in LOSS_KEYS}
    for key, value in LOSS_CASES[case].items():
        assert value != defaults[key]
        t[key] = value
    policies.perturb("B", 0.02, seed=0)
    trainer = _trainer(step_cfg, policies, tmp_path)
    game, rewards = played
    batch = _perturbed_batch(policies, game, rewards, t)
    configured = {k: t[k] for k in LOSS_KEYS}

    for p in policies.parameters("B"):
        p.grad = None
    got = trainer.loss_backward(batch)
    grads = [p.grad.clone() for p in policies.parameters("B")]
    want, want_grads = _loss_by_hand(policies, batch, t, configured)
    assert want["clip_ratio/low"] > 0 and want["clip_ratio/high"] > 0, want  # both bounds bind on this batch
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
    scale = max(float(g.abs().max()) for g in want_grads)
    assert scale > 0
    for g, h in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-5 * scale)

    others = [{**configured, key: defaults[key]} for key in LOSS_CASES[case]]
    if configured["epsilon_high"] is not None:
        others.append({**configured, "epsilon": configured["epsilon_high"], "epsilon_high": configured["epsilon"]})
    for values in others:
        assert _differ(_loss_by_hand(policies, batch, t, values)[0], want), values


# -- the performance knobs: bounds obeyed, result unchanged ---------------------------------------------------------


class ForwardLog:
    """Every scoring forward pass while installed: the decoder's input shape and whether it had an attention mask,
    and the rows of every output-head call (the logit chunks)."""

    def __init__(self, policies: Policies):
        decoder, head = policies._decoder_and_head()
        self.decoder_calls: list[tuple[int, int, bool]] = []  # (rows, width, masked)
        self.head_rows: list[int] = []
        self._hooks = [
            decoder.register_forward_pre_hook(self._decoder, with_kwargs=True),
            head.register_forward_pre_hook(lambda _, args: self.head_rows.append(args[0].shape[0])),
        ]

    def _decoder(self, _module, _args, kwargs):
        rows, width = kwargs["input_ids"].shape
        self.decoder_calls.append((rows, width, kwargs["attention_mask"] is not None))

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


def _logged_update(cfg: Any, policies: Policies, run_dir: Path, game: Game, rewards: dict[str, RoleRewards]
                   ) -> tuple[dict[str, float], ForwardLog]:
    log = ForwardLog(policies)
    try:
        stats = _trainer(cfg, policies, run_dir).update(game, rewards)
    finally:
        log.close()
    return stats, log


def test_each_scoring_knob_bounds_every_forward_pass_and_leaves_the_update_unchanged(step_cfg, policies, played,
                                                                                     tmp_path):
    """With a KL term every row is scored twice per role: its reference log-probs (``Trainer._logps``) and the loss
    (``Trainer.loss_backward``). Each knob set tight, one at a time: every forward pass and every logit chunk stays
    within it, under the default the same update would break it, and the update (loss, clip ratios, KL, weights)
    equals the update with every knob at its default."""
    t = step_cfg.trainer
    t.beta = 0.1
    policies.perturb("B", 0.02, seed=0)
    start = copy.deepcopy(policies)
    game, rewards = played
    assert _spread(game, rewards)
    widths = [policies.batch_tensors([a.prompt for a in game.attempts(r)],
                                     [a.completion for a in game.attempts(r)]).widths() for r in rewards]
    rows = sum(len(w) for w in widths)
    passes = 2  # per role
    totals = sorted({p + c for w in widths for p, c in w})
    solo = totals[-2]  # the longest rows go alone, the others share micro-batches
    assert any(p + c < solo for w in widths for p, c in w)
    tight = {"micro_batch_size": 3, "scoring_batch_tokens": 100, "solo_row_tokens": solo, "logit_chunk_tokens": 5}

    loose_stats, loose = _logged_update(step_cfg, policies, tmp_path / "loose", game, rewards)
    assert sum(r for r, _, _ in loose.decoder_calls) == passes * rows
    # the defaults score each role's rows in one pass with one chunk: each tight value is broken by them
    assert max(r for r, _, _ in loose.decoder_calls) > tight["micro_batch_size"]
    assert max(r * w for r, w, _ in loose.decoder_calls) > tight["scoring_batch_tokens"]
    assert not any(r == 1 for r, _, _ in loose.decoder_calls)
    assert max(loose.head_rows) > tight["logit_chunk_tokens"]
    solo_rows = sum(p + c >= solo for w in widths for p, c in w)
    for key, value in tight.items():
        assert value != getattr(TrainerConfig, key)
        cfg = copy.deepcopy(step_cfg)
        cfg.trainer[key] = value
        twin = copy.deepcopy(start)
        stats, log = _logged_update(cfg, twin, tmp_path / key, game, rewards)
        calls = log.decoder_calls
        assert sum(r for r, _, _ in calls) == passes * rows, key  # every row scored in every pass
        if key == "micro_batch_size":
            assert max(r for r, _, _ in calls) == value
        elif key == "scoring_batch_tokens":
            assert all(r * w <= value for r, w, _ in calls if r > 1) and max(r for r, _, _ in calls) > 1
        elif key == "solo_row_tokens":
            # each row of at least solo_row_tokens alone and unpadded, without an attention mask
            alone = [w for r, w, masked in calls if r == 1 and not masked]
            assert len(alone) == passes * solo_rows and all(w >= solo for w in alone), calls
        else:
            # every scored token through the head as often as before, in more and smaller chunks
            assert max(log.head_rows) == value and sum(log.head_rows) == sum(loose.head_rows)
            assert len(log.head_rows) > len(loose.head_rows)
        for k, v in loose_stats.items():
            if "/loss" in k or "/clip_ratio" in k or "/kl" in k:
                assert stats[k] == pytest.approx(v, rel=1e-4, abs=1e-7), (key, k)
        for a in ADAPTERS:
            for (n, x), (_, y) in zip(twin.lora_state(a).items(), policies.lora_state(a).items()):
                torch.testing.assert_close(x, y, rtol=0, atol=1e-2 * t.learning_rate, msg=f"{key}: {n}")


class GenerateLog:
    """Every ``generate`` call of ``policies`` while installed: the prompts, the token width it held (widest prompt
    plus the new tokens allowed) and the completions it returned."""

    def __init__(self, policies: Policies):
        self.policies, self.real = policies, policies._generate
        self.calls: list[dict[str, Any]] = []
        policies._generate = self._generate

    def _generate(self, prompts, max_new_tokens, *args):
        out = self.real(prompts, max_new_tokens, *args)
        prompt = max(len(ids) for ids in self.policies.prompt_ids(prompts))
        self.calls.append({"prompts": list(prompts), "max_new_tokens": max_new_tokens,
                           "tokens": len(prompts) * (prompt + max_new_tokens), "completions": out})
        return out

    def take(self) -> list[dict[str, Any]]:
        calls, self.calls = self.calls, []
        return calls


def test_generation_budgets_and_batch_shape_bound_what_training_and_evaluation_sample(small_cfg, policies,
                                                                                      tmp_path):
    """A step samples prompts_per_step problems x num_generations completions of at most trainer.max_new_tokens in
    generate calls within trainer.generation_batch_tokens; an evaluation samples within its own
    eval.generation_batch_tokens, set larger: it holds more per call than the trainer's budget would allow."""
    t, e = small_cfg.trainer, small_cfg.eval
    t.prompts_per_step, t.num_generations, t.max_new_tokens = 3, 4, 8
    t.generation_batch_tokens, e.generation_batch_tokens = 60, 150
    e.n_problems, e.samples = 3, 4
    for key in ("prompts_per_step", "num_generations", "max_new_tokens", "generation_batch_tokens"):
        assert t[key] != getattr(TrainerConfig, key), key
    log = GenerateLog(policies)
    trainer = _trainer(small_cfg, policies, tmp_path)

    metrics = trainer.step()
    calls = log.take()
    sampled = [p for c in calls for p in c["prompts"]]
    rows = t.prompts_per_step * t.num_generations
    assert len(sampled) == 2 * rows  # the drafts, then one challenge per draft
    drafts = sampled[:rows]
    assert len(set(drafts)) == t.prompts_per_step
    assert drafts == [p for p in dict.fromkeys(drafts) for _ in range(t.num_generations)]
    assert {c["max_new_tokens"] for c in calls} == {t.max_new_tokens}
    completions = [x for c in calls for x in c["completions"]]
    assert all(x.n_tokens <= t.max_new_tokens for x in completions)
    assert any(x.truncated and x.n_tokens == t.max_new_tokens for x in completions)  # answers run past 8 tokens
    assert metrics["role/drafter/truncated_ratio"] > 0
    assert len(calls) > 2 and max(len(c["prompts"]) for c in calls) > 1  # the budget cut each stage, not every row
    assert all(c["tokens"] <= t.generation_batch_tokens for c in calls), calls

    trainer.evaluate("start", progress=False)
    calls = log.take()
    # A>B and B>A, two stages, and the answers of A>A and B>B
    assert sum(len(c["prompts"]) for c in calls) == (2 * 2 + 2) * e.n_problems * e.samples
    assert all(c["tokens"] <= e.generation_batch_tokens for c in calls)
    assert max(c["tokens"] for c in calls) > t.generation_batch_tokens  # not the trainer's budget
    assert len(calls) > 4  # nor unbounded: the evaluation's own budget cut its stages too


# -- evaluation: when and how much --------------------------------------------------------------------------------


def test_eval_every_and_at_start_decide_which_evaluations_a_run_writes(small_cfg):
    """Five steps with eval.every=2 and eval.at_start=false: evaluations at steps 2 and 4 during training and the
    final one at step 5, none at step 0, in eval.jsonl, metrics.jsonl, samples.jsonl and the summary."""
    t, e = small_cfg.trainer, small_cfg.eval
    t.max_steps, e.every, e.at_start = 5, 2, False
    e.n_problems, e.samples = 2, 1
    t.max_new_tokens = 8  # what is evaluated does not matter here, only when: short completions keep it fast
    assert (EvalConfig.every, EvalConfig.at_start) == (0, True) and t.max_steps != TrainerConfig.max_steps
    summary = run(small_cfg)
    run_dir = Path(small_cfg.output_dir)
    rows = read_jsonl(run_dir / "eval.jsonl")
    assert sorted({(r["phase"], r["step"]) for r in rows}) == [("final", 5), ("train", 2), ("train", 4)]
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["train/step"] for r in metrics if "eval/accuracy" in r] == [2, 4, 5]
    assert [r["train/step"] for r in metrics if "role/drafter/accuracy" in r] == [1, 2, 3, 4, 5]
    assert {r.get("phase") for r in read_jsonl(run_dir / "samples.jsonl")} == {None, "train", "final"}
    assert summary["eval/accuracy_at_start"] is None and summary["train/steps"] == 5


def test_the_diagnostic_plays_eval_diagnostic_samples_per_problem(small_cfg, policies, tmp_path):
    """An evaluation with eval.diagnostic plays the cascade at eval.samples per problem, then the diagnostic at
    eval.diagnostic_samples: three drafters and nine cross-play answerers, each over problems x diagnostic_samples
    rows, and the recap conditions over at most as many."""
    e = small_cfg.eval
    e.diagnostic, e.diagnostic_samples, e.n_problems, e.samples = True, 3, 2, 1
    small_cfg.trainer.max_new_tokens = 8  # cut answers are still answers to count (the evaluation's interpolates it)
    assert e.diagnostic_samples != EvalConfig.diagnostic_samples
    engine = RecordingEngine(policies)
    result = _trainer(small_cfg, policies, tmp_path, engine=engine).evaluate("start", progress=False)
    sizes = [len(prompts) for prompts, _, _ in engine.calls]
    cascade, diagnostic = sizes[:4], sizes[4:]
    assert cascade == [e.n_problems * e.samples] * 4  # A>B and B>A, draft and answer
    rows = e.n_problems * e.diagnostic_samples
    assert max(diagnostic) == rows and diagnostic.count(rows) >= 3 + 9, diagnostic
    assert "crossplay/A>B" in result.metrics and "recap/B/rival" in result.metrics
