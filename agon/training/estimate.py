"""How long a run will take, estimated before its first step: a time model of its engine's work, fed by a short
probe of that engine or by a GPU check's JSON (``python -m agon.estimate`` prints a cell and a sweep, phase by phase).

The model (``Costs`` in, seconds out; nothing here but arithmetic). A decoding step of ``n`` rows whose contexts
sum to ``X`` tokens costs ``fixed + per_row * n + per_context * X``: the fixed part (kernel launches, the weights'
read, the scheduler), each row's own compute, and the read of every row's keys and values, which grows with the
context. Summed over a call that is ``fixed * steps + per_row * tokens + per_context * kv``, ``kv`` being the context
each decoded token read; a call also costs ``per_call`` and the prefill of its prompts. An engine decides how many
calls a stage makes and how many steps and tokens each takes:

- ``hf`` (static batches): rows cut into ``generate`` calls of at most ``generation_batch_tokens`` (rows x (prompt +
  budget)); every row of a call decodes until its longest row ends, and a call of ``r`` rows is ``r`` rows wide;
- ``hf_continuous`` and ``vllm`` (continuous batching): one call per stage that decodes its rows' own tokens, in at
  least as many steps as its longest row, as its tokens over the rows decoded together (``max_num_seqs``) and as its
  context over the KV cache it holds (a full cache every step);
- streamed (an engine that ``streams``, with ``generation.stream``: vLLM): a training step, and a whole evaluation
  (both orders, every chunk), is one call; each challenge is submitted as its draft finishes (at least the longest
  draft plus a challenge of steps), or with the drafts under ``exchange=hidden`` (the longest completion).

Lengths. Early: every completion runs to its budget (an untrained model that does not end its turn; the start
evaluation). Late: completions average ``LATE_FRACTION`` of the budget, a quarter, and the longest of a call still
reaches it: Agon's final traces in the paper average 3.5k of 16k tokens (0.21; GRPO's 8.1k, 0.49, so a GRPO cell wants
``--late-fraction 0.5``), and with a few percent of late traces cut at the budget a call of 128 rows holds one. A
cell's lengths fall linearly from early at step 0 to late at ``SETTLE`` of its steps (half), then stay late.

An evaluation scores the held-out split (``task.heldout_size``) cut to ``eval.n_problems`` (an interim one further to
``eval.interim_problems``), in chunks; with ``eval.equal_generations`` each chunk's drafts are answered again by
their readers (``methods.Evaluation.reads``; streamed, in a stream of their own after the plays'); with
``eval.diagnostic`` it plays the diagnostic's calls after it on the same problems (``diagnostic_calls``, never
streamed).

Besides generation a step scores its completions, forward and backward (``per_scored_token``, ``per_pass`` per
micro-batch), grades them (``per_completion``), and republishes each adapter it trained to an engine that holds a copy
(``per_publish``: vLLM). Left out on purpose: checkpoints, logging, the optimizer's step (small beside the rest),
preemption's recomputation (vLLM's early calls on a full cache take more steps than the bound above), and the
latent exchange's prefix (``hf`` only; its challenge is counted as a visible one).

The probe (``probe``, at every start: about a second on the test world) runs on the run's own engine under a forked
RNG: a warm-up call first (untimed: the first call's setup and, on vLLM, the adapter's first upload), then calls of
1 and ``PROBE_TOKENS`` new tokens, every row to its budget, at ``PROBE_ROWS`` rows of short prompts, of long ones
(the prompt repeated to ``PROBE_CONTEXT`` tokens or what the context allows: the context term) and at an eighth of
the rows (the per-row term), each 1-token call the prefill; a 1-token call after the adapter is marked changed (the
publish); a forward and backward pass over the probe's completions at two widths; their grading. Each timed call is
made twice and the faster kept (another process's work only slows), and a fitted term is never below 0.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

# the probe: new tokens of a timed call, its rows at most, its long prompts' tokens at most, and how often each timed
# call is made (the faster kept)
PROBE_TOKENS = 16
PROBE_ROWS = 64
PROBE_CONTEXT = 1024
PROBE_REPEATS = 2
# late completions' mean as a share of the budget, and the share of a cell's steps over which lengths fall to it
LATE_FRACTION = 0.25
SETTLE = 0.5
# the late lengths' spread below the budget: a lognormal of sigma 0.6 has a mean square of exp(0.36) = 1.43 times its
# squared mean (the KV term reads the square)
LATE_SPREAD = 1.43
# engines whose calls run every row to the call's longest (the others batch continuously)
STATIC = ("hf",)


@dataclass(frozen=True)
class Costs:
    """Seconds of one engine's work on one machine (module docstring: the model)."""

    engine: str
    fixed: float
    per_row: float
    per_context: float
    per_call: float
    per_prompt_token: float
    # a request's own admission besides its tokens (scheduling, its sampler's setup)
    per_request: float = 0.0
    per_publish: float = 0.0
    per_scored_token: float = 0.0
    # rows scored alone (``solo_row_tokens`` or longer: no padding, no mask); None: per_scored_token
    per_solo_token: float | None = None
    per_pass: float = 0.0
    per_completion: float = 0.0
    # a finished round of a streamed evaluation written and synced to its journal (a kill loses only those in flight)
    per_commit: float = 0.0
    # KV tokens held at once (None: as many as asked) and rows decoded together (None: all)
    capacity: float | None = None
    max_rows: int | None = None
    # where the numbers come from, said beside them
    source: str = ""

    @property
    def static(self) -> bool:
        return self.engine in STATIC


@dataclass(frozen=True)
class Lengths:
    """Completion tokens of a stage's rows: their mean, mean square, the longest of a call, and the budget."""

    mean: float
    square: float
    longest: float
    budget: int

    @classmethod
    def at(cls, budget: int, fraction: float) -> "Lengths":
        """Completions averaging ``fraction`` of the budget, spread below it (``LATE_SPREAD``), the longest of a call
        at it; at 1, every completion to the budget (early)."""
        mean = fraction * budget
        return cls(mean, min(budget * mean, LATE_SPREAD * mean * mean), budget, budget)


@dataclass(frozen=True)
class Stage:
    """Rows sampled together by one role: how many, their prompt tokens (mean), their completions."""

    rows: float
    prompt: float
    lengths: Lengths


def kv_reads(s: Stage) -> float:
    """Tokens of context read over the stage's decoding: each row's prompt and its own growing completion."""
    return s.rows * (s.prompt * s.lengths.mean + s.lengths.square / 2)


def continuous_seconds(c: Costs, stages: Sequence[Stage], tail: float) -> float:
    """One call of continuous batching holding ``stages``, in no fewer than ``tail`` decoding steps."""
    tokens = sum(s.rows * s.lengths.mean for s in stages)
    kv = sum(kv_reads(s) for s in stages)
    steps = max(tail, tokens / c.max_rows if c.max_rows else 0.0, kv / c.capacity if c.capacity else 0.0)
    requests = sum(s.rows for s in stages)
    prefill = sum(s.rows * s.prompt for s in stages)
    return (c.per_call + c.per_request * requests + c.per_prompt_token * prefill + c.fixed * steps
            + c.per_row * tokens + c.per_context * kv)


def static_seconds(c: Costs, s: Stage, batch_tokens: int) -> float:
    """``generate`` calls of at most ``batch_tokens`` (rows x (prompt + budget)), each row decoding to the call's
    longest."""
    per_call = max(1, batch_tokens // (math.ceil(s.prompt) + s.lengths.budget))
    calls = math.ceil(s.rows / per_call)
    steps = s.lengths.longest
    per_row = (c.per_request + c.per_prompt_token * s.prompt + c.per_row * steps
               + c.per_context * (s.prompt * steps + steps ** 2 / 2))
    return calls * (c.per_call + c.fixed * steps) + s.rows * per_row


def stage_seconds(c: Costs, s: Stage, batch_tokens: int) -> float:
    """One stage's call (or calls) at the token budget of its calls (``trainer.`` or ``eval.generation_batch_tokens``):
    ``hf`` cuts its calls by it, and ``hf_continuous``'s paged cache holds it."""
    if s.rows <= 0:
        return 0.0
    if c.static:
        return static_seconds(c, s, batch_tokens)
    return continuous_seconds(replace(c, capacity=float(batch_tokens)) if c.engine == "hf_continuous" else c, [s],
                              s.lengths.longest)


def chain(drafts: Lengths, answers: Lengths) -> float:
    """Decoding steps of the longest draft-then-challenge chain: a longest draft with a mean answer, or the reverse
    (both longest together only where every completion is: early)."""
    return max(drafts.longest + answers.mean, drafts.mean + answers.longest)


@dataclass(frozen=True)
class Plan:
    """What a run plays, counted from its config (``plan``): the stages of a step and of an evaluation."""

    streamed: bool
    # a training step: rows per stage (this rank's), stages (0: nothing trains), adapters it updates
    step_rows: float
    step_stages: int
    trained: int
    # the challenge reads its draft (visible, latent); hidden: the plain prompt
    chained: bool
    budget: int
    batch_tokens: int
    eval_budget: int
    eval_batch_tokens: int
    # (problems, samples) of a full and an interim evaluation; problems per chunk; stages of each play
    full: tuple[int, int]
    interim: tuple[int, int]
    chunk: int
    plays: tuple[int, ...]
    world: int
    steps: int
    every: int
    at_start: bool
    # prompt tokens of a draft and of a challenge (mean)
    prompt: float
    challenge: float
    scoring_batch_tokens: int
    solo_row_tokens: int
    micro_batch_size: int | None
    # forward-and-backward passes per update (a forward alone counted as a third of one)
    passes: float
    # the diagnostic at every evaluation (eval.diagnostic): samples per problem (0: none), and its calls per sample
    # row, drafts on the plain prompt and answers on the challenge's (``diagnostic_calls``)
    diagnostic: int = 0
    diagnosed: tuple[int, int] = (0, 0)
    # the plays' drafts answered again at equal generations (eval.equal_generations): an answer per row each
    reads: int = 0


def diagnostic_calls(cfg: Any) -> tuple[int, int]:
    """(drafts, answers): the diagnostic's calls per sample row (``agon.game.diagnostic.diagnose``), each a call of
    its own. A draft by every adapter and the base; an answer by every pair of them (cross-play), then by each
    challenger after its rival's recap (the cross-play's own call where the exchange is visible), a correct and a
    wrong one (a task with worked solutions; the wrong one counted on every row, an upper bound) and none, and under
    ``latent`` the same three as prefixes; then by each player after each kind of the check battery (every kind
    counted on every row, an upper bound: a task makes some kinds on some problems only)."""
    from agon.core.methods import get_method
    from agon.tasks import Task, load_task_kind

    players = len(get_method(cfg.method.name).adapters) + 1
    kind = load_task_kind(str(cfg.task.kind))
    worked = kind is None or kind.worked_solution is not Task.worked_solution
    latent = cfg.exchange.mode == "latent"
    conditions = (cfg.exchange.mode != "visible") + 2 * worked + 1 + latent * (2 * worked + 1)
    from agon.tasks import BATTERY_KINDS

    return players, players * players + players * (conditions + len(BATTERY_KINDS))


def plan(cfg: Any, prompt: float, challenge: float, streams: bool = False, world: int = 1) -> Plan:
    """The ``Plan`` of ``cfg`` at draft and challenge prompts of ``prompt`` and ``challenge`` tokens, on an engine
    that ``streams`` (or not), each of ``world`` processes playing its share."""
    from agon.core.methods import get_method
    from agon.game.cascade import eval_size

    t, e = cfg.trainer, cfg.eval
    method = get_method(cfg.method.name)

    def size(phase: str) -> tuple[int, int]:
        """(problems, samples) as the trainer scores them: the held-out split cut to eval.n_problems, then to the
        phase's size."""
        problems, samples = eval_size(e, phase)
        return min(problems, e.n_problems, cfg.task.heldout_size), samples

    trains = bool(method.trains and cfg.method.train and t.max_steps > 0)
    turn = method.turn(cfg.rotation.mode, 0) if trains else None
    trained = {p for p in (turn.drafter, turn.challenger) if isinstance(p, str)} if turn else set()
    hidden = cfg.exchange.mode == "hidden"
    return Plan(
        streamed=bool(streams and cfg.generation.stream), step_rows=t.prompts_per_step * t.num_generations / world,
        step_stages=0 if turn is None else 1 if turn.challenger is False else 2, trained=len(trained),
        chained=not hidden, budget=t.max_new_tokens, batch_tokens=t.generation_batch_tokens,
        eval_budget=e.max_new_tokens, eval_batch_tokens=e.generation_batch_tokens, full=size("final"),
        interim=size("train"), chunk=-(-max(e.chunk_problems, world) // world) * world,
        plays=tuple(1 if answerer is False else 2 for _, answerer in method.evaluation(cfg.rotation.mode).plays),
        world=world, steps=t.max_steps if trains else 0, every=e.every, at_start=e.at_start, prompt=prompt,
        challenge=prompt if hidden else challenge, scoring_batch_tokens=t.scoring_batch_tokens,
        solo_row_tokens=t.solo_row_tokens, micro_batch_size=t.micro_batch_size,
        passes=t.num_iterations + (t.num_iterations > 1) / 3 + (t.beta != 0) / 3,
        diagnostic=e.diagnostic_samples if e.diagnostic else 0,
        diagnosed=diagnostic_calls(cfg) if e.diagnostic else (0, 0),
        reads=len(method.evaluation(cfg.rotation.mode).reads()) if e.equal_generations else 0)


def update_seconds(p: Plan, c: Costs, lengths: Lengths) -> float:
    """Scoring and backward of a step's completions, every stage's rows (a role each). A row of ``solo_row_tokens``
    or more is scored alone at its own length; a stage that fits one micro-batch pads every row to its longest; a
    longer one is cut into micro-batches of rows of similar length, which pad little (each row at its mean)."""
    total = 0.0
    for prompt in (p.prompt, p.challenge)[: p.step_stages]:
        row, widest = prompt + lengths.mean, prompt + lengths.longest
        if row >= p.solo_row_tokens:
            passes, tokens = p.step_rows, p.step_rows * row
            rate = c.per_scored_token if c.per_solo_token is None else c.per_solo_token
        else:
            one = p.step_rows * widest <= p.scoring_batch_tokens
            tokens = p.step_rows * (widest if one else row)
            passes = max(math.ceil(tokens / p.scoring_batch_tokens), math.ceil(p.step_rows / (p.micro_batch_size
                                                                                            or p.step_rows)))
            rate = c.per_scored_token
        total += p.passes * (passes * c.per_pass + tokens * rate)
    return total


def step_seconds(p: Plan, c: Costs, lengths: Lengths, streamed: bool | None = None) -> float:
    """One training step: generation, grading, publishing the trained adapters, scoring and backward."""
    if not p.step_stages:
        return 0.0
    streamed = p.streamed if streamed is None else streamed
    drafts = Stage(p.step_rows, p.prompt, lengths)
    answers = Stage(p.step_rows, p.challenge, lengths) if p.step_stages == 2 else None
    if streamed and answers is not None:
        tail = chain(lengths, lengths) if p.chained else lengths.longest
        generation = continuous_seconds(c, [drafts, answers], tail)
    else:
        generation = sum(stage_seconds(c, s, p.batch_tokens) for s in (drafts, answers) if s is not None)
    graded = p.step_rows * p.step_stages
    return generation + c.per_completion * graded + c.per_publish * p.trained + update_seconds(p, c, lengths)


def eval_seconds(p: Plan, c: Costs, lengths: Lengths, size: tuple[int, int], streamed: bool | None = None) -> float:
    """One evaluation of ``size`` (problems, samples): every play of every chunk, two stages where a play answers,
    and the diagnostic's calls where the plan has it."""
    streamed = p.streamed if streamed is None else streamed
    problems, samples = size
    chunks = [min(p.chunk, problems - i) for i in range(0, problems, p.chunk)]
    completions = sum(chunks) * samples / p.world * (sum(p.plays) + p.reads)
    if streamed:
        rows = sum(chunks) * samples / p.world
        stages = [Stage(rows * len(p.plays), p.prompt, lengths)]
        if 2 in p.plays:
            stages.append(Stage(rows * p.plays.count(2), p.challenge, lengths))
        tail = chain(lengths, lengths) if p.chained and len(stages) > 1 else lengths.longest
        generation = continuous_seconds(c, stages, tail) + c.per_commit * rows * (len(p.plays) + p.reads)
        if p.reads:  # their own stream, after the plays' drafts exist
            generation += continuous_seconds(c, [Stage(rows * p.reads, p.challenge, lengths)], lengths.longest)
    else:
        generation = 0.0
        for n in chunks:
            rows = n * samples / p.world
            for stages in p.plays:
                generation += stage_seconds(c, Stage(rows, p.prompt, lengths), p.eval_batch_tokens)
                if stages == 2:
                    generation += stage_seconds(c, Stage(rows, p.challenge, lengths), p.eval_batch_tokens)
            generation += p.reads * stage_seconds(c, Stage(rows, p.challenge, lengths), p.eval_batch_tokens)
    if p.diagnostic:  # after the evaluation, on its problems, a call per player and condition (one process)
        rows = problems * p.diagnostic
        drafts, answers = p.diagnosed
        generation += drafts * stage_seconds(c, Stage(rows, p.prompt, lengths), p.eval_batch_tokens)
        generation += answers * stage_seconds(c, Stage(rows, p.challenge, lengths), p.eval_batch_tokens)
        completions += rows * (drafts + answers)
    return generation + c.per_completion * completions


@dataclass(frozen=True)
class Phase:
    """A phase of a cell: how many units (steps, evaluations), one unit early and late, and the phase's total at the
    planned lengths."""

    name: str
    count: int
    early_s: float
    late_s: float
    total_s: float


def cell(p: Plan, c: Costs, early: float = 1.0, late: float = LATE_FRACTION, streamed: bool | None = None,
         settle: float = SETTLE) -> list[Phase]:
    """The phases of one cell: the start evaluation (early lengths), the steps (early to late over ``settle`` of
    them), the interim evaluations (at their step's lengths) and the final one, each completion ``early`` and ``late``
    of its budget on average."""
    steps = p.steps

    def fraction(step: int) -> float:
        return early + (late - early) * (min(1.0, step / (settle * steps)) if steps else 0.0)

    def step(f: float) -> float:
        return step_seconds(p, c, Lengths.at(p.budget, f), streamed)

    def evaluation(f: float, size: tuple[int, int]) -> float:
        return eval_seconds(p, c, Lengths.at(p.eval_budget, f), size, streamed)

    out = []
    if p.at_start:
        out.append(Phase("start evaluation", 1, evaluation(early, p.full), evaluation(late, p.full),
                         evaluation(early, p.full)))
    if steps:
        planned = sum(step(fraction(s)) for s in range(steps))
        out.append(Phase("training steps", steps, step(early), step(late), planned))
        at = range(p.every, steps, p.every) if p.every else range(0)
        if at:
            out.append(Phase("interim evaluations", len(at), evaluation(early, p.interim), evaluation(late, p.interim),
                             sum(evaluation(fraction(s), p.interim) for s in at)))
    out.append(Phase("final evaluation", 1, evaluation(early, p.full), evaluation(late, p.full),
                     evaluation(fraction(steps), p.full)))
    return out


def duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 172_800 else f"{seconds / 86_400:.1f} days"


# -- the probe --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """What the probe measured: the engine's ``Costs`` and the run's prompt lengths (draft, challenge)."""

    costs: Costs
    prompt: float
    challenge: float
    rows: int
    contexts: tuple[float, float]


def fit(width: int, narrow: int, contexts: tuple[float, float], short: float, long: float, thin: float
        ) -> tuple[float, float, float]:
    """(fixed, per_row, per_context) from the decoding step's seconds at ``width`` rows and two mean contexts
    (``short``, ``long``) and at ``narrow`` rows and the short context (``thin``); each at least 0, so that noise on a
    busy machine never makes a term negative."""
    x_short, x_long = contexts
    per_context = max(0.0, (long - short) / (width * (x_long - x_short))) if x_long > x_short else 0.0
    per_row = max(0.0, (short - thin - per_context * (width - narrow) * x_short) / (width - narrow))
    fixed = max(0.0, thin - per_row * narrow - per_context * narrow * x_short)
    return fixed, per_row, per_context


def _padded(policies: Any, task: Any, model_cfg: Any, message: str, tokens: int) -> str:
    """The rendered prompt of ``message`` repeated to about ``tokens`` tokens (never more)."""
    from agon.game.rollout import render

    def length(n: int) -> int:
        return len(policies.prompt_ids([render(policies, task, model_cfg, " ".join([message] * n))])[0])

    n = max(1, tokens // max(1, length(1)))
    while n > 1 and length(n) > tokens:
        n = max(1, n * tokens // length(n) if length(n) > tokens + 8 else n - 1)
    return render(policies, task, model_cfg, " ".join([message] * n))


def probe(cfg: Any, policies: Any, task: Any, engine: Any, problems: Sequence[Any], width: int = PROBE_ROWS,
          directory: Any = None) -> Probe:
    """Measure ``engine`` (module docstring: the probe) under a forked RNG: the run draws what it would have drawn.
    ``directory``: where the run writes (a synced write is timed there; None: the system's temporary folder)."""
    from agon.engines import Sampling
    from agon.game.cascade import forked_rng
    from agon.game.rollout import render

    t = cfg.trainer
    width = max(2, width)
    narrow = max(1, width // 8)
    problems = [problems[i % len(problems)] for i in range(width)]
    messages = [task.user_message(p) for p in problems]
    short = [render(policies, task, cfg.model, m) for m in messages]
    room = (policies.context or 10 ** 9) - PROBE_TOKENS - 1
    v = cfg.generation.get("vllm")
    if cfg.generation.engine == "vllm" and v is not None and v.max_model_len:
        room = min(room, v.max_model_len - PROBE_TOKENS - 1)
    lengths = [len(x) for x in policies.prompt_ids(short)]
    p_short = sum(lengths) / width
    # each row its own (an engine that caches prefixes would prefill copies of one prompt for nothing)
    long = [_padded(policies, task, cfg.model, m, min(room, PROBE_CONTEXT)) for m in messages]
    p_long = sum(len(x) for x in policies.prompt_ids(long)) / width
    adapter = policies.adapters[0] if policies.adapters else None

    def sampling(tokens: int) -> Any:
        return Sampling(tokens, t.temperature, t.top_p, t.top_k, t.generation_batch_tokens, ignore_eos=True)

    def timed(prompts: list[str], tokens: int, repeats: int = PROBE_REPEATS) -> tuple[float, list[Any]]:
        """The least seconds of ``repeats`` engine calls as the game makes them (``stream`` where the engine has it,
        ``sample`` else): another process's work only ever slows a call."""
        best, out = float("inf"), []
        for _ in range(repeats):
            start = time.perf_counter()
            if hasattr(engine, "stream"):
                from agon.engines.base import Request

                out = engine.stream([Request(p, adapter) for p in prompts], sampling(tokens))
            else:
                out = engine.sample(prompts, adapter, sampling(tokens))
            best = min(best, time.perf_counter() - start)
        return best, out

    def decode(prompts: list[str]) -> tuple[float, float, list[Any]]:
        """(prefill's seconds: a 1-token call, seconds per decoding step, the completions)."""
        first, _ = timed(prompts, 1)
        whole, out = timed(prompts, PROBE_TOKENS)
        return first, max(0.0, whole - first) / (PROBE_TOKENS - 1), out

    with forked_rng():
        timed(short, PROBE_TOKENS, 1)  # warm-up: the first call's setup, vLLM's first upload of the adapter
        first, d_short, out = decode(short)
        first_long, d_long, _ = decode(long)
        first_narrow, d_narrow, _ = decode(short[:narrow])
        publish = 0.0
        if adapter is not None:  # an engine holding a copy of the adapter uploads it again before the first call
            policies.mark_updated(adapter)
            publish = max(0.0, timed(short, 1, 1)[0] - timed(short, 1, 1)[0])
        scored = _update_probe(cfg, policies, adapter, short, out, narrow)
        start = time.perf_counter()  # what the game does with a completion besides sampling it
        task.verify(problems, [c.text for c in out])
        policies.prompt_ids([render(policies, task, cfg.model, task.challenge_message(p, task.recap(c.text)))
                             for p, c in zip(problems, out)])
        per_completion = (time.perf_counter() - start) / width
        per_commit = _commit_probe(directory)
    contexts = (p_short + PROBE_TOKENS / 2, p_long + PROBE_TOKENS / 2)
    fixed, per_row, per_context = fit(width, narrow, contexts, d_short, d_long, d_narrow)
    # a 1-token call is the call, its requests and their prompts' tokens: two widths and two prompt lengths
    per_prompt_token = max(0.0, (first_long - first) / (width * (p_long - p_short))) if p_long > p_short else 0.0
    per_request = max(0.0, (first - first_narrow) / (width - narrow) - per_prompt_token * p_short)
    per_call = max(0.0, first_narrow - (per_request + per_prompt_token * p_short) * narrow)
    per_pass, per_token = scored
    # a challenge's prompt holds the recap of a worked solution where the task has one (the offline world's), else an
    # empty one: a truncated draft has none, and a real model's few hundred tokens of summary are small beside 16k
    worked = [task.worked_solution(p) for p in problems]
    recaps = [task.recap(w) if w else "" for w in worked]
    challenges = [render(policies, task, cfg.model, task.challenge_message(p, r)) for p, r in zip(problems, recaps)]
    p_challenge = sum(len(x) for x in policies.prompt_ids(challenges)) / width
    from agon.engines import engine_name

    name = engine_name(cfg)
    capacity, max_rows = _limits(cfg, name, policies)
    costs = Costs(name, fixed, per_row, per_context, per_call, per_prompt_token, per_request, publish, per_token, None,
                  per_pass, per_completion, per_commit, capacity, max_rows,
                  f"probed after a warm-up at {width} rows and {p_short:.0f} and {p_long:.0f} prompt tokens")
    return Probe(costs, p_short, p_challenge, width, contexts)


def _commit_probe(directory: Any = None) -> float:
    """Seconds of a small record appended and synced in ``directory``, as a streamed evaluation commits a round."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory(dir=directory, prefix=".estimate-") as folder:
        best = float("inf")
        with open(os.path.join(folder, "journal"), "ab") as f:
            for _ in range(PROBE_REPEATS + 1):
                start = time.perf_counter()
                f.write(bytes(2048))
                f.flush()
                os.fsync(f.fileno())
                best = min(best, time.perf_counter() - start)
    return best


def _update_probe(cfg: Any, policies: Any, adapter: str | None, prompts: list[str], completions: list[Any],
                  narrow: int) -> tuple[float, float]:
    """(seconds per pass, seconds per token) of the update's forward and backward, from the probe's completions at
    their width and at ``narrow`` rows; nothing is stepped, and the gradients are dropped."""
    if adapter is None:
        return 0.0, 0.0
    t = cfg.trainer
    batch = policies.batch_tensors(prompts, completions)
    times = []
    for rows in (len(prompts), narrow):
        part, best = batch[:rows], float("inf")
        for _ in range(PROBE_REPEATS):
            start = time.perf_counter()
            with policies.use_adapter(adapter):
                logps = policies.token_logps(part, None, t.temperature, t.logit_chunk_tokens, t.top_k, t.top_p)
                logps.sum().backward()
            best = min(best, time.perf_counter() - start)
            for weight in policies.parameters(adapter):
                weight.grad = None
        times.append((best, int(part.prompt_mask.sum() + part.completion_mask.sum())))
    (wide, wide_tokens), (thin, thin_tokens) = times
    per_token = max(0.0, (wide - thin) / max(wide_tokens - thin_tokens, 1))
    return max(0.0, thin - per_token * thin_tokens), per_token


def _limits(cfg: Any, engine: str, policies: Any) -> tuple[float | None, int | None]:
    """(KV tokens held at once, rows decoded together) of ``engine`` here: the paged cache of continuous batching
    (``generation_batch_tokens``); vLLM's cache, ``cpu_kv_cache_gib`` on a CPU, on a GPU its share of the card less
    the weights and ``VLLM_RESERVE_GIB``."""
    if engine == "hf_continuous":
        return float(cfg.trainer.generation_batch_tokens), None
    if engine != "vllm":
        return None, None
    v = cfg.generation.vllm
    per_token = kv_bytes(policies.model.config, cfg.model.dtype)
    if policies.device.type == "cpu":
        return v.cpu_kv_cache_gib * 2 ** 30 / per_token, v.max_num_seqs
    import torch

    memory = torch.cuda.get_device_properties(policies.device).total_memory / 2 ** 30
    weights = sum(w.numel() * w.element_size() for w in policies.model.parameters()) / 2 ** 30
    capacity = max(0.0, v.gpu_memory_utilization * memory - weights - VLLM_RESERVE_GIB) * 2 ** 30 / per_token
    return capacity, v.max_num_seqs


def kv_bytes(config: Any, dtype: str) -> float:
    """Bytes of keys and values one token keeps: layers x KV heads x head width x 2 x the dtype's bytes."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config

    def get(key: str) -> Any:
        return text.get(key) if isinstance(text, dict) else getattr(text, key, None)

    heads = get("num_attention_heads")
    head_dim = get("head_dim") or get("hidden_size") // heads
    width = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(dtype), 2)
    return 2.0 * get("num_hidden_layers") * (get("num_key_value_heads") or heads) * head_dim * width


# -- a GPU check's JSON -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPU:
    """What the model reads of a GPU: its peak memory bandwidth (bytes/s) and its memory (GiB)."""

    bandwidth: float
    memory_gib: float


# the cards a researcher plans on (SXM, as the clusters have them): decoding is bound by the memory's bandwidth
GPUS = {"H100": GPU(3.35e12, 79.6), "H200": GPU(4.8e12, 139.8)}
# the share of the peak bandwidth a decoding step's reads of keys and values get: 2.4-2.8 of the H100's 3.35 TB/s
# and 3.4-4.0 of the H200's 4.8 (vLLM's paged attention on long contexts), 0.72-0.84 of the peak
BANDWIDTH_SHARE = 0.75
# vLLM's decoding step besides the context, on a GPU (CUDA graphs, punica LoRA, its sampler and scheduler): vLLM
# runs Qwen3-0.6B at 4.2 ms per output token at concurrency 1 on an A100 without LoRA (tenstorrent/tt-inference-server
# #340); LoRA's kernels and the sampler's top-k/top-p sort take it to 4-6 ms, and each row 15-25 us. Not measured
# here: a GPU check with a vllm step replaces the fixed part with its own
VLLM_FIXED = 5e-3
VLLM_PER_ROW = 20e-6
VLLM_PER_CALL = 0.05
# writing an adapter (a few tens of MB) and loading it into vLLM
VLLM_PUBLISH = 1.0
# GiB of a GPU's vLLM share that is neither weights nor KV cache: activations of a prefill, CUDA graphs
VLLM_RESERVE_GIB = 2.0
# the GPU check's step prompts (its arithmetic task in Qwen3's chat format): docs/gpu.md reads the step's mean context
# as about 0.6k tokens at 1,024 new tokens
CHECK_PROMPT_TOKENS = 90


def gpu_of(name: str) -> tuple[str, GPU]:
    """The entry of ``GPUS`` that ``name`` (``torch.cuda.get_device_name``, or ``H100``) names."""
    for key, gpu in GPUS.items():
        if key.lower() in name.lower():
            return key, gpu
    raise ValueError(f"no bandwidth known for the GPU {name!r}; known: {', '.join(GPUS)}")


def check_reports(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The reports of a GPU check's JSON: ``agon.bench.gpu``'s own (one), or several runs of one session
    (``{"runs": [{"report": ...}]}``, as ``docs/gpu-h200-2026-12-04.json``)."""
    return [r["report"] for r in data["runs"]] if "runs" in data else [data]


def from_gpu_check(data: dict[str, Any], cfg: Any, engine: str, device: str | None = None) -> Costs:
    """The ``Costs`` of ``engine`` for ``cfg``'s model from a GPU check's JSON, on the check's GPU or on ``device``
    (``H100``, ``H200``): the context term scaled by the ratio of their bandwidths, the KV cache from its memory."""
    reports = check_reports(data)
    measured_name, measured = gpu_of(reports[0]["device"])
    target_name, target = gpu_of(device) if device else (measured_name, measured)
    scale = measured.bandwidth / target.bandwidth
    kv = kv_bytes(_shape(cfg), cfg.model.dtype)
    steps = [s for r in reports for s in r.get("step", []) if s.get("engine") == engine and "decode_step_s" in s]
    points = [p for r in reports if (r.get("context") or {}).get("engine") == engine
              for p in r["context"]["points"] if "decode_step_s" in p]
    cases = {k: v for r in reports for k, v in ((r.get("scoring") or {}).get("cases") or {}).items() if "seconds" in v}
    weights = next((c["allocated_before_gib"] for c in cases.values() if "allocated_before_gib" in c), 0.0)
    notes = []
    per_context = kv / (BANDWIDTH_SHARE * measured.bandwidth)
    if steps and points:  # the decoding step at two contexts: the context term measured
        s, q = steps[-1], points[-1]
        x_step = CHECK_PROMPT_TOKENS + s["new_tokens"] / 2
        x_point = q["prompt_tokens_mean"] + q["new_tokens"] / 2
        rows = s["prompts_per_step"] * s["num_generations"]
        per_context = max(per_context, (q["decode_step_s"] - s["decode_step_s"]) / (rows * (x_point - x_step)))
        notes.append(f"decoding measured at {x_step:.0f} and {x_point:.0f} tokens of context")
    if steps:
        s = steps[-1]
        rows = s["prompts_per_step"] * s["num_generations"]
        per_row = VLLM_PER_ROW if engine == "vllm" else 0.0  # transformers' eager steps: launch-bound, one width
        fixed = max(0.0, s["decode_step_s"] - per_row * rows
                    - per_context * rows * (CHECK_PROMPT_TOKENS + s["new_tokens"] / 2))
        notes.append(f"{engine} measured: {s['decode_step_s'] * 1e3:.0f} ms per decoding step at {rows} rows")
    elif engine == "vllm":
        fixed, per_row = VLLM_FIXED, VLLM_PER_ROW
        notes.append(f"vllm not in the check: {VLLM_FIXED * 1e3:g} ms + {VLLM_PER_ROW * 1e6:g} us per row per step "
                     f"(stated), the KV read at {BANDWIDTH_SHARE:g} of the bandwidth")
    else:
        raise ValueError(f"the GPU check holds no {engine} step; it has "
                         f"{sorted({s.get('engine') for r in reports for s in r.get('step', [])})}")
    solo, padded = cases.get("one_row"), cases.get("training_micro_batch")
    per_scored = padded["seconds"] / padded["real_tokens"] if padded else 0.0
    per_solo = solo["seconds"] / solo["real_tokens"] if solo else None
    if engine == "vllm":
        v = cfg.generation.vllm
        capacity = max(0.0, v.gpu_memory_utilization * target.memory_gib - weights - VLLM_RESERVE_GIB) * 2 ** 30 / kv
        max_rows: int | None = v.max_num_seqs
    else:
        capacity, max_rows = (float(cfg.trainer.generation_batch_tokens) if engine != "hf" else None), None
    where = (f"{target_name}, scaled from the check's {measured_name} by its bandwidth ({scale:.2f}x the context "
             f"term)" if target_name != measured_name else measured_name)
    return Costs(engine, fixed, per_row, per_context * scale, VLLM_PER_CALL if engine == "vllm" else 0.0,
                 # a prefill is a forward pass: a third of the scoring's forward and backward
                 per_prompt_token=per_scored / 3, per_publish=VLLM_PUBLISH if engine == "vllm" else 0.0,
                 per_scored_token=per_scored, per_solo_token=per_solo, capacity=capacity, max_rows=max_rows,
                 source=f"{where}; {'; '.join(notes)}")


def _shape(cfg: Any) -> dict[str, Any]:
    """The model's published shape (``model.shape``), or the offline world's."""
    if cfg.model.name == "tiny" and not cfg.model.get("shape"):
        w = cfg.model.tiny
        return dict(num_hidden_layers=w.num_layers, num_attention_heads=w.num_heads,
                    num_key_value_heads=w.num_kv_heads, hidden_size=w.hidden_size)
    from agon.families import get_family

    if not cfg.model.get("shape"):
        raise ValueError(f"model.name={cfg.model.name} has no model.shape: the KV cache's size per token is unknown")
    return get_family(cfg.model.family).shape.sizes[cfg.model.shape]


# -- the start-up line ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    probe: Probe
    plan: Plan
    phases: tuple[Phase, ...]

    def _unit(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    def line(self) -> str:
        p, c = self.plan, self.probe.costs
        parts = []
        step = self._unit("training steps")
        if step:
            parts.append(f"per training step {duration(step.early_s)} early (every completion to its {p.budget}-token "
                         f"budget) to {duration(step.late_s)} late (a mean of {LATE_FRACTION:g} of it, the longest of "
                         f"a call at it)")
        full = self._unit("final evaluation")
        parts.append(f"per full evaluation ({p.full[0]} x {p.full[1]}) {duration(full.early_s)} to "
                     f"{duration(full.late_s)}")
        interim = self._unit("interim evaluations")
        if interim:
            parts.append(f"per interim one ({p.interim[0]} x {p.interim[1]}) {duration(interim.early_s)} to "
                         f"{duration(interim.late_s)}")
        total = sum(ph.total_s for ph in self.phases)
        if c.static:
            parts.append(f"{c.engine}'s calls last as long as their longest row, early or late")
        return (f"[estimate] engine {c.engine}: {'streamed' if p.streamed else 'two-stage'}, {'; '.join(parts)}; "
                f"the run about {duration(total)}. Decoding {c.fixed * 1e3:.2f} ms + {c.per_row * 1e6:.1f} us per "
                f"row + {c.per_context * 1e9:.1f} ns per row and token of context per step, {c.source} "
                f"(python -m agon.estimate: the phases)")


def estimate(cfg: Any, trainer: Any) -> Estimate:
    """Probe ``trainer``'s engine and scale to the run's steps and evaluations (module docstring)."""
    world = trainer.ranks.world
    t, e = cfg.trainer, cfg.eval
    rows = t.prompts_per_step * t.num_generations // world or min(e.chunk_problems, e.n_problems) * e.samples
    measured = probe(cfg, trainer.policies, trainer.task, trainer.engine, trainer.heldout or trainer.pool,
                     min(rows, PROBE_ROWS), trainer.run_dir)
    streams = bool(getattr(type(trainer.engine), "streams", False))
    p = plan(cfg, measured.prompt, measured.challenge, streams, world)
    return Estimate(measured, p, tuple(cell(p, measured.costs)))
