"""The frozen base model and its LoRA adapters.

``loading`` loads the base (the offline world, a local path or the hub); ``world`` builds and ships the offline world
itself (a tiny Qwen3-architecture model warm-started on its task); ``policies`` puts the adapters on the base,
switches them with a context manager, samples with transformers' ``generate`` and scores per-token log-probabilities;
``lora`` keeps every LoRA weight float32; ``tokens`` holds completions and cuts batches by token budgets; ``latent``
is the latent exchange's key/value prefixes. It imports ``agon.core``, ``agon.tasks`` and ``agon.families``; never
an engine, the game or the trainer.
"""
