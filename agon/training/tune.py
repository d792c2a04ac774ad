"""Optuna studies as a Hydra sweeper: ``python -m agon.run -m hydra/sweeper=optuna ...`` (``sweeps/tune_reward.yaml``).

The sweeper itself is ``hydra_plugins.agon_optuna_sweeper.OptunaSweeper`` (Hydra finds plugins only in the
``hydra_plugins`` package); this module holds what it and the trials share.

``hydra-optuna-sweeper`` pins ``optuna<3`` and its SQLite storage fails under SQLAlchemy 2, so this is the
project's own sweeper, on the current Optuna. It asks Optuna for ``hydra.sweeper.n_jobs`` trials at a time, hands
them to whatever launcher is configured (the basic one, or submitit's local and SLURM launchers: ``hydra/launcher``),
and tells Optuna each cell's ``eval/accuracy`` (what ``agon.run`` returns) or why it did not finish.

- **Search space**: ``hydra.sweeper.params``, one entry per config key: ``float(low, high)``, ``float(low, high,
  log)``, ``int(low, high)``, ``choice(a, b, ...)``. Every key must exist in the composed config: a study naming
  one that does not fails before its first trial.
- **Storage**: SQLite in the sweep directory (``<sweep dir>/optuna.db``) by default, so a killed study launched
  again with the same ``hydra.sweep.dir`` keeps its finished trials and runs only what is missing. Any database
  URL works (``hydra.sweeper.storage=postgresql://...``), and so does Optuna's journal storage
  (``journal:<path>``, a file several workers can share on a network file system). Several workers sharing one
  storage (and study name) each ask Optuna for their own trials, so they never run the same one.
- **Pruning**: a trial reports every evaluation during training (``eval.every``) through ``TrialReporter``; when
  Optuna's pruner (median by default) says so, the trial stops and is recorded as pruned.
- **Faults**: a trial that raises is recorded as failed with its error (``user_attrs["error"]``) and the study goes
  on. A trial left running by a worker that died on this machine is marked failed when a worker starts again.
- **Results**: ``<sweep dir>/optuna/best.yaml`` (the best trial's number, value, parameters and overrides) and
  ``importance.png`` (Optuna's parameter importances, with two or more finished trials), rewritten after each batch.

Left out on purpose: multi-objective studies and Optuna's own parallel ``study.optimize`` (parallelism is the
launcher's job: ``n_jobs`` trials per launch, run as the launcher runs cells).
"""

from __future__ import annotations

import re
from typing import Any

from omegaconf import DictConfig

from agon.core.config import ConfigError

_SPACE = re.compile(r"^\s*(float|int|choice)\((.*)\)\s*$")


def distribution(key: str, spec: str) -> Any:
    """The Optuna distribution of one ``hydra.sweeper.params`` entry."""
    import optuna

    m = _SPACE.match(str(spec))
    if not m:
        raise ConfigError(f"hydra.sweeper.params.{key}={spec!r}: write float(low, high[, log]), int(low, high[, log])"
                          f" or choice(a, b, ...)")
    kind, args = m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()]
    if kind == "choice":
        return optuna.distributions.CategoricalDistribution([_literal(a) for a in args])
    log = len(args) == 3 and args[2] == "log"
    if len(args) not in (2, 3) or (len(args) == 3 and not log):
        raise ConfigError(f"hydra.sweeper.params.{key}={spec!r}: {kind}(low, high) or {kind}(low, high, log)")
    if kind == "int":
        return optuna.distributions.IntDistribution(int(args[0]), int(args[1]), log=log)
    return optuna.distributions.FloatDistribution(float(args[0]), float(args[1]), log=log)


def _literal(text: str) -> Any:
    """A choice as YAML reads it: 3 an int, 0.5 a float, true a bool, anything else a string."""
    import yaml

    return yaml.safe_load(text)


def storage_backend(url: str) -> Any:
    import optuna

    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url[len("journal:"):]))
    return url


# the study attribute holding the sweeper's MedianPruner settings, which each trial's reporter prunes with
PRUNER_ATTR = "agon_pruner"


class TrialReporter:
    """Reports a trial's evaluations to its study and raises ``optuna.TrialPruned`` when the pruner says so. Built
    from the ``tune`` overrides the sweeper gives each trial's cell."""

    def __init__(self, storage: str, study: str, trial: int):
        import optuna

        backend = storage_backend(storage)
        pruner = optuna.load_study(study_name=study, storage=backend).user_attrs.get(PRUNER_ATTR, {})
        self.study = optuna.load_study(study_name=study, storage=backend,
                                       pruner=optuna.pruners.MedianPruner(**pruner))
        trial_id = next(t._trial_id for t in self.study.get_trials(deepcopy=False) if t.number == trial)
        self.trial = optuna.trial.Trial(self.study, trial_id)

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "TrialReporter | None":
        tune = cfg.tune
        return None if tune.trial is None else cls(tune.storage, tune.study, tune.trial)

    def report(self, value: float, step: int) -> None:
        import optuna

        self.trial.report(value, step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} with eval/accuracy {value:.4f}")


def first_value(dist: Any) -> Any:
    return dist.choices[0] if hasattr(dist, "choices") else dist.low
