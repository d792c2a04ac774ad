"""Re-evaluate a finished run's saved adapters: ``python -m agon.eval <run dir> [overrides]``.

Loads the run's own composed config (``.hydra/config.yaml``), applies command-line overrides (typically more
problems or samples: ``eval.n_problems=300 eval.samples=8``), loads ``adapters/`` onto the same base, and writes
into ``<run dir>/reeval/``: ``summary.json`` with the same ``eval/*`` keys as training's final evaluation plus the
cross-play matrix, ``eval.jsonl``, and ``crossplay.csv``. The cross-play matrix is the cascade accuracy of every
(drafter, answerer) pair among the run's adapters and the base alone; the diagonal of a single adapter is
self-refinement, and base>base is the untrained mixture of agents.

With ``logger.name=wandb`` (the run's own setting, or an override) the results also go to W&B as a run of the
training run's group, job type ``reeval`` (``agon.records.wandb_logger.log_reevaluation``).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from agon.records import run_files
from agon.training.checks import validate
from agon.core.config import Config, to_plain


def load_run_config(run_dir: Path, overrides: list[str]) -> Any:
    saved = run_dir / run_files.CONFIG
    if not saved.exists():
        raise FileNotFoundError(f"{saved} not found: is {run_dir} a run directory written by agon.run?")
    loaded = OmegaConf.load(saved)
    # runs saved before generation was bounded by tokens had a row count here; the token budget's default applies
    if "batch_size" in loaded.get("eval", {}):
        del loaded.eval["batch_size"]
    cfg = OmegaConf.merge(OmegaConf.structured(Config), loaded)
    for item in overrides:
        key, _, value = item.partition("=")
        if not _:
            raise ValueError(f"override {item!r} is not key=value")
        if OmegaConf.select(cfg, key, default="__missing__") == "__missing__":
            raise KeyError(f"unknown config key {key!r}")
        OmegaConf.update(cfg, key, OmegaConf.create({"v": value}).v if value else value, merge=True)
    validate(cfg)
    return cfg



def reevaluate(run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    from agon.game.cascade import evaluate
    from agon.game.diagnostic import diagnose
    from agon.engines import build_engine
    from agon.models.loading import load_base
    from agon.models.policies import build_policies
    from agon.records.recorder import JsonlFile
    from agon.records.run_files import write_json_atomic
    from agon.tasks import build_task

    cfg = load_run_config(run_dir, overrides)
    t0 = time.time()
    task, engine = build_task(cfg.task), None
    try:
        model, tokenizer = load_base(cfg.model, cfg.task)
        policies = build_policies(cfg, model, tokenizer)
        policies.load_adapters(run_dir / run_files.ADAPTERS)
        engine = build_engine(cfg, policies)
        problems = list(task.heldout_problems())[: cfg.eval.n_problems]
        result = evaluate(policies, task, cfg, problems, step=-1, phase="reeval", engine=engine,
                          progress=cfg.progress)
        diagnostic = diagnose(policies, task, cfg, problems, engine, samples=cfg.eval.samples)
    finally:
        task.close()
        if engine is not None:
            engine.close()
    out = run_dir / run_files.REEVAL
    out.mkdir(exist_ok=True)
    rows = JsonlFile(out / run_files.EVAL)
    rows.write(result.rows)
    rows.close()
    matrix = {tuple(k.split("/", 1)[1].split(">")): v for k, v in diagnostic.items() if k.startswith("crossplay/")}
    names = sorted({d for d, _ in matrix}, key=lambda n: (n == "base", n))
    with open(out / "crossplay.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["drafter \\ answerer", *names])
        for d in names:
            writer.writerow([d, *(f"{matrix[(d, a)]:.4f}" for a in names)])
    summary = {**result.metrics, **diagnostic, "crossplay": {f"{d}>{a}": v for (d, a), v in matrix.items()},
               "time/total_s": time.time() - t0, "config": to_plain(cfg)}
    write_json_atomic(out / run_files.SUMMARY, summary)
    if cfg.logger.name == "wandb":  # the run's own logger, or logger.name=wandb on the command line
        from agon.records.wandb_logger import log_reevaluation

        log_reevaluation(cfg, run_dir, summary)
    print(f"[agon.eval] {run_dir}: eval/accuracy {summary['eval/accuracy']:.3f} on {len(problems)} problems x "
          f"{cfg.eval.samples} samples")
    print("cross-play (rows draft, columns answer):")
    print("          " + "".join(f"{a:>8}" for a in names))
    for d in names:
        print(f"{d:>10}" + "".join(f"{matrix[(d, a)]:8.3f}" for a in names))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agon.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory written by python -m agon.run")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. eval.n_problems=300 eval.samples=8")
    args = parser.parse_args(argv)
    reevaluate(args.run_dir, args.overrides)


if __name__ == "__main__":
    main()
