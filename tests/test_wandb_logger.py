"""The W&B logger, offline only: files of an offline run, the no-key notice, failing starts, several runs per process.

wandb 0.31 has no public reader for the binary ``.wandb`` file, so its metric keys are checked by searching the
bytes. ``wandb.init`` is replaced wherever a test needs a start to fail, so no test can reach a server.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import pytest
import wandb
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import agon.records.wandb_logger as wl
from agon.records.loggers import Logger
from agon.records.recorder import Recorder, build_logger
from tests.wandb_records import offline_env

CONF = Path(__file__).resolve().parents[1] / "conf"
CELL = "0_exchange=visible,reward=competitive"


@pytest.fixture(autouse=True, scope="module")
def no_wandb_service_left():
    """The W&B runs of this file are in this process: their service (wandb-core, a child process) ends with the
    file, so no later test finds a child it did not start (the sandbox's tests count every one as left behind)."""
    yield
    wandb.teardown()


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path, monkeypatch):
    offline_env(tmp_path, monkeypatch)
    monkeypatch.setattr(wl, "_online_failed", False)


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _cell_dir(tmp_path: Path, name: str = CELL) -> Path:
    sweep = tmp_path / "multirun" / "2026-11-30" / "10-00-00"
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    return sweep / name


def _play(recorder: Recorder, fail: bool = False) -> None:
    """What the trainer does: metric rows, an evaluation with a rollout table, the summary, close."""
    recorder.log_metrics({"train/accuracy": 0.5, "train/final_trace_tokens": 31.0, "time/step_s": None}, step=1)
    recorder.log_metrics({"eval/accuracy": 0.625, "eval/cascade_acc_AB": 0.75}, step=2)
    rows = [
        {
            "problem_id": "p0",
            "problem": "1+2+3",
            "drafter": "A",
            "draft": "<think>1+2=3</think>\\boxed{6}",
            "recap": "1+2=3",
            "challenge": "\\boxed{6}",
            "draft_correct": True,
            "challenge_correct": True,
            "drafter_reward": 1.0,
            "challenger_reward": 1.0,
            "extra": {"k": [1, 2]},
        }
    ] * 3
    recorder.log_rollouts(rows, step=2, mirror=True)
    if fail:
        recorder.close(exit_code=1)
        return
    recorder.write_summary(
        {
            "eval/accuracy": 0.625,
            "eval/headline_orders": ["A>B", "B>A"],
            "method": "agon",
            "experiment": None,
            "config": {"seed": 0},
        }
    )
    recorder.close(exit_code=0)


def _wandb_bytes(run_dir: Path, *keys: str, timeout: float = 20.0) -> bytes:
    """The run's ``.wandb`` file once it holds ``keys`` (W&B's service writes it shortly after ``finish``)."""
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    deadline = time.monotonic() + timeout
    while True:
        blob = files[0].read_bytes()
        if all(k.encode() in blob for k in keys) or time.monotonic() > deadline:
            return blob
        time.sleep(0.1)


def _local_files_complete(run_dir: Path, summary: bool = True) -> None:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"train/step": 1' in lines[0]
    assert len((run_dir / "samples.jsonl").read_text().splitlines()) == 3
    assert (run_dir / "summary.json").exists() == summary


def test_offline_run_writes_its_files_and_metric_keys(tmp_path):
    cfg = _cfg("logger=wandb", "logger.tags=[smoke]", "logger.table_rows=2")
    run_dir = _cell_dir(tmp_path)
    logger = build_logger(cfg, run_dir)
    assert isinstance(logger, wl.WandbLogger)
    run = logger.run
    # job_type: the cell, so that W&B groups its seeds (the overrides less the seed)
    assert run.offline and run.project == "agon" and run.job_type == "exchange=visible,reward=competitive"
    assert run.group == "2026-11-30/10-00-00" and run.name == "exchange=visible,reward=competitive"
    assert set(run.tags) == {
        "method=agon",
        "reward=competitive",
        "exchange=visible",
        "rotation=alternate",
        "init=divergent",
        "task=arithmetic",
        f"model={cfg.model.name}",
        f"seed={cfg.seed}",
        "smoke",
    }
    assert run.config["trainer"]["temperature"] == cfg.model.temperature  # resolved interpolation
    _play(Recorder(run_dir, logger))
    _local_files_complete(run_dir)
    keys = (
        "train/step",
        "train/accuracy",
        "train/final_trace_tokens",
        "eval/accuracy",
        "eval/cascade_acc_AB",
        "rollouts/step_000002",
        "eval/headline_orders",
    )
    blob = _wandb_bytes(run_dir, *keys)
    for key in keys:
        assert key.encode() in blob, key
    assert b"time/step_s" not in blob  # null metrics are not logged
    tables = list((run_dir / "wandb").glob("offline-run-*/files/media/table/rollouts/step_000002*.table.json"))
    assert len(tables) == 1
    table = tables[0].read_text()
    assert '"recap"' in table and table.count('"p0"') == 2  # logger.table_rows=2


def test_no_api_key_runs_offline_with_a_notice(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("HOME", str(tmp_path))
    run_dir = tmp_path / "outputs" / "2026-11-30" / "10-00-00"
    with caplog.at_level(logging.WARNING, logger="agon.records.wandb_logger"):
        logger = build_logger(_cfg("logger=wandb"), run_dir)
    notices = [r.getMessage() for r in caplog.records if r.name == "agon.records.wandb_logger"]
    assert len(notices) == 1 and "no API key" in notices[0] and "\n" not in notices[0]
    assert logger.run.offline and logger.run.name == "10-00-00" and not logger.run.group
    assert logger.run.job_type == "train"  # a single run's directory name is no cell
    logger.finish()


def test_resolve_mode(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert wl.resolve_mode(None, {"HOME": str(home)})[0] == "offline"
    assert wl.resolve_mode(None, {"HOME": str(home), "WANDB_MODE": "online"}) == ("online", None)
    assert wl.resolve_mode(None, {"HOME": str(home), "WANDB_API_KEY": "x" * 40}) == (None, None)
    assert wl.resolve_mode("disabled", {"HOME": str(home), "WANDB_API_KEY": "x" * 40}) == ("disabled", None)
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "x" * 40 + "\n")
    assert wl.resolve_mode(None, {"HOME": str(home)}) == (None, None)
    # a key for another host does not count
    assert wl.resolve_mode(None, {"HOME": str(home), "WANDB_BASE_URL": "https://wandb.example.com"})[0] == "offline"


def test_failing_init_completes_with_local_files(tmp_path, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("W&B is down")

    monkeypatch.setattr(wandb, "init", broken)
    run_dir = _cell_dir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger = build_logger(_cfg("logger=wandb"), run_dir)
    # one warning: an offline start that fails is not retried
    assert [str(w.message) for w in caught] == [
        "logger 'wandb' failed to start (RuntimeError: W&B is down); logging locally only"
    ]
    assert type(logger) is Logger
    _play(Recorder(run_dir, logger))
    _local_files_complete(run_dir)
    assert not (run_dir / "wandb").exists()


def test_online_failure_falls_back_to_offline(tmp_path, monkeypatch):
    real_init, modes = wandb.init, []

    def unreachable_online(**kwargs):
        modes.append(kwargs["mode"])
        if kwargs["mode"] != "offline":
            raise TimeoutError("init timed out")
        return real_init(**kwargs)

    monkeypatch.setattr(wandb, "init", unreachable_online)
    first, second = _cell_dir(tmp_path, "0_a=1"), _cell_dir(tmp_path, "1_a=2")
    with pytest.warns(UserWarning, match="online start failed"):
        logger = build_logger(_cfg("logger=wandb", "logger.mode=online"), first)
    _play(Recorder(first, logger))
    # the next cell of the same process does not wait for the timeout again
    _play(Recorder(second, build_logger(_cfg("logger=wandb"), second)))
    assert modes == ["online", "offline", "offline"]
    for run_dir in (first, second):
        _local_files_complete(run_dir)
        assert b"train/accuracy" in _wandb_bytes(run_dir, "train/accuracy")


def test_cells_of_one_process_each_get_a_finished_run(tmp_path):
    cfg = _cfg("logger=wandb")
    failed, ok = _cell_dir(tmp_path, "0_reward=competitive"), _cell_dir(tmp_path, "1_reward=cooperative")
    first = build_logger(cfg, failed)
    _play(Recorder(failed, first), fail=True)
    second = build_logger(cfg, ok)
    assert second.run.id != first.run.id and second.run.name == "reward=cooperative"
    _play(Recorder(ok, second))
    _local_files_complete(failed, summary=False)
    _local_files_complete(ok)
    assert first._finished and second._finished
    # both runs hold their records (the failed one was finished with exit code 1)
    assert b"rollouts/step_000002" in _wandb_bytes(failed, "rollouts/step_000002")
    assert b"eval/headline_orders" in _wandb_bytes(ok, "eval/headline_orders")


def test_logger_none_logs_nothing(tmp_path):
    cfg = _cfg("logger=none")
    run_dir = _cell_dir(tmp_path)
    logger = build_logger(cfg, run_dir)
    assert type(logger) is Logger
    _play(Recorder(run_dir, logger))
    _local_files_complete(run_dir)
    assert not (run_dir / "wandb").exists()


def test_wandb_is_the_default_logger():
    cfg = _cfg()
    assert cfg.logger.name == "wandb" and cfg.logger.project == "agon" and cfg.logger.mode is None
    assert OmegaConf.select(cfg, "logger.table_rows") == 16


def test_job_type_is_the_cell_without_its_seed():
    assert wl.cell_job_type("exchange=hidden,seed=1") == "exchange=hidden"
    assert wl.cell_job_type("seed=2,+trainer.x=[1,2],reward=cooperative") == "+trainer.x=[1,2],reward=cooperative"
    assert wl.cell_job_type("seed=3") == "train"
    long = ",".join(f"trainer.key{i}=value{i}" for i in range(8))
    assert len(wl.cell_job_type(long)) == 64 and wl.cell_job_type(long) != wl.cell_job_type(long + "0")


def test_names_from_hydra_inside_a_multirun(tmp_path, monkeypatch):
    from hydra.types import RunMode

    assert wl._hydra_config() is None  # Hydra is not running in tests
    hydra = OmegaConf.create(
        {
            "mode": RunMode.MULTIRUN,
            "sweep": {"dir": "multirun/2026-12-01/09-00-00"},
            "job": {"override_dirname": "exchange=hidden,seed=1"},
        }
    )
    monkeypatch.setattr(wl, "_hydra_config", lambda: hydra)
    job = _cfg("logger=wandb", "exchange=hidden")
    assert wl.run_names(job, tmp_path / "3_exchange=hidden,seed=1") == (
        "2026-12-01/09-00-00",
        "exchange=hidden,seed=1",
    )
    job.logger.group = "mine"
    assert wl.run_names(job, tmp_path / "x")[0] == "mine"
    hydra.mode = RunMode.RUN
    job.logger.group = None
    job.experiment = "grid_2x2"
    assert wl.run_names(job, tmp_path / "x") == ("grid_2x2", "exchange=hidden,seed=1")


def test_a_reevaluation_is_a_run_of_the_group_with_its_numbers(tmp_path):
    """agon.eval's results: a W&B run of the training run's group, job type reeval, with the summary's numbers and
    the cross-play matrix as a table."""
    from tests.wandb_records import OfflineRun

    cfg = _cfg("logger=wandb")
    run_dir = _cell_dir(tmp_path)
    summary = {"eval/accuracy": 0.5, "crossplay/A>B": 0.25, "recap/B/none": 0.125,
               "crossplay": {"A>B": 0.25, "B>A": 0.75}, "config": {"seed": 0}, "eval/divergence": None}
    run_id = wl.log_reevaluation(cfg, run_dir, summary)
    offline = OfflineRun(run_dir / "reeval")
    assert offline.run.run_id == run_id and offline.run.run_group == "2026-11-30/10-00-00"
    assert offline.run.job_type == "reeval" and "reeval" in offline.run.tags
    assert offline.run.display_name == "exchange=visible,reward=competitive (reeval)"
    assert offline.summary["eval/accuracy"] == 0.5 and offline.summary["recap/B/none"] == 0.125
    assert "config" not in offline.summary and "eval/divergence" not in offline.summary
    assert "reeval/crossplay/_type" in offline.keys  # a table (W&B flattens its reference)


def test_a_run_stopped_by_sigterm_is_finished_as_preempting_with_exit_code_143(tmp_path):
    """``agon.core.preemption``: the recorder closed with its exit code marks the W&B run preempting (W&B shows it so,
    and the requeued launch resumes it under the same id) before finishing it with 143; a failed run is not marked."""
    from agon.core.preemption import EXIT_CODE
    from tests.wandb_records import OfflineRun

    cfg = _cfg("logger=wandb")
    stopped, failed = _cell_dir(tmp_path, "0_reward=competitive"), _cell_dir(tmp_path, "1_reward=cooperative")
    for run_dir, code in ((stopped, EXIT_CODE), (failed, 1)):
        recorder = Recorder(run_dir, build_logger(cfg, run_dir))
        recorder.log_metrics({"train/accuracy": 0.5}, step=1)
        recorder.close(exit_code=code)
    for run_dir, code, preempting in ((stopped, 143, 1), (failed, 1, 0)):
        run = OfflineRun(run_dir)
        assert [r.exit.exit_code for r in run.records if r.HasField("exit")] == [code]
        assert sum(r.HasField("preempting") for r in run.records) == preempting
