"""The composed config: every group option and every sweep cell composes and validates; mistakes fail before any
model loads."""

from __future__ import annotations

import copy
import functools
import itertools
import re
from pathlib import Path
from typing import Callable, Sequence

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from agon.training.checks import validate
from agon.core.config import ConfigError
from tests.conftest import CONF, compose_config

GROUPS = ["model", "task", "method", "reward", "exchange", "rotation", "init", "trainer", "eval", "logger", "debug",
          "experiment"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes_and_validates(group, option):
    cfg = compose_config([f"{group}={option}"])
    validate(cfg)


def test_defaults_are_agon_competitive_visible_alternate_divergent():
    cfg = compose_config()
    assert (cfg.method.name, cfg.reward.name, cfg.exchange.mode, cfg.rotation.mode, cfg.init.mode) == (
        "agon", "competitive", "visible", "alternate", "divergent")
    assert cfg.model.name == "tiny" and cfg.task.kind == "arithmetic"


def test_sampling_settings_follow_the_model():
    cfg = compose_config(["model=qwen3_0.6b"])
    assert (cfg.trainer.temperature, cfg.eval.temperature, cfg.trainer.top_k) == (0.6, 0.6, 20)


def test_unknown_key_names_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["trainer.lerning_rate=1e-3"])
    assert "lerning_rate" in str(err.value.__cause__ or err.value)


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["trainer.max_steps=many"])
    cause = err.value.__cause__
    assert isinstance(cause, (ValidationError, ConfigKeyError)) and "trainer.max_steps" in str(cause)


@pytest.mark.parametrize("overrides,key", [
    (["trainer.num_generations=1"], "trainer.num_generations"),
    (["trainer.micro_batch_size=0"], "trainer.micro_batch_size"),
    (["trainer.generation_batch_tokens=64"], "trainer.generation_batch_tokens"),
    (["eval.generation_batch_tokens=64"], "eval.generation_batch_tokens"),
    (["trainer.loss_type=ppo"], "trainer.loss_type"),
    (["trainer.scale_rewards=sometimes"], "trainer.scale_rewards"),
    (["reward.name=adversarial"], "reward.name"),
    (["exchange.mode=shouted"], "exchange.mode"),
    (["trainer.temperature=0"], "trainer.temperature"),
    (["eval.samples=0"], "eval.samples"),
    (["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints"),
    (["task.challenge_template=no recap here"], "task.challenge_template"),
])
def test_cross_field_mistakes_name_the_full_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose_config(overrides))


def test_bad_config_fails_before_any_model_loads(tmp_path, monkeypatch):
    """run() rejects the config before it touches the model cache (a load would build the world there)."""
    from agon.run import run

    monkeypatch.setenv("AGON_CACHE", str(tmp_path / "cache"))
    cfg = compose_config(["trainer.num_generations=1", "logger=none"])
    cfg.output_dir = str(tmp_path / "run")
    with pytest.raises(ConfigError, match="trainer.num_generations"):
        run(cfg)
    assert not (tmp_path / "cache").exists()
    assert not Path(cfg.output_dir).exists()


# ---------------------------------------------------------------------------------------------------------------
# sweeps: every cell of every grid composes, validates and holds what its overrides name

SWEEPS = CONF.parent / "sweeps"
# the README's command: python -m agon.run -m reward=competitive,cooperative exchange=visible,hidden
CLI_GRID = {"reward": "competitive,cooperative", "exchange": "visible,hidden"}
TWO_BY_TWO = {(r, e) for r in ("competitive", "cooperative") for e in ("visible", "hidden")}


def _compose_sweep(config_dir: Path, name: str, overrides: Sequence[str] = (), hydra: bool = False) -> DictConfig:
    """A sweep file as ``--config-dir <dir> --config-name <name>`` composes it, conf/ on the search path."""
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose(config_name=name, overrides=[f"hydra.searchpath=[file://{CONF}]", *overrides],
                       return_hydra_config=hydra)


def _cells(params: dict) -> list[list[str]]:
    """The cells of a sweep, expanded as Hydra's basic sweeper does: the product of each key's values."""
    axes = []
    for o in OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()]):
        values = o.sweep_string_iterator() if o.is_sweep_override() else [o.get_value_element_as_str()]
        axes.append([f"{o.get_key_element()}={v}" for v in values])
    return [list(cell) for cell in itertools.product(*axes)]


def _leaves(spec: dict, prefix: str = "") -> list[tuple[str, object]]:
    return [leaf for k, v in spec.items()
            for leaf in (_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)])]


def _option_file(group: str, option: str) -> Path:
    """conf/<group>/<option>.yaml, or a sweep's own group option (sweeps/cell/<option>.yaml)."""
    local = SWEEPS / group / f"{option}.yaml"
    return local if local.exists() else CONF / group / f"{option}.yaml"


def _is_group(key: str) -> bool:
    return (CONF / key).is_dir() or (SWEEPS / key).is_dir()


def _is_global(group: str) -> bool:
    """An experiment-like option (``@package _global_``: conf/experiment, sweeps/cell)."""
    return group == "experiment" or (SWEEPS / group).is_dir()


def _spec(group: str, option: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(_option_file(group, option)))


def _group_overrides(spec: dict) -> dict[str, str]:
    """The ``override /<group>: <option>`` entries of a config's defaults list."""
    return {k.split("/", 1)[1]: v for entry in spec.get("defaults", []) if isinstance(entry, dict)
            for k, v in entry.items()}


def _assert_option(cfg: DictConfig, group: str, option: str, chosen: Sequence[str] = (),
                   shadowed: Sequence[str] = (), outer: Sequence[str] = ()) -> None:
    """``cfg`` holds what <group>/<option>.yaml sets (an experiment: its keys and its group overrides, except
    groups the cell chooses itself and keys the experiment sets over its groups' values). ``outer``: dotted keys
    the cell's experiment-like options set over any group's values."""
    spec = _spec(group, option)
    own = [key for key, _ in _leaves({k: v for k, v in spec.items() if k != "defaults"})]
    for sub, value in _group_overrides(spec).items():
        if sub not in chosen:
            _assert_option(cfg, sub, value, shadowed=[k[len(sub) + 1:] for k in [*own, *outer]
                                                      if k.startswith(sub + ".")])
    spec.pop("defaults", None)
    node = cfg if _is_global(group) else cfg[group]  # experiments are @package _global_
    for key, value in _leaves(spec):
        if key not in shadowed:
            assert OmegaConf.select(node, key) == value, (group, option, key)


def _assert_cell(cfg: DictConfig, cell: Sequence[str], name: str | None) -> None:
    """Each override of a cell holds in its composed config. Precedence, as Hydra composes it: the cell's group
    overrides, then a sweep's own cell option (sweeps/cell/) over conf/experiment's group overrides; an
    experiment-like option's keys over every group's values."""
    pairs = [o.split("=", 1) for o in cell]
    outer = [k for key, value in pairs if _is_group(key) and _is_global(key)
             for k, _ in _leaves({a: b for a, b in _spec(key, value).items() if a != "defaults"})]
    local_choices = [sub for key, value in pairs if (SWEEPS / key).is_dir()
                     for sub in _group_overrides(_spec(key, value))]
    for key, value in pairs:
        if _is_group(key):
            chosen = [k for k, _ in pairs if k != key] + ([] if (SWEEPS / key).is_dir() else local_choices)
            # a plain key of the cell wins over an experiment-like option's value for it (the sweeps' fallback)
            plain = [k for k, _ in pairs if not _is_group(k)]
            shadowed = plain if _is_global(key) else [k[len(key) + 1:] for k in outer if k.startswith(key + ".")]
            _assert_option(cfg, key, value, chosen=chosen, shadowed=shadowed, outer=outer)
        else:
            assert str(OmegaConf.select(cfg, key)) == value, (name, key, value)


@functools.cache
def _composed(name: str | None, cell: tuple[str, ...]) -> DictConfig:
    """A cell of the sweep file ``name`` (None: a command line) composed once per session: several tests read
    every cell of every grid, and composing them all takes tens of seconds. Read-only; ``_grid`` hands out copies."""
    return compose_config(list(cell)) if name is None else _compose_sweep(SWEEPS, name, cell)


def _grid(name: str | None) -> tuple[list[list[str]], Callable[[list[str]], DictConfig]]:
    """(cells, compose) of the sweep file ``name`` (None: the README's 2x2 command); compose gives a fresh copy."""
    if name is None:
        cells = _cells(CLI_GRID)
    else:
        cells = _cells(dict(_compose_sweep(SWEEPS, name, hydra=True).hydra.sweeper.params))
    return cells, lambda cell: copy.deepcopy(_composed(name, tuple(cell)))


# experiments that only the results sweeps use: the 2x2's other cells as named experiments, and the other tasks
RESULTS_ONLY = {"cooperative", "hidden", "cooperative_hidden", "hard_split", "products", "target_sum"}

# the exchange axis's cells (sweeps/exchange_cell/): the mode, and the span under latent
EXCHANGE_CELLS = {("visible", None), ("hidden", None), ("latent", "recap"), ("latent", "trace")}

# grids: the sweep files the basic sweeper expands (Optuna studies sample instead: tests/test_tune.py)
GRIDS = sorted(p.stem for p in SWEEPS.glob("*.yaml") if "hydra/sweeper: optuna" not in p.read_text())


@pytest.mark.parametrize("name", [None, *GRIDS], ids=lambda n: n or "cli")
def test_every_cell_of_every_grid_composes(name):
    """The README's 2x2 command and each sweep file: each cell composes through Hydra, validates, and resolves to
    the options its overrides name (a group option's YAML values, an experiment's keys and group overrides)."""
    cells, compose_cell = _grid(name)
    composed = []
    for cell in cells:
        cfg = compose_cell(cell)
        validate(cfg)
        _assert_cell(cfg, cell, name)
        chosen = dict(o.split("=", 1) for o in cell)
        if "reward" in chosen:
            # the reward's weights, from conf/reward/<name>.yaml read here without Hydra, under those the cell's
            # preset sets itself (the paper's weights: the preset's recipe survives the axis)
            weights = OmegaConf.load(CONF / "reward" / f"{chosen['reward']}.yaml")
            preset = _preset_body(chosen["experiment"]) if "experiment" in chosen else {}
            weights.merge_with({k.split(".", 1)[1]: v for k, v in preset.items() if k.startswith("reward.")})
            assert cfg.reward.name == chosen["reward"] == weights.name
            for key in ("correct_weight", "conversion_bonus", "length_tiebreak", "team_weight", "format_weight"):
                assert cfg.reward[key] == weights[key], (name, cell, key)
        if "exchange" in chosen:
            assert cfg.exchange.mode == chosen["exchange"]
        composed.append(cfg)
    # no two cells compose to the same config (an override that did not apply would make two equal)
    assert len({OmegaConf.to_yaml(c) for c in composed}) == len(cells) > 0, name
    axes = {(c.reward.name, c.exchange.mode) for c in composed}
    if name in (None, "grid_2x2"):
        assert axes == TWO_BY_TWO and len(composed) == 4
    elif name == "grid_2x2_seeds":
        assert {(c.reward.name, c.exchange.mode, c.seed) for c in composed} == {
            (r, e, s) for r, e in TWO_BY_TWO for s in (0, 1, 2)}
    elif name == "ablations":  # Agon beside every ablation and baseline of the offline world
        offline = [o for o in _options("experiment") if not o.startswith("paper") and o not in RESULTS_ONLY]
        assert sorted(c.experiment for c in composed) == offline
    elif name == "results_exchange":  # docs/results.md's exchange axis: the hard split's settings, three seeds
        assert {(c.exchange.mode, c.exchange.span if c.exchange.mode == "latent" else None, c.seed)
                for c in composed} == {(m, s, seed) for m, s in EXCHANGE_CELLS for seed in (0, 1, 2)}
        assert {(c.method.name, c.reward.name, c.generation.engine) for c in composed} == {
            ("agon", "competitive", "hf")}
        assert {(c.task.name, c.trainer.max_new_tokens, c.trainer.max_steps, c.trainer.learning_rate,
                 c.eval.n_problems, c.eval.samples, c.eval.every) for c in composed} == {
            ("arithmetic_hard", 96, 60, 5e-4, 300, 4, 30)}
        assert all(c.eval.diagnostic for c in composed)
    elif name.startswith("results_"):  # docs/results.md: the 2x2, the ablations and baselines, per task
        cells = {(c.method.name, c.reward.name, c.exchange.mode, c.rotation.mode, c.init.mode,
                  c.trainer.num_generations) for c in composed}
        task, n_cells, seeds, steps, samples = {
            "results_arithmetic_hard": (("arithmetic_hard", 96), 10, 3, 60, 4),
            "results_products": (("products", 72), 10, 3, 60, 4),
            # the testbed's study (issue 41): Agon, cooperative and GRPO, three seeds, to the pick run's plateau
            "results_target_sum": (("target_sum", 160), 3, 3, 200, 16)}[name]
        assert len(cells) == n_cells and len(composed) == n_cells * seeds
        assert {c.seed for c in composed} == set(range(seeds))
        agon_cells = {(c.reward.name, c.exchange.mode) for c in composed if c.method.name == "agon"}
        rate = 5e-4
        if name == "results_target_sum":
            assert agon_cells == {("competitive", "visible"), ("cooperative", "visible")}
            assert {c.method.name for c in composed} == {"agon", "grpo"}
            # the cells load the base experiment=target_sum ships: every key that shapes the world is the preset's
            preset = compose_config(["experiment=target_sum"])
            for c in composed:
                assert OmegaConf.to_container(c.task) == OmegaConf.to_container(preset.task)
                assert OmegaConf.to_container(c.model.tiny) == OmegaConf.to_container(preset.model.tiny)
            rate = 1e-3
        else:
            assert agon_cells == TWO_BY_TWO
        # one set of hyperparameters: only what a cell is changes between cells
        assert {(c.task.name, c.trainer.max_new_tokens, c.trainer.max_steps, c.trainer.learning_rate,
                 c.eval.n_problems, c.eval.samples) for c in composed} == {(*task, steps, rate, 300, samples)}
        assert all(c.eval.diagnostic for c in composed)
        if name != "results_target_sum":
            assert {c.model.tiny.warmup_steps for c in composed} == {700 if name == "results_products" else 400}
    elif name == "paper_deepmath_2x2":  # the same grid on the real-model recipe
        assert axes == TWO_BY_TWO and {(c.experiment, c.model.name) for c in composed} == {
            ("paper_deepmath", "Qwen/Qwen3-0.6B")}
    elif name == "paper_scaling":  # the paper's claim: Agon on the family's smallest model, GRPO on a larger one
        assert {(c.experiment, c.model.family) for c in composed} == {("paper_deepmath", "qwen3")}
        assert {(c.method.name, c.model.name) for c in composed} == {("agon", SMALLEST["qwen3"]),
                                                                     ("grpo", "Qwen/Qwen3-4B")}
    elif name == "families_grid":  # both methods on every size of every family, the paper's recipe in each
        models = {OmegaConf.load(CONF / "model" / f"{m}.yaml").name for m in FAMILY_MODELS}
        assert {(c.method.name, c.model.name) for c in composed} == {(m, n) for m in ("agon", "grpo") for n in models}
        assert {c.experiment for c in composed} == {"paper_deepmath"}
        assert {c.model.family for c in composed} == {"qwen3", "qwen3_5", "gemma4"}
        assert all(c.model.lora.rank == 16 and c.trainer.max_new_tokens == 16384 for c in composed)
    elif name == "grid_exchange":  # the exchange axis under the competitive reward, both latent spans included
        assert {(c.reward.name, c.exchange.mode, c.exchange.span if c.exchange.mode == "latent" else None)
                for c in composed} == {("competitive", m, s) for m, s in EXCHANGE_CELLS}
        assert {c.generation.engine for c in composed} == {"hf"}
    else:
        raise AssertionError(f"sweeps/{name}.yaml has no check here")


# the grid's models: every family's sizes (Qwen3 up to 1.7B)
FAMILY_MODELS = ["qwen3_0.6b", "qwen3_1.7b", "qwen3_5_0.8b", "qwen3_5_2b", "gemma4_e2b", "gemma4_e4b"]


def _smallest() -> dict[str, str]:
    """Each family's smallest hub model in conf/model/ (by its parameter count, E2B before E4B for Gemma)."""
    import re

    models: dict[str, list[tuple[float, str]]] = {}
    for option in _options("model"):
        spec = OmegaConf.load(CONF / "model" / f"{option}.yaml")
        if spec.shape:
            size = float(re.sub(r"[^\d.]", "", str(spec.shape)))
            models.setdefault(spec.family, []).append((size, spec.name))
    return {family: min(sizes)[1] for family, sizes in models.items()}


SMALLEST = _smallest()


@pytest.mark.parametrize("family,cells", [
    ("qwen3_5", "cell=agon_qwen3_5_0.8b,grpo_qwen3_5_2b"), ("gemma4", "cell=agon_gemma4_e2b,grpo_gemma4_e4b")])
def test_the_scaling_sweep_runs_on_another_family_by_naming_its_cells(family, cells):
    """The header's override for another family: two cells, Agon on its smallest model, GRPO on a larger one."""
    params = dict(_compose_sweep(SWEEPS, "paper_scaling", hydra=True).hydra.sweeper.params)
    params["cell"] = cells.split("=", 1)[1]  # the command line wins over the sweep's value, as in the sweeper
    composed = []
    for cell in _cells(params):
        cfg = _compose_sweep(SWEEPS, "paper_scaling", cell)
        validate(cfg)
        _assert_cell(cfg, cell, "paper_scaling")
        composed.append(cfg)
    assert {c.model.family for c in composed} == {family} and len(composed) == 2
    agon, grpo = sorted(composed, key=lambda c: c.method.name)
    assert (agon.method.name, grpo.method.name) == ("agon", "grpo")
    assert agon.model.name == SMALLEST[family] != grpo.model.name
    assert agon.experiment == grpo.experiment == "paper_deepmath"


def test_every_scaling_cell_option_is_one_method_on_one_model():
    for path in sorted((SWEEPS / "cell").glob("*.yaml")):
        method, model = path.stem.split("_", 1)
        # with the sweep's fallback: the Qwen3.5 and Gemma 4 cells sample with hf where vLLM is missing or cannot
        cfg = _compose_sweep(SWEEPS, "paper_scaling", ["experiment=paper_deepmath", f"cell={path.stem}",
                                                       "generation.fallback=hf"])
        validate(cfg)
        assert cfg.method.name == method, path.name
        assert cfg.model.name == OmegaConf.load(CONF / "model" / f"{model}.yaml").name, path.name


@pytest.mark.parametrize("name", [g for g in GRIDS if g.startswith("results_")])
def test_a_results_cell_has_one_directory_however_it_is_launched(name):
    """A results sweep names a cell's directory by its overrides alone, not the job number, so a cell run on its own
    (a missing seed, a cell added) and the same cell from the whole sweep resume or skip in one directory."""
    alone = _compose_sweep(SWEEPS, name, ["seed=2", "experiment=hidden"], hydra=True)
    within = _compose_sweep(SWEEPS, name, ["experiment=hidden", "seed=2", "hydra.job.num=7"], hydra=True)
    assert alone.hydra.sweep.subdir == within.hydra.sweep.subdir == "experiment=hidden,seed=2"


def test_a_grid_with_an_unknown_option_fails_to_compose(tmp_path):
    """The grid check composes: a typo in a sweep value fails it, which reading the YAML as text would not."""
    (tmp_path / "typo.yaml").write_text(
        (SWEEPS / "grid_2x2.yaml").read_text().replace("competitive,cooperative", "competitive,coperative"))
    params = _compose_sweep(tmp_path, "typo", hydra=True).hydra.sweeper.params
    cells = _cells(dict(params))
    assert len(cells) == 4
    _compose_sweep(tmp_path, "typo", cells[0])
    with pytest.raises(ConfigCompositionException, match="coperative"):
        _compose_sweep(tmp_path, "typo", next(c for c in cells if "reward=coperative" in c))


@pytest.mark.parametrize("extra,model", [([], "Qwen/Qwen3-0.6B"), (["model=qwen3_1.7b"], "Qwen/Qwen3-1.7B"),
                                         (["model=qwen3_4b"], "Qwen/Qwen3-4B")])
def test_the_paper_deepmath_preset_is_the_papers_recipe_on_any_qwen3(extra, model):
    cfg = compose_config(["experiment=paper_deepmath", *extra])
    validate(cfg)
    assert (cfg.model.name, cfg.task.name, cfg.task.min_difficulty, cfg.task.heldout_size) == \
        (model, "deepmath_hard", 8.0, 300)
    assert (cfg.model.lora.rank, cfg.method.name, cfg.model.enable_thinking) == (16, "agon", True)
    assert dict(cfg.reward) == PAPER_REWARD["competitive"]
    assert (cfg.trainer.temperature, cfg.trainer.top_p, cfg.trainer.top_k) == (0.6, 0.95, 20)
    assert cfg.trainer.max_new_tokens >= 8192 and cfg.eval.max_new_tokens == cfg.trainer.max_new_tokens
    assert cfg.eval.n_problems == 300 and cfg.model.dtype == "bfloat16" and cfg.model.gradient_checkpointing


# the paper's reward (2 c(b) + c(b)(1 - c(a)) + 0.5 format(b)) under each mode of the reward axis: cooperative is its
# twin, the same correctness and format weights with the team term instead of the conversion bonus
PAPER_REWARD = {
    "competitive": dict(name="competitive", correct_weight=2.0, conversion_bonus=1.0, length_tiebreak=0.0,
                        team_weight=0.0, format_weight=0.5, params={}),
    "cooperative": dict(name="cooperative", correct_weight=2.0, conversion_bonus=0.0, length_tiebreak=0.0,
                        team_weight=1.0, format_weight=0.5, params={}),
}
PAPER_PRESETS = ("paper_deepmath", "paper_codecontests")
# where commands are written for users: the front page, the docs, and the comments of presets and sweeps
DOCUMENTED = [CONF.parent / "README.md", *sorted((CONF.parent / "docs").glob("*.md")),
              *sorted(CONF.glob("**/*.yaml")), *sorted(SWEEPS.glob("**/*.yaml"))]


def _documented_paper_commands() -> list[tuple[str, list[str]]]:
    """(where, overrides) of every ``agon.run`` (or ``agon``) command written in the docs, presets and sweeps that
    names a paper preset on its command line (a sweep file run by name is checked through the file itself)."""
    found = []
    for path in DOCUMENTED:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            # `python -m agon.run ...` or the console script `agon ...`
            found_command = re.search(r"(?:agon\.run|(?:^|[\s/])agon)\s(.*)$", line)
            command = found_command.group(1) if found_command else ""
            words = [w for w in command.split("#", 1)[0].replace("`", " ").split() if "=" in w]
            if any(w.startswith("experiment=paper_") for w in words) and "--config-name" not in command:
                found.append((f"{path.name}:{number}", words))
    return found


@functools.cache
def _paper_cells() -> list[tuple[str, list[str], Callable[[list[str]], DictConfig]]]:
    """(where, cell, compose) of every cell of every sweep file and documented command that names a paper preset."""
    out = []
    compose_command = _grid(None)[1]
    for where, words in _documented_paper_commands():
        out += [(where, cell, compose_command) for cell in _cells(dict(w.split("=", 1) for w in words))]
    for name in GRIDS:
        cells, compose_cell = _grid(name)
        out += [(f"sweeps/{name}.yaml", cell, compose_cell) for cell in cells
                if "paper_" in str(compose_cell(cell).experiment)]
    return out


def test_the_paper_commands_are_found():
    """The search below is not vacuous: the README's grid, the preset's own comment and the sweep files are in it."""
    where = {w.split(":")[0] for w, _, _ in _paper_cells()}
    assert {"README.md", "paper_deepmath.yaml", "sweeps/paper_deepmath_2x2.yaml", "sweeps/families_grid.yaml"} <= where


def test_every_paper_cell_runs_the_papers_reward_under_its_own_mode_and_exchange():
    """Each cell of every sweep and documented command on a paper preset: the full reward is the paper's weights
    under the mode the cell names (cooperative: its twin), and the exchange is the cell's, else the preset's. A
    preset that chose a reward option carrying weights (reward=paper) lost them to `reward=competitive`."""
    for where, cell, compose_cell in _paper_cells():
        cfg = compose_cell(cell)
        chosen = dict(o.split("=", 1) for o in cell)
        mode = chosen.get("reward", "competitive")
        assert dict(cfg.reward) == PAPER_REWARD[mode], (where, cell)
        assert cfg.exchange.mode == chosen.get("exchange", "visible"), (where, cell)


AXES = ("reward", "exchange", "rotation", "init", "method", "model")


def _preset_body(name: str) -> dict:
    """The dotted keys an experiment preset sets itself, with those of the presets it extends (theirs first)."""
    spec = _spec("experiment", name)
    body: dict = {}
    for entry in spec.get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            body.update(_preset_body(entry))
    body.update(_leaves({k: v for k, v in spec.items() if k not in ("defaults", "experiment")}))
    return body


@pytest.mark.parametrize("preset", _options("experiment"))
def test_no_axis_option_drops_a_setting_of_a_preset(preset):
    """Whatever option of an ablation axis the command line adds to a preset, every value the preset sets itself
    holds: a preset says its recipe in its own keys, which merge after the axis options."""
    body = _preset_body(preset)
    for axis in AXES:
        for option in _options(axis):
            cfg = compose_config([f"experiment={preset}", f"{axis}={option}"])
            for key, value in body.items():
                assert OmegaConf.select(cfg, key) == value, (preset, f"{axis}={option}", key)


def test_a_cells_full_reward_is_in_its_summary():
    """The summary names the reward's mode and every weight, so a table can tell the paper's reward from the
    offline default's."""
    from agon.core.rewards import reward_summary

    cfg = compose_config(["experiment=paper_deepmath", "reward=cooperative"])
    assert reward_summary(cfg.reward) == PAPER_REWARD["cooperative"]


def test_the_paper_codecontests_preset_runs_qwen3_1_7b_on_easy_problems():
    cfg = compose_config(["experiment=paper_codecontests"])
    validate(cfg)
    assert (cfg.model.name, cfg.task.kind, cfg.task.easy_only, cfg.model.lora.rank) == \
        ("Qwen/Qwen3-1.7B", "codecontests", True, 16)
    assert cfg.trainer.max_new_tokens >= 8192
