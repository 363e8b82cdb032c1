/* The value flags: each one's name and where ml_cli_opts keeps its raw
 * value (the verbs a flag is for are checked where it is parsed,
 * options.c). */
#include <stddef.h>

#include "cli/cli.h"

static const ml_cli_flag flags[] = {
    {"--micro-batch", offsetof(ml_cli_opts, micro_batch)},
    {"--seq-len", offsetof(ml_cli_opts, seq_len)},
    {"--grad-accum", offsetof(ml_cli_opts, grad_accum)},
    {"--precision", offsetof(ml_cli_opts, precision)},
    {"--attention", offsetof(ml_cli_opts, attention)},
    {"--expert-imbalance", offsetof(ml_cli_opts, expert_imbalance)},
    {"--expert-capacity", offsetof(ml_cli_opts, expert_capacity)},
    {"--optimizer", offsetof(ml_cli_opts, optimizer)},
    {"--optimizer-impl", offsetof(ml_cli_opts, optimizer_impl)},
    {"--checkpoint", offsetof(ml_cli_opts, checkpoint)},
    {"--device", offsetof(ml_cli_opts, device)},
    {"--budget", offsetof(ml_cli_opts, budget)},
    {"--runtime-reserve", offsetof(ml_cli_opts, runtime_reserve)},
    {"--peak-tflops", offsetof(ml_cli_opts, peak_tflops)},
    {"--efficiency", offsetof(ml_cli_opts, efficiency)},
    {"--interconnect", offsetof(ml_cli_opts, interconnect)},
    {"--pcie", offsetof(ml_cli_opts, pcie)},
    {"--fragmentation", offsetof(ml_cli_opts, fragmentation)},
    {"--data-parallel", offsetof(ml_cli_opts, data_parallel)},
    {"--dp", offsetof(ml_cli_opts, data_parallel)},
    {"--dp-shard", offsetof(ml_cli_opts, dp_shard)},
    {"--zero", offsetof(ml_cli_opts, zero)},
    {"--offload", offsetof(ml_cli_opts, offload)},
    {"--global-batch", offsetof(ml_cli_opts, global_batch)},
    {"--max-micro-batch", offsetof(ml_cli_opts, max_micro_batch)},
    {"--calib", offsetof(ml_cli_opts, calib)},
    {"--reduce-bucket-size", offsetof(ml_cli_opts, reduce_bucket)},
    {"--allgather-bucket-size", offsetof(ml_cli_opts, allgather_bucket)},
    {"--logits", offsetof(ml_cli_opts, logits)},
    {"--eval-batch", offsetof(ml_cli_opts, eval_batch)},
    {"--eval-seq-len", offsetof(ml_cli_opts, eval_seq_len)},
    {"--target-len", offsetof(ml_cli_opts, target_len)},
    {"--logits-chunk", offsetof(ml_cli_opts, logits_chunk)},
    {"--allocator", offsetof(ml_cli_opts, allocator)},
    {"--max-split-size", offsetof(ml_cli_opts, max_split_size)},
    {"--blas-workspace", offsetof(ml_cli_opts, blas_workspace)},
    {"--allocator-start", offsetof(ml_cli_opts, allocator_start)},
    {"--zero-grad", offsetof(ml_cli_opts, zero_grad)},
    {"--vision-tower", offsetof(ml_cli_opts, vision_tower)},
    {"--lengths", offsetof(ml_cli_opts, lengths)},
    {"--batching", offsetof(ml_cli_opts, batching)},
    {"--max-tokens", offsetof(ml_cli_opts, max_tokens)},
    {"--buckets", offsetof(ml_cli_opts, buckets)},
    {"--parallel", offsetof(ml_cli_opts, parallel)},
    {"--engine", offsetof(ml_cli_opts, engine)},
    {"--gpus", offsetof(ml_cli_opts, gpus)},
    {"--gpus-per-node", offsetof(ml_cli_opts, gpus_per_node)},
    {"--network", offsetof(ml_cli_opts, network)},
    {"--ranks", offsetof(ml_cli_opts, ranks)},
    {"--tp", offsetof(ml_cli_opts, tp)},
    {"--pp", offsetof(ml_cli_opts, pp)},
    {"--vpp", offsetof(ml_cli_opts, vpp)},
    {"--cp", offsetof(ml_cli_opts, cp)},
    {"--ep", offsetof(ml_cli_opts, ep)},
    {"--etp", offsetof(ml_cli_opts, etp)},
    {"--pp-schedule", offsetof(ml_cli_opts, pp_schedule)},
    {"--micro-batches", offsetof(ml_cli_opts, micro_batches)},
    {"--pp-layers", offsetof(ml_cli_opts, pp_layers)},
};

const ml_cli_flag *ml_cli_flags(size_t *count)
{
    *count = sizeof flags / sizeof flags[0];
    return flags;
}
