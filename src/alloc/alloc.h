/* A model of PyTorch 2.x's CUDA caching allocator
 * (c10/cuda/CUDACachingAllocator.cpp): requests and frees replayed through
 * its rounding, pools, best fit, splitting, merging, release-and-retry and
 * expandable segments, to predict torch.cuda.max_memory_reserved() and
 * max_memory_allocated() without a GPU. docs/allocator.md derives each rule
 * from the source and lists what is simplified.
 *
 * Internal to the library (no ML_API): the CLI verb `memledger allocator`
 * and the planner use it. Depends on libc only; no global state: every
 * simulator is one object with its own create and destroy. */
#ifndef ML_ALLOC_H
#define ML_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memledger/error.h"

/* PyTorch's constants (CUDACachingAllocator.cpp; kLargeBuffer lives in
 * CUDAAllocatorConfig in newer releases). */
#define ML_ALLOC_MIN_BLOCK 512u          /* kMinBlockSize: every size rounds up to it */
#define ML_ALLOC_SMALL_SIZE 1048576u     /* kSmallSize: largest small-pool request */
#define ML_ALLOC_SMALL_BUFFER 2097152u   /* kSmallBuffer: small-pool segment, small page */
#define ML_ALLOC_LARGE_BUFFER 20971520u  /* kLargeBuffer: 1-10 MiB segment, large page */
#define ML_ALLOC_MIN_LARGE_ALLOC 10485760u /* kMinLargeAlloc */
#define ML_ALLOC_ROUND_LARGE 2097152u    /* kRoundLarge */
/* allocate() refuses 1 EiB and more with an OutOfMemoryError */
#define ML_ALLOC_MAX_REQUEST (1ull << 60)
/* the device's memory taken without a device (64 TiB): what sizes the
 * expandable segments' address space, 1 1/8 of it (72 TiB) */
#define ML_ALLOC_NO_DEVICE_BYTES (1ull << 46)

typedef enum {
    ML_ALLOC_CACHING,    /* the default: cudaMalloc'd segments, cached */
    ML_ALLOC_EXPANDABLE, /* expandable_segments:True: one growing segment per pool */
    ML_ALLOC_NONE,       /* no cache: reserved = allocated (a lower bound) */
} ml_alloc_mode;

typedef struct {
    ml_alloc_mode mode;
    /* Bytes the allocator may reserve on the device (its capacity less the
     * CUDA context and anything outside PyTorch); a cudaMalloc or a page
     * mapping that would exceed it fails. 0: unlimited. */
    uint64_t device_bytes;
    /* max_split_size_mb in bytes; 0: unlimited (PyTorch's default). When
     * set it must be at least ML_ALLOC_LARGE_BUFFER, as PyTorch 2.9 and
     * later require (c10/core/AllocatorConfig.cpp, parseMaxSplitSize;
     * 2.5 to 2.8 required more). */
    uint64_t max_split_size;
    /* max_non_split_rounding_mb in bytes: how much larger than an oversize
     * request a cached oversize block may be; 0: ML_ALLOC_LARGE_BUFFER. */
    uint64_t max_non_split_rounding;
    /* garbage_collection_threshold, a fraction in [0, 1); 0: off. Acts
     * only with device_bytes (PyTorch: only with a memory fraction set). */
    double gc_threshold;
    /* roundup_power2_divisions, one value for all sizes; 0 or 1: off. A
     * power of two up to 64 otherwise. */
    unsigned roundup_power2_divisions;
} ml_alloc_config;

/* A caching simulator with no device limit and PyTorch's defaults. */
ml_alloc_config ml__alloc_config_defaults(void);

typedef enum {
    ML_ALLOC_OK = 0,
    ML_ALLOC_OOM,        /* the device would run out: PyTorch raises OutOfMemoryError */
    ML_ALLOC_NOMEM,      /* the host ran out of memory; the call changed nothing */
    ML_ALLOC_BAD_HANDLE, /* not a live allocation of this simulator */
    ML_ALLOC_BAD_CONFIG, /* a config value out of range */
} ml_alloc_result;

/* One statistic as torch.cuda.memory_stats() keeps it: now and highest. */
typedef struct {
    uint64_t current, peak;
} ml_alloc_stat;

typedef struct {
    ml_alloc_stat allocated; /* bytes of allocated blocks (rounded, as allocated_bytes) */
    ml_alloc_stat requested; /* bytes as requested (requested_bytes) */
    ml_alloc_stat reserved;  /* bytes of segments, or mapped pages (reserved_bytes) */
    /* cudaMalloc'd segments; with expandable segments, the live expandable
     * segments (one per pool in use), which PyTorch's own count omits */
    ml_alloc_stat segments;
    uint64_t device_allocs;     /* cudaMalloc calls, or page mappings (num_device_alloc) */
    uint64_t device_frees;      /* cudaFree calls, or unmappings (num_device_free) */
    uint64_t num_alloc_retries; /* allocations retried after releasing the cache */
    uint64_t num_ooms;
    uint64_t events;    /* malloc and free calls so far */
    uint64_t oom_event; /* 1-based event index of the first OOM; 0: none */
    /* allocated bytes and segments just after the allocation that last
     * raised reserved.peak: a later release of the cache (a retry) can take
     * the reserved bytes below their peak within one caller's step */
    uint64_t at_peak_allocated, at_peak_segments;
} ml_alloc_stats;

typedef struct ml_alloc_sim ml_alloc_sim;

/* Creates a simulator with an empty cache. Returns ML_ALLOC_OK with *out
 * set (the caller destroys it), ML_ALLOC_BAD_CONFIG (a value out of range,
 * *out untouched) or ML_ALLOC_NOMEM. */
ml_alloc_result ml__alloc_sim_create(const ml_alloc_config *cfg, ml_alloc_sim **out);
/* Room for `blocks` blocks before the simulator allocates again (a hint:
 * no result depends on it). Returns ML_ALLOC_OK or ML_ALLOC_NOMEM (then
 * nothing changed). */
ml_alloc_result ml__alloc_sim_reserve(ml_alloc_sim *s, size_t blocks);
/* Frees the simulator and every block; NULL is accepted. */
void ml__alloc_sim_destroy(ml_alloc_sim *s);

/* Allocates `bytes` (the requested size, before rounding). One event.
 * ML_ALLOC_OK: *handle names the allocation until it is freed (0 for a
 * 0-byte request, which like PyTorch takes no block). ML_ALLOC_OOM: the
 * cache was released and the request still does not fit (the event is
 * recorded in the stats; nothing is allocated). ML_ALLOC_NOMEM: see above.
 * *handle is written only on ML_ALLOC_OK. */
ml_alloc_result ml__alloc_sim_malloc(ml_alloc_sim *s, uint64_t bytes, uint64_t *handle);
/* ml__alloc_sim_malloc for bytes[0], bytes[1], ... in turn (n events),
 * stopping at the first that does not return ML_ALLOC_OK, whose result it
 * returns; *done: how many succeeded (handles[0 .. *done) are written). */
ml_alloc_result ml__alloc_sim_malloc_many(ml_alloc_sim *s, const uint64_t *bytes, size_t n,
                                          uint64_t *handles, size_t *done);
/* Frees an allocation (handle 0: nothing). One event. Returns ML_ALLOC_OK
 * or ML_ALLOC_BAD_HANDLE (unchanged simulator, no event counted). */
ml_alloc_result ml__alloc_sim_free(ml_alloc_sim *s, uint64_t handle);
/* Frees n allocations, as n ml__alloc_sim_free calls in any order would
 * (n events; the same state and statistics), in one pass: the blocks of
 * one run merge once. Returns ML_ALLOC_OK, or ML_ALLOC_BAD_HANDLE when a
 * handle is not live (that one is skipped; the others are freed). */
ml_alloc_result ml__alloc_sim_free_many(ml_alloc_sim *s, const uint64_t *handles, size_t n);
/* torch.cuda.empty_cache(): releases every cached segment (or unused page)
 * that holds no allocation. Returns ML_ALLOC_OK or ML_ALLOC_NOMEM. */
ml_alloc_result ml__alloc_sim_empty_cache(ml_alloc_sim *s);
/* torch.cuda.reset_peak_memory_stats(): each peak becomes its current value. */
void ml__alloc_sim_reset_peaks(ml_alloc_sim *s);
/* The statistics so far. */
void ml__alloc_sim_stats(const ml_alloc_sim *s, ml_alloc_stats *out);
/* Its reserved bytes' peak (stats.reserved.peak), for a caller that asks
 * after every event. */
uint64_t ml__alloc_sim_reserved_peak(const ml_alloc_sim *s);
/* NULL when the simulator's structures agree with each other (every free
 * block in its pool's set in order, the counts, the memo), else what does
 * not; for the tests. */
const char *ml__alloc_sim_check(const ml_alloc_sim *s);
/* The device address a live allocation was placed at (docs/allocator.md,
 * "Addresses"); 0 for handle 0 or one that is not live. */
uint64_t ml__alloc_sim_address(const ml_alloc_sim *s, uint64_t handle);

/* The size a request occupies: round_size() (512 B multiples, minimum
 * 512, or the power-of-two division with roundup_power2_divisions). */
uint64_t ml__alloc_round_size(const ml_alloc_config *cfg, uint64_t bytes);
/* The segment cudaMalloc'd for a rounded size with nothing cached:
 * get_allocation_size() (2 MiB, 20 MiB, or the size rounded to 2 MiB). */
uint64_t ml__alloc_segment_size(uint64_t rounded);

/* "caching", "expandable", "none"; and back (false when unknown). */
const char *ml__alloc_mode_name(ml_alloc_mode m);
bool ml__alloc_mode_parse(const char *s, ml_alloc_mode *out);

/* ---- A trace of allocations and frees: the CSV `action,id,bytes` ---- */

typedef struct {
    uint64_t bytes;  /* alloc: the requested bytes; free: those of the allocation freed */
    uint32_t slot;   /* the allocation: the index of its alloc event */
    uint32_t line;   /* 1-based line of the file */
    bool free;
    bool empty_cache; /* torch.cuda.empty_cache(): no id, no bytes (free is false) */
} ml_alloc_event;

typedef struct ml_alloc_trace {
    ml_alloc_event *ev;
    size_t n;
    size_t allocs, frees, empties; /* empties: empty_cache events */
    /* ids[i]: the id an alloc event i names (NULL for frees); the strings
     * are the trace's, once per distinct id in names */
    char **ids;
    char **names;
    size_t nnames;
} ml_alloc_trace;

/* Parses a trace: a header naming the columns action,id,bytes in that
 * order, then one event per line: `alloc,ID,BYTES` or `free,ID,BYTES`
 * (a free's bytes may be empty), or `empty_cache` (its id and bytes
 * empty or left out). ID is any token without a comma; a free
 * names a live allocation; an alloc may reuse the id of a freed one. Blank
 * lines and lines starting with '#' are skipped.
 * Returns ML_OK with *out set (free with ml__alloc_trace_free), or ML_SCHEMA
 * / ML_RANGE with err's path (from `path`), line, column and message, or
 * ML_NOMEM. */
ml_status ml__alloc_trace_parse(const char *text, size_t len, const char *path,
                                ml_alloc_trace **out, ml_error *err);
void ml__alloc_trace_free(ml_alloc_trace *t);

typedef struct {
    /* the peaks from the start on (after a start state: reset there); the
     * counts (events, device_allocs and frees, retries, OOMs) the trace's own */
    ml_alloc_stats stats;
    ml_alloc_stats start; /* the current figures after the start state (zero without) */
    size_t oom_index; /* 0-based index into the trace's events of the OOM; SIZE_MAX: none */
} ml_alloc_replay_result;

/* Replays the whole trace through a new simulator, stopping at the first
 * OOM. Returns ML_ALLOC_OK (an OOM is reported in *out, not as an error),
 * ML_ALLOC_BAD_CONFIG or ML_ALLOC_NOMEM; *out written on ML_ALLOC_OK. */
ml_alloc_result ml__alloc_replay(const ml_alloc_config *cfg, const ml_alloc_trace *t,
                                 ml_alloc_replay_result *out);
/* The same, from the state `start` leaves (NULL: an empty cache): its
 * events first, then the peaks reset (torch.cuda.reset_peak_memory_stats),
 * then t's. Returns ML_ALLOC_OOM when the start itself runs out (*out
 * unwritten); otherwise as ml__alloc_replay. */
ml_alloc_result ml__alloc_replay_from(const ml_alloc_config *cfg, const ml_alloc_trace *start,
                                      const ml_alloc_trace *t, ml_alloc_replay_result *out);
/* The trace's events through s in order, stopping at the first that does
 * not return ML_ALLOC_OK; *at: the index of that event, t->n when every
 * event ran. What the trace leaves allocated stays allocated in s. Returns
 * what that event returned (ML_ALLOC_OOM, ML_ALLOC_NOMEM), or ML_ALLOC_OK. */
ml_alloc_result ml__alloc_trace_run(ml_alloc_sim *s, const ml_alloc_trace *t, size_t *at);

#endif
