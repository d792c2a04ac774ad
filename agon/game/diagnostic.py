"""The recap diagnostic and cross-play: how each adapter answers after recaps of known quality.

``diagnose`` asks every adapter (and the base) to answer held-out problems after a rival's recap, a correct recap, a
recap with one known slip (``wrong_recaps``: a worked solution with one step wrong, where the task can make one) and
no recap at all, and plays every (drafter, answerer) pair among them (the cross-play matrix). The check battery
asks them again after each kind of recap the task makes with a known defect (``check_battery``), so that a rise
after a right recap can be told from checking: a challenger that checks loses little after a wrong step or a dead
end, one that completes whatever it reads loses most there. The trainer runs it at
the end of a run (``eval.diagnostic``), ``agon-eval`` on a finished run's saved adapters. Left out on purpose:
loading runs and writing files (``agon.eval``).
"""

from __future__ import annotations

import random
from typing import Any

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


def check_battery(task, rows, solutions: list[str | None], rng: random.Random) -> list[dict[str, Any]]:
    """Each row's check battery (``Task.recap_battery``: a recap of each of ``BATTERY_KINDS`` with a known defect,
    None where the task cannot make it) from its right solution; every kind None where the row has none."""
    from agon.tasks import BATTERY_KINDS

    return [dict.fromkeys(BATTERY_KINDS) if s is None else task.recap_battery(p, s, rng)
            for p, s in zip(rows, solutions)]


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

    The check battery: ``battery/<answerer>/<kind>`` is every adapter's and the base's accuracy on the visible
    challenge prompt after a recap of each kind of ``agon.tasks.BATTERY_KINDS`` (a right prefix, a recap that shows
    a wrong step, a dead end, an empty recap), made by the task (``Task.recap_battery``) from the row's worked
    solution or, where the task has none (DeepMath, CodeContests), from a right draft of this diagnostic's;
    ``battery/n/<kind>`` counts the rows the kind was made for (NaN accuracies where none). It samples after every
    other key, so it leaves their draws as they were without it.

    Under ``exchange=latent`` the cross-play answerer reads the drafter's states of ``exchange.span`` (as the run's
    cascade does), the ``recap/*`` keys still probe the text recap on the visible prompt (what a recap's text is
    worth to a challenger, whatever the run exchanges), and ``latent/<challenger>/<condition>`` probe the same
    conditions as prefixes: its rival's drafts' spans under the rival's adapter (``rival``, split by the draft), the
    span of a correct worked solution and of one with a step wrong, each under the rival's adapter (the states that
    adapter would give of that text), and no prefix at all (``none``: the plain prompt). Without ``latent`` there are
    no ``latent/*`` keys: a prefix is then not what the run's challenger reads.
    """
    from agon.engines import Sampling
    from agon.engines.hf import HFEngine
    from agon.models.latent import SPANS, Prefixes
    from agon.game.rollout import derive_seed, latent_prefixes, render, sample_attempts
    from agon.tasks import BATTERY_KINDS

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
    # last: what it samples comes after every draw of the keys above, which stay as they were without it
    solutions = [w if w is not None else next((drafts[d][i].completion.text for d in names
                                               if drafts[d][i].verdict.correct), None) for i, w in enumerate(worked)]
    battery = check_battery(task, rows, solutions, random.Random(derive_seed(cfg.seed, "battery")))
    for kind in BATTERY_KINDS:
        made = [i for i, b in enumerate(battery) if b[kind] is not None]
        out[f"battery/n/{kind}"] = float(len(made))
        for c in names:
            out[f"battery/{c or 'base'}/{kind}"] = _mean(answers(
                c, [battery[i][kind].recap for i in made], [rows[i] for i in made])) if made else float("nan")
    return out

