#!/usr/bin/env bash
# Six target-sum warm-start scans (tools/target_sum_scan.py) side by side on one GPU machine, as run on an H200 on
# 2026-12-04 (docs/tasks.md): the share of challenge rows at 4 operands, and 5 operands. Bare image + the wheels of
# `make gpu-wheels`, as tools/gpu_check.sh. Usage: bash tools/target_sum_scan_grid.sh OUT_DIR [BUDGET_S]
set -u
out=${1:?usage: tools/target_sum_scan_grid.sh OUT_DIR [BUDGET_S]}; budget=${2:-400}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
site=$(mktemp -d)
for w in build/gpu-wheels/*.whl; do python3 -m zipfile -e "$w" "$site"; done
export PYTHONPATH="$PWD:$site" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled \
    TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2 AGON_CACHE=/tmp/agon-cache
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } \
    >"$out/scan.log" 2>&1
common=(--every 100 --first 200 --problems 100 --samples 2 --budget-s "$budget" --out "$out/scan.jsonl")
four=(task.train_size=30000)
five=(task.train_size=30000 task.min_terms=5 task.max_terms=5 model.tiny.max_position=384 trainer.max_new_tokens=320)
scan() { local label=$1; shift; python3 tools/target_sum_scan.py --label "$label" "$@" >>"$out/scan.log" 2>&1 & }
scan c50 --max-steps 1200 "${common[@]}" "${four[@]}" task.warm_start_challenges=0.5
scan c75 --max-steps 1200 "${common[@]}" "${four[@]}" task.warm_start_challenges=0.75
scan c90 --max-steps 1200 "${common[@]}" "${four[@]}" task.warm_start_challenges=0.9
scan c97 --max-steps 1200 "${common[@]}" "${four[@]}" task.warm_start_challenges=0.97
scan f5c50 --max-steps 1600 "${common[@]}" "${five[@]}" task.warm_start_challenges=0.5
scan f5c85 --max-steps 1600 "${common[@]}" "${five[@]}" task.warm_start_challenges=0.85
(sleep 90; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv >>"$out/scan.log") &
wait
date -u >>"$out/scan.log"
