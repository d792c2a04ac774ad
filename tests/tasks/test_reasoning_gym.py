"""reasoning-gym by name: loading, the held-out split, boxed answers, exact-1.0 scoring, counted scorer errors."""

from __future__ import annotations

import pytest

from agon.tasks import build_task
from agon.tasks.reasoning_gym import ReasoningGymTask

# every character of the default basic_arithmetic questions and answers (what the tiny tokenizer must cover)
BASIC_ARITHMETIC_CHARS = set("Calculate") | set(" .+-0123456789")


@pytest.fixture
def make(compose_task):
    def make(*overrides: str) -> ReasoningGymTask:
        task = build_task(compose_task("reasoning_gym", "train_size=300", "heldout_size=40", *overrides))
        assert isinstance(task, ReasoningGymTask)
        return task

    return make


def boxed(answer: str) -> str:
    return f"<think>work</think>{answer}\\boxed{{{answer}}}"


def test_yaml_defaults(compose_task):
    cfg = compose_task("reasoning_gym")
    got = (cfg.kind, cfg.name, cfg.heldout_size, dict(cfg.dataset_args))
    assert got == ("reasoning_gym", "basic_arithmetic", 300, {})
    assert cfg.instruction == "" and "{recap}" in cfg.challenge_template


def test_basic_arithmetic_loads_and_splits(make):
    t = make()
    train, held = t.train_problems(), t.heldout_problems()
    assert len(held) == 40 and 250 <= len(train) <= 300
    assert not {p.question for p in train} & {p.question for p in held}
    assert len({p.id for p in [*train, *held]}) == len(train) + len(held)
    # deterministic: the same config gives the same problems
    again = make()
    assert [p.question for p in again.heldout_problems()] == [p.question for p in held]
    assert [p.question for p in again.train_problems()[:20]] == [p.question for p in train[:20]]
    # compact prompts for the tiny model: the preset keeps questions short and within a small alphabet
    chars = set()
    for p in [*train, *held]:
        chars |= set(t.user_message(p)) | set(p.answer)
        assert p.question.startswith("Calculate ") and len(p.question) <= 32
    assert chars <= BASIC_ARITHMETIC_CHARS, sorted(chars - BASIC_ARITHMETIC_CHARS)


def test_exact_score_required(make):
    t = make()
    p = next(p for p in t.heldout_problems() if len(p.answer) >= 2)
    got = t.verify(
        [p] * 5,
        [
            boxed(p.answer),
            boxed(p.answer + "1"),  # partial credit from the default scorer: still wrong
            f"<think>work</think>the answer is {p.answer}",
            f"<think>so {p.answer}\\boxed{{{p.answer}}}",  # never closed the reasoning block
            f"<think>x</think>\\boxed{{{p.answer[:-1]}}}",
        ],
    )
    assert [(v.correct, v.status, v.format_ok) for v in got] == [
        (True, "ok", True),
        (False, "wrong", True),
        (False, "no_answer", False),
        (False, "no_answer", False),
        (False, "wrong", True),
    ]
    assert got[1].detail.startswith("score 0.")


def test_other_datasets_by_name(make):
    t = make("name=chain_sum", "+task.dataset_args.min_terms=2", "+task.dataset_args.max_terms=2")
    p = t.heldout_problems()[0]
    assert t.verify([p], [boxed(p.answer)])[0].correct
    # reasoning-gym's own defaults come back when the preset is cleared
    plain = make("dataset_defaults.basic_arithmetic=null", "train_size=50", "heldout_size=50")
    assert any(ch in p.question for p in plain.heldout_problems() for ch in "*/(")


def test_scorer_exception_scores_zero_and_is_counted(make):
    t = make("name=prime_factorization", "train_size=20", "heldout_size=5")
    p = t.heldout_problems()[0]
    (v,) = t.verify([p], ["<think>x</think>\\boxed{2 x 3}"])  # this scorer raises ValueError on "x"
    assert (v.correct, v.status, v.failed) == (False, "error", True) and "ValueError" in v.detail


def test_bad_names_and_arguments(make):
    with pytest.raises(ValueError, match="task.name='no_such_dataset'"):
        make("name=no_such_dataset")
    with pytest.raises(ValueError, match="task.dataset_args"):
        make("+task.dataset_args.size=5")
    with pytest.raises(ValueError, match="task.dataset_args"):
        make("+task.dataset_args.bogus=1")
