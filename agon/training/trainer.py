"""The step loop shared by every method: ask the method for the step's roles, play, reward, update each adapter.

One step on a batch of ``prompts_per_step`` problems:
  1. roles from the method (``methods.get_method(method.name).turn``);
  2. ``rollout.play``: ``num_generations`` drafts per problem, their recaps, one challenge per draft; with several
     processes each rank plays its share of the problems and the ranks exchange their games (``distributed``);
  3. rewards from the registry (``rewards.compute_rewards``) on the whole batch;
  4. GRPO per role on this rank's rows (``role_batch.role_batches``, ``grpo.policy_loss``) with the role's adapter
     active, then the gradient bookkeeping (sum over ranks, per-adapter clip, non-finite check), then each adapter
     that played a role steps its own optimizer.

Everything that must survive a restart lives in ``TrainState`` plus the optimizers, the adapters and the RNGs;
``save_checkpoint`` commits all of it atomically (written to a temporary directory, renamed, then ``latest``
rewritten last) and ``load_checkpoint`` restores it. Only rank 0 writes; every rank checks first that its adapters
are bitwise those of rank 0. A non-finite gradient skips the update and is counted; too many in a row abort the
run before anything non-finite reaches the weights or a checkpoint.

Left out on purpose: skipping rows whose advantage is 0 (exact only without a KL term, and it changes the order of
float sums, so results would drift from the same seed's) and asynchronous rollouts (generation and update overlap);
the step stays the synchronous loop the paper describes.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

from agon.records import run_files
from agon.game.cascade import EvalResult, PartStore, eval_size, evaluate, forked_rng, store_key
from agon.core.config import to_plain
from agon.core.distributed import Ranks
from agon.engines import Engine, Sampling, build_engine
from agon.core.grpo import is_extreme, masked_mean, merge_stats, policy_loss, sampler_correction, sampler_mismatch
from agon.training.cores import SharedCores
from agon.training.health import LearningWatch
from agon.models.latent import Prefixes
from agon.core.methods import get_method
from agon.models.policies import Policies
from agon.models.tokens import Tokens
from agon.records.recorder import Recorder
from agon.core.rewards import RoleRewards, compute_rewards
from agon.training.role_batch import RoleBatch, in_place, role_batches
from agon.game.rollout import Game, derive_seed, play_split
from agon.tasks import Problem, Task

# fault injection, for tests only: ``AGON_TEST_PAUSE_AT=<point>:<step>`` stops the run at that point of that step,
# says so on stderr and sleeps, so that a test can SIGKILL it exactly there (``pause_point`` names the points)
PAUSE_AT = "AGON_TEST_PAUSE_AT"
PAUSED = "[agon] test pause at"


def pause_point(point: str, step: int) -> None:
    """A place where a test may kill the run (``PAUSE_AT``); one environment lookup otherwise. The points:
    ``step`` (the step's metrics row written, its rollouts not), ``checkpoint`` (half-way through a checkpoint write:
    the adapters written, the optimizer state not), ``eval_chunk_<i>`` (an evaluation's chunk i committed, the next
    not begun), ``eval_round_<n>`` (a streamed evaluation's n-th round committed, others in flight), ``eval`` (an
    evaluation's eval rows written, its metrics row not) and ``summary`` (summary.json written, the run not yet
    closed)."""
    if os.environ.get(PAUSE_AT) == f"{point}:{step}":
        print(f"{PAUSED} {point}:{step}", file=sys.stderr, flush=True)
        time.sleep(3600)


class TrainingError(RuntimeError):
    """The run cannot go on (too many non-finite steps in a row, ranks that no longer agree)."""


@dataclass
class TrainState:
    step: int = 0
    # problems consumed from the shuffled training pool (the data position)
    cursor: int = 0
    generated_tokens: int = 0
    bad_steps: int = 0
    verifier_failures: int = 0
    train_seconds: float = 0.0
    # one entry per process whose work the run kept: its code (git commit, and whether the checkout had uncommitted
    # changes), when it started (UTC) and its wall seconds up to its last checkpoint (or the summary). Work after a
    # killed launch's last checkpoint is done again, so its seconds after that point are not counted
    launches: list[dict[str, Any]] = field(default_factory=list)
    # what LearningWatch reported (kept across a resume, written to summary.json)
    warnings: list[str] = field(default_factory=list)


class Trainer:
    def __init__(self, cfg: Any, policies: Policies, task: Task, recorder: Recorder, run_dir: Path,
                 log: Callable[[str], None] = print, ranks: Ranks = Ranks(), engine: Engine | None = None):
        self.cfg, self.t = cfg, cfg.trainer
        self.policies, self.task, self.recorder, self.run_dir, self.log = policies, task, recorder, run_dir, log
        self.ranks, self.method = ranks, get_method(cfg.method.name)
        self.state = TrainState()
        self._launch_started = time.time()
        self.pool = task.train_problems()
        self._order: list[int] = []
        self._order_epoch: int | None = None
        self.heldout = list(task.heldout_problems())[: cfg.eval.n_problems]
        # one optimizer per adapter the method owns
        self.optimizers = {
            name: torch.optim.AdamW(policies.parameters(name), lr=self.t.learning_rate,
                                    weight_decay=self.t.weight_decay)
            for name in policies.adapters
        }
        self.sampling = Sampling.from_config(self.t)
        # what samples the rollouts and evaluations (generation.engine): closed by whoever ends the run
        self.engine = engine or build_engine(cfg, policies, ranks, log)
        # vLLM's own log (its KV cache's capacity, compile and graph times): the first real measurement on a GPU
        self.engine.keep_log(run_dir / run_files.engine_log(ranks.rank))
        self._last_checkpoint = time.time()
        # on a CPU, torch's threads follow the cores other work leaves this run (agon.training.cores)
        self.cores = SharedCores(log, enabled=policies.device.type == "cpu")
        # an interim evaluation to run before the next step: a resume found it cut short (``load_checkpoint``)
        self._interim_pending = False
        self.watch = LearningWatch(self.t.warn_after_steps, self.t.warn_zero_std_ratio, self.t.warn_truncated_ratio,
                                   self.t.warn_importance_ratio, self.t.max_new_tokens, self.t.num_generations,
                                   cfg.task.name)

    # -- data ----------------------------------------------------------------------------------------------------

    def next_problems(self) -> list[Problem]:
        """The next ``prompts_per_step`` problems of a seeded per-epoch shuffle (resumable from ``cursor``); the
        same on every rank."""
        out = []
        for _ in range(self.t.prompts_per_step):
            epoch, index = divmod(self.state.cursor, len(self.pool))
            out.append(self.pool[self._epoch_order(epoch)[index]])
            self.state.cursor += 1
        return out

    def _epoch_order(self, epoch: int) -> list[int]:
        if self._order_epoch != epoch:
            self._order = list(range(len(self.pool)))
            random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(self._order)
            self._order_epoch = epoch
        return self._order

    # -- the update: loss, gradient bookkeeping, optimizer step ---------------------------------------------------

    def _score(self, tokens: Tokens, prefixes: Prefixes | None = None) -> torch.Tensor:
        """[b, T] log-probs of the completion tokens under the active adapter, on the distribution the rollouts were
        sampled from: the trainer's temperature, and its top-k and top-p applied to the logits as the sampler does;
        after the rows' latent prefixes (``prefixes``: whose they are) when they have them, as they were sampled."""
        t = self.t
        return self.policies.token_logps(tokens, None, t.temperature, t.logit_chunk_tokens, t.top_k, t.top_p,
                                         prefixes)

    def _logps(self, batch: RoleBatch, adapter: str | None) -> torch.Tensor:
        """[b, T] log-probs of ``batch`` under ``adapter``, without a graph, one micro-batch at a time, in the
        batch's row order (micro-batches hold rows sorted by length: ``in_place`` puts each row back)."""
        t = self.t
        if len(batch) == 0:  # a rank with no rows of this role
            return torch.zeros(batch.mask.shape, device=self.policies.device)
        with torch.no_grad(), self.policies.use_adapter(adapter):
            parts = [(mb.rows, self._score(mb.tokens, mb.prefixes))
                     for mb in batch.micro_batches(t.scoring_batch_tokens, t.micro_batch_size, t.solo_row_tokens)]
        return in_place(parts, len(batch))

    def loss_backward(self, batch: RoleBatch) -> dict[str, float]:
        """Backward of one role's GRPO loss over its micro-batches; the loss, clip ratios and KL of this rank's rows
        as shares of the whole batch (summed over ranks, they are the whole batch's), and, when the engine gave its
        log-probs, the sampler mismatch (``grpo.sampler_mismatch``)."""
        t, device = self.t, self.policies.device
        stats = dict.fromkeys(("loss", "clip_ratio/low", "clip_ratio/high", "kl", "entropy", "advantages/mean",
                               "advantages/square"), 0.0)
        with self.policies.use_adapter(batch.adapter):
            # rows sorted by length, the longest alone: the loss's normalisers are the whole batch's, so neither
            # the grouping nor the order of micro-batches changes it beyond the order of float sums
            for mb in batch.micro_batches(t.scoring_batch_tokens, t.micro_batch_size, t.solo_row_tokens):
                mask = mb.mask.to(device)
                logps = self._score(mb.tokens, mb.prefixes)
                old = logps.detach() if mb.old_logps is None else mb.old_logps.to(device)
                sampler = None if mb.sampler_logps is None else mb.sampler_logps.to(device)
                weights = None
                if sampler is not None and t.vllm_importance_sampling_correction:
                    weights = sampler_correction(old, sampler, mask, t.vllm_importance_sampling_mode,
                                                 t.vllm_importance_sampling_clip_min,
                                                 t.vllm_importance_sampling_clip_max)
                if sampler is not None:
                    merge_stats(stats, sampler_mismatch(old, sampler, mask, weights, batch.batch_tokens,
                                                        batch.batch_rows))
                loss, terms = policy_loss(
                    logps, old, mb.advantages.to(device), mask, loss_type=t.loss_type, epsilon=t.epsilon,
                    epsilon_high=t.epsilon_high, beta=t.beta,
                    ref_logps=None if mb.ref_logps is None else mb.ref_logps.to(device),
                    use_bias_correction_kl=t.use_bias_correction_kl, sampler_weights=weights,
                    max_completion_length=t.max_new_tokens,
                    num_items_in_batch=batch.batch_tokens, batch_rows=batch.batch_rows)
                loss.backward()
                share = float(mask.sum()) / max(batch.batch_tokens, 1.0)
                stats["loss"] += loss.item()
                stats["clip_ratio/low"] += masked_mean(terms.low_clipped.float(), mask) * share
                stats["clip_ratio/high"] += masked_mean(terms.high_clipped.float(), mask) * share
                # mean -log p of the sampled tokens: a Monte Carlo estimate of the policy's per-token entropy
                # (the tokens were drawn from it), without the full-vocabulary logits TRL computes its entropy from
                stats["entropy"] += masked_mean(-logps.detach(), mask) * share
                # per row, as shares of the whole batch's rows (update turns the two into a mean and a std)
                advantages = mb.advantages.double()
                stats["advantages/mean"] += float(advantages.sum()) / max(batch.batch_rows, 1)
                stats["advantages/square"] += float((advantages ** 2).sum()) / max(batch.batch_rows, 1)
                if terms.kl is not None:
                    stats["kl"] += masked_mean(terms.kl.detach(), mask) * share
        return stats

    def reduce_and_clip(self, adapters: list[str]) -> dict[str, float]:
        """Sum each adapter's gradient over the ranks, clip it to ``max_grad_norm``; its norm before the clip."""
        norms = {}
        for name in adapters:
            params = self.policies.parameters(name)
            for p in params:
                if p.grad is None:  # a row-less share still joins the all-reduce
                    p.grad = torch.zeros_like(p)
            self.ranks.sum_([p.grad for p in params])
            norms[name] = float(torch.nn.utils.clip_grad_norm_(params, self.t.max_grad_norm))
        return norms

    def optimizer_step(self, norms: dict[str, float]) -> bool:
        """Step every adapter in ``norms``; a non-finite norm skips them all (counted, fatal after
        ``max_bad_steps`` in a row). True when the weights moved."""
        if not all(torch.isfinite(torch.tensor(list(norms.values())))):
            self.state.bad_steps += 1
            self.log(f"[train] step {self.state.step}: non-finite gradient norm {norms}; update skipped")
            if self.state.bad_steps >= self.t.max_bad_steps:
                raise TrainingError(f"{self.state.bad_steps} non-finite steps in a row (trainer.max_bad_steps)")
            return False
        for name in norms:
            self.optimizers[name].step()
            self.policies.mark_updated(name)  # an engine holding a copy of it republishes it before its next use
        self.state.bad_steps = 0
        return True

    def update(self, game: Game, rewards: dict[str, RoleRewards], rows: slice = slice(None)) -> dict[str, float]:
        """GRPO on every rewarded role of ``game`` (the whole step's batch), this rank's ``rows`` of it."""
        t = self.t
        batches = role_batches(self.policies, game, rewards, rows, t.scale_rewards, t.adv_eps)
        # a latent prefix is the drafter's states as sampled: from the second pass on the drafter has stepped, so
        # its weights of now are kept for the prefixes of every later pass (LoRA weights only: a few MB)
        batches = [replace(b, prefixes=replace(b.prefixes, weights=self.policies.lora_state(b.prefixes.adapter)))
                   if b.prefixes is not None and b.prefixes.adapter is not None and t.num_iterations > 1 else b
                   for b in batches]
        batches = [replace(b, old_logps=self._logps(b, b.adapter) if t.num_iterations > 1 else None,
                           ref_logps=self._logps(b, None) if t.beta != 0 else None) for b in batches]
        trained = sorted({b.adapter for b in batches if b.adapter is not None})
        stats = {f"role/{b.role}/frac_reward_zero_std": b.frac_zero_std for b in batches}
        for _ in range(t.num_iterations):
            for opt in self.optimizers.values():
                opt.zero_grad(set_to_none=True)
            terms = {b.role: self.loss_backward(b) for b in batches}
            extreme = {f"role/{role}/{k}": v for role, s in terms.items() for k, v in s.items() if is_extreme(k)}
            keys = [(role, k) for role, s in terms.items() for k in s
                    if (k != "kl" or t.beta != 0) and not is_extreme(k)]
            summed = torch.tensor([terms[role][k] for role, k in keys], dtype=torch.float64)
            self.ranks.sum_([summed])
            stats |= {f"role/{role}/{k}": float(v) for (role, k), v in zip(keys, summed)}
            for role in terms:  # TRL's clip_ratio/region_mean: the tokens where either clip was active
                stats[f"role/{role}/clip_ratio/region_mean"] = (stats[f"role/{role}/clip_ratio/low"]
                                                                + stats[f"role/{role}/clip_ratio/high"])
                # the advantages' std over the whole batch from their mean and mean square (population std)
                mean, square = stats[f"role/{role}/advantages/mean"], stats.pop(f"role/{role}/advantages/square")
                stats[f"role/{role}/advantages/std"] = max(square - mean * mean, 0.0) ** 0.5
            for share in self.ranks.gather(extreme):  # max and min over the ranks
                merge_stats(stats, share)
            norms = self.reduce_and_clip(trained)
            if not self.optimizer_step(norms):
                return stats | {"train/skipped": 1.0}
            stats |= {f"adapter/{name}/grad_norm": v for name, v in norms.items()}
        return stats

    # -- one step ------------------------------------------------------------------------------------------------

    def step(self) -> dict[str, Any]:
        t0 = time.time()
        self.cores.start()
        turn = self.method.turn(self.cfg.rotation.mode, self.state.step)
        problems = self.next_problems()
        # each problem's requests drawn from seeds of their own (engines that seed requests): a streamed step and a
        # two-stage one, or a step replayed after a resume, sample the same
        seeds = [derive_seed(self.cfg.seed, "train", self.state.step, i) for i in range(len(problems))]
        game, rows = play_split(self.ranks, self.policies, self.task, self.cfg.model, problems, seeds,
                                drafter=turn.drafter, challenger=turn.challenger, exchange=self.cfg.exchange.mode,
                                group_size=self.t.num_generations, sampling=self.sampling, engine=self.engine,
                                span=self.cfg.exchange.span)
        outcome = game.outcome()
        round_rewards = compute_rewards(outcome, self.cfg.reward)
        rewards = {"drafter": round_rewards.drafter}
        if round_rewards.challenger is not None:
            rewards["challenger"] = round_rewards.challenger
        gen_s = time.time() - t0
        stats = self.update(game, rewards, rows)
        metrics = self._metrics(game, rewards, outcome)
        tokens = sum(a.completion.n_tokens for role in rewards for a in game.attempts(role))
        self.state.generated_tokens += tokens
        self.state.step += 1
        step_s = time.time() - t0
        self.state.train_seconds += step_s
        metrics |= stats | {
            "train/drafter": turn.drafter, "train/generated_tokens": self.state.generated_tokens,
            "time/step_s": step_s, "time/generation_s": gen_s, "time/tokens_per_s": tokens / max(gen_s, 1e-9),
            # the share of the step this process's threads waited for a core, and their count after it
            "perf/core_wait": self.cores.observe(), "perf/torch_threads": torch.get_num_threads(),
        }
        if len(self.policies.adapters) > 1:
            metrics["train/divergence"] = self.policies.divergence(*self.policies.adapters[:2])
        from agon.records.recorder import per_adapter

        metrics |= per_adapter(metrics, {"drafter": game.drafter, "challenger": game.challenger})
        if torch.device(self.policies.device).type == "cuda":  # verl's names: the peak since the start, in GiB
            metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(self.policies.device) / 2**30
            metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(self.policies.device) / 2**30
        self.recorder.log_metrics(metrics, self.state.step)
        pause_point("step", self.state.step)
        self.recorder.log_rollouts(self._sample_rows(game, rewards, limit=4), self.state.step)
        return metrics

    def _metrics(self, game: Game, rewards: dict[str, RoleRewards], outcome) -> dict[str, Any]:
        m: dict[str, Any] = {}
        for role, rr in rewards.items():
            attempts = game.attempts(role)
            correct = outcome.draft_correct if role == "drafter" else outcome.challenge_correct
            total = rr.total
            m[f"role/{role}/accuracy"] = float(torch.nan_to_num(correct).mean())
            m[f"role/{role}/reward/mean"] = float(torch.nanmean(total))
            m[f"role/{role}/reward/std"] = float(torch.nan_to_num(total).std()) if total.numel() > 1 else 0.0
            for name, comp in rr.components.items():
                m[f"role/{role}/reward/{name}"] = float(torch.nanmean(comp))
            m[f"role/{role}/completion_tokens"] = sum(a.completion.n_tokens for a in attempts) / len(attempts)
            m[f"role/{role}/truncated_ratio"] = sum(a.completion.truncated for a in attempts) / len(attempts)
            m[f"role/{role}/context_limited"] = sum(a.completion.context_limited for a in attempts)
            if any(a.prefix for a in attempts):  # exchange=latent: the drafter's tokens this role read as states
                m[f"role/{role}/prefix_tokens"] = sum(len(a.prefix) for a in attempts) / len(attempts)
            failures = sum(a.verdict.failed for a in attempts)
            m[f"role/{role}/verifier_failures"] = failures
            self.state.verifier_failures += failures
        final = "challenger" if "challenger" in rewards else "drafter"
        m["train/accuracy"] = m[f"role/{final}/accuracy"]
        m["train/final_trace_tokens"] = m[f"role/{final}/completion_tokens"]
        m["verifier/failures_total"] = self.state.verifier_failures
        if outcome.challenge_correct is not None:
            a, b = torch.nan_to_num(outcome.draft_correct), torch.nan_to_num(outcome.challenge_correct)
            m["train/conversion_rate"] = float(b[a == 0].mean()) if (a == 0).any() else None
            m["train/regression_rate"] = float((1 - b)[a == 1].mean()) if (a == 1).any() else None
        return m

    @staticmethod
    def _sample_rows(game: Game, rewards: dict[str, RoleRewards], limit: int) -> list[dict[str, Any]]:
        rows = []
        for i, r in enumerate(game.rounds[:: game.group_size][:limit]):
            j = i * game.group_size
            rows.append({
                "problem_id": r.problem.id, "problem": r.problem.question, "answer": r.problem.answer,
                "drafter": game.drafter or "base", "challenger": (game.challenger or "base") if r.challenge else None,
                "draft": r.draft.completion.text, "recap": r.recap, "draft_correct": r.draft.verdict.correct,
                "challenge": r.challenge.completion.text if r.challenge else None,
                "challenge_correct": r.challenge.verdict.correct if r.challenge else None,
                "drafter_reward": float(rewards["drafter"].total[j]),
                "challenger_reward": float(rewards["challenger"].total[j]) if "challenger" in rewards else None,
            })
        return rows

    # -- evaluation and the loop ---------------------------------------------------------------------------------

    def evaluate(self, phase: str, progress: bool | None = None) -> EvalResult:
        """The held-out evaluation of ``phase`` (``start``, ``train``, ``final``) at its size (``cascade.eval_size``:
        the interim size during training), logged; a progress bar unless ``progress`` (default ``cfg.progress``) is
        false, on rank 0 only."""
        n, samples = eval_size(self.cfg.eval, phase)
        problems = self.heldout[:n]
        progress = self.cfg.progress if progress is None else progress
        step = self.state.step
        # its chunks committed as they finish, kept until the next checkpoint: a run killed during it, or sent back
        # to the checkpoint before it, plays only what was not done
        store = PartStore(self.run_dir / run_files.EVAL_PARTS,
                          store_key(self.policies.digest(), self.cfg, phase, step, len(problems), samples,
                                    self.ranks.world), self.ranks)
        result = evaluate(self.policies, self.task, self.cfg, problems, step, phase, self.ranks, self.engine,
                          samples=samples, progress=progress, store=store, log=self.log,
                          on_chunk=lambda i: pause_point(f"eval_chunk_{i}", step),
                          on_round=lambda n: pause_point(f"eval_round_{n}", step))
        self.recorder.log_eval_rows(result.rows)
        pause_point("eval", self.state.step)
        if self.cfg.eval.diagnostic:
            from agon.game.diagnostic import diagnose

            # its draws are its own (as the evaluation's are): turning the diagnostic on never moves training's
            with forked_rng():
                result.metrics.update(diagnose(self.policies, self.task, self.cfg, problems, self.engine))
        game = next(iter(result.games.values()))
        self.recorder.log_rollouts(
            [{"phase": phase, **row} for row in self._eval_sample_rows(game)], self.state.step, mirror=True)
        # the metrics row last: it marks the evaluation done (``Recorder.evaluated``)
        self.recorder.log_metrics({k: v for k, v in result.metrics.items() if not isinstance(v, list)},
                                  self.state.step)
        return result

    def _eval_sample_rows(self, game: Game) -> list[dict[str, Any]]:
        n = self.cfg.logger.table_rows
        return [{"problem_id": r.problem.id, "problem": r.problem.question, "answer": r.problem.answer,
                 "drafter": game.drafter or "base", "draft": r.draft.completion.text, "recap": r.recap,
                 "draft_correct": r.draft.verdict.correct,
                 "challenge": r.challenge.completion.text if r.challenge else None,
                 "challenge_correct": r.challenge.verdict.correct if r.challenge else None}
                for r in game.rounds[:: game.group_size][:n]]

    def train(self, progress: bool = True, on_eval: Callable[[EvalResult, int], None] | None = None) -> None:
        """Steps until ``max_steps``; ``on_eval`` sees every evaluation during training (an Optuna trial's report)."""
        from tqdm.auto import tqdm

        bar = tqdm(total=self.t.max_steps, initial=self.state.step, disable=not progress, desc="train",
                   dynamic_ncols=True)
        warned: list[str] = []
        if self._interim_pending:  # resumed from the checkpoint before an interim evaluation a kill cut short
            self._interim_evaluation(progress, on_eval)
        while self.state.step < self.t.max_steps:
            m = self.step()
            for cause, message in self.watch.observe(m, self.state.step):
                warned.append(cause)
                self.state.warnings.append(message)
                bar.write(message) if progress else self.log(message)
            bar.update(1)
            bar.set_postfix(reward=f"{m['role/drafter/reward/mean']:.2f}", acc=f"{m['train/accuracy']:.2f}",
                            tok_s=f"{m['time/tokens_per_s']:.0f}", **({"warn": ",".join(warned)} if warned else {}))
            evaluating = self._interim_due()
            # a due evaluation follows a checkpoint: a kill during it resumes at this step, where its committed
            # rounds are the adapters' of now and none is sampled again
            if evaluating or self._checkpoint_due():
                self.save_checkpoint()
            if evaluating:
                self._interim_evaluation(progress, on_eval)
        bar.close()

    def _interim_due(self) -> bool:
        every = self.cfg.eval.every
        return bool(every) and 0 < self.state.step < self.t.max_steps and self.state.step % every == 0

    def _interim_evaluation(self, progress: bool, on_eval: Callable[[EvalResult, int], None] | None) -> None:
        self._interim_pending = False
        result = self.evaluate("train", progress=progress)
        if on_eval is not None:
            on_eval(result, self.state.step)

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def _checkpoint_due(self) -> bool:
        """Every ``checkpoint_every`` steps, and once ``checkpoint_minutes`` passed since the last checkpoint (rank
        0's clock decides, so every rank takes part in the same checkpoints)."""
        every, minutes = self.t.checkpoint_every, self.t.checkpoint_minutes
        late = bool(minutes) and time.time() - self._last_checkpoint >= 60 * minutes
        return bool(every and self.state.step % every == 0) or bool(self.ranks.share(late))

    def adapter_digests(self) -> list[str]:
        """The sha256 of every rank's adapter weights, in rank order; raises when they differ (the ranks' updates
        stopped being the same update, and a checkpoint from rank 0 would not be the run's)."""
        digests = self.ranks.gather(self.policies.digest())
        if len(set(digests)) > 1:
            raise TrainingError(f"step {self.state.step}: the ranks' adapters differ ({digests})")
        return digests

    def _rng_state(self) -> dict[str, Any]:
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        return rng

    def begin_launch(self, code: dict[str, Any], started: float) -> None:
        """Count this process as one more launch of the run: after a resume restored the earlier ones, before any
        checkpoint of its own. ``code``: what ``agon.run.code_version`` read as the process started."""
        self._launch_started = started
        self.state.launches.append({**code, "started": datetime.fromtimestamp(started, timezone.utc).isoformat(
            timespec="seconds"), "wall_s": 0.0})

    def wall_seconds(self) -> float:
        """The run's wall seconds so far: every kept launch's, this one's up to now (``TrainState.launches``)."""
        if self.state.launches:
            self.state.launches[-1]["wall_s"] = time.time() - self._launch_started
        return sum(launch["wall_s"] for launch in self.state.launches)

    def save_checkpoint(self) -> Path:
        """Commit ``checkpoints/step_N`` atomically, then point ``checkpoints/latest`` at it, then prune the older
        ones down to ``keep_checkpoints`` in all (never the new one). Every rank calls it (their RNG states are saved
        too); rank 0 writes. Not for a step that ``latest`` already names (``committed_step``): replacing that one
        would leave ``latest`` naming nothing for a moment."""
        self.adapter_digests()
        self.wall_seconds()  # the launch's seconds up to this checkpoint, saved with it
        rngs = self.ranks.gather(self._rng_state())
        root = self.run_dir / "checkpoints"
        final = root / f"step_{self.state.step}"
        if self.ranks.is_main:
            tmp = root / f".tmp-step_{self.state.step}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            # the run's config: a launch of another configuration does not train on from it (run.check_checkpoint)
            run_files.write_json_atomic(tmp / run_files.CHECKPOINT_CONFIG, to_plain(self.cfg))
            self.policies.save_adapters(tmp)
            pause_point("checkpoint", self.state.step)
            torch.save({
                "state": asdict(self.state),
                "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
                "rng": rngs,  # one per rank
            }, tmp / "state.pt")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            latest_tmp = root / ".latest.tmp"
            latest_tmp.write_text(final.name)
            os.replace(latest_tmp, root / "latest")
            older = sorted((p for p in root.glob("step_*") if _step_of(p) < self.state.step), key=_step_of)
            for old in older[: max(len(older) - self.t.keep_checkpoints + 1, 0)]:
                shutil.rmtree(old, ignore_errors=True)
        self.ranks.barrier()  # nobody reads a checkpoint before it is committed
        self.discard_eval_parts()  # every evaluation so far lies before it: none is replayed
        self._last_checkpoint = time.time()
        return final

    def committed_step(self) -> int | None:
        """The step of the checkpoint ``checkpoints/latest`` names (rank 0's view), None when there is none."""
        latest = self.run_dir / "checkpoints" / "latest"
        step = _step_of(Path(latest.read_text().strip())) if self.ranks.is_main and latest.exists() else None
        return self.ranks.share(step)

    def discard_checkpoints(self) -> None:
        """Remove every checkpoint of the run directory (a run started afresh: they hold another run's state, which
        ``trainer.resume=auto`` would otherwise resume after a kill, and whose steps the pruning would count)."""
        if self.ranks.is_main:
            shutil.rmtree(self.run_dir / "checkpoints", ignore_errors=True)
        self.ranks.barrier()

    def discard_eval_parts(self) -> None:
        """Remove the committed chunks of every evaluation (``cascade.PartStore``): once a checkpoint is committed
        after them or the run has ended no resume replays them, and ``trainer.resume=never`` wants none."""
        if self.ranks.is_main:
            shutil.rmtree(self.run_dir / run_files.EVAL_PARTS, ignore_errors=True)
        self.ranks.barrier()

    def resume_latest(self) -> bool:
        """Restore ``checkpoints/latest`` of the run directory if there is one; True when it did."""
        root = self.run_dir / "checkpoints"
        committed = self.committed_step()
        # writes a kill interrupted (a temporary directory, or a checkpoint renamed into place before ``latest``
        # named it): never committed, so never read; removed
        if self.ranks.is_main:
            uncommitted = [p for p in root.glob("step_*") if committed is None or _step_of(p) > committed]
            for partial in [*root.glob(".tmp-step_*"), root / ".latest.tmp", *uncommitted]:
                shutil.rmtree(partial, ignore_errors=True) if partial.is_dir() else partial.unlink(missing_ok=True)
        self.ranks.barrier()
        if committed is None:
            return False
        name = f"step_{committed}"
        self.load_checkpoint(root / name)
        self.log(f"[train] resumed from {name} (step {self.state.step})")
        return True

    def load_checkpoint(self, directory: Path) -> None:
        """Restore adapters, optimizers, RNG and the data position from a committed checkpoint."""
        saved = torch.load(directory / "state.pt", weights_only=False)
        self.policies.load_adapters(directory)
        for k, o in self.optimizers.items():
            o.load_state_dict(saved["optimizers"][k])
        rngs = saved["rng"] if isinstance(saved["rng"], list) else [saved["rng"]]  # older checkpoints: one
        # resumed on a different number of processes, a rank without its own state takes rank 0's
        rng = rngs[self.ranks.rank] if self.ranks.rank < len(rngs) else rngs[0]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
        self.state = TrainState(**saved["state"])
        # the interim evaluation that followed this checkpoint, unless its metrics row says it ended
        self._interim_pending = self._interim_due() and not self.ranks.share(self.recorder.evaluated(self.state.step))
        redone = "final" if self.state.step >= self.t.max_steps else "train" if self._interim_pending else None
        self.recorder.resume_from(self.state.step, redone=redone)


def _step_of(checkpoint: Path) -> int:
    """N of a checkpoint directory ``step_N``."""
    return int(checkpoint.name.removeprefix("step_"))
