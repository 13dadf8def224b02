// Key -> bucket, as the Go placement package computes it:
//   "xxh64" (default):  bucket = (xxh64(utf8(key), seed 0) * B) >> 64
//   "synapse-sha256":   bucket = int.from_bytes(sha256(utf8(key)), "little") % B
//
// xxh64 runs on 32-bit limbs (hi/lo uint32 pairs); 64-bit multiplies are
// split into 16-bit parts around Math.imul. No BigInt and no allocation
// per call on the hot path: a string key is written as UTF-8 into one
// reused buffer (ASCII straight from charCodeAt, otherwise
// TextEncoder.encodeInto).
import { createHash } from 'node:crypto';

export const HASH_MODES = Object.freeze(['xxh64', 'synapse-sha256']);
export const MAX_BUCKETS = 65536;

// Primes as [hi, lo].
const P1H = 0x9e3779b1 | 0, P1L = 0x85ebca87 | 0;
const P2H = 0xc2b2ae3d | 0, P2L = 0x27d4eb4f | 0;
const P3H = 0x165667b1 | 0, P3L = 0x9e3779f9 | 0;
const P4H = 0x85ebca77 | 0, P4L = 0xc2b2ae63 | 0;
const P5H = 0x27d4eb2f | 0, P5L = 0x165667c5 | 0;

// Results of the limb helpers (module-level "registers": no allocation).
const R = new Int32Array(2);

// (ah:al) * (bh:bl) mod 2^64 -> R[0]:R[1]
function mul(ah, al, bh, bl) {
  const a0 = al & 0xffff, a1 = al >>> 16, b0 = bl & 0xffff, b1 = bl >>> 16;
  const t = a0 * b0;
  const m1 = a1 * b0, m2 = a0 * b1;
  const mid = (t >>> 16) + (m1 & 0xffff) + (m2 & 0xffff);
  const hiLL = a1 * b1 + (m1 >>> 16) + (m2 >>> 16) + (mid >>> 16); // high 32 bits of al*bl, < 2^32
  R[1] = ((mid << 16) | (t & 0xffff)) | 0;
  R[0] = (hiLL + Math.imul(ah, bl) + Math.imul(al, bh)) | 0;
}

// (ah:al) + (bh:bl) mod 2^64 -> R[0]:R[1]
function add(ah, al, bh, bl) {
  const lo = (al >>> 0) + (bl >>> 0);
  R[1] = lo | 0;
  R[0] = (ah + bh + (lo > 0xffffffff ? 1 : 0)) | 0;
}

// rotl(h:l, r) for 0 < r < 32 -> R[0]:R[1]
function rotl(h, l, r) {
  R[0] = ((h << r) | (l >>> (32 - r))) | 0;
  R[1] = ((l << r) | (h >>> (32 - r))) | 0;
}

// round(acc, lane) = rotl(acc + lane*P2, 31) * P1 -> R. Written out with
// locals only (the hot loop of long keys): no register round-trips.
const P2L0 = P2L & 0xffff, P2L1 = P2L >>> 16, P1L0 = P1L & 0xffff, P1L1 = P1L >>> 16;
function round(ah, al, lh, ll) {
  // p = lane * P2
  let a0 = ll & 0xffff, a1 = ll >>> 16;
  let t = a0 * P2L0, m1 = a1 * P2L0, m2 = a0 * P2L1;
  let mid = (t >>> 16) + (m1 & 0xffff) + (m2 & 0xffff);
  let pl = ((mid << 16) | (t & 0xffff)) | 0;
  let ph = (a1 * P2L1 + (m1 >>> 16) + (m2 >>> 16) + (mid >>> 16) + Math.imul(lh, P2L) + Math.imul(ll, P2H)) | 0;
  // s = acc + p
  const lo = (al >>> 0) + (pl >>> 0);
  const sl = lo | 0;
  const sh = (ah + ph + (lo > 0xffffffff ? 1 : 0)) | 0;
  // r = rotl(s, 31)
  const xh = ((sh << 31) | (sl >>> 1)) | 0;
  const xl = ((sl << 31) | (sh >>> 1)) | 0;
  // r * P1
  a0 = xl & 0xffff; a1 = xl >>> 16;
  t = a0 * P1L0; m1 = a1 * P1L0; m2 = a0 * P1L1;
  mid = (t >>> 16) + (m1 & 0xffff) + (m2 & 0xffff);
  R[1] = ((mid << 16) | (t & 0xffff)) | 0;
  R[0] = (a1 * P1L1 + (m1 >>> 16) + (m2 >>> 16) + (mid >>> 16) + Math.imul(xh, P1L) + Math.imul(xl, P1H)) | 0;
}

let buf = new Uint8Array(256);
const encoder = new TextEncoder();

// utf8 writes key into the shared buffer and returns its byte length.
function utf8(key) {
  const n = key.length;
  if (n * 3 > buf.length) buf = new Uint8Array(Math.max(n * 3, buf.length * 2));
  const b = buf;
  for (let i = 0; i < n; i++) {
    const c = key.charCodeAt(i);
    if (c >= 0x80) return encoder.encodeInto(key, b).written;
    b[i] = c;
  }
  return n;
}

function u32(b, i) {
  return (b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24)) | 0;
}

// xxh64 of b[0:n] with seed 0 -> R[0]:R[1]
function xxh64Limbs(b, n) {
  let i = 0;
  let hh, hl;
  if (n >= 32) {
    i = stripes(b, n);
    hh = R[0]; hl = R[1];
  } else {
    hh = P5H; hl = P5L;
  }
  tail(b, i, n, hh, hl);
}

// stripes consumes the 32-byte stripes of b[0:n] (n >= 32): -> R, and
// returns the offset after the last stripe. (Split from xxh64Limbs so
// that each function stays within V8's inlining budget.)
function stripes(b, n) {
  let i = 0;
  let hh, hl;
  // v1 = P1 + P2, v2 = P2, v3 = 0, v4 = -P1 (seed 0)
  add(P1H, P1L, P2H, P2L);
  let v1h = R[0], v1l = R[1];
  let v2h = P2H, v2l = P2L;
  let v3h = 0, v3l = 0;
  // -P1 mod 2^64
  let v4l = (~P1L + 1) | 0;
  let v4h = (~P1H + (v4l === 0 ? 1 : 0)) | 0;
  while (i + 32 <= n) {
    round(v1h, v1l, u32(b, i + 4), u32(b, i)); v1h = R[0]; v1l = R[1];
    round(v2h, v2l, u32(b, i + 12), u32(b, i + 8)); v2h = R[0]; v2l = R[1];
    round(v3h, v3l, u32(b, i + 20), u32(b, i + 16)); v3h = R[0]; v3l = R[1];
    round(v4h, v4l, u32(b, i + 28), u32(b, i + 24)); v4h = R[0]; v4l = R[1];
    i += 32;
  }
  rotl(v1h, v1l, 1); hh = R[0]; hl = R[1];
  rotl(v2h, v2l, 7); add(hh, hl, R[0], R[1]); hh = R[0]; hl = R[1];
  rotl(v3h, v3l, 12); add(hh, hl, R[0], R[1]); hh = R[0]; hl = R[1];
  rotl(v4h, v4l, 18); add(hh, hl, R[0], R[1]); hh = R[0]; hl = R[1];
  R[0] = hh; R[1] = hl;
  merge4(v1h, v1l, v2h, v2l, v3h, v3l, v4h, v4l);
  return i;
}

// merge4 folds the four accumulators into R: h ^= round(0, v); h = h*P1 + P4.
function merge4(v1h, v1l, v2h, v2l, v3h, v3l, v4h, v4l) {
  let hh = R[0], hl = R[1];
  round(0, 0, v1h, v1l); hh = (hh ^ R[0]) | 0; hl = (hl ^ R[1]) | 0;
  mul(hh, hl, P1H, P1L); add(R[0], R[1], P4H, P4L); hh = R[0]; hl = R[1];
  round(0, 0, v2h, v2l); hh = (hh ^ R[0]) | 0; hl = (hl ^ R[1]) | 0;
  mul(hh, hl, P1H, P1L); add(R[0], R[1], P4H, P4L); hh = R[0]; hl = R[1];
  round(0, 0, v3h, v3l); hh = (hh ^ R[0]) | 0; hl = (hl ^ R[1]) | 0;
  mul(hh, hl, P1H, P1L); add(R[0], R[1], P4H, P4L); hh = R[0]; hl = R[1];
  round(0, 0, v4h, v4l); hh = (hh ^ R[0]) | 0; hl = (hl ^ R[1]) | 0;
  mul(hh, hl, P1H, P1L); add(R[0], R[1], P4H, P4L); hh = R[0]; hl = R[1];
  R[0] = hh; R[1] = hl;
}

function tail(b, i, n, hh, hl) {
  // h += n (n < 2^53; split into hi/lo)
  add(hh, hl, Math.floor(n / 4294967296) | 0, n | 0); hh = R[0]; hl = R[1];
  while (i + 8 <= n) {
    round(0, 0, u32(b, i + 4), u32(b, i));
    hh = (hh ^ R[0]) | 0; hl = (hl ^ R[1]) | 0;
    rotl(hh, hl, 27); mul(R[0], R[1], P1H, P1L); add(R[0], R[1], P4H, P4L); hh = R[0]; hl = R[1];
    i += 8;
  }
  if (i + 4 <= n) {
    mul(0, u32(b, i), P1H, P1L);
    hh = (hh ^ R[0]) | 0; hl = (hl ^ R[1]) | 0;
    rotl(hh, hl, 23); mul(R[0], R[1], P2H, P2L); add(R[0], R[1], P3H, P3L); hh = R[0]; hl = R[1];
    i += 4;
  }
  while (i < n) {
    mul(0, b[i], P5H, P5L);
    hh = (hh ^ R[0]) | 0; hl = (hl ^ R[1]) | 0;
    rotl(hh, hl, 11); mul(R[0], R[1], P1H, P1L); hh = R[0]; hl = R[1];
    i++;
  }
  // avalanche
  hl = (hl ^ (hh >>> 1)) | 0;                          // h ^= h >> 33
  mul(hh, hl, P2H, P2L); hh = R[0]; hl = R[1];
  hl = (hl ^ ((hl >>> 29) | (hh << 3))) | 0;            // h ^= h >> 29
  hh = (hh ^ (hh >>> 29)) | 0;
  mul(hh, hl, P3H, P3L); hh = R[0]; hl = R[1];
  R[0] = hh; R[1] = (hl ^ hh) | 0;                         // h ^= h >> 32
}

function toBytes(key, fn) {
  if (typeof key === 'string') return utf8(key);
  if (key instanceof Uint8Array) return -1;
  throw new TypeError(`${fn}: key must be a string or a Uint8Array, not ${describe(key)}`);
}

export function describe(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  if (typeof v === 'object') return `a ${v.constructor?.name ?? 'object'}`;
  if (typeof v === 'string') return `the string ${JSON.stringify(v.length > 40 ? v.slice(0, 40) + '...' : v)}`;
  return `${typeof v} ${String(v)}`;
}

/** xxh64(key, seed 0) as a BigInt (for tests and tools; bucket() does not use it). */
export function xxh64(key) {
  const n = toBytes(key, 'xxh64');
  if (n < 0) xxh64Limbs(key, key.length); else xxh64Limbs(buf, n);
  return (BigInt(R[0] >>> 0) << 32n) | BigInt(R[1] >>> 0);
}

function checkBuckets(buckets, fn) {
  if (!Number.isInteger(buckets) || buckets < 1 || buckets > MAX_BUCKETS) {
    throw new RangeError(`${fn}: buckets must be an integer in 1..${MAX_BUCKETS}, not ${describe(buckets)}`);
  }
}

// (h * B) >> 64 for B <= 2^16: with h = hh*2^32 + hl, the top word is
// floor((hh*B + floor(hl*B / 2^32)) / 2^32); each product is below 2^48,
// so every step is exact in a double.
function reduce(hh, hl, B) {
  return Math.floor(((hh >>> 0) * B + Math.floor(((hl >>> 0) * B) / 4294967296)) / 4294967296);
}

function sha256Bucket(bytes, B) {
  const d = createHash('sha256').update(bytes).digest();
  // int.from_bytes(d, "little") % B: Horner from the most significant byte.
  let r = 0;
  for (let i = d.length - 1; i >= 0; i--) r = (r * 256 + d[i]) % B;
  return r;
}

/**
 * bucket(key, buckets, hash = 'xxh64') -> the key's bucket in [0, buckets).
 * key: a string (hashed as UTF-8) or a Uint8Array.
 */
export function bucket(key, buckets, hash = 'xxh64') {
  checkBuckets(buckets, 'bucket');
  if (hash === 'xxh64' || hash === '' || hash === undefined) {
    if (typeof key === 'string') xxh64Limbs(buf, utf8(key));
    else if (key instanceof Uint8Array) xxh64Limbs(key, key.length);
    else throw new TypeError(`bucket: key must be a string or a Uint8Array, not ${describe(key)}`);
    return reduce(R[0], R[1], buckets);
  }
  if (hash === 'synapse-sha256') {
    if (typeof key === 'string') return sha256Bucket(key, buckets); // Hash.update encodes strings as UTF-8
    if (key instanceof Uint8Array) return sha256Bucket(key, buckets);
    throw new TypeError(`bucket: key must be a string or a Uint8Array, not ${describe(key)}`);
  }
  throw new RangeError(`bucket: hash must be one of ${HASH_MODES.join(', ')}, not ${describe(hash)}`);
}

/** hasher(buckets, hash) returns key => bucket for a fixed keyspace (checks once). */
export function hasher(buckets, hash = 'xxh64') {
  checkBuckets(buckets, 'hasher');
  if (hash === 'xxh64' || hash === '') {
    return (key) => {
      if (typeof key === 'string') xxh64Limbs(buf, utf8(key));
      else if (key instanceof Uint8Array) xxh64Limbs(key, key.length);
      else throw new TypeError(`key must be a string or a Uint8Array, not ${describe(key)}`);
      return reduce(R[0], R[1], buckets);
    };
  }
  if (hash === 'synapse-sha256') return (key) => bucket(key, buckets, hash);
  throw new RangeError(`hasher: hash must be one of ${HASH_MODES.join(', ')}, not ${describe(hash)}`);
}
