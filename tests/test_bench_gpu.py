"""The GPU check (agon.bench.gpu) refuses without CUDA, runs every part on a CPU at a tiny shape (both engines a GPU
image without vLLM has, the padded micro-batch training builds, a head chunk, a longer context), keeps each part's
result on disk as it comes, and records a failing part without losing the others: so a GPU session's one try is
not spent on a typo."""

from __future__ import annotations

import json

import pytest
import torch

from agon.bench import gpu as bench_gpu
from agon.bench.gpu import main

COLLECTIVES = ["init_process_group", "sum_stats_cpu_float64", "sum_grads_fp32", "broadcast_adapter", "gather_objects",
               "share_object", "barrier"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_refuses_without_cuda(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "out")]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.long
def test_the_cpu_check_measures_every_part(tmp_path):
    out = tmp_path / "out"
    assert main(["--cpu-check", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["bench-gpu.json"]  # nothing else, no temporary file left
    report = json.loads((out / "bench-gpu.json").read_text())
    assert report["finished"] and report["errors"] == [] and report["torch"] == torch.__version__
    assert report["transformers"] and report["date"] and report["device"].startswith("cpu")

    coll = report["collectives"]
    assert coll["backend"] == "gloo" and coll["all_ok"] and coll["child"]["returncode"] == 0
    assert [k for k in coll if isinstance(coll[k], dict) and "ok" in coll[k]] == COLLECTIVES
    assert all(coll[k]["ok"] is True for k in COLLECTIVES)
    assert coll["init_process_group"]["accelerate_processes"] == 1  # a real group of one, not the no-op path

    scoring = report["scoring"]
    assert scoring["lora_rank"] == 16 and scoring["gradient_checkpointing"] is True
    assert (scoring["solo_row_tokens"], scoring["scoring_batch_tokens"]) == (16, 64)
    one, batch = scoring["cases"]["one_row"], scoring["cases"]["training_micro_batch"]
    assert one["row_tokens"] == [32] and one["width"] == 32 and one["seconds"] > 0
    # the micro-batch training builds: several rows, all under solo_row_tokens, padded within the token budget
    assert len(batch["row_tokens"]) > 1 and max(batch["row_tokens"]) < 16 and len(set(batch["row_tokens"])) > 1
    assert len(batch["row_tokens"]) * batch["width"] <= 64 and batch["seconds"] > 0
    for case in (one, batch):
        assert case["sdpa_backends"] and set(case["sdpa_backends"]) <= set(bench_gpu.SDPA_OPS.values())
    assert sorted(scoring["logit_chunks"]) == ["16", "64"]
    for n, chunk in scoring["logit_chunks"].items():
        assert chunk["chunk_tokens"] == int(n) and chunk["seconds"] > 0
        assert chunk["fp32_logits_gib"] == int(n) * 151_936 * 4 / 2**30

    # both engines of a GPU image without vLLM, the one the presets fall back to first
    assert [s["engine"] for s in report["step"]] == ["hf_continuous", "hf"]
    for step in report["step"]:
        assert step["new_tokens"] == 8 and len(step["step_s"]) == 1 and step["generated_tokens_per_s"] > 0
        # both roles of one step: 2 prompts x 2 completions each, at most 8 tokens apiece
        assert 0 < step["generated_tokens_per_step"][0] <= 2 * 2 * 2 * 8
        # one engine call per role, timed, and the attention its layers ran with
        assert [c["rows"] for c in step["engine_calls"]] == [4, 4] and step["decode_step_s"] > 0
        assert step["attention"] and sum(step["attention_seen"].values()) > 0
    assert [s["engine_class"] for s in report["step"]] == ["HFContinuousEngine", "HFEngine"]

    (point,) = report["context"]["points"]
    assert point["prompt_tokens"] == 24 and point["rows"] == 2 and point["new_tokens"] == 4
    assert point["prompt_tokens_mean"] >= 20 and point["generated_tokens"] == 2 * 4  # every row to the budget
    assert point["decode_step_s"] is not None and point["prefill_s"] > 0 and point["attention"]


def test_vllm_is_recorded_as_skipped_where_it_is_not_installed(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_gpu, "vllm_missing", lambda cfg: "vLLM is not installed")
    assert main(["--cpu-check", "--parts", "step", "--engines", "vllm", "--out", str(tmp_path)]) == 0
    (step,) = json.loads((tmp_path / "bench-gpu.json").read_text())["step"]
    assert step["engine"] == "vllm" and step["skipped"] == "vLLM is not installed"


def test_a_context_point_past_the_budget_is_skipped_with_its_reason(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(bench_gpu, "context_point", lambda *args: ran.append(args) or {})
    assert main(["--cpu-check", "--parts", "context", "--budget-s", "1", "--context-tokens", "24", "48",
                 "--out", str(tmp_path)]) == 0
    points = json.loads((tmp_path / "bench-gpu.json").read_text())["context"]["points"]
    assert [p["prompt_tokens"] for p in points] == [24, 48] and not ran
    assert all("--budget-s 1" in p["skipped"] for p in points)


def test_the_padded_micro_batch_is_the_first_one_training_builds():
    from agon.models.tokens import length_batches

    rows = bench_gpu.training_rows(8192, 65536, 128)
    assert len(rows) == 8 and max(rows) == 8191 and rows == sorted(rows, reverse=True)
    tokens = bench_gpu.padded_tokens(rows, 128, 1000, 999)
    assert len(rows) * (tokens.prompt_ids.size(1) + tokens.completion_ids.size(1)) <= 65536
    assert length_batches(tokens.widths(), 65536, None, 8192)[0] == list(range(8))


def test_a_failing_part_is_recorded_and_the_others_still_run_each_written_when_done(tmp_path, monkeypatch):
    out = tmp_path / "out"
    on_disk = {}

    def broken(*_args, **_kwargs):
        raise RuntimeError("NCCL error: unhandled system error")

    def scoring(*_args, **_kwargs):
        on_disk["at_scoring"] = json.loads((out / "bench-gpu.json").read_text())
        return {"cases": {"one_row": {"row_tokens": [64], "error": "OutOfMemoryError: CUDA out of memory"}}}

    def measure(engine, n, prompts, generations, *_args, **_kwargs):
        on_disk.setdefault("at_step", json.loads((out / "bench-gpu.json").read_text()))
        if engine == "hf_continuous":
            raise RuntimeError("CUDA out of memory in the paged cache")
        return {"engine": engine, "new_tokens": n, "prompts_per_step": prompts, "num_generations": generations,
                "step_s": [1.0], "generation_s": [0.5], "generated_tokens_per_s": 10.0}

    monkeypatch.setattr(bench_gpu, "collectives", broken)
    monkeypatch.setattr(bench_gpu, "scoring", scoring)
    monkeypatch.setattr(bench_gpu, "measure", measure)
    assert main(["--cpu-check", "--parts", "collectives", "scoring", "step", "--out", str(out)]) == 1
    # the collectives' failure was on disk before scoring began, and scoring's before the step
    assert "NCCL error" in on_disk["at_scoring"]["collectives"]["error"]
    assert "scoring" not in on_disk["at_scoring"] and "step" not in on_disk["at_scoring"]
    assert on_disk["at_step"]["scoring"]["cases"]["one_row"]["error"].startswith("OutOfMemoryError")
    report = json.loads((out / "bench-gpu.json").read_text())
    # one engine's failure does not stop the next
    assert report["finished"] and report["step"][1]["generated_tokens_per_s"] == 10.0
    assert report["step"][0]["error"].startswith("RuntimeError: CUDA out of memory")
    assert report["errors"] == ["collectives: RuntimeError: NCCL error: unhandled system error",
                                "scoring one_row: OutOfMemoryError: CUDA out of memory",
                                "step hf_continuous 8: RuntimeError: CUDA out of memory in the paged cache"]


def test_a_hung_collectives_child_is_cut_off_and_reported(tmp_path):
    result = bench_gpu.collectives("cpu", bench_gpu.TINY_SHAPE, 4, timeout_s=0.05)
    assert result["all_ok"] is False and result["child"]["timed_out_after_s"] == 0.05


def test_the_collectives_use_the_trainers_lora_shapes():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agon.families import get_family

    qwen3 = get_family("qwen3")
    shape = {**qwen3.shape.sizes["0.6b"], **bench_gpu.TINY_SHAPE}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(qwen3.shape_config("0.6b", **bench_gpu.TINY_SHAPE))
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    real = sorted(tuple(p.shape) for n, p in peft.named_parameters() if "lora_" in n)
    assert sorted(bench_gpu.lora_shapes(shape, 4)) == real


@pytest.mark.parametrize("backend, expected", [(None, ["flash"]), ("MATH", ["math"])])
def test_the_sdpa_backend_is_read_from_the_profiled_op_names(backend, expected):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        if backend is None:
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        else:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    assert bench_gpu.sdpa_backends(prof)["sdpa_backends"] == expected


def test_padded_rows_are_laid_out_as_the_trainer_lays_them_out():
    tokens = bench_gpu.padded_tokens([100, 65, 30], prompt=20, vocab=1000, pad=999)
    assert [p + c for p, c in tokens.widths()] == [100, 65, 30]
    assert tokens.prompt_ids.shape == (3, 20) and tokens.completion_ids.shape == (3, 80)
    assert tokens.prompt_mask[:, -1].all() and not tokens.prompt_mask[1:, 0].any()  # prompts left-padded
    assert tokens.completion_mask[:, 0].all() and not tokens.completion_mask[1:, -1].any()  # completions right
    assert (tokens.completion_ids[tokens.completion_mask == 0] == 999).all()


def test_a_failed_collective_fails_the_run_but_the_expected_nccl_refusal_does_not(tmp_path, monkeypatch):
    def collectives(*_args, **_kwargs):
        return {"backend": "cpu:gloo,cuda:nccl", "sum_grads_fp32": {"ok": False, "error": "NCCL timeout"},
                "barrier": {"ok": True}, "plain_nccl_with_cpu_tensor": {"ok": False, "expected_ok": False},
                "all_ok": False, "child": {"returncode": 0}}

    monkeypatch.setattr(bench_gpu, "collectives", collectives)
    assert main(["--cpu-check", "--parts", "collectives", "--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "bench-gpu.json").read_text())
    assert report["errors"] == ["collectives: not all ok (sum_grads_fp32)"] and "step" not in report
