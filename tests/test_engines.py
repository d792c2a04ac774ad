"""Sampling engines: the ``hf`` engine, the sampler-mismatch correction in the trainer, and vLLM (marker ``vllm``).

The ``vllm`` tests run real vLLM on the test world (``make test-vllm``: vLLM's CPU build in ``.venv-vllm``, as a
worker process); they fail, not skip, when vLLM is missing, since nothing but that target selects them. Each is
bounded in time by an alarm as well as by the worker's own start timeout.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import signal

import pytest
import torch
from omegaconf import OmegaConf

from agon.records import run_files
from agon.core.config import ConfigError
from agon.engines import ENGINES, Sampling, build_engine
from agon.engines.hf import HFEngine
from agon.models.policies import Policies
from agon.models.tokens import Completion
from agon.records.recorder import Recorder
from agon.training.role_batch import role_batches, sampler_logps
from agon.tasks import build_task
from agon.training.trainer import Trainer
from tests.conftest import SMALL_RUN, TEST_WORLD, compose_config

VLLM = ["generation.engine=vllm", "generation.vllm.start_timeout_s=300"]
# the test world's own temperature (1.0) and Qwen3's model-card temperature
TEMPERATURES = [1.0, 0.6]


def _prompts(cfg, policies: Policies, n: int) -> list[str]:
    task = build_task(cfg.task)
    return [policies.render(task.user_message(p)) for p in list(task.heldout_problems())[:n]]


def _fresh_policies(tiny_base, strength: float = 0.02) -> Policies:
    cfg, (model, tokenizer) = tiny_base
    policies = Policies(copy.deepcopy(model), tokenizer, ["A", "B"], cfg.model.lora)
    policies.perturb("A", strength, seed=1)
    policies.perturb("B", strength, seed=2)
    return policies


def _trainer_logps(policies: Policies, prompts, completions, adapter, temperature) -> tuple[torch.Tensor, ...]:
    """(trainer's log-probs, engine's log-probs, mask) of the completions' tokens, [B, T] each."""
    batch = policies.batch_tensors(prompts, completions)
    with torch.no_grad(), policies.use_adapter(adapter):
        ours = policies.token_logps(batch, None, temperature)
    theirs = sampler_logps([c.logps for c in completions], ours.size(1))
    return ours, theirs, batch.completion_mask.bool()


# -- without vLLM ---------------------------------------------------------------------------------------------------


def test_the_engines_are_looked_up_by_name_and_a_wrong_name_is_a_config_error():
    from agon.training.checks import validate

    assert {"hf", "vllm"} <= set(ENGINES)
    with pytest.raises(ConfigError, match="generation.engine='vlm'"):
        validate(compose_config(["generation.engine=vlm"]))


def test_the_hf_engine_is_policies_sample_and_temperature_zero_is_greedy(tiny_base):
    policies = _fresh_policies(tiny_base, 0.3)
    cfg = tiny_base[0]
    prompts = _prompts(cfg, policies, 6)
    greedy = Sampling(max_new_tokens=24, temperature=0)
    first = build_engine(compose_config(TEST_WORLD), policies).sample(prompts, "A", greedy)
    torch.manual_seed(123)  # greedy decoding does not read the RNG
    again = HFEngine(policies).sample(prompts, "A", greedy)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert all(c.logps is None for c in first)  # hf reports no sampler log-probs: no correction applies


def test_asking_for_vllm_where_it_is_not_installed_fails_before_any_model_loads(tmp_path, monkeypatch):
    from agon.run import run

    monkeypatch.setenv("AGON_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("AGON_VLLM_PYTHON", raising=False)
    cfg = compose_config(["logger=none", f"output_dir={tmp_path / 'run'}", "generation.engine=vllm",
                          f"generation.vllm.python={tmp_path / 'no-venv' / 'bin' / 'python'}"])
    with pytest.raises(ConfigError) as err:
        run(cfg)
    message = str(err.value)
    assert "generation.engine=vllm" in message and "make vllm-install" in message
    assert "no-venv" in message
    assert not (tmp_path / "cache").exists()  # the offline world was not even built


def test_a_workers_gpu_is_its_ranks_even_when_the_scheduler_set_cuda_visible_devices():
    """SLURM sets CUDA_VISIBLE_DEVICES for the job; rank 1's model is on cuda:1, the second GPU of that list, and its
    worker must see that GPU alone (inheriting the list put every rank's worker on the first GPU)."""
    from agon.engines import EngineError
    from agon.engines.vllm_engine import worker_env, worker_gpu

    assert worker_gpu(1, "4,6,7") == "6"
    assert worker_gpu(None, "4,6,7") == "4"
    assert worker_gpu(2, None) == worker_gpu(2, "") == "2"
    with pytest.raises(EngineError, match="cuda:3"):
        worker_gpu(3, "4,6")
    inherited = {"CUDA_VISIBLE_DEVICES": "4,6,7", "RANK": "1", "VLLM_CPU_KVCACHE_SPACE": "8", "HOME": "/root"}
    env = worker_env(inherited, {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_X": "y"},
                     {"CUDA_VISIBLE_DEVICES": worker_gpu(1, inherited["CUDA_VISIBLE_DEVICES"])})
    assert env["CUDA_VISIBLE_DEVICES"] == "6"  # forced over the inherited list
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "8" and env["VLLM_X"] == "y"  # the user's own setting wins a default
    assert "RANK" not in env and env["HOME"] == "/root"


def test_a_worker_started_under_torchrun_sees_none_of_the_launchers_variables(tmp_path):
    """torchrun (and accelerate launch, which runs it) gives every rank torch-elastic's variables; a worker that
    inherited TORCHELASTIC_USE_AGENT_STORE=True would start vLLM's own one-process group as a client of a store
    nobody serves and wait out its timeout. The environment is a real two-process torchrun's."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from agon.engines.vllm_engine import worker_env

    dump = "import json, os; json.dump(dict(os.environ), open(os.environ['OUT'] + os.environ['RANK'], 'w'))"
    torchrun = Path(sys.executable).with_name("torchrun")
    subprocess.run([str(torchrun), "--nproc_per_node=2", "--no-python", sys.executable, "-c", dump], check=True,
                   env={**os.environ, "OUT": str(tmp_path / "env")}, capture_output=True, timeout=120)
    for rank in ("0", "1"):
        inherited = json.loads((tmp_path / f"env{rank}").read_text())
        assert inherited["TORCHELASTIC_USE_AGENT_STORE"] == "True" and inherited["RANK"] == rank  # the premise
        env = worker_env(inherited, {}, {})
        launcher = sorted(k for k in env if k.startswith(("TORCHELASTIC_", "ROLE_", "GROUP_")) or k in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
        assert launcher == [], launcher
        assert env["PATH"] == inherited["PATH"]


def test_the_fallback_engine_samples_when_vllm_is_installed_nowhere_and_says_so(tiny_base, tmp_path):
    from agon.training.checks import validate
    from agon.engines import engine_name
    from agon.engines.hf_continuous import HFContinuousEngine
    from agon.training.preflight import check_engine

    missing = f"generation.vllm.python={tmp_path / 'none' / 'python'}"
    cfg = compose_config(TEST_WORLD + ["generation.engine=vllm", "generation.fallback=hf_continuous", missing])
    validate(cfg)
    check_engine(cfg)  # no error: the fallback will sample
    assert engine_name(cfg) == "hf_continuous"
    said = []
    engine = build_engine(cfg, _fresh_policies(tiny_base), log=said.append)
    assert isinstance(engine, HFContinuousEngine) and "generation.fallback=hf_continuous" in said[0]
    without = compose_config(TEST_WORLD + ["generation.engine=vllm", missing])
    with pytest.raises(ConfigError, match="generation.fallback=hf_continuous"):
        check_engine(without)
    with pytest.raises(ConfigError, match="generation.fallback='vllm'"):
        validate(compose_config(["generation.engine=vllm", "generation.fallback=vllm"]))


def test_the_engines_stop_on_every_end_of_turn_the_generation_config_names():
    """Qwen3's generation config ends a turn on <|im_end|> and <|endoftext|>: both engines stop on both."""
    from types import SimpleNamespace

    from agon.families import get_family
    from agon.bench.model_shape import build_tokenizer

    qwen3 = get_family("qwen3")
    tokenizer = build_tokenizer(qwen3.shape)
    im_end, endoftext = (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    assert qwen3.end_of_turn_ids(tokenizer, SimpleNamespace(eos_token_id=[im_end, endoftext])) >= {im_end, endoftext}
    assert endoftext in qwen3.end_of_turn_ids(tokenizer, SimpleNamespace(eos_token_id=endoftext))


@ENGINES.register("hf_skewed_for_test")
class SkewedEngine(HFEngine):
    """hf's completions, reporting as the sampler's log-probs the trainer's own plus ``SKEW`` per token: a sampler
    that disagrees with the trainer by a known amount."""

    SKEW = 0.25

    def sample(self, prompts, adapter, sampling, on_sampled=None) -> list[Completion]:
        out = super().sample(prompts, adapter, sampling, on_sampled)
        batch = self.policies.batch_tensors(prompts, out)
        with torch.no_grad(), self.policies.use_adapter(adapter):
            logps = self.policies.token_logps(batch, None, sampling.temperature)
        return [dataclasses.replace(c, logps=tuple((logps[i, : c.n_tokens] + self.SKEW).tolist()))
                for i, c in enumerate(out)]


@pytest.mark.parametrize("mode, moves", [("token_truncate", True), ("sequence_mask", False)])
def test_the_trainer_measures_the_sampler_mismatch_and_corrects_for_it(step_cfg, tiny_base, tmp_path, mode, moves):
    """Every token's sampler log-prob is 0.25 above the trainer's: the logged difference is 0.25 (mean and max), the
    token ratio exp(-0.25) truncated at clip_min=0.9 is 0.9, and a sequence's ratio exp(-0.25 n) falls below 0.9,
    so sequence_mask leaves every row out of the loss and the adapters do not move."""
    OmegaConf.update(step_cfg, "generation.engine", "hf_skewed_for_test")
    OmegaConf.update(step_cfg, "trainer.vllm_importance_sampling_mode", mode)
    OmegaConf.update(step_cfg, "trainer.vllm_importance_sampling_clip_min", 0.9)
    policies = _fresh_policies(tiny_base)
    trainer = Trainer(step_cfg, policies, build_task(step_cfg.task), Recorder(tmp_path), tmp_path,
                      log=lambda *_: None)
    assert isinstance(trainer.engine, SkewedEngine)
    before = policies.digest()
    m = trainer.step()
    for role in ("drafter", "challenger"):
        assert m[f"role/{role}/sampling/sampling_logp_difference/mean"] == pytest.approx(0.25, abs=1e-4)
        assert m[f"role/{role}/sampling/sampling_logp_difference/max"] == pytest.approx(0.25, abs=1e-4)
        if mode == "token_truncate":
            assert m[f"role/{role}/sampling/importance_sampling_ratio/min"] == pytest.approx(0.9)
            assert m[f"role/{role}/sampling/importance_sampling_ratio/mean"] == pytest.approx(0.9)
        else:
            assert m[f"role/{role}/sampling/importance_sampling_ratio/max"] == 0.0
    assert (policies.digest() != before) == moves


@ENGINES.register("hf_banded_for_test")
class BandedEngine(HFEngine):
    """hf's completions, reporting as the sampler's log-probs the trainer's own shifted on every token of row i by
    ``SHIFTS[i % 3]``: the trainer-to-sampler ratio is e^-0.5 = 0.61 per token on rows 0, 3, ... (below any bound
    above 0.61), e^0.5 = 1.65 on rows 1, 4, ... (above), 1 on rows 2, 5, ...; ``lengths`` keeps each call's rows'
    token counts, from which each mode's weights follow by hand."""

    SHIFTS = (0.5, -0.5, 0.0)
    lengths: list[list[int]] = []

    def sample(self, prompts, adapter, sampling, on_sampled=None) -> list[Completion]:
        out = super().sample(prompts, adapter, sampling, on_sampled)
        batch = self.policies.batch_tensors(prompts, out)
        with torch.no_grad(), self.policies.use_adapter(adapter):
            logps = self.policies.token_logps(batch, None, sampling.temperature)
        BandedEngine.lengths.append([c.n_tokens for c in out])
        return [dataclasses.replace(c, logps=tuple((logps[i, : c.n_tokens] + self.SHIFTS[i % 3]).tolist()))
                for i, c in enumerate(out)]


# the bounds, and each band's weight (ratio 0.61, 1.65, 1) under each mode, by hand: truncated to the bound it
# crosses, or left out of the loss
CLIP_MIN, CLIP_MAX = 0.8, 1.25
BY_HAND = {"token_truncate": (0.8, 1.25, 1.0), "token_mask": (0.0, 0.0, 1.0),
           "sequence_truncate": (0.8, 1.25, 1.0), "sequence_mask": (0.0, 0.0, 1.0)}


@pytest.mark.parametrize("mode", [*BY_HAND, "off"])
def test_each_correction_mode_bounds_the_weights_by_clip_min_and_clip_max_as_worked_out_by_hand(
        step_cfg, tiny_base, tmp_path, mode):
    """One band of rows below clip_min, one above clip_max, one inside, per token and per sequence: the weights of
    each mode are its own by-hand values (token modes averaged over tokens, sequence modes over rows), so the bounds
    passed swapped (clamp(min=1.25, max=0.8) is 0.8 everywhere; a mask between them drops every row), either bound
    dropped (a weight of 0.61 or 1.65 appears) or another mode all change them. ``off``
    (vllm_importance_sampling_correction=false): the mismatch is still measured, and no weight is applied."""
    for key, value in [("generation.engine", "hf_banded_for_test"), ("trainer.prompts_per_step", 4),
                       ("trainer.num_generations", 3), ("trainer.vllm_importance_sampling_clip_min", CLIP_MIN),
                       ("trainer.vllm_importance_sampling_clip_max", CLIP_MAX),
                       ("trainer.vllm_importance_sampling_mode", "token_truncate" if mode == "off" else mode),
                       ("trainer.vllm_importance_sampling_correction", mode != "off")]:
        OmegaConf.update(step_cfg, key, value)
    BandedEngine.lengths.clear()
    trainer = Trainer(step_cfg, _fresh_policies(tiny_base), build_task(step_cfg.task), Recorder(tmp_path), tmp_path,
                      log=lambda *_: None)
    m = trainer.step()
    # one call per role, the drafter's first, each with rows of all three bands
    assert len(BandedEngine.lengths) == 2 and all(len(n) == 12 for n in BandedEngine.lengths)
    for role, lengths in zip(("drafter", "challenger"), BandedEngine.lengths):
        stats = {k.split("/", 3)[-1]: v for k, v in m.items() if k.startswith(f"role/{role}/sampling/")}
        assert stats["sampling_logp_difference/max"] == pytest.approx(0.5, abs=1e-4)
        if mode == "off":
            assert not any(k.startswith("importance_sampling_ratio") for k in stats)
            continue
        weights = BY_HAND[mode]
        if mode.startswith("token"):  # one weight per token
            mean = sum(n * weights[i % 3] for i, n in enumerate(lengths)) / sum(lengths)
        else:  # one weight per row
            mean = sum(weights[i % 3] for i in range(len(lengths))) / len(lengths)
        assert stats["importance_sampling_ratio/mean"] == pytest.approx(mean, abs=1e-4)
        assert stats["importance_sampling_ratio/min"] == pytest.approx(min(weights), abs=1e-4)
        assert stats["importance_sampling_ratio/max"] == pytest.approx(max(weights), abs=1e-4)


def test_role_batches_carry_the_engines_log_probs_only_when_every_row_has_them(tiny_base):
    from agon.core.rewards import RoleRewards
    from agon.game.rollout import Attempt, Game, Round
    from agon.tasks import Problem, Verdict

    policies = _fresh_policies(tiny_base)
    verdict = Verdict(correct=True, format_ok=True)
    problem = Problem(id="1+1", question="1+1", answer="2")

    def game(logps):
        rounds = [Round(problem, Attempt("x", Completion("t", ids, False, logps=lp), verdict), "")
                  for ids, lp in zip(((5, 6, 7), (5,)), logps)]
        return Game(rounds, "A", None, group_size=2)

    rewards = {"drafter": RoleRewards({"correct": torch.tensor([1.0, 0.0])})}
    [batch] = role_batches(policies, game([(-0.5, -1.0, -2.0), (-3.0,)]), rewards, slice(None), "group", 1e-4)
    assert torch.equal(batch.sampler_logps, torch.tensor([[-0.5, -1.0, -2.0], [-3.0, 0.0, 0.0]]))
    assert batch[slice(1, 2)].sampler_logps.shape == (1, 3)
    [batch] = role_batches(policies, game([(-0.5, -1.0, -2.0), None]), rewards, slice(None), "group", 1e-4)
    assert batch.sampler_logps is None


# Sampling observed, not assumed: each setting on its own, so that an engine that drops top-k, drops top-p, truncates
# before it applies the temperature, or ignores the temperature samples tokens these checks see.
KEPT_TEMPERATURE = 0.7
# (top_k, top_p): top-k alone, top-p alone, and both (top-k first, then top-p over what it kept)
KEPT_SETS = {"top_k": (2, 1.0), "top_p": (0, 0.6), "top_k_top_p": (3, 0.7)}


def _next_token_logits(policies: Policies, prompts, completions, adapter) -> tuple[torch.Tensor, ...]:
    """(logits [B, T, V] float64 before temperature, completion ids [B, T], mask [B, T] bool): the model's own
    next-token logits at every completion position, from one plain forward pass over prompt and completion (not
    agon's scoring). The test world's vocabulary has about a hundred tokens, so [B, T, V] is a few MB."""
    batch = policies.batch_tensors(prompts, completions)
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
    attn = torch.cat([batch.prompt_mask, batch.completion_mask], 1)
    with torch.no_grad(), policies.use_adapter(adapter):
        logits = policies.model(input_ids=ids, attention_mask=attn,
                                position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    return (logits[:, batch.prompt_ids.size(1) - 1 : -1].double(), batch.completion_ids,
            batch.completion_mask.bool())


def _more_likely(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For every token of ``probs`` [..., V]: how many tokens are strictly more likely, and their total probability
    (a tie counts as neither)."""
    ascending = probs.sort(-1).values
    at_most = torch.searchsorted(ascending, probs.contiguous(), right=True)  # tokens as likely or less
    mass = torch.nn.functional.pad(ascending.cumsum(-1), (1, 0))
    return probs.size(-1) - at_most, mass[..., -1:] - mass.gather(-1, at_most)


def _kept_set(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[..., V] bool: the tokens a top-k then top-p sampler keeps from ``probs`` (after temperature), the rule
    transformers and vLLM sample by, written here apart from ``agon.core.scoring``: fewer than ``top_k`` tokens more
    likely (0: every token), and then, renormalised over what top-k kept, less than ``top_p`` of the mass on more
    likely tokens."""
    kept = torch.ones_like(probs, dtype=torch.bool)
    if top_k:
        kept = _more_likely(probs)[0] < top_k
        probs = probs * kept / (probs * kept).sum(-1, keepdim=True)
    return kept & (_more_likely(probs)[1] < top_p)


def _outside(logits, ids, mask, temperature: float, top_k: int, top_p: float) -> int:
    """How many sampled tokens fall outside the kept set of the model's distribution at ``temperature``."""
    kept = _kept_set((logits / temperature).softmax(-1), top_k, top_p)
    return int((~kept.gather(-1, ids.unsqueeze(-1)).squeeze(-1) & mask).sum())


def _outside_if_truncated_before_the_temperature(logits, mask, temperature: float, top_k: int, top_p: float) -> float:
    """The tokens a sampler that truncated at temperature 1 and applied ``temperature`` after would be expected to put
    outside the kept set, summed over these positions: below 1 the temperature sharpens the distribution, so top-p
    keeps fewer tokens than at 1, and that sampler draws the extra ones with their share of its kept mass."""
    probs = (logits / temperature).softmax(-1)
    right, wrong = _kept_set(probs, top_k, top_p), _kept_set(logits.softmax(-1), top_k, top_p)
    drawn = probs * wrong / (probs * wrong).sum(-1, keepdim=True)
    return float((drawn * (wrong & ~right)).sum(-1)[mask].sum())


def _sampled_inside_the_kept_sets(engine, policies: Policies, prompts) -> dict[str, list[Completion]]:
    """``engine``'s completions with adapter A for each of ``KEPT_SETS`` at ``KEPT_TEMPERATURE``, after asserting
    that none of their tokens falls outside its kept set, and that the check can fail for every way of getting it
    wrong: completions sampled at full support (an engine that dropped that setting's only truncation) have dozens of
    tokens outside each set, and where top-p truncates, a sampler that truncated before the temperature would put
    more than 10 outside."""
    full = _next_token_logits(policies, prompts, engine.sample(prompts, "A", Sampling(24, KEPT_TEMPERATURE)), "A")
    out = {}
    for name, (top_k, top_p) in KEPT_SETS.items():
        sampled = engine.sample(prompts, "A", Sampling(24, KEPT_TEMPERATURE, top_p=top_p, top_k=top_k))
        logits, ids, mask = _next_token_logits(policies, prompts, sampled, "A")
        assert int(mask.sum()) > 300, name
        assert _outside(logits, ids, mask, KEPT_TEMPERATURE, top_k, top_p) == 0, name
        assert _outside(*full, KEPT_TEMPERATURE, top_k, top_p) > 20, name
        if top_p < 1:
            assert _outside_if_truncated_before_the_temperature(logits, mask, KEPT_TEMPERATURE, top_k, top_p) > 10
        out[name] = sampled
    return out


def _temperature_z(logits, ids, mask, temperature: float) -> float:
    """How far the sampled tokens sit from draws of the model's distribution at ``temperature``, in standard
    deviations: the sum over positions of log p(sampled token) minus its expectation (the negative entropy), over the
    square root of the summed variances of log p. Each term has mean 0 given the tokens before it, so the sum is a
    martingale and the ratio is about standard normal when the engine samples at ``temperature``. A hotter sampler
    draws less likely tokens (negative), a colder one more likely ones (positive)."""
    logp = (logits / temperature).log_softmax(-1)
    mean = (logp.exp() * logp).sum(-1)
    var = (logp.exp() * logp**2).sum(-1) - mean**2
    got = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return float((got - mean)[mask].sum() / var[mask].sum().sqrt())


def _sampled_at_the_temperature(engine, policies: Policies, prompts) -> None:
    """Full-support completions of adapter A at ``KEPT_TEMPERATURE`` are draws of the model's own distribution at
    that temperature (|z| < 4); completions sampled at 1.0, what an engine that ignores the temperature draws, are
    not (z < -8: about -18 on the test world)."""
    at = engine.sample(prompts, "A", Sampling(24, KEPT_TEMPERATURE))
    logits, ids, mask = _next_token_logits(policies, prompts, at, "A")
    assert int(mask.sum()) > 300
    assert abs(_temperature_z(logits, ids, mask, KEPT_TEMPERATURE)) < 4
    hot = engine.sample(prompts, "A", Sampling(24, 1.0))
    assert _temperature_z(*_next_token_logits(policies, prompts, hot, "A"), KEPT_TEMPERATURE) < -8


@pytest.mark.parametrize("engine", ["hf", "hf_continuous"])
def test_sampled_tokens_stay_inside_the_top_k_top_p_set_and_the_trainer_scores_that_distribution(
        tiny_base, engine):
    """At top-k alone, top-p alone and both, no sampled token falls outside the kept set (and the check can fail:
    ``_sampled_inside_the_kept_sets``); adapter B too at both. The trainer's log-probs are those of the truncated
    distribution: they exceed the full softmax's by log(1 / kept mass)."""
    cfg, _ = tiny_base
    policies = _fresh_policies(tiny_base, 0.3)
    prompts = _prompts(cfg, policies, 24) * 2
    sampler = build_engine(compose_config(TEST_WORLD + [f"generation.engine={engine}"]), policies)
    top_k, top_p = KEPT_SETS["top_k_top_p"]
    truncated = {"A": _sampled_inside_the_kept_sets(sampler, policies, prompts)["top_k_top_p"],
                 "B": sampler.sample(prompts, "B", Sampling(24, KEPT_TEMPERATURE, top_p=top_p, top_k=top_k))}
    assert _outside(*_next_token_logits(policies, prompts, truncated["B"], "B"), KEPT_TEMPERATURE, top_k, top_p) == 0
    for adapter, completions in truncated.items():
        batch = policies.batch_tensors(prompts, completions)
        with torch.no_grad(), policies.use_adapter(adapter):
            kept = policies.token_logps(batch, None, KEPT_TEMPERATURE, 512, top_k, top_p)
            whole = policies.token_logps(batch, None, KEPT_TEMPERATURE)
        mask = batch.completion_mask.bool()
        assert bool((kept[mask] >= whole[mask] - 1e-6).all()) and float((kept - whole)[mask].mean()) > 1e-2


@pytest.mark.parametrize("engine", ["hf", "hf_continuous"])
def test_sampled_tokens_are_draws_of_the_models_own_distribution_at_the_sampling_temperature(tiny_base, engine):
    cfg, _ = tiny_base
    policies = _fresh_policies(tiny_base, 0.3)
    sampler = build_engine(compose_config(TEST_WORLD + [f"generation.engine={engine}"]), policies)
    _sampled_at_the_temperature(sampler, policies, _prompts(cfg, policies, 24) * 2)


# -- with vLLM ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(agon_cache):
    """(cfg, policies, vLLM engine) on the test world, the adapters perturbed far enough to change greedy answers."""
    cfg = compose_config(TEST_WORLD + VLLM + ["logger=none"])
    from agon.models.loading import load_base

    model, tokenizer = load_base(cfg.model, cfg.task, log=lambda *_: None, device="cpu")
    policies = Policies(model, tokenizer, ["A", "B"], cfg.model.lora)
    policies.perturb("A", 0.3, seed=1)
    policies.perturb("B", 0.3, seed=2)
    engine = build_engine(cfg, policies, log=lambda *_: None)
    yield cfg, policies, engine
    engine.close()


@pytest.mark.vllm(seconds=300)
def test_vllm_reports_each_finished_completion_as_it_finishes(served, bounded):
    """The worker streams one progress message per finished request before its reply, so an evaluation's bar moves
    per completion, not once per engine call; the completions are those of a call without progress."""
    cfg, policies, engine = served
    prompts = _prompts(cfg, policies, 12)
    greedy = Sampling(max_new_tokens=24, temperature=0)
    told: list[int] = []
    streamed = engine.sample(prompts, "A", greedy, on_sampled=told.append)
    assert told == [1] * len(prompts)
    assert [c.token_ids for c in streamed] == [c.token_ids for c in engine.sample(prompts, "A", greedy)]


@pytest.mark.vllm(seconds=300)
def test_greedy_vllm_completions_equal_hf_for_each_adapter_and_the_base(served, bounded):
    """Token for token, in the order A, B, base: the base's call comes after LoRA calls (vLLM once gave adapter-less
    requests beside LoRA ones the last adapter), and each slot really is its own adapter."""
    cfg, policies, engine = served
    prompts = _prompts(cfg, policies, 48)
    greedy = Sampling(max_new_tokens=40, temperature=0)
    seen = {}
    for adapter in ("A", "B", None):
        ours = engine.sample(prompts, adapter, greedy)
        theirs = HFEngine(policies).sample(prompts, adapter, greedy)
        assert [c.token_ids for c in ours] == [c.token_ids for c in theirs], adapter
        assert [c.text for c in ours] == [c.text for c in theirs]
        assert all(c.logps is not None and len(c.logps) == c.n_tokens for c in ours)
        seen[adapter] = [c.token_ids for c in ours]
    assert seen["A"] != seen[None] and seen["B"] != seen[None] and seen["A"] != seen["B"]
    # ignore_eos (equal work in make bench): every completion runs to the budget, its text still ends at the turn's end
    budget = Sampling(max_new_tokens=40, temperature=0, ignore_eos=True)
    full = engine.sample(prompts, "A", budget)
    assert all(c.n_tokens == 40 and c.truncated for c in full)
    assert [c.text for c in full] == [c.text for c in engine.sample(prompts, "A", greedy)]
    assert [c.token_ids for c in full] == [c.token_ids for c in HFEngine(policies).sample(prompts, "A", budget)]


@pytest.mark.vllm(seconds=300)
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_vllm_log_probs_match_the_trainers_at_the_sampling_temperature(served, bounded, temperature):
    cfg, policies, engine = served
    prompts = _prompts(cfg, policies, 32)
    for adapter in ("A", "B"):
        completions = engine.sample(prompts, adapter, Sampling(max_new_tokens=40, temperature=temperature))
        ours, theirs, mask = _trainer_logps(policies, prompts, completions, adapter, temperature)
        assert mask.sum() > 100
        assert float((ours - theirs).abs()[mask].max()) < 1e-4
        # at another temperature they would not match: the comparison can fail
        other, _, _ = _trainer_logps(policies, prompts, completions, adapter, temperature + 0.3)
        assert float((other - theirs).abs()[mask].max()) > 1e-2


@pytest.mark.vllm(seconds=300)
def test_after_a_training_step_vllm_samples_from_the_updated_adapters(step_cfg, tiny_base, tmp_path, bounded):
    """The step changes both adapters; vLLM then serves them under new ids (the old ones removed), and its
    log-probs are the updated adapter's (1e-4), not the cached one's."""
    for item in VLLM:
        key, value = item.split("=")
        OmegaConf.update(step_cfg, key, value)
    step_cfg.trainer.learning_rate = 3e-2
    policies = _fresh_policies(tiny_base)
    trainer = Trainer(step_cfg, policies, build_task(step_cfg.task), Recorder(tmp_path), tmp_path,
                      log=lambda *_: None)
    engine = trainer.engine
    try:
        prompts = _prompts(step_cfg, policies, 16)
        sampling = Sampling(max_new_tokens=32, temperature=1.0)
        engine.sample(prompts, "A", sampling)
        engine.sample(prompts, "B", sampling)
        ids = {name: engine.published[name][1] for name in ("A", "B")}
        stale = {name: policies.lora_state(name) for name in ("A", "B")}
        digest = policies.digest()
        m = trainer.step()
        assert policies.digest() != digest
        for role in ("drafter", "challenger"):  # the step's own rollouts: sampler and trainer agree
            assert m[f"role/{role}/sampling/sampling_logp_difference/max"] < 1e-4
        for name in ("A", "B"):
            completions = engine.sample(prompts, name, sampling)
            assert engine.published[name][1] != ids[name]
            ours, theirs, mask = _trainer_logps(policies, prompts, completions, name, 1.0)
            assert float((ours - theirs).abs()[mask].max()) < 1e-4
            current = policies.lora_state(name)
            params = dict(policies.model.named_parameters())
            with torch.no_grad():
                for key, value in stale[name].items():
                    params[key].copy_(value)
                old, _, _ = _trainer_logps(policies, prompts, completions, name, 1.0)
                for key, value in current.items():
                    params[key].copy_(value)
            assert float((old - theirs).abs()[mask].max()) > 1e-3  # the cached adapter would be visible
        assert engine.backend.call("loaded") == sorted(v[1] for v in engine.published.values())
    finally:
        engine.close()


@pytest.mark.vllm(seconds=420)
def test_a_five_step_agon_run_with_vllm_finishes_and_writes_its_summary(agon_cache, tmp_path, bounded):
    from agon.run import run

    run_dir = tmp_path / "run"
    cfg = compose_config(TEST_WORLD + SMALL_RUN + VLLM + [
        "logger=none", "trainer.max_steps=5", "trainer.prompts_per_step=4", "trainer.num_generations=4",
        "eval.n_problems=8", f"output_dir={run_dir}"])
    summary = run(cfg)
    assert summary["train/steps"] == 5
    # vLLM's own log kept in the run (its KV cache's capacity: the first real measurement on a GPU)
    assert "KV cache" in (run_dir / run_files.engine_log(0)).read_text(errors="replace")
    assert run_files.read_json(run_dir / run_files.SUMMARY)["train/steps"] == 5
    steps = [r for r in run_files.read_jsonl(run_dir / run_files.METRICS) if "role/drafter/loss" in r]
    assert [r["train/step"] for r in steps] == [1, 2, 3, 4, 5]
    for r in steps:
        assert r["role/drafter/sampling/sampling_logp_difference/max"] < 1e-4
        assert r["role/challenger/sampling/importance_sampling_ratio/min"] > 0.99


@pytest.mark.vllm(seconds=420)
def test_vllm_with_top_k_top_p_in_training_keeps_the_weights_at_one_and_the_gradient_of_hf(
        step_cfg, tiny_base, tmp_path, bounded):
    """Training sampled by vLLM at top_k=5, top_p=0.8: the trainer scores the same truncated distribution, so the
    mean importance weight of each role stays within [0.9, 1.1] over two steps, and the loss's gradient on one
    batch is within 2x of the gradient without sampler weights (what the hf engine, which reports none, trains
    with). Scored with the full softmax instead (the bug this fixes) the same rollouts' weights fall below 0.9."""
    from agon.core.grpo import sampler_correction
    from agon.core.rewards import compute_rewards
    from agon.game.rollout import play_split

    for item in VLLM + ["trainer.top_k=5", "trainer.top_p=0.8", "trainer.vllm_importance_sampling_mode=sequence_mask",
                        "trainer.vllm_importance_sampling_clip_max=null"]:
        key, value = item.split("=")
        OmegaConf.update(step_cfg, key, None if value == "null" else value)
    policies = _fresh_policies(tiny_base, 0.1)
    trainer = Trainer(step_cfg, policies, build_task(step_cfg.task), Recorder(tmp_path), tmp_path,
                      log=lambda *_: None)
    try:
        for _ in range(2):
            m = trainer.step()
            for role in ("drafter", "challenger"):
                assert 0.9 <= m[f"role/{role}/sampling/importance_sampling_ratio/mean"] <= 1.1, m
        game, rows = play_split(trainer.ranks, policies, trainer.task, step_cfg.model, trainer.next_problems(),
                                drafter="A", challenger="B", exchange="visible", group_size=4,
                                sampling=trainer.sampling, engine=trainer.engine)
        rewards = compute_rewards(game.outcome(), step_cfg.reward)
        batch = role_batches(policies, game, {"drafter": rewards.drafter}, rows, "group", 1e-4)[0]
        assert batch.sampler_logps is not None and float(batch.advantages.abs().sum()) > 0

        def grad_norm(b) -> float:
            policies.model.zero_grad(set_to_none=True)
            trainer.loss_backward(b)
            return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in policies.parameters("A")])))

        corrected, unweighted = grad_norm(batch), grad_norm(dataclasses.replace(batch, sampler_logps=None))
        assert 0.5 <= corrected / unweighted <= 2.0
        with torch.no_grad(), policies.use_adapter("A"):
            full = policies.token_logps(batch.tokens, None, step_cfg.trainer.temperature)
        weights = sampler_correction(full, batch.sampler_logps, batch.mask, "sequence_mask", None, None)
        assert float(weights.mean()) < 0.9
    finally:
        trainer.engine.close()


@pytest.mark.vllm(seconds=300)
def test_vllm_samples_stay_inside_the_top_k_top_p_set(served, bounded):
    """As hf's: top-k alone, top-p alone and both, each able to fail (``_sampled_inside_the_kept_sets``); B at both."""
    cfg, policies, engine = served
    # three samples of each prompt: the premise that a sampler truncating before the temperature would put more than
    # 10 tokens outside was met by 9.0 once at two (vLLM's CPU numerics vary with the machine's load)
    prompts = _prompts(cfg, policies, 24) * 3
    _sampled_inside_the_kept_sets(engine, policies, prompts)
    top_k, top_p = KEPT_SETS["top_k_top_p"]
    b = engine.sample(prompts, "B", Sampling(24, KEPT_TEMPERATURE, top_p=top_p, top_k=top_k))
    assert _outside(*_next_token_logits(policies, prompts, b, "B"), KEPT_TEMPERATURE, top_k, top_p) == 0


@pytest.mark.vllm(seconds=300)
def test_vllm_samples_are_draws_of_the_models_own_distribution_at_the_sampling_temperature(served, bounded):
    cfg, policies, engine = served
    _sampled_at_the_temperature(engine, policies, _prompts(cfg, policies, 24) * 2)


@pytest.mark.vllm(seconds=180)
def test_a_worker_that_dies_is_an_engine_error_with_its_log_not_a_hang(tiny_base, bounded):
    from agon.engines import EngineError

    cfg = compose_config(TEST_WORLD + VLLM)
    policies = _fresh_policies(tiny_base)
    engine = build_engine(cfg, policies, log=lambda *_: None)
    workdir = engine.workdir
    try:
        engine.backend.proc.kill()
        engine.backend.proc.wait()
        # A is published first: the call that finds the worker gone is add_adapter
        with pytest.raises(EngineError, match=r"vLLM worker (exited with code -9 )?during add_adapter"):
            engine.sample(_prompts(cfg, policies, 2), "A", Sampling(max_new_tokens=8, temperature=1.0))
    finally:
        engine.close()
    assert not workdir.exists()  # the published adapters are cleaned up


# -- a sweep of vLLM cells in one process ----------------------------------------------------------------------------

# two cells of a few steps with vLLM, as `python -m agon.run -m` runs them one after the other in one process
SWEEP_CELLS = TEST_WORLD + SMALL_RUN + VLLM + ["logger=none", "progress=false", "trainer.max_steps=1", "seed=0,1",
                                               "eval.at_start=false"]


def _cells(sweep) -> list[dict]:
    summaries = sorted(sweep.glob("*/summary.json"))
    assert len(summaries) == 2, list(sweep.iterdir())
    return [run_files.read_json(p) for p in summaries]


@pytest.mark.vllm(seconds=900)
def test_a_two_cell_vllm_sweep_in_one_process_starts_its_second_cell_with_the_memory_of_the_first(
        agon_cache, tmp_path, bounded):
    """The engine is a process of its own (placement auto): gone when the cell closes it, so the second cell
    starts with no child process and the resident memory the first started with, not the first's vLLM as well
    (vLLM's KV cache alone is generation.vllm.cpu_kv_cache_gib, 1 GiB, here)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    sweep = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "agon.run", "-m", *SWEEP_CELLS, f"hydra.sweep.dir={sweep}"],
                          cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=880,
                          env={**os.environ, "AGON_CACHE": str(agon_cache), "WANDB_MODE": "disabled"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("[engine] vLLM worker ready") == 2  # the premise: each cell started its engine
    first, second = sorted(_cells(sweep), key=lambda s: s["seed"])
    assert first["memory/child_processes_at_start"] == second["memory/child_processes_at_start"] == 0
    assert abs(second["memory/at_start_gib"] - first["memory/at_start_gib"]) < 0.5, (first, second)


@pytest.mark.vllm(seconds=1200)
def test_a_two_process_vllm_sweep_of_two_cells_keeps_its_process_group_through_both(agon_cache, tmp_path, bounded):
    """accelerate launch of two processes, each rank with its own vLLM worker, two cells in one launch: closing
    the first cell's engines leaves the launch's process group to the second (agon.run fails a cell whose engine
    ended it), and both cells train on two processes."""
    from tests.test_distributed import launch

    sweep = tmp_path / "sweep"
    launch(["agon.run", "-m", *SWEEP_CELLS, "trainer.prompts_per_step=2", f"hydra.sweep.dir={sweep}"], tmp_path,
           timeout=1150)
    assert [s["train/processes"] for s in _cells(sweep)] == [2, 2]


def _tree(pid: int) -> set[int]:
    """``pid`` and every live process descended from it (zombies are dead: they hold no memory)."""
    from pathlib import Path

    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    tree = {pid} if pid in parents else set()
    while True:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        if not more:
            return tree
        tree |= more


def _gone(pids: set[int], seconds: float = 30.0) -> bool:
    """Every one of ``pids`` ended within ``seconds`` (zombies count as ended)."""
    import time
    from pathlib import Path

    def alive() -> set[int]:
        out = set()
        for p in pids:
            try:
                if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    out.add(p)
            except OSError:
                pass
        return out

    deadline = time.monotonic() + seconds
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive()


# vLLM's engine core in a process of its own, as on a GPU (the CPU setup keeps it in the worker)
ENGINE_CORE_APART = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
HOLD_AN_ENGINE = """
import sys, time
from tests.conftest import TEST_WORLD, compose_config
from agon.engines import build_engine
from agon.models.loading import load_base
from agon.models.policies import Policies
cfg = compose_config(TEST_WORLD + ["generation.engine=vllm", "generation.vllm.start_timeout_s=300", "logger=none"])
model, tokenizer = load_base(cfg.model, cfg.task, log=lambda *_: None, device="cpu")
engine = build_engine(cfg, Policies(model, tokenizer, ["A", "B"], cfg.model.lora), log=lambda *_: None)
print("worker", engine.backend.proc.pid, engine.backend.log_path, flush=True)
time.sleep(3600)
"""


@pytest.mark.vllm(seconds=600)
def test_no_engine_process_outlives_a_killed_trainer_or_a_close_that_timed_out(agon_cache, tmp_path, bounded):
    """With vLLM's engine core in a process of its own (the GPU's process tree): SIGKILL of the trainer leaves no
    process of its worker's group within 30 s; nor does a close whose worker does not answer (stopped), after its
    30 s wait."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).parents[1]
    log = tmp_path / "trainer.log"
    with open(log, "w") as out:
        trainer = subprocess.Popen([sys.executable, "-c", HOLD_AN_ENGINE], cwd=root, stdout=out,
                                   stderr=subprocess.STDOUT, env={**os.environ, **ENGINE_CORE_APART})
    try:
        deadline = time.monotonic() + 400
        while "worker " not in log.read_text() and trainer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        line = next((x for x in log.read_text().splitlines() if x.startswith("worker ")), None)
        assert line is not None, log.read_text()[-3000:]
        engine_tree = _tree(int(line.split()[1]))
        assert len(engine_tree) >= 2, engine_tree  # the premise: the worker and its engine core
        # SLURM's preemption signals every process of the job: the worker leaves that SIGTERM to its living trainer
        os.kill(int(line.split()[1]), signal.SIGTERM)
        time.sleep(2)
        assert _tree(int(line.split()[1])) == engine_tree
        assert "SIGTERM while the trainer lives: left to the trainer" in Path(line.split()[2]).read_text()
        trainer.kill()
        trainer.wait()
        assert _gone(engine_tree), [Path(f"/proc/{p}/cmdline").read_text() for p in _tree(min(engine_tree))]
    finally:
        trainer.kill()

    cfg = compose_config(TEST_WORLD + VLLM + ["logger=none"])
    from agon.models.loading import load_base

    model, tokenizer = load_base(cfg.model, cfg.task, log=lambda *_: None, device="cpu")
    previous = {k: os.environ.get(k) for k in ENGINE_CORE_APART}
    os.environ.update(ENGINE_CORE_APART)
    try:
        engine = build_engine(cfg, Policies(model, tokenizer, ["A", "B"], cfg.model.lora), log=lambda *_: None)
    finally:
        for k, v in previous.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    worker = engine.backend.proc.pid
    engine_tree = _tree(worker)
    assert len(engine_tree) >= 2, engine_tree
    os.kill(worker, signal.SIGSTOP)  # a worker that no longer answers
    engine.close()
    assert _gone(engine_tree, 5)
