/* A keyed hash for tables indexed by outside input (internal). With a fixed
 * hash, ids chosen to collide in a table's low bits turn each insertion
 * into a scan of all before it (250,000 trace ids once took 291 s); with a
 * key drawn per table the collisions cannot be chosen in advance. */
#ifndef MEMLEDGER_UTIL_HASH_H
#define MEMLEDGER_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct ml_hash_key {
    uint64_t k0, k1;
} ml_hash_key;

/* A fresh key: the clock, the CPU time and the addresses of the caller's
 * table and of the stack (which ASLR moves), mixed; no state is kept. Not for cryptography: it
 * only has to be unknown to whoever wrote the input. */
ml_hash_key ml__hash_key_new(const void *salt);

/* SipHash-2-4 of n bytes at p under key k (Aumasson and Bernstein 2012,
 * "SipHash: a fast short-input PRF"; the test vectors of its appendix). */
uint64_t ml__hash(const ml_hash_key *k, const void *p, size_t n);

#endif
