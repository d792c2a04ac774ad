"""DeepMath-103K loader, filter, held-out split and grading, on a small fixture in the dataset's schema."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from agon.tasks import build_task
from agon.tasks.deepmath import DatasetUnavailableError, DeepMathTask

FIXTURES = Path(__file__).parent / "fixtures"
PARQUET = str(FIXTURES / "deepmath.parquet")
JSONL = str(FIXTURES / "deepmath.jsonl")
# rows at difficulty >= 8 in the fixture, after dropping a duplicate question, NaN and the -1 sentinel
N_HARD = 9


@pytest.fixture
def make(compose_task):
    def make(*overrides: str) -> DeepMathTask:
        task = build_task(compose_task("deepmath_hard", f"source={PARQUET}", "heldout_size=3", *overrides))
        assert isinstance(task, DeepMathTask)
        return task

    return make


def test_yaml_defaults(compose_task):
    cfg = compose_task("deepmath_hard")
    got = (cfg.kind, cfg.source, cfg.min_difficulty, cfg.heldout_size)
    assert got == ("deepmath", "zwhe99/DeepMath-103K", 8.0, 300)
    assert cfg.instruction.endswith("Please reason step by step, and put your final answer within \\boxed{}.")


def test_filter_and_disjoint_seeded_split(make):
    task = make()
    train, held = task.train_problems(), task.heldout_problems()
    assert len(held) == 3 and len(train) + len(held) == N_HARD
    assert not {p.id for p in train} & {p.id for p in held}
    assert not {p.question for p in train} & {p.question for p in held}
    assert all(p.meta["difficulty"] >= 8.0 for p in [*train, *held])
    assert all(p.answer for p in [*train, *held]) and all(p.meta["topic"].startswith("Mathematics") for p in held)
    # the same config gives the same split; another seed another one
    again = make()
    assert [p.id for p in again.heldout_problems()] == [p.id for p in held]
    others = [make(f"split_seed={s}").heldout_problems() for s in (1, 2, 3)]
    assert any([p.id for p in o] != [p.id for p in held] for o in others)


def test_min_difficulty_is_configurable(make):
    assert len(make("min_difficulty=9.0", "heldout_size=1").train_problems()) == 2  # 9.0 and 9.5
    assert len(make("min_difficulty=0", "heldout_size=0").train_problems()) == N_HARD + 2  # 4.5 and 7.5 back


def test_jsonl_file_and_directory_sources_match_parquet(make, tmp_path):
    want = sorted(p.id for p in make().heldout_problems())
    assert sorted(p.id for p in make(f"source={JSONL}").heldout_problems()) == want
    shutil.copy(PARQUET, tmp_path / "train-00000-of-00001.parquet")
    assert sorted(p.id for p in make(f"source={tmp_path}").heldout_problems()) == want


def test_heldout_larger_than_pool_is_a_clear_error(make):
    with pytest.raises(ValueError, match="task.heldout_size=50"):
        make("heldout_size=50")


def test_unreachable_hub_gives_one_clear_error(make):
    t0 = time.monotonic()
    with pytest.raises(DatasetUnavailableError) as err:
        make("source=zwhe99/DeepMath-103K")
    msg = str(err.value)
    assert "DeepMath-103K" in msg and "task.source=/path/to/file.parquet" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert time.monotonic() - t0 < 30


def test_missing_local_path(make):
    with pytest.raises(FileNotFoundError, match="task.source="):
        make("source=/nonexistent/deepmath.parquet")


def test_prompt_recap_and_verify(make):
    task = make("verify_workers=1")
    try:
        by_answer = {p.answer: p for p in [*task.train_problems(), *task.heldout_problems()]}
        half, yes = by_answer["\\frac{1}{2}"], by_answer["Yes"]
        assert task.user_message(half).startswith(half.question)
        assert task.user_message(half).endswith("within \\boxed{}.")
        draft = "<think>x^2/2 from 0 to 1</think>The integral of x is x^2/2, so we get \\boxed{\\frac{1}{2}}."
        assert task.recap(draft) == "The integral of x is x^2/2, so we get ."
        assert task.recap("<think>never closed \\boxed{1}") == ""
        got = task.verify(
            [half, half, yes, half],
            [draft, "<think>x</think>\\boxed{1/3}", "<think>x</think>\\boxed{\\text{Yes}}", "no think \\boxed{1/2}"],
        )
        assert [(v.correct, v.status, v.format_ok) for v in got] == [
            (True, "ok", True),
            (False, "wrong", True),
            (True, "ok", True),
            (False, "no_answer", False),
        ]
    finally:
        task.close()
