"""Streamed rounds (``Engine.stream``, ``rollout.play_rounds``) and streamed evaluations (``cascade.evaluate``).

Without vLLM: the default stream's waves on the ``hf`` engine and the journal a streamed evaluation commits its
rounds to. With vLLM (marker ``vllm``, ``make test-vllm``: vLLM's CPU build as a worker): per-request seeds make a
streamed step and a two-stage step sample the same completions, a hidden step is one engine call, and a run killed
during a streamed evaluation resumes it, playing only the rounds that were in flight, and ends with the rows of an
uninterrupted run and of a two-stage one.
"""

from __future__ import annotations

import copy
import pickle
import shutil
from pathlib import Path

import pytest

from agon.engines import Request, Sampling, build_engine
from agon.engines.hf import HFEngine
from agon.game.cascade import RoundJournal
from agon.game.rollout import derive_seed, play
from agon.models.policies import Policies
from agon.records import run_files
from agon.tasks import build_task
from tests.conftest import TEST_WORLD, compose_config
from tests.test_engines import VLLM
from tests.test_resume import Launch, paused_at, records

SAMPLING = Sampling(max_new_tokens=16, temperature=1.0)


class _CountedHF(HFEngine):
    """The hf engine, each ``sample`` call's adapter and rows kept."""

    def __init__(self, policies: Policies):
        super().__init__(policies)
        self.calls: list[tuple[str | None, int]] = []

    def sample(self, prompts, adapter, sampling, on_sampled=None, prefixes=None):
        self.calls.append((adapter, len(prompts)))
        return super().sample(prompts, adapter, sampling, on_sampled, prefixes)


def _policies(tiny_base) -> Policies:
    cfg, (model, tokenizer) = tiny_base
    return Policies(copy.deepcopy(model), tokenizer, ["A", "B"], cfg.model.lora)


def test_the_default_stream_plays_waves_and_indexes_each_follow_up_after_what_was_submitted(tiny_base):
    """hf: the drafts' wave is one call per adapter (A's rows, then B's), ``then`` hears of the whole wave in index
    order, and the follow-ups it returns take the next indices in the order returned, sampled as the next wave."""
    cfg, _ = tiny_base
    engine = _CountedHF(_policies(tiny_base))
    prompts = [engine.policies.render(f"What is {i} + {i}?") for i in range(3)]
    first = [Request(p, a) for p in prompts for a in ("A", "B")][:4]
    heard: list[list[int]] = []

    def then(finished):
        heard.append([k for k, _ in finished])
        return [Request(first[k].prompt, "B", max_new_tokens=4) for k, _ in reversed(finished)] \
            if len(heard) == 1 else []

    out = engine.stream(first, SAMPLING, then)
    assert heard == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert engine.calls == [("A", 2), ("B", 2), ("B", 4)]
    assert len(out) == 8 and all(c.n_tokens <= 4 for c in out[4:])  # the follow-ups' own budget
    assert any(c.n_tokens > 4 for c in out[:4])


def test_a_hidden_round_submits_its_challenge_with_its_draft_and_a_visible_one_after_it(tiny_base):
    cfg, _ = tiny_base
    task = build_task(cfg.task)
    problems = list(task.heldout_problems())[:2]
    policies = _policies(tiny_base)
    for exchange, calls in (("visible", [("A", 4), ("B", 4)]), ("hidden", [("A", 4), ("B", 4)])):
        engine = _CountedHF(policies)
        game = play(engine.policies, task, cfg.model, problems, drafter="A", challenger="B", exchange=exchange,
                    group_size=2, sampling=SAMPLING, engine=engine)
        assert engine.calls == calls
        for rnd in game.rounds:
            reads_recap = rnd.recap in rnd.challenge.prompt and rnd.challenge.prompt != rnd.draft.prompt
            assert reads_recap == (exchange == "visible") or not rnd.recap
            assert rnd.draft.prompt == engine.policies.render(task.user_message(rnd.problem),
                                                              system=task.cfg.system_prompt,
                                                              enable_thinking=cfg.model.enable_thinking)
    # one adapter in both roles under hidden: drafts and challenges are one call
    engine = _CountedHF(policies)
    play(engine.policies, task, cfg.model, problems, drafter="A", challenger="A", exchange="hidden", group_size=2,
         sampling=SAMPLING, engine=engine)
    assert engine.calls == [("A", 8)]


def test_a_journal_cut_mid_record_keeps_every_whole_round_and_appends_after_them(tiny_base, tmp_path):
    cfg, _ = tiny_base
    task = build_task(cfg.task)
    policies = _policies(tiny_base)
    game = play(policies, task, cfg.model, list(task.heldout_problems())[:2], drafter="A", challenger="B",
                exchange="visible", group_size=2, sampling=SAMPLING)
    path = tmp_path / "rounds_rank0.pkl"
    journal = RoundJournal(path)
    for i, rnd in enumerate(game.rounds[:3]):
        journal.append("A>B", i, rnd)
    journal.close()
    whole = path.stat().st_size
    with open(path, "ab") as f:  # a kill during the fourth record's write
        f.write(pickle.dumps(("A>B", 3, game.rounds[3]))[:40])
    loaded = RoundJournal(path).load()
    assert sorted(loaded) == [("A>B", 0), ("A>B", 1), ("A>B", 2)]
    assert loaded[("A>B", 1)] == game.rounds[1]
    assert path.stat().st_size == whole  # cut back to the last whole record
    again = RoundJournal(path)
    again.append("A>B", 3, game.rounds[3])
    again.close()
    assert sorted(RoundJournal(path).load()) == [("A>B", i) for i in range(4)]
    assert RoundJournal(tmp_path / "none.pkl").load() == {}


# -- vLLM ----------------------------------------------------------------------------------------------------------


@pytest.mark.vllm(seconds=600)
def test_a_streamed_step_and_a_two_stage_step_sample_the_same_completions_and_hidden_is_one_call(
        agon_cache, bounded):
    """The same problems and seeds played streamed and in two stages on one vLLM engine: every row's draft and
    challenge are token for token the same (each request draws from its own seed, whatever shares its batch).
    Streamed is one engine call for visible and hidden; two-stage is two for visible and one for hidden (its
    challenges read the plain prompt: they go in with the drafts)."""
    from agon.models.loading import load_base

    cfg = compose_config(TEST_WORLD + VLLM + ["logger=none"])
    model, tokenizer = load_base(cfg.model, cfg.task, log=lambda *_: None, device="cpu")
    policies = Policies(model, tokenizer, ["A", "B"], cfg.model.lora)
    policies.perturb("A", 0.3, seed=1)
    policies.perturb("B", 0.3, seed=2)
    task = build_task(cfg.task)
    problems = list(task.heldout_problems())[:8]
    seeds = [derive_seed(0, "train", 0, i) for i in range(len(problems))]
    engine = build_engine(cfg, policies, log=lambda *_: None)
    calls: list[str] = []
    call = engine.backend.call
    engine.backend.call = lambda method, **kw: (calls.append(method), call(method, **kw))[1]
    sampling = Sampling(max_new_tokens=48, temperature=1.0)
    try:
        for exchange, two_stage_calls in (("visible", 2), ("hidden", 1)):
            games = {}
            for streaming in (True, False):
                engine.streaming = streaming
                calls.clear()
                games[streaming] = play(policies, task, cfg.model, problems, drafter="A", challenger="B",
                                        exchange=exchange, group_size=4, sampling=sampling, engine=engine,
                                        seeds=seeds)
                sampled = [m for m in calls if m in ("stream", "generate")]
                assert len(sampled) == (1 if streaming else two_stage_calls), (exchange, streaming, calls)
            for a, b in zip(games[True].rounds, games[False].rounds, strict=True):
                assert a.draft.completion.token_ids == b.draft.completion.token_ids
                assert a.challenge.completion.token_ids == b.challenge.completion.token_ids
                assert a.challenge.prompt == b.challenge.prompt
            # the seeds decide: other seeds, other drafts
            other = play(policies, task, cfg.model, problems, drafter="A", challenger="B", exchange=exchange,
                         group_size=4, sampling=sampling, engine=engine, seeds=[s + 1 for s in seeds])
            assert sum(a.draft.completion.token_ids != b.draft.completion.token_ids
                       for a, b in zip(other.rounds, games[True].rounds)) > len(other.rounds) // 2
    finally:
        engine.close()


@pytest.mark.vllm(seconds=600)
def test_without_request_seeds_the_same_seeded_rows_draw_other_completions(agon_cache, bounded):
    """generation.vllm.request_seeds=false: the rows' seeds are not sent, so two plays of the same problems and seeds
    draw from the engine's one stream and differ; with the default, the same seeds give the same completions."""
    from agon.models.loading import load_base

    for request_seeds, same in ((True, True), (False, False)):
        cfg = compose_config(TEST_WORLD + VLLM + ["logger=none", f"generation.vllm.request_seeds={request_seeds}"])
        model, tokenizer = load_base(cfg.model, cfg.task, log=lambda *_: None, device="cpu")
        policies = Policies(model, tokenizer, ["A", "B"], cfg.model.lora)
        task = build_task(cfg.task)
        problems = list(task.heldout_problems())[:6]
        engine = build_engine(cfg, policies, log=lambda *_: None)
        try:
            games = [play(policies, task, cfg.model, problems, drafter="A", challenger="B", exchange="visible",
                          group_size=2, sampling=Sampling(max_new_tokens=32, temperature=1.0), engine=engine,
                          seeds=list(range(len(problems)))) for _ in range(2)]
        finally:
            engine.close()
        tokens = [[(r.draft.completion.token_ids, r.challenge.completion.token_ids) for r in g.rounds] for g in games]
        assert (tokens[0] == tokens[1]) == same, request_seeds


# an evaluation of 24 problems x 4 samples x 2 orders and their 2 self-cascades (384 rounds), long enough to be killed
# half-way
STREAMED_EVAL = TEST_WORLD + VLLM + [
    "logger=none", "progress=false", "trainer.max_steps=1", "trainer.prompts_per_step=2", "trainer.num_generations=2",
    "trainer.max_new_tokens=48", "eval.n_problems=24", "eval.samples=4", "eval.at_start=true",
    "trainer.checkpoint_minutes=0"]
ROUNDS = 24 * 4 * 4
# the cascade orders' rounds, played in the first engine call; the self-cascades read their drafts in a second
PLAYED = {"A>B", "B>A"}


def calls_to_finish(journal: Path, tmp_path: Path) -> int:
    """Engine calls a relaunch makes after a kill that left ``journal``: one for the plays' rounds not committed
    (none when all are), one for the reads (never all committed: the kill came before the evaluation ended)."""
    copy = tmp_path / "journal-calls.pkl"
    shutil.copy(journal, copy)
    plays = sum(order in PLAYED for order, _ in RoundJournal(copy).load())
    return (plays < ROUNDS // 2) + 1


def _journal(run_dir: Path) -> Path | None:
    found = list((run_dir / run_files.EVAL_PARTS).glob("start-0-*/rounds_rank0.pkl"))
    return found[0] if found else None


def _committed(journal: Path, tmp_path: Path) -> int:
    """Whole rounds in a copy of ``journal`` (the copy: reading cuts a torn tail)."""
    copy = tmp_path / "journal-copy.pkl"
    shutil.copy(journal, copy)
    return len(RoundJournal(copy).load())


@pytest.mark.vllm(seconds=1200)
def test_a_run_killed_during_a_streamed_evaluation_plays_only_the_rounds_in_flight_and_ends_with_the_same_rows(
        agon_cache, tmp_path, bounded):
    """SIGKILL once a third of the start evaluation's rounds are committed (a kill at any moment: rounds in
    flight, a record perhaps half-written). The launch again keeps every committed round and plays the rest in one
    engine call; eval.jsonl, metrics.jsonl and samples.jsonl are those of the uninterrupted run, and of the same
    run played in two stages (generation.stream=false)."""
    straight, two_stage, killed = (tmp_path / name for name in ("straight", "two_stage", "killed"))
    out = Launch(STREAMED_EVAL + [f"hydra.run.dir={straight}"], agon_cache, tmp_path / "straight.log").finish()
    assert f"[eval] eval start: {ROUNDS} of {ROUNDS} rounds played in 2 engine calls" in out, out[-3000:]
    out = Launch(STREAMED_EVAL + ["generation.stream=false", f"hydra.run.dir={two_stage}"], agon_cache,
                 tmp_path / "two_stage.log").finish()
    # a draft and an answer call per cascade order, an answer call per self-cascade
    assert "[eval] eval start: 1 of 1 chunks played in 6 engine calls" in out, out[-3000:]

    command = STREAMED_EVAL + [f"hydra.run.dir={killed}"]
    # paused once a third of the rounds are committed, the rest in flight: a poll of the journal could miss the
    # evaluation (every round committed before it looked)
    launch = Launch(command, agon_cache, tmp_path / "killed.log", env=paused_at(f"eval_round_{ROUNDS // 3}:0"))
    launch.kill_at(f"eval_round_{ROUNDS // 3}:0")
    committed = _committed(_journal(killed), tmp_path)
    assert committed == ROUNDS // 3  # the premise: killed during the evaluation
    calls = calls_to_finish(_journal(killed), tmp_path)
    out = Launch(command, agon_cache, tmp_path / "again.log").finish()
    in_flight = ROUNDS - committed
    assert (f"[eval] eval start: {in_flight} of {ROUNDS} rounds played in {calls} engine calls, {committed} kept "
            f"from an interrupted run") in out, out[-3000:]
    print(f"killed with {committed} of {ROUNDS} rounds committed; the launch again played {in_flight}")
    assert records(killed) == records(straight)
    assert records(two_stage) == records(straight)
    assert not (killed / run_files.EVAL_PARTS).exists()


@pytest.mark.vllm(seconds=300)
def test_seeded_requests_with_long_prompts_arriving_mid_stream_sample_on_vllms_cpu_build(agon_cache, bounded):
    """Challenges of ~110-token prompts submitted while 256 drafts decode: more prompt tokens than one step
    schedules. Split across steps, a seeded request's generator is rewound, which vLLM's CPU build cannot do ("CPU
    Generator does not use offset"); the engine keeps prompts whole on CPU. Every completion reaches its budget."""
    from agon.models.loading import load_base

    cfg = compose_config(TEST_WORLD + VLLM + ["logger=none"])
    model, tokenizer = load_base(cfg.model, cfg.task, log=lambda *_: None, device="cpu")
    policies = Policies(model, tokenizer, ["A", "B"], cfg.model.lora)
    task = build_task(cfg.task)
    problems = list(task.heldout_problems())
    prompts = [policies.render(task.user_message(problems[i % len(problems)]) + " 1" * 70) for i in range(512)]
    engine = build_engine(cfg, policies, log=lambda *_: None)
    sampling = Sampling(max_new_tokens=32, temperature=1.0, ignore_eos=True)
    try:
        out = engine.stream([Request(p, "A", seed=i) for i, p in enumerate(prompts[:256])], sampling,
                            lambda done: [Request(prompts[256 + k], "B", seed=10_000 + k) for k, _ in done if k < 256])
    finally:
        engine.close()
    assert len(out) == 512 and all(c.n_tokens == 32 for c in out)
