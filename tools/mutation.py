"""Mutation testing of the core: change one thing in the code, run the tests that cover it, expect a failure.

Two kinds of mutant, each applied alone to a scratch copy of the tree (the checkout is never touched):

* **named**: hand-written one-line bugs in the wiring between the parts (the ones a reviewer found the suite blind
  to), each an exact ``(file, old text, new text)`` patch that must apply cleanly;
* **operators**: every comparison, arithmetic and boolean operator, ``not``, and small numeric constant in the core
  modules, swapped for its neighbour (``<`` for ``<=``, ``+`` for ``-``, ``and`` for ``or``, ``0`` for ``1``, ...)
  by rewriting the module's syntax tree. ``--sample N`` draws N of them with ``--seed``.

A mutant is *killed* when the tests fail (or time out), and *survives* when they pass. Survivors are listed with
their source line, to be explained (harmless: logging, an equivalent rewrite) or closed with a test.

    python tools/mutation.py --named                     # the named mutants (a few minutes)
    python tools/mutation.py --operators --sample 40     # 40 random operator mutants
    python tools/mutation.py --operators --files agon/run.py analysis/tables.py --sample 10   # of these modules
    python tools/mutation.py --list                      # what would run, without running it

The test world is built once into ``$AGON_TEST_CACHE`` (``.agon-cache/test`` by default) and reused by every
mutant. Results go to ``mutation.json`` (``--out``). Left out on purpose: a mutation library (mutmut rewrites
every function into a trampoline and runs the whole suite per mutant, hours on two cores); these ~100 lines pick
the tests per module and stop at the first failure.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the tests read: the packed results and the pages quoting them (tests/analysis/test_results.py), the sweeper,
# the shipped bases, the tools the tests load (the target-sum gate), the README whose commands tests compose
COPIED = ("agon", "analysis", "conf", "sweeps", "tests", "pyproject.toml", "results", "docs", "hydra_plugins",
          "bases", "tools", "README.md")

# the test files that cover each core module, fastest first (pytest stops at the first failure)
TESTS = {
    "agon/core/grpo.py": ["tests/test_grpo.py", "tests/test_grpo_gradients.py", "tests/test_trainer.py"],
    "agon/core/rewards.py": ["tests/test_rewards.py", "tests/test_rollout.py", "tests/test_trainer.py"],
    "agon/game/rollout.py": ["tests/test_rollout.py", "tests/test_cascade.py", "tests/test_trainer.py",
                             "tests/test_streamed.py"],
    "agon/training/trainer.py": ["tests/test_trainer.py", "tests/test_engines.py", "tests/test_run.py",
                                 "tests/test_distributed.py"],
    "agon/engines/__init__.py": ["tests/test_engines.py", "tests/test_preflight.py"],
    "agon/engines/base.py": ["tests/test_engines.py", "tests/test_rollout.py", "tests/test_streamed.py"],
    "agon/engines/vllm_engine.py": ["tests/test_engines.py", "tests/test_rollout.py"],
    "agon/engines/hf_continuous.py": ["tests/test_engines.py", "tests/test_rollout.py"],
    "agon/tasks/sandbox.py": ["tests/tasks/test_sandbox.py"],
    "agon/training/role_batch.py": ["tests/test_trainer.py", "tests/test_distributed.py"],
    "agon/core/methods.py": ["tests/test_trainer.py", "tests/test_methods.py", "tests/test_run.py"],
    "agon/game/cascade.py": ["tests/test_cascade.py", "tests/test_run.py", "tests/test_streamed.py"],
    "agon/game/diagnostic.py": ["tests/test_eval.py"],
    "agon/models/policies.py": ["tests/test_scoring.py", "tests/test_policies.py", "tests/tasks/test_qwen3_format.py",
                                "tests/test_trainer.py"],
    "agon/models/tokens.py": ["tests/test_role_batch.py", "tests/test_scoring.py", "tests/test_policies.py"],
    "agon/models/lora.py": ["tests/test_policies.py"],
    "agon/models/loading.py": ["tests/test_policies.py", "tests/test_run.py"],
    "agon/core/scoring.py": ["tests/test_scoring_ties.py", "tests/test_scoring.py", "tests/test_trainer.py"],
    "agon/families/__init__.py": ["tests/test_families_every_family.py", "tests/test_families.py"],
    "agon/families/gemma4.py": ["tests/test_families_every_family.py", "tests/test_families.py",
                                "tests/test_smoke_cut.py"],
    "agon/families/qwen3_5.py": ["tests/test_families_every_family.py", "tests/test_families.py",
                                 "tests/test_smoke_cut.py"],
    "agon/models/latent.py": ["tests/test_latent_budgets.py", "tests/test_latent.py"],
    "agon/training/tune.py": ["tests/test_tune_space.py", "tests/test_tune.py"],
    "agon/tasks/target_sum.py": ["tests/test_splits.py", "tests/tasks/test_target_sum.py"],
    "agon/tasks/arithmetic.py": ["tests/test_splits.py", "tests/test_arithmetic.py"],
    "agon/training/health.py": ["tests/test_health.py"],
    "agon/run.py": ["tests/analysis/test_model_labels.py", "tests/test_operator_survivors.py", "tests/test_run.py",
                    "tests/test_resume.py", "tests/test_tune.py"],
    "analysis/load.py": ["tests/analysis/test_model_labels.py", "tests/analysis/test_analysis.py",
                         "tests/analysis/test_results.py", "tests/analysis/test_pack.py"],
    "analysis/tables.py": ["tests/analysis/test_model_labels.py", "tests/analysis/test_analysis.py",
                           "tests/analysis/test_results.py", "tests/analysis/test_pack.py"],
    "analysis/stats.py": ["tests/analysis/test_stats.py", "tests/analysis/test_claims.py",
                          "tests/analysis/test_paired.py"],
    "analysis/claims.py": ["tests/analysis/test_claims.py", "tests/analysis/test_results.py",
                           "tests/analysis/test_paired.py"],
    "analysis/paired.py": ["tests/analysis/test_paired.py"],
    "analysis/patterns.py": ["tests/analysis/test_patterns.py"],
    "analysis/figures.py": ["tests/analysis/test_analysis.py", "tests/analysis/test_pack.py"],
    "analysis/pack.py": ["tests/analysis/test_pack.py"],
    "analysis/callbacks.py": ["tests/analysis/test_analysis.py", "tests/test_sweep.py"],
    # changed since round three, with round four's class tests beside each module's own
    "agon/training/estimate.py": ["tests/test_setting_places.py", "tests/test_estimate.py", "tests/test_memory.py"],
    "agon/training/memory.py": ["tests/test_memory.py", "tests/test_setting_places.py"],
    "agon/training/checks.py": ["tests/test_setting_places.py", "tests/test_gates.py", "tests/test_config.py",
                                "tests/test_sampling_settings.py"],
    "agon/training/preflight.py": ["tests/test_gates.py", "tests/test_setting_places.py", "tests/test_preflight.py",
                                   "tests/test_memory.py"],
    "agon/records/recorder.py": ["tests/test_recorder.py", "tests/test_provenance.py", "tests/test_reuse_keys.py"],
    "agon/tasks/codecontests.py": ["tests/tasks/test_interfaces.py", "tests/tasks/test_codecontests.py",
                                   "tests/test_codecontests_limits.py"],
}


@dataclass
class Mutant:
    id: str
    file: str
    description: str
    # named mutants: exact text replaced once; operator mutants: the index of the operator site in the module
    old: str | None = None
    new: str | None = None
    site: int | None = None
    line: int | None = None
    # the test files to run; null: TESTS[file]
    tests: list[str] | None = None


NAMED = [
    Mutant("conversion_sign", "agon/core/rewards.py", "conversion bonus sign flipped",
           '"conversion": w.conversion_bonus * b * (1 - a)', '"conversion": -w.conversion_bonus * b * (1 - a)'),
    Mutant("visible_empty_recap", "agon/game/rollout.py", "challenger under exchange=visible gets an empty recap",
           "task.challenge_message(matches[m].problems[i], recap)", 'task.challenge_message(matches[m].problems[i], "")'),
    Mutant("rotation_swapped", "agon/core/methods.py", "rotation A/B swapped",
           'return Turn("A", "B") if rotation == "fixed" or step % 2 == 0 else Turn("B", "A")',
           'return Turn("B", "A") if rotation == "fixed" or step % 2 == 0 else Turn("A", "B")'),
    Mutant("tiebreak_drafter_tokens", "agon/game/rollout.py", "length tiebreak compares against the drafter's tokens",
           "correct(challenges), tokens(challenges), fmt(challenges)",
           "correct(challenges), tokens(drafts), fmt(challenges)"),
    Mutant("no_clip", "agon/core/grpo.py", "surrogate loss without the clip",
           "per_token = -torch.min(ratio * adv, clipped * adv)", "per_token = -(ratio * adv)"),
    Mutant("drafter_reward_for_both", "agon/training/role_batch.py",
           "both roles' advantages from the drafter's reward",
           "adv = group_advantages(reward.total,", 'adv = group_advantages(rewards["drafter"].total,'),
    Mutant("conversion_over_right_drafts", "agon/game/cascade.py", "conversion rate over drafts that were right",
           "[float(final) for draft, final in pairs if not draft]",
           "[float(final) for draft, final in pairs if draft]"),
    Mutant("conversion_wrong_given_wrong", "agon/game/cascade.py", "conversion = P(final wrong | draft wrong)",
           "[float(final) for draft, final in pairs if not draft]",
           "[float(not final) for draft, final in pairs if not draft]"),
    Mutant("verifier_failure_zero", "agon/game/rollout.py", "verifier failure scored 0 instead of NaN",
           'float("nan") if a.verdict.failed else', "0.0 if a.verdict.failed else"),
    Mutant("no_grad_clip", "agon/training/trainer.py", "per-adapter gradient clip turned off",
           "clip_grad_norm_(params, self.t.max_grad_norm)", 'clip_grad_norm_(params, float("inf"))'),
    Mutant("headline_first_order", "agon/game/cascade.py", "headline eval/accuracy from the A>B order only",
           "_mean([_accuracy(finals[o]) for o in headline])", "_mean([_accuracy(finals[o]) for o in headline[:1]])"),
    Mutant("resume_no_optimizer", "agon/training/trainer.py", "resume skips restoring the optimizers",
           'o.load_state_dict(saved["optimizers"][k])', "pass"),
    Mutant("resume_no_rng", "agon/training/trainer.py", "resume skips restoring the RNG",
           'torch.set_rng_state(rng["torch"])', "pass"),
    # beyond the review's list: the other places where a wrong wire changes the update silently
    Mutant("dapo_per_micro_batch", "agon/training/trainer.py", "dapo normalised per micro-batch instead of per batch",
           "num_items_in_batch=batch.batch_tokens,", "num_items_in_batch=float(mask.sum()),"),
    Mutant("stale_old_logps", "agon/training/trainer.py", "num_iterations > 1 uses the current policy as the old one",
           "old = logps.detach() if mb.old_logps is None else mb.old_logps.to(device)", "old = logps.detach()"),
    Mutant("kl_to_self", "agon/training/trainer.py", "KL reference taken with the adapter on, not the base",
           "ref_logps=self._logps(b, None)", "ref_logps=self._logps(b, b.adapter)"),
    Mutant("no_nonfinite_skip", "agon/training/trainer.py", "non-finite gradients applied instead of skipped",
           "if not all(torch.isfinite(torch.tensor(list(norms.values())))):", "if False:"),
    Mutant("joint_clip", "agon/training/trainer.py", "one clip over both adapters instead of one per adapter",
           "norms[name] = float(torch.nn.utils.clip_grad_norm_(params, self.t.max_grad_norm))",
           "norms[name] = float(torch.nn.utils.clip_grad_norm_([p for a in adapters for p in "
           "self.policies.parameters(a)], self.t.max_grad_norm))"),
    # several processes: what makes the split update the one-process update (tests/test_distributed.py)
    Mutant("clip_before_rank_sum", "agon/training/trainer.py", "each rank clips its own gradient before the sum",
           "            self.ranks.sum_([p.grad for p in params])\n"
           "            norms[name] = float(torch.nn.utils.clip_grad_norm_(params, self.t.max_grad_norm))",
           "            norms[name] = float(torch.nn.utils.clip_grad_norm_(params, self.t.max_grad_norm))\n"
           "            self.ranks.sum_([p.grad for p in params])"),
    Mutant("rank_local_rows", "agon/training/role_batch.py", "grpo/dr_grpo normalised by this rank's rows",
           "batch_rows=len(attempts),", "batch_rows=len(mine),"),
    Mutant("group_left_started", "agon/run.py", "a finished run exits with its process group started (gloo aborts)",
           "    ranks.close()\n", "    pass\n", tests=["tests/test_distributed_backend.py"]),
    # the real-model path: chunked scoring, token budgets, the model's context, Qwen3's template
    Mutant("scoring_without_temperature", "agon/core/scoring.py", "chunked log-probs ignore the sampling temperature",
           "logits = logits.to(torch.promote_types(logits.dtype, torch.float32)).div_(temperature)",
           "logits = logits.to(torch.promote_types(logits.dtype, torch.float32))"),
    Mutant("generation_budget_ignored", "agon/models/policies.py", "generate calls not bounded by the token budget",
           "for part in token_batches(widths, batch_tokens):", "for part in token_batches(widths, 10**12):"),
    Mutant("context_ignored", "agon/models/policies.py", "prompts sampled past the model's context",
           "return [min(max_new_tokens, self.context - n) for n in prompt_lengths]",
           "return [max_new_tokens for n in prompt_lengths]"),
    Mutant("template_opening_dropped", "agon/models/policies.py", "the template's empty think block left off the turn",
           "self.family.canonical(opening + text)", "self.family.canonical(text)"),
    # sampling engines: the sampler-mismatch correction, and vLLM's copy of the adapters (the vLLM ones are killed
    # only where vLLM runs: make test-vllm's environment, found as the tests find it)
    Mutant("sampler_weights_dropped", "agon/training/trainer.py",
           "the vLLM importance-sampling weights never reach the loss",
           "use_bias_correction_kl=t.use_bias_correction_kl, sampler_weights=weights,",
           "use_bias_correction_kl=t.use_bias_correction_kl, sampler_weights=None,"),
    Mutant("vllm_adapter_never_republished", "agon/engines/vllm_engine.py",
           "vLLM keeps serving the adapters it loaded first",
           "if old is not None and old[0] == revision:", "if old is not None:"),
    Mutant("vllm_temperature_ignored", "agon/engines/vllm_engine.py",
           "vLLM samples at temperature 1 whatever is asked",
           "lora_id=lora_id,\n            temperature=sampling.temperature,",
           "lora_id=lora_id,\n            temperature=1.0,"),
    Mutant("vllm_stops_despite_ignore_eos", "agon/engines/vllm_engine.py",
           "vLLM stops at the end of turn under ignore_eos",
           "stop_token_ids=sorted(self.policies.end_ids), ignore_eos=sampling.ignore_eos,",
           "stop_token_ids=sorted(self.policies.end_ids), ignore_eos=False,"),
    # the sandbox: what isolates one run from the host and from the runs beside it
    Mutant("sandbox_no_seccomp", "agon/tasks/sandbox.py", "programs run without the seccomp filter",
           '"--seccomp", str(seccomp_fd), ', ""),
    Mutant("sandbox_no_cgroup", "agon/tasks/sandbox.py", "the run's processes never join its cgroup",
           "if group is not None:  # the shell joins", "if False:  # the shell joins"),
    Mutant("sandbox_oom_ignored", "agon/tasks/sandbox.py", "an OOM kill that the program survives is graded",
           "if oom:  # the run went over its memory", "if False:  # the run went over its memory"),
    Mutant("sandbox_shared_uid", "agon/tasks/sandbox.py", "every concurrent run shares one uid",
           'f"--reuid={uid}", f"--regid={uid}"', '"--reuid=61000", "--regid=61000"'),
    Mutant("softcap_dropped", "agon/families/__init__.py", "scoring ignores the final logit soft-cap (Gemma 4)",
           'return base.get_decoder(), (lambda h: torch.tanh(head(h) / cap) * cap) if cap else head',
           'return base.get_decoder(), head'),
    Mutant("gemma_thought_kept_visible", "agon/families/gemma4.py",
           "Gemma 4's thought channel is read as visible text",
           '.replace(CHANNEL_CLOSE, THINK_CLOSE)', '.replace(CHANNEL_CLOSE, "")'),
    # keys no test moved before the settings map (tests/test_settings.py)
    Mutant("lora_alpha_ignored", "agon/models/policies.py",
           "model.lora.alpha not applied: the LoRA scale is alpha = 2 x rank whatever the config says (the test wor"
           "ld's own alpha 8 = 2 x 4 hides it)",
           "lora_alpha=lora.alpha,",
           "lora_alpha=2 * lora.rank,",
           tests=[
                 "tests/test_settings.py::test_lora_alpha_scales_the_adapters_output_and_dropout_makes_it_random_in"
                 "_training",
           ]),
    Mutant("max_operand_ignored", "agon/tasks/arithmetic.py",
           "task.max_operand ignored: arithmetic problems always draw operands from 1-9",
           "int(self.cfg.max_operand)",
           "9",
           tests=[
                 "tests/test_settings.py::test_the_arithmetic_task_draws_its_problems_as_its_keys_say",
           ]),
    Mutant("family_not_passed", "agon/models/policies.py",
           "model.family not handed to the run's Policies: every run reads its turns as Qwen3's",
           "cfg.model.gradient_checkpointing, get_family(cfg.model.family))",
           "cfg.model.gradient_checkpointing)",
           tests=[
                 "tests/test_settings.py::test_model_family_is_how_a_run_reads_its_completions",
           ]),
    Mutant("system_prompt_dropped", "agon/game/rollout.py",
           "task.system_prompt never reaches the prompts the roles sample from",
           "system=task.cfg.system_prompt",
           "system=None",
           tests=[
                 "tests/test_settings.py::test_the_task_text_keys_are_the_prompts_each_role_reads",
           ]),
    Mutant("vllm_max_num_seqs_default", "agon/engines/vllm_engine.py",
           "generation.vllm.max_num_seqs not passed: vLLM always gets its default 256",
           "max_num_seqs=v.max_num_seqs",
           "max_num_seqs=256",
           tests=[
                 "tests/test_settings.py::test_the_vllm_keys_are_what_the_worker_is_started_with",
           ]),
    Mutant("table_rows_fixed", "agon/training/trainer.py",
           "logger.table_rows ignored: every evaluation writes 16 rollouts to samples.jsonl",
           "n = self.cfg.logger.table_rows",
           "n = 16",
           tests=[
                 "tests/test_settings.py::test_logger_table_rows_is_how_many_rollouts_an_evaluation_writes_to_sampl"
                 "es_jsonl",
           ]),
    Mutant("warmup_lr_fixed", "agon/models/world.py",
           "model.tiny.warmup_lr ignored: the offline world is always warm-started at 3e-3",
           "lr=tiny.warmup_lr",
           "lr=3e-3",
           tests=[
                 "tests/test_settings.py::test_the_warm_start_follows_its_steps_rate_batch_schedule_and_seed",
           ]),
    # trainer and evaluation keys no test moved before (tests/test_settings_trainer.py)
    Mutant("scale_rewards_ignored", "agon/training/trainer.py",
           "trainer.scale_rewards never reaches the advantages (always divided by the group's std)",
           "rows, t.scale_rewards, t.adv_eps)",
           'rows, "group", t.adv_eps)',
           tests=[
                 "tests/test_settings_trainer.py::test_scale_rewards_and_adv_eps_set_the_advantages_the_gradient_we"
                 "ighs",
           ]),
    Mutant("weight_decay_ignored", "agon/training/trainer.py",
           "the optimizers are built without trainer.weight_decay",
           "weight_decay=self.t.weight_decay)",
           "weight_decay=0.0)",
           tests=[
                 "tests/test_settings_trainer.py::test_weight_decay_shrinks_every_lora_weight_by_lr_times_decay_on_"
                 "top_of_the_same_step",
           ]),
    Mutant("solo_rows_batched_when_scoring_without_grad", "agon/training/trainer.py",
           "Trainer._logps (old and reference log-probs) ignores trainer.solo_row_tokens: long rows padded into sha"
           "red micro-batches",
           "t.micro_batch_size, t.solo_row_tokens)]",
           "t.micro_batch_size, None)]",
           tests=[
                 "tests/test_settings_trainer.py::test_each_scoring_knob_bounds_every_forward_pass_and_leaves_the_u"
                 "pdate_unchanged",
           ]),
    Mutant("eval_at_start_ignored", "agon/run.py",
           "the evaluation before training runs whatever eval.at_start says",
           'start = trainer.evaluate("start").metrics if cfg.eval.at_start else {}',
           'start = trainer.evaluate("start").metrics',
           tests=[
                 "tests/test_settings_trainer.py::test_eval_every_and_at_start_decide_which_evaluations_a_run_writes",
           ]),
    # sampling: each truncation alone, evaluation with its own settings, the sampler correction's bounds
    Mutant("eval_samples_with_trainer_settings", "agon/game/cascade.py",
           "the held-out evaluation samples with trainer.* instead of eval.*",
           "sampling = Sampling.from_config(e)",
           "sampling = Sampling.from_config(cfg.trainer)",
           tests=[
                 "tests/test_sampling_settings.py",
           ]),
    Mutant("diagnostic_samples_with_trainer_settings", "agon/game/diagnostic.py",
           "the cross-play and recap diagnostic samples with trainer.* instead of eval.*",
           "sampling = Sampling.from_config(cfg.eval)",
           "sampling = Sampling.from_config(cfg.trainer)",
           tests=[
                 "tests/test_eval.py",
           ]),
    Mutant("clip_bounds_swapped", "agon/training/trainer.py",
           "the sampler correction's clip_min and clip_max passed swapped",
           "t.vllm_importance_sampling_clip_min,\n                                                 t.vllm_importanc"
           "e_sampling_clip_max)",
           "t.vllm_importance_sampling_clip_max,\n                                                 t.vllm_importanc"
           "e_sampling_clip_min)",
           tests=[
                 "tests/test_engines.py",
           ]),
    Mutant("clip_max_dropped", "agon/training/trainer.py",
           "the sampler correction ignores trainer.vllm_importance_sampling_clip_max",
           "t.vllm_importance_sampling_clip_max)",
           "None)",
           tests=[
                 "tests/test_engines.py",
           ]),
    Mutant("correction_switch_ignored", "agon/training/trainer.py",
           "trainer.vllm_importance_sampling_correction=false still weights the loss",
           "if sampler is not None and t.vllm_importance_sampling_correction:",
           "if sampler is not None:",
           tests=[
                 "tests/test_engines.py",
           ]),
    Mutant("hf_top_p_ignored_without_top_k", "agon/models/policies.py",
           "the hf engine applies top-p only when top-k is set too",
           "how = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)",
           "how = dict(do_sample=True, temperature=temperature, top_p=top_p if top_k else 1.0, top_k=top_k)",
           tests=[
                 "tests/test_engines.py",
           ]),
    Mutant("hf_continuous_top_k_ignored_without_top_p", "agon/engines/hf_continuous.py",
           "the hf_continuous engine applies top-k only when top-p is set too",
           "**(dict(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)",
           "**(dict(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k if sampling.top_p "
           "< 1 else 0)",
           tests=[
                 "tests/test_engines.py",
           ]),
    Mutant("vllm_top_p_ignored_without_top_k", "agon/engines/vllm_engine.py",
           "the vLLM engine applies top-p only when top-k is set too",
           "            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,\n            "
           "stop_token_ids",
           "            temperature=sampling.temperature, top_p=sampling.top_p if sampling.top_k else 1.0, top_k=sa"
           "mpling.top_k,\n            stop_token_ids",
           tests=[
                 "tests/test_engines.py",
           ]),
    # rewards over the truth table, a stage played by the wrong adapter, watch rules with one role apart
    Mutant("reward_format_from_draft", "agon/core/rewards.py",
           "the challenger's format term paid for the draft's format instead of its own",
           '"format": w.format_weight * o.challenge_format,',
           '"format": w.format_weight * o.draft_format,',
           tests=[
                 "tests/test_rewards.py",
           ]),
    Mutant("tiebreak_any_length_difference", "agon/core/rewards.py",
           "the length tiebreak pays a challenge of any other length, longer included",
           "shorter = (o.challenge_tokens < o.draft_tokens).float()",
           "shorter = (o.challenge_tokens != o.draft_tokens).float()",
           tests=[
                 "tests/test_rewards.py",
           ]),
    Mutant("competitive_drafter_paid_team", "agon/core/rewards.py",
           "the competitive drafter is paid the team term (cooperative only by definition)",
           "        }\n    )\n    return RoundRewards(drafter, challenger)",
           '        }\n    )\n    return RoundRewards(RoleRewards(drafter.components | {"team": w.team_weight * b}), challenger)',
           tests=[
                 "tests/test_rewards.py",
           ]),
    Mutant("challenge_played_by_drafter", "agon/game/rollout.py",
           "the challenge stage sampled with the drafter's adapter",
           "return Request(prompt, matches[m].challenger, challenge_seed(m, i))",
           "return Request(prompt, matches[m].drafter, challenge_seed(m, i))",
           tests=[
                 "tests/test_rollout.py",
           ]),
    Mutant("draft_played_by_base", "agon/game/rollout.py",
           "the draft stage sampled with the base model (adapters off) instead of the drafter",
           "return Request(prompt, matches[m].drafter, matches[m].seeds[i])",
           "return Request(prompt, None, matches[m].seeds[i])",
           tests=[
                 "tests/test_rollout.py",
           ]),
    Mutant("health_truncated_needs_every_role", "agon/training/health.py",
           "truncation said only when every role is cut (any -> all)",
           '"truncated": any(v >= self.truncated_ratio for v in cut.values()),',
           '"truncated": all(v >= self.truncated_ratio for v in cut.values()),',
           tests=[
                 "tests/test_health.py",
           ]),
    Mutant("health_no_signal_one_role", "agon/training/health.py",
           "no-signal read from one role (the first in sorted order) instead of every role",
           '"no_signal": all(v >= self.zero_std_ratio for v in zero.values()),',
           '"no_signal": zero[roles[0]] >= self.zero_std_ratio,',
           tests=[
                 "tests/test_health.py",
           ]),
    Mutant("health_weight_at_threshold_counts", "agon/training/health.py",
           "a mean importance weight equal to warn_importance_ratio counts as a mismatch",
           "any(v < self.importance_ratio for v in weight.values())",
           "any(v <= self.importance_ratio for v in weight.values())",
           tests=[
                 "tests/test_health.py",
           ]),
    Mutant("watch_ratios_swapped", "agon/training/trainer.py",
           "the trainer passes warn_truncated_ratio as the zero-spread share and vice versa",
           "LearningWatch(self.t.warn_after_steps, self.t.warn_zero_std_ratio, self.t.warn_truncated_ratio,",
           "LearningWatch(self.t.warn_after_steps, self.t.warn_truncated_ratio, self.t.warn_zero_std_ratio,",
           tests=[
                 "tests/test_health.py",
           ]),
    # resume at the edges
    Mutant("final_eval_logged_twice_on_resume", "agon/training/trainer.py",
           "a run killed during (or after) its final evaluation resumes from its last step's checkpoint without for"
           "getting that evaluation's records, then runs it again: its eval rows, metrics row and samples twice",
           'redone = "final" if self.state.step >= self.t.max_steps else',
           'redone = None if self.state.step >= self.t.max_steps else',
           tests=[
                 "tests/test_resume.py::test_a_run_killed_at_each_edge_and_launched_again_ends_with_the_records_of_"
                 "an_uninterrupted_run_each_once[during-the-final-evaluation]",
           ]),
    Mutant("interim_eval_logged_twice_on_resume", "agon/training/trainer.py",
           "a run stopped during an interim evaluation resumes from the checkpoint before it and runs it again "
           "without forgetting the rows it had written: its eval rows and samples twice",
           'else "train" if self._interim_pending else None',
           "else None",
           tests=[
                 "tests/test_resume.py::test_a_run_killed_at_each_edge_and_launched_again_ends_with_the_records_of_"
                 "an_uninterrupted_run_each_once[during-an-interim-evaluation]",
           ]),
    Mutant("interim_eval_before_its_checkpoint", "agon/training/trainer.py",
           "an interim evaluation runs before its step is checkpointed: stopped during it, a run resumes from an "
           "earlier checkpoint, trains the steps again and, under vLLM, replays every round of the evaluation",
           "if evaluating or self._checkpoint_due():",
           "if self._checkpoint_due():",
           tests=[
                 "tests/test_resume.py::test_a_run_killed_at_each_edge_and_launched_again_ends_with_the_records_of_"
                 "an_uninterrupted_run_each_once[during-an-interim-evaluation]",
           ]),
    Mutant("summary_counts_lost_on_resume", "agon/training/trainer.py",
           "resume restores the step and the data position but not the run's counters: summary.json's generated tok"
           "ens (and verifier failures, train time, warnings) count only the steps after the checkpoint",
           'self.state = TrainState(**saved["state"])',
           'self.state = TrainState(step=saved["state"]["step"], cursor=saved["state"]["cursor"])',
           tests=[
                 "tests/test_resume.py::test_a_run_killed_at_each_edge_and_launched_again_ends_with_the_records_of_"
                 "an_uninterrupted_run_each_once[mid-step]",
           ]),
    Mutant("wall_time_of_the_last_launch_only", "agon/run.py",
           "a resumed run's time/total_s counts only the launch that finished it, not the launches whose work it "
           "kept (the pilot's GRPO run read 1.3 h for 2.2 h of steps)",
           '"time/total_s": trainer.wall_seconds(),',
           '"time/total_s": time.time() - t0,',
           tests=[
                 "tests/test_resume.py::test_a_run_killed_at_each_edge_and_launched_again_ends_with_the_records_of_"
                 "an_uninterrupted_run_each_once[mid-step]",
           ]),
    Mutant("stale_summary_kept_when_records_forgotten", "agon/records/recorder.py",
           "the records are forgotten on resume or start-over but summary.json stays: a run started afresh and kill"
           "ed is then skipped as finished, its records half written",
           "        (self.run_dir / run_files.SUMMARY).unlink(missing_ok=True)\n",
           "",
           tests=[
                 "tests/test_resume.py::test_trainer_resume_never_starts_afresh_leaving_no_summary_or_checkpoint_of"
                 "_the_run_before_to_resume",
           ]),
    Mutant("run_started_afresh_keeps_old_checkpoints", "agon/run.py",
           "a run that starts from step 0 keeps the checkpoints of the run before it: killed before its own first c"
           "heckpoint, it resumes the other run's last step with its records gone",
           "            trainer.discard_checkpoints()\n",
           "",
           tests=[
                 "tests/test_resume.py::test_trainer_resume_never_starts_afresh_leaving_no_summary_or_checkpoint_of"
                 "_the_run_before_to_resume",
           ]),
    # tests that hold on a busy machine (the sandbox's own runs, the Optuna workers); run.py's logger
    Mutant("sandbox_uid_locks_per_process", "agon/tasks/isolation.py",
           "uid slots locked per process: two trainers on one host may run programs as the same uid",
           'fd = os.open(self.lock_dir / f"uid-{self.base + slot}", os.O_RDWR | os.O_CREAT, 0o600)',
           'fd = os.open(self.lock_dir / f"uid-{self.base + slot}-{os.getpid()}", os.O_RDWR | os.O_CREAT, 0o600)',
           tests=[
                 "tests/tasks/test_sandbox.py",
           ]),
    Mutant("sandbox_cgroup_numbers_per_instance", "agon/tasks/sandbox.py",
           "run cgroups numbered per sandbox: two sandboxes of one process running at once collide",
           "self.python, self.network = python, network",
           "self.python, self.network, self._runs = python, network, itertools.count(1)",
           tests=[
                 "tests/tasks/test_sandbox.py",
           ]),
    Mutant("sandbox_outlives_trainer", "agon/tasks/sandbox.py",
           "bwrap no longer dies with its trainer: a killed trainer's runs go on",
           '"--die-with-parent", ',
           "",
           tests=[
                 "tests/tasks/test_sandbox.py",
           ]),
    # the sandbox's second round (tests/tasks/test_sandbox_hostile.py): verdicts, the allow-list, the uid pool
    Mutant('sandbox_verdict_signal_enum', 'agon/tasks/sandbox.py',
           'the verdict names a signal through signal.Signals: a real-time signal makes it raise (an unscored run)',
           'f"killed by {signal_name(-rc)}{pids_note}"',
           'f"killed by {signal.Signals(-rc).name}{pids_note}"',
           tests=['tests/tasks/test_sandbox_hostile.py::test_a_wrong_program_that_ends_itself_with_any_signal_ge'
                 'ts_a_failing_verdict_never_an_unscored_one']),
    Mutant('sandbox_verdict_error_unscored', 'agon/tasks/sandbox.py',
           'an unexpected state after the program started is a sandbox_error again (reward NaN, advantage 0)',
           'res = RunResult("runtime_error" if started else "sandbox_error", None, out.text(), err.text(),',
           'res = RunResult("sandbox_error", None, out.text(), err.text(),',
           tests=['tests/tasks/test_sandbox_hostile.py::test_the_verdict_never_raises_whatever_state_the_run_ends_in']),
    Mutant('seccomp_any_socket_family', 'agon/tasks/isolation.py',
           'sockets of every family (loopback TCP, vsock, netlink) can be made again',
           '(_JEQ, 0, 1, AF_UNIX), allow,',
           '(_JEQ, 0, 0, AF_UNIX), allow,',
           tests=['tests/tasks/test_sandbox_hostile.py::test_only_unix_sockets_can_be_made']),
    Mutant('seccomp_deny_list', 'agon/tasks/isolation.py',
           'what the filter does not name is allowed (a deny-list again)',
           '    prog.append((_RET, 0, 0, _RET_ERRNO | _ENOSYS))',
           '    prog.append(allow)',
           tests=['tests/tasks/test_sandbox_hostile.py::test_calls_off_the_allow_list_do_not_exist_for_a_run']),
    Mutant('seccomp_hugetlb_allowed', 'agon/tasks/isolation.py',
           "huge pages from the host's pool can be mapped",
           'block(numbers[k], [(_LD_ABS, 0, 0, _arg(index)), (_JSET, 0, 1, flag), eperm, allow])',
           'block(numbers[k], [allow])',
           tests=['tests/tasks/test_sandbox_hostile.py::test_huge_pages_are_refused']),
    Mutant('seccomp_aio_allowed', 'agon/tasks/isolation.py',
           'the legacy AIO calls are allowed (a host-wide pool no cgroup counts)',
           '    for numbers in DENIED.values():\n        if numbers[k] is not None:\n            block(numbers'
           '[k], [eperm])',
           '    for name, numbers in DENIED.items():\n        if numbers[k] is not None:\n            block(nu'
           'mbers[k], [allow if name.startswith("io_") else eperm])',
           tests=['tests/tasks/test_sandbox_hostile.py::test_the_legacy_aio_pool_is_refused']),
    Mutant('seccomp_inotify_allowed', 'agon/tasks/isolation.py',
           'inotify and fanotify are allowed',
           '    for numbers in DENIED.values():\n        if numbers[k] is not None:\n            block(numbers'
           '[k], [eperm])',
           '    for name, numbers in DENIED.items():\n        if numbers[k] is not None:\n            block(nu'
           'mbers[k], [allow if "notify" in name else eperm])',
           tests=['tests/tasks/test_sandbox_hostile.py::test_inotify_fanotify_and_dnotify_are_refused']),
    Mutant('seccomp_flock_allowed', 'agon/tasks/isolation.py',
           'flock on shared files is allowed: a channel between concurrent runs',
           '    for numbers in DENIED.values():\n        if numbers[k] is not None:\n            block(numbers'
           '[k], [eperm])',
           '    for name, numbers in DENIED.items():\n        if numbers[k] is not None:\n            block(nu'
           'mbers[k], [allow if name == "flock" else eperm])',
           tests=['tests/tasks/test_sandbox_hostile.py::test_a_copier_learns_nothing_from_a_solver_through_locks'
                 '_on_shared_files']),
    Mutant('seccomp_fcntl_locks_allowed', 'agon/tasks/isolation.py',
           "fcntl's record locks, leases and dnotify are allowed",
           'block(FCNTL[k], fcntl_body + [allow])',
           'block(FCNTL[k], [allow])',
           tests=['tests/tasks/test_sandbox_hostile.py::test_locks_on_shared_files_are_refused_and_other_fcntl_works']),
    Mutant('sandbox_uid_locks_under_tmpdir', 'agon/tasks/sandbox.py',
           "uid locks under the trainer's TMPDIR again: two trainers hand out the same uids",
           'self.slots = UidSlots(uid_base, uid_slots, runs_in_cgroups=self.cgroups is not None)',
           'self.slots = UidSlots(uid_base, uid_slots, Path(self.tmp_root) / "agon-sbx-uids", self.cgroups is '
           'not None)',
           tests=['tests/tasks/test_sandbox_hostile.py::test_a_fork_bomb_beside_another_trainers_runs_does_not_f'
                 'ail_them']),
    Mutant('uid_pool_overlap_unchecked', 'agon/tasks/isolation.py',
           'a uid pool that overlaps an account or a foreign process is accepted',
           '        if clash := foreign_uid_users(range(base, base + size), processes=runs_in_cgroups):',
           '        if clash := []:',
           tests=['tests/tasks/test_sandbox_hostile.py::test_a_pool_that_overlaps_another_user_of_its_uids_is_re'
                 'fused_naming_it']),
    Mutant('sandbox_keyring_inherited', 'agon/tasks/sandbox.py',
           "runs keep the trainer's session keyring",
           'if libc.syscall(keyctl, 1, None) < 0 and ctypes.get_errno() != 38:',
           'if False:',
           tests=['tests/tasks/test_sandbox_hostile.py::test_each_run_gets_an_empty_session_keyring_of_its_own']),
    Mutant('sandbox_usr_local_visible', 'agon/tasks/sandbox.py',
           '/usr/local and /usr/share are bound into every run',
           'whole = {d for d in ("/usr/lib/locale", "/usr/lib64", "/usr/share/zoneinfo")',
           'whole = {d for d in ("/usr/lib/locale", "/usr/lib64", "/usr/share/zoneinfo", "/usr/local", "/usr/share")',
           tests=['tests/tasks/test_sandbox_hostile.py::test_usr_holds_only_what_the_interpreter_needs_and_the_s'
                 'tandard_library_works']),
    Mutant('sandbox_stdin_a_pipe', 'agon/tasks/sandbox.py',
           "the run's stdin file is not made fd 0: the program reads /dev/null, so fstat-sized reads read nothing",
           'os.dup2(_fd, 0)\n',
           '',
           tests=['tests/tasks/test_sandbox_round4.py::test_stdin_is_a_read_only_regular_file_holding_exactly_the_'
                  'input']),
    Mutant('sandbox_cpu_rlimit_at_the_budget', 'agon/tasks/sandbox.py',
           "RLIMIT_CPU at the budget again, though the kernel checks it against tick-sampled time (3-35% ahead)",
           'cpu = math.ceil(req.time_limit_s * CPU_BACKSTOP) + 1 if group is not None else',
           'cpu = max(1, math.ceil(req.time_limit_s)) if group is not None else',
           tests=['tests/tasks/test_sandbox_hostile.py::test_every_process_limit_is_set_by_the_sandbox_not_'
                  'inherited']),
    Mutant('sandbox_pidfd_allowed', 'agon/tasks/isolation.py',
           "pidfd_open allowed again: a pidfd's inode number is pidfs's host-wide sequence, moved by every fork",
           '"seccomp": (317, 277), "pidfd_open": (434, 434),',
           '"seccomp": (317, 277),',
           tests=['tests/tasks/test_sandbox_round4.py::test_pidfs_inode_numbers_a_neighbour_moves_cannot_be_read']),
    Mutant('codecontests_one_problem_at_once', 'agon/tasks/codecontests.py',
           "the completions of one problem graded at the same time again: a copier has its solver beside it",
           'list(self._pool.map(grade, by_problem.values()))',
           'list(self._pool.map(grade, [[i] for rows in by_problem.values() for i in rows]))',
           tests=['tests/tasks/test_codecontests.py::test_programs_for_one_problem_never_run_together_while_other_'
                  'problems_do']),
    Mutant('sandbox_rlimit_inherited', 'agon/tasks/sandbox.py',
           'RLIMIT_SIGPENDING passes through from the trainer',
           '    for lim, (soft, hard) in limits.items():\n        resource.setrlimit(lim, (soft, hard))',
           '    for lim, (soft, hard) in limits.items():\n        if lim != resource.RLIMIT_SIGPENDING: resour'
           'ce.setrlimit(lim, (soft, hard))',
           tests=['tests/tasks/test_sandbox_hostile.py::test_every_process_limit_is_set_by_the_sandbox_not_inherited']),
    Mutant('sandbox_ignored_signals_inherited', 'agon/tasks/sandbox.py',
           'signals the trainer ignores stay ignored in the program',
           '    for sig in signal.valid_signals():\n',
           '    for sig in ():\n',
           tests=['tests/tasks/test_sandbox_hostile.py::test_signals_ignored_or_blocked_by_the_trainer_do_not_pa'
                 'ss_to_the_program']),
    Mutant('sandbox_blocked_signals_inherited', 'agon/tasks/sandbox.py',
           "signals the trainer's thread blocks stay blocked in the program",
           '    signal.pthread_sigmask(signal.SIG_SETMASK, ())\n',
           '',
           tests=['tests/tasks/test_sandbox_hostile.py::test_signals_ignored_or_blocked_by_the_trainer_do_not_pa'
                 'ss_to_the_program']),
    # CodeContests' matcher, exact where the expected output is exact (tests/tasks/test_codecontests.py)
    Mutant('integer_expected_float_fallback', 'agon/tasks/codecontests.py',
           'an integer expected token is compared as a number again (7.0 for 7, 9.98e17 for 998244359987710471)',
           'if not stated and _INTEGER.fullmatch(expected):',
           'if False and _INTEGER.fullmatch(expected):',
           tests=['tests/tasks/test_codecontests.py']),
    Mutant('float_tolerance_binary', 'agon/tasks/codecontests.py',
           'the tolerance decided on doubles instead of exact decimals',
           '    x = Decimal(actual.decode("ascii"), _EXACT)\n    return x.is_finite() and lo <= x <= hi',
           '    x, y = float(expected), float(actual)\n    return abs(x - y) <= float(tol) * max(1.0, abs(x))',
           tests=['tests/tasks/test_codecontests.py']),
    Mutant('tolerance_absolute_only', 'agon/tasks/codecontests.py',
           'the tolerance is absolute only (no relative error for |expected| > 1)',
           'd = _EXACT.multiply(tol, max(Decimal(1), e.copy_abs()))',
           'd = tol',
           tests=['tests/tasks/test_codecontests.py']),
    Mutant('unicode_whitespace_split', 'agon/tasks/codecontests.py',
           "tokens split on Unicode whitespace (str.split) instead of testlib's ASCII whitespace",
           'return text.encode("utf-8", "surrogatepass").split()  # bytes: split at ASCII whitespace only',
           'return [t.encode("utf-8", "surrogatepass") for t in text.split()]',
           tests=['tests/tasks/test_codecontests.py']),
    Mutant("tune_fails_live_workers_trials", "hydra_plugins/agon_optuna_sweeper/optuna_sweeper.py",
           "a starting worker fails every running trial of this host, also those of workers still alive",
           'if name == host and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):',
           "if name == host and pid.isdigit():",
           tests=[
                 "tests/test_tune.py",
           ]),
    Mutant("run_finishes_logger_as_crashed", "agon/run.py",
           "every finished run tells its logger (W&B) it crashed",
           "        exit_code = 0\n",
           "        exit_code = 1\n",
           tests=[
                 "tests/test_operator_survivors.py",
           ]),
    # the game's axes on the training path
    Mutant("exchange_fixed_in_training", "agon/training/trainer.py",
           "training challengers read the recap whatever exchange.mode says",
           "exchange=self.cfg.exchange.mode,",
           'exchange="visible",',
           tests=[
                 "tests/test_trainer.py",
           ]),
    # round three (issue 39): one or more per class of the survivors of a set of one-line bugs in the code added
    # last; each is killed by the test written for its class (docs/testing.md, "Mutation testing")
    # a guard of one model family, tested on every family
    Mutant("gemma_latent_exchange_allowed", "agon/families/gemma4.py",
           "Gemma 4 loses its refusal of exchange=latent (its sliding and KV-sharing layers)",
           'latent_exchange_refused = "its sliding-window', 'latent_exchange_refused = None and "its sliding-window',
           tests=["tests/test_families_every_family.py"]),
    # a value of the model config read at the top level, where a multimodal checkpoint nests it in text_config
    Mutant("context_from_top_level_config", "agon/families/__init__.py",
           "the context length read from the top level of a (multimodal) config: None, so no context check",
           'return getattr(config.get_text_config(), "max_position_embeddings", None)',
           'return getattr(config, "max_position_embeddings", None)',
           tests=["tests/test_families_every_family.py"]),
    Mutant("softcap_from_top_level_config", "agon/families/__init__.py",
           "the final logit soft-cap read from the top level of a (multimodal) config",
           'cap = getattr(base.config.get_text_config(), "final_logit_softcapping", None)',
           'cap = getattr(base.config, "final_logit_softcapping", None)',
           tests=["tests/test_families_every_family.py"]),
    # ties at the top-k boundary (bfloat16 logits tie; random float32 ones never do)
    Mutant("top_k_ties_dropped", "agon/core/scoring.py", "top-k keeps exactly k tokens, dropping ties with the k-th",
           "keep = logits >= top[:, -1:]",
           "keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, torch.topk(logits, top_k, -1).indices, "
           "True)",
           tests=["tests/test_scoring_ties.py"]),
    Mutant("top_p_mass_over_k_only", "agon/core/scoring.py",
           "top-p after top-k renormalises over exactly k tokens, not over the ties top-k kept",
           'ascending = widest.masked_fill(widest < top[:, -1:], float("-inf")).flip(-1)', "ascending = top.flip(-1)",
           tests=["tests/test_scoring_ties.py"]),
    # a loss term whose value is right and whose gradient is not
    Mutant("kl_ratio_detached", "agon/core/grpo.py",
           "the KL's bias-correction ratio detached (value right, gradient not)",
           "kl = kl * ratio", "kl = kl * ratio.detach()", tests=["tests/test_grpo_gradients.py"]),
    Mutant("clip_branch_detached", "agon/core/grpo.py",
           "the clipped branch's ratio detached: the same value, half the gradient where the two branches tie",
           "clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)",
           "clipped = torch.clamp(ratio.detach(), 1 - epsilon, 1 + eps_high)", tests=["tests/test_grpo_gradients.py"]),
    # a context or token budget without the latent prefix
    Mutant("latent_prefix_outside_context", "agon/models/policies.py",
           "a challenger's room in the context computed without its latent prefix",
           "room = self.room([a + b for a, b in zip(before, lengths)], max_new_tokens)",
           "room = self.room(lengths, max_new_tokens)", tests=["tests/test_latent_budgets.py"]),
    # a per-problem limit from the dataset ignored for the config's default
    Mutant("problem_time_limit_ignored", "agon/tasks/codecontests.py",
           "every program graded under task.time_limit_s, not its problem's time limit",
           'time_limit_s=problem.meta.get("time_limit_s", self.cfg.time_limit_s),',
           "time_limit_s=self.cfg.time_limit_s,", tests=["tests/test_codecontests_limits.py"]),
    Mutant("problem_memory_limit_ignored", "agon/tasks/codecontests.py",
           "every program graded under task.memory_mb, not its problem's memory limit",
           'memory_mb=problem.meta.get("memory_mb", self.cfg.memory_mb),',
           "memory_mb=self.cfg.memory_mb,", tests=["tests/test_codecontests_limits.py"]),
    # duplicates inside one split of a generated task
    Mutant("target_sum_repeats_in_split", "agon/tasks/target_sum.py",
           "target sum's draw checks a problem only against the other split: repeats inside a split",
           "if q not in seen:", "if q not in exclude:", tests=["tests/test_splits.py"]),
    Mutant("arithmetic_repeats_in_split", "agon/tasks/arithmetic.py",
           "arithmetic's draw checks a problem only against the other split: repeats inside a split",
           "if expr not in seen:", "if expr not in exclude:", tests=["tests/test_splits.py"]),
    # per-rank randomness (two processes: tests/test_rank_randomness.py)
    Mutant("ranks_seeded_alike", "agon/run.py", "every rank seeded as rank 0 before its first sample",
           "torch.manual_seed(cfg.seed + ranks.rank)", "torch.manual_seed(cfg.seed)",
           tests=["tests/test_rank_randomness.py"]),
    Mutant("journal_torn_tail_kept", "agon/game/cascade.py",
           "a streamed evaluation's journal keeps a record a kill cut short, so rounds appended after it are lost",
           "        if whole < self.path.stat().st_size:\n            os.truncate(self.path, whole)\n",
           "", tests=["tests/test_streamed.py"]),
    Mutant("eval_chunk_seed_rank_0", "agon/game/cascade.py", "every rank plays an evaluation chunk from rank 0's seed",
           "torch.manual_seed(chunk_seed(cfg.seed, phase, step, i, ranks.rank))",
           "torch.manual_seed(chunk_seed(cfg.seed, phase, step, i, 0))", tests=["tests/test_rank_randomness.py"]),
    Mutant("resume_restores_rank_0_rng", "agon/training/trainer.py", "a resumed rank takes rank 0's RNG state",
           "rng = rngs[self.ranks.rank] if self.ranks.rank < len(rngs) else rngs[0]", "rng = rngs[0]",
           tests=["tests/test_rank_randomness.py"]),
    # the order of training problems across epochs
    Mutant("epoch_order_repeats", "agon/training/trainer.py",
           "every epoch shuffles the training pool into the same order",
           "random.Random(self.cfg.seed * 1_000_003 + epoch)", "random.Random(self.cfg.seed * 1_000_003)",
           tests=["tests/test_trainer_epochs.py"]),
    # the Optuna search space's parsing
    Mutant("tune_int_log_dropped", "agon/training/tune.py", "int(low, high, log) parsed as a uniform int distribution",
           "return optuna.distributions.IntDistribution(int(args[0]), int(args[1]), log=log)",
           "return optuna.distributions.IntDistribution(int(args[0]), int(args[1]))",
           tests=["tests/test_tune_space.py"]),
    # which evaluation a resumed run's start-of-run metrics come from
    Mutant("start_metrics_any_evaluation", "agon/run.py",
           "a resumed run's start metrics taken from the first evaluation row, at whatever step",
           'rows = [r for r in rows if r["train/step"] == 0 and "eval/accuracy" in r]',
           'rows = [r for r in rows if "eval/accuracy" in r]', tests=["tests/test_run_start_metrics.py"]),
    # a cut to fewer layers that ignores the family's layer structure (make smoke-real --layers)
    Mutant("qwen3_5_plain_cut", "agon/families/qwen3_5.py",
           "Qwen3.5 cut to any depth: a cut can keep linear-attention layers only, and the cache has no attention layer",
           "return list(range(period, SIZES[size][\"num_hidden_layers\"] + 1, period))",
           "return list(range(1, SIZES[size][\"num_hidden_layers\"] + 1))", tests=["tests/test_smoke_cut.py"]),
    Mutant("gemma4_cut_without_kv_owner", "agon/families/gemma4.py",
           "Gemma 4 cut to one repeat where it shares KV: the reusing layers have no owning layer of their type",
           'first = 2 * period if published["num_kv_shared_layers"] else period', "first = period",
           tests=["tests/test_smoke_cut.py"]),
    # claims: the pooled SD under one run's evaluation noise, and verdicts for claims written after their runs
    Mutant("claims_no_eval_floor", "analysis/claims.py", "the pooled SD is never raised to the evaluation floor",
           "sd = seed_sd if math.isnan(floor) or math.isnan(seed_sd) else max(seed_sd, floor)", "sd = seed_sd"),
    Mutant("claims_after_judged", "analysis/claims.py", "claims written after their runs get verdicts",
           'if row["written"] != "before":', "if False:"),
    # the target-sum base's design (issue 41): the share of challenge rows, and the fixed ramp that makes a scan's
    # checkpoint the base a build makes
    Mutant("warm_start_challenges_ignored", "agon/models/world.py",
           "task.warm_start_challenges ignored: half the warm start's rows are challenges whatever it says",
           "if rng.random() < challenge_share:", "if rng.random() < 0.5:",
           tests=["tests/tasks/test_target_sum.py::test_the_share_of_challenge_rows_is_a_key"]),
    Mutant("warm_start_ramp_unfixed", "agon/models/world.py",
           "model.tiny.warmup_ramp_steps ignored: the ramp is always a twentieth of the warm start",
           "ramp = tiny.warmup_ramp_steps or max(1, tiny.warmup_steps // 20)",
           "ramp = max(1, tiny.warmup_steps // 20)",
           tests=["tests/tasks/test_target_sum_scan.py::"
                  "test_a_saved_checkpoint_is_the_base_a_build_of_that_length_makes"]),
    # the study's within-run outcomes (analysis/paired.py)
    Mutant("paired_unclustered", "analysis/paired.py",
           "cascade minus solo with one cluster per sample: an interval as if a problem's samples were independent",
           'clustered_rate(diff, np.ones(len(rows)), rows["problem_id"])',
           "clustered_rate(diff, np.ones(len(rows)), range(len(rows)))"),
    Mutant("recap_kind_whole_chain", "analysis/paired.py",
           "a draft's recap kind read from its whole chain, not its prefix: every wrong draft a dead end",
           "live(operands, target, signs[:-1])", "live(operands, target, signs)"),
    Mutant("arm_floor_dropped", "analysis/paired.py",
           "an arm's interval over seeds may fall below one run's evaluation SE",
           'max(out["seed_sd"], out["floor"])', 'out["seed_sd"]'),
    Mutant("pattern_chance_off_by_a_sign", "analysis/patterns.py",
           "a pattern's chance counted over 2^n sign patterns, not the 2^(n - 1) a row of n operands has",
           'keys["chance"] = 1 / 2 ** (keys["operands"] - 1)', 'keys["chance"] = 1 / 2 ** keys["operands"]'),
    Mutant("budget_mixed_designs", "analysis/paired.py",
           "arms at equal tokens read off curves that mix the interim design (first 100 problems x 4) with the final "
           "one (300 x 16): GRPO at its final point against Agon between interim points, on other problems",
           'if metric == "eval/accuracy" and not one_design_at(curves.values(), x, at):',
           'if False:'),
]

# round four's mutants, one file per class of blind spot (tools/mutants/<class>.json: the class's tests, the bugs they
# close, each killed by its class's test file)
MUTANT_FILES = sorted((ROOT / "tools" / "mutants").glob("*.json"))
NAMED += [Mutant(**m) for path in MUTANT_FILES for m in json.loads(path.read_text())]

# operator swaps: each site becomes exactly one mutant
SWAPS = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv, ast.And: ast.Or, ast.Or: ast.And,
}
# functions whose mutants can only change printed text or timing, not a result; and analysis/figures.py's drawing,
# which changes only pixels that no test reads (whether a figure is made, its files and its tables are tested)
SKIP_FUNCTIONS = {"_report", "train", "_sample_rows", "_eval_sample_rows", "__init__",
                  "_lighter", "_bars", "_tick", "_setting", "_smooth", "accuracy_figure", "trace_length_figure",
                  "training_curves_figure", "conversion_figure"}


class _Sites(ast.NodeTransformer):
    """Numbers operator sites in visiting order; with ``target`` set, mutates that one site."""

    def __init__(self, target: int | None = None):
        self.count, self.target, self.lines = 0, target, []
        self._skip = 0

    def _site(self, node: ast.AST) -> bool:
        if self._skip:
            return False
        self.count += 1
        self.lines.append(getattr(node, "lineno", 0))
        return self.count - 1 == self.target

    def visit_FunctionDef(self, node):
        skip = node.name in SKIP_FUNCTIONS
        self._skip += skip
        self.generic_visit(node)
        self._skip -= skip
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Expr(self, node):  # docstrings and bare calls: nothing to mutate in a string
        return node if isinstance(node.value, ast.Constant) else self.generic_visit(node)

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if type(node.op) in SWAPS and self._site(node):
            node.op = SWAPS[type(node.op)]()
        return node

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        if self._site(node):
            node.op = SWAPS[type(node.op)]()
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        for i, op in enumerate(node.ops):
            if type(op) in SWAPS and self._site(node):
                node.ops[i] = SWAPS[type(op)]()
        return node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not) and self._site(node):
            return node.operand
        return node

    def visit_Constant(self, node):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)) or node.value not in (0, 1, 2):
            return node
        if self._site(node):
            return ast.copy_location(ast.Constant(value={0: 1, 1: 0, 2: 3}[node.value]), node)
        return node


def operator_mutants(files: list[str] | None = None) -> list[Mutant]:
    """Every operator mutant of the modules in ``TESTS``, or of ``files`` alone (each one of them)."""
    unknown = sorted(set(files or ()) - set(TESTS))
    if unknown:
        raise SystemExit(f"no tests are mapped for {', '.join(unknown)} (tools/mutation.py TESTS)")
    out = []
    for file in files or TESTS:
        source = (ROOT / file).read_text()
        sites = _Sites()
        sites.visit(ast.parse(source))
        lines = source.splitlines()
        for i, line in enumerate(sites.lines):
            out.append(Mutant(f"{Path(file).stem}:{i}", file, lines[line - 1].strip() if line else "", site=i,
                              line=line))
    return out


def mutated_source(m: Mutant, source: str) -> str:
    if m.site is None:
        if source.count(m.old) != 1:  # type: ignore[arg-type]
            raise ValueError(f"mutant {m.id}: the text to replace occurs {source.count(m.old)} times in {m.file}")
        return source.replace(m.old, m.new, 1)  # type: ignore[arg-type]
    tree = _Sites(target=m.site).visit(ast.parse(source))
    return ast.unparse(ast.fix_missing_locations(tree))


def mutated_lines(m: Mutant, source: str) -> str:
    """The changed line, before -> after (both sides unparsed, so only the mutation differs)."""
    if m.site is None:
        return f"{m.old} -> {m.new}"
    before = ast.unparse(ast.parse(source)).splitlines()
    after = mutated_source(m, source).splitlines()
    changed = [(b.strip(), a.strip()) for b, a in zip(before, after) if a != b]
    return "; ".join(f"{b} -> {a}" for b, a in changed) or "(no textual change)"


def _vllm_python() -> Path | None:
    """vLLM's worker interpreter, as the tests would find it from the checkout (the scratch copy has none)."""
    python = Path(os.environ.get("AGON_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")
    return python if python.exists() else None


def _markers() -> str:
    """The fast tests and the long ones (a test left out of make test for its time still guards its module), and the
    vLLM ones where vLLM can run (they fail, not skip, without it)."""
    return "not slow and not gpu" + ("" if _vllm_python() else " and not vllm")


# test files a mutation run never runs, whatever it is asked to: tests/test_mutation_tool.py fails whenever any edit
# touches a line a named mutant patches (its job: keep the patches applicable), so it would "kill" every named
# mutant for a reason that has nothing to do with behaviour
EXCLUDED = ("tests/test_mutation_tool.py",)


def pytest_targets(m: Mutant, tests: list[str] | None = None, exclude: tuple[str, ...] = EXCLUDED) -> list[str]:
    """pytest's arguments naming what to run against ``m``: ``tests`` (e.g. ``["tests"]``, the whole suite) or the
    mutant's own, without the ``exclude`` files, which are also ignored where a folder is named."""
    chosen = [t for t in (tests or m.tests or TESTS[m.file]) if t.partition("::")[0] not in exclude]
    return chosen + [f"--ignore={e}" for e in exclude]


def run_mutant(m: Mutant, scratch: Path, timeout: int, tests: list[str] | None = None,
               exclude: tuple[str, ...] = EXCLUDED) -> dict:
    original = (ROOT / m.file).read_text()
    (scratch / m.file).write_text(mutated_source(m, original))
    env = {**os.environ, "PYTHONPATH": str(scratch), "WANDB_MODE": "disabled"}  # AGON_TEST_CACHE set in main
    if _vllm_python():
        env["AGON_VLLM_PYTHON"] = str(_vllm_python())
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", _markers(),
           *pytest_targets(m, tests, exclude)]
    t0 = time.time()
    try:
        out = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout)
        status = "survived" if out.returncode == 0 else "killed"
        tail = out.stdout.strip().splitlines()[-1:] if out.stdout.strip() else []
        failed = [ln.split(" ")[1] for ln in out.stdout.splitlines() if ln.startswith("FAILED ")]
    except subprocess.TimeoutExpired:
        status, tail, failed = "killed", ["timed out"], []
    finally:
        (scratch / m.file).write_text(original)
    return {**asdict(m), "change": mutated_lines(m, original), "status": status,
            "seconds": round(time.time() - t0, 1), "summary": tail, "caught_by": failed[:3]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--named", action="store_true", help="run the named mutants")
    parser.add_argument("--operators", action="store_true", help="run operator mutants of the core modules")
    parser.add_argument("--sample", type=int, default=0, help="run this many operator mutants, drawn at random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--files", nargs="+", default=None, metavar="FILE",
                        help="operator mutants of these modules only (paths as in TESTS, e.g. agon/run.py)")
    parser.add_argument("--only", nargs="*", default=None, help="mutant ids to run")
    parser.add_argument("--extra", default=None,
                        help="a JSON list of more named mutants ({id, file, description, old, new}), to try a new "
                             "one before it joins NAMED")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per mutant before it counts as killed")
    parser.add_argument("--out", default="mutation.json")
    parser.add_argument("--tests", nargs="+", default=None, metavar="PATH",
                        help="run these tests against every mutant instead of its own (e.g. --tests tests: the "
                             "whole suite)")
    parser.add_argument("--exclude", nargs="*", default=list(EXCLUDED), metavar="PATH",
                        help="test files never run against a mutant (default: tests/test_mutation_tool.py, which "
                             "fails on any edit of a patched line); --exclude with no path runs them all")
    args = parser.parse_args()

    named = NAMED + [Mutant(**m) for m in json.loads(Path(args.extra).read_text())] if args.extra else NAMED
    mutants = named if args.named or not args.operators else []
    if args.operators:
        ops = operator_mutants(args.files)
        mutants = mutants + (random.Random(args.seed).sample(ops, min(args.sample, len(ops))) if args.sample else ops)
    if args.only:  # by id, from either kind
        mutants = list({m.id: m for m in named + operator_mutants() if m.id in set(args.only)}.values())
    for m in mutants:  # fail now, not an hour in, if a named patch no longer applies
        mutated_source(m, (ROOT / m.file).read_text())
    if args.list:
        for m in mutants:
            print(f"{m.id:32} {m.file:20} {mutated_lines(m, (ROOT / m.file).read_text())}")
        print(f"{len(mutants)} mutants")
        return 0

    os.environ.setdefault("AGON_TEST_CACHE", str(ROOT / ".agon-cache" / "test"))
    results = []
    with tempfile.TemporaryDirectory(prefix="agon-mutation-") as tmp:
        scratch = Path(tmp)
        for name in COPIED:
            src = ROOT / name
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, scratch / name)
        for i, m in enumerate(mutants, 1):
            r = run_mutant(m, scratch, args.timeout, args.tests, tuple(args.exclude))
            results.append(r)
            print(f"[{i}/{len(mutants)}] {r['status']:8} {m.id:32} {r['seconds']:6.1f}s  {m.description}"
                  f"{'  <- ' + ', '.join(r['caught_by']) if r['caught_by'] else ''}", flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1))
    survivors = [r for r in results if r["status"] == "survived"]
    print(f"{len(results)} mutants, {len(results) - len(survivors)} killed, {len(survivors)} survived")
    for r in survivors:
        print(f"  survived {r['id']}: {r['file']}:{r['line'] or ''} {r['change']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
