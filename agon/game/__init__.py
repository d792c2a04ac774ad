"""The draft-recap-challenge game and its evaluation.

``rollout`` plays one round per problem: a drafter's attempt, its recap, a challenger's attempt that reads the recap
(never the drafter's reasoning or final answer), each graded by the task (``Attempt``, ``Round``, ``Game``).
``cascade`` evaluates adapters on held-out problems in both orders, in committed chunks that a relaunch reuses.
``diagnostic`` is the recap diagnostic and the cross-play matrix. It imports the layers below (engines, models,
tasks, core); the trainer and the entry points import it.
"""
