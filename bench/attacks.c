/* Inputs built to cost superlinear time (attacks.h). */
#include "attacks.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc/alloc.h"
#include "memledger/memledger.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- FNV-1a multicollisions ----
 * The low k bits of FNV-1a's state depend only on the low k bits of the
 * state before and the byte (a product modulo 2^k), so two 3-byte blocks
 * that meet in the low 19 bits from one state stay met whatever follows
 * (Joux 2004's multicollisions): 18 such pairs, one chosen per bit of j,
 * give 2^18 = 262,144 ids of 54 bytes, every one in the same slot of any
 * table of up to 2^19 entries. A birthday search per pair: about 2^9.5
 * blocks. */
#define LOW_BITS 19
#define STAGES 18
#define BLOCK 3

static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

static uint32_t fnv_low(uint32_t s, const char *b)
{
    uint64_t h = s;
    for (int i = 0; i < BLOCK; i++)
        h = (h ^ (unsigned char)b[i]) * 1099511628211ull;
    return (uint32_t)(h & ((1u << LOW_BITS) - 1));
}

static void block_of(uint32_t i, char *b)
{
    for (int k = 0; k < BLOCK; k++, i /= 62)
        b[k] = alnum[i % 62];
}

/* The pairs of blocks of each stage: pairs[t][0] and pairs[t][1]. */
static int find_pairs(char pairs[STAGES][2][BLOCK])
{
    int32_t *seen = malloc(sizeof *seen << LOW_BITS);
    if (!seen)
        return -1;
    uint32_t s = (uint32_t)(1469598103934665603ull & ((1u << LOW_BITS) - 1));
    for (int t = 0; t < STAGES; t++) {
        memset(seen, 0xff, sizeof *seen << LOW_BITS);
        for (uint32_t i = 0;; i++) {
            char b[BLOCK];
            block_of(i, b);
            uint32_t v = fnv_low(s, b);
            if (seen[v] >= 0) {
                block_of((uint32_t)seen[v], pairs[t][0]);
                memcpy(pairs[t][1], b, BLOCK);
                s = v;
                break;
            }
            seen[v] = (int32_t)i;
        }
    }
    free(seen);
    return 0;
}

/* The trace text of n colliding allocs (n <= 2^18), or with random 54-byte
 * ids to compare; NULL without memory. */
static char *collision_trace(size_t n, size_t *len, bool random_ids)
{
    char pairs[STAGES][2][BLOCK];
    const size_t line = 6 + STAGES * BLOCK + 3; /* alloc,<id>,1\n */
    char *text = malloc(16 + n * line);
    if (!text || find_pairs(pairs)) {
        free(text);
        return NULL;
    }
    size_t o = (size_t)sprintf(text, "action,id,bytes\n");
    for (size_t j = 0; j < n; j++) {
        memcpy(text + o, "alloc,", 6);
        o += 6;
        for (int t = 0; t < STAGES; t++, o += BLOCK)
            if (random_ids)
                block_of((uint32_t)rand() % (62 * 62 * 62), text + o);
            else
                memcpy(text + o, pairs[t][(j >> t) & 1], BLOCK);
        memcpy(text + o, ",1\n", 3);
        o += 3;
    }
    *len = o;
    return text;
}

int bench_write_collision_trace(const char *path, size_t n)
{
    size_t len = 0;
    char *text = collision_trace(n, &len, false);
    FILE *f = text ? fopen(path, "wb") : NULL;
    int rc = f && fwrite(text, 1, len, f) == len ? 0 : -1;
    if (f && fclose(f))
        rc = -1;
    free(text);
    return rc;
}

void bench_trace_collisions(size_t n, bool random_ids)
{
    size_t len = 0;
    char *text = collision_trace(n, &len, random_ids);
    if (!text)
        return;
    ml_alloc_trace *t = NULL;
    ml_error e;
    double t0 = now();
    ml_status st = ml__alloc_trace_parse(text, len, "collide.csv", &t, &e);
    double dt = now() - t0;
    printf("allocator trace, %7zu ids %s (%.1f MiB): %8.1f ms to read%s\n", n,
           random_ids ? "random, to compare     " : "colliding in FNV-1a's low 19 bits",
           (double)len / (1 << 20), dt * 1e3, st ? " FAILED" : "");
    ml__alloc_trace_free(t);
    free(text);
}

void bench_sequential_fit(unsigned n)
{
    char y[512];
    snprintf(y, sizeof y,
             "name: seq-%u\nmodel:\n  type: sequential\n  input: [16]\n  layers:\n"
             "    - repeat: {times: %u, layers: [linear: {out: 16}, relu: {}]}\n"
             "  loss: mse\ntraining:\n  micro_batch: 4\ndevice:\n  memory: 8GiB\n",
             n, n / 2);
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_string(y, strlen(y), "seq.yaml", &m, &e) != ML_OK) {
        fprintf(stderr, "bench: %s\n", e.msg);
        return;
    }
    ml_config c = ml_model_config(m);
    ml_fit_request req = ml_fit_request_defaults();
    req.auto_checkpoint = true;
    ml_fit_result r;
    double t0 = now();
    ml_status st = ml_fit(m, &c, &req, &r, &e);
    double dt = now() - t0;
    printf("fit --checkpoint auto, sequential model of %6u layers: %8.1f ms (%u evaluations, "
           "micro-batch %llu)%s%s\n",
           n, dt * 1e3, r.evaluations, (unsigned long long)r.micro_batch, st ? ": " : "",
           st ? e.msg : "");
    ml_model_destroy(m);
}
