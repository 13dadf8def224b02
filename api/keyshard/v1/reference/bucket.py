#!/usr/bin/env python3
"""Keyshard key -> bucket, in plain Python (no packages needed).

This is the reference for client authors: it implements both hash modes
exactly as the Go placement package does, and checks itself against the
shared test vectors:

    python3 bucket.py ../hash_vectors.json

The default mode, "xxh64":   bucket = (xxh64(key, seed=0) * B) >> 64
The Synapse mode, "synapse-sha256":
                             bucket = int.from_bytes(sha256(key), "little") % B
Keys are the UTF-8 bytes of the key string.
"""
import hashlib
import json
import sys

_M = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc, lane):
    acc = (acc + lane * _P2) & _M
    return (_rotl(acc, 31) * _P1) & _M


def _merge(acc, val):
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _M


def _u64(b, i):
    return int.from_bytes(b[i:i + 8], "little")


def xxh64(data, seed=0):
    """XXH64 of data (bytes), as an int in [0, 2**64)."""
    n, i = len(data), 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _M
        v2 = (seed + _P2) & _M
        v3 = seed & _M
        v4 = (seed - _P1) & _M
        while i + 32 <= n:
            v1 = _round(v1, _u64(data, i))
            v2 = _round(v2, _u64(data, i + 8))
            v3 = _round(v3, _u64(data, i + 16))
            v4 = _round(v4, _u64(data, i + 24))
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h ^= _round(0, _u64(data, i))
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i:i + 4], "little") * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    h ^= h >> 32
    return h


def bucket(key, buckets, mode="xxh64"):
    """The bucket of key (str or bytes) in a keyspace of `buckets` buckets."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    if mode == "xxh64":
        return (xxh64(key) * buckets) >> 64
    if mode == "synapse-sha256":
        return int.from_bytes(hashlib.sha256(key).digest(), "little") % buckets
    raise ValueError("unknown hash mode %r" % (mode,))


def main(path):
    with open(path) as f:
        doc = json.load(f)
    bad = 0
    for v in doc["vectors"]:
        got = bucket(v["key"], v["buckets"], v["mode"])
        if got != v["bucket"]:
            bad += 1
            print("MISMATCH mode=%s key=%r buckets=%d: got %d, want %d"
                  % (v["mode"], v["key"], v["buckets"], got, v["bucket"]))
    print("%d vectors checked, %d mismatches" % (len(doc["vectors"]), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "hash_vectors.json"))
