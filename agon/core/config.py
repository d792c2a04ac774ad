"""Typed schema of every config group: the bottom layer of agon, importing nothing of it.

The YAML files under ``conf/`` hold values; these dataclasses hold types and defaults. ``Config`` types every group
through its field (stored once in Hydra's ConfigStore as ``agon_schema`` by ``register_configs``, which agon's own
entry points call), so an unknown key or a value of the wrong type fails at composition, before any model loads.
A task family's settings are typed by the schema registered for its kind (``TASK_SCHEMAS``). The checks that need
more than a type, and the registries above this module, are ``agon.training.checks``.

Left out on purpose: ``_target_`` instantiation. Every option is a plain value looked up in a registry by name,
which keeps the config printable and the lookup in one place.
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import II, MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value that composes but cannot be run; the message names the full key."""


# ---------------------------------------------------------------------------------------------------------------
# model


@dataclass
class LoraConfig:
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.0
    # "all-linear" or an explicit list of module names
    target_modules: Any = "all-linear"


@dataclass
class TinyWorldConfig:
    """Shape and warm start of the offline Qwen3-architecture model (used when model.name == 'tiny')."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position: int = 256
    warmup_steps: int = 400
    warmup_batch_size: int = 64
    warmup_lr: float = 3e-3
    # cosine decay to zero; false keeps the peak rate (a base stopped mid-learning, as RL then finds it)
    warmup_cosine: bool = False
    warmup_seed: int = 0
    # steps of the learning rate's linear ramp; null: a twentieth of warmup_steps. Fixed, a warm start of N steps is
    # the first N steps of a longer one, so a scan's checkpoint is the base a build of that length makes
    warmup_ramp_steps: Optional[int] = None


@dataclass
class ModelConfig:
    # "tiny" builds the offline world; anything else is a hub name or a local directory for from_pretrained
    name: str = "tiny"
    # the model family (agon/families/<family>.py): loading, chat format, logits, engines that serve it
    family: str = "qwen3"
    # the family's published shape this config stands for (agon.bench.model_shape builds it offline); null: none
    shape: Optional[str] = None
    # a local directory holding the weights; wins over the hub name when set
    path: Optional[str] = None
    # float32 | bfloat16 | float16
    dtype: str = "float32"
    # auto (cuda when available, else cpu) | cpu | cuda | cuda:N
    device: str = "auto"
    gradient_checkpointing: bool = False
    # passed to the chat template (Qwen3's thinking switch)
    enable_thinking: bool = True
    # the model card's sampling settings; trainer and eval read them by interpolation
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    lora: LoraConfig = field(default_factory=LoraConfig)
    tiny: TinyWorldConfig = field(default_factory=TinyWorldConfig)


# ---------------------------------------------------------------------------------------------------------------
# task (one schema per task family; the YAML option picks it with its defaults list)


@dataclass
class TaskConfig:
    # registry key of the task family
    kind: str = MISSING
    # human-readable name (for reasoning_gym: the dataset name)
    name: str = MISSING
    # size of the fixed held-out split
    heldout_size: int = 300
    # seed of the held-out split (fixed across runs so every run is scored on the same problems)
    split_seed: int = 1234
    # optional system message
    system_prompt: Optional[str] = None
    # appended to every problem statement in the user message
    instruction: str = ""
    # the challenger's user message under exchange=visible; {problem} and {recap} are filled in
    challenge_template: str = "{problem}\n\nA rival's recap of its attempt (final answer removed):\n{recap}"


@dataclass
class ArithmeticTaskConfig(TaskConfig):
    kind: str = "arithmetic"
    name: str = "arithmetic"
    # compact, as the tiny model reads it (the same as conf/task/arithmetic.yaml, so the offline world built for
    # another task is the cached default one)
    challenge_template: str = "{problem}|{recap}"
    min_terms: int = 3
    max_terms: int = 5
    # operands are drawn from [1, max_operand]
    max_operand: int = 9
    # number of distinct training problems drawn per epoch
    train_size: int = 100_000
    # chain lengths the offline base is warm-started on, when they differ from the task's (the hard split: a base
    # that learned short chains, trained and scored on longer ones); null: min_terms / max_terms
    warm_start_min_terms: Optional[int] = None
    warm_start_max_terms: Optional[int] = None


@dataclass
class TargetSumTaskConfig(TaskConfig):
    kind: str = "target_sum"
    name: str = "target_sum"
    # compact, as the tiny model reads it
    challenge_template: str = "{problem}|{recap}"
    # fewest and most operands per problem (a worked 4-operand search is up to 14 steps)
    min_terms: int = 3
    max_terms: int = 4
    # operands are drawn from [1, max_operand]
    max_operand: int = 9
    train_size: int = 100_000
    # share of the warm start's challenges whose rival recap is wrong: dead ends (refuted by the leaf test, then
    # searched) and extendable ones (finished with the sign the leaf test picks); conf/task/target_sum.yaml says why
    warm_start_wrong_recaps: float = 0.3
    # share of the right-recap challenges answered by reusing the recap (the leaf test of the last gap), the rest by
    # a search from scratch
    warm_start_reuse: float = 1.0
    # share of the warm start's rows that are challenges (a rival's recap to answer), the rest plain problems
    # answered by the search from scratch
    warm_start_challenges: float = 0.5


@dataclass
class ReasoningGymTaskConfig(TaskConfig):
    kind: str = "reasoning_gym"
    name: str = "basic_arithmetic"
    # passed to reasoning_gym.create_dataset as keyword arguments
    dataset_args: dict = field(default_factory=dict)
    train_size: int = 10_000
    # per-dataset keyword arguments used only when `name` matches a key; dataset_args overrides them
    dataset_defaults: dict = field(default_factory=dict)
    # what the offline base (model=tiny) is warm-started on: "own" (this dataset's training items) or "arithmetic"
    # (the built-in arithmetic world)
    warm_start: str = "own"


@dataclass
class DeepMathTaskConfig(TaskConfig):
    kind: str = "deepmath"
    name: str = "deepmath_hard"
    # hub dataset id, or a local parquet/jsonl file or directory
    source: str = "zwhe99/DeepMath-103K"
    min_difficulty: float = 8.0
    verify_timeout_s: float = 10.0
    verify_workers: int = 2


@dataclass
class SandboxConfig:
    # run model-written programs even where they cannot be isolated (per-process limits only): never on a shared
    # machine; the default refuses to start instead (agon/tasks/sandbox.py)
    allow_unsafe: bool = False


@dataclass
class CodeContestsTaskConfig(TaskConfig):
    kind: str = "codecontests"
    name: str = "codecontests"
    source: str = "deepmind/code_contests"
    split: str = "train"
    max_cf_rating: int = 1200
    max_generated_tests: int = 20
    time_limit_s: float = 4.0
    memory_mb: int = 512
    # stdout's cap at the least (a test's is the larger of this and 4x its expected output)
    max_output_bytes: int = 1_048_576
    # where the statement states no tolerance: a non-integer answer passes within |actual - expected| <=
    # float_tolerance (absolute); integers and words must match exactly. A stated one is graded as testlib's rcmp
    float_tolerance: float = 1e-6
    workers: int = 2
    # the "easy" filter: cf_rating in (0, max_cf_rating] or difficulty in easy_difficulties (1 EASY, 7 A)
    easy_only: bool = True
    easy_difficulties: list = field(default_factory=lambda: [1, 7])
    # keep only problems with a Python 3 reference solution
    require_python_solution: bool = True
    # per-test CPU limit: min(time_limit_s, time_limit_factor * the problem's own limit)
    time_limit_factor: float = 2.0
    # take the held-out problems from this split (e.g. "valid", "test"); null: a seeded split of `split`
    heldout_split: Optional[str] = None
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)


# ---------------------------------------------------------------------------------------------------------------
# the ablation axes


@dataclass
class MethodConfig:
    # a name registered in agon.core.methods: agon | grpo | self_refine | moa
    name: str = "agon"
    # False skips training (evaluate the untrained adapters); a method that never trains ignores it
    train: bool = True


@dataclass
class RewardConfig:
    # registry key: competitive | cooperative | paper
    name: str = "competitive"
    correct_weight: float = 1.0
    conversion_bonus: float = 1.0
    length_tiebreak: float = 0.0
    team_weight: float = 0.0
    format_weight: float = 0.0
    # a reward mode's own settings beyond these weights (a mode registered outside agon reads them; docs/extending.md)
    params: dict = field(default_factory=dict)


@dataclass
class ExchangeConfig:
    # visible: the challenger reads the drafter's recap; hidden: the plain prompt only; latent: the plain prompt after
    # the drafter's key/value states of `span` (agon.models.latent)
    mode: str = "visible"
    # latent only: recap (the recap's tokens) | trace (the drafter's prompt and reasoning through </think>)
    span: str = "recap"


def exchange_name(mode: str, span: str) -> str:
    """The exchange axis as tables and figures name a cell: the mode, with the span under ``latent``
    (``latent:recap``, ``latent:trace``); ``summary.json``'s ``exchange``."""
    return f"{mode}:{span}" if mode == "latent" else mode


@dataclass
class RotationConfig:
    # alternate: A drafts on even steps, B on odd; fixed: A always drafts
    mode: str = "alternate"


@dataclass
class InitConfig:
    # divergent: B's lora_B gets a seeded Gaussian perturbation; symmetric: both zero-init; split (not the paper's):
    # each adapter first trained on worked solutions of its own half of the training pool
    mode: str = "divergent"
    std: float = 0.02
    seed: int = 0
    # split only: supervised steps per adapter, their learning rate and problems per step
    steps: int = 0
    lr: float = 1e-3
    batch_size: int = 32


# ---------------------------------------------------------------------------------------------------------------
# trainer, eval, logger


@dataclass
class TrainerConfig:
    max_steps: int = 60
    learning_rate: float = 5e-4
    weight_decay: float = 0.0
    # completions per problem per role (the GRPO group)
    num_generations: int = 8
    # problems per step
    prompts_per_step: int = 16
    # at most this many sequences per forward/backward pass; null: only scoring_batch_tokens bounds it
    micro_batch_size: Optional[int] = None
    # most tokens in one forward/backward pass: rows x (widest prompt + widest completion) of the micro-batch
    scoring_batch_tokens: int = 65_536
    # most tokens in one generate call: rows x (widest prompt + max_new_tokens), the KV cache it holds
    generation_batch_tokens: int = 262_144
    # rows at least this long (prompt + completion) get a micro-batch of their own: no padding, no attention mask,
    # so SDPA can take its causal flash path
    solo_row_tokens: int = 8192
    # tokens whose logits (vocabulary wide, float32) are held at once when scoring
    logit_chunk_tokens: int = 512
    # refuse, before anything loads, a run on a GPU whose update's estimated peak does not fit beside vLLM's share
    check_memory: bool = True
    max_new_tokens: int = 72
    temperature: float = II("model.temperature")
    top_p: float = II("model.top_p")
    top_k: int = II("model.top_k")
    # grpo | dr_grpo | dapo, TRL's meanings
    loss_type: str = "dapo"
    # group | batch | none, TRL's meanings
    scale_rewards: str = "group"
    # the denominator guard of the advantage (TRL: 1e-4)
    adv_eps: float = 1e-4
    epsilon: float = 0.2
    # null means epsilon (symmetric clipping)
    epsilon_high: Optional[float] = None
    # KL coefficient to the base model (adapters disabled); 0 skips the reference pass
    beta: float = 0.0
    # multiply the KL term by the importance ratio (TRL's use_bias_correction_kl, default True)
    use_bias_correction_kl: bool = True
    # optimisation passes over each generated batch
    num_iterations: int = 1
    max_grad_norm: float = 1.0
    # save a checkpoint every N steps (0: only at the end) ...
    checkpoint_every: int = 0
    # ... and whenever this many minutes passed since the last one (0: never for that reason)
    checkpoint_minutes: float = 5.0
    keep_checkpoints: int = 2
    # auto: continue from <output_dir>/checkpoints/latest when there is one, and skip a run whose summary.json is
    # complete; never: always start afresh
    resume: str = "auto"
    # bad (non-finite) steps tolerated in a row before the run aborts
    max_bad_steps: int = 3
    # the sampler-trainer mismatch correction when the engine gives log-probs (vLLM), TRL's names; token-level
    # truncation with a cap of 2 by default rather than TRL's sequence_mask (docs/generation.md)
    vllm_importance_sampling_correction: bool = True
    # token_truncate | token_mask | sequence_truncate | sequence_mask
    vllm_importance_sampling_mode: str = "token_truncate"
    vllm_importance_sampling_clip_max: Optional[float] = 2.0
    vllm_importance_sampling_clip_min: Optional[float] = None
    # say the run is not learning after this many steps in a row of ...
    warn_after_steps: int = 3
    # ... at least this share of zero-spread groups in every role, or ...
    warn_zero_std_ratio: float = 0.9
    # ... at least this share of completions cut at max_new_tokens in a role, or a mean sampler importance weight
    # below this in a role (the engine's and the trainer's distributions apart: the update shrinks toward 0)
    warn_truncated_ratio: float = 0.9
    warn_importance_ratio: float = 0.5
    # seconds a process waits at a collective for the others before the run fails (HF's ddp_timeout): longer than
    # the slowest rank's share of an evaluation
    ddp_timeout: int = 10_800


@dataclass
class EvalConfig:
    # held-out problems scored (capped by task.heldout_size)
    n_problems: int = 200
    # samples per problem (pass@1 is their mean)
    samples: int = 4
    # steps between evaluations during training (0: only before and after)
    every: int = 0
    # the evaluations during training (every `every` steps) score the first interim_problems of the held-out
    # problems with interim_samples each; null: n_problems and samples (the start and the end always use those)
    interim_problems: Optional[int] = None
    interim_samples: Optional[int] = None
    max_new_tokens: int = II("trainer.max_new_tokens")
    temperature: float = II("trainer.temperature")
    top_p: float = II("trainer.top_p")
    top_k: int = II("trainer.top_k")
    # most tokens in one generate call (rows x (prompt + max_new_tokens))
    generation_batch_tokens: int = II("trainer.generation_batch_tokens")
    # problems per chunk: each is sampled from its own seed and committed as it finishes (a killed evaluation resumes)
    chunk_problems: int = 64
    # evaluate before training (eval/accuracy_at_start)
    at_start: bool = True
    # also score every drafter's self-cascade and cross cascades on its drafts (methods.Evaluation.reads), so that
    # arms are compared at equal generations per answer (eval/accuracy_two_generations); one answer per row each
    equal_generations: bool = True
    # at every evaluation also the cross-play matrix and the recap diagnostic (agon.game.diagnostic.diagnose; one
    # process)
    diagnostic: bool = False
    # samples per problem in the diagnostic (it plays 3 drafts and 30 answers per sample)
    diagnostic_samples: int = 1


@dataclass
class VLLMConfig:
    # auto (in this process when vLLM imports here, else the worker) | inprocess | worker
    placement: str = "auto"
    # the worker's interpreter; null: $AGON_VLLM_PYTHON, else .venv-vllm/bin/python (make vllm-install)
    python: Optional[str] = None
    # share of the GPU's memory vLLM takes for its weights and KV cache
    gpu_memory_utilization: float = 0.3
    # KV cache on a CPU machine, GiB (VLLM_CPU_KVCACHE_SPACE)
    cpu_kv_cache_gib: int = 1
    # longest prompt plus completion; null: the model's context
    max_model_len: Optional[int] = None
    max_num_seqs: int = 256
    # no CUDA graphs; null: true on CPU, false on GPU
    enforce_eager: Optional[bool] = None
    start_timeout_s: float = 900.0
    # each request sampled from its own seed (reproducible rows whatever shares a batch; vLLM then draws each seeded
    # row's noise in a kernel of its own per decoding step); false: the engine's one stream
    request_seeds: bool = True


@dataclass
class GenerationConfig:
    # hf | hf_continuous | vllm
    engine: str = "hf"
    # the engine used when `engine` is vllm and vLLM is not installed; null: fail before the model loads
    fallback: Optional[str] = None
    # run an engine the config check finds far slower than the run was sized for (the fallback at a long budget,
    # continuous batching on CUDA without flash attention, a family's missing kernels) instead of refusing it
    allow_slow: bool = False
    # an engine that batches continuously (vLLM) submits each challenge as its draft finishes, and an evaluation
    # plays all of its rounds in one call; false: stage by stage, as the hf engines always play
    stream: bool = True
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class LoggerConfig:
    # none | wandb
    name: str = "none"
    project: str = "agon"
    entity: Optional[str] = None
    # online | offline | disabled; null decides from the environment
    mode: Optional[str] = None
    # W&B group; null means the sweep or experiment name
    group: Optional[str] = None
    tags: list = field(default_factory=list)
    # rollouts logged as a table at each evaluation
    table_rows: int = 16
    # the final adapters uploaded as a W&B model artifact (logger=wandb)
    artifacts: bool = True


@dataclass
class TuneConfig:
    """Set by the Optuna sweeper (agon.training.tune) on each trial's cell, so that it reports its evaluations; null
    otherwise."""

    storage: Optional[str] = None
    study: Optional[str] = None
    trial: Optional[int] = None


@dataclass
class Config:
    model: ModelConfig = MISSING
    task: Any = MISSING
    method: MethodConfig = MISSING
    reward: RewardConfig = MISSING
    exchange: ExchangeConfig = MISSING
    rotation: RotationConfig = MISSING
    init: InitConfig = MISSING
    trainer: TrainerConfig = MISSING
    eval: EvalConfig = MISSING
    logger: LoggerConfig = MISSING
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    experiment: Optional[str] = None
    seed: int = 0
    # where run files go; Hydra's runtime.output_dir when null
    output_dir: Optional[str] = None
    # show a progress bar
    progress: bool = True
    # modules imported before the config is checked, registering tasks, rewards, methods or model families of a
    # package outside agon (the ``agon.plugins`` entry points are imported too); docs/extending.md
    plugins: list = field(default_factory=list)


# task.kind -> the schema of that family's settings. The task group has no schema of its own at composition (one
# node cannot take the fields of every family): ``typed`` merges the composed task into its kind's schema, filling
# defaults and checking keys and types. A task module outside agon adds its own (``agon.tasks.register_task``).
TASK_SCHEMAS: dict[str, type] = {
    "arithmetic": ArithmeticTaskConfig,
    "target_sum": TargetSumTaskConfig,
    "reasoning_gym": ReasoningGymTaskConfig,
    "deepmath": DeepMathTaskConfig,
    "codecontests": CodeContestsTaskConfig,
}


def register_task_schema(kind: str, schema: type) -> None:
    """``schema`` (a dataclass extending ``TaskConfig``) types ``task.*`` when ``task.kind`` is ``kind``."""
    if not (isinstance(schema, type) and issubclass(schema, TaskConfig)):
        raise TypeError(f"the schema of task kind {kind!r} must be a dataclass extending agon.core.config.TaskConfig")
    TASK_SCHEMAS[kind] = schema


def safe_dirname(name: str, limit: int = 160) -> str:
    """A directory name from Hydra's override string, cut to ``limit`` characters with a short hash of the whole
    when longer, so a cell with many overrides never hits the file system's 255-byte name limit."""
    if len(name) <= limit:
        return name
    import hashlib

    return f"{name[: limit - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


# seconds since the epoch at launch, shared by every process of a multi-process run (agon.run sets it from rank 0)
LAUNCH_TIME_ENV = "AGON_LAUNCH_TIME"
_PROCESS_START = time.time()


def launch_time(pattern: str) -> str:
    """The launch time formatted with ``pattern`` (``strftime``): ``AGON_LAUNCH_TIME`` when set, else when this
    process started. Hydra's output directories use it, so the ranks of one launch share theirs."""
    stamp = float(os.environ.get(LAUNCH_TIME_ENV) or _PROCESS_START)
    return datetime.datetime.fromtimestamp(stamp).strftime(pattern)


def register_configs() -> None:
    """Store agon's root schema (``agon_schema``: every group typed through its field of ``Config``) and its
    resolvers. Called by agon's own entry points, never on import: Hydra imports every plugin of the environment in
    every app, and agon's nodes must not show up in another app's config store."""
    if not OmegaConf.has_resolver("safe_dirname"):
        OmegaConf.register_new_resolver("safe_dirname", safe_dirname)
    if not OmegaConf.has_resolver("launch_time"):
        # cached like Hydra's own `now`: the value travels with the config to launcher jobs in other processes
        OmegaConf.register_new_resolver("launch_time", launch_time, use_cache=True)
    ConfigStore.instance().store(name="agon_schema", node=Config)


def shipped(name: str, packaged: str) -> Path:
    """A folder shipped with agon: ``<checkout>/<name>`` in a checkout (an editable install included), else the
    copy a wheel installs inside the package, ``agon/<packaged>`` (pyproject.toml's ``package-dir``)."""
    here = Path(__file__).resolve().parents[1]  # the agon package
    return here.parent / name if (here.parent / name).is_dir() and (here.parent / "pyproject.toml").is_file() \
        else here / packaged


# the config tree, the sweep files
CONF_DIR = shipped("conf", "conf")
SWEEPS_DIR = shipped("sweeps", "sweeps")


def did_you_mean(name: str, choices: Any) -> str:
    """`` (did you mean X?)`` for the closest of ``choices`` to ``name``, else an empty string."""
    import difflib

    close = difflib.get_close_matches(name, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


# ---------------------------------------------------------------------------------------------------------------
# cross-field checks


EXCHANGES = ("visible", "hidden", "latent")
ROTATIONS = ("alternate", "fixed")
WARM_STARTS = ("own", "arithmetic")
INITS = ("divergent", "symmetric", "split")
SCALE_REWARDS = ("group", "batch", "none")
DTYPES = ("float32", "bfloat16", "float16")
PLACEMENTS = ("auto", "inprocess", "worker")
# true and false: what older configs and commands say (true resumed when it could: auto)
RESUMES = ("auto", "never", "true", "false")


def resume_mode(value: Any) -> str:
    """``trainer.resume`` as auto or never."""
    return "never" if str(value).lower() in ("never", "false") else "auto"


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain containers (for summary.json and W&B)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]

