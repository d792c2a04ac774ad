"""The shared core end to end on a tiny model: roles, one step's effect, the exchange, every method, checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from agon.recorder import Recorder, read_jsonl
from agon.rollout import Sampling, play
from agon.tasks import build_task
from agon.trainer import Trainer, roles


def test_rotation_schedule():
    assert [roles("agon", "alternate", s) for s in range(4)] == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]
    assert {roles("agon", "fixed", s) for s in range(4)} == {("A", "B")}
    assert roles("self_refine", "alternate", 1) == ("A", "A")
    assert roles("grpo", "alternate", 1) == ("A", False)


def _trainer(small_cfg, policies, tmp_path):
    task = build_task(small_cfg.task)
    return Trainer(small_cfg, policies, task, Recorder(tmp_path), tmp_path, log=lambda *_: None)


def test_hidden_exchange_shows_no_recap_and_visible_does(small_cfg, policies):
    task = build_task(small_cfg.task)
    problems = list(task.train_problems())[:2]
    sampling = Sampling(max_new_tokens=12, temperature=1.0)
    for mode in ("visible", "hidden"):
        game = play(policies, task, small_cfg.model, problems, drafter="A", challenger="B", exchange=mode,
                    group_size=2, sampling=sampling)
        for r in game.rounds:
            plain = policies.render(task.user_message(r.problem))
            if mode == "hidden":
                assert r.challenge.prompt == plain
            else:
                assert r.challenge.prompt == policies.render(task.challenge_message(r.problem, r.recap))
                assert "|" in r.challenge.prompt
    # a recap that is not empty never reaches a hidden challenger's prompt
    game = play(policies, task, small_cfg.model, problems, drafter="A", challenger="B", exchange="hidden",
                group_size=2, sampling=sampling)
    sentinel = "93+1=94"
    assert all(sentinel not in r.challenge.prompt for r in game.rounds)


def test_one_step_changes_both_adapters_and_not_the_base(small_cfg, policies, tmp_path):
    small_cfg.trainer.prompts_per_step = 4
    small_cfg.trainer.num_generations = 4
    small_cfg.trainer.learning_rate = 1e-2
    policies.perturb("B", 0.02, seed=0)
    trainer = _trainer(small_cfg, policies, tmp_path)
    # the untrained tiny model is right too rarely for a reward spread; pay for length so every group has signal
    small_cfg.reward.format_weight = 0.0
    from agon import rewards as R

    original = R.REWARD_MODES["competitive"]

    def spread(outcome, w):
        out = original(outcome, w)
        bonus = {"length": outcome.draft_tokens / 100}
        drafter = R.RoleRewards({**out.drafter.components, **bonus})
        challenger = R.RoleRewards({**out.challenger.components, "length": outcome.challenge_tokens / 100})
        return R.RoundRewards(drafter, challenger)

    R.REWARD_MODES["competitive"] = spread
    try:
        base = {n: p.detach().clone() for n, p in policies.model.named_parameters() if "lora_" not in n}
        before = {a: policies.lora_state(a) for a in ("A", "B")}
        metrics = trainer.step()
    finally:
        R.REWARD_MODES["competitive"] = original
    for a in ("A", "B"):
        after = policies.lora_state(a)
        assert any(not torch.equal(before[a][n], p) for n, p in after.items()), f"adapter {a} did not move"
    assert all(torch.equal(base[n], p) for n, p in policies.model.named_parameters() if "lora_" not in n)
    assert metrics["train/drafter"] == "A" and trainer.state.step == 1
    for key in ("role/drafter/accuracy", "role/challenger/reward/conversion", "adapter/A/grad_norm",
                "adapter/B/grad_norm", "train/divergence", "role/challenger/clip_ratio/low", "time/step_s",
                "role/drafter/frac_reward_zero_std", "train/generated_tokens"):
        assert key in metrics, key
    assert read_jsonl(tmp_path / "metrics.jsonl")[-1]["train/step"] == 1


REQUIRED = ["eval/accuracy", "eval/accuracy_at_start", "eval/final_trace_tokens", "eval/n_problems",
            "train/steps", "train/generated_tokens", "time/total_s", "eval/cascade_acc_AB", "eval/cascade_acc_BA",
            "eval/solo_acc_A", "eval/solo_acc_B", "eval/conversion_rate", "eval/regression_rate", "git_commit",
            "versions"]


@pytest.mark.parametrize("overrides,applies", [
    ({}, {"eval/cascade_acc_AB", "eval/cascade_acc_BA", "eval/solo_acc_B", "eval/conversion_rate"}),
    ({"method": "grpo"}, set()),
    ({"method": "self_refine"}, {"eval/conversion_rate"}),
    ({"method": "moa"}, {"eval/conversion_rate"}),
    ({"rotation": "fixed"}, {"eval/cascade_acc_AB", "eval/cascade_acc_BA"}),
    ({"init": "symmetric", "exchange": "hidden", "reward": "cooperative"}, {"eval/cascade_acc_AB"}),
])
def test_every_method_runs_end_to_end(small_cfg, overrides, applies):
    from agon.run import run
    from tests.conftest import compose_config

    cfg = compose_config([f"{k}={v}" for k, v in overrides.items()] + [
        f"{k}={v}" for k, v in _flat(small_cfg).items() if k.startswith(("model.tiny", "model.lora", "trainer.",
                                                                          "eval.", "logger.name"))])
    cfg.output_dir, cfg.progress = small_cfg.output_dir, False
    summary = run(cfg)
    run_dir = cfg.output_dir
    saved = json.load(open(f"{run_dir}/summary.json"))
    for key in REQUIRED:
        assert key in saved, key
    for key in applies:
        assert saved[key] is not None, key
    method = overrides.get("method", "agon")
    if method == "grpo":
        assert saved["eval/cascade_acc_AB"] is None and saved["eval/conversion_rate"] is None
    if method != "agon":
        assert saved["eval/solo_acc_B"] is None
    assert saved["train/steps"] == (0 if method == "moa" else 2)
    assert summary["eval/accuracy"] == saved["eval/accuracy"]
    rows = read_jsonl(__import__("pathlib").Path(run_dir) / "eval.jsonl")
    assert {r["phase"] for r in rows} == {"start", "final"}
    assert len(read_jsonl(__import__("pathlib").Path(run_dir) / "metrics.jsonl")) >= 2


def _flat(cfg, prefix=""):
    from omegaconf import DictConfig

    out = {}
    for k, v in cfg.items():
        if isinstance(v, DictConfig):
            out |= _flat(v, f"{prefix}{k}.")
        elif not isinstance(v, (list, dict)) and v is not None and not str(v).startswith("${"):
            out[f"{prefix}{k}"] = v
    return out


def test_checkpoint_resume_reproduces_the_straight_run(small_cfg, tiny_base, tmp_path):
    """k steps, save, restore into a fresh trainer, k more == 2k straight: same weights, optimizers, data."""
    import copy

    from agon.policies import Policies

    cfg, (model, tok) = tiny_base

    def fresh(path):
        p = Policies(copy.deepcopy(model), tok, ["A", "B"], cfg.model.lora)
        p.perturb("B", 0.02, seed=0)
        return _trainer(small_cfg, p, path), p

    torch.manual_seed(0)
    straight, p1 = fresh(tmp_path / "straight")
    for _ in range(4):
        straight.step()

    torch.manual_seed(0)
    first, _ = fresh(tmp_path / "resumed")
    for _ in range(2):
        first.step()
    ckpt = first.save_checkpoint()
    assert (tmp_path / "resumed" / "checkpoints" / "latest").read_text() == ckpt.name
    torch.manual_seed(123)  # whatever the RNG holds now, the checkpoint's state must win
    second, p2 = fresh(tmp_path / "resumed")
    second.load_checkpoint(ckpt)
    for _ in range(2):
        second.step()
    assert second.state.step == straight.state.step == 4
    assert second.state.cursor == straight.state.cursor
    for a in ("A", "B"):
        for (n, x), (_, y) in zip(p1.lora_state(a).items(), p2.lora_state(a).items()):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
    steps = [r["train/step"] for r in read_jsonl(tmp_path / "resumed" / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4]


def test_reevaluation_of_a_finished_run(small_cfg, tmp_path):
    """python -m agon.eval on a run's saved adapters: the same eval keys plus the full cross-play matrix."""
    import subprocess
    import sys

    from agon.eval import reevaluate
    from agon.run import run

    small_cfg.output_dir = str(tmp_path / "run")
    run(small_cfg)
    # Hydra writes .hydra/config.yaml for real runs; a run called from Python gets it written here
    from omegaconf import OmegaConf

    (tmp_path / "run" / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(small_cfg, tmp_path / "run" / ".hydra" / "config.yaml")
    summary = reevaluate(tmp_path / "run", ["eval.n_problems=2", "eval.samples=3"])
    assert summary["eval/n_problems"] == 2 and summary["eval/samples"] == 3
    assert set(summary["crossplay"]) == {f"{d}>{a}" for d in ("A", "B", "base") for a in ("A", "B", "base")}
    assert all(0.0 <= v <= 1.0 for v in summary["crossplay"].values())
    assert (tmp_path / "run" / "reeval" / "crossplay.csv").read_text().startswith("drafter")
    rows = read_jsonl(tmp_path / "run" / "reeval" / "eval.jsonl")
    assert {r["order"] for r in rows} >= {"A>B", "B>A", "A", "B"}
    bad = subprocess.run([sys.executable, "-m", "agon.eval", str(tmp_path / "run"), "eval.n_problemz=2"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "eval.n_problemz" in bad.stderr


def test_run_resumes_from_its_latest_checkpoint(small_cfg):
    """An interrupted run continues where its last committed checkpoint left it, without repeating steps."""
    from agon.run import run

    small_cfg.trainer.checkpoint_every = 1
    run(small_cfg)
    small_cfg.trainer.max_steps = 3
    small_cfg.trainer.resume = True
    summary = run(small_cfg)
    assert summary["train/steps"] == 3
    assert summary["eval/accuracy_at_start"] is not None
    import pathlib

    rows = read_jsonl(pathlib.Path(small_cfg.output_dir) / "metrics.jsonl")
    train_steps = [r["train/step"] for r in rows if "role/drafter/accuracy" in r]
    assert train_steps == [1, 2, 3]
    ckpts = sorted(p.name for p in (pathlib.Path(small_cfg.output_dir) / "checkpoints").glob("step_*"))
    assert ckpts == ["step_2", "step_3"]  # keep_checkpoints=2, the older pruned after the newer committed
