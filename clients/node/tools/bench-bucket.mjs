#!/usr/bin/env node
// Measures bucket() (32-bit limbs) against a straightforward BigInt xxh64,
// for 16-byte and 40-byte ASCII keys: ns/key and keys/s, median of 5 runs
// (wall clock, and the process's CPU time, which a busy machine inflates less).
// Prints JSON. Usage: node tools/bench-bucket.mjs [keysPerRun]
import { bucket } from '../src/hash.js';

const M = (1n << 64n) - 1n;
const P1 = 0x9E3779B185EBCA87n, P2 = 0xC2B2AE3D27D4EB4Fn, P3 = 0x165667B19E3779F9n;
const P4 = 0x85EBCA77C2B2AE63n, P5 = 0x27D4EB2F165667C5n;
const rotl = (x, r) => ((x << r) | (x >> (64n - r))) & M;
const round = (acc, lane) => (rotl((acc + lane * P2) & M, 31n) * P1) & M;
const merge = (acc, v) => (((acc ^ round(0n, v)) * P1) + P4) & M;
const enc = new TextEncoder();
function u64(b, i) { let x = 0n; for (let k = 7; k >= 0; k--) x = (x << 8n) | BigInt(b[i + k]); return x; }
function u32(b, i) { return BigInt((b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24)) >>> 0); }
function xxh64Big(data) {
  const n = data.length; let i = 0; let h;
  if (n >= 32) {
    let v1 = (P1 + P2) & M, v2 = P2, v3 = 0n, v4 = (-P1) & M;
    for (; i + 32 <= n; i += 32) { v1 = round(v1, u64(data, i)); v2 = round(v2, u64(data, i + 8)); v3 = round(v3, u64(data, i + 16)); v4 = round(v4, u64(data, i + 24)); }
    h = (rotl(v1, 1n) + rotl(v2, 7n) + rotl(v3, 12n) + rotl(v4, 18n)) & M;
    h = merge(merge(merge(merge(h, v1), v2), v3), v4);
  } else h = P5;
  h = (h + BigInt(n)) & M;
  for (; i + 8 <= n; i += 8) { h ^= round(0n, u64(data, i)); h = (rotl(h, 27n) * P1 + P4) & M; }
  if (i + 4 <= n) { h ^= (u32(data, i) * P1) & M; h = (rotl(h, 23n) * P2 + P3) & M; i += 4; }
  for (; i < n; i++) { h ^= (BigInt(data[i]) * P5) & M; h = (rotl(h, 11n) * P1) & M; }
  h ^= h >> 33n; h = (h * P2) & M; h ^= h >> 29n; h = (h * P3) & M; h ^= h >> 32n;
  return h;
}
const bucketBig = (key, B) => Number((xxh64Big(enc.encode(key)) * BigInt(B)) >> 64n);

function keys(len, count) {
  const out = [];
  for (let i = 0; i < count; i++) {
    const s = `token:${i.toString(36)}:`;
    out.push((s + 'x'.repeat(len)).slice(0, len - 6) + String(i % 1000000).padStart(6, '0'));
  }
  return out;
}

function measure(fn, ks, B, runs = 5) {
  let sink = 0;
  for (let i = 0; i < Math.min(ks.length, 20000); i++) sink += fn(ks[i], B); // warm up
  const wall = [], cpu = [];
  for (let r = 0; r < runs; r++) {
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < ks.length; i++) sink += fn(ks[i], B);
    wall.push(Number(process.hrtime.bigint() - t0) / ks.length);
    const c = process.cpuUsage(c0);
    cpu.push(((c.user + c.system) * 1000) / ks.length);
  }
  if (sink === -1) console.log(sink);
  const med = (a) => a.sort((x, y) => x - y)[Math.floor(runs / 2)];
  const ns = med(wall), cns = med(cpu);
  // cpu: the process's CPU time per key (what the code costs on a shared,
  // busy machine); wall: elapsed time per key.
  return {
    nsPerKey: Math.round(ns * 10) / 10, keysPerSec: Math.round(1e9 / ns),
    cpuNsPerKey: Math.round(cns * 10) / 10, cpuKeysPerSec: Math.round(1e9 / cns),
  };
}

const n = Number(process.argv[2] ?? 1000000);
const out = { node: process.version, keysPerRun: n, buckets: 4096, results: {} };
for (const len of [16, 40]) {
  const ks = keys(len, n);
  for (const k of ks.slice(0, 1000)) if (bucket(k, 4096) !== bucketBig(k, 4096)) throw new Error(`mismatch on ${k}`);
  const limbs = measure(bucket, ks, 4096);
  const big = measure(bucketBig, ks.slice(0, Math.max(1, n / 10)), 4096);
  out.results[`${len}B`] = { limbs, bigint: big, speedup: Math.round((big.nsPerKey / limbs.nsPerKey) * 10) / 10 };
}
console.log(JSON.stringify(out, null, 2));
