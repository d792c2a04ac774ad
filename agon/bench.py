"""``make bench``: speed of a vanilla GRPO step of agon against TRL's ``GRPOTrainer``, side by side in one process.

Both train the same LoRA (rank 8, all linear layers) on the same Qwen3-architecture model and tokenizer, on the same
arithmetic prompts, with the same group size, batch and completion length, on the same threads. Each side is
warmed up, then timed over ``--steps`` steps; the report is the ratio of median step times (TRL / agon), so the
machine's speed cancels out. Results go to stdout and to ``bench.json``.

It also measures the memory of scoring (per-token log-probabilities, forward and backward) at Qwen3's vocabulary of
151,936 for one batch of 4 sequences x 1,024 completion tokens, on a 2-layer model of Qwen3-0.6B's width: agon's
chunked ``selective_logps`` from hidden states against the straightforward full float32 log-softmax of the whole
logits, each in its own process (peak resident memory, ``ru_maxrss``), so neither inherits the other's allocations.

Left out on purpose: absolute targets. A ratio measured in one run is the claim; seconds depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _setup(hidden: int, layers: int):
    from omegaconf import OmegaConf

    from agon import world
    from agon.config import ArithmeticTaskConfig, TinyWorldConfig
    from agon.tasks import build_task

    tok = world.build_tokenizer()
    shape = TinyWorldConfig(hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2,
                            intermediate_size=3 * hidden)
    model = world.build_model(shape, len(tok), seed=0)
    task = build_task(OmegaConf.structured(ArithmeticTaskConfig(heldout_size=10, train_size=2000)))
    return tok, model, task


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agon.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("bench.json"))
    parser.add_argument("--scoring-child", choices=["selective", "full"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scoring_child:  # one side of the memory comparison, alone in this process
        print(json.dumps(_score_once(args.scoring_child)))
        return
    memory = {kind: _scoring_memory(kind) for kind in ("full", "selective")}
    agon_s = _agon_steps(args)
    trl_s = _trl_steps(args)
    a, t = statistics.median(agon_s), statistics.median(trl_s)
    report = {
        "setup": {k: v for k, v in vars(args).items() if k != "out"},
        "agon_step_s": agon_s, "trl_step_s": trl_s,
        "agon_median_s": a, "trl_median_s": t, "speedup_trl_over_agon": t / a,
        "scoring_memory": memory,
        "scoring_peak_ratio_selective_over_full": memory["selective"]["peak_gib"] / memory["full"]["peak_gib"],
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"vanilla GRPO step, {args.prompts} prompts x {args.generations} completions of <= {args.max_new_tokens} "
          f"tokens, LoRA r=8, {args.hidden}x{args.layers} Qwen3, {torch.get_num_threads()} threads")
    print(f"  agon  median {a:.3f} s/step   ({', '.join(f'{x:.2f}' for x in agon_s)})")
    print(f"  TRL   median {t:.3f} s/step   ({', '.join(f'{x:.2f}' for x in trl_s)})")
    print(f"  ratio TRL/agon = {t / a:.2f}x   (written to {args.out})")
    full, sel = memory["full"], memory["selective"]
    print(f"scoring 4 x {SCORING_TOKENS} tokens at vocabulary {SCORING_VOCAB:,}, forward + backward, peak RSS in "
          f"separate processes: selective {sel['peak_gib']:.2f} GiB vs full log-softmax {full['peak_gib']:.2f} GiB "
          f"= {sel['peak_gib'] / full['peak_gib']:.2f}x (above the loaded model: {sel['scoring_gib']:.2f} vs "
          f"{full['scoring_gib']:.2f} GiB)")


SCORING_VOCAB, SCORING_TOKENS, SCORING_ROWS = 151_936, 1024, 4


def _score_once(kind: str) -> dict[str, float]:
    """Forward + backward of one batch's log-probabilities with ``kind`` scoring; peak RSS in GiB (this process)."""
    from omegaconf import OmegaConf
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agon.config import LoraConfig
    from agon.policies import Completion, Policies
    from agon.scoring import full_logps
    from agon.world import build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=SCORING_VOCAB, hidden_size=1024, intermediate_size=3072, num_hidden_layers=2,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        max_position_embeddings=4096, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    for p in model.parameters():
        p.requires_grad_(False)
    policies = Policies(model, tok, ["A"], OmegaConf.structured(LoraConfig(rank=8, alpha=16)))
    completions = [Completion("", tuple(torch.randint(0, SCORING_VOCAB, (SCORING_TOKENS,)).tolist()), True)
                   for _ in range(SCORING_ROWS)]
    batch = policies.batch_tensors([policies.render("1+2+3")] * SCORING_ROWS, completions)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if kind == "selective":
        logps = policies.token_logps(batch)
    else:
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        logits = policies.model(input_ids=ids, attention_mask=attn, use_cache=False).logits
        logps = full_logps(logits[:, batch["prompt_ids"].size(1) - 1 : -1], batch["completion_ids"])
    logps.sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_gib": peak / 2**20, "scoring_gib": (peak - before) / 2**20}


def _scoring_memory(kind: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "agon.bench", "--scoring-child", kind], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _agon_steps(args) -> list[float]:
    from hydra import compose, initialize_config_dir

    import agon.config  # noqa: F401  (registers the schemas)
    from agon.policies import build_policies
    from agon.recorder import Recorder
    from agon.trainer import Trainer

    tok, model, task = _setup(args.hidden, args.layers)
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "method=grpo", "logger=none", f"trainer.prompts_per_step={args.prompts}",
            f"trainer.num_generations={args.generations}", f"trainer.max_new_tokens={args.max_new_tokens}",
            "trainer.learning_rate=1e-5", "model.lora.rank=8", "model.lora.alpha=16"])
    cfg.task = task.cfg
    policies = build_policies(cfg, model, tok)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, policies, task, Recorder(Path(tmp), enabled=False), Path(tmp), log=lambda *_: None)
        times = []
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            trainer.step()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
    return times


def _trl_steps(args) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig as PeftLora
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok, model, task = _setup(args.hidden, args.layers)
    problems = list(task.train_problems())[: args.prompts * (args.warmup + args.steps + 2)]
    by_prompt = {}
    prompts = []
    for p in problems:
        text = tok.apply_chat_template([{"role": "user", "content": p.question}], tokenize=False,
                                       add_generation_prompt=True)
        by_prompt[text] = p
        prompts.append(text)

    def reward(prompts, completions, **kw):
        return [float(v.correct) for v in task.verify([by_prompt[p] for p in prompts], completions)]

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(output_dir=tmp, per_device_train_batch_size=args.prompts * args.generations,
                            num_generations=args.generations, max_completion_length=args.max_new_tokens,
                            max_steps=args.warmup + args.steps, learning_rate=1e-5, report_to="none",
                            use_cpu=True, logging_steps=10_000, save_strategy="no", temperature=1.0,
                            gradient_checkpointing=False, disable_tqdm=True)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config,
                              train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tok,
                              peft_config=PeftLora(r=8, lora_alpha=16, target_modules="all-linear",
                                                   task_type="CAUSAL_LM"), callbacks=[Clock()])
        trainer.train()
    return times[args.warmup :]


if __name__ == "__main__":
    main()
