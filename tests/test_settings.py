"""Settings that change what a run computes, each set away from its default and observed where it acts: the model
built and loaded, the adapters, the problems drawn, the prompts, the grading, the files written, the arguments vLLM
is started with, the Optuna study. ``tests/settings_map.py`` names, for every config key, the test that does this;
these are the tests no other file had.

No stand-ins where the real part runs here. Two places where it cannot: vLLM, whose worker is replaced by a script
that records what it is sent at the process boundary (the real engine code builds and sends it), and the grading
sandbox, which runs for real but is tapped to see the request each test is given.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from agon.records import run_files
from agon.models import world
from agon.engines import EngineError, Sampling
from agon.models.loading import load_base
from agon.models.policies import build_policies
from agon.models.tokens import Completion
from agon.game.rollout import play
from agon.tasks import build_task
from tests.conftest import TEST_WORLD, TINY, compose_config

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "tasks" / "fixtures"
CODECONTESTS = FIXTURES / "codecontests.jsonl"
DEEPMATH = FIXTURES / "deepmath.parquet"


def compose_task(option: str, *overrides: str):
    """The task node for ``task=<option>`` plus ``task.``-relative overrides (tests/tasks/conftest.py's, here)."""
    return compose_config([f"task={option}", *(f"task.{o}" for o in overrides)]).task


def _numbers(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


# ---------------------------------------------------------------------------------------------------------------
# model: the offline world's shape and warm start


def _world(tmp_path: Path, monkeypatch, *overrides: str):
    """The offline world built (into a cache of this test's own) for TINY plus ``overrides``: (config, state)."""
    from safetensors.torch import load_file

    monkeypatch.setenv("AGON_CACHE", str(tmp_path / "cache"))
    cfg = compose_config(TINY + ["task.train_size=200", "task.heldout_size=20", *overrides])
    path = world.ensure_world(cfg.model, cfg.task, log=lambda *_: None)
    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


def test_the_offline_worlds_shape_is_what_model_tiny_says(tmp_path, monkeypatch):
    """Every shape key reaches the Qwen3 config of the built world and the shapes of its weights, and the context a
    run is checked against (``max_position``) is the loaded model's."""
    config, state = _world(tmp_path, monkeypatch, "model.tiny.warmup_steps=0", "model.tiny.hidden_size=48",
                           "model.tiny.num_layers=3", "model.tiny.num_heads=3", "model.tiny.num_kv_heads=3",
                           "model.tiny.intermediate_size=80", "model.tiny.max_position=96")
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["max_position_embeddings"]) == (
        48, 3, 3, 3, 80, 96)
    layers = {int(k.split(".")[2]) for k in state if k.startswith("model.layers.")}
    assert layers == {0, 1, 2}
    assert state["model.layers.0.self_attn.q_proj.weight"].shape == (48, 48)  # 3 heads of 16
    assert state["model.layers.0.self_attn.k_proj.weight"].shape == (48, 48)  # 3 KV heads of 16 (TINY has 1)
    assert state["model.layers.0.mlp.up_proj.weight"].shape == (80, 48)
    from agon.models.loading import load_tokenizer

    cfg = compose_config(TINY + ["model.tiny.max_position=96"])
    assert load_tokenizer(cfg.model)[1] == 96


def test_the_warm_start_follows_its_steps_rate_batch_schedule_and_seed(tmp_path, monkeypatch):
    """Built worlds compared weight by weight. With no steps, or a rate of zero, the world is its seeded random init;
    batch size and the cosine schedule each give other weights, and the seed another init."""
    def weights(*overrides: str) -> dict[str, torch.Tensor]:
        return _world(tmp_path, monkeypatch, *overrides)[1]

    def same(a: dict, b: dict) -> bool:
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    init = weights("model.tiny.warmup_steps=0")
    two = weights("model.tiny.warmup_steps=2", "model.tiny.warmup_batch_size=2")
    assert not same(init, two), "two warm-start steps left the weights as initialised"
    assert same(init, weights("model.tiny.warmup_steps=2", "model.tiny.warmup_batch_size=2",
                              "model.tiny.warmup_lr=0.0"))
    assert not same(two, weights("model.tiny.warmup_steps=2", "model.tiny.warmup_batch_size=3"))
    # the second of two steps runs at half the peak rate under the cosine
    assert not same(two, weights("model.tiny.warmup_steps=2", "model.tiny.warmup_batch_size=2",
                                 "model.tiny.warmup_cosine=true"))
    other = weights("model.tiny.warmup_steps=0", "model.tiny.warmup_seed=1")
    assert not same(init, other)
    rebuilt = world.build_model(compose_config(TINY).model.tiny, len(world.build_tokenizer()), seed=1).state_dict()
    assert same(other, {k: v for k, v in rebuilt.items() if k in other})  # the seed is the init's


# ---------------------------------------------------------------------------------------------------------------
# model: where it is loaded, how it is trained, how its turns are read


def test_model_device_is_where_the_base_is_loaded(agon_cache):
    """``auto`` is the CPU here; any other device is taken as given (``meta`` is the one a CPU machine has)."""
    cfg = compose_config(TEST_WORLD)
    model, _ = load_base(cfg.model, cfg.task, log=lambda *_: None)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    cfg.model.device = "meta"
    model, _ = load_base(cfg.model, cfg.task, log=lambda *_: None)
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_gradient_checkpointing_recomputes_each_layer_in_the_backward_and_gives_the_same_gradients(tiny_base):
    _, (model, tok) = tiny_base
    prompts = [f"<|im_start|>u{q}<|im_end|><|im_start|>a" for q in ("1+2+3", "4-1+2")]
    completions = [Completion("", tuple(range(10, 30)), True), Completion("", tuple(range(40, 52)), True)]

    def run(checkpointing: bool) -> tuple[int, list[torch.Tensor]]:
        cfg = compose_config(TEST_WORLD + [f"model.gradient_checkpointing={str(checkpointing).lower()}"])
        torch.manual_seed(0)  # PEFT draws lora_A from the global RNG: the same adapters both times
        policies = build_policies(cfg, copy.deepcopy(model), tok)
        calls = []
        # entering the MLP of the first layer: the layer's own hooks stay outside the checkpoint, and the recomputation
        # stops once it has what the backward needs, before the MLP returns
        mlp = policies.model.get_base_model().model.layers[0].mlp
        hook = mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        with policies.use_adapter("B"):
            policies.token_logps(policies.batch_tensors(prompts, completions)).sum().backward()
        hook.remove()
        return len(calls), [p.grad for p in policies.parameters("B")]

    plain, checkpointed = run(False), run(True)
    assert any(g.abs().sum() > 0 for g in plain[1]), "the backward gave adapter B no gradient"
    assert (plain[0], checkpointed[0]) == (1, 2)  # forward, then the recomputation in the backward
    for a, b in zip(plain[1], checkpointed[1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_model_family_is_how_a_run_reads_its_completions(tiny_base):
    """The family of the config, not Qwen3's by default, reads the turn: Gemma 4's canonical form gives a turn
    without a thought channel an empty reasoning block; Qwen3's leaves the test world's turn as it is."""
    _, (model, tok) = tiny_base
    text = "<think>2+4=6</think>2+4=6\\boxed{6}"
    ids = tok(text + tok.eos_token, add_special_tokens=False)["input_ids"]
    read = {}
    for family in ("qwen3", "gemma4"):
        cfg = compose_config(TEST_WORLD + [f"model.family={family}"])
        policies = build_policies(cfg, copy.deepcopy(model), tok)
        assert policies.family.name == family
        read[family] = policies.completion(policies.render("2+4"), ids).text
    assert read == {"qwen3": text, "gemma4": "<think></think>" + text}


def test_model_enable_thinking_is_in_every_prompt_a_run_samples(agon_cache):
    """On a Qwen3-shaped checkpoint with Qwen3's chat template (random weights, tiny widths: the one test_families
    builds), loaded as a hub model is, through ``model.path``: the template opens the assistant's turn plainly with
    thinking on, and writes an empty reasoning block into the prompt with it off, which the completion then carries
    as its own opening."""
    from tests.test_families import checkpoint

    cfg = compose_config(["model=qwen3_0.6b", f"model.path={checkpoint('qwen3')}", "model.dtype=float32",
                          "model.gradient_checkpointing=false", "task.train_size=50", "task.heldout_size=4"])
    policies = build_policies(cfg, *load_base(cfg.model, cfg.task, log=lambda *_: None))
    task = build_task(cfg.task)
    empty = "<think>\n\n</think>\n\n"
    assert cfg.model.enable_thinking
    for thinking in (True, False):
        cfg.model.enable_thinking = thinking
        torch.manual_seed(0)
        game = play(policies, task, cfg.model, list(task.heldout_problems())[:2], drafter="A", challenger="B",
                    exchange="visible", group_size=1, sampling=Sampling(3, 1.0))
        for r in game.rounds:
            for attempt in (r.draft, r.challenge):
                assert attempt.prompt.endswith("<|im_start|>assistant\n" + ("" if thinking else empty))
                assert attempt.completion.text.startswith(empty) is not thinking


def test_lora_rank_and_target_modules_are_the_adapters_shape(tiny_base):
    _, (model, tok) = tiny_base

    def adapted(*overrides: str):
        policies = build_policies(compose_config(TEST_WORLD + list(overrides)), copy.deepcopy(model), tok)
        names = [n for n, _ in policies.model.named_parameters() if ".lora_A.A." in n]
        return {n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n in names}, {
            p.shape[0] for n, p in policies.model.named_parameters() if ".lora_A.A." in n}

    every = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert adapted() == (every, {4})  # TEST_WORLD's rank 4 on every linear layer (all-linear)
    assert adapted("model.lora.rank=2") == (every, {2})
    assert adapted("model.lora.target_modules=[q_proj,v_proj]") == ({"q_proj", "v_proj"}, {4})


def test_lora_alpha_scales_the_adapters_output_and_dropout_makes_it_random_in_training(tiny_base):
    """One LoRA layer, the same weights: its adapter's contribution (output minus the base's) doubles with alpha;
    with dropout on its input, two training-mode passes differ, without it they are equal."""
    _, (model, tok) = tiny_base
    x = torch.randn(3, model.config.hidden_size)

    def layer(*overrides: str):
        policies = build_policies(compose_config(TEST_WORLD + list(overrides)), copy.deepcopy(model), tok)
        q = policies.model.get_base_model().model.layers[0].self_attn.q_proj
        with torch.no_grad():
            q.lora_B["B"].weight.copy_(torch.linspace(-1, 1, q.lora_B["B"].weight.numel()).view_as(
                q.lora_B["B"].weight))
            q.lora_A["B"].weight.copy_(torch.linspace(1, -1, q.lora_A["B"].weight.numel()).view_as(
                q.lora_A["B"].weight))
        return policies, q

    def delta(policies, q) -> torch.Tensor:
        with torch.no_grad(), policies.use_adapter("B"):
            on = q(x)
        with torch.no_grad(), policies.use_adapter(None):
            off = q(x)
        return on - off

    base = delta(*layer("model.lora.alpha=8"))
    assert base.abs().max() > 0
    torch.testing.assert_close(delta(*layer("model.lora.alpha=16")), 2 * base)

    for p, differ in ((0.0, False), (0.5, True)):
        policies, q = layer(f"model.lora.dropout={p}")
        q.train()
        with torch.no_grad(), policies.use_adapter("B"):
            first, second = q(x), q(x)
        assert (not torch.equal(first, second)) is differ, p


# ---------------------------------------------------------------------------------------------------------------
# init and the run seed


def test_init_std_and_init_seed_plus_the_run_seed_make_bs_perturbation(tiny_base):
    _, (model, tok) = tiny_base

    def b_weights(*overrides: str) -> dict[str, torch.Tensor]:
        policies = build_policies(compose_config(TEST_WORLD + list(overrides)), copy.deepcopy(model), tok)
        return {n: p for n, p in policies.lora_state("B").items() if "lora_B" in n}

    base = b_weights()
    assert all(p.abs().sum() > 0 for p in base.values())
    for n, p in b_weights("init.std=0.05").items():
        torch.testing.assert_close(p, base[n] * 2.5)  # the same noise, scaled
    moved, run_seed = b_weights("init.seed=1"), b_weights("seed=1")
    assert all(not torch.equal(moved[n], base[n]) for n in base)
    # init.seed + seed seeds it: either one moved by 1 gives the same perturbation
    assert all(torch.equal(moved[n], run_seed[n]) for n in base)


def test_the_run_seed_orders_the_training_problems(small_cfg, policies, tmp_path):
    from agon.records.recorder import Recorder
    from agon.training.trainer import Trainer

    def first_problems(seed: int) -> list[str]:
        cfg = copy.deepcopy(small_cfg)
        cfg.seed = seed
        trainer = Trainer(cfg, policies, build_task(cfg.task), Recorder(tmp_path / str(seed)), tmp_path / str(seed),
                          log=lambda *_: None)
        return [p.id for _ in range(4) for p in trainer.next_problems()]

    assert first_problems(0) == first_problems(0)
    assert first_problems(0) != first_problems(1)


# ---------------------------------------------------------------------------------------------------------------
# method, and what the run writes


def test_method_train_false_evaluates_the_untrained_adapters(small_cfg, tmp_path):
    from agon.run import run

    small_cfg.method.train = False
    small_cfg.eval.at_start, small_cfg.eval.n_problems, small_cfg.eval.samples = False, 1, 1
    summary = run(small_cfg)
    run_dir = Path(small_cfg.output_dir)
    assert summary["train/steps"] == 0 and small_cfg.trainer.max_steps == 2
    assert not [r for r in run_files.read_jsonl(run_dir / run_files.METRICS) if "role/drafter/loss" in r]
    assert {r["phase"] for r in run_files.read_jsonl(run_dir / run_files.EVAL)} == {"final"}
    # the adapters written are the initial ones: A's lora_B still PEFT's zeros, B's the divergent perturbation
    from safetensors.torch import load_file

    a = load_file(str(run_dir / run_files.ADAPTERS / "A" / "adapter_model.safetensors"))
    b = load_file(str(run_dir / run_files.ADAPTERS / "B" / "adapter_model.safetensors"))
    assert all(torch.count_nonzero(v) == 0 for k, v in a.items() if "lora_B" in k)
    assert all(torch.count_nonzero(v) > 0 for k, v in b.items() if "lora_B" in k)


def test_logger_table_rows_is_how_many_rollouts_an_evaluation_writes_to_samples_jsonl(small_cfg, policies, tmp_path):
    from agon.records.recorder import Recorder
    from agon.training.trainer import Trainer

    # GRPO's evaluation is one game, A's drafts: 3 problems, one rollout each, cut at 2 rows (the default is 16)
    small_cfg.method.name, small_cfg.eval.n_problems, small_cfg.eval.samples = "grpo", 3, 1
    small_cfg.logger.table_rows = 2
    recorder = Recorder(tmp_path)
    result = Trainer(small_cfg, policies, build_task(small_cfg.task), recorder, tmp_path,
                     log=lambda *_: None).evaluate("final", progress=False)
    recorder.close()
    assert len(next(iter(result.games.values())).rounds) == 3
    rows = [r for r in run_files.read_jsonl(tmp_path / run_files.SAMPLES) if r["phase"] == "final"]
    assert [r["problem_id"] for r in rows] == [p.id for p in build_task(small_cfg.task).heldout_problems()[:2]]


# ---------------------------------------------------------------------------------------------------------------
# task: the problems drawn, and the text each role reads


def test_task_kind_picks_the_task_family_a_run_builds():
    from agon.tasks.arithmetic import ArithmeticTask
    from agon.tasks.deepmath import DeepMathTask
    from agon.tasks.reasoning_gym import ReasoningGymTask

    built = {
        kind: build_task(compose_config(overrides).task)
        for kind, overrides in (("arithmetic", ["task.train_size=20", "task.heldout_size=5"]),
                                ("reasoning_gym", ["task=reasoning_gym", "task.train_size=20", "task.heldout_size=5"]),
                                ("deepmath", ["task=deepmath_hard", f"task.source={DEEPMATH}", "task.heldout_size=3"]))
    }
    assert {k: type(t) for k, t in built.items()} == {"arithmetic": ArithmeticTask,
                                                      "reasoning_gym": ReasoningGymTask, "deepmath": DeepMathTask}
    assert all(t.cfg.kind == k for k, t in built.items())


def test_the_arithmetic_task_draws_its_problems_as_its_keys_say():
    def task(*overrides: str):
        return build_task(compose_config(["task.train_size=300", "task.heldout_size=40", *overrides]).task)

    default, moved = task(), task("task.min_terms=2", "task.max_terms=2", "task.max_operand=50",
                                  "task.train_size=120", "task.heldout_size=25")
    # the defaults: chains of 3 to 5 operands of 1 to 9
    drawn = [*default.train_problems(), *default.heldout_problems()]
    assert {len(_numbers(p.question)) for p in drawn} == {3, 4, 5}
    assert max(n for p in drawn for n in _numbers(p.question)) == 9
    assert (len(moved.train_problems()), len(moved.heldout_problems())) == (120, 25)
    drawn = [*moved.train_problems(), *moved.heldout_problems()]
    assert {len(_numbers(p.question)) for p in drawn} == {2}
    operands = [n for p in drawn for n in _numbers(p.question)]
    assert 1 <= min(operands) and max(operands) <= 50 and max(operands) > 40
    # another split seed, another held-out split (and another training pool beside it)
    other = task("task.split_seed=7")
    assert {p.id for p in other.heldout_problems()} != {p.id for p in default.heldout_problems()}
    assert not {p.id for p in other.heldout_problems()} & {p.id for p in other.train_problems()}


def test_the_hard_split_warm_starts_the_base_on_its_own_chain_lengths():
    """task.warm_start_{min,max}_terms: the problems the offline base is warm-started on have those lengths, while
    the run trains and is scored on its own."""
    cfg = compose_config(["task.min_terms=6", "task.max_terms=7", "task.warm_start_min_terms=2",
                          "task.warm_start_max_terms=3", "task.train_size=200", "task.heldout_size=20"])
    warm = build_task(world.world_task_cfg(cfg.task))
    run = build_task(cfg.task)
    assert {len(_numbers(p.question)) for p in warm.train_problems()} == {2, 3}
    assert {len(_numbers(p.question)) for p in run.train_problems()} == {6, 7}


def test_reasoning_gym_dataset_args_and_train_size_shape_its_problems():
    def task(terms: int, size: int):
        return build_task(compose_config(["task=reasoning_gym", "task.name=chain_sum", "task.heldout_size=10",
                                          f"task.train_size={size}", f"+task.dataset_args.min_terms={terms}",
                                          f"+task.dataset_args.max_terms={terms}"]).task)

    two, four = task(2, 30), task(4, 60)
    for t, terms in ((two, 2), (four, 4)):
        assert {len(_numbers(p.question)) for p in [*t.train_problems(), *t.heldout_problems()]} == {terms}
    # train_size items are drawn; those that repeat a held-out question are dropped
    assert len(two.train_problems()) <= 30 < len(four.train_problems()) <= 60


def test_the_task_text_keys_are_the_prompts_each_role_reads(small_cfg, policies):
    """system_prompt, instruction and challenge_template set away from their defaults: the drafter's and the visible
    challenger's prompts, written out here in the test world's chat format."""
    cfg = copy.deepcopy(small_cfg)
    cfg.task.system_prompt = "Be exact."
    cfg.task.instruction = " ="
    cfg.task.challenge_template = "{problem}#{recap}"
    task = build_task(cfg.task)
    problems = list(task.heldout_problems())[:3]
    torch.manual_seed(0)
    game = play(policies, task, cfg.model, problems, drafter="A", challenger="B", exchange="visible",
                group_size=1, sampling=Sampling(32, 1.0))
    assert any(r.recap for r in game.rounds), "no draft had a recap to show the challenger"
    for r in game.rounds:
        system = "<|im_start|>sBe exact.<|im_end|>"
        assert r.draft.prompt == f"{system}<|im_start|>u{r.problem.question} =<|im_end|><|im_start|>a"
        assert r.challenge.prompt == (f"{system}<|im_start|>u{r.problem.question} =#{r.recap}<|im_end|>"
                                      "<|im_start|>a")


# -- deepmath and codecontests ------------------------------------------------------------------------------------


def test_deepmath_verify_workers_and_timeout_are_the_graders():
    """verify_workers grading processes (one here); verify_timeout_s ends an item that hangs (a power tower) at its
    deadline, well before the default's 10 s (whose inner deadline alone is 5 s)."""
    task = build_task(compose_task("deepmath_hard", f"source={DEEPMATH}", "heldout_size=3", "verify_workers=1",
                                   "verify_timeout_s=1"))
    try:
        problem = task.heldout_problems()[0]
        verdicts = task.verify([problem] * 3, [f"<think>x</think>\\boxed{{{problem.answer}}}"] * 3)
        assert all(v.correct for v in verdicts)
        assert len(task.verifier._workers) == 1  # the default is 2
        t0 = time.monotonic()
        (hung,) = task.verify([problem], ["<think>x</think>\\boxed{9^{9^{9^{9^{9}}}}}"])
        assert hung.status == "timeout" and time.monotonic() - t0 < 4.5
    finally:
        task.close()


class _Tap:
    """The real sandbox, with every request it is given kept, and an optional wait at a barrier before each run."""

    def __init__(self, barrier: threading.Barrier | None = None):
        from agon.tasks.sandbox import LocalSandbox

        self.sandbox, self.barrier, self.requests = LocalSandbox(), barrier, []
        self.isolation = self.sandbox.isolation

    def run(self, request):
        self.requests.append(request)
        if self.barrier is not None:
            self.barrier.wait()
        return self.sandbox.run(request)


def _codecontests(*overrides: str, sandbox=None):
    from agon.tasks.codecontests import CodeContestsTask

    cfg = compose_task("codecontests", f"source={CODECONTESTS}", "heldout_size=0", *overrides)
    return CodeContestsTask(cfg, sandbox) if sandbox is not None else build_task(cfg)


def _program(code: str) -> str:
    return f"<think>x</think>\n```python\n{code}\n```\n"


SUM = "a, b = map(int, input().split())\nprint(a + b)"


def test_codecontests_limits_are_the_ones_each_program_runs_under():
    """time_limit_s and time_limit_factor (the smaller of the task's limit and the factor times the problem's 2 s),
    memory_mb (the smaller of it and the problem's 256 MB) and max_output_bytes reach every sandboxed run; an
    output over the byte limit is cut and fails."""
    tap = _Tap()
    task = _codecontests("time_limit_s=3.5", "time_limit_factor=1.5", "memory_mb=128",
                         "max_output_bytes=64", sandbox=tap)
    try:
        ab = next(p for p in task.train_problems() if p.meta["name"] == "1_A. Sum of Two")
        assert (ab.meta["time_limit_s"], ab.meta["memory_mb"]) == (3.0, 128)  # min(3.5, 1.5 x 2), min(128, 256)
        (right,) = task.verify([ab], [_program(SUM)])
        assert right.correct and {(r.time_limit_s, r.memory_mb, r.max_output_bytes) for r in tap.requests} == {
            (3.0, 128, 64)}
        (flood,) = task.verify([ab], [_program("print('7 ' * 100)")])
        assert not flood.correct and "output_limit" in flood.detail
    finally:
        task.close()
    loose = _codecontests("time_limit_s=1.0")
    ab = next(p for p in loose.train_problems() if p.meta["name"] == "1_A. Sum of Two")
    assert (ab.meta["time_limit_s"], ab.meta["memory_mb"]) == (1.0, 256)  # min(1, 2 x 2); the problem's 256 MB
    loose.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_codecontests_workers_grade_that_many_programs_at_once(workers):
    """Every run waits at a barrier for a second run: two workers pass it together and grade both programs (two
    problems: one problem's programs are graded one after another, issue 51), each wrong at its first test; one
    worker never has a second run beside it, so the barrier breaks and both are graded as errors."""
    barrier = threading.Barrier(2, timeout=60 if workers == 2 else 1)
    task = _codecontests(f"workers={workers}", "max_generated_tests=0", sandbox=_Tap(barrier))
    try:
        ab, even = (next(p for p in task.train_problems() if p.meta["name"] == name)
                    for name in ("1_A. Sum of Two", "EVENODD"))
        verdicts = task.verify([ab, even], [_program("print(-1)"), _program("print(-1)")])
        assert [v.status for v in verdicts] == ["wrong" if workers == 2 else "error"] * 2, verdicts
        if workers == 1:
            assert all("BrokenBarrierError" in v.detail for v in verdicts)
    finally:
        task.close()


def test_codecontests_split_is_where_the_problems_come_from(tmp_path):
    rows = CODECONTESTS.read_text().splitlines()
    (tmp_path / "train-00000-of-00001.jsonl").write_text(
        "\n".join(r for r in rows if '"2_A. Mean Value"' not in r) + "\n")
    (tmp_path / "valid-00000-of-00001.jsonl").write_text("\n".join(rows) + "\n")

    def names(*overrides: str) -> set[str]:
        task = _codecontests(f"source={tmp_path}", *overrides)
        task.close()
        return {p.meta["name"] for p in task.train_problems()}

    assert names() == {"1_A. Sum of Two", "EVENODD"}
    assert names("split=valid") == {"1_A. Sum of Two", "2_A. Mean Value", "EVENODD"}


def test_codecontests_sandbox_allow_unsafe_runs_programs_where_isolation_is_missing(tmp_path,
                                                                                     monkeypatch):
    from agon.tasks import sandbox as sbx

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it: the sandbox cannot isolate
    with pytest.raises(sbx.SandboxUnavailable):
        _codecontests()
    sbx._WARNED.clear()
    task = _codecontests("sandbox.allow_unsafe=true")
    try:
        assert task.sandbox.isolation == sbx.ISOLATION_UNSAFE
        ab = next(p for p in task.train_problems() if p.meta["name"] == "1_A. Sum of Two")
        assert task.verify([ab], [_program(SUM)])[0].correct
    finally:
        task.close()


# ---------------------------------------------------------------------------------------------------------------
# generation.vllm: what the worker is started with

# a stand-in for vLLM's worker: it says vLLM is installed, records the start request the engine sends and its
# environment, then answers it (or, with AGON_TEST_SILENT set, never does) and ends when told to close
STAND_IN = """\
#!{python}
import json, os, sys
if sys.argv[1] == "-c":
    sys.exit(0)
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[sys.argv.index("--fd") + 1]))
method, kwargs = conn.recv()
with open({record!r}, "w") as f:
    json.dump({{"argv": sys.argv, "method": method, "kwargs": kwargs,
               "kv_cache": os.environ.get("VLLM_CPU_KVCACHE_SPACE")}}, f)
if not os.environ.get("AGON_TEST_SILENT"):
    conn.send(("ok", {{"seconds": 0.0, "version": "stand-in"}}))
while conn.recv()[0] != "close":
    pass
conn.send(("ok", None))
"""


def _stand_in(tmp_path: Path) -> tuple[Path, Path]:
    python, record = tmp_path / "vllm-python", tmp_path / "worker.json"
    python.write_text(STAND_IN.format(python=sys.executable, record=str(record)))
    python.chmod(0o755)
    return python, record


def test_the_vllm_keys_are_what_the_worker_is_started_with(small_cfg, policies, tmp_path, monkeypatch):
    """generation.engine=vllm builds the vLLM engine, which starts the worker's python; gpu_memory_utilization,
    max_model_len, max_num_seqs, enforce_eager and the run's seed are in the start request, cpu_kv_cache_gib in its
    environment (on a CPU)."""
    from agon.engines import build_engine
    from agon.engines.vllm_engine import WORKER, VLLMEngine

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    python, record = _stand_in(tmp_path)
    vllm = ["placement=worker", f"python={python}", "gpu_memory_utilization=0.4", "cpu_kv_cache_gib=3",
            "max_model_len=200", "max_num_seqs=7", "enforce_eager=false"]
    cfg = compose_config(TEST_WORLD + ["generation.engine=vllm", "seed=5", *(f"generation.vllm.{o}" for o in vllm)])
    engine = build_engine(cfg, policies, log=lambda *_: None)
    engine.close()
    assert isinstance(engine, VLLMEngine)
    sent = json.loads(record.read_text())
    assert sent["argv"][1] == str(WORKER) and sent["method"] == "init"
    assert {k: sent["kwargs"][k] for k in ("gpu_memory_utilization", "max_model_len", "max_num_seqs",
                                             "enforce_eager", "seed")} == {
        "gpu_memory_utilization": 0.4, "max_model_len": 200, "max_num_seqs": 7, "enforce_eager": False, "seed": 5}
    assert sent["kv_cache"] == "3"
    # the defaults where the keys are null: the model's context, and no CUDA graphs on a CPU
    defaults = compose_config(TEST_WORLD + ["generation.engine=vllm", f"generation.vllm.python={python}",
                                            "generation.vllm.placement=worker"])
    build_engine(defaults, policies, log=lambda *_: None).close()
    sent = json.loads(record.read_text())["kwargs"]
    assert (sent["max_model_len"], sent["enforce_eager"], sent["max_num_seqs"]) == (policies.context, True, 256)


def test_a_vllm_worker_that_never_answers_fails_after_start_timeout_s(small_cfg, policies, tmp_path, monkeypatch):
    from agon.engines import build_engine

    monkeypatch.setenv("AGON_TEST_SILENT", "1")
    python, record = _stand_in(tmp_path)
    cfg = compose_config(TEST_WORLD + ["generation.engine=vllm", f"generation.vllm.python={python}",
                                       "generation.vllm.placement=worker", "generation.vllm.start_timeout_s=1"])
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="within 1 s \\(generation.vllm.start_timeout_s\\)"):
        build_engine(cfg, policies, log=lambda *_: None)
    assert time.monotonic() - t0 < 20 and json.loads(record.read_text())["method"] == "init"


def test_vllm_placement_inprocess_is_refused_where_vllm_does_not_import_even_with_a_worker_at_hand(tmp_path):
    """placement=worker starts the worker's python; inprocess wants vLLM in this process, which agon's environment
    lacks, and says so instead of falling back to the worker; auto takes the worker."""
    from agon.engines.vllm_engine import vllm_placement

    python, _ = _stand_in(tmp_path)

    def placement(choice: str) -> str:
        return vllm_placement(compose_config([f"generation.vllm.python={python}",
                                              f"generation.vllm.placement={choice}"]))

    assert placement("worker") == placement("auto") == "worker"
    with pytest.raises(EngineError, match="placement=inprocess"):
        placement("inprocess")


# ---------------------------------------------------------------------------------------------------------------
# the Optuna sweeper: a study of a small Hydra app whose cells report through agon.run's own trial reporter

APP = """\
import json
from types import SimpleNamespace

import hydra
import optuna

import agon.core.config  # registers hydra/sweeper=optuna
from agon.core.distributed import Ranks
from agon.run import _trial_reporter
from agon.training.tune import storage_backend


@hydra.main(config_path=".", config_name="study", version_base="1.3")
def main(cfg):
    running = len(optuna.load_study(study_name=cfg.tune.study, storage=storage_backend(cfg.tune.storage)).get_trials(
        states=(optuna.trial.TrialState.RUNNING,)))
    with open(cfg.record, "a") as f:
        f.write(json.dumps({"trial": cfg.tune.trial, "x": cfg.x, "running": running}) + "\\n")
    value = float(cfg.sign * cfg.tune.trial)  # each later trial worse under minimize (sign 1), better with -1
    report = _trial_reporter(cfg, Ranks())
    for step in range(3):
        report(SimpleNamespace(metrics={"eval/accuracy": value}), step)
    return value


if __name__ == "__main__":
    main()
"""
STUDY = """\
defaults:
  - override hydra/sweeper: optuna
  - _self_
x: 0.0
sign: 1
record: {record}
tune: {{storage: null, study: null, trial: null}}
hydra:
  mode: MULTIRUN
  sweep: {{dir: {sweep}}}
  sweeper:
    params:
      x: float(0.0, 6.0)
"""


def _study(tmp_path: Path, name: str, *overrides: str) -> list[dict]:
    """Run the app's study with ``overrides``; the record each cell wrote."""
    here = tmp_path / name
    here.mkdir()
    record = here / "cells.jsonl"
    (here / "app.py").write_text(APP)
    (here / "study.yaml").write_text(STUDY.format(record=record, sweep=here / "sweep"))
    out = subprocess.run([sys.executable, str(here / "app.py"), *overrides], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_the_optuna_sweepers_keys_set_the_study_it_runs(tmp_path):
    """One study, every key away from its default: it lives where ``storage`` and ``study_name`` say, minimises, asks
    for ``n_jobs`` trials at a time (the second is running when the first cell starts), draws its first trial from
    TPE seeded with ``seed`` and ends with ``n_trials``. Each cell reads the value drawn for it from ``params`` and
    reports to its own trial through tune.*."""
    import optuna

    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    cells = _study(tmp_path, "one", "sign=-1", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=2",
                   "hydra.sweeper.direction=minimize", f"hydra.sweeper.storage={url}",
                   "hydra.sweeper.study_name=mine", "hydra.sweeper.seed=7")
    assert not (tmp_path / "one" / "sweep" / "optuna.db").exists()
    study = optuna.load_study(study_name="mine", storage=url)
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    # each trial better than the last (so none is pruned); the best is the last one's, its lowest value
    assert study.direction == optuna.study.StudyDirection.MINIMIZE and study.best_value == -2.0
    assert "value: -2.0" in (tmp_path / "one" / "sweep" / "optuna" / "best.yaml").read_text()
    assert [c["running"] for c in cells] == [2, 2, 1]  # two trials asked for at once, then the last one
    assert all(t.intermediate_values == dict.fromkeys((0, 1, 2), -t.number) for t in trials)  # its own reports
    assert [c["trial"] for c in cells] == [0, 1, 2] and [c["x"] for c in cells] == [t.params["x"] for t in trials]
    assert all(t.distributions["x"] == optuna.distributions.FloatDistribution(0.0, 6.0) for t in trials)
    fresh = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=7))
    assert trials[0].params["x"] == fresh.ask({"x": optuna.distributions.FloatDistribution(0.0, 6.0)}).params["x"]


# A trial's cell prunes through agon.training.tune.TrialReporter, in its own process, with the study loaded from
# storage: the sweeper's pruner settings reach it only as the study attribute agon.training.tune.PRUNER_ATTR (Optuna's
# default pruner, 5 startup trials and no warm-up, decided alone before that)
def test_the_optuna_sweepers_pruner_keys_set_when_a_trial_is_pruned(tmp_path):
    """Each trial is worse than all before it. ``pruner_startup_trials=1``: from the second trial on, a trial below
    the median is pruned (the default 2 would spare the second); ``pruner_warmup_steps=1``: never at step 0."""
    import optuna

    _study(tmp_path, "pruned", "hydra.sweeper.n_trials=3", "hydra.sweeper.direction=minimize",
           "hydra.sweeper.pruner_startup_trials=1", "hydra.sweeper.pruner_warmup_steps=1")
    trials = optuna.load_study(study_name="app", storage=f"sqlite:///{tmp_path / 'pruned' / 'sweep' / 'optuna.db'}"
                               ).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] + [optuna.trial.TrialState.PRUNED] * 2
    assert [sorted(t.intermediate_values) for t in trials] == [[0, 1, 2], [0, 1], [0, 1]]
