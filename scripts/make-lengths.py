#!/usr/bin/python3
"""Writes models/lengths/agnews-tokens.csv: an illustrative distribution of
sample lengths in tokens, 120,000 samples (the size of AG News's training
split) with log-normal lengths, median 43 tokens and sigma 0.45, truncated at
256 tokens as a tokenizer's max_length=256 would. The counts are the
log-normal's probability of each length (t - 0.5, t + 0.5], times 120,000,
rounded down, with the remainder added to the median's count so they sum to
120,000 exactly: deterministic, no random numbers. The shape (a long right
tail) is that of news-article token counts; the parameters are chosen to
illustrate, not fitted to a measurement.

usage: scripts/make-lengths.py > models/lengths/agnews-tokens.csv
"""
import math

N, MEDIAN, SIGMA, CAP = 120000, 43, 0.45, 256


def cdf(x):
    """P(L <= x) for the log-normal."""
    if x <= 0:
        return 0.0
    return 0.5 * (1 + math.erf((math.log(x) - math.log(MEDIAN)) / (SIGMA * math.sqrt(2))))


counts = {}
for t in range(1, CAP + 1):
    p = (1.0 if t == CAP else cdf(t + 0.5)) - cdf(t - 0.5)
    c = int(N * p)
    if c:
        counts[t] = c
counts[MEDIAN] += N - sum(counts.values())
print("# scripts/make-lengths.py: log-normal, median %d, sigma %g, %d samples, "
      "truncated at %d" % (MEDIAN, SIGMA, N, CAP))
print("length,count")
for t in sorted(counts):
    print("%d,%d" % (t, counts[t]))
