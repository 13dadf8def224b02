// Router: follows a keyspace's map (GetMap long poll) and answers owners
// from its local copy.
import { EventEmitter } from 'node:events';
import { Client } from './client.js';
import { Closed, DeadlineExceeded, NotFound, Unauthenticated, PermissionDenied, InvalidArgument, KeyshardError } from './errors.js';
import { hasher } from './hash.js';
import { checkName, checkNumber, checkObject, describe } from './convert.js';
import { deferred, emitError } from './timing.js';
import { follow } from './follow.js';

const FOLLOW_WAIT = 30; // seconds per long poll

function fatal(err) {
  return err instanceof NotFound || err instanceof Unauthenticated || err instanceof PermissionDenied || err instanceof InvalidArgument || err instanceof Closed;
}

/**
 * Router follows keyspace's map in the background.
 * Events: 'change' (map), 'stale' ({since, error}), 'recovered', 'error'.
 */
export class Router extends EventEmitter {
  constructor(client, keyspace, options = {}) {
    super();
    if (!(client instanceof Client)) throw new TypeError(`Router: client must be a Client, not ${describe(client)}`);
    checkName('Router', 'keyspace', keyspace);
    checkObject('Router', 'options', options);
    this.client = client;
    this.keyspace = keyspace;
    this.wait = checkNumber('Router', 'options.wait', options.wait ?? FOLLOW_WAIT, { above: 0, max: 60 });
    this._map = null;
    this._hash = null;
    this._addrs = new Map();
    this._stale = null;
    this._ac = new AbortController();
    this._ready = deferred();
    this._ready.promise.catch(() => {});
    this._waiters = new Set();
    this._loop = null;
    this._changedD = deferred();
  }

  /** start() begins following; resolves with the first map (rejects on NotFound and the like). */
  start() {
    if (!this._loop) this._loop = this._follow();
    return this._ready.promise;
  }

  get map() { return this._map; }
  get epoch() { return this._map ? this._map.epoch : 0n; }
  /** null while fresh; {since: Date, error} while the control plane is unreachable (the last map is kept). */
  get stale() { return this._stale; }

  /** bucket(key) in the keyspace's hash mode. */
  bucket(key) {
    if (!this._hash) throw new KeyshardError('unavailable', `Router(${this.keyspace}): no map yet; await router.start()`);
    return this._hash(key);
  }

  /** owner(key) -> {bucket, member, address, epoch}; member "" when the bucket is unassigned. */
  owner(key) {
    const b = this.bucket(key);
    return this.ownerOfBucket(b);
  }

  ownerOfBucket(b) {
    const m = this._map;
    if (!m) throw new KeyshardError('unavailable', `Router(${this.keyspace}): no map yet; await router.start()`);
    const i = m.owners[b] ?? 0;
    const member = i > 0 ? m.members[i - 1].id : '';
    return { bucket: b, member, address: i > 0 ? m.members[i - 1].address : '', epoch: m.epoch };
  }

  addressOf(member) { return this._addrs.get(member); }

  /** A promise resolved with the next map of a new epoch. */
  changed() { return this._changedD.promise; }

  /** waitEpoch(e, {timeout}) resolves with the map once its epoch is >= e. */
  waitEpoch(epoch, { timeout } = {}) {
    const e = BigInt(epoch);
    if (timeout !== undefined) checkNumber('waitEpoch', 'timeout', timeout, { above: 0 });
    if (this._map && this._map.epoch >= e) return Promise.resolve(this._map);
    if (this._ac.signal.aborted) return Promise.reject(new Closed('keyshard: the Router was closed'));
    return new Promise((resolve, reject) => {
      const w = { e, resolve, reject, timer: null };
      if (timeout !== undefined) {
        w.timer = setTimeout(() => {
          this._waiters.delete(w);
          reject(new DeadlineExceeded(`Router(${this.keyspace}): epoch ${e} not reached within ${timeout}s (at ${this.epoch})`));
        }, timeout * 1000);
      }
      this._waiters.add(w);
    });
  }

  _apply(m) {
    if (this._map && m.epoch < this._map.epoch) return;
    const changed = !this._map || m.epoch !== this._map.epoch;
    if (!this._hash || this._map.buckets !== m.buckets || this._map.hash !== m.hash) this._hash = hasher(m.buckets, m.hash);
    this._map = m;
    this._addrs = new Map(m.members.map((x) => [x.id, x.address]));
    for (const w of [...this._waiters]) {
      if (m.epoch >= w.e) {
        clearTimeout(w.timer);
        this._waiters.delete(w);
        w.resolve(m);
      }
    }
    this._ready.resolve(m);
    if (changed) {
      const d = this._changedD;
      this._changedD = deferred();
      d.resolve(m);
      this.emit('change', m);
    }
  }

  _follow() {
    return follow(this, this._ac.signal, {
      staleKey: '_stale',
      poll: () => this.client.getMap(this.keyspace, { sinceEpoch: this.epoch, wait: this._map ? this.wait : undefined, signal: this._ac.signal }),
      apply: (r) => this._apply(r.map),
      firstError: (e) => {
        if (!fatal(e)) return false;
        this._ready.reject(e);
        this._ac.abort();
        emitError(this, e);
        return true;
      },
    });
  }

  /** close() stops following; resolves once the loop has ended. */
  async close() {
    this._ac.abort();
    this._ready.reject(new Closed('keyshard: the Router was closed'));
    for (const w of this._waiters) {
      clearTimeout(w.timer);
      w.reject(new Closed('keyshard: the Router was closed'));
    }
    this._waiters.clear();
    if (this._loop) await this._loop;
  }
}
