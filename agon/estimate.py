"""Expected hours of a cell and of a sweep, phase by phase: ``python -m agon.estimate <overrides> [--gpu-check FILE]
[--device H100] [--seeds N]``.

The overrides are a run's (``experiment=paper_deepmath``); a comma list (``exchange=visible,hidden``) makes a sweep
of every combination, as ``agon.run -m`` would. With ``--gpu-check`` the engine's costs come from a GPU check's JSON
(``python -m agon.bench.gpu``, such as ``docs/gpu-h200-2026-12-04.json``) and nothing loads; ``--device`` moves them to
another GPU by its bandwidth. Without it the configured model and engine load here and are probed as a run's
start-up probes them. Every cell is composed and checked first, so a config mistake fails before any model loads,
naming its key. Per cell: each phase (start evaluation, training steps, interim evaluations, final evaluation), one
unit early and late and the phase as planned, two-stage and streamed (the same on an engine that does not stream);
then the cell's and the sweep's hours. The model and its assumptions: ``agon.training.estimate``.

Left out on purpose: Hydra's sweep syntax beyond comma lists (ranges, globs), and launchers: the hours are of one
GPU running one cell at a time, without the minutes a requeued job loses.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from agon.core.config import ConfigError
from agon.engines import EngineError
from agon.models.loading import ModelLoadError
from agon.training import estimate as model

# errors whose message says all a user needs (as agon.run's): printed alone, exit code 1
USER_ERRORS = (ConfigError, ModelLoadError, EngineError)


def cells(overrides: Sequence[str]) -> list[list[str]]:
    """Every combination of the comma lists in ``overrides`` (``key=a,b``), each a cell's overrides."""
    choices = [[f"{key}={v}" for v in value.split(",")] if "," in value and "[" not in value else [item]
               for item in overrides for key, _, value in [item.partition("=")]]
    return [list(c) for c in itertools.product(*choices)]


def _configs(sweep: list[list[str]], probing: bool) -> list[Any]:
    """Each cell composed and checked (a ConfigError names the key), before anything loads; where its engine is to be
    probed here, that engine checked too (installed, or accepted where slow: ``agon.training.preflight``)."""
    from agon.training.checks import check_overrides, compose_config, validate
    from agon.training.preflight import check_engine

    out = []
    for overrides in sweep:
        check_overrides(overrides)
        cfg = compose_config(overrides)
        validate(cfg)
        if probing:
            check_engine(cfg)
        out.append(cfg)
    return out


def _streams(engine: str) -> bool:
    from agon.engines import ENGINES

    return bool(getattr(ENGINES.get(engine), "streams", False))


def _from_check(cfg: Any, data: dict[str, Any], device: str | None, prompt: float, recap: float
                ) -> tuple[model.Costs, float, float]:
    try:
        costs = model.from_gpu_check(data, cfg, cfg.generation.engine, device)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"--gpu-check: {exc}") from None
    return costs, prompt, prompt + recap


def _probed(cfg: Any) -> tuple[model.Costs, float, float]:
    """Load the configured model and engine, as a run does, and probe them."""
    from agon.engines import build_engine
    from agon.models.loading import load_base, load_tokenizer
    from agon.models.policies import build_policies
    from agon.tasks import build_task
    from agon.training.preflight import check_context, check_sources

    check_sources(cfg)
    task = build_task(cfg.task)
    engine = None
    try:
        check_context(cfg, task, *load_tokenizer(cfg.model))
        base, tokenizer = load_base(cfg.model, cfg.task)
        policies = build_policies(cfg, base, tokenizer, task)
        engine = build_engine(cfg, policies)
        problems = list(task.heldout_problems())[: cfg.eval.n_problems] or list(task.train_problems())
        measured = model.probe(cfg, policies, task, engine, problems)
        return measured.costs, measured.prompt, measured.challenge
    finally:
        if engine is not None:
            engine.close()
        task.close()


def _memory(cfg: Any, device: str) -> str:
    """What the run's start-up check (``preflight.check_memory``) says of the update's memory on ``device``."""
    from agon.training.preflight import check_memory

    name, gpu = model.gpu_of(device)
    try:
        return check_memory(cfg, gpu.memory_gib, f"an {name}") or "no published shape: not estimated"
    except ConfigError as exc:
        return f"refused at the start: {exc}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def report(name: str, cfg: Any, costs: model.Costs, prompt: float, challenge: float, early: float,
           late: float) -> tuple[str, float, float]:
    """One cell's table, and its two-stage and streamed seconds."""
    streams = _streams(costs.engine)
    plans = [model.plan(cfg, prompt, challenge, streams=False), model.plan(cfg, prompt, challenge, streams=streams)]
    two, streamed = (model.cell(p, costs, early, late) for p in plans)
    rows = [("phase", "n", "two-stage, one", "two-stage, all", "streamed, one", "streamed, all")]
    for a, b in zip(two, streamed):
        rows.append((a.name, str(a.count), f"{model.duration(a.early_s)} to {model.duration(a.late_s)}",
                     model.duration(a.total_s), f"{model.duration(b.early_s)} to {model.duration(b.late_s)}",
                     model.duration(b.total_s)))
    totals = sum(p.total_s for p in two), sum(p.total_s for p in streamed)
    rows.append(("cell", "", "", _hours(totals[0]), "", _hours(totals[1])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = "\n".join("  " + "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w)
                                       in enumerate(zip(r, widths))) for r in rows)
    note = "" if streams else f" ({costs.engine} does not stream: both columns are its two stages)"
    head = (f"{name}: engine {costs.engine}, {costs.source}\n  completions {early:g} of the budget early, {late:g} "
            f"late, falling over the first {model.SETTLE:g} of the steps; prompts {prompt:.0f} tokens, challenges "
            f"{plans[0].challenge:.0f}{note}")
    return f"{head}\n{table}", *totals


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agon.estimate", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="a run's config overrides; a comma list sweeps its values")
    parser.add_argument("--gpu-check", type=Path, help="a GPU check's JSON: its numbers, no model loaded")
    parser.add_argument("--device", help=f"the GPU to plan on, one of {', '.join(model.GPUS)} (default: the "
                                         "check's)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds of every cell (the sweep's runs: cells x seeds)")
    parser.add_argument("--early-fraction", type=float, default=1.0,
                        help="mean completion as a share of the budget early (default 1: every one to its budget)")
    parser.add_argument("--late-fraction", type=float, default=model.LATE_FRACTION,
                        help="mean completion as a share of the budget late (Agon's paper traces 0.21, GRPO's 0.49)")
    parser.add_argument("--prompt-tokens", type=float, default=256,
                        help="with --gpu-check: a prompt's tokens (nothing is tokenized)")
    parser.add_argument("--recap-tokens", type=float, default=256,
                        help="with --gpu-check: a recap's tokens, in the challenge's prompt")
    args = parser.parse_intermixed_args(argv)
    try:
        if args.device is not None:
            try:
                model.gpu_of(args.device)
            except ValueError as exc:
                raise ConfigError(f"--device={args.device}: {exc}") from None
        for key in ("early_fraction", "late_fraction"):
            if not 0 < getattr(args, key) <= 1:
                raise ConfigError(f"--{key.replace('_', '-')}={getattr(args, key)}: a share of the budget, in (0, 1]")
        if args.seeds < 1:
            raise ConfigError(f"--seeds={args.seeds}: at least 1")
        data = None
        if args.gpu_check is not None:
            try:
                data = json.loads(args.gpu_check.read_text())
                if not model.check_reports(data)[0]["device"]:
                    raise KeyError("device")
            except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
                raise ConfigError(f"--gpu-check={args.gpu_check}: not a GPU check's JSON ({exc})") from None
        elif args.device is not None:
            raise ConfigError("--device moves a GPU check's numbers: give --gpu-check FILE too")
        sweep = cells(args.overrides)
        configs = _configs(sweep, probing=data is None)
        probed: dict[str, tuple[model.Costs, float, float]] = {}
        total = [0.0, 0.0]
        for overrides, cfg in zip(sweep, configs):
            if data is not None:
                costs, prompt, challenge = _from_check(cfg, data, args.device, args.prompt_tokens, args.recap_tokens)
            else:  # one probe per model, task and engine
                key = json.dumps([str(cfg.model), str(cfg.task), str(cfg.generation)])
                probed[key] = probed.get(key) or _probed(cfg)
                costs, prompt, challenge = probed[key]
            text, two, streamed = report(" ".join(overrides) or "(defaults)", cfg, costs, prompt, challenge,
                                         args.early_fraction, args.late_fraction)
            if data is not None:  # the card is known: whether the update fits it beside vLLM's share
                text += "\n  memory: " + _memory(cfg, args.device or model.check_reports(data)[0]["device"])
            print(text + "\n")
            total[0] += two * args.seeds
            total[1] += streamed * args.seeds
        runs = len(sweep) * args.seeds
        print(f"sweep: {len(sweep)} cell{'s' * (len(sweep) > 1)} x {args.seeds} seed{'s' * (args.seeds > 1)} = {runs} "
              f"run{'s' * (runs > 1)}: {_hours(total[0])} two-stage, {_hours(total[1])} streamed, one GPU per run")
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
