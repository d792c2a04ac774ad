"""Training and its checks.

``trainer`` is the step loop (rollout, rewards, one update per adapter, evaluations, checkpoints); ``role_batch``
turns a step's games into each role's batch of rows and advantages; ``estimate`` times a probe step and prints what a
run will cost before its first step; ``health`` watches the step metrics for a run that stopped learning. The checks
before any model loads live here too, since they read every registry below: ``checks`` (the composed config: names,
ranges, pairs that cannot work together, each naming its key) and ``preflight`` (what needs the tokenizer or the
data: prompts that do not fit the context, an engine that is not installed). ``tune`` is the Optuna search's side in
a trial. It imports every layer below; only the entry points import it.
"""
