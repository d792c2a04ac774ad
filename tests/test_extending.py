"""agon extended from outside and kept to itself: a package outside ``agon/`` adds a task, a reward and a method that
a run uses; agon's schemas stay out of another Hydra app in the same environment and out of agon's own ``--help``;
mistakes in the config fail in one line, with the closest name, before W&B or any model starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agon.records import run_files
from tests.conftest import TEST_WORLD, run_agon

ROOT = Path(__file__).parents[1]
PLUGIN = ROOT / "tests" / "plugin_example"
# the test world's model, warm-started briefly on the plugin's own task (its settings come from the plugin's yaml)
WORLD = [o for o in TEST_WORLD if not o.startswith("task.")] + ["model.tiny.warmup_steps=30"]
SMALL = ["logger=none", "progress=false", "trainer.prompts_per_step=2", "trainer.num_generations=2",
         "trainer.max_new_tokens=24", "eval.n_problems=2", "eval.samples=2", "trainer.max_steps=2"]


def test_a_package_outside_agon_adds_a_task_a_reward_and_a_method_and_a_run_uses_all_three(tmp_path, agon_cache):
    """``plugins=[tests.plugin_example]`` imports it before the check; its yaml comes through Hydra's search path.
    The method is refused by name without the plugin, so the run really is the plugin's."""
    args = ["task=scaled_sums", "reward=brevity", "method=relay", *WORLD, *SMALL,
            f"hydra.searchpath=[file://{PLUGIN / 'conf'}]", f"hydra.run.dir={tmp_path / 'run'}"]
    refused = run_agon(args, agon_cache)
    assert refused.returncode == 1 and "scaled_sums" in refused.stderr  # the premise: agon alone knows none of them
    done = run_agon(["plugins=[tests.plugin_example]", *args], agon_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "run"
    summary = run_files.read_json(run_dir / run_files.SUMMARY)
    assert summary["method"] == "relay" and summary["task"] == "scaled_sums"
    assert summary["reward_weights"]["name"] == "brevity" and summary["reward_weights"]["params"] == {"bonus": 0.25}
    assert summary["config"]["task"]["factor"] == 2  # the plugin's own schema, its default filled
    steps = [r for r in run_files.read_jsonl(run_dir / run_files.METRICS) if "role/drafter/loss" in r]
    assert all("role/challenger/reward/brevity" in r for r in steps)  # the plugin's reward term, logged
    # relay's pair, A alone, and A's self-cascade at equal generations
    assert {r["order"] for r in run_files.read_jsonl(run_dir / run_files.EVAL)} == {"A>B", "A", "A>A"}
    # every problem doubled: each operand of an evaluated problem is even
    ids = {r["problem_id"] for r in run_files.read_jsonl(run_dir / run_files.EVAL)}
    assert ids and all(int(n) % 2 == 0 for i in ids for n in i.replace("-", "+").split("+"))



def test_a_plugin_written_against_the_old_flat_paths_still_imports_them_with_a_warning():
    """``agon.config``, ``agon.rewards`` and ``agon.methods`` (the extension API before the modules moved into
    folders) import as the very modules of their new paths, so a registration through an old path lands in the one
    registry; each warns once, naming the new path. A fresh interpreter: nothing imported before the old paths."""
    probe = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as seen:
    from agon.rewards import REWARD_MODES, register_reward
    from agon.methods import register_method
    from agon.config import TaskConfig
    import agon.config
import agon.core.config, agon.core.rewards, agon.core.methods
from agon.core.rewards import REWARD_MODES as registry
assert REWARD_MODES is registry and agon.config is agon.core.config and TaskConfig is agon.core.config.TaskConfig
assert agon.core.rewards.__spec__.name == "agon.core.rewards", agon.core.rewards.__spec__
print(sorted(str(w.message) for w in seen if w.category is DeprecationWarning))
import agon.policies
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip() == str(sorted(f"agon.{old} is now agon.core.{old}: import it from there"
                                            for old in ("config", "methods", "rewards"))), out.stderr[-2000:]
    # only the extension API has an old path: any other old module is gone, not silently aliased
    assert "ModuleNotFoundError: No module named 'agon.policies'" in out.stderr, out.stderr[-2000:]

def test_a_toy_hydra_app_in_agons_environment_sees_none_of_agons_schemas(tmp_path):
    """Hydra imports every installed ``hydra_plugins`` module (agon's Optuna sweeper among them) in every app: an
    app of its own, with a group named like one of agon's, lists none of agon's nodes and composes its own."""
    conf = tmp_path / "conf"
    (conf / "exchange").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - _self_\nvolume: 1\n")
    (conf / "exchange" / "visible.yaml").write_text("loud: true\n")
    (tmp_path / "app.py").write_text(
        "import hydra\nfrom omegaconf import OmegaConf\n\n"
        "@hydra.main(config_path='conf', config_name='config', version_base='1.3')\n"
        "def main(cfg):\n    print(OmegaConf.to_yaml(cfg))\n\nmain()\n")
    help_text = subprocess.run([sys.executable, "app.py", "--help"], cwd=tmp_path, capture_output=True, text=True,
                               timeout=120).stdout
    assert "exchange: visible" in help_text  # the premise: the app's own groups are listed
    assert "schema" not in help_text and "reward" not in help_text
    composed = subprocess.run([sys.executable, "app.py", "+exchange=visible"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
    assert composed.returncode == 0 and "loud: true" in composed.stdout, composed.stderr[-2000:]
    # the sweeper is there for an app that asks for it
    sweepers = subprocess.run([sys.executable, "app.py", "--hydra-help"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120).stdout
    assert "optuna" in sweepers


def test_agons_own_help_and_errors_list_options_not_schemas():
    done = subprocess.run([sys.executable, "-m", "agon.run", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert "reward: competitive, cooperative, paper" in done.stdout
    assert "_schema" not in done.stdout


@pytest.mark.parametrize("args,says", [
    (["trainer.learning_rate=-1e-3"], "trainer.learning_rate=-0.001 must be > 0"),
    (["trainer.top_p=1.5"], "trainer.top_p=1.5 must be a probability in (0, 1]"),
    (["task=deepmath_hard", "task.source=/nonexistent/deepmath.parquet"],
     "task.source='/nonexistent/deepmath.parquet' does not exist"),
    (["reward=competitve"], "did you mean competitive"),
    (["trainer.lerning_rate=1e-3"], "did you mean trainer.learning_rate"),
])
def test_a_config_mistake_fails_in_one_line_before_wandb_or_any_model(args, says, tmp_path):
    run_dir = tmp_path / "run"
    done = run_agon([*args, "logger=wandb", f"hydra.run.dir={run_dir}"], tmp_path / "cache", cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], done.stderr
    assert not (run_dir / "wandb").exists() and not (tmp_path / "wandb").exists()  # no W&B run was started
    assert not (tmp_path / "cache").exists()  # no model built or loaded


def test_a_run_logs_what_the_console_shows_to_run_log_with_no_bar_and_no_warning_when_asked(tmp_path, agon_cache):
    """Python logging under Hydra: every line agon writes on the console is in the run directory's run.log too;
    progress=false draws no bar at all (the libraries' weight-loading bar included) and a default run warns of
    nothing."""
    run_dir = tmp_path / "run"
    done = run_agon([*TEST_WORLD, *SMALL, "trainer.max_steps=1", f"hydra.run.dir={run_dir}"], agon_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = [line for line in done.stdout.splitlines() if line.strip()]
    assert any(line.startswith("[estimate]") for line in shown) and any("[eval] eval final" in s for s in shown)
    logged = (run_dir / "run.log").read_text()
    assert all(line in logged for line in shown)
    assert "Warning" not in done.stderr and "%|" not in done.stderr and "it/s" not in done.stderr, done.stderr
