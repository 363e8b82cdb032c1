#!/bin/sh
# The GPU measurement campaign in one run: calibrate (fp32 and bf16, at the
# default shapes and at Llama-2-7B's width, each checked against the CPU
# backend), then Hugging Face decoders in PyTorch against `memledger plan`
# (calib/torch_vs_plan.py), with allocator traces of a few of them.
#
# Usage: OUT=/path/to/results sh calib/run-gpu.sh [PREBUILT]
#   PREBUILT: a folder with bin/memledger, bin/memledger-calibrate (built with
#   -Dcuda=enabled) and lib/ with the libraries they need beyond the CUDA
#   driver and cuBLAS; without it the script builds with meson here.
# PARTS: which parts to run, of "calib torch variants" (default all).
# Results: $OUT/run.log (every log, in order), the two profiles
# h200-fp32.yaml and h200-bf16.yaml, results.jsonl and results.md,
# traces.tar.gz, traces-expandable.tar.gz and extra.tar.gz (the other
# profiles, plans, variant results and logs): at most eight files, as a
# device machine returns them. Each step has a time
# limit and a failed step does not stop the others.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
WORK=$(mktemp -d)
mkdir -p "$WORK/extra"
PATH=/usr/local/cuda/bin:$PATH
export PATH
T0=$(date +%s)
log() { echo "== [$(($(date +%s) - T0)) s] $*" | tee -a "$OUT/run.log"; }
# run LIMIT LOGNAME CMD...: the command's output goes to run.log too
run() {
    lim=$1 name=$2
    shift 2
    timeout "$lim" "$@" >"$WORK/extra/$name.log" 2>&1
    rc=$?
    { echo "-- $name (exit $rc)"; cat "$WORK/extra/$name.log"; } >>"$OUT/run.log"
    [ $rc = 0 ] || log "$name: exit $rc"
    return $rc
}
pack() { tar -C "$WORK" -czf "$OUT/extra.tar.gz" extra; }

log "device"
{ nvidia-smi; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; } \
    >>"$OUT/run.log" 2>&1

if [ $# -ge 1 ]; then
    ML=$1/bin/memledger
    CAL=$1/bin/memledger-calibrate
    cublas=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
        [ -e "$d/libcublas.so.13" ] && cublas=$d && break
    done
    [ -n "$cublas" ] || cublas=$(dirname "$(find / -xdev -name 'libcublas.so.13*' 2>/dev/null | head -1)")
    LD_LIBRARY_PATH=$1/lib:$cublas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
    log "prebuilt binaries from $1, cuBLAS from $cublas"
    { ldd "$ML"; ldd "$CAL"; } >>"$OUT/run.log" 2>&1
else
    log "build (release, -Dcuda=enabled)"
    run 600 build sh -c 'meson setup build-gpu --buildtype=release -Dcuda=enabled -Dtests=false \
        -Dtorch_crosscheck=disabled -Drender_tests=disabled && ninja -C build-gpu' || exit 1
    ML=build-gpu/src/memledger
    CAL=build-gpu/calib/memledger-calibrate
fi

PARTS=${PARTS:-calib torch variants}
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

if has calib; then
log "GPU against CPU, fp32 (1e-3 of each tensor's largest value)"
run 60 check-fp32 "$CAL" --backend cuda --check
log "GPU against CPU, autocast bf16 rules (2e-2)"
run 60 check-bf16 "$CAL" --backend cuda --check --dtype bf16

# Dense peaks from NVIDIA's H200 SXM datasheet: 67 TFLOP/s fp32 (CUDA cores),
# 989 TFLOP/s bf16 tensor cores without sparsity. They only scale the
# efficiency figure; the planner uses the measured TFLOP/s.
log "calibrate fp32, default sweep"
run 90 h200-fp32 "$CAL" --backend cuda --dtype fp32 --peak-tflops 67 --name h200-fp32 \
    -o "$OUT/h200-fp32.yaml"
log "calibrate bf16 (autocast), default sweep"
run 90 h200-bf16 "$CAL" --backend cuda --dtype bf16 --peak-tflops 989 --name h200-bf16 \
    -o "$OUT/h200-bf16.yaml"
pack
log "Llama-2-7B's width: RMSNorm, SwiGLU, GQA 32/8, D=4096, F=11008, T=2048, B=1 and 2"
for dt in fp32 bf16; do
    pk=67
    [ $dt = bf16 ] && pk=989
    run 60 "h200-llama7b-$dt" "$CAL" --backend cuda --dtype $dt --peak-tflops $pk \
        --layers llama_block,linear --hidden 4096 --heads 32 --kv-heads 8 --ffn 11008 \
        --vocab 32000 --points 1x2048,2x2048 --name "h200-llama7b-$dt" \
        -o "$WORK/extra/h200-llama7b-$dt.yaml"
done
cat >"$WORK/extra/llama-7b-block.yaml" <<'YAML'
name: llama-7b-block
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
  position: rope
  bias: false
  tied_embeddings: false
  dropout: 0
training:
  seq_len: 2048
YAML
for B in 1 2; do
    "$ML" plan "$WORK/extra/llama-7b-block.yaml" --micro-batch "$B" --format json \
        >"$WORK/extra/plan-llama7b-b$B.json" 2>&1
    for dt in fp32 bf16; do
        p=fp32
        [ $dt = bf16 ] && p=amp-bf16
        "$ML" plan "$WORK/extra/llama-7b-block.yaml" --micro-batch "$B" --precision $p \
            --format json --calib "$WORK/extra/h200-llama7b-$dt.yaml" \
            >"$WORK/extra/plan-llama7b-b$B-$dt-calib.json" 2>&1
    done
done
pack
fi

if has torch; then
log "PyTorch + transformers against the planner"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
    transformers.__version__, torch.cuda.get_device_name(0))' >>"$OUT/run.log" 2>&1
# BUDGET: seconds for the whole script. The deadline stops starting new
# configurations; the one running finishes (a minute at most, the limit).
# Traced: GPT-2 small SDPA fp32, Llama-0.2b SDPA bf16, GPT-2 small SDPA fp32
# with full checkpointing (indices into torch_vs_plan.py's matrix).
left=$((${BUDGET:-420} - ($(date +%s) - T0)))
deadline=$((left - 70))
[ $deadline -gt 30 ] || deadline=30
PYTHONUNBUFFERED=1 timeout $((deadline + 60)) python3 calib/torch_vs_plan.py \
    --memledger "$ML" --out "$WORK" --calib-fp32 "$OUT/h200-fp32.yaml" \
    --calib-bf16 "$OUT/h200-bf16.yaml" --traces "${TRACES:-0,9,24}" \
    --deadline "$deadline" >"$WORK/extra/torch_vs_plan.log" 2>&1
log "torch_vs_plan: exit $?"
cat "$WORK/extra/torch_vs_plan.log" >>"$OUT/run.log"
cp "$WORK/results.jsonl" "$WORK/results.md" "$OUT/" 2>/dev/null
tar -C "$WORK" -czf "$OUT/traces.tar.gz" traces 2>/dev/null
pack
fi

if has variants; then
# What the first campaign raised: which SDPA kernel runs for fp32 with
# grouped-query heads; the loop that keeps the logits to the end of the
# iteration; the reserved bytes under expandable segments (with traces).
# Configurations: every model, SDPA and eager, checkpoint none, bf16 and fp32.
log "SDPA kernels per dtype, with and without enable_gqa"
run 60 sdpa-probe python3 calib/sdpa_probe.py
sel=$(python3 -c 'import sys; sys.path.insert(0, "calib"); import torch_vs_plan as t
print(",".join(str(i) for i, c in enumerate(t.configurations()) if not c[2] and c[4] == "foreach"))')
log "the loop keeps the logits (configurations $sel)"
PYTHONUNBUFFERED=1 timeout 150 python3 calib/torch_vs_plan.py --memledger "$ML" --out "$WORK/extra" \
    --only "$sel" --loop kept --tag=-kept --deadline 100 >>"$OUT/run.log" 2>&1
log "expandable segments (configurations $sel; traces of 0 and 9)"
mkdir -p "$WORK/exp"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 timeout 150 \
    python3 calib/torch_vs_plan.py --memledger "$ML" --out "$WORK/exp" --only "$sel" \
    --traces 0,9 --tag=-expandable --deadline 100 >>"$OUT/run.log" 2>&1
mv "$WORK/exp/results-expandable.jsonl" "$WORK/exp/results-expandable.md" "$WORK/extra/" 2>/dev/null
tar -C "$WORK/exp" -czf "$OUT/traces-expandable.tar.gz" traces 2>/dev/null
pack
fi
rm -rf "$WORK"
log "done: $OUT"
