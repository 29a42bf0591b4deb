#!/usr/bin/env bash
# Issue 22's GPU check, prepared to run once on a lent device (15 minutes of device time in all): ViT-B/32's DP
# step at batch 16, 64 and 256 in fp32 and bf16 (naive DP, DP-Merging and DPSAT + anchor against a non-private step
# measured side by side; s/step, ratios, peak GPU memory), then the real CLIP loader's fine-tuning loop
# (bench/gpu_readiness.py). From the repository root on the GPU machine:
#
#   OUT=/where/results/go bash bench/gpu_session.sh
#
# Needs python3 with CUDA torch, timm and transformers (the lent machines have them); gpu_readiness.py also needs
# open_clip_torch and its dependencies (carry them as wheels: docs/operations.md, "GPUs"); without them that
# part says so and the rest stands. Each part has its own timeout, so one slow part cannot take the others' time.
# The results (dp_step.txt, gpu_readiness.{txt,json}, gpu.txt) are what docs/performance.md quotes.
set -uo pipefail
OUT=${OUT:-gpu_session}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/workflow${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

for precision in fp32 bf16; do
    for batch in 16 64 256; do
        timeout 120 "$PY" bench/dp_step.py --models vit_b32 --strategies bookkeeping --no-secure --device cuda \
            --precision "$precision" --batch-size "$batch" --repeats 10 2>&1 | tee -a "$OUT/dp_step.txt"
    done
done

timeout 240 "$PY" bench/gpu_readiness.py --steps 50 --batch-size 64 --out "$OUT/gpu_readiness.json" 2>&1 \
    | tee "$OUT/gpu_readiness.txt"
