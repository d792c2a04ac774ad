"""agon: two LoRA adapters on one frozen base model compete in a draft-and-challenge RL game.

Entry points: ``python -m agon.run`` (train and evaluate one config, ``-m`` for a sweep), ``python -m agon.eval``
(re-evaluate a finished run), ``python -m agon.bench`` (Agon against GRPO, agon against TRL). Modules are imported
lazily by the entry points; importing ``agon`` itself loads nothing heavy.
"""

__version__ = "0.1.0"
