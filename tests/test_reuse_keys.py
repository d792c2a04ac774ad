"""The keys that decide what a relaunch reuses, taken apart one component at a time: the committed parts of an
evaluation (``cascade.store_key``), a finished run (``run.finished_summary``), the checkpoint a resume reads
(``run.check_checkpoint``), a sweep cell's folder (Hydra's ``override_dirname`` through ``safe_dirname``), and the
sandbox's runtime copies (``sandbox.runtime_of``'s digest, ``slot_runtime``, ``release_runtime``,
``sweep_runtimes``).

Every key of the config is enumerated from the composed config (so a key added to agon is enumerated too) and changed
alone: reuse must be refused for each one that changes what a run computes, and kept for those that only say where
and how a run is shown. A record written before a key existed matches only that key's default. A reset removes every
part. Names are the same in another process (another ``PYTHONHASHSEED``). The decisions are called directly on
records written to tmp_path; one cheap in-process run shows that a checkpoint names its configuration.

Left out on purpose: the offline world's cache key (``world.world_key``, tests/test_world.py and
tests/tasks/test_target_sum.py move each of its keys), the rows a resumed evaluation plays again (tests/test_resume.py
and tests/test_streamed.py kill real runs for that), and whether each key really changes what a run computes (the
settings map, tests/settings_map.py, says so key by key).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from agon.core import config
from agon.core.config import ConfigError, safe_dirname, to_plain
from agon.game.cascade import evaluate, store_key
from agon.records import run_files
from agon.records.recorder import Recorder
from agon.run import MEMORY_KEYS, check_checkpoint, finished_summary, run
from agon.tasks import build_task
from agon.tasks import sandbox
from agon.training.trainer import Trainer
from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]


# -- the config, one key at a time ------------------------------------------------------------------------------------


@functools.cache
def _default_plain() -> str:
    return json.dumps(to_plain(compose_config([])))


def default_config() -> dict[str, Any]:
    """The default composed config, resolved, as plain containers (a fresh copy each call)."""
    return json.loads(_default_plain())


def leaves(tree: dict[str, Any]) -> dict[str, Any]:
    """Every key of a plain config, dotted, with its value (a list or an empty dict is one value)."""
    return run_files.flatten(tree)


def other(value: Any) -> Any:
    """A value of the same kind as ``value`` and different from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if value is None:
        return "other"
    if isinstance(value, list):
        return [*value, "other"]
    return {**value, "other": 1}


def off(value: Any) -> Any:
    """The value of ``value``'s kind that turns a feature off (what an older run without the key is guessed to
    have had)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return type(value)(0)
    return {list: [], dict: {}}.get(type(value))


def with_key(tree: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(tree)
    *path, last = key.split(".")
    node = out
    for part in path:
        node = node[part]
    node[last] = value
    return out


def without_key(tree: dict[str, Any], key: str) -> dict[str, Any]:
    out = copy.deepcopy(tree)
    *path, last = key.split(".")
    node = out
    for part in path:
        node = node[part]
    del node[last]
    return out


def schema_defaults(task_kind: str) -> dict[str, Any]:
    """Every key's default as the typed schema gives it (``Config``'s fields, the task's through its kind's schema):
    what a key is when nobody sets it."""
    hints = typing.get_type_hints(config.Config)
    tree: dict[str, Any] = {}
    for f in dataclasses.fields(config.Config):
        schema = config.TASK_SCHEMAS[task_kind] if f.name == "task" else hints[f.name]
        if dataclasses.is_dataclass(schema):
            tree[f.name] = OmegaConf.to_container(OmegaConf.structured(schema))
        else:
            tree[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore
    return leaves(tree)


# -- a committed evaluation's parts -----------------------------------------------------------------------------------

# keys whose value an evaluation's samples do not depend on, each with why; every other key must move the parts key
NOT_SAMPLED_GROUPS = {
    "reward": "an evaluation grades its answers; nothing in it is rewarded",
    "init": "how the adapters started: the adapters evaluated are named by their digest",
    "trainer": "training's sampling and update; an evaluation samples with eval.* (Sampling.from_config(cfg.eval))",
    "logger": "where the records are mirrored",
    "tune": "which Optuna trial the run reports to",
    "experiment": "a label",
    "output_dir": "where the files go",
    "progress": "a progress bar",
    "plugins": "imports whose registrations are named by the keys that use them (task.kind, method.name ...)",
}
NOT_SAMPLED = {
    "generation.allow_slow": "a preflight gate: whether a slow engine may start",
    "generation.stream": "every row draws from its own seed, streamed or in two stages",
    "generation.vllm.placement": "where the engine runs",
    "generation.vllm.python": "which interpreter starts the worker",
    "generation.vllm.gpu_memory_utilization": "the engine's memory (lowered after an out-of-memory)",
    "generation.vllm.cpu_kv_cache_gib": "the engine's memory",
    "generation.vllm.max_num_seqs": "the engine's batch width; rows draw from their own seeds",
    "generation.vllm.enforce_eager": "how the engine runs its forward pass",
    "generation.vllm.start_timeout_s": "how long the engine may take to start",
}


def not_sampled(key: str) -> bool:
    return key in NOT_SAMPLED or key.split(".")[0] in NOT_SAMPLED_GROUPS


def parts_key(plain: dict[str, Any], *, digest: str = "digest", phase: str = "start", step: int = 0, n: int = 3,
              samples: int = 2, world: int = 1) -> str:
    return store_key(digest, OmegaConf.create(plain), phase, step, n, samples, world=world)


def parts_key_moves() -> dict[str, bool]:
    """Every key of the config -> whether changing it alone moves the parts key."""
    plain = default_config()
    base = parts_key(plain)
    return {key: parts_key(with_key(plain, key, other(value))) != base for key, value in leaves(plain).items()}


def test_every_setting_that_shapes_an_evaluation_moves_its_parts_key_and_no_other_does():
    moves = parts_key_moves()
    assert set(NOT_SAMPLED) <= set(moves), "a key listed here is no longer in the config"
    wrong = sorted(k for k, moved in moves.items() if moved == not_sampled(k))
    assert not wrong, ("parts reused across a change of what the evaluation samples, or refused across one of its "
                       f"resources: {wrong}")


def test_the_parts_key_moves_with_the_adapters_the_phase_the_step_the_size_and_the_processes():
    """Two processes cut an evaluation of chunk_problems=3 into chunks of 4 problems (a multiple of the processes),
    one process into chunks of 3, and each rank seeds its own share: chunk 0 of one launch is not chunk 0 of a
    relaunch on another number of processes."""
    plain = default_config()
    base = parts_key(plain)
    assert parts_key(plain) == base
    for component, value in {"digest": "another", "phase": "final", "step": 1, "n": 4, "samples": 3,
                             "world": 2}.items():
        assert parts_key(plain, **{component: value}) != base, component


def test_an_evaluation_reads_no_setting_its_parts_key_leaves_out(policies, small_cfg):
    """The evaluation played on a config that holds only what moves the parts key (every other key removed, so
    reading one fails) gives the rows it gives on the whole config: nothing it reads is missing from the key."""
    moves = parts_key_moves()
    small_cfg.eval.max_new_tokens = 8  # cut short: the rows of both plays are compared, not their quality
    plain = to_plain(small_cfg)
    kept: dict[str, Any] = {}
    for key, value in leaves(plain).items():
        if moves.get(key, True):  # small_cfg's own keys are the default config's
            *path, last = key.split(".")
            node = kept
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
    assert "trainer" not in kept and "generation" in kept and "stream" not in kept["generation"]
    bare = OmegaConf.create(kept)
    OmegaConf.set_struct(bare, True)
    task = build_task(small_cfg.task)
    problems = list(task.heldout_problems())[:1]
    whole = evaluate(policies, task, small_cfg, problems, step=0, phase="start", samples=1)
    read = evaluate(policies, task, bare, problems, step=0, phase="start", samples=1)
    assert read.rows == whole.rows


# -- a finished run ---------------------------------------------------------------------------------------------------

@functools.cache
def _dictconfig(plain: str) -> Any:
    return OmegaConf.create(json.loads(plain))


def reuse(run_dir: Path, ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """What a launch of ``ours`` does with a directory holding the finished run of ``theirs``: ``reused`` (skipped),
    ``resumed`` (extended or evaluated again from its last checkpoint) or ``refused`` (another configuration)."""
    summary = {"eval/accuracy": 0.5, "config": theirs}
    (run_dir / run_files.SUMMARY).write_text(json.dumps(summary))
    try:
        done = finished_summary(run_dir, _dictconfig(json.dumps(ours)))
    except ConfigError:
        return "refused"
    assert done is None or done == summary
    return "resumed" if done is None else "reused"


# where and how a run is shown, not what it computes: a finished run is the same run without them
PRESENTATION = {"output_dir", "progress", "plugins", "trainer.resume", "tune.storage", "tune.study"}


def presentation(key: str) -> bool:
    return key in PRESENTATION or key.startswith("logger.")


def test_a_finished_run_is_reused_across_presentation_keys_alone_and_every_other_key_refuses_it(tmp_path):
    """Each key changed alone in the finished run's record: reused across a presentation key, resumed across the
    run's length and its evaluation (a finished run extended, or evaluated again), refused across any other key, and
    the refusal names the key."""
    plain = default_config()
    wrong = {}
    for key, value in leaves(plain).items():
        theirs = with_key(plain, key, other(value))
        expected = ("reused" if presentation(key) else
                    "resumed" if key == "trainer.max_steps" or key.startswith("eval.") else "refused")
        got = reuse(tmp_path, plain, theirs)
        if got != expected:
            wrong[key] = got
        elif got == "refused":
            with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
                finished_summary(tmp_path, _dictconfig(json.dumps(plain)))
    assert not wrong, f"keys whose change does not decide the reuse as it should: {wrong}"


def test_a_record_older_than_a_key_matches_that_keys_default_alone(tmp_path):
    """A finished run recorded before agon had a key: the same run for a launch at the key's default when that
    default is off (the feature the key added is not used), never for a launch at any other value."""
    plain = default_config()
    defaults = schema_defaults(plain["task"]["kind"])
    wrong = {}
    for key, value in leaves(plain).items():
        if presentation(key):
            continue
        theirs = without_key(plain, key)
        for new in (other(value), off(value), value):
            at_default = key in defaults and new == defaults[key] and type(new) is type(defaults[key])
            if at_default and new == off(new):
                continue  # the documented match (tests/test_resume.py: allow_slow, reward.params)
            if not at_default and reuse(tmp_path, with_key(plain, key, new), theirs) == "reused":
                wrong[key] = new
    assert not wrong, f"an older record counted as matching a launch away from the key's default: {wrong}"
    for key in ("generation.allow_slow", "reward.params", "generation.vllm.python"):
        assert reuse(tmp_path, plain, without_key(plain, key)) == "reused", key


# -- the checkpoint a resume reads ------------------------------------------------------------------------------------


def resumes(run_dir: Path, ours: dict[str, Any], saved: dict[str, Any] | None) -> bool:
    """Whether a launch of ``ours`` may train on from the checkpoint ``latest`` names, written by a run of ``saved``
    (None: a checkpoint written before checkpoints kept their config)."""
    step = run_dir / run_files.CHECKPOINTS / "step_2"
    step.mkdir(parents=True, exist_ok=True)
    (run_dir / run_files.CHECKPOINTS / "latest").write_text("step_2")
    (step / run_files.CHECKPOINT_CONFIG).unlink(missing_ok=True)
    if saved is not None:
        (step / run_files.CHECKPOINT_CONFIG).write_text(json.dumps(saved))
    try:
        check_checkpoint(run_dir, _dictconfig(json.dumps(ours)))
    except ConfigError:
        return False
    return True


def test_a_checkpoint_is_trained_on_only_across_its_length_its_evaluation_and_presentation_and_engine_resources(
        tmp_path):
    """Each key changed alone in the config a checkpoint was written under: a launch trains on from it across the
    run's length, its evaluation, a presentation key, the engine's resources and the trainer's memory cuts (a
    relaunch after an out-of-memory), and is refused across any other key (a learning rate, a reward, a seed)."""
    plain = default_config()
    assert resumes(tmp_path, plain, plain) and resumes(tmp_path, plain, None)
    wrong = {}
    for key, value in leaves(plain).items():
        allowed = (presentation(key) or key == "trainer.max_steps" or key.startswith("eval.") or key in NOT_SAMPLED
                   or key in MEMORY_KEYS)
        if resumes(tmp_path, plain, with_key(plain, key, other(value))) != allowed:
            wrong[key] = "refused" if allowed else "trained on"
    assert not wrong, wrong
    assert resumes(tmp_path, plain, without_key(plain, "generation.allow_slow"))
    assert not resumes(tmp_path, with_key(plain, "generation.vllm.request_seeds", False),
                       without_key(plain, "generation.vllm.request_seeds"))


def test_a_checkpoint_names_its_config_and_a_run_of_another_is_refused_before_any_model_loads(policies, small_cfg):
    run_dir = Path(small_cfg.output_dir)
    trainer = Trainer(small_cfg, policies, build_task(small_cfg.task), Recorder(run_dir), run_dir, log=lambda *_: None)
    trainer.save_checkpoint()  # at step 0: what a launch in this directory would resume
    trainer.engine.close()
    assert run_files.read_json(run_dir / run_files.CHECKPOINTS / "step_0" / run_files.CHECKPOINT_CONFIG) == \
        to_plain(small_cfg)
    other_rate = copy.deepcopy(small_cfg)
    other_rate.trainer.learning_rate *= 2
    with pytest.raises(ConfigError, match=r"checkpoint .*trainer\.learning_rate"):
        run(other_rate)
    assert (run_dir / run_files.CHECKPOINTS / "step_0").is_dir(), "refused, not discarded"


# -- a sweep cell's folder --------------------------------------------------------------------------------------------

@functools.cache
def _hydra_naming() -> tuple[str, tuple[str, ...], str, str]:
    """(the sweep's subdir as composed, the keys left out of folder names, item and key-value separators)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config.CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=LONG_OVERRIDES, return_hydra_config=True)
    naming = cfg.hydra.job.config.override_dirname
    assert cfg.hydra.sweep.subdir == safe_dirname(cfg.hydra.job.override_dirname)
    return cfg.hydra.sweep.subdir, tuple(naming.exclude_keys), naming.item_sep, naming.kv_sep


# more overrides than a folder name holds: cut, with a hash of the whole
LONG_OVERRIDES = ["reward=cooperative", "exchange=hidden", "seed=3", "trainer.learning_rate=0.0002",
                  "trainer.max_steps=7", "eval.n_problems=11", "trainer.prompts_per_step=4",
                  "trainer.num_generations=3", "model.lora.rank=8", "model.lora.alpha=16", "task.max_operand=9",
                  "logger.mode=offline"]


def folder(overrides: list[str]) -> str:
    """The folder a sweep cell launched with ``overrides`` writes into (under the sweep's directory)."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.override_parser.overrides_parser import OverridesParser

    _, exclude, item_sep, kv_sep = _hydra_naming()
    parsed = OverridesParser.create().parse_overrides(overrides)
    return safe_dirname(get_overrides_dirname(parsed, list(exclude), item_sep, kv_sep))


def groups() -> list[str]:
    """The config groups a command line can choose (the folders of conf/, less Hydra's own)."""
    return sorted(p.name for p in config.CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")


def test_a_cells_folder_is_named_by_every_override_that_a_finished_run_is_not_reused_across(tmp_path):
    """A sweep launched again finds its finished cells by their folders. An override left out of the name must be
    one a finished run is reused across (else the relaunch lands in the cell of another configuration and is
    refused), and one a finished run is reused across must be left out (else a logging change trains every cell
    again in new folders). Which keys a finished run is reused across is asked of ``finished_summary`` itself."""
    plain = default_config()
    reused = {key for key, value in leaves(plain).items()
              if reuse(tmp_path, plain, with_key(plain, key, other(value))) == "reused"}
    assert reused, "the premise: some keys are presentation"
    unnamed = {key for key, value in leaves(plain).items() if folder([f"{key}=1"]) == folder([])}
    assert unnamed == reused, {"named but reused": sorted(reused - unnamed),
                               "unnamed but refused": sorted(unnamed - reused)}
    # a group is left out of the name when everything under it is reused across
    for group in groups():
        under = [k for k in leaves(plain) if k.split(".")[0] == group]
        whole = bool(under) and all(k in reused for k in under)
        assert (folder([f"{group}=x"]) == folder([])) == whole, group


def test_a_cells_folder_is_its_overrides_alone_in_any_order_and_long_ones_are_cut_apart():
    subdir = _hydra_naming()[0]
    assert subdir == folder(LONG_OVERRIDES) == folder(list(reversed(LONG_OVERRIDES)))
    assert len(subdir) <= 160 and not subdir[0].isdigit()  # no job number: a relaunch with more cells keeps names
    # two names that agree up to the cut still differ: the hash is of the whole
    assert folder([*LONG_OVERRIDES, "seed=4"]) != folder([*LONG_OVERRIDES, "seed=5"])
    short = "seed=1,trainer.max_steps=2"
    assert safe_dirname(short) == short
    assert len({safe_dirname("x" * 150 + tail) for tail in ("a" * 20, "b" * 20, "a" * 21)}) == 3


# -- names in another process -----------------------------------------------------------------------------------------

NAMES_SCRIPT = """
import json
from omegaconf import OmegaConf
from agon.core.config import safe_dirname
from agon.game.cascade import store_key
from agon.tasks import sandbox
plain = json.loads(open({config!r}).read())
print(json.dumps({{
    "parts": store_key("digest", OmegaConf.create(plain), "train", 4, 3, 2),
    "folder": safe_dirname({overrides!r}),
    "runtime": sandbox.runtime_of({python!r}, {setpriv!r}).digest,
}}))
"""


def setpriv() -> str:
    found = shutil.which("setpriv", path=sandbox.ENV_ALLOWLIST["PATH"])
    if found is None or not Path(sandbox.SYSTEM_PYTHON).exists():
        pytest.skip("no setpriv or system python: the sandbox's runtime cannot be listed here")
    return found


def test_every_reuse_name_is_the_same_in_a_process_with_another_hash_seed(tmp_path):
    plain = default_config()
    (tmp_path / "config.json").write_text(json.dumps(plain))
    # the folder's name: Hydra's sorted overrides (no hashing there), cut with a hash by safe_dirname
    names = ",".join(sorted(LONG_OVERRIDES))
    here = {"parts": store_key("digest", OmegaConf.create(plain), "train", 4, 3, 2), "folder": safe_dirname(names),
            "runtime": sandbox.runtime_of(sandbox.SYSTEM_PYTHON, setpriv()).digest}
    assert len(names) > 160 and here["folder"] != names[:160], "the premise: the name is cut, with its hash"
    script = NAMES_SCRIPT.format(config=str(tmp_path / "config.json"), overrides=names,
                                 python=sandbox.SYSTEM_PYTHON, setpriv=setpriv())
    seed = str(int(os.environ.get("PYTHONHASHSEED", "0") or "0") + 1)  # ours is random unless set: another either way
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == here


# -- the sandbox's runtime copies -------------------------------------------------------------------------------------


def test_the_runtimes_digest_moves_with_each_files_size_and_time_and_each_links_target(tmp_path, monkeypatch):
    """A uid's copy of the runtime is reused while its stamp is the host runtime's digest: a file the host updated
    (its size, or only its time) or a link pointed elsewhere must give another digest, so the copy is made again.
    Here the runtime's ``setpriv`` is a link to a copy of the host's, changed one way at a time."""
    real = setpriv()
    (tmp_path / "bin").mkdir()
    exe, link = tmp_path / "bin" / "setpriv", tmp_path / "setpriv"
    shutil.copy2(real, exe)
    link.symlink_to("bin/setpriv")

    def digest() -> str:
        monkeypatch.setattr(sandbox, "_RUNTIMES", {})  # found once per process otherwise
        return sandbox.runtime_of(sandbox.SYSTEM_PYTHON, str(link)).digest

    base = digest()
    assert digest() == base
    stamp = exe.stat().st_mtime_ns
    os.utime(exe, ns=(stamp, stamp + 10**9))
    assert digest() != base, "a file's time"
    with open(exe, "ab") as f:
        f.write(b"\0")
    os.utime(exe, ns=(stamp, stamp))
    assert digest() != base, "a file's size"
    exe.write_bytes(Path(real).read_bytes())
    os.utime(exe, ns=(stamp, stamp))
    assert digest() == base, "the premise: the same file again, the same digest"
    link.unlink()
    link.symlink_to("./bin/setpriv")
    assert digest() != base, "a link's target"


def mounts_at(path: Path) -> list[int]:
    """The ids of the file systems mounted at ``path`` (stacked ones each count), the one a reader sees last."""
    with open("/proc/self/mountinfo") as f:
        return [int(line.split()[0]) for line in f if line.split()[4] == str(path)]


@pytest.fixture
def copies(tmp_path):
    """A directory for runtime copies of this test's own, every mount under it detached afterwards."""
    if os.geteuid() != 0:
        pytest.skip("runtime copies are tmpfs mounts: root only")
    base = tmp_path / "runtime"
    yield base
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f if line.split()[4].startswith(str(base))]
    for point in sorted(points, key=len, reverse=True):
        while os.path.ismount(point):
            sandbox._mount_call(point.encode(), 2)


def small_runtime(tmp_path: Path, digest: str) -> sandbox.Runtime:
    """A runtime of one file, ``host/lib`` under ``tmp_path``, holding ``digest``."""
    src = tmp_path / "host"
    src.mkdir(parents=True, exist_ok=True)
    (src / "lib").write_text(digest)
    return sandbox.Runtime(((str(src), "dir", ""), (str(src / "lib"), "file", "")), (f"/{src.parts[1]}",), digest,
                           4096)


def stack(root: Path, n: int, stamp: str) -> None:
    """``n`` copies mounted on one another at ``root``, as a trainer that died while making one leaves them."""
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(n):
        sandbox._mount_call(b"tmpfs", str(root).encode(), b"tmpfs", 0, b"size=1m")
        (root / sandbox.RUNTIME_STAMP).write_text(stamp)


def test_a_runtime_copy_is_reused_only_while_mounted_with_the_hosts_digest(tmp_path, copies):
    first = small_runtime(tmp_path, "one")
    root = Path(sandbox.slot_runtime(first, 7, base=str(copies)))
    copied = root / str(tmp_path / "host" / "lib").lstrip("/")
    # the host's file changed under the same digest: a copy made again would hold the change, one reused does not
    (tmp_path / "host" / "lib").write_text("changed")
    sandbox.slot_runtime(first, 7, base=str(copies))
    assert copied.read_text() == "one" and len(mounts_at(root)) == 1, "the same runtime: reused"
    second = small_runtime(tmp_path / "b", "two")
    sandbox.slot_runtime(second, 7, base=str(copies))
    assert len(mounts_at(root)) == 1, "another runtime: made again, the old copy gone"
    assert (root / sandbox.RUNTIME_STAMP).read_text() == "two" and not copied.exists()
    # the stamp alone, on a folder where no copy is mounted (the copy gone, the folder left), is no copy
    assert sandbox.release_runtime(7, base=str(copies))
    root.mkdir()
    (root / sandbox.RUNTIME_STAMP).write_text("two")
    sandbox.slot_runtime(second, 7, base=str(copies))
    assert os.path.ismount(root) and (root / str(tmp_path / "b" / "host" / "lib").lstrip("/")).read_text() == "two"


def test_remaking_or_releasing_a_runtime_copy_leaves_none_of_the_stacked_copies_behind(tmp_path, copies):
    runtime = small_runtime(tmp_path, "fresh")
    root = copies / "uid-8"
    stack(root, 3, "stale")
    sandbox.slot_runtime(runtime, 8, base=str(copies))
    assert len(mounts_at(root)) == 1 and (root / sandbox.RUNTIME_STAMP).read_text() == "fresh"
    stack(root, 2, "stale")
    assert sandbox.release_runtime(8, base=str(copies))
    assert mounts_at(root) == [] and not root.exists()


def test_sweeping_removes_every_copy_of_a_free_uid_and_none_of_a_held_one(tmp_path, copies):
    from agon.tasks.isolation import UidSlots

    slots = UidSlots(61300, 2, lock_dir=tmp_path / "locks", runs_in_cgroups=False)
    for uid in (61300, 61301):
        stack(copies / f"uid-{uid}", 2, "left")
    with slots.hold(61301) as free:
        assert free
        assert sandbox.sweep_runtimes(slots, range(61300, 61302), base=str(copies)) == 1
    assert mounts_at(copies / "uid-61300") == [] and not (copies / "uid-61300").exists()
    assert len(mounts_at(copies / "uid-61301")) == 2, "a copy a run holds is left to it"
