#!/usr/bin/env python3
"""Measures keyshard.bucket / buckets_of throughput in pure Python.

Prints JSON: keys/s (median of 5 runs) for 16-byte and 40-byte keys,
bucket() per key and buckets_of() per batch, both hash modes.

    python3 clients/python/tools/bench_bucket.py [--keys 100000] [--buckets 4096]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from keyshard import bucket, buckets_of  # noqa: E402


def keys_of(n, size):
    # distinct, room-id-like keys of exactly size bytes
    return [("!%0*d:ex.org" % (size - 8, i))[:size] if size > 8 else ("%0*d" % (size, i)) for i in range(n)]


def rate(fn, keys, runs=5):
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(keys)
        out.append(len(keys) / (time.perf_counter() - t))
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--keys", type=int, default=100000)
    p.add_argument("--buckets", type=int, default=4096)
    a = p.parse_args()
    B = a.buckets
    res = {"python": platform.python_version(), "keys_per_run": a.keys, "buckets": B, "runs": 5}
    for size in (16, 40):
        ks = keys_of(a.keys, size)
        assert all(len(k) == size for k in ks)
        res["bucket_xxh64_%db_keys_per_s" % size] = round(rate(lambda keys: [bucket(k, B) for k in keys], ks))
        res["buckets_of_xxh64_%db_keys_per_s" % size] = round(rate(lambda keys: buckets_of(keys, B), ks))
        res["bucket_sha256_%db_keys_per_s" % size] = round(
            rate(lambda keys: [bucket(k, B, "synapse-sha256") for k in keys], ks))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
