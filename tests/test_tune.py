"""Optuna studies through agon's Hydra sweeper (``hydra/sweeper=optuna``): search spaces, a study killed and
launched again, two workers on one storage, failing trials, bad keys, and every sweep file composing.

No test races a study: a worker is killed where its trial stopped (``AGON_TEST_PAUSE_AT``), and every wait is for a
line or a state in the study's storage, with deadlines far beyond what a launch takes on a busy machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from agon.core.config import ConfigError
from agon.training.trainer import PAUSED
from agon.training.tune import distribution, first_value
from tests.test_resume import FAST, FINISH_S, REACH_S, ROOT, Launch, paused_at

SWEEPS = ROOT / "sweeps"
STUDY = ["--config-dir", str(SWEEPS), "--config-name", "tune_reward", *FAST, "eval.at_start=false",
         "trainer.max_steps=2", "eval.every=1", "hydra.sweeper.n_jobs=1"]
COMPLETE, RUNNING, FAIL = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING,
                           optuna.trial.TrialState.FAIL)
# a trial stops after the metrics row of its first step, until it is killed
IN_A_TRIAL = "step:1"


def reach(launch: Launch, line: str) -> None:
    """Wait until the launch has written ``line``, running all the while."""
    deadline = time.monotonic() + REACH_S
    while line not in launch.output():
        assert launch.proc.poll() is None, f"the launch ended first: {launch.output()[-3000:]}"
        assert time.monotonic() < deadline, f"the launch never wrote {line!r}: {launch.output()[-3000:]}"
        time.sleep(0.05)


def load(storage: str) -> optuna.Study:
    from agon.training.tune import storage_backend

    return optuna.load_study(study_name="run", storage=storage_backend(storage))


def test_search_space_entries():
    assert distribution("a", "float(0.0, 2.0)") == optuna.distributions.FloatDistribution(0.0, 2.0)
    assert distribution("a", "float(1e-4, 1e-2, log)").log
    assert distribution("a", "int(1, 8)") == optuna.distributions.IntDistribution(1, 8)
    assert distribution("a", "choice(grpo, dapo, 3)").choices == ("grpo", "dapo", 3)
    with pytest.raises(ConfigError, match="hydra.sweeper.params.a='uniform"):
        distribution("a", "uniform(0, 1)")


@pytest.mark.long
def test_a_study_killed_during_its_second_trial_and_launched_again_ends_with_three_trials_the_first_kept(
        agon_cache, tmp_path):
    sweep = tmp_path / "study"
    storage = f"sqlite:///{sweep}/optuna.db"
    study = STUDY + [f"hydra.sweeper.storage={storage}", f"hydra.sweep.dir={sweep}"]
    command = study + ["hydra.sweeper.n_trials=3"]
    # the first trial finished (by a launch that asked for one), then the second stopped in its first step and was
    # killed there: no race between the kill and the end of that trial
    Launch(study + ["hydra.sweeper.n_trials=1"], agon_cache, tmp_path / "first.log").finish()
    Launch(command, agon_cache, tmp_path / "killed.log", env=paused_at(IN_A_TRIAL)).kill_at(IN_A_TRIAL)
    first, second = load(storage).get_trials()
    assert (first.state, second.state) == (COMPLETE, RUNNING)
    Launch(command, agon_cache, tmp_path / "again.log").finish()
    trials = load(storage).get_trials()
    complete = [t for t in trials if t.state == COMPLETE]
    assert len(complete) == 3
    assert (trials[0].state, trials[0].value, trials[0].params, trials[0].datetime_complete) == (
        COMPLETE, first.value, first.params, first.datetime_complete)  # kept, not run again
    assert trials[1].state == FAIL  # abandoned by the killed worker
    assert all(t.intermediate_values for t in complete)  # every evaluation during training was reported
    best = (sweep / "optuna" / "best.yaml").read_text()
    assert f"value: {max(t.value for t in complete)}" in best
    assert (sweep / "optuna" / "importance.png").exists()


@pytest.mark.long
def test_two_workers_on_one_storage_run_disjoint_trials_and_neither_takes_or_fails_one_the_other_holds(
        agon_cache, tmp_path):
    """The first worker holds its trial (stopped in it) while the second runs the whole study, so both surely ran
    trials whatever the machine's speed: the second never runs that trial again, and does not fail it either, since
    its worker still lives."""
    journal = tmp_path / "journal.log"
    command = STUDY + ["hydra.sweeper.n_trials=3", f"hydra.sweeper.storage=journal:{journal}"]
    holder = Launch([*command, f"hydra.sweep.dir={tmp_path / 'worker0'}"], agon_cache, tmp_path / "worker0.log",
                    env=paused_at(IN_A_TRIAL))
    try:
        reach(holder, f"{PAUSED} {IN_A_TRIAL}\n")
        Launch([*command, f"hydra.sweep.dir={tmp_path / 'worker1'}"], agon_cache, tmp_path / "worker1.log").finish()
        trials = load(f"journal:{journal}").get_trials()
    finally:
        holder.kill()
    by_worker: dict[str, list[optuna.trial.FrozenTrial]] = {}
    for t in trials:
        by_worker.setdefault(t.user_attrs["worker"], []).append(t)
    held = by_worker.pop(next(w for w in by_worker if w.endswith(f":{holder.proc.pid}")))
    (ran,) = by_worker.values()
    assert [t.state for t in held] == [RUNNING]  # neither run again nor failed while its worker lived
    assert not {t.number for t in held} & {t.number for t in ran}
    assert len([t for t in ran if t.state == COMPLETE]) == 3


def test_a_trial_that_raises_is_recorded_as_failed_and_the_study_goes_on(agon_cache, tmp_path):
    """choice() over the loss type includes one that does not exist: its trials fail (validate raises), with the
    error kept, and the study still ends with its complete trials."""
    config = tmp_path / "study.yaml"
    config.write_text("defaults:\n  - config\n  - override hydra/sweeper: optuna\n  - _self_\nhydra:\n"
                      "  mode: MULTIRUN\n  sweeper:\n    n_trials: 2\n    params:\n"
                      "      trainer.loss_type: choice(dapo, no_such_loss)\n      seed: int(0, 1000)\n")
    sweep = tmp_path / "sweep"
    Launch(["--config-dir", str(tmp_path), "--config-name", "study", *FAST, "eval.at_start=false",
            "trainer.max_steps=1", f"hydra.sweep.dir={sweep}"], agon_cache, tmp_path / "study.log").finish()
    trials = load(f"sqlite:///{sweep}/optuna.db").get_trials()
    failed = [t for t in trials if t.state == FAIL]
    assert len([t for t in trials if t.state == COMPLETE]) == 2
    assert failed and all("trainer.loss_type='no_such_loss'" in t.user_attrs["error"] for t in failed)


def test_a_study_naming_a_key_that_does_not_exist_fails_before_any_trial(agon_cache, tmp_path):
    config = tmp_path / "study.yaml"
    config.write_text("defaults:\n  - config\n  - override hydra/sweeper: optuna\n  - _self_\nhydra:\n"
                      "  mode: MULTIRUN\n  sweeper:\n    params:\n      reward.no_such_weight: float(0, 1)\n")
    sweep = tmp_path / "sweep"
    out = subprocess.run([sys.executable, "-m", "agon.run", "--config-dir", str(tmp_path), "--config-name", "study",
                          *FAST, f"hydra.sweep.dir={sweep}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=FINISH_S, env={**os.environ, "AGON_CACHE": str(agon_cache), "WANDB_MODE": "disabled"})
    assert out.returncode != 0 and "reward.no_such_weight" in out.stdout + out.stderr
    assert not list(sweep.glob("*/metrics.jsonl")) and not (sweep / "optuna.db").exists()


def test_a_grid_naming_a_key_that_does_not_exist_fails_before_any_cell(agon_cache, tmp_path):
    out = subprocess.run([sys.executable, "-m", "agon.run", "-m", *FAST, "reward.no_such_weight=0,1",
                          f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=FINISH_S, env={**os.environ, "AGON_CACHE": str(agon_cache), "WANDB_MODE": "disabled"})
    assert out.returncode != 0 and "reward.no_such_weight" in out.stdout + out.stderr
    assert not list(Path(tmp_path).glob("*/metrics.jsonl"))


# the sweep files that are Optuna studies (the grids' cells are composed by tests/test_config.py)
STUDIES = sorted(p.stem for p in SWEEPS.glob("*.yaml") if "hydra/sweeper: optuna" in p.read_text())


@pytest.mark.parametrize("name", STUDIES)
def test_every_study_file_composes_with_every_key_it_searches(name):
    """Each study in sweeps/ composes as `--config-dir sweeps --config-name <file>` does, and a trial built from the
    first value of each searched key composes too (a key that does not exist would fail here)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode

    from agon.core.config import CONF_DIR

    search = create_config_search_path(str(CONF_DIR))
    search.prepend("command-line", f"file://{SWEEPS}")
    loader = ConfigLoaderImpl(config_search_path=search)
    cfg = loader.load_configuration(config_name=name, overrides=[], run_mode=RunMode.MULTIRUN)
    params = cfg.hydra.sweeper.params or {}
    assert params, f"{name} sweeps nothing"
    assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper")
    first = [f"{key}={first_value(distribution(key, spec))}" for key, spec in params.items()]
    cell = loader.load_sweep_config(cfg, first)
    assert cell.seed is not None
