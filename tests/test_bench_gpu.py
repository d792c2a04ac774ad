"""make bench-gpu refuses without CUDA, and its code runs (on a CPU, at a tiny shape) so a GPU session's one try
is not spent on a typo."""

from __future__ import annotations

import json

import pytest
import torch

from agon.bench_gpu import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_refuses_without_cuda(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "b.json")]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err and not (tmp_path / "b.json").exists()


def test_the_script_measures_agon_steps_on_a_cpu_at_a_tiny_shape(tmp_path):
    out = tmp_path / "bench-gpu.json"
    assert main(["--cpu-check", "--new-tokens", "8", "--prompts", "2", "--generations", "2", "--warmup-tokens", "4",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (result,) = report["results"]
    assert result["new_tokens"] == 8 and len(result["step_s"]) == 1 and result["generated_tokens_per_s"] > 0
    # both roles of one step: 2 prompts x 2 completions each, at most 8 tokens apiece
    assert 0 < result["generated_tokens_per_step"][0] <= 2 * 2 * 2 * 8
