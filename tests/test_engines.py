"""Sampling engines: the ``hf`` engine, the sampler-mismatch correction in the trainer, and vLLM (marker ``vllm``).

The ``vllm`` tests run real vLLM on the test world (``make test-vllm``: vLLM's CPU build in ``.venv-vllm``, as a
worker process); they fail, not skip, when vLLM is missing, since nothing but that target selects them. Each is
bounded in time by an alarm as well as by the worker's own start timeout.
"""

from __future__ import annotations

import copy
import signal

import pytest
import torch
from omegaconf import OmegaConf

from agon import run_files
from agon.config import ConfigError
from agon.engines import ENGINES, HFEngine, Sampling, build_engine
from agon.policies import Completion, Policies
from agon.recorder import Recorder
from agon.role_batch import role_batches, sampler_logps
from agon.tasks import build_task
from agon.trainer import Trainer
from tests.conftest import SMALL_RUN, TEST_WORLD, compose_config

VLLM = ["generation.engine=vllm", "generation.vllm.start_timeout_s=300"]
# the test world's own temperature (1.0) and Qwen3's model-card temperature
TEMPERATURES = [1.0, 0.6]


@pytest.fixture
def bounded(request):
    """Fail a test that runs longer than its marker's ``seconds`` (vLLM calls can hang where a worker wedges)."""
    seconds = request.node.get_closest_marker("vllm").kwargs.get("seconds", 240)

    def expire(*_):
        raise TimeoutError(f"{request.node.name} ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


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
    from agon.config import validate

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


@ENGINES.register("hf_skewed_for_test")
class SkewedEngine(HFEngine):
    """hf's completions, reporting as the sampler's log-probs the trainer's own plus ``SKEW`` per token: a sampler
    that disagrees with the trainer by a known amount."""

    SKEW = 0.25

    def sample(self, prompts, adapter, sampling) -> list[Completion]:
        import dataclasses

        out = super().sample(prompts, adapter, sampling)
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


def test_role_batches_carry_the_engines_log_probs_only_when_every_row_has_them(tiny_base):
    from agon.rewards import RoleRewards
    from agon.rollout import Attempt, Game, Round
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


# -- with vLLM ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(agon_cache):
    """(cfg, policies, vLLM engine) on the test world, the adapters perturbed far enough to change greedy answers."""
    cfg = compose_config(TEST_WORLD + VLLM + ["logger=none"])
    from agon.policies import load_base

    model, tokenizer = load_base(cfg.model, cfg.task, log=lambda *_: None, device="cpu")
    policies = Policies(model, tokenizer, ["A", "B"], cfg.model.lora)
    policies.perturb("A", 0.3, seed=1)
    policies.perturb("B", 0.3, seed=2)
    engine = build_engine(cfg, policies, log=lambda *_: None)
    yield cfg, policies, engine
    engine.close()


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
    assert run_files.read_json(run_dir / run_files.SUMMARY)["train/steps"] == 5
    steps = [r for r in run_files.read_jsonl(run_dir / run_files.METRICS) if "role/drafter/loss" in r]
    assert [r["train/step"] for r in steps] == [1, 2, 3, 4, 5]
    for r in steps:
        assert r["role/drafter/sampling/sampling_logp_difference/max"] < 1e-4
        assert r["role/challenger/sampling/importance_sampling_ratio/min"] > 0.99


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
