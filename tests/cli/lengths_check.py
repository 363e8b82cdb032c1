#!/usr/bin/python3
"""The length walk-through of docs/choosing.md, derived independently.

From the shipped CSV alone (models/lengths/agnews-tokens.csv) this computes
the CDF, the median/P99 sample lengths, the median/P99 length of the longest
of b samples (F(t)^b >= p), the bucket boundaries, and P(over) = 1 - F(T)^b;
it then checks memledger's --lengths figures against them, and each batch
shape's peak against a plain `memledger plan --micro-batch B --seq-len T`,
and the token budget that `fit --max-tokens auto` returns against plans of
every batch shape at N (all fit) and N + 1 (one does not).

usage: lengths_check.py MEMLEDGER SOURCE_ROOT
"""
import json
import subprocess
import sys

MEMLEDGER, ROOT = sys.argv[1], sys.argv[2]
MODEL = ROOT + "/models/agnews-classifier.yaml"
CSV = ROOT + "/models/lengths/agnews-tokens.csv"
DEVICE = "3GiB"
B = 128
failures = 0


def check(what, ok):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += not ok


def run(*args):
    p = subprocess.run([MEMLEDGER] + list(args), capture_output=True, text=True)
    if p.returncode not in (0, 1):
        sys.exit("memledger %s: exit %d: %s" % (" ".join(args), p.returncode, p.stderr))
    return p


def plan_json(*args):
    return json.loads(run("plan", MODEL, "--device", DEVICE, "--format", "json", *args).stdout)


def shape(b, t):
    """(binding peak, fits) of a plain plan at micro-batch b, seq_len t."""
    d = plan_json("--micro-batch", str(b), "--seq-len", str(t))
    peaks = d["peaks"]
    return peaks[peaks["binding"]], d["device"]["fits"]


# the distribution, from the CSV
counts = {}
for line in open(CSV):
    line = line.strip()
    if not line or line.startswith("#") or line.startswith("length"):
        continue
    t, c = line.split(",")
    counts[int(t)] = counts.get(int(t), 0) + int(c)
lengths = sorted(counts)
N = sum(counts.values())
cum, F = 0, {}
for t in lengths:
    cum += counts[t]
    F[t] = cum / N


def cdf(t):
    below = [x for x in lengths if x <= t]
    return F[below[-1]] if below else 0.0


def quantile(p):
    return next(t for t in lengths if F[t] >= p)


check("120,000 samples, 6 to 256 tokens", (N, lengths[0], lengths[-1]) == (120000, 6, 256))
check("median 43 tokens", quantile(0.5) == 43)

# padded random batches of 128
d = plan_json("--micro-batch", str(B), "--lengths", CSV)["lengths"]
t50, t99 = quantile(0.5 ** (1 / B)), quantile(0.99 ** (1 / B))
check("median batch of %d: %d tokens (F >= 0.5^(1/%d))" % (B, t50, B), d["p50"]["seq_len"] == t50)
check("P99 batch: %d tokens" % t99, d["p99"]["seq_len"] == t99)
check("worst batch: 256 tokens", d["worst"]["seq_len"] == 256)
for key, t in (("p50", t50), ("p99", t99), ("worst", 256)):
    peak, fits = shape(B, t)
    check("%s batch peak %d = plan --micro-batch %d --seq-len %d" % (key, peak, B, t),
          d[key]["peak"] == peak and d[key]["fits"] == fits)
T = d["longest_fit"]
check("longest that fits (%d) fits, one more does not" % T, shape(B, T)[1] and not shape(B, T + 1)[1])
p_over = 1 - cdf(T) ** B
check("P(over) = 1 - F(%d)^%d = %.6f" % (T, B, p_over), abs(d["p_over_budget"] - p_over) < 1e-12)
check("the median batch fits and the P99 batch does not",
      d["p50"]["fits"] and not d["p99"]["fits"])

# the token budget: every batch shape at N fits, one at N + 1 does not
fit = json.loads(run("fit", MODEL, "--device", DEVICE, "--format", "json", "--lengths", CSV,
                     "--max-tokens", "auto").stdout)["lengths"]
n = fit["max_tokens"]


def worst_fits(n):
    tops = {}
    for t in lengths:  # each batch size at its longest sample length
        tops[max(1, n // t)] = t
    return all(shape(b, t)[1] for b, t in tops.items())


check("--max-tokens auto = %d: every batch fits" % n, worst_fits(n) and fit["p_over_budget"] == 0)
check("at %d tokens some batch does not" % (n + 1), not worst_fits(n + 1))
check("the budget's median sample: floor(%d / 43) samples" % n,
      fit["p50"]["micro_batch"] == n // 43 and fit["p50"]["seq_len"] == 43)

# four buckets of equal shares
bk = plan_json("--micro-batch", str(B), "--lengths", CSV, "--batching", "bucketed")["lengths"]
edges = [quantile(k / 4) for k in (1, 2, 3)] + [256]
lo = 6
want = []
for hi in edges:
    want.append((lo, hi, cdf(hi) - cdf(lo - 1)))
    lo = hi + 1
got = [(b["lo"], b["hi"], b["share"]) for b in bk["buckets"]]
check("buckets %s" % [(a, b) for a, b, _ in want],
      [(a, b) for a, b, _ in got] == [(a, b) for a, b, _ in want] and
      all(abs(g[2] - w[2]) < 1e-12 for g, w in zip(got, want)))

print("%d failed" % failures)
sys.exit(1 if failures else 0)
