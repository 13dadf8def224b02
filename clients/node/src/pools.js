// Tenant pools: PoolFollower (where to read a tenant) and LoadReporter
// (requests per tenant, reported with a sequence number).
import { EventEmitter } from 'node:events';
import { Client } from './client.js';
import { Closed, InvalidArgument, Unauthenticated, PermissionDenied, NotFound } from './errors.js';
import { checkName, checkNumber, checkString, describe } from './convert.js';
import { deferred, emitError } from './timing.js';
import { follow } from './follow.js';

function spanTargets(a, now) {
  const spans = a.targets ?? [];
  let cur = null;
  for (const s of spans) {
    const from = s.from ? Date.parse(s.from) : -Infinity;
    if (from <= now) cur = s;
  }
  if (cur) return cur.members ?? [];
  if (spans.length === 0) return (a.members ?? []).map((m) => m.member);
  return [];
}

/**
 * PoolFollower(client, pool) follows a tenant pool's snapshot
 * (GetPoolSnapshot long poll). targets(tenant) answers from it; a tenant
 * the snapshot does not know is asked of GetTenants once per snapshot
 * version (cached). It keeps the last snapshot while the control plane is
 * unreachable (stale). Events: 'change' (version), 'stale', 'recovered', 'error'.
 */
export class PoolFollower extends EventEmitter {
  constructor(client, pool, { wait = 30 } = {}) {
    super();
    if (!(client instanceof Client)) throw new TypeError(`PoolFollower: client must be a Client, not ${describe(client)}`);
    checkName('PoolFollower', 'pool', pool);
    checkNumber('PoolFollower', 'wait', wait, { above: 0, max: 60 });
    this.client = client;
    this.pool = pool;
    this.wait = wait;
    this.version = 0n;
    this.snapshot = null;
    this.stale = null;
    this._tenants = new Map();
    this._unknown = new Map(); // tenant -> {version, assignment} from GetTenants
    this._ac = new AbortController();
    this._first = deferred();
    this._first.promise.catch(() => {});
    this._loop = null;
  }

  start() {
    if (!this._loop) this._loop = this._follow();
    return this._first.promise;
  }

  /** members of the snapshot (id, address, zone, weight). */
  get members() { return this.snapshot ? this.snapshot.members : []; }

  /** known(tenant): the snapshot lists the tenant. */
  known(tenant) { return this._tenants.has(tenant); }

  /** targetsSync(tenant) -> read targets now, or null for a tenant not in the snapshot and not cached. */
  targetsSync(tenant, now = Date.now()) {
    const a = this._tenants.get(tenant) ?? this._cached(tenant);
    return a ? spanTargets(a, now) : null;
  }

  /** targets(tenant) -> the member ids to read the tenant from now (sorted). */
  async targets(tenant, now = Date.now()) {
    checkString('targets', 'tenant', tenant, { nonEmpty: true });
    const a = this._tenants.get(tenant) ?? this._cached(tenant) ?? (await this._ask(tenant));
    return spanTargets(a, now);
  }

  /** serves(member, tenant): the member is in the tenant's subset (prefetches it). */
  async serves(member, tenant) {
    checkString('serves', 'member', member, { nonEmpty: true });
    checkString('serves', 'tenant', tenant, { nonEmpty: true });
    const a = this._tenants.get(tenant) ?? this._cached(tenant) ?? (await this._ask(tenant));
    return (a.members ?? []).some((m) => m.member === member);
  }

  _cached(tenant) {
    const c = this._unknown.get(tenant);
    return c && c.version === this.version ? c.assignment : null;
  }

  async _ask(tenant) {
    const r = await this.client.getTenants(this.pool, [tenant], { signal: this._ac.signal });
    const t = r.tenants.find((x) => x.assignment.tenant === tenant) ?? r.tenants[0];
    const a = t ? t.assignment : { tenant, members: [], targets: [] };
    if (this._unknown.size > 10000) this._unknown.clear();
    this._unknown.set(tenant, { version: this.version, assignment: a });
    return a;
  }

  _follow() {
    return follow(this, this._ac.signal, {
      poll: (first) => this.client.getPoolSnapshot(this.pool, { sinceVersion: this.version, wait: first ? undefined : this.wait, signal: this._ac.signal }),
      apply: (r) => {
        const s = r.snapshot;
        if (this.snapshot === null || s.version > this.version) {
          this.snapshot = s;
          this.version = s.version;
          this._tenants = new Map(s.tenants.map((a) => [a.tenant, a]));
          this.emit('change', s.version);
        }
        this._first.resolve(s);
      },
      firstError: (e) => {
        if (e instanceof NotFound || e instanceof Unauthenticated || e instanceof PermissionDenied || e instanceof InvalidArgument) this._first.reject(e);
        return false;
      },
    });
  }

  async close() {
    this._ac.abort(new Closed('keyshard: PoolFollower closed'));
    this._first.reject(new Closed('keyshard: PoolFollower closed'));
    if (this._loop) await this._loop;
  }
}

/**
 * LoadReporter(client, pool, reporter, {interval}) counts requests per
 * tenant (add) and reports them every interval seconds (default 5). A
 * failed report is retried with the same seq and counts (a lost answer is
 * a replay, never counted twice); counts added meanwhile go into the next.
 * Refused reports are dropped, never silently: stats.dropped and a
 * 'dropped' event.
 */
export class LoadReporter extends EventEmitter {
  constructor(client, pool, reporter, { interval = 5 } = {}) {
    super();
    if (!(client instanceof Client)) throw new TypeError(`LoadReporter: client must be a Client, not ${describe(client)}`);
    checkName('LoadReporter', 'pool', pool);
    checkName('LoadReporter', 'reporter', reporter);
    checkNumber('LoadReporter', 'interval', interval, { above: 0 });
    this.client = client;
    this.pool = pool;
    this.reporter = reporter;
    this.interval = interval;
    this._counts = new Map();
    this._pending = null; // {seq, counts} sent but not answered
    this._seq = 0n;
    this._taken = performance.now(); // when counts were last taken into a report
    this.stats = { reports: 0, failures: 0, dropped: 0 };
    this._timer = setInterval(() => { this.flush().catch(() => {}); }, interval * 1000);
    this._timer.unref?.();
    this._busy = null;
  }

  add(tenant, n = 1) {
    if (typeof tenant !== 'string' || tenant === '') throw new TypeError(`LoadReporter.add: tenant must be a non-empty string, not ${describe(tenant)}`);
    if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`LoadReporter.add: n must be a safe integer >= 0, not ${n}`);
    this._counts.set(tenant, (this._counts.get(tenant) ?? 0) + n);
  }

  /** flush() sends what is counted (and any report not answered yet) now. */
  async flush() {
    while (this._busy) await this._busy;
    this._busy = this._flush();
    try { await this._busy; } finally { this._busy = null; }
  }

  async _flush() {
    if (!this._pending) {
      const now = performance.now();
      const period = Math.max(now - this._taken, 0) / 1000;
      this._taken = now;
      if (this._counts.size === 0) return;
      this._seq++;
      // period: the time the counts were counted over, so that a late
      // report does not read as a burst at the leader.
      this._pending = { seq: this._seq, period, counts: [...this._counts].map(([tenant, count]) => ({ tenant, count })) };
      this._counts = new Map();
    }
    const p = this._pending;
    for (let i = 0; i < p.counts.length; i += 10000) {
      // more than 10,000 tenants: one seq per chunk
      const chunk = p.counts.length > 10000 ? p.counts.slice(i, i + 10000) : p.counts;
      try {
        const r = await this.client.reportLoad(this.pool, this.reporter, p.seq, chunk, { period: p.period });
        this.stats.reports++;
        if (r.outcome === 'REPORT_OUTCOME_STALE') {
          this.stats.dropped += chunk.length;
          this.emit('dropped', { reason: 'stale', counts: chunk });
        }
      } catch (e) {
        this.stats.failures++;
        if (e instanceof InvalidArgument) {
          this.stats.dropped += chunk.length;
          this.emit('dropped', { reason: e.message, counts: chunk });
          this._pending = null;
          return;
        }
        emitError(this, e);
        throw e;
      }
      if (p.counts.length <= 10000) break;
    }
    this._pending = null;
  }

  async close() {
    clearInterval(this._timer);
    await this.flush().catch(() => {});
  }
}
