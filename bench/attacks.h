/* Inputs built to cost superlinear time, timed at n, 2n and 4n:
 * the figures go to stdout; a linear cost doubles from line to line. */
#ifndef MEMLEDGER_BENCH_ATTACKS_H
#define MEMLEDGER_BENCH_ATTACKS_H

#include <stdbool.h>
#include <stddef.h>

/* Allocator traces of n alloc lines whose ids all collide in the low 19
 * bits of FNV-1a (the hash the trace reader used before), or random ids of
 * the same length. */
void bench_trace_collisions(size_t n, bool random_ids);
/* A sequential model of n layers (n / 2 of linear 16 wide, relu) at
 * micro-batch 4 on 8 GiB: fit --checkpoint auto. */
void bench_sequential_fit(unsigned n);

/* Writes a colliding trace of n lines to path (the fuzz corpus's); 0 on
 * success. */
int bench_write_collision_trace(const char *path, size_t n);

#endif
