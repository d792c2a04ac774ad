"""The order of training problems across epochs (``Trainer.next_problems``): a seeded shuffle per epoch.

A shuffle seeded by the run's seed alone gives every epoch the same order: each problem keeps its place, so the
problems next to it in a step (its group's batch neighbours) never change and any order effect repeats each epoch.
Nothing else shows it: every problem is still seen once per epoch. Checked on the real trainer's draws.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from agon.records.recorder import Recorder
from agon.tasks import build_task
from agon.training.trainer import Trainer


def _trainer(cfg, policies, tmp_path, seed: int) -> Trainer:
    cfg = OmegaConf.create(OmegaConf.to_container(cfg))
    cfg.seed = seed
    return Trainer(cfg, policies, build_task(cfg.task), Recorder(tmp_path, enabled=False), tmp_path,
                   log=lambda *_: None)


def _epochs(trainer: Trainer, n: int) -> list[list[str]]:
    pool = len(trainer.pool)
    draws = []
    while len(draws) < n * pool:
        draws += [p.id for p in trainer.next_problems()]
    return [draws[i * pool : (i + 1) * pool] for i in range(n)]


def test_each_epoch_is_its_own_permutation_of_the_pool_and_a_resumed_run_continues_it(small_cfg, policies,
                                                                                      tmp_path):
    """Catches an epoch order that ignores the epoch (the same permutation every epoch) or the seed: three epochs
    each cover the pool once, no two in the same order; a trainer resumed at epoch 1's start (its cursor) draws
    epoch 1 as the first did; another seed gives another order."""
    small_cfg.trainer.prompts_per_step = 40  # the test world's pool of 400: ten steps an epoch
    first = _trainer(small_cfg, policies, tmp_path / "a", seed=0)
    ids = sorted(p.id for p in first.pool)
    assert len(ids) == len(set(ids)) >= 100, "premise: a pool of distinct problems"
    epochs = _epochs(first, 3)
    for order in epochs:
        assert sorted(order) == ids
    assert len({tuple(order) for order in epochs}) == 3, "every epoch in an order of its own"
    resumed = _trainer(small_cfg, policies, tmp_path / "b", seed=0)
    resumed.state.cursor = len(ids)
    assert _epochs(resumed, 1)[0] == epochs[1]
    other = _trainer(small_cfg, policies, tmp_path / "c", seed=1)
    assert _epochs(other, 1)[0] != epochs[0]
