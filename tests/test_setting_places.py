"""Every place a setting lives in, and every part of a quantity, read by each check and estimate that uses it.

A setting can live in more than one key: the sampling values in ``model.*`` (the model card's), ``trainer.*`` and
``eval.*``; the budget of new tokens and the generation call's tokens in ``trainer.*`` and ``eval.*``. A quantity can
have parts: an evaluation's problems (``task.heldout_size`` cut to ``eval.n_problems``, an interim one cut further to
``eval.interim_problems``), its chunks, the diagnostic's generations at each evaluation, a run's start, interim and
final evaluations, a challenge's prompt (the problem and the recap). A consumer that reads one place passes every
test that moves only that one; here every place is moved alone, with every other place set apart explicitly
(``APART``), and the consumer's output must move the right way: the config check refuses naming the place, the
context and slow-engine checks refuse at that place's budget, the memory model grows with training's budget and not
with evaluation's, and each phase of the estimate moves with exactly the places it reads.

The places are derived, not picked: every pair of keys an interpolation joins, in the schema's defaults
(``agon/core/config.py``) and in the YAML under conf/. ``PLACES`` must equal what is derived, so a setting given a
new place fails here until it is listed, and every consumer's ``READS`` must name every place of each setting it
reads or say in ``IGNORED`` why it leaves one.

Cheap: configs composed once and copied, the estimate's arithmetic on made-up costs, the memory model on the meta
device, the tiny tokenizer; one chunked evaluation and two diagnostics of two problems on the test world, their
completions counted against the estimate's.

Left out on purpose: the engines' use of the sampling values (tests/test_sampling_settings.py and the diagnostic's
test in tests/test_eval.py), the estimate's accuracy (tests/test_estimate.py), and what a committed chunk holds
after a kill (tests/test_resume.py).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import re
import typing
from types import SimpleNamespace

import pytest
import yaml
from omegaconf import OmegaConf

from agon.core.config import CONF_DIR, TASK_SCHEMAS, Config, ConfigError
from agon.training import estimate as model
from agon.training.checks import _dotted, validate
from agon.training.estimate import Costs, Lengths
from tests.conftest import TEST_WORLD, RecordingEngine, compose_config

# every setting that lives in more than one key, and its places (the first test derives them)
PLACES = {
    "temperature": ("model.temperature", "trainer.temperature", "eval.temperature"),
    "top_p": ("model.top_p", "trainer.top_p", "eval.top_p"),
    "top_k": ("model.top_k", "trainer.top_k", "eval.top_k"),
    "max_new_tokens": ("trainer.max_new_tokens", "eval.max_new_tokens"),
    "generation_batch_tokens": ("trainer.generation_batch_tokens", "eval.generation_batch_tokens"),
}
# every place at a valid value of its own, none equal to another's, so that a consumer reading the wrong one is seen
APART = {
    "model.temperature": 0.7, "trainer.temperature": 0.8, "eval.temperature": 0.9,
    "model.top_p": 0.9, "trainer.top_p": 0.8, "eval.top_p": 0.7,
    "model.top_k": 5, "trainer.top_k": 6, "eval.top_k": 7,
    "trainer.max_new_tokens": 40, "eval.max_new_tokens": 50,
    "trainer.generation_batch_tokens": 4000, "eval.generation_batch_tokens": 5000,
}
# a value out of each setting's range, printed as the config check prints it
INVALID = {"temperature": -0.5, "top_p": 1.5, "top_k": -1, "max_new_tokens": 0, "generation_batch_tokens": 0}
# quantities whose parts are keys of other names
PARTS = {
    "problems of an evaluation": ("task.heldout_size", "eval.n_problems", "eval.interim_problems"),
    "samples of an evaluation": ("eval.samples", "eval.interim_samples", "eval.diagnostic_samples"),
    "generations of an evaluation": ("eval.chunk_problems", "eval.diagnostic", "eval.diagnostic_samples"),
    "evaluations of a run": ("eval.at_start", "eval.every", "trainer.max_steps"),
    "rows of a step": ("trainer.prompts_per_step", "trainer.num_generations"),
    "passes of an update": ("trainer.num_iterations", "trainer.beta"),
}
# consumer -> setting -> the places it reads
READS = {
    "config check": dict(PLACES),
    "context check": {"max_new_tokens": PLACES["max_new_tokens"]},
    "slow-engine check": {"max_new_tokens": PLACES["max_new_tokens"]},
    "memory check": {"max_new_tokens": ("trainer.max_new_tokens",)},
    "estimate": {"max_new_tokens": PLACES["max_new_tokens"],
                 "generation_batch_tokens": PLACES["generation_batch_tokens"]},
}
# (consumer, place) -> why the consumer leaves that place of a setting it reads (the test moves it and sees nothing)
IGNORED = {
    ("memory check", "eval.max_new_tokens"): "the update scores training's completions; an evaluation's are sampled "
                                             "and graded, never scored with a graph",
}


# ---------------------------------------------------------------------------------------------------------------
# the places, derived

LINK = re.compile(r"^\$\{([\w.]+)\}$")


def _schema_links(schema: type, prefix: str = "") -> set[tuple[str, str]]:
    """(key, key it reads) of every field whose default is an interpolation, nested dataclasses included."""
    out = set()
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if isinstance(f.default, str) and LINK.match(f.default):
            out.add((prefix + f.name, LINK.match(f.default)[1]))
        if dataclasses.is_dataclass(hints.get(f.name)):
            out |= _schema_links(hints[f.name], f"{prefix}{f.name}.")
    return out


def _yaml_links() -> set[tuple[str, str]]:
    """(key, key it reads) of every value of the YAML under conf/ that is an interpolation of another key."""
    out = set()

    def walk(node: typing.Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k not in ("defaults", "hydra"):
                    walk(v, f"{prefix}{k}.")
        elif isinstance(node, str) and LINK.match(node):
            out.add((prefix[:-1], LINK.match(node)[1]))

    for path in CONF_DIR.rglob("*.yaml"):
        if path.relative_to(CONF_DIR).parts[0] == "hydra":  # Hydra's own settings: none of agon's
            continue
        text = path.read_text()
        group = "" if "@package _global_" in text else ".".join(path.relative_to(CONF_DIR).parent.parts)
        walk(yaml.safe_load(text), f"{group}." if group else "")
    return out


def _settings(links: set[tuple[str, str]]) -> dict[str, set[str]]:
    """The keys joined by ``links``, one set per setting, named by their common last component."""
    groups: list[set[str]] = []
    for a, b in links:
        joined = [g for g in groups if a in g or b in g]
        groups = [g for g in groups if g not in joined] + [set().union({a, b}, *joined)]
    out = {}
    for g in groups:
        names = {k.rsplit(".", 1)[-1] for k in g}
        assert len(names) == 1, f"one interpolation joins keys of different names: {sorted(g)}"
        out[names.pop()] = g
    return out


def test_the_places_listed_are_every_key_an_interpolation_joins_in_the_schema_and_in_conf():
    schema = _schema_links(Config) | {(f"task.{a}", b) for s in TASK_SCHEMAS.values() for a, b in _schema_links(s)}
    assert schema == _yaml_links()  # the schema's defaults and the shipped YAML share a setting between the same keys
    assert {k: set(v) for k, v in PLACES.items()} == _settings(schema)
    assert set(APART) == {p for places in PLACES.values() for p in places} and set(INVALID) == set(PLACES)
    keys = set(_dotted(Config)) | {f"task.{k}" for s in TASK_SCHEMAS.values() for k in _dotted(s)}
    assert {p for parts in PARTS.values() for p in parts} <= keys


def test_every_consumer_reads_every_place_of_a_setting_it_reads_or_says_why_not():
    for consumer, settings in READS.items():
        for setting, places in settings.items():
            left = {p for (c, p) in IGNORED if c == consumer and p in PLACES[setting]}
            assert set(places) | left == set(PLACES[setting]) and not set(places) & left, (consumer, setting)
    assert all(c in READS for c, _ in IGNORED)


def test_each_consumer_lists_every_setting_of_several_places_its_code_reads():
    """A consumer whose code starts reading a setting that lives in several places must be listed in ``READS`` for it,
    so that every place of it is moved below."""
    from agon.training.checks import _check_ranges
    from agon.training.memory import fitting_settings, update_memory
    from agon.training.preflight import check_context, check_engine

    code = {"config check": (validate, _check_ranges), "context check": (check_context,),
            "slow-engine check": (check_engine,), "memory check": (update_memory, fitting_settings),
            "estimate": (model.plan,)}
    assert set(code) == set(READS)
    for consumer, functions in code.items():
        source = "\n".join(inspect.getsource(f) for f in functions)
        assert {s for s in PLACES if re.search(rf"\.{s}\b", source)} == set(READS[consumer]), consumer


@functools.lru_cache(maxsize=None)
def _composed(*overrides: str):
    return compose_config([f"{k}={v}" for k, v in APART.items()] + list(overrides))


def _apart(moved: dict | None = None, *overrides: str):
    """The config with every place set apart (and ``overrides``), then the keys of ``moved`` set: a copy, composed
    once."""
    cfg = copy.deepcopy(_composed(*overrides))
    for key, value in (moved or {}).items():
        OmegaConf.update(cfg, key, value)
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# the checks

COUNTS = [p for part in ("problems of an evaluation", "samples of an evaluation") for p in PARTS[part]] + [
    "eval.chunk_problems"]


@pytest.mark.parametrize("place,bad", [(place, INVALID[setting]) for setting, places in READS["config check"].items()
                                       for place in places] + [(key, 0) for key in COUNTS])
def test_the_config_check_refuses_a_bad_value_in_any_one_place_and_names_that_place(place, bad):
    validate(_apart())  # every other place is valid: the one moved is what is refused
    with pytest.raises(ConfigError) as refused:
        validate(_apart({place: bad}))
    assert str(refused.value).startswith(f"{place}={bad} "), str(refused.value)


@pytest.mark.parametrize("group", ["trainer", "eval"])
def test_each_generation_call_budget_is_checked_against_its_own_groups_budget_of_new_tokens(group):
    batch = APART[f"{group}.generation_batch_tokens"]
    validate(_apart({f"{group}.max_new_tokens": batch}))
    with pytest.raises(ConfigError) as refused:
        validate(_apart({f"{group}.max_new_tokens": batch + 1}))
    assert str(refused.value).startswith(f"{group}.generation_batch_tokens={batch} cannot hold one completion of "
                                         f"{group}.max_new_tokens={batch + 1}")


SMALL_TASK = ("task.heldout_size=20", "task.train_size=200", "eval.n_problems=20")


@functools.lru_cache(maxsize=None)
def _task_and_tokenizer():
    from agon.models.world import build_tokenizer
    from agon.tasks import build_task

    return build_task(_apart(None, *SMALL_TASK).task), build_tokenizer()


@pytest.mark.parametrize("place", READS["context check"]["max_new_tokens"])
def test_the_context_check_refuses_the_budget_of_either_place_one_token_past_the_context(place):
    from agon.training.preflight import check_context

    task, tokenizer = _task_and_tokenizer()
    longest = check_context(_apart(None, *SMALL_TASK), task, tokenizer, context=256)
    check_context(_apart({place: 256 - longest}, *SMALL_TASK), task, tokenizer, context=256)
    with pytest.raises(ConfigError, match=rf"plus {re.escape(place)}={257 - longest} is 257 tokens"):
        check_context(_apart({place: 257 - longest}, *SMALL_TASK), task, tokenizer, context=256)


@pytest.mark.parametrize("place", READS["slow-engine check"]["max_new_tokens"])
def test_the_slow_engine_check_refuses_the_fallback_at_a_long_budget_in_either_place(place, monkeypatch):
    from agon.training.preflight import ALLOW_SLOW, LONG_BUDGET, check_engine

    monkeypatch.setenv("AGON_VLLM_PYTHON", "/nonexistent/python")  # vLLM installed nowhere
    fallback = {"generation.engine": "vllm", "generation.fallback": "hf_continuous"}
    check_engine(_apart({**fallback, place: LONG_BUDGET - 1}))
    with pytest.raises(ConfigError, match=f"at {LONG_BUDGET:,} new tokens its fallback"):
        check_engine(_apart({**fallback, place: LONG_BUDGET}))
    # without a fallback the refusal names the opt-in a fallback would need, at a long budget only
    for budget, said in ((LONG_BUDGET - 1, False), (LONG_BUDGET, True)):
        with pytest.raises(ConfigError) as refused:
            check_engine(_apart({**fallback, "generation.fallback": None, place: budget}))
        assert (f"at this budget also {ALLOW_SLOW}" in str(refused.value)) == said


def test_the_memory_check_grows_with_trainings_budget_and_not_with_evaluations():
    """Qwen3-0.6B's paper update fits the trainer's share of an H100 beside vLLM; a solo training row of 400k tokens
    does not. The budget that moves the update is training's; evaluation's, moved alone, changes nothing."""
    from agon.training.memory import PROMPT_TOKENS, update_memory
    from agon.training.preflight import check_memory

    paper = ["experiment=paper_deepmath"]  # Qwen3-0.6B, as the command test below
    h100 = model.GPUS["H100"].memory_gib
    base = update_memory(_apart(None, *paper))
    check_memory(_apart(None, *paper), h100, "an H100")
    long = 400_000
    for place in READS["memory check"]["max_new_tokens"]:
        moved = update_memory(_apart({place: long}, *paper))
        assert moved.tokens == long + PROMPT_TOKENS and moved.needed > base.needed
        with pytest.raises(ConfigError, match="its first update would run out of memory"):
            check_memory(_apart({place: long}, *paper), h100, "an H100")
    for (consumer, place) in IGNORED:
        if consumer == "memory check":
            assert update_memory(_apart({place: long}, *paper)) == base
            check_memory(_apart({place: long}, *paper), h100, "an H100")


# ---------------------------------------------------------------------------------------------------------------
# the estimate

# every term of the time model at a cost, so that anything a plan reads shows in seconds
EVERY_TERM = dict(fixed=1e-3, per_row=1e-5, per_context=1e-8, per_call=0.05, per_prompt_token=1e-5,
                  per_request=1e-4, per_publish=0.5, per_scored_token=1e-5, per_pass=0.01, per_completion=1e-3,
                  per_commit=1e-4)
# (engine, streamed): the static engine, continuous batching whose cache is the call's token budget, vLLM both ways
ENGINES = [("hf", False), ("hf_continuous", False), ("vllm", False), ("vllm", True)]
# engines whose time depends on a call's generation_batch_tokens: hf cuts its calls by it, hf_continuous's paged
# cache holds it; vLLM's cache is its share of the card
BATCHED = ("hf", "hf_continuous")
# a cell with every phase: start, 30 steps, interim evaluations at steps 10 and 20 on a size of their own, final;
# 130 problems in chunks of 64 (the last one short), the diagnostic at every evaluation
CELL = ("trainer.max_steps=30", "eval.every=10", "eval.n_problems=130", "eval.samples=3", "eval.interim_problems=40",
        "eval.interim_samples=2", "eval.chunk_problems=64", "eval.diagnostic=true", "task.heldout_size=300")
START, STEPS, INTERIM, FINAL = "start evaluation", "training steps", "interim evaluations", "final evaluation"
EVALUATIONS = (START, INTERIM, FINAL)
# place -> (its value moved, the phases that grow, or shrink with a leading "-"), every other phase unchanged
MOVES = {
    "trainer.max_new_tokens": (80, (STEPS,)),
    "eval.max_new_tokens": (100, EVALUATIONS),
    "trainer.generation_batch_tokens": (1000, (STEPS,)),
    "eval.generation_batch_tokens": (600, EVALUATIONS),
    "eval.n_problems": (200, (START, FINAL)),
    "eval.samples": (5, (START, FINAL)),
    "eval.interim_problems": (60, (INTERIM,)),
    "eval.interim_samples": (3, (INTERIM,)),
    "task.heldout_size": (100, ("-" + START, "-" + FINAL)),
    "eval.diagnostic_samples": (2, EVALUATIONS),
    "eval.diagnostic": (False, tuple("-" + p for p in EVALUATIONS)),
    "trainer.prompts_per_step": (32, (STEPS,)),
    "trainer.num_generations": (16, (STEPS,)),
    # the update's passes: more epochs over the batch, a KL reference scored with the adapters off
    "trainer.num_iterations": (2, (STEPS,)),
    "trainer.beta": (0.04, (STEPS,)),
}


def _phases(cfg, engine: str, streamed: bool, prompt: float = 30, challenge: float = 60) -> dict[str, model.Phase]:
    p = model.plan(cfg, prompt, challenge, streams=streamed)
    return {ph.name: ph for ph in model.cell(p, Costs(engine, **EVERY_TERM))}


def test_every_place_and_part_the_estimate_reads_is_moved_below():
    assert {p for places in READS["estimate"].values() for p in places} <= set(MOVES)
    assert {p for part in ("problems of an evaluation", "samples of an evaluation", "rows of a step",
                           "passes of an update")
            for p in PARTS[part]} <= set(MOVES)


@pytest.mark.parametrize("place", list(MOVES))
@pytest.mark.parametrize("engine,streamed", ENGINES)
def test_each_place_moved_alone_moves_exactly_the_phases_of_the_estimate_that_read_it(place, engine, streamed):
    value, phases = MOVES[place]
    if place.endswith("generation_batch_tokens") and engine not in BATCHED:
        phases = ()
    base, moved = (_phases(cfg, engine, streamed) for cfg in (_apart(None, *CELL), _apart({place: value}, *CELL)))
    assert list(base) == list(moved) == [START, STEPS, INTERIM, FINAL]
    for name in base:
        a, b = base[name], moved[name]
        units = (a.early_s, a.late_s, a.total_s), (b.early_s, b.late_s, b.total_s)
        if name in phases:
            assert all(y > x for x, y in zip(*units)), (name, units)
        elif "-" + name in phases:
            assert all(y < x for x, y in zip(*units)), (name, units)
        else:
            assert units[0] == units[1], (name, units)


def _count(engine: str, term: str) -> Costs:
    """Costs of one term alone at 1: the seconds count what that term counts (completions, tokens)."""
    zero = {k: 0.0 for k in ("fixed", "per_row", "per_context", "per_call", "per_prompt_token")}
    return Costs(engine, **{**zero, term: 1.0})


@pytest.mark.parametrize("engine,streamed", ENGINES)
@pytest.mark.parametrize("chunk", [1, 7, 64, 130, 500])
def test_an_evaluations_chunks_sum_to_all_its_problems_short_last_chunk_included(engine, streamed, chunk):
    """130 problems x 3 samples x (2 orders x 2 stages + 2 self-cascades' answers): every chunk's completions
    counted, each to its budget early, however the problems are cut."""
    cfg = _apart({"eval.chunk_problems": chunk}, *CELL)
    OmegaConf.update(cfg, "eval.diagnostic", False)
    p = model.plan(cfg, 30, 60, streams=streamed)
    early = Lengths.at(p.eval_budget, 1.0)
    completions = 130 * 3 * 6
    assert model.eval_seconds(p, _count(engine, "per_completion"), early, p.full) == completions
    assert model.eval_seconds(p, _count(engine, "per_row"), early, p.full) == completions * p.eval_budget


@pytest.mark.parametrize("heldout,n,interim", [(300, 130, 40), (100, 130, 40), (100, 130, 120), (300, 130, 500),
                                               (20, 130, None)])
def test_the_estimate_plans_the_problems_the_trainer_scores_the_held_out_split_cut_by_each_count(heldout, n, interim):
    """The trainer scores the held-out split cut to eval.n_problems, and an interim evaluation that cut to
    eval.interim_problems: the smallest of the three, each a bound the estimate must read."""
    from agon.game.cascade import eval_size
    from agon.tasks import build_task

    cfg = _apart({"task.heldout_size": heldout, "eval.n_problems": n, "eval.interim_problems": interim}, *CELL)
    OmegaConf.update(cfg, "eval.diagnostic", False)
    split = list(build_task(cfg.task).heldout_problems())[: cfg.eval.n_problems]  # Trainer.heldout
    p = model.plan(cfg, 30, 60)
    completions = _count("hf", "per_completion")
    for phase, size in (("final", p.full), ("train", p.interim)):
        problems, samples = eval_size(cfg.eval, phase)
        scored = len(split[:problems])  # Trainer.evaluate
        assert model.eval_seconds(p, completions, Lengths.at(50, 1.0), size) == scored * samples * 6, phase


def _interim_steps(cfg) -> list[int]:
    """The steps after which the trainer evaluates (``Trainer._interim_due``, run on each step of the cell)."""
    from agon.training.trainer import Trainer

    return [s for s in range(cfg.trainer.max_steps + 1)
            if Trainer._interim_due(SimpleNamespace(cfg=cfg, t=cfg.trainer, state=SimpleNamespace(step=s)))]


@pytest.mark.parametrize("moved", [{}, {"eval.at_start": False}, {"eval.every": 0}, {"eval.every": 7},
                                   {"trainer.max_steps": 0}, {"method.train": False}, {"eval.every": 30}])
def test_a_cells_total_is_its_start_its_steps_its_interim_evaluations_and_its_final_one(moved):
    """Each phase counted as the trainer plays it, its total its units (at one length throughout), and the cell's
    total, as ``python -m agon.estimate`` and the start-up line print it, the sum of its phases."""
    from agon.estimate import report

    cfg = _apart(moved, *CELL)
    costs = Costs("hf", **EVERY_TERM)
    p = model.plan(cfg, 30, 60)
    phases = {ph.name: ph for ph in model.cell(p, costs, early=0.5, late=0.5)}
    trains = cfg.method.train and cfg.trainer.max_steps > 0
    counts = {START: int(cfg.eval.at_start), STEPS: cfg.trainer.max_steps if trains else 0,
              INTERIM: len(_interim_steps(cfg)) if trains else 0, FINAL: 1}
    assert {name: ph.count for name, ph in phases.items()} == {k: v for k, v in counts.items() if v}
    for ph in phases.values():
        assert ph.total_s == pytest.approx(ph.count * ph.early_s) and ph.early_s == ph.late_s > 0
    phases = model.cell(p, costs)
    _, two, streamed = report("cell", cfg, costs, 30, 60, 1.0, model.LATE_FRACTION)
    assert two == streamed == pytest.approx(sum(ph.total_s for ph in phases))
    line = model.Estimate(model.Probe(costs, 30, 60, 64, (30, 60)), p, tuple(phases)).line()
    assert f"the run about {model.duration(sum(ph.total_s for ph in phases))}." in line


def test_the_commands_challenge_prompt_is_the_problem_and_the_recap_each_moving_the_hours(capsys):
    """``python -m agon.estimate --gpu-check``: a challenge reads its problem's prompt and a recap; either part
    moved alone lengthens the challenges and the cell."""
    from agon.estimate import main

    check = CONF_DIR.parent / "docs" / "gpu-h200-2026-12-04.json"

    def printed(*flags: str) -> tuple[float, float, float]:
        assert main(["experiment=paper_deepmath", "--gpu-check", str(check), *flags]) == 0
        out = capsys.readouterr().out
        prompts, challenges = re.search(r"prompts (\d+) tokens, challenges (\d+)", out).groups()
        hours = re.search(r"^\s+cell\s+[\d.]+ h\s+([\d.]+) h$", out, re.M)[1]
        return float(prompts), float(challenges), float(hours)

    base = printed()
    assert base[:2] == (256, 256 + 256)  # the command's defaults
    more_prompt = printed("--prompt-tokens", "8192")
    more_recap = printed("--recap-tokens", "8192")
    assert more_prompt[:2] == (8192, 8192 + 256) and more_prompt[2] > base[2]
    assert more_recap[:2] == (256, 256 + 8192) and more_recap[2] > base[2]


# ---------------------------------------------------------------------------------------------------------------
# the estimate's counts against what an evaluation and a diagnostic sample on the test world

TINY_EVAL = ["logger=none", "progress=false", "trainer.max_new_tokens=4", "eval.samples=2", "eval.chunk_problems=2",
             "eval.diagnostic_samples=1"]


@pytest.fixture
def one_thread():
    """torch on one thread: a tiny model's small calls on two threads, a core of them held by another process,
    thrash (ten times slower on a busy machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _sampled(engine: RecordingEngine) -> tuple[int, int]:
    """(engine calls, completions) the engine was asked for."""
    return len(engine.calls), sum(len(out) for _, _, out in engine.calls)


def test_a_chunked_evaluation_plays_every_problem_once_and_the_estimate_counts_its_calls_and_completions(
        policies, tmp_path, one_thread):
    """5 problems x 2 samples in chunks of 2 (the last one short): each problem's samples in every order, the
    completions and ``generate`` calls the estimate counts, each chunk committed and read back instead of played."""
    from agon.game.cascade import PartStore, evaluate
    from agon.tasks import build_task

    cfg = compose_config(TEST_WORLD + TINY_EVAL + ["eval.n_problems=5"])
    task = build_task(cfg.task)
    problems = list(task.heldout_problems())[:5]
    engine, store, said = RecordingEngine(policies), PartStore(tmp_path, "parts"), []
    result = evaluate(policies, task, cfg, problems, 0, "final", engine=engine, store=store, log=said.append)
    for order in result.games:
        ids = [r["problem_id"] for r in result.rows if r["order"] == order and r["stage"] == "final"]
        assert sorted(ids) == sorted(p.id for p in problems for _ in range(2)), order
    assert result.metrics["eval/n_problems"] == 5 and result.metrics["eval/samples"] == 2
    p = model.plan(cfg, 10, 20)
    early = Lengths.at(p.eval_budget, 1.0)
    assert _sampled(engine) == (model.eval_seconds(p, _count("hf", "per_call"), early, p.full),
                                model.eval_seconds(p, _count("hf", "per_completion"), early, p.full)) == (
        3 * 6, 5 * 2 * 6)
    assert len(list(store.dir.glob("chunk_*.pt"))) == 3 and "3 of 3 chunks played" in said[0]
    again = evaluate(policies, task, cfg, problems, 0, "final", engine=RecordingEngine(policies), store=store,
                     log=said.append)
    assert again.rows == result.rows and "0 of 3 chunks played in 0 engine calls, 3 kept" in said[1]


@pytest.mark.parametrize("exchange", ["visible", "hidden"])
def test_the_estimate_counts_the_diagnostics_completions_at_every_evaluation(exchange, policies, one_thread):
    """``agon.game.diagnostic.diagnose`` on 2 problems x ``eval.diagnostic_samples``: every call and completion it
    samples is in the estimate of an evaluation with ``eval.diagnostic``, and none without. The estimate counts a
    wrong recap for every row (an upper bound): the diagnostic asks each challenger only on the rows where a slip
    shows in the recap (``recap/n_wrong``); so too each kind of the check battery, asked only on the rows the task
    made it for (``battery/n/<kind>``: arithmetic makes no dead end)."""
    from agon.game.diagnostic import diagnose
    from agon.tasks import BATTERY_KINDS, build_task

    cfg = compose_config(TEST_WORLD + TINY_EVAL + [f"exchange={exchange}", "eval.n_problems=2"])
    task = build_task(cfg.task)
    engine = RecordingEngine(policies)
    out = diagnose(policies, task, cfg, list(task.heldout_problems())[:2], engine)
    made = [int(out[f"battery/n/{kind}"]) for kind in BATTERY_KINDS]
    assert made[BATTERY_KINDS.index("dead_end")] == 0 and max(made) == 2
    wrong = int(out["recap/n_wrong"])
    off = model.plan(cfg, 10, 20)
    OmegaConf.update(cfg, "eval.diagnostic", True)
    on = model.plan(cfg, 10, 20)
    early = Lengths.at(on.eval_budget, 1.0)
    counted = tuple(model.eval_seconds(on, _count("hf", term), early, on.full)
                    - model.eval_seconds(off, _count("hf", term), early, off.full)
                    for term in ("per_call", "per_completion"))
    calls, completions = _sampled(engine)
    challengers = 3  # A, B and the base
    assert counted == (calls + challengers * ((wrong == 0) + made.count(0)),
                       completions + challengers * (2 - wrong + sum(2 - n for n in made)))
    if exchange == "visible":  # conf/eval/default.yaml: 3 drafts and 30 answers per sample
        assert counted == (33, 2 * 33)


def test_the_diagnostics_recap_conditions_follow_whether_the_task_has_worked_solutions():
    """A task with worked solutions plays a correct and a wrong recap for every player on top of the rest; one
    without (DeepMath, CodeContests) plays neither: each of the diagnostic's counts is a part the task decides."""
    drafts, answers = model.diagnostic_calls(compose_config(["task=arithmetic"]))
    for task in ("deepmath_hard", "codecontests"):
        assert model.diagnostic_calls(compose_config([f"task={task}"])) == (drafts, answers - 2 * drafts)
