"""Sampling settings reach the engine through the config: ``model.*`` (the model card's) is what ``trainer.*`` reads,
``trainer.*`` is what ``eval.*`` reads, and each of them, set apart from the other, is what its own phase samples with.
The engines' own tests (tests/test_engines.py) show that an engine samples what its ``Sampling`` asks for; these show
which ``Sampling`` each phase hands it, and what the completions look like because of it."""

from __future__ import annotations

from omegaconf import OmegaConf

from agon.records import run_files
from agon.training.checks import validate
from agon.engines import Sampling
from agon.models.tokens import Completion
from agon.records.recorder import Recorder
from agon.tasks import build_task
from agon.training.trainer import Trainer
from tests.conftest import RecordingEngine, compose_config

KEYS = ("temperature", "top_p", "top_k")


def test_the_model_cards_sampling_reaches_trainer_and_eval_and_each_can_be_set_apart():
    card = compose_config(["model.temperature=0.7", "model.top_p=0.9", "model.top_k=7"])
    assert [card.trainer[k] for k in KEYS] == [card.eval[k] for k in KEYS] == [0.7, 0.9, 7]
    qwen3 = compose_config(["experiment=paper_deepmath"])  # Qwen3's card: T 0.6, top_p 0.95, top_k 20
    assert [qwen3.trainer[k] for k in KEYS] == [qwen3.eval[k] for k in KEYS] == [0.6, 0.95, 20]
    trainer = compose_config(["model.top_k=7", "trainer.temperature=0.5", "trainer.top_p=0.8", "trainer.top_k=3",
                              "trainer.max_new_tokens=40", "trainer.generation_batch_tokens=8192"])
    assert [trainer.eval[k] for k in (*KEYS, "max_new_tokens", "generation_batch_tokens")] == [0.5, 0.8, 3, 40, 8192]
    assert (trainer.model.temperature, trainer.model.top_p, trainer.model.top_k) == (1.0, 1.0, 7)
    apart = compose_config(["eval.temperature=0.4", "eval.top_p=0.7", "eval.top_k=2", "eval.max_new_tokens=9",
                            "eval.generation_batch_tokens=4096"])
    assert Sampling.from_config(apart.eval) == Sampling(9, 0.4, 0.7, 2, 4096)
    assert Sampling.from_config(apart.trainer) == Sampling(72, 1.0, 1.0, 0, 262_144)  # the defaults, untouched


TRAIN = Sampling(max_new_tokens=32, temperature=0.9, top_p=0.95, top_k=6, batch_tokens=8192)
EVAL = Sampling(max_new_tokens=10, temperature=0.5, top_p=0.8, top_k=1, batch_tokens=4096)


def _identical_per_prompt(prompts: list[str], completions: list[Completion]) -> bool:
    seen: dict[str, tuple[int, ...]] = {}
    return all(seen.setdefault(p, c.token_ids) == c.token_ids for p, c in zip(prompts, completions))


def test_training_samples_with_trainer_settings_and_evaluation_with_eval_settings(small_cfg, policies, tmp_path):
    """A run's phases (as ``agon.run.run`` calls them), trainer.* and eval.* apart in every key: each of the two
    training calls (8 rows: 2 problems x 4) is handed the trainer's ``Sampling``, each call of the evaluations before
    and after (6 rows: 3 problems x 2 samples) the evaluation's. The completions show it too: at eval.top_k=1 the
    samples of one prompt are identical and none is longer than eval.max_new_tokens=10, where training's, at top_k=6,
    differ within a group and run past 10 tokens."""
    for key in ("max_new_tokens", *KEYS):
        OmegaConf.update(small_cfg, f"trainer.{key}", getattr(TRAIN, key))
        OmegaConf.update(small_cfg, f"eval.{key}", getattr(EVAL, key))
    small_cfg.trainer.generation_batch_tokens, small_cfg.eval.generation_batch_tokens = 8192, 4096
    small_cfg.trainer.num_generations = 4
    validate(small_cfg)
    engine = RecordingEngine(policies)
    trainer = Trainer(small_cfg, policies, build_task(small_cfg.task), Recorder(tmp_path), tmp_path,
                      log=lambda *_: None, engine=engine)
    trainer.evaluate("start")
    trainer.step()
    trainer.evaluate("final")
    calls = engine.calls
    training = [c for c in calls if len(c[0]) == 8]
    evaluation = [c for c in calls if len(c[0]) == 6]
    # drafter and challenger of the one step; draft and answer of A>B and B>A and the answers of A>A and B>B, at the
    # start and at the end
    assert (len(training), len(evaluation), len(calls)) == (2, 12, 14)
    assert {s for _, s, _ in training} == {TRAIN}
    assert {s for _, s, _ in evaluation} == {EVAL}
    assert not all(_identical_per_prompt(p, c) for p, _, c in training)  # the premise: top_k=1 is what ties them
    assert max(x.n_tokens for _, _, c in training for x in c) > EVAL.max_new_tokens
    assert all(_identical_per_prompt(p, c) for p, _, c in evaluation)
    assert max(x.n_tokens for _, _, c in evaluation for x in c) == EVAL.max_new_tokens
    rows = run_files.read_jsonl(tmp_path / run_files.EVAL)
    assert rows and max(r["tokens"] for r in rows) <= EVAL.max_new_tokens

