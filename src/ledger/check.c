/* The limits of a configuration, checked once for every caller: the
 * loaders report them with the key's position, the CLI with the flag, the
 * library with the key's name (ml_config_check). */
#include <math.h>
#include <stdio.h>

#include "ledger/replay.h"
#include "memledger/ledger.h"
#include "model/limits.h"
#include "util/error.h"

/* Two problems of a figure against the device's memory: ml_config_check
 * knows them by these strings' addresses and says both figures. */
static const char over_budget[] = "device.budget: the budget is above the device memory";
static const char over_reserve[] =
    "device.runtime_reserve: the reserve is not below the device memory";

/* The device's sizes against each other and against the headroom's 64
 * signed bits. */
static const char *device_problem(const ml_device *dv)
{
    if (!dv->present)
        return NULL;
    if (dv->memory == 0)
        return "device.memory: must be at least 1 byte";
    /* the headroom is a signed 64-bit figure (ml_summary.headroom, the
     * JSON's "headroom"): a device of 2^63 B or more could have a headroom
     * it cannot state */
    if (dv->memory > (uint64_t)INT64_MAX)
        return "device.memory: must be below 8 EiB (2^63 B), the most a headroom in signed "
               "64 bits can state; give the device's real size";
    if (dv->budget > dv->memory)
        return over_budget;
    if (dv->runtime_reserve >= dv->memory)
        return over_reserve;
    return NULL;
}

/* The allocator settings the simulation cannot take together: PyTorch's
 * oversize-block rules beside expandable segments' growing segment
 * (docs/allocator.md, "What is simplified"). */
static const char *allocator_problem(const ml_device *dv)
{
    /* checked once every setting applies: a flag may simulate the
     * allocator the model file leaves unsimulated */
    if (dv->max_split_size && dv->allocator == ML_ALLOCATOR_NONE)
        return "device.max_split_size: applies to the simulated caching allocator only, and "
               "device.allocator is none: remove it, or simulate it (device.allocator caching)";
    if (dv->max_split_size && dv->allocator == ML_ALLOCATOR_EXPANDABLE)
        return "device.max_split_size: not simulated with expandable segments "
               "(device.allocator expandable): drop one of the two, or simulate the caching "
               "allocator (device.allocator caching)";
    return NULL;
}

bool ml__headroom(uint64_t have, uint64_t need, int64_t *out)
{
    if (have >= need) {
        if (have - need > (uint64_t)INT64_MAX)
            return false;
        *out = (int64_t)(have - need);
        return true;
    }
    const uint64_t over = need - have;
    if (over > (uint64_t)INT64_MAX)
        return false;
    *out = -(int64_t)over;
    return true;
}

const char *ml_config_problem(const ml_config *cfg)
{
    const ml_training *t = &cfg->training;
    const ml_device *dv = &cfg->device;
    size_t nlim = 0;
    const ml_uint_limit *lim = ml__uint_limits(&nlim);
    for (size_t i = 0; i < nlim; i++) {
        const uint64_t v = ml__uint_limit_get(&lim[i], cfg);
        if ((v < lim[i].lo || v > lim[i].hi) && !(v == 0 && lim[i].zero_unset))
            return lim[i].problem;
    }
    /* the effective batch is a 64-bit figure (fit's effective_batch, the
     * emitted train_batch_size): at every limit the product is 2^64 */
    uint64_t effective;
    if (__builtin_mul_overflow(t->micro_batch, t->grad_accum, &effective) ||
        __builtin_mul_overflow(effective, t->data_parallel, &effective))
        return "training: micro_batch x grad_accum x data_parallel (the effective batch) must "
               "be below 2^64; lower one of them";
    if ((unsigned)t->precision >= ML_PREC_COUNT || (unsigned)t->optimizer >= ML_OPT_COUNT ||
        (unsigned)t->optimizer_impl >= ML_IMPL_COUNT ||
        (unsigned)t->checkpoint.kind >= ML_CKPT_COUNT)
        return "training: unknown precision, optimizer, implementation or checkpoint policy";
    if ((unsigned)t->offload >= ML_OFFLOAD_COUNT)
        return "training.offload: unknown";
    if (t->offload == ML_OFFLOAD_PARAMS && t->zero != 3)
        return "training.offload: params offload needs training.zero 3";
    if ((unsigned)t->logits >= ML_LOGITS_COUNT)
        return "training.logits: unknown; use kept, released or fused";
    if (t->logits_chunk && t->logits != ML_LOGITS_FUSED)
        return "training.logits_chunk: only with training.logits fused";
    if ((unsigned)t->sequence_parallel >= ML_SP_COUNT)
        return "parallel.sp: unknown; use on, off or auto";
    if ((unsigned)t->zero_grad >= ML_ZERO_GRAD_COUNT)
        return "training.zero_grad: unknown; use set_to_none or zero";
    if (t->checkpoint.kind == ML_CKPT_EVERY && t->checkpoint.every == 0)
        return "training.checkpoint: every-K needs K >= 1";
    if (t->checkpoint.kind == ML_CKPT_LIST && t->checkpoint.count > ML_CKPT_LIST_MAX)
        return "training.checkpoint: more than 256 blocks listed";
    if (t->checkpoint.kind == ML_CKPT_LIST)
        for (uint32_t i = 1; i < t->checkpoint.count && i < ML_CKPT_LIST_MAX; i++)
            if (t->checkpoint.blocks[i] <= t->checkpoint.blocks[i - 1])
                return "training.checkpoint: list each block once, in ascending order";
    if (t->checkpoint.kind == ML_CKPT_SEGMENTS) {
        const ml_checkpoint *c = &t->checkpoint;
        if (c->count == 0 || c->count > ML_CKPT_LIST_MAX / 2)
            return "training.checkpoint: segments: between 1 and 128 of them";
        for (uint32_t i = 0; i < c->count; i++)
            if (c->blocks[2 * i] > c->blocks[2 * i + 1] ||
                (i && c->blocks[2 * i] <= c->blocks[2 * i - 1]))
                return "training.checkpoint: segments must be [first-last] with first <= last, "
                       "ascending and not overlapping";
    }
    if (t->checkpoint.kind == ML_CKPT_OPTIMAL && !dv->present)
        return "training.checkpoint: optimal needs a budget: give a device (device.memory)";
    const char *dev = device_problem(dv);
    if (dev)
        return dev;
    /* the range the flag and the model file take */
    if (!(dv->efficiency >= 1e-6 && dv->efficiency <= 1))
        return "device.efficiency: must be between 1e-06 and 1";
    if (!(dv->fragmentation >= 0 && dv->fragmentation <= 1))
        return "device.fragmentation: must be in [0, 1]";
    const char *alloc = allocator_problem(dv);
    if (alloc)
        return alloc;
    /* 0: not given (not timed); else the range the YAML and flags take */
    if (!(dv->interconnect_gbps == 0 ||
          (dv->interconnect_gbps >= 1e-6 && dv->interconnect_gbps <= 1e6)))
        return "device.interconnect_gbps: must be 0 (not timed) or in [1e-6, 1e6] GB/s";
    if (!(dv->pcie_gbps == 0 || (dv->pcie_gbps >= 1e-6 && dv->pcie_gbps <= 1e6)))
        return "device.pcie_gbps: must be 0 (not timed) or in [1e-6, 1e6] GB/s";
    if (!(dv->peak_tflops >= 0) || !isfinite(dv->peak_tflops))
        return "device.peak_tflops: must be a number >= 0";
    /* below one FLOP/s a step's time is no estimate (it overflowed to inf);
     * the tests' toy devices run at 1e-9 TFLOP/s, 1,000 FLOP/s */
    if (dv->peak_tflops > 0 && dv->peak_tflops * dv->efficiency < 1e-12)
        return "device.peak_tflops: times device.efficiency, below 1 FLOP/s (1e-12 TFLOP/s): "
               "give 0 (not timed) or a real rate";
    return NULL;
}

ml_status ml_config_check(const ml_config *cfg, ml_error *err)
{
    const char *bad = ml_config_problem(cfg);
    if (!bad)
        return ML_OK;
    /* a figure against the device's memory: say both, since either side
     * may be the one to change */
    const ml_device *dv = &cfg->device;
    if (bad == over_budget || bad == over_reserve) {
        const bool budget = bad == over_budget;
        char a[32], b[32];
        ml_format_bytes(budget ? dv->budget : dv->runtime_reserve, a, sizeof a);
        ml_format_bytes(dv->memory, b, sizeof b);
        return ml__errorf(err, ML_RANGE,
                          "%s: the %s (%s) is %s the device's memory (%s): lower it or give a "
                          "larger device (device.memory)",
                          budget ? "device.budget" : "device.runtime_reserve",
                          budget ? "budget" : "reserve", a, budget ? "above" : "not below", b);
    }
    return ml__errorf(err, ML_RANGE, "%s", bad);
}
