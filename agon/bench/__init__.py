"""Measurement tools, apart from the library: nothing in agon's core imports them (``make lint`` enforces it).

- ``ratios`` (``make bench``, ``python -m agon.bench``): ratios measured side by side with equal work: an Agon step
  against a GRPO step, agon's GRPO against TRL's, scoring memory, engines, length-skewed batches.
- ``gpu`` (``make bench-gpu``, ``tools/gpu_check.sh``, ``python -m agon.bench.gpu``): what a first GPU session must
  learn in one run: collectives, 16k-token scoring, an Agon step per engine.
- ``smoke_real`` (``make smoke-real``, ``python -m agon.bench.smoke_real``): a model's exact shape on CPU with random
  weights, two Agon steps and an evaluation.
- ``model_shape``: builds a model of a real config's exact shape with random weights, for the tools above and tests.

Each is a script over the library's public entry points, as a user's own script would be.
"""
