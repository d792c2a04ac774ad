"""Per-rank randomness across processes: every rank samples from its own stream, at the start of a run, in each
evaluation chunk, and after a resume (``agon.run.build_trainer``, ``agon.game.cascade.evaluate``'s chunk seeds,
``Trainer.load_checkpoint``).

Seeding or restoring every rank as rank 0 breaks nothing visible on one process and nothing that fails on two: each
rank still plays its own problems. But the ranks' samples are then the same draws, so a problem that two ranks play
(or a rank's group next to another's) is sampled identically, and a run's variance is that of one rank. Two
processes (``accelerate launch``, gloo) each play one copy of the same problem, with the same adapters: their
completions must differ, and each rank's stream after a checkpoint is loaded back must be its own.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import SMALL_RUN, TEST_WORLD, compose_config
from tests.test_distributed import launch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.long
def test_each_rank_draws_its_own_samples_at_start_in_evaluation_and_after_a_resume(agon_cache, tmp_path):
    """Catches every rank seeded or restored as rank 0 (the run's seeding, an evaluation chunk's seed, the RNG
    state a checkpoint gives back): the two ranks' first draws differ; their completions of one problem (each rank
    plays a copy) differ; each rank's draw after loading the checkpoint repeats its own draw after saving it, and
    the two ranks' differ."""
    # a hot, untruncated evaluation: two draws of one problem's completion differ unless their streams are equal
    cfg = compose_config(TEST_WORLD + SMALL_RUN + ["logger=none", "method=grpo", "eval.samples=2",
                                                   "eval.max_new_tokens=16", "eval.temperature=3.0", "eval.top_k=0",
                                                   "eval.top_p=1.0", "eval.chunk_problems=2"])
    OmegaConf.update(cfg, "output_dir", str(tmp_path / "run"), force_add=True)
    (tmp_path / "cfg.pkl").write_bytes(pickle.dumps(cfg))
    launch(["tests.rank_randomness_worker", str(tmp_path)], cwd=ROOT)
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    r0, r1 = out["ranks"]
    assert not torch.equal(r0["start"], r1["start"]), "every rank seeded alike at the start"
    g = out["group_size"]
    first, second = out["evaluated"][:g], out["evaluated"][g:]
    assert len(first) == len(second) == g
    assert first != second, "both ranks sampled the same completions of the same problem in one evaluation chunk"
    for r in (r0, r1):
        assert torch.equal(r["again"], r["after"]), "a rank's stream after a resume is not its own"
    assert not torch.equal(r0["again"], r1["again"])
