"""Say when a run cannot learn, once per cause, naming the cause and the setting to change.

Three failures leave a GRPO run training on nothing while every number still looks normal: groups whose completions
all got the same reward (their advantages are zero: the task is too hard or too easy for the model, or the group is
too small), completions cut at the token budget (a cut-off answer scores 0 whatever its reasoning; TRL users lost
DeepMath runs when 97-99% of completions hit a 256-token cap), and a sampling engine whose distribution is not the
trainer's (vLLM's log-probs after top-k/top-p against a full softmax: the importance weights fall toward 0 and take
the gradient with them; huggingface/trl#6789). ``LearningWatch`` reads each step's metrics and
returns a warning when one holds for ``after_steps`` steps in a row; prompts that did not fit the model's context
are reported at once. The trainer prints the warning, shows it in the progress line and keeps it in summary.json.

Left out on purpose: stopping the run. A warning costs nothing; a researcher may be watching a deliberate probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# the trainer's metric of the sampler correction's mean weight (grpo.sampler_mismatch), per role
IMPORTANCE = "sampling/importance_sampling_ratio/mean"


@dataclass
class LearningWatch:
    # consecutive steps a condition must hold before it is reported
    after_steps: int = 3
    # share of a role's groups with zero reward spread that counts as no signal (every role must be above it)
    zero_std_ratio: float = 0.9
    # share of a role's completions cut at the budget that counts as truncated
    truncated_ratio: float = 0.9
    # a role's mean sampler importance weight below this counts as the sampler and the trainer apart
    importance_ratio: float = 0.5
    # for the messages: the settings a user would change
    max_new_tokens: int = 0
    num_generations: int = 0
    task: str = ""
    streaks: dict[str, int] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)

    def observe(self, metrics: Mapping[str, Any], step: int) -> list[tuple[str, str]]:
        """(cause, message) for each cause reported for the first time at ``step`` (1-based: steps done)."""
        roles = sorted({k.split("/")[1] for k in metrics if k.startswith("role/") and k.endswith("/accuracy")})
        if not roles:
            return []
        zero = {r: metrics.get(f"role/{r}/frac_reward_zero_std", 0.0) for r in roles}
        cut = {r: metrics.get(f"role/{r}/truncated_ratio", 0.0) for r in roles}
        weight = {r: metrics.get(f"role/{r}/{IMPORTANCE}", 1.0) for r in roles}
        held = {"no_signal": all(v >= self.zero_std_ratio for v in zero.values()),
                "truncated": any(v >= self.truncated_ratio for v in cut.values()),
                "sampler_mismatch": any(v < self.importance_ratio for v in weight.values())}
        out = []
        for cause, now in held.items():
            self.streaks[cause] = self.streaks.get(cause, 0) + 1 if now else 0
            if self.streaks[cause] >= self.after_steps and cause not in self.reported:
                out.append((cause, self._message(cause, metrics, roles, zero, cut, step)))
        limited = {r: metrics.get(f"role/{r}/context_limited", 0) for r in roles}
        if any(limited.values()) and "context" not in self.reported:
            out.append(("context", self._message("context", metrics, roles, zero, cut, step, limited)))
        self.reported |= {cause for cause, _ in out}
        return out

    def _message(self, cause: str, metrics: Mapping[str, Any], roles: list[str], zero: dict, cut: dict,
                 step: int, limited: dict | None = None) -> str:
        span = f"steps {step - self.after_steps + 1}-{step}"
        if cause == "no_signal":
            shares = ", ".join(f"{r} {zero[r]:.0%}" for r in roles)
            accs = ", ".join(f"{r} {metrics[f'role/{r}/accuracy']:.0%}" for r in roles)
            return (f"[agon] the run is not learning ({span}): groups whose completions all got the same reward, so "
                    f"their advantages are 0: {shares} (accuracy: {accs}). The task may be too hard or too easy for "
                    f"this model (task.name={self.task}), or the groups too small "
                    f"(trainer.num_generations={self.num_generations}).")
        if cause == "truncated":
            shares = ", ".join(f"{r} {cut[r]:.0%}" for r in roles)
            return (f"[agon] the run is not learning ({span}): completions cut at trainer.max_new_tokens="
                    f"{self.max_new_tokens} before they finish: {shares}. A cut-off answer scores 0 whatever its "
                    f"reasoning; raise trainer.max_new_tokens (and eval.max_new_tokens).")
        if cause == "sampler_mismatch":
            shares = ", ".join(f"{r} {metrics.get(f'role/{r}/{IMPORTANCE}', 1.0):.2f}" for r in roles)
            return (f"[agon] the run is barely learning ({span}): the mean importance weight of the sampler's "
                    f"tokens under the trainer is {shares} (role/<role>/{IMPORTANCE}), so the update is scaled toward "
                    f"0. The sampling engine and the trainer disagree on the distribution: check that both use the "
                    f"same temperature, top_k and top_p (trainer.*), and the model's dtype (model.dtype); "
                    f"trainer.vllm_importance_sampling_mode=token_truncate bounds each token's weight on its own.")
        counts = ", ".join(f"{r} {n}" for r, n in (limited or {}).items() if n)
        return (f"[agon] step {step}: prompts too long for the model's context with trainer.max_new_tokens="
                f"{self.max_new_tokens} ({counts}); they were sampled with the room left, or not at all when the "
                f"prompt alone filled it (metric role/<role>/context_limited). Lower trainer.max_new_tokens or "
                f"shorten the prompts.")
