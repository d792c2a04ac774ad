"""The start-up estimate (``agon.training.estimate``) and its command (``python -m agon.estimate``): the time model on
hand-worked numbers, the calls it counts against those a real step and evaluation make, the command on the H200
check's JSON (the paper cell's hours that docs/gpu.md and docs/training.md quote), a config mistake failing before
any model loads, and the estimate against measured steps and evaluations of the test world: ``hf`` here, vLLM under
``make test-vllm``.

The accuracy tests run on a busy machine: torch on one thread (two threads on a core another process holds thrash),
the estimate and what it estimates measured side by side in one process, in rounds (three, two on vLLM), and one
round in which everything agrees is enough (another process's burst between a probe and its step throws one round
off). The tolerance is a factor of 1.5 (``TOLERANCE``): each measured time within the start-up line's early and late
bounds widened by it, and the model at the lengths the run sampled within it of the measured time.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import pytest
import torch

from agon.estimate import cells, main
from agon.records.recorder import Recorder
from agon.training import estimate as model
from agon.training.estimate import Costs, Lengths, Stage
from tests.conftest import TEST_WORLD, compose_config

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "docs" / "gpu-h200-2026-12-04.json"
TOLERANCE = 1.5


@contextlib.contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _calls_only(engine: str, **kw) -> Costs:
    """Costs in which only a call costs anything (one second), or only a decoding step: seconds count them."""
    return Costs(engine, **{"fixed": 0.0, "per_row": 0.0, "per_context": 0.0, "per_call": 0.0,
                            "per_prompt_token": 0.0, **kw})


def test_the_time_model_on_hand_worked_numbers():
    c = Costs("vllm", fixed=1.0, per_row=0.1, per_context=0.001, per_call=2.0, per_prompt_token=0.01,
              capacity=1000, max_rows=4)
    s = Stage(rows=8, prompt=10, lengths=Lengths.at(20, 1.0))
    # 160 tokens; each row reads 10 x 20 + 20^2 / 2 = 400 tokens of context, 3,200 in all; steps: the longest row 20,
    # 160 tokens / 4 rows at a time = 40, 3,200 / 1,000 of cache = 3.2: 40. Call 2 + prefill 80 x 0.01 + 40 x 1 +
    # 160 x 0.1 + 3,200 x 0.001
    assert model.continuous_seconds(c, [s], 20) == pytest.approx(2 + 0.8 + 40 + 16 + 3.2)
    # hf: 60 tokens per call hold 2 rows of 10 + 20: 4 calls of 20 steps; each row 0.01 x 10 + 0.1 x 20 + 0.001 x 400
    hf = Costs("hf", fixed=1.0, per_row=0.1, per_context=0.001, per_call=2.0, per_prompt_token=0.01)
    assert model.static_seconds(hf, s, 60) == pytest.approx(4 * (2 + 20) + 8 * 2.5)
    late = Lengths.at(100, 0.25)  # a mean of 25, its square 1.43 x 625 (below 100 x 25), the longest at the budget
    assert (late.mean, late.square, late.longest) == (25, pytest.approx(893.75), 100)
    assert model.chain(late, late) == 125 and model.chain(Lengths.at(100, 1), Lengths.at(100, 1)) == 200
    def truth(rows: int, context: float) -> float:  # 1 ms + 10 us per row + 1 ns per row and token of context
        return 1e-3 + 1e-5 * rows + 1e-9 * rows * context

    fitted = model.fit(64, 8, (20, 500), truth(64, 20), truth(64, 500), truth(8, 20))
    assert fitted == pytest.approx((1e-3, 1e-5, 1e-9))


def test_a_streamed_step_waits_one_chain_and_a_hidden_one_its_longest_completion():
    """Seconds of a step where only a decoding step costs (1 s): the steps it waits."""
    steps = _calls_only("vllm", fixed=1.0)
    cfg = compose_config([])
    early, late = Lengths.at(72, 1.0), Lengths.at(72, 0.25)
    visible, hidden = (model.plan(cfg, 12, 30, streams=True), model.plan(compose_config(["exchange=hidden"]), 12, 30,
                                                                          streams=True))
    two = model.plan(cfg, 12, 30, streams=False)
    assert model.step_seconds(two, steps, late) == 2 * 72  # two calls, each to its longest row
    assert model.step_seconds(visible, steps, late) == 72 + 18  # a longest draft, then a mean challenge
    assert model.step_seconds(visible, steps, early) == 2 * 72  # every completion to the budget: no overlap
    assert model.step_seconds(hidden, steps, early) == 72  # drafts and challenges side by side
    assert not model.plan(compose_config([]), 12, 30, streams=False).streamed
    assert not model.plan(compose_config(["generation.stream=false"]), 12, 30, streams=True).streamed


@pytest.mark.parametrize("overrides,engine,streams,step_calls,eval_calls", [
    # 200 problems in 4 chunks of 64: each chunk 2 orders x 2 stages, and an answer per self-cascade (A>A, B>B)
    ([], "hf", False, 2, 4 * (2 * 2 + 2)),
    # 2,000 // (12 + 72) = 23 rows a call: 6 for 128 rows, 12 for a chunk's 256, 2 for the last chunk's 32
    (["trainer.generation_batch_tokens=2000", "eval.generation_batch_tokens=2000"], "hf", False,
     2 * 6, 3 * (6 * 12) + 6 * 2),
    ([], "hf_continuous", False, 2, 24),
    ([], "vllm", False, 2, 24),
    ([], "vllm", True, 1, 2),  # the plays in one call, the self-cascades in a second
    (["method=grpo"], "vllm", False, 1, 4 * 2),
    (["method=grpo", "eval.equal_generations=false"], "vllm", False, 1, 4),
    (["method=moa"], "hf", False, 0, 4 * 2),  # the base drafts and answers: one play
])
def test_the_calls_a_step_and_an_evaluation_make_on_each_engine(overrides, engine, streams, step_calls, eval_calls):
    cfg = compose_config(overrides)
    p = model.plan(cfg, 12, 12, streams=streams)
    calls = _calls_only(engine, per_call=1.0, max_rows=256)
    assert model.step_seconds(p, calls, Lengths.at(72, 1.0)) == step_calls
    assert model.eval_seconds(p, calls, Lengths.at(72, 1.0), p.full) == eval_calls


class _Calls(list):
    """Each engine call's completion lengths (a list of them per call), and each call's prompts (``prompts``)."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[list[str]] = []

    def clear(self) -> None:
        super().clear()
        self.prompts.clear()


def _count_calls(engine) -> _Calls:
    """The engine's calls as it makes them: vLLM's conversations with its worker (``_play``), each ``generate`` of
    ``hf`` (``Policies._generate``), each ``sample`` call of the others."""
    from agon.engines.hf import HFEngine

    owner = engine.policies if isinstance(engine, HFEngine) else engine
    name = "_play" if hasattr(engine, "_play") else "_generate" if owner is not engine else "sample"
    made = _Calls()
    inner = getattr(owner, name)

    def counted(requests, *args, **kwargs):
        out = inner(requests, *args, **kwargs)
        made.append([c.n_tokens for c in out])
        made.prompts.append([getattr(r, "prompt", r) for r in requests])
        return out

    setattr(owner, name, counted)
    return made


def _trainer(cfg, tmp_path, base=None):
    """A trainer of ``cfg`` in ``tmp_path``: built as a run builds it, or over ``base``'s model, task and engine."""
    from agon.run import build_trainer
    from agon.training.trainer import Trainer

    tmp_path.mkdir(parents=True, exist_ok=True)
    if base is None:
        return build_trainer(cfg, tmp_path, Recorder(tmp_path, None), log=lambda *_: None)
    return Trainer(cfg, base.policies, base.task, Recorder(tmp_path, None), tmp_path, log=lambda *_: None,
                   engine=base.engine)


def test_the_counted_calls_are_those_a_real_step_and_evaluation_make(agon_cache, tmp_path):
    """On the test world with ``hf`` and a token budget that cuts each stage into several ``generate`` calls: the
    calls made lie between the model's counts at the narrowest and at the widest prompts of each kind (``generate``
    pads a call's rows to its widest, so a call holds at least the rows of the widest prompt)."""
    cfg = compose_config(TEST_WORLD + ["logger=none", "progress=false", "trainer.prompts_per_step=4",
                                       "trainer.num_generations=4", "trainer.max_new_tokens=24",
                                       "trainer.generation_batch_tokens=300", "eval.n_problems=6", "eval.samples=2",
                                       "eval.chunk_problems=4"])
    trainer = _trainer(cfg, tmp_path / "run")
    try:
        made = _count_calls(trainer.engine)
        policies, task = trainer.policies, trainer.task
        plain = {policies.render(task.user_message(p)) for p in [*trainer.pool, *trainer.heldout]}
        calls = _calls_only("hf", per_call=1.0)
        for play in (trainer.step, lambda: trainer.evaluate("final", progress=False)):
            made.clear()
            with _one_thread():  # small calls on two threads, a core of them held by another process, thrash
                play()
            prompts = [p for call in made.prompts for p in call]
            drafts = [len(x) for x in policies.prompt_ids([p for p in prompts if p in plain])]
            answers = [len(x) for x in policies.prompt_ids([p for p in prompts if p not in plain])]
            assert drafts and answers
            bounds = []
            for pick in (min, max):
                p = model.plan(cfg, pick(drafts), pick(answers))
                lengths = Lengths.at(24, 1.0)
                bounds.append(model.step_seconds(p, calls, lengths) if play == trainer.step
                              else model.eval_seconds(p, calls, lengths, p.full))
            assert bounds[0] <= len(made) <= bounds[1] and bounds[1] > 2 * 2, (len(made), bounds)
    finally:
        trainer.engine.close()
        trainer.task.close()


def _cell_hours(out: str) -> tuple[float, float]:
    two, streamed = re.search(r"^\s+cell\s+([\d.]+) h\s+([\d.]+) h$", out, re.M).groups()
    return float(two), float(streamed)


def test_the_command_prints_a_cell_and_a_sweep_from_a_gpu_check(capsys, monkeypatch):
    def no_model(*_a, **_k):
        raise AssertionError("a GPU check's estimate loads no model")

    monkeypatch.setattr("agon.models.loading.load_base", no_model)
    hours = {}
    for device in ("H200", "H100"):
        assert main(["experiment=paper_deepmath", "--gpu-check", str(CHECK), "--device", device]) == 0
        out = capsys.readouterr().out
        for phase in ("start evaluation", "training steps", "interim evaluations", "final evaluation"):
            assert re.search(rf"^\s+{phase}\s+(1|200|3)\s", out, re.M), phase
        hours[device] = _cell_hours(out)
        assert "vllm not in the check" in out  # the check measured hf and hf_continuous only
    assert hours["H100"][0] > hours["H200"][0]  # a slower memory, a smaller KV cache
    for two, streamed in hours.values():
        assert streamed < two
    # the paper's 2x2, three seeds: twelve runs, the hidden cells cheaper streamed (one tail per step)
    assert main(["experiment=paper_deepmath", "reward=competitive,cooperative", "exchange=visible,hidden",
                 "--gpu-check", str(CHECK), "--seeds", "3"]) == 0
    out = capsys.readouterr().out
    per_cell = [tuple(map(float, m)) for m in re.findall(r"^\s+cell\s+([\d.]+) h\s+([\d.]+) h$", out, re.M)]
    assert len(per_cell) == 4 and "4 cells x 3 seeds = 12 runs" in out
    total = re.search(r"12 runs: ([\d.]+) h two-stage, ([\d.]+) h streamed", out).groups()
    assert float(total[0]) == pytest.approx(3 * sum(c[0] for c in per_cell), rel=0.01)
    visible, hidden = per_cell[0], per_cell[1]  # exchange varies fastest
    assert hidden[1] < visible[1]


def test_the_docs_give_the_paper_cells_hours_the_command_prints(capsys):
    """docs/gpu.md and docs/training.md quote the command's cell hours, on an H100 and an H200, both ways."""
    docs = {name: (ROOT / "docs" / name).read_text() for name in ("gpu.md", "training.md")}
    for device in ("H100", "H200"):
        main(["experiment=paper_deepmath", "--gpu-check", str(CHECK), "--device", device])
        two, streamed = _cell_hours(capsys.readouterr().out)
        for name, text in docs.items():
            row = next((line for line in text.splitlines() if line.startswith(f"| one {device}")), "")
            assert f"{two:.1f} h" in row and f"{streamed:.1f} h" in row, (name, device, row)


def test_without_a_gpu_check_the_command_probes_the_configured_engine_here(agon_cache, capsys):
    with _one_thread():
        assert main([*TEST_WORLD, "trainer.max_steps=4", "eval.n_problems=8", "eval.every=2",
                     "eval.interim_problems=4", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "engine hf, probed after a warm-up at 64 rows" in out
    assert re.search(r"^\s+interim evaluations\s+1\s", out, re.M) and "1 cell x 2 seeds = 2 runs" in out


def test_a_config_mistake_fails_before_any_model_loads_and_names_the_key(capsys, monkeypatch):
    def no_model(*_a, **_k):
        raise AssertionError("loaded a model")

    monkeypatch.setattr("agon.models.loading.load_base", no_model)
    assert main(["trainer.max_new_tokns=16"]) == 1
    assert "trainer.max_new_tokns" in capsys.readouterr().err
    assert main(["exchange=visible,hiden"]) == 1  # the second cell of a sweep, before the first loads
    assert "hiden" in capsys.readouterr().err
    assert main(["--gpu-check", str(CHECK), "--device", "B200"]) == 1
    assert "B200" in capsys.readouterr().err
    assert main(["--device", "H100"]) == 1 and "--gpu-check" in capsys.readouterr().err
    assert main(["--gpu-check", str(CHECK), "generation.engine=hf", "trainer.max_new_tokens=64"]) == 0
    assert cells(["a=1,2", "b=x", "c=[3,4]"]) == [["a=1", "b=x", "c=[3,4]"], ["a=2", "b=x", "c=[3,4]"]]




def _lengths(made: list[list[int]], budget: int) -> Lengths:
    """The completions the calls really sampled, as the model reads them: mean, mean square, each call's longest
    (their mean: a call's steps follow its own longest row)."""
    rows = [n for call in made for n in call]
    return Lengths(sum(rows) / len(rows), sum(n * n for n in rows) / len(rows),
                   sum(max(call) for call in made) / len(made), budget)


def _rounds(trainer, cfg, rounds: int, steps: int) -> list[dict[str, float]]:
    """``rounds`` rounds of: the start-up estimate's early and late bounds of a step and a full evaluation, the
    measured seconds of each (a step's the mean of ``steps``: a call of ``hf`` lasts as long as its longest row, and
    the test world's rows now and then run to the budget), and the model at the lengths they sampled."""
    made = _count_calls(trainer.engine)
    out = []
    for _ in range(rounds):
        est = model.estimate(cfg, trainer)
        phases = {p.name: p for p in est.phases}
        step, final = phases["training steps"], phases["final evaluation"]
        made.clear()
        start = time.perf_counter()
        for _ in range(steps):
            trainer.step()
        step_s = (time.perf_counter() - start) / steps
        step_at = model.step_seconds(est.plan, est.probe.costs, _lengths(made, cfg.trainer.max_new_tokens))
        made.clear()
        start = time.perf_counter()
        trainer.evaluate("final", progress=False)
        eval_s = time.perf_counter() - start
        eval_at = model.eval_seconds(est.plan, est.probe.costs, _lengths(made, cfg.eval.max_new_tokens),
                                     est.plan.full)
        out.append(dict(step=step_s, step_early=step.early_s, step_late=step.late_s, step_at=step_at, eval=eval_s,
                        eval_early=final.early_s, eval_late=final.late_s, eval_at=eval_at))
    return out


def _off(m: dict[str, float]) -> list[str]:
    """What of one round is off by more than ``TOLERANCE``: a measured time outside the start-up bounds widened by
    it, or the model at the sampled lengths off the measured time by more than it."""
    off = []
    for unit in ("step", "eval"):
        measured, early, late, at = m[unit], m[f"{unit}_early"], m[f"{unit}_late"], m[f"{unit}_at"]
        if not late / TOLERANCE <= measured <= early * TOLERANCE:
            off.append(f"{unit}: measured {measured:.2f} s outside [{late:.2f}, {early:.2f}] x/÷ {TOLERANCE}")
        if not 1 / TOLERANCE <= at / measured <= TOLERANCE:
            off.append(f"{unit}: at the sampled lengths {at:.2f} s against {measured:.2f} s measured")
    return off


def _agree(rounds: list[dict[str, float]]) -> bool:
    """Whether some round agrees throughout: a round is measured in one stretch of whatever else the machine runs,
    and another process's burst between a probe and its step throws that round off, not the estimate."""
    return any(not _off(r) for r in rounds)


def _shown(rounds: list[dict[str, float]]) -> list:
    return [(_off(r), {k: round(v, 3) for k, v in r.items()}) for r in rounds]


# make run's step (16 problems x 8 completions) on the test world; an evaluation of 64 problems x 4 samples in two
# chunks (calls of 128 rows)
WORLD_RUN = TEST_WORLD + ["logger=none", "progress=false", "eval.n_problems=64", "eval.chunk_problems=32"]
# half the rows on vLLM's CPU build, about twice as slow here as hf
VLLM_RUN = ["generation.engine=vllm", "generation.vllm.start_timeout_s=300", "trainer.prompts_per_step=8",
            "eval.n_problems=32", "eval.chunk_problems=16"]


@pytest.mark.long
def test_the_start_up_estimate_is_within_1_5x_of_the_test_worlds_steps_and_evaluations_with_hf(agon_cache, tmp_path):
    """At budgets of 48 and 24 new tokens, which the test world's completions (about 24 tokens, the longest of a call
    about 38, now and then one to the budget) mostly fill: at 72, which they fill to a third, hf's calls end well
    before the budget and its early bound is up to 1.8x the measured time, while the model at the sampled lengths
    stays within 1.5x."""
    first = None
    try:
        with _one_thread():
            for budget in (48, 24):
                cfg = compose_config(WORLD_RUN + [f"trainer.max_new_tokens={budget}"])
                trainer = _trainer(cfg, tmp_path / str(budget), base=first)
                first = first or trainer
                rounds = _rounds(trainer, cfg, rounds=3, steps=3)
                assert _agree(rounds), (budget, _shown(rounds))
    finally:
        if first is not None:
            first.engine.close()
            first.task.close()


@pytest.mark.vllm(seconds=600)
def test_the_start_up_estimate_is_within_1_5x_of_the_test_worlds_steps_and_evaluations_with_vllm(
        agon_cache, tmp_path, bounded, monkeypatch):
    """As with hf, on vLLM streamed (one call a step, one an evaluation) at 48 and 24 new tokens and two-stage at 48:
    the worker warmed up before the probe times it."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the worker's threads too
    first = None
    try:
        with _one_thread():
            for budget, stream in ((48, True), (24, True), (48, False)):
                cfg = compose_config(WORLD_RUN + VLLM_RUN + [f"trainer.max_new_tokens={budget}",
                                                             f"generation.stream={stream}"])
                trainer = _trainer(cfg, tmp_path / f"{budget}-{stream}", base=first)
                first = first or trainer
                trainer.engine.streaming = stream  # the first config's engine, played as this one asks
                rounds = _rounds(trainer, cfg, rounds=2, steps=2)
                assert _agree(rounds), (budget, stream, _shown(rounds))
    finally:
        if first is not None:
            first.engine.close()
            first.task.close()


def test_the_h200_check_json_is_read_whole():
    reports = model.check_reports(json.loads(CHECK.read_text()))
    assert len(reports) == 3 and all(r["device"] == "NVIDIA H200" for r in reports)
