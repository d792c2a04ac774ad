"""agon.eval's diagnostic: cross-play and the challenger's accuracy under each kind of recap."""

from __future__ import annotations

import math
from pathlib import Path

from agon.engines import Engine, Sampling
from agon.game.diagnostic import RECAP_CONDITIONS, diagnose
from agon.models.tokens import Completion
from agon.run import run
from agon.records.run_files import read_jsonl
from agon.tasks import build_task
from agon.tasks.arithmetic import worked_solution
from tests.conftest import TEST_WORLD, compose_config


class TrustingEngine(Engine):
    """A scripted sampler with known behaviour, so every number of the diagnostic has one right value: A drafts
    correct solutions, B drafts wrong ones, the base drafts nothing; every challenger answers right exactly when the
    recap it reads is the correct one (it trusts the recap and cannot solve the problem alone)."""

    def __init__(self, policies, task):
        super().__init__(policies)
        self.task = task

    def sample(self, prompts, adapter, sampling, on_sampled=None):
        out = []
        for prompt in prompts:
            message = prompt.split("<|im_start|>u", 1)[1].split("<|im_end|>", 1)[0]
            question, bar, recap = message.partition("|")
            right = worked_solution(question)
            if bar:
                text = right if recap and recap == self.task.recap(right) else "<think></think>\\boxed{-999}"
            else:
                text = {"A": right, "B": worked_solution(question).replace("\\boxed{", "\\boxed{1")}.get(adapter, "")
                if adapter == "B":  # a wrong first step, so B's recap is wrong too
                    first = right.split("<think>")[1].split(";")[0]
                    left, value = first.split("=")
                    text = text.replace(f"{left}={value}", f"{left}={int(value) + 1}")
            out.append(Completion(text, (1,), False))
        return out


def test_each_recap_condition_is_scored_on_its_own_prompts(policies):
    cfg = compose_config(TEST_WORLD + ["task.min_terms=3", "task.max_terms=4"])
    task = build_task(cfg.task)
    problems = list(task.heldout_problems())[:6]
    got = diagnose(policies, task, cfg, problems, TrustingEngine(policies, task), samples=2)
    assert got["crossplay/A>B"] == 1.0 and got["crossplay/A>A"] == 1.0 and got["crossplay/A>base"] == 1.0
    assert got["crossplay/B>A"] == 0.0 and got["crossplay/base>B"] == 0.0
    assert got["recap/B/rival"] == 1.0 and got["recap/B/rival_right"] == 1.0 and math.isnan(got["recap/B/rival_wrong"])
    assert got["recap/A/rival"] == 0.0 and got["recap/A/rival_wrong"] == 0.0 and math.isnan(got["recap/A/rival_right"])
    assert got["recap/base/rival"] == 1.0  # the base reads A's recaps
    for who in ("A", "B", "base"):
        assert (got[f"recap/{who}/correct"], got[f"recap/{who}/wrong"], got[f"recap/{who}/none"]) == (1.0, 0.0, 0.0)
    assert got["recap/n_wrong"] == 12  # every problem has a wrong recap: 2-3 steps, the slip forced into the recap


class LatentTrustingEngine(TrustingEngine):
    """The scripted sampler reading a latent prefix: a prompt read after a prefix is answered as the challenge prompt
    holding the prefix's text as its recap (``exchange.span=recap``: the prefix is the recap's tokens)."""

    latent_prefix = True

    def sample(self, prompts, adapter, sampling, on_sampled=None, prefixes=None):
        if prefixes is not None:
            decode = self.policies.tokenizer.decode
            prompts = [p.replace("<|im_end|>", f"|{decode(list(x))}<|im_end|>", 1) if x else p
                       for p, x in zip(prompts, prefixes.ids, strict=True)]
        return super().sample(prompts, adapter, sampling, on_sampled)


def test_under_the_latent_exchange_crossplay_and_the_latent_conditions_read_prefixes(policies):
    """Cross-play answers after the drafter's recap span, and ``latent/*`` score each condition as a prefix: the
    rival's drafts' spans, a correct and a wrong worked solution's, and none (the plain prompt, where the scripted
    A drafts right and B wrong); the ``recap/*`` text probes are still there."""
    cfg = compose_config(TEST_WORLD + ["task.min_terms=3", "task.max_terms=4", "exchange=latent"])
    task = build_task(cfg.task)
    problems = list(task.heldout_problems())[:4]
    got = diagnose(policies, task, cfg, problems, LatentTrustingEngine(policies, task), samples=2)
    assert got["crossplay/A>B"] == 1.0 and got["crossplay/A>base"] == 1.0 and got["crossplay/B>A"] == 0.0
    assert got["latent/B/rival"] == 1.0 and got["latent/B/rival_right"] == 1.0
    assert math.isnan(got["latent/B/rival_wrong"])
    assert got["latent/A/rival"] == 0.0 and got["latent/A/rival_wrong"] == 0.0 and got["latent/base/rival"] == 1.0
    for who in ("A", "B", "base"):
        assert (got[f"latent/{who}/correct"], got[f"latent/{who}/wrong"]) == (1.0, 0.0), who
        assert got[f"recap/{who}/correct"] == 1.0
    assert (got["latent/A/none"], got["latent/B/none"], got["latent/base/none"]) == (1.0, 0.0, 0.0)
    visible = diagnose(policies, task, compose_config(TEST_WORLD), problems, TrustingEngine(policies, task))
    assert not any(k.startswith("latent/") for k in visible)


def test_under_the_hidden_exchange_crossplay_answers_alone_and_the_recap_is_still_probed(policies):
    cfg = compose_config(TEST_WORLD + ["exchange=hidden"])
    task = build_task(cfg.task)
    problems = list(task.heldout_problems())[:4]
    got = diagnose(policies, task, cfg, problems, TrustingEngine(policies, task))
    # the answerer reads the plain prompt, as it does when drafting: whoever drafted, A is right and B is not
    for drafter in ("A", "B", "base"):
        assert (got[f"crossplay/{drafter}>A"], got[f"crossplay/{drafter}>B"]) == (1.0, 0.0)
    assert got["recap/B/rival"] == 1.0 and got["recap/B/correct"] == 1.0


class RecordingEngine(TrustingEngine):
    """The scripted sampler, keeping the ``Sampling`` of every call."""

    def __init__(self, policies, task):
        super().__init__(policies, task)
        self.settings = []

    def sample(self, prompts, adapter, sampling, on_sampled=None):
        self.settings.append(sampling)
        return super().sample(prompts, adapter, sampling, on_sampled)


def test_the_diagnostic_samples_with_the_eval_settings_not_the_trainers(policies):
    """Every call of the cross-play and the recap probes is handed eval.*, set apart from trainer.* in every key."""
    cfg = compose_config(TEST_WORLD + ["eval.temperature=0.5", "eval.top_p=0.8", "eval.top_k=3",
                                       "eval.max_new_tokens=9", "eval.generation_batch_tokens=4096",
                                       "trainer.temperature=0.9", "trainer.top_p=0.95", "trainer.top_k=6",
                                       "trainer.max_new_tokens=40", "trainer.generation_batch_tokens=8192"])
    task = build_task(cfg.task)
    engine = RecordingEngine(policies, task)
    diagnose(policies, task, cfg, list(task.heldout_problems())[:2], engine)
    assert len(engine.settings) > 10 and set(engine.settings) == {Sampling(9, 0.5, 0.8, 3, 4096)}


def test_a_run_logs_the_diagnostic_at_every_evaluation_and_trains_as_it_does_without_it(small_cfg, tmp_path):
    """The diagnostic at every evaluation, and its draws its own: the run without it trains the same steps bit for
    bit (it once drew from training's streams, so turning it on changed every step after the first evaluation)."""
    small_cfg.eval.every = 1
    small_cfg.trainer.max_steps = 2
    small_cfg.output_dir = str(tmp_path / "plain")
    run(small_cfg)
    small_cfg.output_dir = str(tmp_path / "run")
    small_cfg.eval.diagnostic = True
    run(small_cfg)

    def trained(run_dir: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k.startswith("role/")} for r in read_jsonl(run_dir / "metrics.jsonl")
                if "role/drafter/loss" in r]

    assert trained(tmp_path / "run") == trained(tmp_path / "plain") != []
    for adapter in ("A", "B"):
        ours, theirs = (d / "adapters" / adapter / "adapter_model.safetensors" for d in (tmp_path / "run",
                                                                                         tmp_path / "plain"))
        assert ours.read_bytes() == theirs.read_bytes()
    rows = [r for r in read_jsonl(Path(small_cfg.output_dir) / "metrics.jsonl") if "crossplay/A>B" in r]
    assert [r["train/step"] for r in rows] == [0, 1, 2]
    for row in rows:
        for who in ("A", "B", "base"):
            for condition in RECAP_CONDITIONS:
                value = row[f"recap/{who}/{condition}"]
                assert value is None or 0.0 <= value <= 1.0
        assert row["recap/n_wrong"] > 0
    # the test world solves some of its problems: all zeros would mean nothing was graded
    assert sum(v for k, v in rows[0].items() if k.startswith("crossplay/")) > 0
