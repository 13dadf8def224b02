#!/usr/bin/env node
// A chaos/sink worker with the CLI and behaviour of `keyshard chaos worker`:
// one Worker of this library that reports every grant and release to a
// fenced sink and writes to it for every bucket it holds, passing the
// grant's token, until the bucket is released.
//
//   node clients/node/tools/chaos-worker.mjs --server URL[,URL...] --sink URL --keyspace K --id ID
//        [--interval 20ms] [--release-delay 0s] [--block-release] [--drain-timeout 30s]
//        [--replace] [--log-level info]
//
// On SIGTERM or SIGINT it drains (bounded by --drain-timeout) and exits 0,
// or 2 if the drain timed out. Logs go to stderr.
import { Client, Worker, DeadlineExceeded } from '../index.js';
import { Transport } from '../src/transport.js';

// The machine's monotonic clock (CLOCK_MONOTONIC) in ns: the clock of every
// worker's records, whatever its language.
const mono = () => Number(process.hrtime.bigint());

const UNITS = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, ms: 1, s: 1000, m: 60000, h: 3600000 };
/** parseDuration("1m30s") -> ms, Go syntax. */
function parseDuration(flag, s) {
  if (s === '0') return 0;
  const re = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)/y;
  let ms = 0, i = 0;
  if (s === '') fail(`--${flag}: empty duration`);
  while (i < s.length) {
    re.lastIndex = i;
    const m = re.exec(s);
    if (!m) fail(`--${flag} ${JSON.stringify(s)}: not a duration (want Go syntax such as 20ms, 1.5s, 2m)`);
    ms += Number(m[1]) * UNITS[m[2]];
    i = re.lastIndex;
  }
  return ms;
}

function fail(msg) {
  process.stderr.write(`chaos worker: ${msg}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const cfg = { server: '', sink: '', keyspace: 'chaos', id: '', interval: 20, releaseDelay: 0, blockRelease: false, drainTimeout: 30000, replace: false, logLevel: 'info' };
  const bools = new Set(['replace', 'block-release']);
  const known = new Set(['server', 'sink', 'keyspace', 'id', 'interval', 'release-delay', 'drain-timeout', 'log-level', ...bools]);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const m = /^--?([a-z-]+)(?:=(.*))?$/.exec(a);
    if (!m || !known.has(m[1])) fail(`unknown argument ${JSON.stringify(a)}`);
    const name = m[1];
    let v = m[2];
    if (bools.has(name)) {
      if (v !== undefined && !['true', 'false'].includes(v)) fail(`--${name}=${v}: want true or false`);
      v = v === undefined ? true : v === 'true';
    } else if (v === undefined) {
      if (i + 1 >= argv.length) fail(`--${name} needs a value`);
      v = argv[++i];
    }
    switch (name) {
      case 'server': cfg.server = v; break;
      case 'sink': cfg.sink = v.replace(/\/+$/, ''); break;
      case 'keyspace': cfg.keyspace = v; break;
      case 'id': cfg.id = v; break;
      case 'interval': cfg.interval = parseDuration(name, v); break;
      case 'release-delay': cfg.releaseDelay = parseDuration(name, v); break;
      case 'drain-timeout': cfg.drainTimeout = parseDuration(name, v); break;
      case 'replace': cfg.replace = v; break;
      case 'block-release': cfg.blockRelease = v; break;
      case 'log-level':
        if (!['debug', 'info', 'warn', 'error'].includes(v)) fail(`--log-level ${JSON.stringify(v)}: want debug, info, warn or error`);
        cfg.logLevel = v;
        break;
    }
  }
  if (!cfg.server || !cfg.sink || !cfg.id || !cfg.keyspace || !(cfg.interval > 0)) {
    fail('--server, --sink, --keyspace and --id are required and --interval must be positive');
  }
  if (cfg.drainTimeout <= 0) cfg.drainTimeout = 30000;
  return cfg;
}

const cfg = parseArgs(process.argv.slice(2));
const LEVELS = { debug: 0, info: 1, warn: 2, error: 3 };
function logAt(level) {
  return (msg, attrs = {}) => {
    if (LEVELS[level] < LEVELS[cfg.logLevel]) return;
    const kv = Object.entries({ worker: cfg.id, ...attrs }).map(([k, v]) => `${k}=${JSON.stringify(String(v))}`).join(' ');
    process.stderr.write(`time=${new Date().toISOString()} level=${level.toUpperCase()} msg=${JSON.stringify(msg)} ${kv}\n`);
  };
}
const log = { debug: logAt('debug'), info: logAt('info'), warn: logAt('warn'), error: logAt('error') };

// --- the sink reporter ------------------------------------------------------

// Grants whose release() returned, carried on the next post (bench clients
// times a handoff's library part from there).
const releasedQueue = [];

// The sink's connections (node:http: see src/transport.js for why not fetch),
// at most 4: a handoff's tens of reports at once then queue on warm
// connections instead of opening new ones (bench clients: p99 at the sink
// 30-47 -> 29-32 ms).
const sinkTransport = new Transport({ maxSockets: 4 });

/** post(path, record) -> the sink's status (0 if unreachable). */
async function post(path, rec) {
  const body = { kind: rec.kind, worker: cfg.id, pid: process.pid, bucket: rec.bucket ?? 0, token: String(rec.token ?? 0n) };
  if (rec.session) body.session = rec.session;
  if (rec.n) body.n = rec.n;
  if (rec.fenced) body.fenced = true;
  if (rec.err) body.err = rec.err;
  if (releasedQueue.length) body.released = releasedQueue.splice(0);
  body.mono = rec.mono ?? mono();
  try {
    const res = await sinkTransport.post(cfg.sink, path.replace(/^\//, ''), JSON.stringify(body), { 'Content-Type': 'application/json' }, AbortSignal.timeout(5000));
    return res.status;
  } catch (e) {
    log.warn('report to the sink failed', { kind: rec.kind, err: e.code ?? e.message });
    return 0;
  }
}

// Lifecycle events go through a queue, in order, never blocking the library.
const queue = [];
let draining = null;
function enqueue(rec) {
  if (queue.length >= 1024) {
    log.warn('event queue full; dropping', { kind: rec.kind });
    return;
  }
  queue.push(rec);
  if (!draining) {
    draining = (async () => {
      while (queue.length) await post('/event', queue.shift());
      draining = null;
    })();
  }
}
async function flush() {
  while (draining) await draining;
}

// --- the handler --------------------------------------------------------------

const buckets = new Map(); // bucket -> {g, stop, done}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function startWriter(bw) {
  bw.done = (async () => {
    for (let n = 1; ; n++) {
      await new Promise((resolve) => {
        const t = setTimeout(resolve, cfg.interval);
        bw.wake = () => { clearTimeout(t); resolve(); };
      });
      if (bw.stopped || bw.g.signal.aborted) return;
      if (!bw.g.valid()) return; // checked right before each write
      // a write in flight is always finished, so that once done resolves the sink has answered every write
      const code = await post('/write', { kind: 'write', bucket: bw.g.bucket, token: bw.g.token, n });
      if (code === 409) {
        log.warn('write refused: a newer owner exists; stopping work on the bucket', { bucket: bw.g.bucket, token: bw.g.token });
        return;
      }
    }
  })();
}

const handler = {
  async acquire(g) {
    const code = await post('/event', { kind: 'acquire', bucket: g.bucket, token: g.token });
    if (code === 409) log.error('the sink refused the claim of a new grant: it has seen a higher token', { bucket: g.bucket, token: g.token });
    const bw = { g, stopped: false, wake: () => {}, done: null };
    buckets.set(g.bucket, bw);
    g.signal.addEventListener('abort', () => bw.wake(), { once: true });
    startWriter(bw);
  },
  async release(bucket) {
    const bw = buckets.get(bucket);
    buckets.delete(bucket);
    if (!bw) {
      await post('/event', { kind: 'release', bucket, err: 'Release without a preceding Acquire' });
      return;
    }
    const fenced = !bw.g.valid();
    await post('/event', { kind: 'releasing', bucket, token: bw.g.token, fenced });
    if (!fenced && cfg.blockRelease) {
      log.warn('release is stuck until the grant ends', { bucket, token: bw.g.token });
      await new Promise((r) => (bw.g.signal.aborted ? r() : bw.g.signal.addEventListener('abort', r, { once: true })));
    }
    if (!fenced && cfg.releaseDelay > 0 && !bw.g.signal.aborted) {
      await Promise.race([sleep(cfg.releaseDelay), new Promise((r) => bw.g.signal.addEventListener('abort', r, { once: true }))]);
    }
    bw.stopped = true;
    bw.wake();
    await bw.done;
    await post('/event', { kind: 'release', bucket, token: bw.g.token, fenced: fenced || !bw.g.valid() });
  },
};

// --- main -------------------------------------------------------------------

let client, worker;
try {
  client = new Client(cfg.server);
  worker = new Worker(client, cfg.keyspace, { id: cfg.id, address: `pid-${process.pid}`, replace: cfg.replace, logger: log }, handler);
} catch (e) {
  fail(e.message);
}
for (const kind of ['joined', 'fenced', 'session-lost', 'rejoined', 'left']) {
  worker.on(kind, (ev) => {
    const rec = { kind, session: ev.session, mono: mono() };
    if (ev.error) rec.err = ev.error.message;
    enqueue(rec);
  });
}
worker.on('released', (g) => releasedQueue.push({ bucket: g.bucket, token: String(g.token), mono: mono() }));
worker.on('error', (e) => log.error('worker error', { err: e.message }));

let stopping = false;
async function stop(signal) {
  if (stopping) return;
  stopping = true;
  log.info('stopping: draining', { signal });
  await post('/event', { kind: 'draining' });
  let code = 0;
  try {
    await worker.close({ timeout: cfg.drainTimeout / 1000 });
    log.info('drained; exiting');
  } catch (e) {
    if (e instanceof DeadlineExceeded) {
      log.error('drain did not finish', { err: e.message });
      code = 2;
    } else {
      log.error('close failed', { err: e.message });
      code = 1;
    }
  }
  await flush();
  await client.close();
  process.exit(code);
}
process.on('SIGTERM', () => stop('SIGTERM'));
process.on('SIGINT', () => stop('SIGINT'));

worker.start().catch(() => {}); // failures surface through done
worker.done.then(
  () => {},
  async (e) => {
    if (stopping) return;
    log.error(`chaos worker: the worker stopped by itself: ${e.message}`);
    await flush();
    process.exit(1);
  },
);
