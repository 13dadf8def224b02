// Hot keys: a bounded local Detector (Space-Saving over exponentially
// decayed counts) and HotKeys, which reports a producer's heavy hitters to
// its pool and follows the pool's cluster-wide overflow set.
import { EventEmitter } from 'node:events';
import { Client } from './client.js';
import { Closed, NotFound, Unauthenticated, PermissionDenied, InvalidArgument } from './errors.js';
import { checkName, checkNumber, checkObject, describe } from './convert.js';
import { deferred, emitError, monotonic, sleep } from './timing.js';
import { follow } from './follow.js';

export const MAX_REPORT_KEYS = 1024;
export const MAX_REPORT_KEY_BYTES = 512;

/**
 * Detector finds a producer's heaviest keys in bounded memory: at most
 * `capacity` keys are tracked whatever the number of distinct keys
 * (Space-Saving: a new key takes the least counted slot and inherits its
 * count as its error). Counts decay exponentially with `halfLife`
 * seconds, so rate = decayed count × ln2 / halfLife (messages/s).
 * observe() is O(log capacity) and allocates nothing for tracked keys.
 */
export class Detector {
  constructor({ capacity = 1024, halfLife = 2, clock = monotonic } = {}) {
    checkNumber('Detector', 'capacity', capacity, { min: 1, max: 1 << 20, integer: true });
    checkNumber('Detector', 'halfLife', halfLife, { above: 0 });
    this.capacity = capacity;
    this.halfLife = halfLife;
    this.clock = clock;
    this._lambda = Math.LN2 / (halfLife * 1000); // per ms
    this._t0 = clock.now();
    this._keys = new Array(capacity);
    this._cnt = new Float64Array(capacity); // scaled by exp(λ (t - t0))
    this._err = new Float64Array(capacity);
    this._idx = new Map();
    this._size = 0;
  }

  get size() { return this._size; }

  _weight(now) {
    let x = this._lambda * (now - this._t0);
    if (x > 50) {
      // renormalize: every count scales alike, so the heap order holds
      const f = Math.exp(-x);
      for (let i = 0; i < this._size; i++) { this._cnt[i] *= f; this._err[i] *= f; }
      this._t0 = now;
      x = 0;
    }
    return Math.exp(x);
  }

  /** observe(key, n = 1): count n messages of key now. */
  observe(key, n = 1, now = this.clock.now()) {
    const w = n * this._weight(now);
    const i = this._idx.get(key);
    if (i !== undefined) {
      this._cnt[i] += w;
      this._down(i);
      return;
    }
    if (this._size < this.capacity) {
      const j = this._size++;
      this._keys[j] = key;
      this._cnt[j] = w;
      this._err[j] = 0;
      this._idx.set(key, j);
      this._up(j);
      return;
    }
    // replace the least counted key
    this._idx.delete(this._keys[0]);
    this._keys[0] = key;
    this._err[0] = this._cnt[0];
    this._cnt[0] += w;
    this._idx.set(key, 0);
    this._down(0);
  }

  _swap(a, b) {
    const k = this._keys[a]; this._keys[a] = this._keys[b]; this._keys[b] = k;
    const c = this._cnt[a]; this._cnt[a] = this._cnt[b]; this._cnt[b] = c;
    const e = this._err[a]; this._err[a] = this._err[b]; this._err[b] = e;
    this._idx.set(this._keys[a], a);
    this._idx.set(this._keys[b], b);
  }
  _up(i) {
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (this._cnt[p] <= this._cnt[i]) break;
      this._swap(i, p);
      i = p;
    }
  }
  _down(i) {
    const n = this._size;
    for (;;) {
      const l = 2 * i + 1, r = l + 1;
      let m = i;
      if (l < n && this._cnt[l] < this._cnt[m]) m = l;
      if (r < n && this._cnt[r] < this._cnt[m]) m = r;
      if (m === i) return;
      this._swap(i, m);
      i = m;
    }
  }

  _scale(now) { return this._lambda * 1000 * Math.exp(-this._lambda * (now - this._t0)); }

  /** rate(key) -> the key's upper-bound rate now (0 if untracked). */
  rate(key, now = this.clock.now()) {
    const i = this._idx.get(key);
    return i === undefined ? 0 : this._cnt[i] * this._scale(now);
  }

  /**
   * top(minRate) -> [{key, rate, lower}], highest first: every tracked key
   * whose upper-bound rate is at least minRate and whose guaranteed rate
   * (lower) is at least half of it (a key seen once is never reported).
   */
  top(minRate = 0, limit = MAX_REPORT_KEYS, now = this.clock.now()) {
    const s = this._scale(now);
    const out = [];
    for (let i = 0; i < this._size; i++) {
      const rate = this._cnt[i] * s;
      const lower = (this._cnt[i] - this._err[i]) * s;
      if (rate >= minRate && lower >= minRate / 2 && lower > 0) out.push({ key: this._keys[i], rate, lower });
    }
    out.sort((a, b) => b.rate - a.rate);
    return out.length > limit ? out.slice(0, limit) : out;
  }
}

const enc = new TextEncoder();

/**
 * HotKeys(client, {pool, producer, report, interval, onSet, wait}): every
 * `interval` seconds (default 1) reports the producer's keys at or above the
 * pool's report_threshold (learned from the answers) and follows the
 * pool's overflow set. report: a Detector, or a function (minRate) ->
 * [{key, rate}]. It fails open: while the control plane is unreachable it
 * keeps the last set and retries. Events: 'change' ({version, keys}),
 * 'stale' (error), 'recovered', 'error'.
 */
export class HotKeys extends EventEmitter {
  constructor(client, options) {
    super();
    const fn = 'HotKeys';
    if (!(client instanceof Client)) throw new TypeError(`${fn}: client must be a Client, not ${describe(client)}`);
    checkObject(fn, 'options', options);
    const { pool, producer, report, interval = 1, onSet, wait = 30 } = options;
    checkName(fn, 'options.pool', pool);
    checkName(fn, 'options.producer', producer);
    if (report instanceof Detector) this._report = (minRate) => report.top(minRate);
    else if (typeof report === 'function') this._report = report;
    else throw new TypeError(`${fn}: options.report must be a Detector or a function (minRate) => [{key, rate}], not ${describe(report)}`);
    checkNumber(fn, 'options.interval', interval, { above: 0 });
    checkNumber(fn, 'options.wait', wait, { above: 0, max: 60 });
    if (onSet !== undefined && typeof onSet !== 'function') throw new TypeError(`${fn}: options.onSet must be a function, not ${describe(onSet)}`);
    this.client = client;
    this.pool = pool;
    this.producer = producer;
    this.interval = interval;
    this.wait = wait;
    this.onSet = onSet;
    this._set = new Set();
    this._keys = [];
    this.version = 0n;
    this.reportThreshold = 0;
    this.stale = null;
    this.stats = { reports: 0, reportFailures: 0, keysReported: 0, lastError: null };
    this._ac = new AbortController();
    this._first = deferred();
    this._first.promise.catch(() => {});
    this._loops = null;
  }

  /** start() begins reporting and following; resolves with the first overflow set answer. */
  start() {
    if (!this._loops) this._loops = Promise.all([this._reportLoop(), this._follow()]);
    return this._first.promise;
  }

  /** isHot(key): the key is in the pool's overflow set (as last known). */
  isHot(key) { return this._set.has(key); }

  /** The overflow set's keys (a read-only Set). */
  get set() { return this._set; }

  /** The set's keys with their rates and since, as last received. */
  get keys() { return this._keys; }

  async _reportLoop() {
    const signal = this._ac.signal;
    while (!signal.aborted) {
      const started = Date.now();
      await this.reportNow().catch(() => {});
      if (!(await sleep(Math.max(0, this.interval * 1000 - (Date.now() - started)), signal))) return;
    }
  }

  /** reportNow() sends one report (what the report function gives at the known threshold). */
  async reportNow() {
    let keys;
    try {
      keys = this._report(this.reportThreshold) ?? [];
    } catch (e) {
      emitError(this, e);
      keys = [];
    }
    const out = [];
    for (const k of keys) {
      if (typeof k?.key !== 'string' || k.key === '' || !(k.rate >= 0) || !Number.isFinite(k.rate)) continue;
      if (k.key.length > MAX_REPORT_KEY_BYTES || enc.encode(k.key).length > MAX_REPORT_KEY_BYTES) continue;
      if (k.rate < this.reportThreshold) continue;
      out.push({ key: k.key, rate: k.rate });
    }
    out.sort((a, b) => b.rate - a.rate);
    if (out.length > MAX_REPORT_KEYS) out.length = MAX_REPORT_KEYS;
    try {
      const r = await this.client.reportHotKeys(this.pool, this.producer, out, { signal: this._ac.signal, timeout: Math.max(this.interval, 10) });
      this.stats.reports++;
      this.stats.keysReported += out.length;
      if (r.pool.reportThreshold > 0 && Number.isFinite(r.pool.reportThreshold)) this.reportThreshold = r.pool.reportThreshold;
    } catch (e) {
      if (this._ac.signal.aborted) return;
      this.stats.reportFailures++;
      this.stats.lastError = e;
      emitError(this, e);
      throw e;
    }
  }

  _follow() {
    return follow(this, this._ac.signal, {
      poll: (first) => this.client.getOverflowSet(this.pool, { sinceVersion: this.version, wait: first ? undefined : this.wait, signal: this._ac.signal }),
      apply: (r) => {
        this._apply(r.set);
        this._first.resolve(r.set);
      },
      firstError: (e) => {
        if (e instanceof Unauthenticated || e instanceof PermissionDenied || e instanceof InvalidArgument) this._first.reject(e);
        return false;
      },
    });
  }

  _apply(set) {
    if (set.version <= this.version && this.version !== 0n) return;
    if (set.version === this.version) return;
    this.version = set.version;
    this._keys = set.keys;
    this._set = new Set(set.keys.map((k) => k.key));
    const ev = { version: set.version, keys: this._set };
    this.emit('change', ev);
    if (this.onSet) {
      try { this.onSet(this._set, set.version); } catch (e) { emitError(this, e); }
    }
  }

  /** close() stops reporting and following (the last set stays readable). */
  async close() {
    this._ac.abort(new Closed('keyshard: HotKeys closed'));
    this._first.reject(new Closed('keyshard: HotKeys closed'));
    if (this._loops) await this._loops;
  }
}
void NotFound;
