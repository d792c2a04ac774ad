"""Held-out metrics on games built by hand: every number is worked out below, and no two definitions agree.

Four problems x two samples, so eight rounds per game, problem-major (round i is problem i // 2, sample i % 2).
A pattern gives each round's verdict: ``1`` right, ``0`` wrong, ``t``/``e``/``u`` a verifier failure (timeout,
error, unscorable), which scores as wrong. Final-stage tokens are ``base + i`` for round i (a mean of base + 3.5),
drafts ``100 + i`` (mean 103.5).

    order      drafts     finals     final tokens   draft right  final right  conversion   regression
    A>B        1100t001   10110101   20 + i         3/8          5/8          3/5          1/3
    B>A        01110100   110000u0   40 + i         4/8          2/8          1/4          3/4
    A>A        011100e0   10101101   60 + i         3/8          5/8          4/5          2/3
    base>base  10000000   11000001   80 + i         1/8          3/8          2/7          0/1
    A (grpo)   111000t0   -          -              3/8          (the drafts)  -           -

Worked out per order (draft, final) for rounds 0..7:
    A>B   wrong drafts at 2,3,4,5,6 -> finals 1,1,0,1,0: 3 of 5; right drafts at 0,1,7 -> finals 1,0,1: 1 of 3
    B>A   wrong drafts at 0,4,6,7 -> finals 1,0,0,0: 1 of 4; right drafts at 1,2,3,5 -> finals 1,0,0,0: 3 of 4
    A>A   wrong drafts at 0,4,5,6,7 -> finals 1,1,1,0,1: 4 of 5; right drafts at 1,2,3 -> finals 0,1,0: 2 of 3
    base  wrong drafts at 1..7 -> finals 1,0,0,0,0,0,1: 2 of 7; the right draft at 0 -> final 1: 0 of 1

Agon, rotation=alternate pools A>B and B>A: accuracy (5/8 + 2/8) / 2 = 7/16, conversion (3 + 1) / (5 + 4) = 4/9,
regression (1 + 3) / (3 + 4) = 4/7, tokens (23.5 + 43.5) / 2 = 33.5. The wrong definitions give: A>B alone 5/8;
P(final right | draft right) 3/7; P(final wrong | draft wrong) 5/9; per-order means of rates .425 and .542; solo B
from A>B's finals 5/8 (B>A's drafts give 4/8). Verifier failures are the t/e/u marks, each completion once: 2 in
agon's games (the solo rows repeat A>B's drafts, its timeout included, and must not count it again), 1 in A>A's,
1 in grpo's, 0 in base>base's.
"""

from __future__ import annotations

import copy
import math
from dataclasses import astuple

import pytest
import yaml

from agon.game.cascade import EvalResult, agreement, divergence, evaluate, order_name, summarise
from agon.core.methods import Evaluation, get_method
from agon.models.tokens import Completion
from agon.game.rollout import Attempt, Game, Round
from agon.tasks import Problem, Verdict

PROBLEMS = [Problem(f"p{k}", f"{k}+{k}", str(2 * k)) for k in range(4)]
SAMPLES = 2
FAILURES = {"t": "timeout", "e": "error", "u": "unscorable"}

# order -> (drafter, answerer, draft pattern, final pattern, final-token base)
GAMES = {
    "A>B": ("A", "B", "1100t001", "10110101", 20),
    "B>A": ("B", "A", "01110100", "110000u0", 40),
    "A>A": ("A", "A", "011100e0", "10101101", 60),
    "base>base": (None, None, "10000000", "11000001", 80),
    "A": ("A", False, "111000t0", None, None),
}

# the equal-generations reads (methods.Evaluation.reads): order -> (the order whose drafts it answers, final pattern,
# final-token base); A>A after A>B's drafts 1100t001 reads 10101101 (5/8), B>B after B>A's 01110100 reads 01100110
# (4/8), grpo's A>A after its drafts 111000t0 reads 10101101 (5/8)
READS = {"A>A": ("10101101", 60), "B>B": ("01100110", 70)}

# the hand-built drafts box no answer, and no answer agrees with nothing: agreement 0 wherever an adapter drafted
NO_AGREEMENT = {"eval/agree_AB": None, "eval/agree_AA": None, "eval/agree_BB": None, "eval/divergence": None}
ONE_DRAFTER = {**NO_AGREEMENT, "eval/agree_AA": 0.0}
NONE_KEYS = {"eval/cascade_acc_AB": None, "eval/cascade_acc_BA": None, "eval/cascade_acc_AA": None,
             "eval/cascade_acc_BB": None, "eval/solo_acc_A": None, "eval/solo_acc_B": None,
             "eval/solo_acc_base": None}
# the reads answer drafts already counted: agon's verifier failures stay A>B's timeout and B>A's unscorable
AGON = {"eval/n_problems": 4, "eval/samples": 2, "eval/cascade_acc_AB": 5 / 8, "eval/cascade_acc_BA": 2 / 8,
        "eval/cascade_acc_AA": 5 / 8, "eval/cascade_acc_BB": 4 / 8, "eval/generations": 2,
        "eval/solo_acc_A": 3 / 8, "eval/solo_acc_B": 4 / 8, "eval/solo_acc_base": None, "eval/verifier_failures": 2,
        "eval/agree_AB": 0.0, "eval/agree_AA": 0.0, "eval/agree_BB": 0.0, "eval/divergence": 0.0}
# (method, rotation) -> every metric summarise returns
EXPECTED = {
    ("agon", "alternate"): {**AGON, "eval/accuracy": 7 / 16, "eval/final_trace_tokens": 33.5,
                            "eval/conversion_rate": 4 / 9, "eval/regression_rate": 4 / 7,
                            "eval/headline_orders": ["A>B", "B>A"], "eval/accuracy_one_generation": 7 / 16,
                            "eval/accuracy_two_generations": 7 / 16},
    # both orders are still played (and reported), only A>B is the headline
    ("agon", "fixed"): {**AGON, "eval/accuracy": 5 / 8, "eval/final_trace_tokens": 23.5,
                        "eval/conversion_rate": 3 / 5, "eval/regression_rate": 1 / 3, "eval/headline_orders": ["A>B"],
                        "eval/accuracy_one_generation": 3 / 8, "eval/accuracy_two_generations": 5 / 8},
    ("self_refine", None): {**NONE_KEYS, **ONE_DRAFTER, "eval/n_problems": 4, "eval/samples": 2,
                            "eval/solo_acc_A": 3 / 8, "eval/cascade_acc_AA": 5 / 8, "eval/generations": 2,
                            "eval/accuracy_one_generation": 3 / 8, "eval/accuracy_two_generations": 5 / 8,
                            "eval/accuracy": 5 / 8, "eval/final_trace_tokens": 63.5, "eval/conversion_rate": 4 / 5,
                            "eval/regression_rate": 2 / 3, "eval/verifier_failures": 1,
                            "eval/headline_orders": ["A>A"]},
    ("moa", None): {**NONE_KEYS, **NO_AGREEMENT, "eval/n_problems": 4, "eval/samples": 2, "eval/solo_acc_base": 1 / 8,
                    "eval/generations": 2, "eval/accuracy_one_generation": 1 / 8,
                    "eval/accuracy_two_generations": 3 / 8,
                    "eval/accuracy": 3 / 8, "eval/final_trace_tokens": 83.5, "eval/conversion_rate": 2 / 7,
                    "eval/regression_rate": 0.0, "eval/verifier_failures": 0, "eval/headline_orders": ["base>base"]},
    # grpo's answer is the draft: its accuracy and solo A are the same drafts, and there is no cascade rate; at two
    # generations it is its self-cascade, A>A on those very drafts
    ("grpo", None): {**NONE_KEYS, **ONE_DRAFTER, "eval/n_problems": 4, "eval/samples": 2, "eval/solo_acc_A": 3 / 8,
                     "eval/cascade_acc_AA": 5 / 8, "eval/generations": 1, "eval/accuracy_one_generation": 3 / 8,
                     "eval/accuracy_two_generations": 5 / 8,
                     "eval/accuracy": 3 / 8, "eval/final_trace_tokens": 103.5, "eval/conversion_rate": None,
                     "eval/regression_rate": None, "eval/verifier_failures": 1, "eval/headline_orders": ["A"]},
}
# rotation only changes agon's headline
CASES = [(m, r) for m, r in EXPECTED if r] + [(m, r) for m, x in EXPECTED if not x for r in ("alternate", "fixed")]


def _attempt(prompt: str, mark: str, tokens: int) -> Attempt:
    status = {"1": "ok", "0": "wrong"}.get(mark) or FAILURES[mark]
    verdict = Verdict(correct=mark == "1", format_ok=status != "no_answer", status=status, detail=f"marked {mark}")
    return Attempt(prompt, Completion(f"<think>work</think>answer {mark}", tuple(range(tokens)), False), verdict)


def _game(order: str, exchange: str) -> Game:
    """One game as ``rollout.play`` would return it: plain prompt for drafts, recap only under visible exchange."""
    drafter, answerer, drafts, finals, base = GAMES[order]
    rounds = []
    for i, mark in enumerate(drafts):
        problem = PROBLEMS[i // SAMPLES]
        plain, recap = f"user: {problem.question}", f"recap {order} {i}"
        draft = _attempt(plain, mark, 100 + i)
        challenge = None
        if finals is not None:
            prompt = f"user: {problem.question}\nrival: {recap}" if exchange == "visible" else plain
            challenge = _attempt(prompt, finals[i], base + i)
        rounds.append(Round(problem, draft, recap, challenge))
    return Game(rounds, drafter, None if answerer is False else answerer, SAMPLES)


def _read(source: Game, reader: str, exchange: str) -> Game:
    """``source``'s drafts answered again by ``reader`` (``rollout.answer_drafts``), with ``READS``' finals."""
    finals, base = READS[f"{source.drafter}>{reader}"]
    rounds = []
    for i, rnd in enumerate(source.rounds):
        prompt = f"user: {rnd.problem.question}\nrival: {rnd.recap}" if exchange == "visible" else rnd.draft.prompt
        rounds.append(Round(rnd.problem, rnd.draft, rnd.recap, _attempt(prompt, finals[i], base + i)))
    return Game(rounds, source.drafter, reader, SAMPLES)


def _summary(method: str, rotation: str, exchange: str, step: int = 7, phase: str = "final",
             reads: bool = True) -> EvalResult:
    evaluation = get_method(method).evaluation(rotation)
    games = {order_name(d, a): _game(order_name(d, a), exchange) for d, a in evaluation.plays}
    sources = {d: order_name(d, a) for d, a in reversed(evaluation.plays)}
    for drafter, reader in evaluation.reads() if reads else ():
        games[order_name(drafter, reader)] = _read(games[sources[drafter]], reader, exchange)
    return summarise(games, evaluation.headline, step=step, phase=phase)


def _assert_metrics(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    for key, value in expected.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert got[key] == value and type(got[key]) is type(value), key


def marks(rows: list[dict]) -> str:
    """eval.jsonl rows back as a pattern string."""
    return "".join("1" if r["correct"] else {"wrong": "0"}.get(r["status"], r["status"][0]) for r in rows)


@pytest.mark.parametrize("exchange", ["visible", "hidden"])
@pytest.mark.parametrize("method,rotation", CASES)
def test_metrics_of_hand_built_games(method, rotation, exchange):
    expected = EXPECTED.get((method, rotation)) or EXPECTED[(method, None)]
    _assert_metrics(_summary(method, rotation, exchange).metrics, expected)


def test_each_method_evaluates_what_it_deploys():
    assert get_method("agon").evaluation("alternate") == Evaluation([("A", "B"), ("B", "A")], ["A>B", "B>A"])
    assert get_method("agon").evaluation("fixed") == Evaluation([("A", "B"), ("B", "A")], ["A>B"])
    assert get_method("self_refine").evaluation("alternate") == Evaluation([("A", "A")], ["A>A"])
    assert get_method("moa").evaluation("fixed") == Evaluation([(None, None)], ["base>base"])
    assert get_method("grpo").evaluation("alternate") == Evaluation([("A", False)], ["A"])
    assert [order_name(d, a) for d, a in [("A", "B"), (None, None), ("A", False)]] == ["A>B", "base>base", "A"]
    with pytest.raises(KeyError, match="ppo"):
        get_method("ppo")


def test_eval_rows_of_a_cascade():
    result = _summary("agon", "alternate", "visible", step=7, phase="final")
    rows = result.rows
    # per play: 8 rounds x (draft, final) and the drafts again as the drafter alone; per read (A>A, B>B) 8 x (draft,
    # final), its drafts not again: they are the play's
    assert len(rows) == 2 * 8 * 3 + 2 * 8 * 2
    by = {(o, s): [r for r in rows if (r["order"], r["stage"]) == (o, s)]
          for o, s in [("A>B", "draft"), ("A>B", "final"), ("B>A", "draft"), ("B>A", "final"), ("A", "final"),
                       ("B", "final"), ("A>A", "draft"), ("A>A", "final"), ("B>B", "draft"), ("B>B", "final")]}
    assert sum(map(len, by.values())) == len(rows)
    # a self-cascade answers the very drafts of the cross cascade: the same rows, the same drafts
    assert (marks(by["A>A", "draft"]), marks(by["A>A", "final"])) == ("1100t001", "10101101")
    assert (marks(by["B>B", "draft"]), marks(by["B>B", "final"])) == ("01110100", "01100110")
    assert [r["tokens"] for r in by["A>A", "draft"]] == [r["tokens"] for r in by["A>B", "draft"]]

    assert (marks(by["A>B", "draft"]), marks(by["A>B", "final"])) == ("1100t001", "10110101")
    assert (marks(by["B>A", "draft"]), marks(by["B>A", "final"])) == ("01110100", "110000u0")
    # each adapter alone is its own cascade's drafts: A from A>B, B from B>A (not the other cascade's finals)
    assert (marks(by["A", "final"]), marks(by["B", "final"])) == ("1100t001", "01110100")
    for rs in by.values():
        assert [r["problem_id"] for r in rs] == ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3"]
        assert [r["sample"] for r in rs] == [0, 1] * 4
        assert {(r["step"], r["phase"]) for r in rs} == {(7, "final")}
    assert [r["tokens"] for r in by["B>A", "final"]] == list(range(40, 48))
    assert [r["tokens"] for r in by["B", "final"]] == list(range(100, 108))
    assert list(rows[0]) == ["step", "phase", "order", "stage", "problem_id", "sample", "correct", "format_ok",
                             "tokens", "status", "answer"]
    # the rows hold the metrics: headline finals (equal-sized orders) and solo rows give the same numbers
    head = [float(r["correct"]) for o in ("A>B", "B>A") for r in by[o, "final"]]
    assert sum(head) / len(head) == pytest.approx(result.metrics["eval/accuracy"])
    assert sum(r["correct"] for r in by["B", "final"]) / 8 == result.metrics["eval/solo_acc_B"]


def test_eval_rows_of_drafts_only():
    rows = _summary("grpo", "alternate", "hidden", step=0, phase="start", reads=False).rows
    assert [(r["order"], r["stage"]) for r in rows] == [("A", "final")] * 8
    assert marks(rows) == "111000t0"
    assert [r["tokens"] for r in rows] == list(range(100, 108))
    # with its self-cascade: A's drafts once as A alone, then A>A's draft and final stages on those drafts
    rows = _summary("grpo", "alternate", "hidden", step=0, phase="start").rows
    assert [(r["order"], r["stage"]) for r in rows] == [("A", "final")] * 8 + [("A>A", "draft"), ("A>A", "final")] * 8
    assert marks([r for r in rows if r["order"] == "A>A" and r["stage"] == "draft"]) == "111000t0"


def test_summarise_is_pure():
    """The same games give the same result twice, and the games come back unchanged (the trainer logs them)."""
    plays, headline = astuple(get_method("agon").evaluation("alternate"))
    games = {order_name(d, a): _game(order_name(d, a), "visible") for d, a in plays}
    first, second = (summarise(games, headline, step=1, phase="train") for _ in range(2))
    assert first.metrics == second.metrics and first.rows == second.rows
    assert list(first.games) == ["A>B", "B>A"] and all(first.games[o] is games[o] for o in games)


@pytest.mark.parametrize("method,exchange", [("agon", "visible"), ("agon", "hidden"), ("grpo", "visible")])
def test_evaluate_on_a_tiny_model_is_summarise_of_its_games(policies, small_cfg, method, exchange):
    """The real path: evaluate plays the method's pipelines, and its metrics are exactly summarise of those games."""
    from agon.tasks import build_task

    small_cfg.method.name, small_cfg.exchange.mode = method, exchange
    task = build_task(small_cfg.task)
    problems = list(task.heldout_problems())[: small_cfg.eval.n_problems]
    result = evaluate(policies, task, small_cfg, problems, step=3, phase="train")
    evaluation = get_method(method).evaluation(small_cfg.rotation.mode)
    plays, headline = evaluation.plays, evaluation.headline
    reads = {order_name(d, r): order_name(d, next(a for x, a in plays if x == d)) for d, r in evaluation.reads()}
    assert list(result.games) == [order_name(d, a) for d, a in plays] + list(reads) and reads
    # each self-cascade answers the very drafts of its drafter's play, on the same rows: the comparison is paired
    for order, source in reads.items():
        assert [r.draft for r in result.games[order].rounds] == [r.draft for r in result.games[source].rounds]
        assert result.games[order].challenger == order.split(">")[1] == result.games[order].drafter
        assert all(r.challenge is not None for r in result.games[order].rounds)
    assert result.metrics["eval/cascade_acc_AA"] is not None
    again = summarise(result.games, headline, step=3, phase="train")
    assert result.metrics == again.metrics and result.rows == again.rows
    n, k = len(problems), small_cfg.eval.samples
    assert (result.metrics["eval/n_problems"], result.metrics["eval/samples"]) == (n, k) == (3, 2)
    for order, game in result.games.items():
        assert len(game.rounds) == n * k and game.group_size == k
        assert [r.problem.id for r in game.rounds] == [p.id for p in problems for _ in range(k)]
        for r in game.rounds:
            if game.challenger is None and method == "grpo":
                assert r.challenge is None
                continue
            # the second stage saw what training showed it: the recap (visible) or the plain prompt (hidden)
            assert (r.challenge.prompt == r.draft.prompt) == (exchange == "hidden"), order
    # and the headline is what the verdicts in those games say, counted here without summarise
    finals = [[(r.challenge or r.draft).verdict.correct for r in result.games[o].rounds] for o in headline]
    assert result.metrics["eval/accuracy"] == pytest.approx(sum(sum(f) / len(f) for f in finals) / len(finals))
    assert not math.isnan(result.metrics["eval/final_trace_tokens"])
    # eval.equal_generations=false plays the method's pipelines alone, and they draw what they drew with the reads
    small_cfg.eval.equal_generations = False
    alone = evaluate(policies, task, small_cfg, problems, step=3, phase="train")
    assert list(alone.games) == [order_name(d, a) for d, a in plays]
    assert alone.metrics["eval/accuracy"] == result.metrics["eval/accuracy"]
    # without its self-cascade, a one-generation arm has no number at two generations; a cascade is its own
    assert alone.metrics["eval/cascade_acc_AA"] is None
    two = alone.metrics["eval/accuracy_two_generations"]
    assert two == (None if method == "grpo" else alone.metrics["eval/accuracy"])


@pytest.mark.parametrize("method", ["agon", "grpo", "self_refine", "moa"])
def test_every_method_scores_each_drafter_solo_as_a_self_cascade_and_as_the_cross_cascades_on_the_same_rows(
        policies, small_cfg, method):
    """Equal generations, by default: every drafter of every method is scored alone, answering its own recap and
    (two drafters) answering the other's, each on the same problems and samples; a self-cascade and a cross cascade
    answer the very same drafts, so the comparison between them is paired."""
    from agon.tasks import build_task

    small_cfg.method.name = method
    task = build_task(small_cfg.task)
    problems = list(task.heldout_problems())[: small_cfg.eval.n_problems]
    result = evaluate(policies, task, small_cfg, problems, step=0, phase="start")
    games = result.games
    drafters = {order_name(g.drafter, False) for g in games.values()}
    assert drafters == ({"A", "B"} if method == "agon" else {"base"} if method == "moa" else {"A"})
    rows = [(p.id, k) for p in problems for k in range(small_cfg.eval.samples)]

    def keys(game: Game) -> list[tuple[str, int]]:
        return [(r.problem.id, i % game.group_size) for i, r in enumerate(game.rounds)]

    for d in drafters:
        answered = {o: g for o, g in games.items() if order_name(g.drafter, False) == d and g.rounds[0].challenge}
        assert set(answered) == {f"{d}>{a}" for a in drafters}, (d, list(games))
        drafts = {tuple(r.draft for r in g.rounds) for g in answered.values()}
        assert len(drafts) == 1, f"{d}'s cascades answer different drafts"
        assert all(keys(g) == rows for g in answered.values())
        solo = [r for r in result.rows if r["order"] == d and r["stage"] == "final"]
        assert [(r["problem_id"], r["sample"]) for r in solo] == rows, "each draft once as the drafter alone"
    # the numbers at one and two generations are those orders' accuracies
    metrics = result.metrics
    if method == "grpo":
        assert metrics["eval/accuracy_two_generations"] == metrics["eval/cascade_acc_AA"]
        assert metrics["eval/accuracy_one_generation"] == metrics["eval/accuracy"] == metrics["eval/solo_acc_A"]
    elif method == "agon":
        assert metrics["eval/accuracy_two_generations"] == metrics["eval/accuracy"]
        assert metrics["eval/accuracy_one_generation"] == pytest.approx(
            (metrics["eval/solo_acc_A"] + metrics["eval/solo_acc_B"]) / 2)


# two problems x three drafts each; None is a draft with no boxed answer
DRAFTS_A = {"p0": ["3", "3", "4"], "p1": ["7", None, "7"]}
DRAFTS_B = {"p0": ["3", "4", "4"], "p1": ["7", "7", "7"]}


def test_agreement_by_hand():
    """A-A pairs: p0 (3,3) (3,4) (3,4) -> 1/3, p1 (7,-) (7,7) (-,7) -> 1/3; B-B: p0 1/3, p1 1; A-B: p0 4 of 9 pairs,
    p1 6 of 9. The wrong definitions: pooling pairs over problems, counting a draft with itself (A-A 5/9), or two
    missing answers as agreeing."""
    assert agreement(DRAFTS_A) == pytest.approx(1 / 3)
    assert agreement(DRAFTS_B) == pytest.approx(2 / 3)
    assert agreement(DRAFTS_A, DRAFTS_B) == pytest.approx(5 / 9)
    assert agreement(DRAFTS_B, DRAFTS_A) == pytest.approx(5 / 9)
    assert divergence(DRAFTS_A, DRAFTS_B) == pytest.approx(
        {"eval/agree_AB": 5 / 9, "eval/agree_AA": 1 / 3, "eval/agree_BB": 2 / 3, "eval/divergence": 1 / 2 - 5 / 9})
    assert agreement({"p": [None, None]}) == 0.0 and agreement({"p": [None]}, {"p": [None]}) == 0.0
    # one draft per problem has no pair of its own; B absent: no cross pairs
    assert agreement({"p": ["1"]}) is None and agreement(DRAFTS_A, {}) is None
    assert divergence(DRAFTS_A, {})["eval/divergence"] is None


def test_divergence_is_zero_for_one_policy_and_positive_for_two():
    """Drafts of one answer distribution for both adapters give about 0; each adapter with its own favourite
    answer per problem (separate blind spots) gives clearly more."""
    import random

    rng = random.Random(0)
    problems = [f"p{i}" for i in range(400)]
    shared = {p: [rng.choice("0123") for _ in range(8)] for p in problems}
    other = {p: [rng.choice("0123") for _ in range(8)] for p in problems}
    same = divergence(shared, other)["eval/divergence"]
    assert abs(same) < 0.02

    def favourite(answer: str) -> list[str]:
        return [answer if rng.random() < 0.7 else rng.choice("0123") for _ in range(8)]

    a = {p: favourite("0") for p in problems}
    b = {p: favourite("1") for p in problems}
    assert divergence(a, b)["eval/divergence"] > 0.4


def test_summarise_reads_the_boxed_answers_of_the_drafts():
    """Agreement comes from the drafts' boxed answers, by problem; the challenges' answers do not count."""
    rounds = {"A": [], "B": []}
    for adapter, drafts in (("A", DRAFTS_A), ("B", DRAFTS_B)):
        for pid, answers in drafts.items():
            for answer in answers:
                text = "<think>w</think>no box" if answer is None else f"<think>w</think>\\boxed{{{answer}}}"
                draft = Attempt("q", Completion(text, (1,), False), Verdict(True, True))
                challenge = Attempt("q", Completion("<think>w</think>\\boxed{x}", (1,), False), Verdict(True, True))
                rounds[adapter].append(Round(Problem(pid, "q", "1"), draft, "r", challenge))
    games = {"A>B": Game(rounds["A"], "A", "B", 3), "B>A": Game(rounds["B"], "B", "A", 3)}
    metrics = summarise(games, ["A>B", "B>A"], step=0, phase="start").metrics
    assert metrics["eval/divergence"] == pytest.approx(1 / 2 - 5 / 9)
    assert metrics["eval/agree_AB"] == pytest.approx(5 / 9)
    rows = summarise(games, ["A>B", "B>A"], step=0, phase="start").rows
    assert [r["answer"] for r in rows if r["order"] == "A"] == ["3", "3", "4", "7", None, "7"]


def test_the_parts_key_names_what_shapes_the_samples_and_not_the_engines_resources(small_cfg):
    """A committed part is reused across a change of the engine's resources (memory, batch width, start timeout,
    streaming: each row draws from its own seed) and never across a change of what is sampled."""
    from omegaconf import OmegaConf

    from agon.game.cascade import store_key

    def key(*overrides: str) -> str:
        cfg = copy.deepcopy(small_cfg)
        for item in overrides:
            name, value = item.split("=")
            OmegaConf.update(cfg, name, yaml.safe_load(value))
        return store_key("digest", cfg, "start", 0, 3, 2)

    base = key()
    for same in ("generation.vllm.gpu_memory_utilization=0.2", "generation.vllm.max_num_seqs=8",
                 "generation.vllm.start_timeout_s=60", "generation.vllm.cpu_kv_cache_gib=4",
                 "generation.vllm.enforce_eager=true", "generation.stream=false", "generation.allow_slow=true"):
        assert key(same) == base, same
    for other in ("generation.engine=vllm", "generation.vllm.max_model_len=128", "generation.vllm.request_seeds=false",
                  "eval.temperature=0.5", "eval.chunk_problems=2", "seed=1"):
        assert key(other) != base, other
