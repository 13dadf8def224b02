// Worker: a member of a keyspace, mirroring the Go SDK's client.Worker:
// join, keep alive (at once, then every TTL/3 counted from each send),
// self-fence on a monotonic clock, follow grants (GetGrants long poll),
// call the handler per bucket (never concurrently for one bucket),
// release after the handler's release resolved, re-join after a fence or
// a lost session, drain and leave on close().
import { EventEmitter } from 'node:events';
import { Client } from './client.js';
import {
  AlreadyExists, Closed, DeadlineExceeded, FailedPrecondition, InvalidArgument, KeyshardError, NotFound, NotGranted,
  PermissionDenied, Unauthenticated, Unavailable, Aborted, Unknown, WrongOwner,
} from './errors.js';
import { hasher } from './hash.js';
import { checkBool, checkNumber, checkObject, checkName, checkString, describe, durationOut, memberIn, u64, u64In } from './convert.js';
import { Backoff, deferred, emitError, monotonic, sleep } from './timing.js';
import { Router } from './router.js';

const GRANTS_WAIT = 30; // seconds per GetGrants long poll
const KEEPALIVE_RETRY = 50; // ms, doubling up to TTL/9
const MAX_FENCE_MARGIN = 12 * 3600; // seconds
// RELEASE_COALESCE_MS bounds how long released buckets wait for the other
// handoffs of their burst (those whose release() is still due or running)
// before they are sent without them.
const RELEASE_COALESCE_MS = 2;

/** fenceMargin(ttlMs, marginMs?) -> the margin used: marginMs or max(TTL/10, 500 ms), at most TTL/2. */
export function fenceMargin(ttl, margin) {
  const m = margin > 0 ? margin : Math.max(ttl / 10, 500);
  return Math.min(m, ttl / 2);
}

/**
 * Lease is a session's fence deadline on a monotonic clock (ms):
 * deadline = send time of the newest acknowledged keep-alive + TTL − margin.
 * Once past the deadline it is void for good.
 */
export class Lease {
  constructor({ ttl, margin, sent, clock = monotonic }) {
    this.ttl = ttl;
    this.margin = margin;
    this.clock = clock;
    this.deadline = sent + ttl - margin;
    this.void = false;
    this.acked = false;
  }
  valid() {
    if (!this.void && this.clock.now() >= this.deadline) this.void = true;
    return !this.void;
  }
  /** renewed(sent, ttlLeft): a keep-alive sent at `sent` was acknowledged now. False (and nothing moves) if already void. */
  renewed(sent, ttlLeft = this.ttl) {
    if (!this.valid()) return false;
    this.acked = true;
    const d = sent + Math.min(ttlLeft, this.ttl) - this.margin;
    if (d > this.deadline) this.deadline = d;
    return true;
  }
  end() { this.void = true; }
}

function fencedError(lease) {
  const e = new KeyshardError('unavailable', `keyshard: lease deadline passed: no keep-alive acknowledged in time (lease TTL ${lease.ttl / 1000}s, margin ${lease.margin / 1000}s); stopped acting on every bucket`);
  e.fenced = true;
  return e;
}

/**
 * Grant: the right to act on one bucket. token strictly increases per
 * bucket: pass it to storage. signal aborts when the grant ends by a
 * fence, a loss or after its release. Call valid() right before each write.
 */
export class Grant {
  constructor({ bucket, token, from = 0n }, session, lease, ac) {
    this.bucket = bucket;
    this.token = token;
    this.from = from;
    this.session = session;
    this._lease = lease;
    this._ac = ac;
    this.signal = ac.signal;
  }
  /** False once the fence deadline passed (checked against the clock now) or the grant ended. */
  valid() {
    if (this._ac.signal.aborted) return false;
    if (!this._lease.valid()) {
      this._ac.abort(fencedError(this._lease));
      return false;
    }
    return true;
  }
  /** The session's fence deadline, in ms of the worker's monotonic clock. */
  get deadline() { return this._lease.deadline; }
  toJSON() { return { bucket: this.bucket, token: String(this.token), from: String(this.from) }; }
}

function permanent(err, first) {
  if (err instanceof InvalidArgument || err instanceof NotFound || err instanceof FailedPrecondition ||
      err instanceof Unauthenticated || err instanceof PermissionDenied || err instanceof Closed) return true;
  return first && err instanceof AlreadyExists;
}

const NOOP_LOG = { debug() {}, info() {}, warn() {}, error() {} };

/**
 * new Worker(client, keyspace, {id, address, weight, zone, metadata, replace, fenceMargin, clock, logger}, handler)
 * handler: {acquire(grant), release(bucket, grant)}, async or not.
 * Events: 'joined', 'rejoined', 'left' ({session}); 'fenced', 'session-lost' ({session, error});
 * 'acquired', 'released' (grant); 'renewed' ({session, deadline}); 'error' (err).
 */
export class Worker extends EventEmitter {
  constructor(client, keyspace, member, handler) {
    super();
    const fn = 'Worker';
    if (!(client instanceof Client)) throw new TypeError(`${fn}: client must be a Client, not ${describe(client)}`);
    checkName(fn, 'keyspace', keyspace);
    checkObject(fn, 'member', member);
    const { replace, fenceMargin: margin, clock, logger, ...m } = member;
    this.member = memberIn(fn, m);
    this.replace = checkBool(fn, 'member.replace', replace);
    if (margin !== undefined) checkNumber(fn, 'member.fenceMargin', margin, { above: 0, max: MAX_FENCE_MARGIN - 1e-9 });
    this.fenceMarginMs = margin !== undefined ? margin * 1000 : undefined;
    if (clock !== undefined && typeof clock?.now !== 'function') throw new TypeError(`${fn}: member.clock must have a now() method (ms, monotonic), not ${describe(clock)}`);
    this.clock = clock ?? monotonic;
    this.log = logger ?? NOOP_LOG;
    if (handler === null || typeof handler !== 'object' && typeof handler !== 'function') throw new TypeError(`${fn}: handler must be an object with acquire(grant) and release(bucket, grant), not ${describe(handler)}`);
    if (typeof handler.acquire !== 'function') throw new TypeError(`${fn}: handler.acquire must be a function`);
    if (typeof handler.release !== 'function') throw new TypeError(`${fn}: handler.release must be a function`);
    this.client = client;
    this.keyspace = keyspace;
    this.handler = handler;
    this.router = new Router(client, keyspace);
    this._grants = new Map(); // bucket -> grant state, until release resolved
    this._last = new Map(); // bucket -> state of its latest grant
    this._releaseCoalesceMs = RELEASE_COALESCE_MS;
    this._actors = new Set();
    this._cur = null;
    this._hash = null;
    this._lastTTL = 0;
    this._drainAC = new AbortController();
    this._stopAC = new AbortController();
    const quit = new AbortController(); // aborted by a drain or a stop (AbortSignal.any needs Node 20.3)
    this._quit = quit.signal;
    this._drainAC.signal.addEventListener('abort', () => quit.abort(), { once: true });
    this._stopAC.signal.addEventListener('abort', () => quit.abort(), { once: true });
    this._joined = deferred();
    this._joined.promise.catch(() => {});
    this._done = deferred();
    this._done.promise.catch(() => {});
    this._runP = null;
    this._stopped = false;
    this._changed = deferred();
    this._finished = false;
    this._finishedD = deferred();
    this._finishedP = this._finishedD.promise;
  }

  /** Resolves once the worker has joined (its first session); rejects if it cannot (NotFound, AlreadyExists, ...). */
  start() {
    if (this._runP) return this._joined.promise;
    if (this._drainAC.signal.aborted) return Promise.reject(new Closed('keyshard: the Worker was closed before start()'));
    this.router.start().catch(() => {});
    this._runP = this._run().then(
      () => null,
      (e) => e,
    );
    this._runP.then((e) => {
      this._finished = true;
      this._finishedD.resolve();
      if (!this._drainAC.signal.aborted) this.router.close(); // stopped by itself: nothing follows the map any more
      if (e) {
        this._joined.reject(e);
        emitError(this, e);
        this._done.reject(e);
      } else {
        this._joined.reject(new Closed('keyshard: the Worker stopped before it joined'));
        this._done.resolve();
      }
    });
    return this._joined.promise;
  }

  /** Resolves when the worker has stopped (after close()); rejects with the error that stopped it by itself. */
  get done() { return this._done.promise; }

  /** The current session id, or null between sessions. */
  get session() { return this._cur ? this._cur.id : null; }

  /** Grants acquired, not being released, and valid now, sorted by bucket. */
  held() {
    const out = [];
    for (const gs of this._grants.values()) {
      if (gs.acquired && !gs.ending && gs.grant.valid()) out.push(gs.grant);
    }
    return out.sort((a, b) => a.bucket - b.bucket);
  }

  /**
   * granted() -> {session, grants}: every grant of the current session
   * not released, acquired or not (grant.from is where a bucket starts),
   * including those being handed off; {session: null, grants: []} between
   * sessions and once fenced. For stream commits: maxToken = the highest
   * token among them.
   */
  granted() {
    const s = this._cur;
    if (!s || s.fenced) return { session: null, grants: [] };
    const grants = [];
    for (const gs of this._grants.values()) {
      if (gs.s === s && !(gs.ending && gs.how === 'fence')) grants.push(gs.grant);
    }
    return { session: s.id, grants: grants.sort((a, b) => a.bucket - b.bucket) };
  }

  /**
   * commit({session, maxToken, position, exceptions}) records the
   * session's stream positions (stream keyspaces): position covers every
   * bucket held at a token <= maxToken that exceptions ({bucket, token,
   * position}) do not list. Buckets handed off with a final position that
   * the server may still hold are added as exceptions at it. Resolves
   * with {revision}. Safe to retry.
   */
  async commit({ session, maxToken, position, exceptions = [] } = {}) {
    const s = this._cur;
    if (session !== undefined && session !== null) checkString('commit', 'session', session);
    if (!s || s.fenced) throw new NotGranted('keyshard: commit: the worker has no live session');
    if (session && session !== s.id) throw new NotGranted(`keyshard: commit: the positions were computed for session ${session}, not the current ${s.id}`);
    const mt = u64In('commit', 'maxToken', maxToken, { optional: false });
    const pos = u64In('commit', 'position', position, { optional: false });
    if (!Array.isArray(exceptions)) throw new TypeError(`commit: exceptions must be an array of {bucket, token, position}, not ${describe(exceptions)}`);
    const seen = new Set();
    const ex = exceptions.map((x, i) => {
      checkObject('commit', `exceptions[${i}]`, x);
      checkNumber('commit', `exceptions[${i}].bucket`, x.bucket, { min: 0, integer: true });
      if (seen.has(x.bucket)) throw new RangeError(`commit: exceptions[${i}]: bucket ${x.bucket} is listed twice`);
      seen.add(x.bucket);
      const token = u64In('commit', `exceptions[${i}].token`, x.token, { optional: false });
      if (token === '0') throw new RangeError(`commit: exceptions[${i}].token must be > 0`);
      return { bucket: x.bucket, token, position: u64In('commit', `exceptions[${i}].position`, x.position, { optional: false }) };
    });
    const send = async () => {
      const all = [...ex];
      for (const f of s.finals.values()) {
        if (!seen.has(f.bucket)) all.push({ bucket: f.bucket, token: String(f.token), position: String(f.position) });
      }
      const body = { session: s.id, maxToken: mt, position: pos };
      if (all.length) body.exceptions = all;
      const r = await this.client._call('keyshard.v1.MemberService/Commit', body);
      return { revision: u64(r.revision) };
    };
    try {
      return await send();
    } catch (e) {
      if (!(e instanceof FailedPrecondition) || s.finals.size === 0) throw e;
      // a bucket handed off with a final position may have been handed over meanwhile: keep only those still released, once
      for (const b of [...s.finals.keys()]) if (!s.released.has(b)) s.finals.delete(b);
      return send();
    }
  }

  /** owns(key) -> the grant of key's bucket; throws WrongOwner (another owner) or NotGranted (not yet / fencing). */
  owns(key) {
    if (!this._hash) throw new NotGranted('keyshard: the worker has not joined yet');
    const b = this._hash(key);
    const gs = this._grants.get(b);
    if (gs && gs.acquired && !gs.ending) {
      if (!gs.grant.valid()) throw new NotGranted(`keyshard: bucket ${b}: the session's fence deadline passed; the worker is fencing`);
      return gs.grant;
    }
    let owner = '', address = '', epoch = 0n;
    if (this.router.map) ({ member: owner, address, epoch } = this.router.ownerOfBucket(b));
    if (owner === this.member.id) throw new NotGranted(`keyshard: bucket ${b} is this worker's in the map, but its grant has not arrived or acquire() has not returned`);
    throw new WrongOwner(b, owner, address, epoch);
  }

  /**
   * waitGrant(key, {timeout, signal}) resolves with the grant of key's
   * bucket once the worker holds it (as owns() counts it). It rejects with
   * WrongOwner when waiting would not change the answer (a map that names
   * this worker gives the bucket to another; or any map once close() has
   * begun), DeadlineExceeded after timeout seconds, Closed once the worker
   * stopped. It waits while the worker joins, the grant is on its way, or
   * the bucket is unassigned.
   */
  async waitGrant(key, { timeout, signal } = {}) {
    if (typeof key !== 'string' && !(key instanceof Uint8Array)) throw new TypeError(`waitGrant: key must be a string or a Uint8Array, not ${describe(key)}`);
    if (timeout !== undefined) checkNumber('waitGrant', 'timeout', timeout, { above: 0 });
    let timer = null;
    const limit = new Promise((_, reject) => {
      if (timeout !== undefined) timer = setTimeout(() => reject(new DeadlineExceeded(`keyshard: waitGrant: no grant for the key within ${timeout}s`)), timeout * 1000);
      signal?.addEventListener('abort', () => reject(signal.reason ?? new Closed('keyshard: waitGrant aborted')), { once: true });
    });
    limit.catch(() => {});
    try {
      for (;;) {
        if (signal?.aborted) throw signal.reason ?? new Closed('keyshard: waitGrant aborted');
        const changed = this._changed.promise;
        const mapChanged = this.router.changed();
        try {
          return this.owns(key);
        } catch (e) {
          if (e instanceof WrongOwner && this._settled(e)) throw e;
          if (!(e instanceof WrongOwner) && !(e instanceof NotGranted)) throw e;
        }
        if (this._runP && this._finished) throw new Closed('keyshard: the Worker has stopped');
        await Promise.race([changed, mapChanged, limit, this._finishedP]);
      }
    } finally {
      clearTimeout(timer);
    }
  }

  _settled(wo) {
    if (this._drainAC.signal.aborted) return true;
    if (wo.owner === '') return false;
    const m = this.router.map;
    return !!m && m.epoch === wo.epoch && m.members.some((x) => x.id === this.member.id);
  }

  /** bucket(key) in the keyspace's hash mode (after joining). */
  bucket(key) {
    if (!this._hash) throw new NotGranted('keyshard: the worker has not joined yet');
    return this._hash(key);
  }

  /**
   * close({timeout}) drains (every bucket handed over, then Leave) and
   * stops. Past timeout seconds it stops at once (every grant ended as in a
   * fence) and rejects with DeadlineExceeded.
   */
  async close({ timeout } = {}) {
    if (timeout !== undefined) checkNumber('Worker.close', 'timeout', timeout, { above: 0 });
    this._drainAC.abort(new Closed('keyshard: the Worker is closing'));
    if (!this._runP) {
      await this.router.close();
      return;
    }
    let timedOut = false;
    const t = timeout !== undefined ? setTimeout(() => { timedOut = true; this._stop(); }, timeout * 1000) : null;
    await this._runP;
    clearTimeout(t);
    await this.router.close();
    if (timedOut) throw new DeadlineExceeded(`keyshard: the worker stopped before it finished draining (timeout ${timeout}s)`);
  }

  _stop() {
    this._stopped = true;
    this._stopAC.abort(new Closed('keyshard: the Worker was stopped'));
    if (this._cur) {
      const c = new Closed('keyshard: the Worker was stopped');
      c.stopped = true;
      this._cur.end(c);
    }
  }

  _marginFor(ttl) { return fenceMargin(ttl, this.fenceMarginMs); }

  _notify() {
    const d = this._changed;
    this._changed = deferred();
    d.resolve();
  }

  async _run() {
    let first = true;
    let fenced = '';
    const rejoin = new Backoff(1000, 10000);
    for (;;) {
      const s = await this._join(first, fenced);
      if (!s) return;
      this._cur = s;
      this._hash = s.hash;
      this._lastTTL = s.ttl;
      if (first) {
        this._joined.resolve(s.id);
        this.emit('joined', { session: s.id });
      } else {
        this.emit('rejoined', { session: s.id });
      }
      const cause = await this._runSession(s);
      this._cur = null;
      if (cause === null) {
        this.emit('left', { session: s.id });
        return;
      }
      if (this._stopped) return;
      fenced = s.selfFenced ? s.id : '';
      const lost = new KeyshardError('unavailable', `keyshard: session ${s.id} lost: ${cause.message}`, [], { cause });
      lost.sessionLost = true;
      this.log.error(`keyshard: session lost; re-joining: ${cause.message}`);
      this.emit('session-lost', { session: s.id, error: lost });
      if (this._drainAC.signal.aborted) return; // nothing is held, nothing left to drain
      if (s.lease.acked) rejoin.reset();
      else {
        rejoin.limit = Math.min(Math.max(s.ttl, 1000), 10000);
        if (!(await sleep(rejoin.next(), this._quit))) return;
      }
      first = false;
    }
  }

  async _join(first, fenced) {
    const req = { keyspace: this.keyspace, member: this.member, replace: this.replace || fenced !== '' };
    if (fenced) req.fencedSession = fenced;
    const b = new Backoff(100, 5000);
    while (!this._quit.aborted) {
      const within = this._lastTTL > 0 ? this._lastTTL - this._marginFor(this._lastTTL) : this.client.timeout * 1000;
      const sent = this.clock.now();
      let err;
      try {
        const resp = await this.client._call('keyshard.v1.MemberService/Join', req, { timeout: within / 1000, signal: this._stopAC.signal });
        const s = this._newSession(resp, sent);
        if (s.lease.valid()) return s;
        err = new Unavailable(`keyshard: the Join's answer came ${Math.round(this.clock.now() - sent)}ms after it was sent, past the session's fence deadline`);
      } catch (e) {
        err = e;
      }
      if (this._stopAC.signal.aborted) return null;
      if (err instanceof Unavailable || err instanceof Aborted || err instanceof Unknown) req.replace = true;
      if (permanent(err, first)) {
        const hint = err instanceof AlreadyExists ? ' (pass replace: true to take over the id from a live session)' : '';
        const e = new err.constructor(`keyshard: join keyspace ${JSON.stringify(this.keyspace)} as ${JSON.stringify(this.member.id)}: ${err.message}${hint}`, err.details ?? []);
        throw e;
      }
      this.log.warn(`keyshard: join failed; retrying: ${err.message}`);
      if (!(await sleep(b.next(), this._quit))) return null;
    }
    return null;
  }

  _newSession(resp, sent) {
    const ks = resp.keyspace ?? {};
    let ttl = durationOut(resp.leaseTtl) * 1000;
    if (!(ttl > 0)) ttl = durationOut(ks.leaseTtl) * 1000;
    if (!resp.session || !(ttl > 0)) throw new KeyshardError('internal', `keyshard: join keyspace ${this.keyspace}: the answer lacks the session or its lease TTL`);
    const margin = this._marginFor(ttl);
    if (this.fenceMarginMs > margin) this.log.warn(`keyshard: fence margin too large for the lease TTL ${ttl / 1000}s; using TTL/2`);
    const ended = deferred();
    const s = {
      id: resp.session, ttl, margin,
      lease: new Lease({ ttl, margin, sent, clock: this.clock }),
      hash: hasher(ks.buckets || 4096, ks.hash || 'xxh64'),
      stream: ks.mode === 'KEYSPACE_MODE_STREAM',
      fenced: false, selfFenced: false,
      released: new Map(), pending: [], held: [],
      releasing: 0, // handoffs whose release() is due or running (see _kickRelease)
      releaseWake: null, // resolves the releaser's wait for the rest of a burst
      finals: new Map(), // bucket -> {bucket, token, position}: handed off with a final position, maybe still held at the server
      rev: 0n, minRev: 0n,
      ac: new AbortController(),
      actors: new Set(),
      releaser: null,
      cause: undefined,
      ended: ended.promise,
      end(cause) {
        if (this.cause === undefined) {
          this.cause = cause;
          ended.resolve(cause);
        }
      },
    };
    return s;
  }

  async _runSession(s) {
    const keep = this._keep(s);
    const follow = this._followGrants(s);
    let leaving = false;
    let leave = null;
    const onDrain = () => {
      if (leaving) return;
      leaving = true;
      leave = this._leave(s);
    };
    if (this._drainAC.signal.aborted) onDrain();
    else this._drainAC.signal.addEventListener('abort', onDrain, { once: true });
    const cause = await s.ended;
    this._drainAC.signal.removeEventListener('abort', onDrain);
    const left = leaving && cause.gone === true;
    this._fence(s, cause, !left && !cause.stopped);
    s.ac.abort();
    await Promise.all([keep, follow, leave, s.releaser]);
    while (s.actors.size > 0) await Promise.all([...s.actors]);
    if (left) return null;
    if (!cause.stopped && !cause.gone) {
      s.selfFenced = true;
      if (this._drainAC.signal.aborted && !this._stopped) await this._handBack(s);
    }
    return cause;
  }

  // The keep-alive loop: first at once, then TTL/3 after each send (or as
  // soon as the previous answer came, if later); each call bounded by the
  // fence deadline; a failure retried after 50 ms doubling to TTL/9; a
  // timer fences the session at its deadline.
  _keep(s) {
    return new Promise((done) => {
      const interval = s.ttl / 3;
      const retry = new Backoff(KEEPALIVE_RETRY, Math.max(interval / 3, KEEPALIVE_RETRY));
      let inflight = false, due = false, finished = false, nextT = null, fenceT = null;
      const finish = () => {
        if (finished) return;
        finished = true;
        clearTimeout(nextT);
        clearTimeout(fenceT);
        s.ac.signal.removeEventListener('abort', finish);
        done();
      };
      s.ac.signal.addEventListener('abort', finish, { once: true });
      const fenced = () => {
        const cause = fencedError(s.lease);
        this._fence(s, cause, true);
        s.end(cause);
        finish();
      };
      const armFence = () => {
        clearTimeout(fenceT);
        fenceT = setTimeout(onFence, Math.max(0, s.lease.deadline - this.clock.now()));
      };
      const onFence = () => {
        if (finished) return;
        if (s.lease.valid()) armFence(); // early tick, or a renewal meanwhile
        else fenced();
      };
      const send = () => {
        const sent = this.clock.now();
        const left = s.lease.deadline - sent;
        if (left <= 0 || !s.lease.valid()) return fenced();
        inflight = true;
        clearTimeout(nextT);
        nextT = setTimeout(onNext, interval); // counted from this send, not from its answer
        this.client._call('keyshard.v1.MemberService/KeepAlive', { session: s.id }, { timeout: left / 1000, signal: s.ac.signal })
          .then((resp) => onResult(sent, resp, null), (err) => onResult(sent, null, err));
      };
      const onNext = () => {
        if (finished) return;
        if (inflight) due = true;
        else send();
      };
      const onResult = (sent, resp, err) => {
        if (finished) return;
        inflight = false;
        if (!err) {
          const left = durationOut(resp.ttl) * 1000;
          const ttl = left > 0 && left < s.ttl ? left : s.ttl;
          if (!s.lease.renewed(sent, ttl)) return fenced(); // acknowledged only after the deadline
          armFence();
          retry.reset();
          this.emit('renewed', { session: s.id, deadline: s.lease.deadline });
        } else if (err instanceof NotFound) {
          const c = new KeyshardError('not_found', `keyshard: keep-alive: the server ended the session: ${err.message}`);
          c.gone = true;
          s.end(c);
          return finish();
        } else if (err instanceof Closed) {
          s.end(err);
          return finish();
        } else {
          this.log.warn(`keyshard: keep-alive failed; retrying: ${err.message}`);
          due = false;
          clearTimeout(nextT);
          nextT = setTimeout(onNext, retry.next());
        }
        if (due) {
          due = false;
          send();
        }
      };
      armFence();
      send();
    });
  }

  // _fence ends every grant of s at once (signals aborted first) and stops new ones.
  _fence(s, cause, report) {
    if (s.fenced) return;
    s.fenced = true;
    s.lease.end();
    for (const gs of this._grants.values()) {
      if (gs.s === s) {
        s.held.push(gs.grant);
        this._endGrant(gs, 'fence', cause);
      }
    }
    this._notify();
    if (report) {
      this.log.error(`keyshard: self-fenced: stopped acting on every bucket: ${cause.message}`);
      this.emit('fenced', { session: s.id, error: cause });
    }
  }

  async _followGrants(s) {
    const b = new Backoff(100, 5000);
    while (!s.ac.signal.aborted) {
      const minRev = s.rev > s.minRev ? s.rev : s.minRev;
      const body = { session: s.id, sinceRevision: String(s.rev), wait: `${GRANTS_WAIT}s` };
      if (minRev > 0n) body.minRevision = String(minRev);
      try {
        const resp = await this.client._call('keyshard.v1.MemberService/GetGrants', body, { wait: GRANTS_WAIT, signal: s.ac.signal });
        b.reset();
        this._reconcile(s, resp);
      } catch (e) {
        if (s.ac.signal.aborted) return;
        if (e instanceof NotFound) {
          const c = new KeyshardError('not_found', `keyshard: grants: the server ended the session: ${e.message}`);
          c.gone = true;
          s.end(c);
          return;
        }
        if (e instanceof Closed) {
          s.end(e);
          return;
        }
        this.log.warn(`keyshard: reading grants failed; retrying: ${e.message}`);
        await sleep(b.next(), s.ac.signal);
      }
    }
  }

  _reconcile(s, resp) {
    if (s.fenced || s.ac.signal.aborted) return;
    const rev = u64(resp.revision);
    if (rev !== 0n) {
      if (rev < s.rev) return; // older than what was applied
      s.rev = rev;
    }
    const granted = new Map();
    for (const g of resp.grants ?? []) {
      const bucket = g.bucket ?? 0;
      granted.set(bucket, { bucket, token: u64(g.token), from: u64(g.from) });
    }
    for (const [b, tok] of s.released) {
      const g = granted.get(b);
      if (!g || g.token !== tok) s.released.delete(b); // the server has taken the release in
    }
    for (const [b, f] of s.finals) {
      const g = granted.get(b);
      if (!g || g.token !== f.token) s.finals.delete(b); // handed over (or granted again): no longer ours to list
    }
    for (const [b, gs] of this._grants) {
      if (gs.s !== s) continue;
      const g = granted.get(b);
      if (!g || g.token !== gs.grant.token) {
        this.log.warn(`keyshard: the server took back bucket ${b} (token ${gs.grant.token}) without a release; stopping it`);
        this._endGrant(gs, 'fence', new KeyshardError('failed_precondition', `keyshard: bucket ${b} was taken back by the server`));
      }
    }
    for (const [b, g] of granted) {
      if (s.released.get(b) === g.token) continue;
      const gs = this._grants.get(b);
      if (gs && gs.s === s && gs.grant.token === g.token) continue;
      this._startGrant(s, g);
    }
    for (const b of resp.release ?? []) {
      const gs = this._grants.get(b);
      if (gs && gs.s === s) this._endGrant(gs, 'handoff');
    }
    this._notify();
  }

  _startGrant(s, g) {
    const ac = new AbortController();
    const grant = new Grant(g, s.id, s.lease, ac);
    const end = deferred();
    const gs = { grant, s, ac, ending: false, how: null, acquired: false, releasing: false, end };
    const prev = this._last.get(g.bucket);
    this._last.set(g.bucket, gs);
    this._grants.set(g.bucket, gs);
    gs.done = this._serveGrant(gs, prev ? prev.done : null);
    s.actors.add(gs.done);
    this._actors.add(gs.done);
    gs.done.then(() => {
      s.actors.delete(gs.done);
      this._actors.delete(gs.done);
    });
  }

  _endGrant(gs, how, reason) {
    if (how === 'fence') {
      if (!gs.ac.signal.aborted) gs.ac.abort(reason ?? fencedError(gs.s.lease));
      gs.how = 'fence';
    }
    if (!gs.ending) {
      gs.ending = true;
      gs.how = how;
      if (how === 'handoff' && !gs.s.fenced) {
        gs.releasing = true; // counted in s.releasing until release() returned
        gs.s.releasing++;
      }
      gs.end.resolve();
    }
  }

  // _serveGrant calls acquire, then release once the grant ends, after the
  // previous grant of the bucket finished: calls for one bucket never overlap.
  async _serveGrant(gs, prev) {
    if (prev) await prev;
    else await null;
    const { bucket: b, token } = gs.grant;
    const positioner = typeof this.handler.finalPosition === 'function';
    let final = null;
    if (gs.ending && gs.s.stream) final = gs.grant.from; // nothing of the bucket was handled: hand it over where it started
    if (!gs.ending) {
      try {
        await this.handler.acquire(gs.grant);
      } catch (e) {
        this.log.error(`keyshard: acquire(${b}) failed; the bucket stays held until released: ${e?.message ?? e}`);
        emitError(this, e);
      }
      gs.acquired = true;
      this._notify();
      this.emit('acquired', gs.grant);
      await gs.end.promise;
      try {
        await this.handler.release(b, gs.grant);
      } catch (e) {
        this.log.error(`keyshard: release(${b}) failed; releasing the bucket anyway: ${e?.message ?? e}`);
        emitError(this, e);
      }
      if (gs.s.stream) {
        final = gs.grant.from;
        if (positioner) {
          try {
            const p = this.handler.finalPosition(b, gs.grant);
            if (p !== undefined && p !== null) final = BigInt(p);
          } catch (e) {
            this.log.error(`keyshard: finalPosition(${b}) failed; handing the bucket over at its committed position: ${e?.message ?? e}`);
            final = null;
          }
        }
      }
      this.emit('released', gs.grant);
    }
    if (!gs.ac.signal.aborted) gs.ac.abort(new KeyshardError('canceled', `keyshard: the grant of bucket ${b} ended`));
    if (this._grants.get(b) === gs) this._grants.delete(b);
    if (this._last.get(b) === gs) this._last.delete(b);
    const s = gs.s;
    if (gs.releasing) {
      gs.releasing = false;
      s.releasing--;
    }
    if (gs.how === 'handoff' && !s.fenced) {
      if (final !== null) s.finals.set(b, { bucket: b, token, position: final });
      s.released.set(b, token);
      s.pending.push(gs.grant);
    }
    this._kickRelease(s);
    this._notify();
  }

  // _kickRelease tells the server about released buckets, one call at a
  // time. A map change usually ends many grants at once, whose release()
  // handlers return within microseconds of each other: the releaser sends
  // once none of them is still running, so that the burst goes in one call
  // rather than one call for the first bucket and, a round trip later, one
  // for the rest. A slow handler holds the others back by at most
  // RELEASE_COALESCE_MS; buckets released while a call is in flight go in
  // the next.
  _kickRelease(s) {
    if (s.releaseWake) s.releaseWake();
    if (s.releaser || s.pending.length === 0) return;
    s.releaser = (async () => {
      try {
        while (s.pending.length > 0 && !s.ac.signal.aborted) {
          if (s.releasing > 0) await this._awaitBurst(s);
          const batch = s.pending.splice(0);
          if (!(await this._sendRelease(s, batch, s.ac.signal))) return;
        }
      } catch (e) {
        this.log.error(`keyshard: releasing failed: ${e?.message ?? e}`);
        emitError(this, e);
      } finally {
        s.releaser = null;
      }
    })();
  }

  // _awaitBurst waits until none of s's release() handlers is running, or
  // RELEASE_COALESCE_MS passed.
  async _awaitBurst(s) {
    let timer;
    const bound = new Promise((resolve) => { timer = setTimeout(resolve, this._releaseCoalesceMs, true); });
    try {
      while (s.releasing > 0 && !s.ac.signal.aborted) {
        const next = new Promise((resolve) => { s.releaseWake = resolve; });
        if (await Promise.race([bound, next])) return; // the bound passed: send without the rest
      }
    } finally {
      clearTimeout(timer);
      s.releaseWake = null;
    }
  }

  // _sendRelease sends one Release for batch, retrying what may pass; a
  // refused batch is sent bucket by bucket so the others go through.
  async _sendRelease(s, batch, signal, withPositions = true) {
    const b = new Backoff(100, 5000);
    for (;;) {
      const body = { session: s.id, buckets: batch.map((g) => ({ bucket: g.bucket, token: String(g.token) })) };
      if (withPositions) {
        const positions = [];
        for (const g of batch) {
          const f = s.finals.get(g.bucket);
          if (f && f.token === g.token) positions.push({ bucket: f.bucket, token: String(f.token), position: String(f.position) });
        }
        if (positions.length) body.positions = positions;
      }
      try {
        const resp = await this.client._call('keyshard.v1.MemberService/Release', body, { signal });
        const rev = u64(resp.revision);
        if (rev > s.minRev) s.minRev = rev; // later answers, through any replica, include this release
        return true;
      } catch (e) {
        if (signal.aborted) return false;
        if (e instanceof NotFound) return true; // the session is gone; the keep-alive loop sees it too
        if ((e instanceof InvalidArgument || e instanceof FailedPrecondition) && batch.length > 1) {
          for (const g of batch) if (!(await this._sendRelease(s, [g], signal, withPositions))) return false;
          return true;
        }
        if (e instanceof FailedPrecondition && body.positions) {
          this.log.warn(`keyshard: the server refused bucket ${batch[0].bucket}'s final position; releasing it at its committed position: ${e.message}`);
          const f = s.finals.get(batch[0].bucket);
          if (f && f.token === batch[0].token) s.finals.delete(batch[0].bucket);
          return this._sendRelease(s, batch, signal, false);
        }
        if (e instanceof InvalidArgument || e instanceof FailedPrecondition) {
          this.log.warn(`keyshard: the server refused the release of bucket ${batch[0].bucket}: ${e.message}`);
          return true;
        }
        this.log.warn(`keyshard: release failed; retrying: ${e.message}`);
        if (!(await sleep(b.next(), signal))) return false;
      }
    }
  }

  async _leave(s) {
    const b = new Backoff(100, 5000);
    while (!s.ac.signal.aborted) {
      try {
        await this.client._call('keyshard.v1.MemberService/Leave', { session: s.id }, { signal: s.ac.signal });
        return;
      } catch (e) {
        if (s.ac.signal.aborted) return;
        if (e instanceof NotFound) {
          const c = new KeyshardError('not_found', `keyshard: leave: the session has ended: ${e.message}`);
          c.gone = true;
          s.end(c);
          return;
        }
        if (permanent(e, false)) {
          this.log.error(`keyshard: leave refused; waiting for the session to end: ${e.message}`);
          return;
        }
        this.log.warn(`keyshard: leave failed; retrying: ${e.message}`);
        await sleep(b.next(), s.ac.signal);
      }
    }
  }

  // _handBack releases what a session fenced while leaving still holds
  // at the server (no Join follows to name it as fenced). Best effort,
  // bounded by one TTL.
  async _handBack(s) {
    const held = new Map();
    for (const [b, tok] of s.released) held.set(b, tok);
    for (const g of [...s.pending, ...s.held]) held.set(g.bucket, g.token);
    s.pending = [];
    s.held = [];
    const hb = new AbortController();
    const signal = hb.signal;
    const t = setTimeout(() => hb.abort(), s.ttl);
    const onStop = () => hb.abort();
    this._stopAC.signal.addEventListener('abort', onStop, { once: true });
    try {
      await this._handBackWithin(s, held, signal);
    } finally {
      clearTimeout(t);
      this._stopAC.signal.removeEventListener('abort', onStop);
    }
  }

  async _handBackWithin(s, held, signal) {
    try {
      const minRev = s.rev > s.minRev ? s.rev : s.minRev;
      const resp = await this.client._call('keyshard.v1.MemberService/GetGrants', { session: s.id, minRevision: String(minRev) }, { signal });
      for (const g of resp.grants ?? []) held.set(g.bucket ?? 0, u64(g.token));
    } catch (e) {
      if (e instanceof NotFound) return;
      if (signal.aborted) return;
      this.log.warn(`keyshard: cannot read the fenced session's grants; handing back the ones it knew: ${e.message}`);
    }
    if (held.size === 0) return;
    const batch = [...held].sort((a, b) => a[0] - b[0]).map(([bucket, token]) => ({ bucket, token }));
    await this._sendRelease(s, batch, signal);
  }
}
