"""One rank of the two-process update test (tests/test_distributed.py), started by ``accelerate launch``.

Reads what the test wrote into ``<dir>``: the config, the adapters to start from, and a fixed played game with its
rewards. For each loss type it restores the starting adapters and fresh optimizers, runs ``Trainer.update`` on this
rank's share of the game's rows, and checks that the ranks hold bitwise-identical adapters; rank 0 saves the
adapters it got (``<dir>/<loss_type>.pt``).
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import torch


def main(directory: Path) -> None:
    from agon.core.distributed import Ranks
    from agon.models.loading import load_base
    from agon.models.policies import build_policies
    from agon.records.recorder import Recorder
    from agon.tasks import build_task
    from agon.training.trainer import Trainer

    torch.set_num_threads(1)
    cfg, game, rewards, loss_types = pickle.loads((directory / "inputs.pkl").read_bytes())
    ranks = Ranks.from_env("cpu")
    assert ranks.world == 2, ranks
    model, tokenizer = load_base(cfg.model, cfg.task, log=lambda *_: None)
    policies = build_policies(cfg, model, tokenizer)
    task = build_task(cfg.task)
    share = len(game.rounds) // ranks.world
    rows = slice(ranks.rank * share, (ranks.rank + 1) * share)
    for loss_type in loss_types:
        policies.load_adapters(directory / "start")
        cfg.trainer.loss_type = loss_type
        trainer = Trainer(cfg, policies, task, Recorder(directory / "run", enabled=False), directory / "run",
                          log=lambda *_: None, ranks=ranks)
        stats = trainer.update(game, rewards, rows)
        trainer.adapter_digests()  # raises if the ranks' adapters differ in a single bit
        if ranks.is_main:
            state = {a: policies.lora_state(a) for a in policies.adapters}
            torch.save({"state": state, "stats": stats}, directory / f"{loss_type}.pt")
    ranks.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
