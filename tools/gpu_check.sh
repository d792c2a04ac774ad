#!/usr/bin/env bash
# The GPU check (python -m agon.bench.gpu) on a bare GPU image: torch, transformers, peft and accelerate installed,
# no hydra-core/omegaconf/antlr4, no network, no install step. The wheels of `make gpu-wheels` (pure Python, carried
# as build/gpu-wheels) are unpacked into a temporary folder that goes on PYTHONPATH; nothing is pip-installed.
#
#   bash tools/gpu_check.sh OUT_DIR [agon.bench.gpu arguments...]     e.g. bash tools/gpu_check.sh "$OUT"
#
# Writes OUT_DIR/bench-gpu.json (rewritten after every part), OUT_DIR/bench-gpu.log (the console) and
# OUT_DIR/nvidia-smi.txt. Exit code: agon.bench.gpu's (0 all measured, 1 some part failed, 2 no CUDA).
# GPU_WHEELS=DIR takes the wheels from elsewhere; PYTHON=... picks the interpreter (default: the first of python3 and
# python that imports torch).
set -uo pipefail
out=${1:?usage: tools/gpu_check.sh OUT_DIR [agon.bench.gpu arguments...]}
shift
mkdir -p "$out" && out=$(cd "$out" && pwd)  # absolute: the run goes on from the repository root
cd "$(dirname "$0")/.."
py=${PYTHON:-}
if [[ -z $py ]]; then  # the first interpreter on PATH that has torch: images differ in which name holds it
    for candidate in python3 python; do
        if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
            py=$(command -v "$candidate")
            break
        fi
    done
fi
py=${py:-python3}
wheels=${GPU_WHEELS:-build/gpu-wheels}
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
shopt -s nullglob
found=("$wheels"/*.whl)
if ((${#found[@]} == 0)); then
    echo "[gpu-check] no wheels in $wheels (make gpu-wheels, then carry it): relying on what is installed" >&2
fi
for w in ${found[@]+"${found[@]}"}; do  # (the guard: bash before 4.4 calls an empty array unset)
    # a wheel is a zip; python's own zipfile, since the image may have no unzip
    "$py" -m zipfile -e "$w" "$site" || echo "[gpu-check] could not unpack $w" >&2
done
command -v nvidia-smi >/dev/null && nvidia-smi >"$out/nvidia-smi.txt" 2>&1
# offline: nothing may wait on a hub; wandb is never imported on this path, disabled all the same
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
echo "[gpu-check] $("$py" --version 2>&1) at $py, ${#found[@]} wheels from $wheels" | tee "$out/bench-gpu.log"
"$py" -m agon.bench.gpu --out "$out" "$@" 2>&1 | tee -a "$out/bench-gpu.log"
exit "${PIPESTATUS[0]}"
