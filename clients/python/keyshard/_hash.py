"""Key -> bucket, in pure Python: xxh64 (default) and synapse-sha256.

bucket = (xxh64(utf8(key), seed=0) * B) >> 64 for "xxh64", and
int.from_bytes(sha256(utf8(key)), "little") % B for "synapse-sha256",
exactly as the Go placement package and api/keyshard/v1/reference/bucket.py.

The xxh64 code is written for speed in CPython: arithmetic inlined,
constants bound as default arguments (fast locals), lanes read with
precompiled struct unpackers.
"""
import hashlib
import struct
from typing import Iterable, List, Union

__all__ = ["bucket", "buckets_of", "xxh64", "HASH_MODES"]

HASH_MODES = ("xxh64", "synapse-sha256")

_M = 0xFFFFFFFFFFFFFFFF
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5

# _LANES[k] reads k little-endian uint64 lanes at an offset.
_LANES = [struct.Struct("<%dQ" % k).unpack_from for k in range(5)]
_U32 = struct.Struct("<I").unpack_from
_U64x4 = struct.Struct("<4Q").unpack_from


def xxh64(data: bytes, seed: int = 0,
          M: int = _M, P1: int = _P1, P2: int = _P2, P3: int = _P3,
          P4: int = _P4, P5: int = _P5, LANES=_LANES, U32=_U32,
          U64x4=_U64x4) -> int:
    """XXH64 of data (bytes), as an int in [0, 2**64)."""
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + P1 + P2) & M
        v2 = (seed + P2) & M
        v3 = seed & M
        v4 = (seed - P1) & M
        limit = n - 32
        while i <= limit:
            a, b, c, d = U64x4(data, i)
            v1 = (v1 + a * P2) & M
            v1 = (((v1 << 31) | (v1 >> 33)) & M) * P1 & M
            v2 = (v2 + b * P2) & M
            v2 = (((v2 << 31) | (v2 >> 33)) & M) * P1 & M
            v3 = (v3 + c * P2) & M
            v3 = (((v3 << 31) | (v3 >> 33)) & M) * P1 & M
            v4 = (v4 + d * P2) & M
            v4 = (((v4 << 31) | (v4 >> 33)) & M) * P1 & M
            i += 32
        h = ((((v1 << 1) | (v1 >> 63)) + ((v2 << 7) | (v2 >> 57))
              + ((v3 << 12) | (v3 >> 52)) + ((v4 << 18) | (v4 >> 46))) & M)
        for v in (v1, v2, v3, v4):
            v = (v * P2) & M
            v = (((v << 31) | (v >> 33)) & M) * P1 & M
            h = ((h ^ v) * P1 + P4) & M
        h = (h + n) & M
    else:
        h = (seed + P5 + n) & M
    k = (n - i) >> 3
    if k:
        for lane in LANES[k](data, i):
            lane = (lane * P2) & M
            lane = (((lane << 31) | (lane >> 33)) & M) * P1 & M
            h ^= lane
            h = ((((h << 27) | (h >> 37)) & M) * P1 + P4) & M
        i += k << 3
    if n - i >= 4:
        h ^= (U32(data, i)[0] * P1) & M
        h = ((((h << 23) | (h >> 41)) & M) * P2 + P3) & M
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M
        h = (((h << 11) | (h >> 53)) & M) * P1 & M
        i += 1
    h ^= h >> 33
    h = (h * P2) & M
    h ^= h >> 29
    h = (h * P3) & M
    return h ^ (h >> 32)


def _check_buckets(buckets: int) -> None:
    if type(buckets) is not int:  # bool is refused too
        raise TypeError("buckets: want an int, got %s" % type(buckets).__name__)
    if not 1 <= buckets <= 65536:
        raise ValueError("buckets: %d is outside [1, 65536]" % buckets)


def bucket(key: Union[str, bytes], buckets: int, hash: str = "xxh64",
           M: int = _M, P1: int = _P1, P2: int = _P2, P3: int = _P3,
           P4: int = _P4, P5: int = _P5, LANES=_LANES, U32=_U32, U64x4=_U64x4,
           _sha256=hashlib.sha256) -> int:
    """The bucket of key (str, encoded as UTF-8, or bytes) among `buckets`.

    hash is the keyspace's hash mode: "xxh64" (the default) or
    "synapse-sha256". Raises TypeError/ValueError for a bad argument.
    """
    if type(key) is str:
        data = key.encode("utf-8")
    elif isinstance(key, bytes):
        data = key
    elif isinstance(key, (bytearray, memoryview)):
        data = bytes(key)
    else:
        raise TypeError("key: want str or bytes, got %s" % type(key).__name__)
    if type(buckets) is not int or not 0 < buckets <= 65536:
        _check_buckets(buckets)
    if hash != "xxh64":
        if hash == "synapse-sha256":
            return int.from_bytes(_sha256(data).digest(), "little") % buckets
        raise ValueError("hash: unknown hash mode %r; want one of %s" % (hash, ", ".join(HASH_MODES)))
    n = len(data)
    if n >= 32:
        v1 = 6983438078262162902  # (P1 + P2) mod 2**64
        v2 = P2
        v3 = 0
        v4 = 7046029288634856825  # -P1 mod 2**64
        i = 0
        limit = n - 32
        while i <= limit:
            a, b, c, d = U64x4(data, i)
            v1 = (v1 + a * P2) & M
            v1 = (((v1 << 31) | (v1 >> 33)) & M) * P1 & M
            v2 = (v2 + b * P2) & M
            v2 = (((v2 << 31) | (v2 >> 33)) & M) * P1 & M
            v3 = (v3 + c * P2) & M
            v3 = (((v3 << 31) | (v3 >> 33)) & M) * P1 & M
            v4 = (v4 + d * P2) & M
            v4 = (((v4 << 31) | (v4 >> 33)) & M) * P1 & M
            i += 32
        h = ((((v1 << 1) | (v1 >> 63)) + ((v2 << 7) | (v2 >> 57))
              + ((v3 << 12) | (v3 >> 52)) + ((v4 << 18) | (v4 >> 46))) & M)
        v = (v1 * P2) & M
        h = ((h ^ ((((v << 31) | (v >> 33)) & M) * P1 & M)) * P1 + P4) & M
        v = (v2 * P2) & M
        h = ((h ^ ((((v << 31) | (v >> 33)) & M) * P1 & M)) * P1 + P4) & M
        v = (v3 * P2) & M
        h = ((h ^ ((((v << 31) | (v >> 33)) & M) * P1 & M)) * P1 + P4) & M
        v = (v4 * P2) & M
        h = ((h ^ ((((v << 31) | (v >> 33)) & M) * P1 & M)) * P1 + P4) & M
        h = (h + n) & M
    else:
        h = (P5 + n) & M
        i = 0
    k = (n - i) >> 3
    if k:
        for lane in LANES[k](data, i):
            lane = (lane * P2) & M
            h ^= (((lane << 31) | (lane >> 33)) & M) * P1 & M
            h = ((((h << 27) | (h >> 37)) & M) * P1 + P4) & M
        i += k << 3
    if n - i >= 4:
        h ^= (U32(data, i)[0] * P1) & M
        h = ((((h << 23) | (h >> 41)) & M) * P2 + P3) & M
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M
        h = (((h << 11) | (h >> 53)) & M) * P1 & M
        i += 1
    h ^= h >> 33
    h = (h * P2) & M
    h ^= h >> 29
    h = (h * P3) & M
    return ((h ^ (h >> 32)) * buckets) >> 64


def buckets_of(keys: Iterable[Union[str, bytes]], buckets: int, hash: str = "xxh64") -> List[int]:
    """The bucket of every key in keys, in order (bucket() of each)."""
    _check_buckets(buckets)
    if hash not in HASH_MODES:
        raise ValueError("hash: unknown hash mode %r; want one of %s" % (hash, ", ".join(HASH_MODES)))
    out: List[int] = []
    for i, k in enumerate(keys):
        if not isinstance(k, (str, bytes, bytearray, memoryview)):
            raise TypeError("keys[%d]: want str or bytes, got %s" % (i, type(k).__name__))
        out.append(bucket(k, buckets, hash))
    return out
