"""Shared setup for the task-layer tests: nothing here may reach a hub, and datasets' cache stays in a temp dir."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# before anything imports datasets / huggingface_hub, which read these at import time
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
if "HF_DATASETS_CACHE" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="agon-test-hf-datasets-")
    os.environ["HF_DATASETS_CACHE"] = _cache
    atexit.register(shutil.rmtree, _cache, True)

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _offline():
    """Also force offline mode when another test imported datasets before these environment variables were set."""
    try:
        import datasets.config
        import huggingface_hub.constants

        datasets.config.HF_DATASETS_OFFLINE = True
        huggingface_hub.constants.HF_HUB_OFFLINE = True
    except ImportError:
        pass
    yield


CONF = Path(__file__).parents[2] / "conf"


def compose(*overrides: str):
    """The full config composed by Hydra from conf/ (so the YAML files are tested too)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import agon.core.config  # noqa: F401  (registers the schemas)

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides))


def compose_task(option: str, *overrides: str):
    """The task node for ``task=<option>`` plus ``task.``-relative overrides, as build_task receives it."""
    cfg = compose(f"task={option}", *(o if o.startswith(("task.", "+task.")) else f"task.{o}" for o in overrides))
    return cfg.task


@pytest.fixture(name="compose_task")
def _compose_task_fixture():
    return compose_task
