"""Evaluations sized by phase and shown as they go: the interim size during training, the full set before and after,
and one progress bar per evaluation advanced as each engine call returns, on the test world.

The bars are read back from what tqdm wrote to stderr, with ``mininterval=0`` so that every update is drawn:
each drawn state of a bar is one ``n/total`` of the completions sampled so far.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import tqdm.auto
from omegaconf import OmegaConf

from agon.game.cascade import eval_size, evaluate
from agon.engines import Sampling
from agon.engines.hf import HFEngine
from agon.game.rollout import play
from agon.run import run
from agon.records.run_files import read_jsonl
from agon.tasks import build_task

# the full evaluation of the run below and its interim one (problems, samples)
FULL, INTERIM = (6, 3), (2, 2)


def every_update_drawn(monkeypatch) -> None:
    """The evaluation's bar with ``mininterval=0``: tqdm skips a redraw within 0.1 s of the last, so on a fast machine
    the stages of a tiny evaluation would be drawn or not by timing. (``TQDM_MININTERVAL`` is read when tqdm is first
    imported, too late for a test to set it.)"""
    monkeypatch.setattr(tqdm.auto, "tqdm", functools.partial(tqdm.auto.tqdm, mininterval=0))


def _bars(stderr: str) -> dict[str, list[tuple[int, int]]]:
    """Every drawn state ``(n, total)`` of each bar, by its description (``eval start``, ``eval step 1`` ...)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for line in re.split(r"[\r\n]", stderr):
        m = re.match(r"\s*(eval [\w ]+?): .*\| *(\d+)/(\d+) \[", line)
        if m:
            out.setdefault(m[1], []).append((int(m[2]), int(m[3])))
    return out


def test_eval_size_by_phase():
    e = OmegaConf.create({"n_problems": 300, "samples": 4, "interim_problems": 50, "interim_samples": 1})
    assert eval_size(e, "train") == (50, 1)
    assert eval_size(e, "start") == eval_size(e, "final") == (300, 4)
    e.interim_samples = None  # each key falls back on its own
    assert eval_size(e, "train") == (50, 4)
    e.interim_problems, e.interim_samples = None, 2
    assert eval_size(e, "train") == (300, 2)


class CallLog(HFEngine):
    """The real hf engine, noting each call as it returns, so the test can see when the callback came."""

    def __init__(self, policies, log):
        super().__init__(policies)
        self.log = log

    def sample(self, prompts, adapter, sampling, on_sampled=None):
        out = super().sample(prompts, adapter, sampling, on_sampled)
        self.log.append(("engine", adapter, len(out)))
        return out


@pytest.mark.parametrize("challenger", ["B", False])
def test_play_tells_each_stage_as_its_engine_batches_return(policies, small_cfg, challenger):
    task = build_task(small_cfg.task)
    problems = list(task.heldout_problems())[:3]
    log: list[tuple] = []
    game = play(policies, task, small_cfg.model, problems, drafter="A", challenger=challenger, exchange="visible",
                group_size=2, sampling=Sampling.from_config(small_cfg.eval), engine=CallLog(policies, log),
                on_sampled=lambda n: log.append(("told", n)))
    # told from inside each engine call, as its generate batch returns (here one batch per stage)
    stages = [("told", 6), ("engine", "A", 6)] + ([("told", 6), ("engine", "B", 6)] if challenger else [])
    assert log == stages and len(game.rounds) == 6


def test_a_disabled_bar_draws_nothing(policies, small_cfg, capsys, monkeypatch):
    every_update_drawn(monkeypatch)
    task = build_task(small_cfg.task)
    problems = list(task.heldout_problems())[:2]
    evaluate(policies, task, small_cfg, problems, step=3, phase="train", samples=1, progress=False)
    assert "eval" not in capsys.readouterr().err
    result = evaluate(policies, task, small_cfg, problems, step=3, phase="train", samples=1, progress=True)
    # 2 problems x 1 sample x ((draft, challenge) x (A>B, B>A) + the answers of A>A and B>B), each stage call one
    # step of the bar
    bars = _bars(capsys.readouterr().err)
    assert set(bars) == {"eval step 3"}
    assert sorted(set(bars["eval step 3"])) == [(0, 12), (2, 12), (4, 12), (6, 12), (8, 12), (10, 12), (12, 12)]
    assert sum(len(g.rounds) for g in result.games.values()) * 2 == 16  # the reads' drafts are not sampled again


def test_interim_evaluations_are_sized_apart_and_every_evaluation_shows_its_progress(small_cfg, capsys,
                                                                                      monkeypatch):
    every_update_drawn(monkeypatch)
    e = small_cfg.eval
    (e.n_problems, e.samples), (e.interim_problems, e.interim_samples) = FULL, INTERIM
    e.every, small_cfg.trainer.max_steps, small_cfg.progress = 1, 2, True
    run(small_cfg)
    run_dir = Path(small_cfg.output_dir)
    heldout = [p.id for p in build_task(small_cfg.task).heldout_problems()]

    rows = read_jsonl(run_dir / "eval.jsonl")
    metrics = {r["train/step"]: r for r in read_jsonl(run_dir / "metrics.jsonl") if "eval/accuracy" in r}
    # start (step 0) and final (step 2) the full set, the evaluation during training (step 1) the interim one
    sizes = {"start": (0, FULL), "train": (1, INTERIM), "final": (2, FULL)}
    assert {r["phase"] for r in rows} == set(sizes)
    for phase, (step, (n, k)) in sizes.items():
        mine = [r for r in rows if r["phase"] == phase]
        assert {r["step"] for r in mine} == {step}
        for order in ("A>B", "B>A", "A>A", "B>B"):
            for stage in ("draft", "final"):
                got = [(r["problem_id"], r["sample"]) for r in mine if (r["order"], r["stage"]) == (order, stage)]
                assert got == [(p, s) for p in heldout[:n] for s in range(k)], (phase, order, stage)
        assert (metrics[step]["eval/n_problems"], metrics[step]["eval/samples"]) == (n, k)

    # one bar per evaluation, its total the completions it sampled (2 orders x 2 stages and an answer per
    # self-cascade), one step per stage call
    bars = _bars(capsys.readouterr().err)
    assert set(bars) == {"eval start", "eval step 1", "eval final"}
    for name, (n, k) in (("eval start", FULL), ("eval step 1", INTERIM), ("eval final", FULL)):
        total = 6 * n * k
        assert {t for _, t in bars[name]} == {total}, name
        assert sorted({c for c, _ in bars[name]}) == [i * n * k for i in range(7)], name
