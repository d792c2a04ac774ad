"""The outside world's interfaces as they really are, for the parts of agon that meet them outside the tasks: an
installed package's entry point (not only ``plugins=[...]``), and W&B's own metric definitions and step axes (not
only the history rows). The tasks' interfaces (CodeContests' statements, the kernel's system-call arguments,
datasets that repeat items) are in tests/tasks/test_interfaces.py.

The entry point is a real distribution's metadata (``<name>.dist-info`` with ``METADATA`` and ``entry_points.txt``,
what pip writes into site-packages) on a fresh interpreter's path: ``importlib.metadata`` finds it exactly as it
finds an installed one. The W&B records are the offline run's own ``.wandb`` file, read with W&B's protobuf types
(tests/wandb_records.py). Left out on purpose: ``pip install`` of the package itself (tests/test_install.py builds and
installs agon's wheel; installing a second one here would add a minute for the same metadata) and an online W&B
server (no network here; the offline file is what ``wandb sync`` uploads).
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agon.records import run_files
from agon.records.recorder import Recorder, build_logger
from tests.conftest import compose_config
from tests.wandb_records import OfflineRun, offline_env

ROOT = Path(__file__).parents[1]
PLUGIN_CONF = ROOT / "tests" / "plugin_example" / "conf"
RESULTS = ROOT / "results"


# ---------------------------------------------------------------------------------------------------------------
# an installed entry point


def _install_metadata(site: Path) -> None:
    """A distribution as pip leaves it in site-packages: its dist-info, declaring tests.plugin_example under the
    ``agon.plugins`` group with an entry-point name that is not its module's (the name is a label, the value is
    what is imported)."""
    info = site / "agon_scaled_sums-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agon-scaled-sums\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[agon.plugins]\nscaled-sums = tests.plugin_example\n")
    (info / "RECORD").write_text("")


PROBE = """
import importlib.metadata, json, sys
from agon.core.config import TASK_SCHEMAS
from agon.core.methods import METHODS
from agon.core.rewards import REWARD_MODES
from agon.training.checks import compose_config, validate
found = [(ep.name, ep.value) for ep in importlib.metadata.entry_points(group="agon.plugins")]
before = ["scaled_sums" in TASK_SCHEMAS, "relay" in METHODS, "brevity" in REWARD_MODES,
          "tests.plugin_example" in sys.modules]
try:
    cfg = compose_config(["task=scaled_sums", "reward=brevity", "method=relay", "hydra.searchpath=[file://%s]"])
    validate(cfg)
    out = {"task": cfg.task.kind, "factor": cfg.task.factor, "method": cfg.method.name, "reward": cfg.reward.name}
except Exception as exc:
    out = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps({"found": found, "before": before, "config": out}))
"""


def test_an_installed_packages_entry_point_is_imported_and_registers_its_task_method_and_reward(tmp_path):
    """No ``plugins=[...]``: the distribution's ``agon.plugins`` entry point alone makes agon's config check know
    the plugin's task kind (its schema and default), method and reward. A fresh interpreter, so nothing else has
    imported the plugin, and the check is agon's own (``compose_config`` and ``validate``, as a run composes)."""
    site = tmp_path / "site-packages"
    _install_metadata(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", PROBE % PLUGIN_CONF], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["found"] == [["scaled-sums", "tests.plugin_example"]]  # the metadata is found as an installed one's
    assert got["before"] == [False, False, False, False]  # until agon's check runs, agon knows none of them
    assert got["config"] == {"task": "scaled_sums", "factor": 2, "method": "relay", "reward": "brevity"}


# ---------------------------------------------------------------------------------------------------------------
# W&B's metric definitions


def _logged_rows() -> tuple[dict, dict]:
    """One training row and one evaluation row holding every key that agon's runs kept in ``results/`` logged,
    with the values they logged: each family of metrics agon writes (role/, adapter/, latent/, recap/, crossplay/,
    eval/, time/, verifier/, train/)."""
    train: dict = {}
    evaluation: dict = {}
    for path in sorted(RESULTS.rglob("metrics.jsonl*")):
        for row in run_files.read_jsonl(path.with_name("metrics.jsonl")):
            into = evaluation if "eval/accuracy" in row else train
            for key, value in row.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "train/step":
                    into.setdefault(key, value)
    return train, evaluation


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch, wandb_service):
    offline_env(tmp_path, monkeypatch)


def _definition(definitions: list, key: str):
    """The metric definition W&B applies to ``key``: the one defined by its exact name, else the first glob that
    matches it (W&B's rule), else None."""
    exact = [d for d in definitions if d.name == key]
    if exact:
        return exact[-1]
    return next((d for d in definitions if d.glob_name and fnmatch.fnmatchcase(key, d.glob_name)), None)


def test_every_metric_family_agon_logs_is_drawn_against_train_step_in_wands_own_definitions(tmp_path,
                                                                                             offline_wandb):
    """Each key of every history row (training, evaluation, the rollout tables) has W&B's step axis
    ``train/step`` by W&B's own metric definitions, written before the first row; ``train/step`` itself is a
    defined, visible metric, and every row carries it. A definition that covered ``train/*`` alone, named another
    axis, or came after the rows would leave the rows on W&B's internal ``_step`` (its count of log calls), which
    a resumed run restarts."""
    train, evaluation = _logged_rows()
    families = {k.split("/")[0] for k in [*train, *evaluation]}
    assert {"role", "adapter", "latent", "recap", "crossplay", "eval", "time", "train"} <= families  # the premise
    run_dir = tmp_path / "run"
    recorder = Recorder(run_dir, build_logger(compose_config(["logger=wandb"]), run_dir))
    recorder.log_metrics(train, step=3)
    recorder.log_metrics(evaluation, step=3)
    recorder.log_rollouts([{"problem_id": "p0", "draft": "1+2=3", "drafter_reward": 1.0}], step=3, mirror=True)
    recorder.log_metrics(train, step=4)
    recorder.write_summary({"eval/accuracy": evaluation["eval/accuracy"], "train/steps": 4})
    recorder.close(0)

    wandb_run = OfflineRun(run_dir)
    records = wandb_run.records
    definitions = [r.metric for r in records if r.HasField("metric")]
    first_row = next(i for i, r in enumerate(records) if r.HasField("history"))
    assert all(i < first_row for i, r in enumerate(records) if r.HasField("metric")), "defined after a row"
    axis = _definition(definitions, "train/step")
    assert axis is not None and axis.name == "train/step" and not axis.step_metric and not axis.options.hidden
    # a metric's name: an item's key, or the first part of a nested one (a table's fields sit under its name)
    keys = {item.key or item.nested_key[0] for r in records if r.HasField("history") for item in r.history.item}
    keys -= {"_step", "_runtime", "_timestamp"}  # W&B's own
    assert set(train) | set(evaluation) | {"train/step", "rollouts/step_000003"} <= keys
    for key in sorted(keys - {"train/step"}):
        d = _definition(definitions, key)
        assert d is not None and d.step_metric == "train/step" and not d.options.hidden, (key, d)
    assert [row.get("train/step") for row in wandb_run.history] == [3, 3, 3, 4]
