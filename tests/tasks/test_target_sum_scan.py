"""The target-sum warm-start scan (tools/target_sum_scan.py): a line per checkpoint, and gating a copy of the model
leaves the warm start as it would have been."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(f"agon_{name}", TOOLS / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scan_gates_each_checkpoint_without_moving_the_warm_start(tmp_path):
    """Four warm-start steps gated at 2 and 4: a line each, every condition measured on every problem, and the
    loss at each checkpoint exactly the one a warm start of the same length reaches ungated (the gate samples on a
    copy, and resets the torch seed, which the warm start does not draw from after its init)."""
    from agon.training.checks import compose_config
    from agon.models.world import build_model, build_tokenizer, warm_start, world_task_cfg

    scan = _tool("target_sum_scan")
    out = tmp_path / "scan.jsonl"
    overrides = ["task.train_size=300", "model.tiny.warmup_batch_size=8", "trainer.max_new_tokens=24"]
    assert scan.main(["--max-steps", "4", "--every", "2", "--first", "2", "--problems", "3", "--samples", "1",
                      "--device", "cpu", "--label", "t", "--out", str(out), *overrides]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["step"] for x in lines] == [2, 4] and {x["label"] for x in lines} == {"t"}
    for line in lines:
        (numbers,) = line["by_temperature"].values()  # the evaluation's temperature alone, by default
        assert all(numbers[c]["n"] == 3 for c in ("right", "dead_end", "solo", "cascade"))

    cfg = compose_config(["experiment=target_sum", *overrides, "model.tiny.warmup_steps=4"])
    tok = build_tokenizer()
    model = build_model(cfg.model.tiny, len(tok), seed=cfg.model.tiny.warmup_seed)
    losses = {}
    warm_start(model, tok, cfg.model.tiny, world_task_cfg(cfg.task), log=lambda *_: None,
               on_step=lambda step, _, loss: losses.__setitem__(step, loss))
    assert [losses[x["step"]] for x in lines] == [x["loss"] for x in lines]


def test_a_saved_checkpoint_is_the_base_a_build_of_that_length_makes(tmp_path, monkeypatch):
    """With the ramp fixed (model.tiny.warmup_ramp_steps), the scan's checkpoint at step 2 of 40, saved with --save,
    is named by the key of a 2-step build and holds the same weights, to the bit, as that build (the base shipped
    from a scan is then the base `make bases` makes on the same machine)."""
    from safetensors.torch import load_file

    from agon.training.checks import compose_config
    from agon.models.world import ensure_world, world_key, world_task_cfg

    scan = _tool("target_sum_scan")
    overrides = ["task.train_size=300", "model.tiny.warmup_batch_size=8", "model.tiny.warmup_ramp_steps=3",
                 "trainer.max_new_tokens=8"]
    # 40 steps: a ramp of a twentieth would be 2 steps in the scan and 1 in the 2-step build
    assert scan.main(["--max-steps", "40", "--every", "100", "--first", "2", "--problems", "2", "--samples", "1",
                      "--device", "cpu", "--save", str(tmp_path / "saved"), "--out", str(tmp_path / "scan.jsonl"),
                      *overrides]) == 0
    cfg = compose_config(["experiment=target_sum", *overrides, "model.tiny.warmup_steps=2"])
    name = f"tiny-{world_key(cfg.model, world_task_cfg(cfg.task))}"
    saved = tmp_path / "saved" / name
    assert (saved / "world.json").is_file() and json.loads((saved / "world.json").read_text())["key"] == name
    monkeypatch.setenv("AGON_CACHE", str(tmp_path / "cache"))
    built = ensure_world(cfg.model, cfg.task, log=lambda *_: None)
    assert built.name == name
    ours, theirs = load_file(saved / "model.safetensors"), load_file(built / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)
