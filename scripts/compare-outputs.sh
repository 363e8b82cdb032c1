#!/bin/sh
# Runs a fixed set of memledger command lines (every preset: plan text/JSON/device
# under four checkpoint policies, compare, timeline CSV/JSON/SVG, fit, report,
# ZeRO-3 with offload, triage, the for-loop optimizer step, fused logits; every
# shipped config.json; a small Falcon, Mixtral and Qwen2-MoE under the caching
# allocator's simulation;
# every calibration profile)
# and stores each output, so that two builds can be compared byte for byte:
#   sh scripts/compare-outputs.sh OLD/memledger /tmp/old
#   sh scripts/compare-outputs.sh NEW/memledger /tmp/new
#   diff -r /tmp/old /tmp/new        # a refactoring must print nothing
# Run from the repository root.
set -u
BIN=$1
O=$2
rm -rf "$O"
mkdir -p "$O"
i=0
run() {
    i=$((i + 1))
    "$BIN" "$@" >"$O/$i.out" 2>"$O/$i.err"
    echo "rc=$?" >>"$O/$i.out"
}
for m in models/*.yaml; do
    for ck in none full optimal every-2; do
        run plan "$m" --checkpoint $ck
        run plan "$m" --checkpoint $ck --format json
        run plan "$m" --checkpoint $ck --device 8GiB --precision bf16
    done
    run compare "$m"
    run compare "$m" --format json
    run timeline "$m" --format csv
    run timeline "$m" --format json --checkpoint full
    run timeline "$m" --format svg -o "$O/$i.svg"
    run fit "$m" --device 8GiB
    run fit "$m" --device 24GiB --checkpoint auto
    run report "$m" -o "$O/$i.html"
    run plan "$m" --zero 3 --data-parallel 8 --offload optimizer
    run triage "$m" --device 8GiB
    run triage "$m" --device 24GiB --format json --oom-phase backward
    run plan "$m" --optimizer-impl for-loop --format json
    run plan "$m" --logits fused --precision bf16 --format json
done
for h in models/hf/*/config.json; do
    run plan --hf "$h" --seq-len 512 --micro-batch 2
    run plan --hf "$h" --seq-len 512 --micro-batch 2 --format json --checkpoint full
    run fit --hf "$h" --device 24GiB
done
# the caching allocator's simulation allocates a block's saved tensors in
# the inventory's order: a small model (Falcon's torch twin) shows a change
# of that order where the presets' large tensors do not
for att in eager sdpa flash; do
    for p in fp32 amp-bf16 bf16; do
        run plan tests/torch/models/falcon.yaml --attention $att --precision $p \
            --checkpoint selective --allocator caching --format json
    done
done
# ... and Mixtral's and Qwen2-MoE's twins, whose experts list their saved
# tensors once per expert with rows (balanced and imbalanced routing)
for t in mixtral qwen2moe; do
    for p in fp32 amp-bf16 bf16; do
        run plan tests/torch/models/$t.yaml --precision $p --checkpoint selective \
            --allocator caching --format json
        run plan tests/torch/models/$t.yaml --precision $p --expert-imbalance 2.5 \
            --allocator caching --format json
    done
done
for p in calib/profiles/*.yaml; do
    run plan models/gpt2-small.yaml --calib "$p"
    run plan models/llama-2-7b.yaml --calib "$p" --format json
done
echo "$i runs into $O"
