"""Recap extraction: what a challenger may read of a draft."""

from __future__ import annotations

from omegaconf import OmegaConf

from agon.core.config import ArithmeticTaskConfig
from agon.tasks import build_task
from agon.tasks.text import boxed_answers, last_boxed, remove_boxed, visible_text


def _task():
    return build_task(OmegaConf.structured(ArithmeticTaskConfig(heldout_size=5, train_size=10)))


def test_nested_braces_are_removed_whole():
    text = r"so x = \boxed{\frac{1}{2}} done"
    assert remove_boxed(text) == "so x =  done"
    assert boxed_answers(text) == [r"\frac{1}{2}"]


def test_several_boxes_all_removed_last_one_is_the_answer():
    text = r"\boxed{1} or maybe \boxed{{2}} then \boxed{3}"
    assert remove_boxed(text) == " or maybe  then "
    assert last_boxed(text) == "3"


def test_unclosed_box_runs_to_the_end():
    assert remove_boxed(r"answer \boxed{\frac{1}{2") == "answer "


def test_recap_is_the_visible_text_without_the_answer():
    task = _task()
    draft = r"<think>secret reasoning 93+1=94</think>93+1=94\boxed{56}"
    assert task.recap(draft) == "93+1=94"
    assert "secret" not in task.recap(draft)


def test_recap_uses_text_after_the_last_think_close():
    assert visible_text("<think>a</think>b</think>c") == "c"


def test_missing_think_close_gives_an_empty_recap():
    task = _task()
    assert visible_text("<think>never closed \\boxed{3}") is None
    assert task.recap("<think>never closed \\boxed{3}") == ""
    assert task.recap("no tags at all \\boxed{3}") == ""


def test_empty_draft_gives_an_empty_recap():
    assert _task().recap("") == ""
    assert _task().recap("<think></think>") == ""
