#!/usr/bin/env node
// A PostHog-style ingestion producer over Keyshard's cluster-wide hot keys.
//
// Events are keyed by `token:distinct_id`. Each goes to its key's
// partition (bucket of the key over --partitions), unless the key is in
// the pool's cluster-wide overflow set: then it goes to one overflow
// partition chosen by hashing the key (--overflow-partitions), keeping the
// key, so one consumer still sees all of a hot key's events in order.
// A local Detector measures this producer's heavy hitters and HotKeys
// reports them to the pool and follows the overflow set; if the control
// plane is unreachable the last set is kept (fail open) and nothing waits.
//
// Partitions are JSONL files in --out. Every event is counted: produced =
// main + overflow, checked every second (no silent drops). A summary line
// (JSON) goes to stdout every second, and a final one at exit.
import fs from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import { Client, HotKeys, Detector, bucket } from '../../clients/node/index.js';

function parseArgs(argv) {
  const cfg = {
    server: 'http://127.0.0.1:7400', token: process.env.KEYSHARD_TOKEN, pool: 'ingest', threshold: 1000,
    partitions: 8, overflowPartitions: 2, out: './ingest-out', rate: 2000, duration: 0,
    hotKey: 'phc_demo:user-hot', hotShare: 0.3, producer: `ingest-${os.hostname()}-${process.pid}`, reportInterval: 1,
  };
  const num = (k, v) => {
    const n = Number(v);
    if (!Number.isFinite(n) || n < 0) usage(`--${k} ${JSON.stringify(v)}: want a number >= 0`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(argv[i]);
    if (!m) usage(`unknown argument ${JSON.stringify(argv[i])}`);
    const v = m[2] ?? argv[++i];
    if (v === undefined) usage(`--${m[1]} needs a value`);
    switch (m[1]) {
      case 'server': cfg.server = v; break;
      case 'pool': cfg.pool = v; break;
      case 'threshold': cfg.threshold = num(m[1], v); break;
      case 'partitions': cfg.partitions = num(m[1], v); break;
      case 'overflow-partitions': cfg.overflowPartitions = num(m[1], v); break;
      case 'out': cfg.out = v; break;
      case 'rate': cfg.rate = num(m[1], v); break;
      case 'duration': cfg.duration = num(m[1], v); break;
      case 'hot-key': cfg.hotKey = v; break;
      case 'hot-share': cfg.hotShare = num(m[1], v); break;
      case 'producer': cfg.producer = v; break;
      case 'report-interval': cfg.reportInterval = num(m[1], v); break;
      default: usage(`unknown flag --${m[1]}`);
    }
  }
  for (const k of ['partitions', 'overflowPartitions']) {
    if (!Number.isInteger(cfg[k]) || cfg[k] < 1 || cfg[k] > 65536) usage(`--${k.replace(/[A-Z]/g, (c) => '-' + c.toLowerCase())} must be an integer in 1..65536`);
  }
  if (!(cfg.hotShare <= 1)) usage('--hot-share must be in 0..1');
  return cfg;
}

function usage(msg) {
  process.stderr.write(`ingest: ${msg}\nusage: node examples/node-ingest/ingest.mjs [--server URL] [--pool NAME] [--threshold MSG_PER_S] [--partitions N] [--overflow-partitions M] [--out DIR] [--rate EVENTS_PER_S] [--duration S] [--hot-key TOKEN:DISTINCT_ID] [--hot-share 0..1] [--producer ID]\n`);
  process.exit(1);
}

const cfg = parseArgs(process.argv.slice(2));
const client = new Client(cfg.server, { token: cfg.token, timeout: 5 });

// The pool: create it if missing (an admin call; with tokens, use an admin token).
try {
  const pools = await client.listHotKeyPools();
  if (!pools.some((p) => p.name === cfg.pool)) {
    const p = await client.putHotKeyPool({ name: cfg.pool, threshold: cfg.threshold, cooldown: 30 });
    process.stderr.write(`ingest: created hot-key pool ${p.name} (threshold ${p.threshold} msg/s, report threshold ${p.reportThreshold})\n`);
  }
} catch (e) {
  process.stderr.write(`ingest: cannot read or create the hot-key pool ${cfg.pool} at ${cfg.server}: ${e.message}\n`);
  process.exit(1);
}

fs.mkdirSync(cfg.out, { recursive: true });
const streams = new Map();
function sink(name) {
  let s = streams.get(name);
  if (!s) {
    s = fs.createWriteStream(path.join(cfg.out, `${name}.jsonl`), { flags: 'a' });
    streams.set(name, s);
  }
  return s;
}

const detector = new Detector({ capacity: 1024, halfLife: 2 });
const hot = new HotKeys(client, { pool: cfg.pool, producer: cfg.producer, report: detector, interval: cfg.reportInterval });
let lastErr = '';
hot.on('error', (e) => { lastErr = e.message; });
hot.on('change', (e) => process.stderr.write(`ingest: overflow set v${e.version}: ${[...e.keys].join(', ') || '(empty)'}\n`));
hot.start().catch(() => {}); // routing does not wait for it: until the first answer, nothing is hot

const totals = { produced: 0, main: 0, overflow: 0 };
let second = { produced: 0, main: 0, overflow: 0 };
const tokens = ['phc_demo', 'phc_shop', 'phc_blog'];
let seq = 0;

function route(ev) {
  const key = `${ev.token}:${ev.distinct_id}`;
  detector.observe(key);
  let dest;
  if (hot.isHot(key)) {
    dest = `overflow-${bucket(key, cfg.overflowPartitions)}`;
    totals.overflow++;
    second.overflow++;
  } else {
    dest = `partition-${bucket(key, cfg.partitions)}`;
    totals.main++;
    second.main++;
  }
  sink(dest).write(JSON.stringify({ key, ...ev }) + '\n');
}

function produce(n) {
  for (let i = 0; i < n; i++) {
    seq++;
    let token, id;
    if (Math.random() < cfg.hotShare) {
      const c = cfg.hotKey.indexOf(':');
      token = cfg.hotKey.slice(0, c);
      id = cfg.hotKey.slice(c + 1);
    } else {
      token = tokens[seq % tokens.length];
      id = `user-${Math.floor(Math.random() * 10000)}`;
    }
    const ev = { token, distinct_id: id, event: '$pageview', n: seq, ts: Date.now() };
    totals.produced++;
    second.produced++;
    route(ev);
  }
}

const tick = 10; // ms
let carry = 0;
const gen = setInterval(() => {
  carry += (cfg.rate * tick) / 1000;
  const n = Math.floor(carry);
  carry -= n;
  produce(n);
}, tick);

const started = Date.now();
function summary(final = false) {
  if (totals.produced !== totals.main + totals.overflow) {
    process.stderr.write(`ingest: BUG: produced ${totals.produced} != main ${totals.main} + overflow ${totals.overflow}\n`);
    process.exitCode = 3;
  }
  const line = {
    t: Math.round((Date.now() - started) / 100) / 10,
    ...(final ? { final: true, ...totals } : { ...second, total: totals.produced }),
    overflowSet: [...hot.set],
    version: String(hot.version),
    reports: hot.stats.reports,
    ...(hot.stale ? { stale: hot.stale.error.message } : {}),
    ...(lastErr && !final ? { lastError: lastErr } : {}),
  };
  process.stdout.write(JSON.stringify(line) + '\n');
  second = { produced: 0, main: 0, overflow: 0 };
}
const sum = setInterval(summary, 1000);

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  clearInterval(gen);
  clearInterval(sum);
  await hot.close();
  await Promise.all([...streams.values()].map((s) => new Promise((r) => s.end(r))));
  summary(true);
  await client.close();
}
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
if (cfg.duration > 0) setTimeout(stop, cfg.duration * 1000);
