"""One rank of tests/test_rank_randomness.py, started by ``accelerate launch`` (two CPU processes, gloo).

Builds the run's trainer as ``agon.run`` does (``build_trainer``: every rank seeded for its own samples), then on
each rank: an evaluation of one problem written twice (each rank plays one copy, from its chunk's seed); a training
draw; a checkpoint, a draw after it, the checkpoint loaded back and the same draw again. Rank 0 writes what every
rank got to ``<dir>/out.pt``.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import torch


def main(directory: Path) -> None:
    from agon.game.cascade import evaluate
    from agon.core.distributed import Ranks
    from agon.records.recorder import Recorder
    from agon.run import build_trainer

    torch.set_num_threads(1)
    cfg = pickle.loads((directory / "cfg.pkl").read_bytes())
    ranks = Ranks.from_env("cpu")
    assert ranks.world == 2, ranks
    run_dir = directory / "run"
    trainer = build_trainer(cfg, run_dir, Recorder(run_dir, enabled=ranks.is_main), ranks, log=lambda *_: None)
    start = torch.rand(4)  # the first draw after the per-rank seeding
    problem = trainer.heldout[0]
    result = evaluate(trainer.policies, trainer.task, cfg, [problem, problem], 0, "start", ranks)
    game = next(iter(result.games.values()))
    evaluated = [a.completion.token_ids for a in game.attempts("drafter")]  # problem-major: rank 0's, then rank 1's
    trainer.save_checkpoint()
    after = torch.rand(4)
    trainer.load_checkpoint(run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip())
    again = torch.rand(4)
    mine = {"start": start, "after": after, "again": again}
    gathered = ranks.gather(mine)
    if ranks.is_main:
        torch.save({"ranks": gathered, "evaluated": evaluated, "group_size": game.group_size}, directory / "out.pt")
    trainer.engine.close() if hasattr(trainer.engine, "close") else None
    trainer.task.close()
    ranks.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
