"""agon's Optuna sweeper for Hydra (``hydra/sweeper=optuna``); what it does: ``agon/training/tune.py``.

Hydra imports every module of ``hydra_plugins`` in every app of the environment, so this one imports nothing of agon
at the top and registers only its own node, ``hydra/sweeper/optuna``: agon's schemas stay out of other apps. (No
``from __future__ import annotations``: Hydra executes plugin modules outside ``sys.modules``, where a dataclass
with string annotations cannot be built.)
"""

import os
import socket
from pathlib import Path
from typing import Any, Sequence

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf


@dataclass
class OptunaSweeperConfig:
    """``hydra/sweeper=optuna``: agon's Optuna sweeper (agon/training/tune.py)."""

    _target_: str = "hydra_plugins.agon_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    # config key -> float(low, high[, log]) | int(low, high[, log]) | choice(a, b, ...)
    params: dict = field(default_factory=dict)
    # finished (complete or pruned) trials the study ends with
    n_trials: int = 20
    # trials handed to the launcher at once
    n_jobs: int = 1
    # maximize | minimize (the objective is eval/accuracy)
    direction: str = "maximize"
    # null: <sweep dir>/optuna.db (SQLite); any SQLAlchemy URL; journal:<path> for Optuna's journal file
    storage: Optional[str] = None
    # null: the job's name (agon.run's "run")
    study_name: Optional[str] = None
    # seeds Optuna's TPE sampler
    seed: int = 0
    # median pruning starts after this many finished trials, and from this training step
    pruner_startup_trials: int = 2
    pruner_warmup_steps: int = 0


ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConfig, provider="agon")


class OptunaSweeper(Sweeper):
    def __init__(self, params: dict, n_trials: int, n_jobs: int, direction: str, storage: str | None,
                 study_name: str | None, seed: int, pruner_startup_trials: int, pruner_warmup_steps: int):
        self.params, self.n_trials, self.n_jobs, self.direction = dict(params or {}), n_trials, n_jobs, direction
        self.storage_url, self.study_name, self.seed = storage, study_name, seed
        self.pruner_args = (pruner_startup_trials, pruner_warmup_steps)
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context,
                                                                task_function=task_function)
        self.sweep_dir = Path(str(config.hydra.sweep.dir))

    # -- the study ---------------------------------------------------------------------------------------------

    def _study(self) -> Any:
        import optuna

        from agon.training.tune import PRUNER_ATTR, storage_backend

        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        url = self.storage_url or f"sqlite:///{self.sweep_dir / 'optuna.db'}"
        self.storage = url
        startup, warmup = self.pruner_args
        pruner = {"n_startup_trials": startup, "n_warmup_steps": warmup}
        study = optuna.create_study(
            study_name=self.study_name or str(self.config.hydra.job.name), storage=storage_backend(url),
            direction=self.direction, load_if_exists=True, sampler=optuna.samplers.TPESampler(seed=self.seed),
            pruner=optuna.pruners.MedianPruner(**pruner))
        # the trials decide pruning in their own processes (agon.training.tune.TrialReporter), which load the study
        # from storage: Optuna keeps no pruner there, so the settings travel as a study attribute
        study.set_user_attr(PRUNER_ATTR, pruner)
        return study

    def _fail_abandoned(self, study: Any) -> None:
        """Trials left running by a worker on this machine that no longer runs: failed, to be asked again."""
        import optuna

        host = socket.gethostname()
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            worker = t.user_attrs.get("worker", "")
            name, _, pid = worker.rpartition(":")
            if name == host and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)

    def _check_keys(self, arguments: Sequence[str]) -> None:
        """Compose one trial's config before any runs: a key that does not exist fails here, named."""
        from hydra.errors import ConfigCompositionException

        from agon.core.config import ConfigError
        from agon.training.tune import first_value

        overrides = list(arguments) + [f"{k}={first_value(d)}" for k, d in self.distributions.items()]
        try:
            self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        except ConfigCompositionException as exc:
            raise ConfigError(f"hydra.sweeper.params: {exc}") from None

    def sweep(self, arguments: list[str]) -> Any:
        import optuna

        from agon.training.tune import distribution

        self.distributions = {k: distribution(k, v) for k, v in self.params.items()}
        self._check_keys(arguments)
        study = self._study()
        self._fail_abandoned(study)
        finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        returns = []
        while True:
            done = len(study.get_trials(deepcopy=False, states=finished))
            if done >= self.n_trials:
                break
            trials = [study.ask(self.distributions) for _ in range(min(self.n_jobs, self.n_trials - done))]
            for t in trials:
                t.set_user_attr("worker", self.worker)
            overrides = [tuple(arguments) + tuple(f"{k}={v}" for k, v in t.params.items()) + (
                f"tune.storage={self.storage}", f"tune.study={study.study_name}", f"tune.trial={t.number}")
                for t in trials]
            results = self.launcher.launch(overrides, initial_job_idx=trials[0].number)
            for trial, result in zip(trials, results):
                self._tell(study, trial, result)
            returns.append(results)
            self._write_results(study)
        return returns

    def _tell(self, study: Any, trial: Any, result: Any) -> None:
        import optuna
        from hydra.core.utils import JobStatus

        if result.status == JobStatus.COMPLETED and isinstance(result.return_value, (int, float)):
            study.tell(trial, float(result.return_value))
        elif isinstance(result._return_value, optuna.TrialPruned):
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            error = result._return_value if result.status != JobStatus.COMPLETED else "no number returned"
            trial.set_user_attr("error", f"{type(error).__name__}: {error}"[:2000])
            study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _write_results(self, study: Any) -> None:
        import optuna

        out = self.sweep_dir / "optuna"
        out.mkdir(exist_ok=True)
        complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if not complete:
            return
        best = study.best_trial
        from agon.records.run_files import write_text_atomic

        write_text_atomic(out / "best.yaml", OmegaConf.to_yaml({
            "study": study.study_name, "trial": best.number, "value": best.value, "params": best.params,
            "overrides": [f"{k}={v}" for k, v in best.params.items()], "finished_trials": len(complete)}))
        if len(complete) >= 2:
            import matplotlib

            matplotlib.use("Agg")
            from optuna.visualization.matplotlib import plot_param_importances

            try:
                axes = plot_param_importances(study)
                axes.figure.savefig(out / "importance.png", bbox_inches="tight")
                import matplotlib.pyplot as plt

                plt.close(axes.figure)
            except (ValueError, RuntimeError) as exc:  # e.g. every trial had the same value
                (out / "importance.txt").write_text(f"no importances: {exc}\n")
