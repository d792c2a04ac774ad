"""Re-evaluate a finished run's saved adapters: ``python -m agon.eval <run dir> [overrides]``.

Loads the run's own composed config (``.hydra/config.yaml``), applies command-line overrides (typically more
problems or samples: ``eval.n_problems=300 eval.samples=8``), loads ``adapters/`` onto the same base, and writes
into ``<run dir>/reeval/``: ``summary.json`` with the same ``eval/*`` keys as training's final evaluation plus the
cross-play matrix, ``eval.jsonl``, and ``crossplay.csv``. The cross-play matrix is the cascade accuracy of every
(drafter, answerer) pair among the run's adapters and the base alone; the diagonal of a single adapter is
self-refinement, and base>base is the untrained mixture of agents.

With ``logger.name=wandb`` (the run's own setting, or an override) the results also go to W&B as a run of the
training run's group, job type ``reeval`` (``agon.wandb_logger.log_reevaluation``).
"""

from __future__ import annotations

import argparse
import csv
import random
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from agon import run_files
from agon.checks import validate
from agon.config import Config, to_plain


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


RECAP_CONDITIONS = ("rival", "rival_right", "rival_wrong", "correct", "wrong", "none")
# under exchange=latent, the same conditions read as key/value prefixes (latent/<challenger>/<condition>)
LATENT_CONDITIONS = RECAP_CONDITIONS


def _mean(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else float("nan")


def wrong_solutions(task, problems, rng: random.Random, tries: int = 10) -> list[str | None]:
    """For each problem, a worked solution with one step wrong whose recap shows the slip, or None where the task
    has no worked solutions or every slip lands past the recap (a two-step chain recaps one step; the slip may hit
    the other)."""
    out: list[str | None] = []
    for p in problems:
        right = task.worked_solution(p)
        found = None
        for _ in range(tries if right is not None else 0):
            candidate = task.worked_solution(p, rng)
            if task.recap(candidate) != task.recap(right):
                found = candidate
                break
        out.append(found)
    return out


def wrong_recaps(task, problems, rng: random.Random, tries: int = 10) -> list[str | None]:
    """For each problem, the recap of ``wrong_solutions``' solution, or None where there is none."""
    return [None if w is None else task.recap(w) for w in wrong_solutions(task, problems, rng, tries)]


def diagnose(policies, task, cfg, problems, engine=None, samples: int | None = None) -> dict[str, float]:
    """Cross-play and the recap diagnostic on ``problems`` x ``samples`` (default ``eval.diagnostic_samples``).

    ``crossplay/<drafter>><answerer>``: the cascade accuracy of every pair among the adapters and the base, with
    the run's exchange (under ``hidden`` the answerer never reads the draft). ``recap/<challenger>/<condition>``:
    the challenger's accuracy on the visible challenge prompt given, per ``RECAP_CONDITIONS``, its rival's recap
    (B's rival is A and A's is B; a single adapter reads its own, the base reads A's; ``rival_right`` and
    ``rival_wrong`` split those rounds by the draft), a correct worked solution's recap, one with a step wrong, or
    an empty recap. Conditions that cannot be formed (no worked solutions, no rival draft of that kind) are NaN;
    ``recap/n_wrong`` counts the problems that got a wrong recap. Drafts are sampled once per drafter and shared by
    every answerer.

    Under ``exchange=latent`` the cross-play answerer reads the drafter's states of ``exchange.span`` (as the run's
    cascade does), the ``recap/*`` keys still probe the text recap on the visible prompt (what a recap's text is
    worth to a challenger, whatever the run exchanges), and ``latent/<challenger>/<condition>`` probe the same
    conditions as prefixes: its rival's drafts' spans under the rival's adapter (``rival``, split by the draft), the
    span of a correct worked solution and of one with a step wrong, each under the rival's adapter (the states that
    adapter would give of that text), and no prefix at all (``none``: the plain prompt). Without ``latent`` there are
    no ``latent/*`` keys: a prefix is then not what the run's challenger reads.
    """
    from agon.engines import HFEngine, Sampling
    from agon.latent import SPANS, Prefixes
    from agon.rollout import latent_prefixes, render, sample_attempts

    engine = engine or HFEngine(policies)
    sampling = Sampling.from_config(cfg.eval)
    rows = [p for p in problems for _ in range(samples or cfg.eval.diagnostic_samples)]
    names: list[str | None] = [*policies.adapters, None]
    plain = [render(policies, task, cfg.model, task.user_message(p)) for p in rows]

    def answers(adapter: str | None, recaps: list[str], rows=rows, visible: bool = True) -> list[bool]:
        prompts = [render(policies, task, cfg.model, task.challenge_message(p, r)) for p, r in zip(rows, recaps)] \
            if visible else plain
        return [a.verdict.correct for a in sample_attempts(engine, task, adapter, rows, prompts, sampling)]

    def after(adapter: str | None, prefixes: Prefixes | None, which: list[int] | None = None) -> list[bool]:
        """The answerer's verdicts on the plain prompts of rows ``which`` (default all), each read after its
        prefix (None: none)."""
        which = list(range(len(rows))) if which is None else which
        return [a.verdict.correct for a in sample_attempts(engine, task, adapter, [rows[i] for i in which],
                                                           [plain[i] for i in which], sampling, prefixes=prefixes)]

    def worked_spans(texts: list[str], which: list[int], adapter: str | None) -> Prefixes:
        """``exchange.span`` of worked solutions written after the plain prompts of rows ``which``, as ``adapter``'s
        prefix (the states that adapter computes of that text)."""
        cut = SPANS.get_or_raise(cfg.exchange.span)
        return Prefixes(adapter, tuple(cut(policies, task, plain[i], policies.completion(
            plain[i], policies.prompt_ids([text])[0])) for i, text in zip(which, texts)))

    drafts = {d: sample_attempts(engine, task, d, rows, plain, sampling) for d in names}
    recaps = {d: [task.recap(a.completion.text) for a in drafts[d]] for d in names}
    visible, latent = cfg.exchange.mode == "visible", cfg.exchange.mode == "latent"
    spans = {d: latent_prefixes(policies, task, drafts[d], d, cfg.exchange.span) for d in names} if latent else {}
    out: dict[str, float] = {}
    played: dict[tuple, list[bool]] = {}
    for d in names:
        for a in names:
            played[d, a] = after(a, spans[d]) if latent else answers(a, recaps[d], visible=visible)
            out[f"crossplay/{d or 'base'}>{a or 'base'}"] = _mean(played[d, a])
    worked = [task.worked_solution(p) for p in rows]
    correct = [task.recap(w) for w in worked] if all(w is not None for w in worked) else None
    wrong_worked = wrong_solutions(task, rows, random.Random(cfg.seed))
    wrong = [None if w is None else task.recap(w) for w in wrong_worked]
    wrong_rows = [i for i, r in enumerate(wrong) if r is not None]
    out["recap/n_wrong"] = float(len(wrong_rows))
    for c in names:
        others = [x for x in policies.adapters if x != c] or list(policies.adapters[:1]) or [None]
        rival = others[0]  # the other adapter; a single adapter reads its own recap; the base reads A's
        got = played[rival, c] if visible else answers(c, recaps[rival])
        right = [a.verdict.correct for a in drafts[rival]]
        key = f"recap/{c or 'base'}"
        out[f"{key}/rival"] = _mean(got)
        out[f"{key}/rival_right"] = _mean([g for g, r in zip(got, right) if r])
        out[f"{key}/rival_wrong"] = _mean([g for g, r in zip(got, right) if not r])
        out[f"{key}/correct"] = _mean(answers(c, correct)) if correct is not None else float("nan")
        out[f"{key}/wrong"] = _mean(answers(c, [wrong[i] for i in wrong_rows], [rows[i] for i in wrong_rows])) \
            if wrong_rows else float("nan")
        out[f"{key}/none"] = _mean(answers(c, [""] * len(rows)))
        if latent:
            key = f"latent/{c or 'base'}"
            got = played[rival, c]
            out[f"{key}/rival"] = _mean(got)
            out[f"{key}/rival_right"] = _mean([g for g, r in zip(got, right) if r])
            out[f"{key}/rival_wrong"] = _mean([g for g, r in zip(got, right) if not r])
            everyone = list(range(len(rows)))
            out[f"{key}/correct"] = _mean(after(c, worked_spans(worked, everyone, rival))) \
                if correct is not None else float("nan")
            out[f"{key}/wrong"] = _mean(after(c, worked_spans([wrong_worked[i] for i in wrong_rows], wrong_rows,
                                                              rival), wrong_rows)) if wrong_rows else float("nan")
            out[f"{key}/none"] = _mean(after(c, None))
    return out


def reevaluate(run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    from agon.cascade import evaluate
    from agon.engines import build_engine
    from agon.policies import build_policies, load_base
    from agon.recorder import JsonlFile
    from agon.run_files import write_json_atomic
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
        from agon.wandb_logger import log_reevaluation

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
