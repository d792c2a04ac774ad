"""Completions shaped like Qwen3's: a long thinking block, a visible summary, a boxed answer; and the cases that go
wrong on real models (a trace cut inside <think>, several </think> tags, thinking switched off, an answer restated
in words). Graded by the real DeepMath task (math-verify) on its local fixture; sampled with a tokenizer that has
Qwen3's special tokens and thinking chat template (agon.qwen3_shape)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agon.tasks import Problem, build_task

FIXTURE = str(Path(__file__).parent / "fixtures" / "deepmath.parquet")
PROBLEM = Problem("p", "What is 6 times 7?", "42")
REASONING = ("<think>\nOkay, so I need to multiply 6 by 7. Let me think. 6 times 7... maybe \\boxed{41}? No, "
             "6*7 = 6*5 + 6*2 = 30 + 12 = 42. Let me double-check: 7+7+7+7+7+7 = 42. Yes.\n</think>\n\n")


@pytest.fixture(scope="module")
def task():
    from tests.tasks.conftest import compose_task

    t = build_task(compose_task("deepmath_hard", f"source={FIXTURE}", "heldout_size=3"))
    yield t
    t.close()


def _grade(task, text: str):
    return task.verify([PROBLEM], [text])[0]


def test_the_recap_is_the_visible_summary_without_the_box_and_the_answer_is_graded(task):
    text = REASONING + ("We split 7 as 5 + 2: $6 \\cdot 5 + 6 \\cdot 2 = 42$.\n\n"
                        "**Final Answer**\n\\[\n\\boxed{42}\n\\]")
    recap = task.recap(text)
    assert recap == "We split 7 as 5 + 2: $6 \\cdot 5 + 6 \\cdot 2 = 42$.\n\n**Final Answer**\n\\[\n\n\\]"
    assert "Okay" not in recap and "41" not in recap and "boxed" not in recap
    verdict = _grade(task, text)
    assert verdict.correct and verdict.format_ok and verdict.status == "ok"


def test_a_trace_cut_inside_think_has_no_recap_and_is_wrong_even_with_a_right_box_in_its_reasoning(task):
    cut = REASONING.split("</think>")[0].replace("maybe \\boxed{41}", "maybe \\boxed{42}")
    assert task.recap(cut) == ""
    verdict = _grade(task, cut)
    assert not verdict.correct and not verdict.format_ok and not verdict.failed


def test_with_several_think_closings_only_the_text_after_the_last_counts(task):
    text = "<think>first try</think>draft \\boxed{41}</think>\n\nOn reflection 6*7 = 42. \\boxed{42}"
    assert task.recap(text) == "On reflection 6*7 = 42."
    assert _grade(task, text).correct
    assert not _grade(task, "<think>a</think>\\boxed{42}</think>\n\nI give up.").correct


def test_an_answer_restated_in_words_stays_in_the_recap(task):
    """Only boxes are removed (docs/tasks.md says why): a recap that says 'the answer is 42' hands it over."""
    text = REASONING + "The answer is 42, since 6*7 = 42. \\boxed{42}"
    assert task.recap(text) == "The answer is 42, since 6*7 = 42."


@pytest.fixture(scope="module")
def qwen3_policies():
    """Two adapters on a random 2-layer model with Qwen3's vocabulary and a tokenizer shaped like Qwen3's."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from agon.core.config import LoraConfig
    from agon.families import get_family
    from agon.bench.model_shape import build_tokenizer
    from agon.models.policies import Policies

    qwen3 = get_family("qwen3")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen3.shape_config(
        "0.6b", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16))
    for p in model.parameters():
        p.requires_grad_(False)
    return Policies(model, build_tokenizer(qwen3.shape), ["A", "B"], OmegaConf.structured(LoraConfig(rank=4, alpha=8)),
                    family=qwen3)


def test_a_sampled_trace_cut_at_the_budget_is_truncated_with_an_empty_recap(task, qwen3_policies):
    prompt = qwen3_policies.render(task.user_message(PROBLEM), enable_thinking=True)
    assert prompt.endswith("<|im_start|>assistant\n")  # thinking on: the model opens <think> itself
    (c,) = qwen3_policies.sample([prompt], "A", max_new_tokens=6, temperature=1.0)
    assert c.truncated and c.n_tokens == 6 and "</think>" not in c.text
    assert task.recap(c.text) == "" and not _grade(task, c.text).format_ok


def test_with_thinking_off_the_templates_empty_think_block_is_part_of_the_turn(task, qwen3_policies):
    """Qwen3's template writes '<think>\\n\\n</think>\\n\\n' into the prompt when thinking is off; the completion is
    all visible text, and is graded and recapped as such instead of failing for a missing </think>."""
    prompt = qwen3_policies.render(task.user_message(PROBLEM), enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    (c,) = qwen3_policies.sample([prompt], "A", max_new_tokens=6, temperature=1.0)
    decoded = qwen3_policies.tokenizer.decode(c.token_ids)
    assert c.text == "<think>\n\n</think>\n\n" + decoded.replace("<|im_end|>", "")
    assert task.recap(c.text) == task.recap("<think></think>" + decoded.replace("<|im_end|>", ""))
