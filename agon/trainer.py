"""The step loop shared by every method: choose roles, play a game, reward it, update each role's adapter.

One step on a batch of ``prompts_per_step`` problems:
  1. roles from the rotation (Agon alternate: A drafts on even steps, B on odd; fixed: A always drafts;
     self_refine: A plays both; grpo: A drafts alone);
  2. ``rollout.play``: ``num_generations`` drafts per problem, their recaps, one challenge per draft;
  3. rewards from the registry (``rewards.compute_rewards``), each role's rows grouped per problem;
  4. GRPO per role (``grpo.group_advantages`` + ``grpo.policy_loss``) with the role's adapter active; every adapter
     that played a role steps its own optimizer, after a per-adapter gradient clip.

Everything that must survive a restart lives in ``TrainState`` plus the optimizers, the adapters and the RNGs;
``save_checkpoint`` commits all of it atomically (written to a temporary directory, renamed, then ``latest``
rewritten last) and ``load_checkpoint`` restores it. A non-finite gradient skips the update and is counted; too
many in a row abort the run before anything non-finite reaches the weights or a checkpoint.

Left out on purpose: multi-process training (``accelerate``). The recorder is the only writer, so a rank other
than 0 only has to get a disabled recorder.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from agon.cascade import EvalResult, evaluate
from agon.grpo import group_advantages, masked_mean, policy_loss
from agon.health import LearningWatch
from agon.policies import Policies, token_batches
from agon.recorder import Recorder
from agon.rewards import RoleRewards, compute_rewards
from agon.rollout import Attempt, Game, Sampling, play
from agon.tasks import Problem, Task


class TrainingError(RuntimeError):
    """The run cannot go on (too many non-finite steps in a row)."""


@dataclass
class TrainState:
    step: int = 0
    # problems consumed from the shuffled training pool (the data position)
    cursor: int = 0
    generated_tokens: int = 0
    bad_steps: int = 0
    verifier_failures: int = 0
    train_seconds: float = 0.0
    # what LearningWatch reported (kept across a resume, written to summary.json)
    warnings: list[str] = field(default_factory=list)


def roles(method: str, rotation: str, step: int) -> tuple[str, str | bool]:
    """(drafter, challenger) adapters for ``step``; challenger False means no challenge (vanilla GRPO)."""
    if method == "grpo":
        return "A", False
    if method == "self_refine":
        return "A", "A"
    if method == "agon":
        return ("A", "B") if rotation == "fixed" or step % 2 == 0 else ("B", "A")
    raise KeyError(f"method {method!r} does not train")


def adapter_divergence(policies: Policies) -> float:
    """Sum over LoRA modules of ||dW_A - dW_B||_F / (||dW_A||_F + ||dW_B||_F): 0 identical, 1 unrelated or opposed."""
    num = den = 0.0
    with torch.no_grad():
        for module in policies.model.modules():
            if hasattr(module, "lora_A") and "A" in module.lora_A and "B" in module.lora_A:
                d = {n: module.lora_B[n].weight.float() @ module.lora_A[n].weight.float() * module.scaling[n]
                     for n in ("A", "B")}
                num += float((d["A"] - d["B"]).norm())
                den += float(d["A"].norm() + d["B"].norm())
    return num / den if den > 0 else 0.0


class Trainer:
    def __init__(self, cfg: Any, policies: Policies, task: Task, recorder: Recorder, run_dir: Path,
                 log: Callable[[str], None] = print):
        self.cfg, self.t = cfg, cfg.trainer
        self.policies, self.task, self.recorder, self.run_dir, self.log = policies, task, recorder, run_dir, log
        self.state = TrainState()
        self.pool = task.train_problems()
        self._order: list[int] = []
        self._order_epoch: int | None = None
        self.heldout = list(task.heldout_problems())[: cfg.eval.n_problems]
        # one optimizer per adapter (policies.adapter_names: A and B for agon, A alone otherwise)
        self.optimizers = {
            name: torch.optim.AdamW(policies.parameters(name), lr=self.t.learning_rate,
                                    weight_decay=self.t.weight_decay)
            for name in policies.adapters
        }
        self.sampling = Sampling.from_config(self.t)
        self.watch = LearningWatch(self.t.warn_after_steps, self.t.warn_zero_std_ratio, self.t.warn_truncated_ratio,
                                   self.t.max_new_tokens, self.t.num_generations, cfg.task.name)

    # -- data ----------------------------------------------------------------------------------------------------

    def next_problems(self) -> list[Problem]:
        """The next ``prompts_per_step`` problems of a seeded per-epoch shuffle (resumable from ``cursor``)."""
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

    # -- one step ------------------------------------------------------------------------------------------------

    def _role_batch(self, attempts: list[Attempt]) -> dict[str, torch.Tensor]:
        return self.policies.batch_tensors([a.prompt for a in attempts], [a.completion for a in attempts])

    def _micro_batches(self, batch: dict[str, torch.Tensor]) -> list[slice]:
        """Slices of at most ``scoring_batch_tokens`` tokens (and ``micro_batch_size`` rows, when set)."""
        widths = zip(batch["prompt_mask"].sum(1).tolist(), batch["completion_mask"].sum(1).tolist())
        return token_batches(list(widths), self.t.scoring_batch_tokens, self.t.micro_batch_size)

    def _logps(self, adapter: str | None, batch: dict[str, torch.Tensor], parts: list[slice],
               grad: bool) -> list[torch.Tensor]:
        """Per micro-batch log-probs [mb, T] under ``adapter``."""
        with torch.set_grad_enabled(grad), self.policies.use_adapter(adapter):
            return [self.policies.token_logps(batch, part, self.t.temperature, self.t.logit_chunk_tokens)
                    for part in parts]

    def update(self, game: Game, rewards: dict[str, RoleRewards]) -> dict[str, float]:
        """GRPO on every role of ``game``; returns per-role and per-adapter statistics."""
        t, stats = self.t, {}
        played = {"drafter": game.drafter} | ({"challenger": game.challenger} if "challenger" in rewards else {})
        prepared = {}
        for role, adapter in played.items():
            adv = group_advantages(rewards[role].total, game.group_size, t.scale_rewards, t.adv_eps)
            batch = self._role_batch(game.attempts(role))
            device = self.policies.device  # batch tensors stay on the CPU; token_logps moves its slice
            mask, advantages = batch["completion_mask"].float().to(device), adv.advantages.to(device)
            parts = self._micro_batches(batch)
            old = self._logps(adapter, batch, parts, grad=False) if t.num_iterations > 1 else None
            ref = self._logps(None, batch, parts, grad=False) if t.beta != 0 else None
            prepared[role] = (adapter, advantages, batch, mask, parts, old, ref)
            stats[f"role/{role}/frac_reward_zero_std"] = float(adv.zero_std.float().mean())
        for _ in range(t.num_iterations):
            for opt in self.optimizers.values():
                opt.zero_grad(set_to_none=True)
            for role, (adapter, advantages, batch, mask, parts, old, ref) in prepared.items():
                rows = mask.size(0)
                total, clip_lo, clip_hi, kl = 0.0, 0.0, 0.0, 0.0
                with self.policies.use_adapter(adapter):
                    for k, sl in enumerate(parts):
                        logps = self.policies.token_logps(batch, sl, t.temperature, t.logit_chunk_tokens)
                        loss, terms = policy_loss(
                            logps, old[k] if old else logps.detach(), advantages[sl], mask[sl],
                            loss_type=t.loss_type, epsilon=t.epsilon, epsilon_high=t.epsilon_high, beta=t.beta,
                            ref_logps=ref[k] if ref else None, use_bias_correction_kl=t.use_bias_correction_kl,
                            max_completion_length=t.max_new_tokens,
                            num_items_in_batch=float(mask.sum()), batch_rows=rows)
                        loss.backward()
                        share = float(mask[sl].sum() / mask.sum().clamp(min=1))
                        total += loss.item()
                        clip_lo += masked_mean(terms.low_clipped.float(), mask[sl]) * share
                        clip_hi += masked_mean(terms.high_clipped.float(), mask[sl]) * share
                        kl += masked_mean(terms.kl.detach(), mask[sl]) * share if terms.kl is not None else 0.0
                stats |= {f"role/{role}/loss": total, f"role/{role}/clip_ratio/low": clip_lo,
                          f"role/{role}/clip_ratio/high": clip_hi}
                if t.beta != 0:
                    stats[f"role/{role}/kl"] = kl
            norms = {name: float(torch.nn.utils.clip_grad_norm_(self.policies.parameters(name), t.max_grad_norm))
                     for name in self.optimizers if name in played.values()}
            if not all(torch.isfinite(torch.tensor(list(norms.values())))):
                self.state.bad_steps += 1
                self.log(f"[train] step {self.state.step}: non-finite gradient norm {norms}; update skipped")
                if self.state.bad_steps >= t.max_bad_steps:
                    raise TrainingError(f"{self.state.bad_steps} non-finite steps in a row (trainer.max_bad_steps)")
                return stats | {"train/skipped": 1.0}
            for name in norms:
                self.optimizers[name].step()
            self.state.bad_steps = 0
            stats |= {f"adapter/{name}/grad_norm": v for name, v in norms.items()}
        return stats

    def step(self) -> dict[str, Any]:
        t0 = time.time()
        drafter, challenger = roles(self.cfg.method.name, self.cfg.rotation.mode, self.state.step)
        game = play(self.policies, self.task, self.cfg.model, self.next_problems(), drafter=drafter,
                    challenger=challenger, exchange=self.cfg.exchange.mode, group_size=self.t.num_generations,
                    sampling=self.sampling)
        outcome = game.outcome()
        round_rewards = compute_rewards(outcome, self.cfg.reward)
        rewards = {"drafter": round_rewards.drafter}
        if round_rewards.challenger is not None:
            rewards["challenger"] = round_rewards.challenger
        gen_s = time.time() - t0
        stats = self.update(game, rewards)
        metrics = self._metrics(game, rewards, outcome)
        tokens = sum(a.completion.n_tokens for role in rewards for a in game.attempts(role))
        self.state.generated_tokens += tokens
        self.state.step += 1
        step_s = time.time() - t0
        self.state.train_seconds += step_s
        metrics |= stats | {
            "train/drafter": drafter, "train/generated_tokens": self.state.generated_tokens,
            "time/step_s": step_s, "time/generation_s": gen_s, "time/tokens_per_s": tokens / max(gen_s, 1e-9),
        }
        if len(self.policies.adapters) > 1:
            metrics["train/divergence"] = adapter_divergence(self.policies)
        self.recorder.log_metrics(metrics, self.state.step)
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

    def evaluate(self, phase: str) -> EvalResult:
        result = evaluate(self.policies, self.task, self.cfg, self.heldout, self.state.step, phase)
        self.recorder.log_eval_rows(result.rows)
        self.recorder.log_metrics({k: v for k, v in result.metrics.items() if not isinstance(v, list)},
                                  self.state.step)
        game = next(iter(result.games.values()))
        self.recorder.log_rollouts(
            [{"phase": phase, **row} for row in self._eval_sample_rows(game)], self.state.step, mirror=True)
        return result

    def _eval_sample_rows(self, game: Game) -> list[dict[str, Any]]:
        n = self.cfg.logger.table_rows
        return [{"problem_id": r.problem.id, "problem": r.problem.question, "answer": r.problem.answer,
                 "drafter": game.drafter or "base", "draft": r.draft.completion.text, "recap": r.recap,
                 "draft_correct": r.draft.verdict.correct,
                 "challenge": r.challenge.completion.text if r.challenge else None,
                 "challenge_correct": r.challenge.verdict.correct if r.challenge else None}
                for r in game.rounds[:: game.group_size][:n]]

    def train(self, progress: bool = True) -> None:
        from tqdm.auto import tqdm

        bar = tqdm(total=self.t.max_steps, initial=self.state.step, disable=not progress, desc="train",
                   dynamic_ncols=True)
        warned: list[str] = []
        while self.state.step < self.t.max_steps:
            m = self.step()
            for cause, message in self.watch.observe(m, self.state.step):
                warned.append(cause)
                self.state.warnings.append(message)
                bar.write(message) if progress else self.log(message)
            bar.update(1)
            bar.set_postfix(reward=f"{m['role/drafter/reward/mean']:.2f}", acc=f"{m['train/accuracy']:.2f}",
                            tok_s=f"{m['time/tokens_per_s']:.0f}", **({"warn": ",".join(warned)} if warned else {}))
            every = self.cfg.eval.every
            if every and self.state.step % every == 0 and self.state.step < self.t.max_steps:
                self.evaluate("train")
            if self.t.checkpoint_every and self.state.step % self.t.checkpoint_every == 0:
                self.save_checkpoint()
        bar.close()

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Commit ``checkpoints/step_N`` atomically, then point ``checkpoints/latest`` at it, then prune."""
        root = self.run_dir / "checkpoints"
        final = root / f"step_{self.state.step}"
        tmp = root / f".tmp-step_{self.state.step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.policies.save_adapters(tmp)
        torch.save({
            "state": asdict(self.state),
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        }, tmp / "state.pt")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        latest_tmp = root / ".latest.tmp"
        latest_tmp.write_text(final.name)
        os.replace(latest_tmp, root / "latest")
        kept = sorted((p for p in root.glob("step_*")), key=lambda p: int(p.name.split("_")[1]))
        for old in kept[: -self.t.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def resume_latest(self) -> bool:
        """Restore ``checkpoints/latest`` of the run directory if there is one; True when it did."""
        latest = self.run_dir / "checkpoints" / "latest"
        if not latest.exists():
            return False
        name = latest.read_text().strip()
        self.load_checkpoint(self.run_dir / "checkpoints" / name)
        self.log(f"[train] resumed from {name} (step {self.state.step})")
        return True

    def load_checkpoint(self, directory: Path) -> None:
        """Restore adapters, optimizers, RNG and the data position from a committed checkpoint."""
        saved = torch.load(directory / "state.pt", weights_only=False)
        self.policies.load_adapters(directory)
        for k, o in self.optimizers.items():
            o.load_state_dict(saved["optimizers"][k])
        torch.set_rng_state(saved["rng"]["torch"])
        random.setstate(saved["rng"]["python"])
        self.state = TrainState(**saved["state"])
        self.recorder.resume_from(self.state.step)
