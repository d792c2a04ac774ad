"""The training metrics a researcher reads next to the reward: per adapter, entropy, advantages, clipped fraction.

Each is checked against a value worked out here from the same step's tensors (``role_batches``, ``_logps``), not
against the trainer's own arithmetic, on the test world.
"""

from __future__ import annotations

import pytest
import torch

from agon.core.grpo import masked_mean
from agon.records.recorder import ADAPTER_METRICS, Recorder, per_adapter
from agon.core.rewards import compute_rewards
from agon.training.role_batch import role_batches
from agon.game.rollout import play
from agon.tasks import build_task
from agon.training.trainer import Trainer


def _trainer(cfg, policies, run_dir) -> Trainer:
    return Trainer(cfg, policies, build_task(cfg.task), Recorder(run_dir), run_dir, log=lambda *_: None)


def test_per_adapter_copies_each_role_to_the_adapter_that_played_it():
    metrics = {"role/drafter/accuracy": 0.25, "role/challenger/accuracy": 0.75, "role/drafter/kl": None,
               "role/challenger/loss": 1.5, "role/challenger/other": 3.0}
    got = per_adapter(metrics, {"drafter": "B", "challenger": "A"})
    assert got == {"adapter/B/drafter/accuracy": 0.25, "adapter/A/challenger/accuracy": 0.75,
                   "adapter/A/challenger/loss": 1.5}
    # the base model (moa) has no adapter to follow
    assert per_adapter(metrics, {"drafter": None, "challenger": None}) == {}


def test_under_rotation_an_adapters_curve_follows_that_adapter(step_cfg, policies, tmp_path):
    """Two steps of ``rotation=alternate``: A drafts at step 1 and challenges at step 2, and its curves hold exactly
    the numbers of the role it played, B's the other."""
    step_cfg.rotation.mode = "alternate"
    trainer = _trainer(step_cfg, policies, tmp_path)
    first, second = trainer.step(), trainer.step()
    assert (first["train/drafter"], second["train/drafter"]) == ("A", "B")
    for metrics, a_role, b_role in ((first, "drafter", "challenger"), (second, "challenger", "drafter")):
        for adapter, role in (("A", a_role), ("B", b_role)):
            for name in ("accuracy", "reward/mean", "completion_tokens", "entropy", "loss"):
                assert metrics[f"adapter/{adapter}/{role}/{name}"] == metrics[f"role/{role}/{name}"], name
            other = "challenger" if role == "drafter" else "drafter"
            assert not any(k.startswith(f"adapter/{adapter}/{other}/") for k in metrics)
    assert set(ADAPTER_METRICS) >= {"accuracy", "reward/mean", "completion_tokens", "entropy", "kl"}


def test_entropy_advantages_and_clipped_fraction_are_the_batchs(step_cfg, policies, tmp_path):
    """``role/<r>/entropy`` is the mean -log p of the sampled completion tokens under the adapter before the
    update; ``advantages/mean`` and ``/std`` those of the whole role batch; ``clip_ratio/region_mean`` is low +
    high."""
    t = step_cfg.trainer
    t.micro_batch_size = 4  # several micro-batches: the shares must add up to the batch's values
    trainer = _trainer(step_cfg, policies, tmp_path)
    game = play(policies, trainer.task, step_cfg.model, trainer.next_problems(), drafter="A", challenger="B",
                exchange="visible", group_size=t.num_generations, sampling=trainer.sampling)
    rewards = compute_rewards(game.outcome(), step_cfg.reward)
    rewards = {"drafter": rewards.drafter, "challenger": rewards.challenger}
    batches = role_batches(policies, game, rewards, slice(None), t.scale_rewards, t.adv_eps)
    expected = {}
    for b in batches:
        mask = b.mask.float()
        logps = trainer._logps(b, b.adapter)
        expected[f"role/{b.role}/entropy"] = masked_mean(-logps, mask.to(logps.device))
        adv = b.advantages.double()
        expected[f"role/{b.role}/advantages/mean"] = float(adv.mean())
        expected[f"role/{b.role}/advantages/std"] = float(adv.std(unbiased=False))
    assert any(v > 0 for k, v in expected.items() if k.endswith("advantages/std"))
    stats = trainer.update(game, rewards)
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for role in rewards:
        assert stats[f"role/{role}/clip_ratio/region_mean"] == pytest.approx(
            stats[f"role/{role}/clip_ratio/low"] + stats[f"role/{role}/clip_ratio/high"])
        assert f"role/{role}/advantages/square" not in stats
    assert not torch.cuda.is_available() or "perf/max_memory_allocated_gb" in trainer.step()
