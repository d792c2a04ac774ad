"""The offline world: a small Qwen3-architecture model and its tokenizer, built and warm-started locally.

No machine here reaches a model hub, so the default run builds its own base model: ``Qwen3ForCausalLM`` from a
``Qwen3Config``, a character-level tokenizer built with the ``tokenizers`` library (printable ASCII plus Qwen3's
special tokens and a compact chat template), warm-started by supervised training on worked solutions until it is
imperfect but competent, then saved with ``save_pretrained``. The worked solutions come from the task
(``Task.worked_solution``): the built-in arithmetic by default, whatever task the run has (its chain lengths may
differ: ``task.warm_start_{min,max}_terms``, the hard split), or a reasoning-gym dataset's own training items
(``task=reasoning_gym``, ``task.warm_start=own``), so any such dataset is a run that can learn offline. Runs load
it back through the same ``from_pretrained`` path a hub model takes.

The warm start also trains the challenge format (problem, separator, a rival's recap), with recaps that are sometimes
wrong, so the challenger's prompt is in distribution from step 0 and trusting a recap blindly is not free.

The worlds listed in ``bases/worlds.yaml`` (the default world, the test world, products, target sum) are shipped in
the repository, warm-started once, with each file's sha256 in ``bases/manifest.json``: a run whose world key matches
one loads it from there after checking its hashes, so every CPU starts from the same weights with no warm start
(the warm start's rounding differs by CPU, and with it every number after it). ``python -m agon.bases --ship``
(``make bases``) rebuilds them. Any other world is built and cached under ``$AGON_CACHE`` (default
``~/.cache/agon``) in a directory named by a hash of everything that shapes it; it is built in a temporary directory
and renamed into place, under a file lock, so parallel runs never see half a model and build it once.

Left out on purpose: a learned BPE. Characters keep the vocabulary tiny, and arithmetic wants digits as tokens.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import string
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import DictConfig, OmegaConf

from agon.core.config import shipped

# bump when the tokenizer, the template or the warm-start data change, so stale caches are not reused
WORLD_VERSION = 3
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# multi-character pieces that get one token each (shorter sequences, same text)
EXTRA_TOKENS = ["\\boxed{"]
CHAT_TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m['role'][0] }}{{ m['content'] }}<|im_end|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>a{%- endif -%}"
)


def cache_root() -> Path:
    return Path(os.environ.get("AGON_CACHE", Path.home() / ".cache" / "agon"))


def build_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` with Qwen3's special tokens and a compact chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + EXTRA_TOKENS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
    )
    tok.add_tokens(EXTRA_TOKENS)
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def build_model(tiny: Any, vocab_size: int, seed: int = 0):
    """A randomly initialised ``Qwen3ForCausalLM`` of the tiny shape."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_kv_heads,
        head_dim=tiny.hidden_size // tiny.num_heads,
        max_position_embeddings=tiny.max_position,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


# ---------------------------------------------------------------------------------------------------------------
# warm start


# share of the warm start's challenges whose rival recap is wrong, where the task has no ``warm_start_wrong_recaps``
WRONG_RECAPS = 0.3
# share of the warm start's rows that are challenges, where the task has no ``warm_start_challenges``
CHALLENGES = 0.5


def _warm_start_texts(task, pool, n: int, rng: random.Random, tokenizer) -> list[tuple[str, str]]:
    """(prompt, completion) pairs: plain problems and challenges with a rival's recap (``CHALLENGES`` of the rows,
    or the task's ``warm_start_challenges``; ``WRONG_RECAPS`` of those wrong, or the task's
    ``warm_start_wrong_recaps``), recap and answer as the task's ``warm_start_pair`` draws them."""
    wrong_share = float(task.cfg.get("warm_start_wrong_recaps", WRONG_RECAPS))
    challenge_share = float(task.cfg.get("warm_start_challenges", CHALLENGES))
    out = []
    for _ in range(n):
        problem = pool[rng.randrange(len(pool))]
        message, target = task.user_message(problem), None
        if rng.random() < challenge_share:
            wrong = rng.random() < wrong_share
            recap, target = task.warm_start_pair(problem, wrong, rng)
            message = task.challenge_message(problem, recap)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                               add_generation_prompt=True)
        out.append((prompt, (target or task.worked_solution(problem)) + tokenizer.eos_token))
    return out


def supervised_loss(model, tokenizer, pairs: list[tuple[str, str]]) -> torch.Tensor:
    """Mean cross-entropy of the completions given their prompts (prompt tokens and padding unscored), one batch of
    (prompt, completion) texts, right-padded."""
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in pairs]
    comp_ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for _, c in pairs]
    width = max(len(p) + len(c) for p, c in zip(prompt_ids, comp_ids))
    ids = torch.full((len(pairs), width), tokenizer.pad_token_id)
    labels = torch.full((len(pairs), width), -100)
    attn = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, comp_ids)):
        seq = p + c
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor(c)
        attn[i, : len(seq)] = 1
    device = next(model.parameters()).device
    return model(input_ids=ids.to(device), attention_mask=attn.to(device), labels=labels.to(device)).loss


def warm_start(model, tokenizer, tiny: Any, task_cfg: Any, log=print,
               on_step: Callable[[int, Any, float], None] | None = None) -> dict[str, float]:
    """Supervised training on worked solutions (loss on completion tokens only): a short linear ramp, then a
    constant rate (``warmup_cosine=false``, the default) or cosine decay. A constant rate stops the base while it is
    still learning arithmetic; measured here, RL then gained +9 points (GRPO) and +16 (Agon's cascade) in 40 steps,
    where a cosine-annealed base (51% at the start) lost 4-9 points under the same GRPO. ``on_step(steps done,
    model, loss average)`` runs after every step (``tools/target_sum_scan.py`` reads checkpoints through it); the
    model is put back in training mode after it."""
    from agon.tasks import build_task

    task = build_task(task_cfg)
    pool = [p for p in task.train_problems() if task.worked_solution(p) is not None]
    if not pool:
        raise ValueError(f"task {task_cfg.name!r} has no worked solutions to warm-start the offline model on")
    _check_characters(task, pool, tokenizer)
    rng = random.Random(tiny.warmup_seed)
    torch.manual_seed(tiny.warmup_seed)
    opt = torch.optim.AdamW(model.parameters(), lr=tiny.warmup_lr, weight_decay=0.01, betas=(0.9, 0.98))
    ramp = tiny.warmup_ramp_steps or max(1, tiny.warmup_steps // 20)

    def factor(s: int) -> float:
        decay = 0.5 * (1 + math.cos(math.pi * min(1.0, s / tiny.warmup_steps))) if tiny.warmup_cosine else 1.0
        return min(1.0, (s + 1) / ramp) * decay

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    model.train()
    t0, loss_ema = time.time(), None
    for step in range(tiny.warmup_steps):
        pairs = _warm_start_texts(task, pool, tiny.warmup_batch_size, rng, tokenizer)
        loss = supervised_loss(model, tokenizer, pairs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        if on_step is not None:  # (steps done, the model, the loss's average): a scan's checkpoints
            on_step(step + 1, model, loss_ema)
            model.train()
        if step % 100 == 0 or step == tiny.warmup_steps - 1:
            log(f"[world] warm start step {step}/{tiny.warmup_steps} loss {loss_ema:.3f} ({time.time() - t0:.0f}s)")
    model.eval()
    return {"warmup/final_loss": float(loss_ema or 0.0), "warmup/seconds": time.time() - t0}


# ---------------------------------------------------------------------------------------------------------------
# cache


# train_size too: the warm start draws its problems from the training split, so two sizes are two worlds
ARITHMETIC_KEYS = ("min_terms", "max_terms", "max_operand", "split_seed", "heldout_size", "challenge_template",
                  "instruction", "train_size")
TARGET_SUM_KEYS = ("min_terms", "max_terms", "max_operand", "split_seed", "heldout_size", "challenge_template",
                   "instruction", "train_size", "warm_start_wrong_recaps", "warm_start_reuse",
                   "warm_start_challenges")
REASONING_GYM_KEYS = ("name", "train_size", "split_seed", "heldout_size", "challenge_template", "instruction",
                      "system_prompt")


def world_key(model_cfg: Any, task_cfg: Any) -> str:
    """Hash of everything that shapes the warm-started model (``task_cfg`` as ``world_task_cfg`` gives it)."""
    tiny = OmegaConf.to_container(model_cfg.tiny, resolve=True) if isinstance(model_cfg.tiny, DictConfig) else dict(
        vars(model_cfg.tiny))
    if task_cfg.kind == "arithmetic":  # the key of every world built before other families had worlds of their own
        task = {k: task_cfg[k] for k in ARITHMETIC_KEYS}
    elif task_cfg.kind == "target_sum":
        from agon.tasks.target_sum import WARM_START_DESIGN

        task = {"kind": task_cfg.kind, "design": WARM_START_DESIGN, **{k: task_cfg[k] for k in TARGET_SUM_KEYS}}
    else:
        from agon.tasks.reasoning_gym import dataset_kwargs

        task = {"kind": task_cfg.kind, **{k: task_cfg[k] for k in REASONING_GYM_KEYS},
                "dataset": dataset_kwargs(task_cfg)}
    if tiny.get("warmup_ramp_steps") is None:  # unset: the key of every world built before the key existed
        tiny.pop("warmup_ramp_steps", None)
    blob = json.dumps({"v": WORLD_VERSION, "tiny": tiny, "task": task}, sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def world_task_cfg(task_cfg: Any) -> Any:
    """The task the offline base is warm-started on: target sum's own problems, a reasoning-gym dataset's own items
    (``task.warm_start=own``), else the built-in arithmetic with the run's knobs if the run is arithmetic, its chain
    lengths replaced by ``task.warm_start_{min,max}_terms`` where set (the hard split shares the default world)."""
    from agon.core.config import ArithmeticTaskConfig

    if task_cfg is not None and (task_cfg.kind == "target_sum" or (task_cfg.kind == "reasoning_gym"
                                                                    and task_cfg.warm_start == "own")):
        return task_cfg
    base = OmegaConf.structured(ArithmeticTaskConfig)
    if task_cfg is None or task_cfg.kind != "arithmetic":
        return base
    cfg = OmegaConf.merge(base, task_cfg)
    for end in ("min", "max"):
        if cfg[f"warm_start_{end}_terms"] is not None:
            cfg[f"{end}_terms"] = cfg[f"warm_start_{end}_terms"]
            cfg[f"warm_start_{end}_terms"] = None
    return cfg


def _check_characters(task, pool, tokenizer) -> None:
    """The character tokenizer maps anything outside printable ASCII to one unknown token: say so, naming it."""
    known = set(tokenizer.get_vocab())
    for problem in pool[:200]:
        for text in (task.user_message(problem), task.worked_solution(problem)):
            odd = sorted({c for c in text if c not in known})
            if odd:
                raise ValueError(f"task {task.cfg.name!r}: problem {problem.id} holds characters the offline world's "
                                 f"tokenizer does not have ({''.join(odd)!r}); the tiny model reads printable ASCII")


def build_once(final: Path, build: Callable[[Path], None], marker: str, log=print, what: str = "") -> Path:
    """``final``, made by ``build(tmp)`` (which writes ``marker`` last) in a temporary directory beside it and renamed
    into place under a file lock: a second builder waits, then finds the finished directory; a directory without its
    marker, or a temporary one left by a killed build, is removed and built again."""
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    if (final / marker).exists():
        return final
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / marker).exists():
            return final
        for stale in root.glob(f".{final.name}.*"):  # left by a build that was killed; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        log(f"[world] building {what or final.name} into {final}")
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
        try:
            build(tmp)
            if final.exists():  # a stale partial directory (no marker) from a killed build
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------------------------------------
# the shipped bases

BASES = shipped("bases", "shipped_bases")
MANIFEST = "manifest.json"
# set to 0 to ignore the shipped bases and build every world (how `--ship` rebuilds them)
SHIPPED_ENV = "AGON_SHIPPED_BASES"


class ShippedBaseMismatch(RuntimeError):
    """A shipped base's files differ from the hashes in ``bases/manifest.json``."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def base_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file of a base directory, by name."""
    return {f.name: _sha256(f) for f in sorted(directory.iterdir()) if f.is_file()}


def read_manifest(bases: Path) -> dict[str, dict[str, str]]:
    """``bases/manifest.json``: {base directory: {file: sha256}}, empty where there is none yet."""
    path = bases / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def shipped_base(name: str, bases: Path | None = None) -> Path | None:
    """``bases/<name>`` when the repository ships that world, after checking every file against the manifest; None
    when it does not (or ``AGON_SHIPPED_BASES=0``). A file that differs stops the run, naming it."""
    bases = bases or BASES
    directory = bases / name
    if os.environ.get(SHIPPED_ENV, "1") == "0" or not (directory / "world.json").is_file():
        return None
    expected, actual = read_manifest(bases).get(name), base_hashes(directory)
    if expected != actual:
        wrong = sorted(k for k in set(expected or {}) | set(actual) if (expected or {}).get(k) != actual.get(k))
        raise ShippedBaseMismatch(
            f"the shipped base {directory} does not match {bases / MANIFEST}: {', '.join(wrong) or 'no entry'} "
            f"differ. Restore it (git checkout -- {directory}) or rebuild every shipped base on this machine "
            f"(make bases), or set {SHIPPED_ENV}=0 to build the world into $AGON_CACHE instead")
    return directory


def ensure_world(model_cfg: Any, task_cfg: Any = None, log=print) -> Path:
    """Directory of the warm-started tiny model: the shipped base where the repository has this world, else the
    cached one, built on first use. Safe under concurrent callers."""
    task_cfg = world_task_cfg(task_cfg)
    key = world_key(model_cfg, task_cfg)
    if (shipped := shipped_base(f"tiny-{key}")) is not None:
        return shipped
    final = cache_root() / f"tiny-{key}"

    def build(tmp: Path) -> None:
        tokenizer = build_tokenizer()
        model = build_model(model_cfg.tiny, len(tokenizer), seed=model_cfg.tiny.warmup_seed)
        stats = warm_start(model, tokenizer, model_cfg.tiny, task_cfg, log=log)
        save_world(model, tokenizer, tmp, final.name, stats)

    return build_once(final, build, "world.json", log, what="the offline model (one-time warm start)")


def save_world(model, tokenizer, directory: Path, name: str, stats: dict[str, float]) -> None:
    """A warm-started model as a world directory ``name`` (``tiny-<key>``): weights, tokenizer, and ``world.json``
    written last, since its presence marks a complete model."""
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "world.json").write_text(json.dumps({"key": name, "version": WORLD_VERSION, **stats}))
