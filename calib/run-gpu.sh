#!/bin/sh
# The GPU measurement campaign of issue 8, in one run: build with CUDA,
# calibrate (fp32 and bf16), measure gpt2-small-shaped blocks through the
# runner next to the planner's prediction, and run Hugging Face models in
# PyTorch against `memledger plan`. Every raw result goes under $OUT.
# Usage: OUT=/path/to/results sh calib/run-gpu.sh   (a few minutes on an H200)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
PATH=/usr/local/cuda/bin:$PATH
export PATH
log() { echo "== $*" | tee -a "$OUT/run.log"; }

log "device"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.csv" 2>&1 || true

log "build (release, -Dcuda=enabled)"
if ! { meson setup build-gpu --buildtype=release -Dcuda=enabled -Dtests=false \
        -Dtorch_crosscheck=disabled -Drender_tests=disabled && ninja -C build-gpu; } \
        >"$OUT/build.log" 2>&1; then
    echo "build failed: see $OUT/build.log"
    exit 1
fi
ML=build-gpu/src/memledger
CAL=build-gpu/calib/memledger-calibrate

log "the same layers on the GPU and the CPU, compared (fp32 tolerance)"
"$CAL" --backend cuda --check >"$OUT/check.log" 2>&1 || log "GPU and CPU results differ: see check.log"
log "the same under autocast bf16 rules (cuBLAS bf16 GEMMs vs the CPU's emulation, 2e-2)"
"$CAL" --backend cuda --check --dtype bf16 >"$OUT/check-bf16.log" 2>&1 ||
    log "GPU and CPU bf16 results differ: see check-bf16.log"

# Dense peaks from NVIDIA's H200 SXM datasheet: 67 TFLOP/s fp32 (CUDA cores),
# 989 TFLOP/s bf16 tensor cores without sparsity. They only scale the
# efficiency figure; the measured TFLOP/s are what the planner uses.
log "calibrate fp32 (default sweep)"
"$CAL" --backend cuda --dtype fp32 --peak-tflops 67 --name h200-fp32 \
    -o "$OUT/h200-fp32.yaml" 2>"$OUT/h200-fp32.log"
log "calibrate bf16 (autocast layers and bf16 GEMM throughput)"
"$CAL" --backend cuda --dtype bf16 --peak-tflops 989 --name h200-bf16 \
    -o "$OUT/h200-bf16.yaml" 2>"$OUT/h200-bf16.log"

log "gpt2-small-shaped blocks at micro-batch 4, 8, 16 (T=1024, D=768, H=12)"
"$CAL" --backend cuda --layers transformer_block,lm_head --hidden 768 --heads 12 \
    --vocab 50257 --points 4x1024,8x1024,16x1024 --name h200-gpt2-blocks \
    -o "$OUT/h200-gpt2-blocks.yaml" 2>"$OUT/h200-gpt2-blocks.log"
for B in 4 8 16; do
    "$ML" plan models/gpt2-small.yaml --micro-batch "$B" --device 141GB --format json \
        >"$OUT/plan-gpt2-b$B.json"
    "$ML" plan models/gpt2-small.yaml --micro-batch "$B" --device 141GB --format json \
        --calib "$OUT/h200-gpt2-blocks.yaml" >"$OUT/plan-gpt2-b$B-calib.json"
done

log "a Llama-2-7B-shaped block (RMSNorm, SwiGLU, GQA 32/8 heads, D=4096, F=11008) at micro-batch 1 and 2, T=2048"
"$CAL" --backend cuda --layers llama_block --hidden 4096 --heads 32 --kv-heads 8 --ffn 11008 \
    --points 1x2048,2x2048 --name h200-llama-block -o "$OUT/h200-llama-block.yaml" \
    2>"$OUT/h200-llama-block.log"
cat >"$OUT/llama-block.yaml" <<'YAML'
name: llama-block
model:
  type: decoder
  layers: 1
  hidden: 4096
  heads: 32
  kv_heads: 8
  ffn: 11008
  activation: swiglu
  norm: rmsnorm
  vocab: 32000
  position: none
  bias: false
  tied_embeddings: false
  dropout: 0
training:
  seq_len: 2048
YAML
for B in 1 2; do
    "$ML" plan "$OUT/llama-block.yaml" --micro-batch "$B" --format json >"$OUT/plan-llama-b$B.json"
    "$ML" plan "$OUT/llama-block.yaml" --micro-batch "$B" --format json \
        --calib "$OUT/h200-llama-block.yaml" >"$OUT/plan-llama-b$B-calib.json"
done

log "PyTorch + Hugging Face against the planner"
/usr/bin/env python3 calib/torch_vs_plan.py --memledger "$ML" --out "$OUT" \
    --calib "$OUT/h200-fp32.yaml" >"$OUT/torch_vs_plan.log" 2>&1 || log "torch_vs_plan failed"
log "done: $OUT"
