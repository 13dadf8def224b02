// Client: Keyshard's HTTP/JSON (Connect) API behind one or more replicas.
import { performance } from 'node:perf_hooks';
import { Closed, Unavailable, KeyshardError, fromAnswer } from './errors.js';
import { Transport } from './transport.js';
import {
  checkName, checkNumber, checkObject, checkString, describe, durationIn, durationOut, hotKeyPoolIn, hotKeyPoolOut,
  keyspaceIn, keyspaceOut, mapOut, memberOut, overflowSetOut, tsOut, u64, u64In,
} from './convert.js';

const DEFAULT_TIMEOUT = 10; // seconds, one call over every replica
const DEFAULT_REPLICA_TIMEOUT = 5; // seconds, one attempt at one replica (with several)
/** Seconds added to a long poll's wait to bound its call. */
export const LONG_POLL_MARGIN = 5;

function parseURLs(url) {
  let list;
  if (typeof url === 'string') list = url.split(',');
  else if (Array.isArray(url)) list = url;
  else throw new TypeError(`Client: url must be a string (comma-separated replicas) or an array of strings, not ${describe(url)}`);
  const out = [];
  for (const [i, raw] of list.entries()) {
    if (typeof raw !== 'string') throw new TypeError(`Client: url[${i}] must be a string, not ${describe(raw)}`);
    const s = raw.trim();
    if (s === '') continue;
    let u;
    try {
      u = new URL(s);
    } catch {
      throw new RangeError(`Client: url ${JSON.stringify(s)} is not a URL; want http://host:port or https://host:port`);
    }
    if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new RangeError(`Client: url ${JSON.stringify(s)}: scheme must be http or https`);
    out.push(s.replace(/\/+$/, ''));
  }
  if (out.length === 0) throw new RangeError('Client: url names no replica');
  return out;
}

/**
 * A client of Keyshard's API. url: "http://ks-1:7400" or several replicas
 * ("http://ks-1:7400,http://ks-2:7400" or an array): a call moves to the
 * next replica on a connection error, a timeout or an `unavailable` answer.
 * Options: token (Bearer), timeout (seconds per call, default 10),
 * replicaTimeout (seconds per attempt when there are several replicas,
 * default 5).
 */
export class Client {
  constructor(url, options = {}) {
    this.urls = parseURLs(url);
    checkObject('Client', 'options', options);
    const { token, timeout = DEFAULT_TIMEOUT, replicaTimeout = DEFAULT_REPLICA_TIMEOUT } = options;
    for (const k of Object.keys(options)) {
      if (!['token', 'timeout', 'replicaTimeout'].includes(k)) throw new RangeError(`Client: unknown option ${JSON.stringify(k)} (want token, timeout, replicaTimeout)`);
    }
    if (token !== undefined) checkString('Client', 'options.token', token);
    this.timeout = checkNumber('Client', 'options.timeout', timeout, { above: 0, max: 86400 });
    this.replicaTimeout = checkNumber('Client', 'options.replicaTimeout', replicaTimeout, { above: 0, max: 86400 });
    this._headers = { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' };
    if (token) this._headers.Authorization = `Bearer ${token}`;
    this._pref = 0;
    // aborted (and replaced) whenever calls move to another replica: long
    // polls open on the old one end and are re-sent to the new one, as the
    // Go SDK's streams are
    this._moved = new AbortController();
    this._closing = new AbortController();
    this._transport = new Transport();
  }

  get closed() { return this._closing.signal.aborted; }

  /** Ends every call in flight (they reject with Closed). */
  async close() {
    if (!this._closing.signal.aborted) {
      this._closing.abort(new Closed('keyshard: the client was closed'));
      this._transport.close();
    }
  }

  /**
   * call(service, method, body, {timeout, wait, signal}) makes one raw call
   * and resolves with the answer's JSON as sent (64-bit numbers are
   * strings). service: "MemberService" or "keyshard.v1.MemberService".
   * timeout bounds the whole call in seconds; wait (seconds) is added to it
   * and to each attempt (for long polls).
   */
  async call(service, method, body = {}, options = {}) {
    checkString('call', 'service', service, { nonEmpty: true });
    checkString('call', 'method', method, { nonEmpty: true });
    checkObject('call', 'body', body);
    checkObject('call', 'options', options);
    const svc = service.includes('.') ? service : `keyshard.v1.${service}`;
    return this._call(`${svc}/${method}`, body, options);
  }

  async _call(path, body, { timeout, wait = 0, signal } = {}) {
    if (timeout !== undefined) checkNumber(path, 'timeout', timeout, { above: 0 });
    checkNumber(path, 'wait', wait, { min: 0 });
    if (this.closed) throw new Closed();
    const n = this.urls.length;
    const explicit = timeout !== undefined;
    const budget = (explicit ? timeout : this.timeout + wait) * 1000;
    const start = performance.now();
    const payload = JSON.stringify(body);
    let first = this._pref;
    const failures = [];
    let last = null;
    let restarts = 0;
    for (let i = 0; i < n; i++) {
      const left = budget - (performance.now() - start);
      if (left <= 0) break;
      let limit = left;
      if (n > 1) limit = explicit ? left / (n - i) : Math.min(left, (this.replicaTimeout + wait) * 1000);
      const idx = (first + i) % n;
      const url = this.urls[idx];
      // a long poll at the preferred replica ends when other calls move away from it
      const moved = n > 1 && wait > 0 && idx === this._pref ? this._moved.signal : null;
      const r = await this._attempt(url, path, payload, limit, signal, moved);
      if (r.ok) {
        this._prefer(idx);
        return r.body;
      }
      if (r.moved && restarts < n) {
        restarts++;
        first = this._pref;
        i = -1; // start again at the replica the client moved to
        continue;
      }
      if (!(r.err instanceof Unavailable)) throw r.err;
      last = r.err;
      failures.push(r.err.message);
    }
    if (last === null) {
      last = new Unavailable(`keyshard: no answer from ${this.urls.join(', ')} within ${Math.round(budget) / 1000}s`);
    } else if (n > 1) {
      last = new Unavailable(`keyshard: all ${n} replicas failed (${path}): ${failures.join('; ')}`, [], { cause: last });
    }
    throw last;
  }

  _prefer(idx) {
    if (this._pref === idx) return;
    this._pref = idx;
    const m = this._moved;
    this._moved = new AbortController();
    m.abort();
  }

  async _attempt(url, path, payload, limitMs, signal, moved = null) {
    if (signal?.aborted) throw signal.reason ?? new DOMException('aborted', 'AbortError');
    const ac = new AbortController();
    let timedOut = false, wasMoved = false;
    const timer = setTimeout(() => { timedOut = true; ac.abort(); }, Math.max(1, limitMs));
    const onAbort = () => ac.abort();
    const onMoved = () => { wasMoved = true; ac.abort(); };
    signal?.addEventListener('abort', onAbort, { once: true });
    moved?.addEventListener('abort', onMoved, { once: true });
    this._closing.signal.addEventListener('abort', onAbort, { once: true });
    try {
      const res = await this._transport.post(url, path, payload, this._headers, ac.signal);
      const text = res.text;
      if (res.status === 200) {
        let body;
        try {
          body = text === '' ? {} : JSON.parse(text);
        } catch {
          return { ok: false, err: new KeyshardError('internal', `keyshard: ${url}/${path} answered 200 with a body that is not JSON: ${text.slice(0, 200)}`) };
        }
        return { ok: true, body };
      }
      return { ok: false, err: fromAnswer(res.status, text, `${url}/${path}`) };
    } catch (e) {
      if (this.closed) throw new Closed();
      if (signal?.aborted) throw signal.reason ?? e;
      if (wasMoved) return { ok: false, moved: true, err: new Unavailable(`keyshard: calls moved away from ${url}`) };
      if (timedOut) return { ok: false, err: new Unavailable(`keyshard: ${url} did not answer ${path} within ${Math.round(limitMs) / 1000}s`) };
      const why = e?.code ?? e?.cause?.code ?? e?.message ?? String(e);
      return { ok: false, err: new Unavailable(`keyshard: cannot reach ${url} (${path}): ${why}`, [], { cause: e }) };
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      moved?.removeEventListener('abort', onMoved);
      this._closing.signal.removeEventListener('abort', onAbort);
    }
  }

  // --- AdminService --------------------------------------------------------

  /** createKeyspace({name, buckets, hash, mode, leaseTtl, drainTimeout}) -> keyspace */
  async createKeyspace(keyspace, opts) {
    const k = keyspaceIn('createKeyspace', keyspace);
    const r = await this._call('keyshard.v1.AdminService/CreateKeyspace', { keyspace: k }, opts);
    return keyspaceOut(r.keyspace);
  }

  async getKeyspace(name, opts) {
    checkName('getKeyspace', 'name', name);
    const r = await this._call('keyshard.v1.AdminService/GetKeyspace', { name }, opts);
    return keyspaceOut(r.keyspace);
  }

  async listKeyspaces(opts) {
    const r = await this._call('keyshard.v1.AdminService/ListKeyspaces', {}, opts);
    return (r.keyspaces ?? []).map(keyspaceOut);
  }

  /** updateKeyspace({name, leaseTtl, drainTimeout}) -> keyspace */
  async updateKeyspace(keyspace, opts) {
    const k = keyspaceIn('updateKeyspace', keyspace);
    const r = await this._call('keyshard.v1.AdminService/UpdateKeyspace', { keyspace: k }, opts);
    return keyspaceOut(r.keyspace);
  }

  /** listMembers(keyspace) -> {members: [{member, targetBuckets, grantedBuckets, releasingBuckets, draining}], epoch} */
  async listMembers(keyspace, opts) {
    checkName('listMembers', 'keyspace', keyspace);
    const r = await this._call('keyshard.v1.AdminService/ListMembers', { keyspace }, opts);
    return {
      members: (r.members ?? []).map((m) => ({
        member: memberOut(m.member),
        targetBuckets: m.targetBuckets ?? 0,
        grantedBuckets: m.grantedBuckets ?? 0,
        releasingBuckets: m.releasingBuckets ?? 0,
        draining: m.draining ?? false,
      })),
      epoch: u64(r.epoch),
    };
  }

  async drainMember(keyspace, member, opts) {
    checkName('drainMember', 'keyspace', keyspace);
    checkName('drainMember', 'member', member);
    await this._call('keyshard.v1.AdminService/DrainMember', { keyspace, member }, opts);
  }

  /**
   * status() -> {replica, leader, keyspaces: [{keyspace, epoch, members, unassignedBuckets, handoffsInFlight,
   * drainingMembers, releasingBuckets, membersWithoutBuckets}], replicas, store}.
   * membersWithoutBuckets: active members (kept alive once, not draining) the current map gives no bucket; with
   * buckets enough, nonzero means a map the leader has not written yet (a join held back by the rebalance gap). A
   * keyspace has settled when unassignedBuckets, handoffsInFlight, releasingBuckets and membersWithoutBuckets are 0.
   */
  async status(opts) {
    const r = await this._call('keyshard.v1.AdminService/Status', {}, opts);
    return {
      replica: r.replica ?? '',
      leader: r.leader ?? '',
      keyspaces: (r.keyspaces ?? []).map((k) => ({
        keyspace: keyspaceOut(k.keyspace),
        epoch: u64(k.epoch),
        members: k.members ?? 0,
        unassignedBuckets: k.unassignedBuckets ?? 0,
        handoffsInFlight: k.handoffsInFlight ?? 0,
        drainingMembers: k.drainingMembers ?? 0,
        releasingBuckets: k.releasingBuckets ?? 0,
        membersWithoutBuckets: k.membersWithoutBuckets ?? 0,
      })),
      replicas: (r.replicas ?? []).map((x) => ({ id: x.id ?? '', url: x.url ?? '', leader: x.leader ?? false })),
      store: {
        healthy: r.store?.healthy ?? false,
        error: r.store?.error ?? '',
        endpoints: r.store?.endpoints ?? [],
        dbSizeBytes: u64(r.store?.dbSizeBytes),
        revision: u64(r.store?.revision),
        latency: durationOut(r.store?.latency),
      },
    };
  }

  /**
   * history(keyspace, {limit}) -> the latest epochs of the keyspace's map,
   * newest first (limit 0: 50, at most 500): [{epoch, time, reason ('create',
   * 'join', 'leave', 'crash', 'drain', 'load', 'update', 'import'), members,
   * movedBuckets, moves: [{from, to, buckets}], detail}]. Any replica
   * answers; a member token may read it.
   */
  async history(keyspace, { limit = 0, ...opts } = {}) {
    checkName('history', 'keyspace', keyspace);
    checkNumber('history', 'limit', limit, { min: 0, max: 500, integer: true });
    const r = await this._call('keyshard.v1.AdminService/GetKeyspaceHistory', { keyspace, limit }, opts);
    return (r.changes ?? []).map((c) => ({
      epoch: u64(c.epoch),
      time: tsOut(c.time),
      reason: String(c.reason ?? 'MOVE_REASON_UNSPECIFIED').replace('MOVE_REASON_', '').toLowerCase(),
      members: c.members ?? [],
      movedBuckets: c.movedBuckets ?? 0,
      moves: (c.moves ?? []).map((m) => ({ from: m.from ?? '', to: m.to ?? '', buckets: m.buckets ?? 0 })),
      detail: c.detail ?? '',
    }));
  }

  /**
   * buckets(keyspace) -> {epoch, buckets, stream, runs: [{first, count,
   * owner, holder, token, state ('unassigned', 'granted', 'releasing',
   * 'awaiting-grant'), position}]}: every bucket in runs of alike buckets;
   * owner and holder are member ids ('' none). Any replica answers.
   */
  async buckets(keyspace, opts) {
    checkName('buckets', 'keyspace', keyspace);
    const r = await this._call('keyshard.v1.AdminService/GetBuckets', { keyspace }, opts);
    const ms = r.members ?? [];
    const member = (i) => (i > 0 && i <= ms.length ? ms[i - 1] : '');
    return {
      epoch: u64(r.epoch),
      buckets: r.buckets ?? 0,
      stream: r.stream ?? false,
      runs: (r.runs ?? []).map((x) => ({
        first: x.first ?? 0,
        count: x.count ?? 0,
        owner: member(x.owner ?? 0),
        holder: member(x.holder ?? 0),
        token: u64(x.token),
        state: String(x.state ?? 'BUCKET_STATE_UNSPECIFIED').replace('BUCKET_STATE_', '').toLowerCase().replaceAll('_', '-'),
        position: u64(x.position),
      })),
    };
  }

  /** putHotKeyPool({name, threshold, lowThreshold, cooldown, reportThreshold, reportMaxAge, maxKeys}) -> pool as stored */
  async putHotKeyPool(pool, opts) {
    const p = hotKeyPoolIn('putHotKeyPool', pool);
    const r = await this._call('keyshard.v1.AdminService/PutHotKeyPool', { pool: p }, opts);
    return hotKeyPoolOut(r.pool);
  }

  async listHotKeyPools(opts) {
    const r = await this._call('keyshard.v1.AdminService/ListHotKeyPools', {}, opts);
    return (r.pools ?? []).map(hotKeyPoolOut);
  }

  /** getPositions(keyspace, {behind}) -> {min, max, spread, runs, behind, epoch, revision} (BigInt positions) */
  async getPositions(keyspace, { behind, ...opts } = {}) {
    checkName('getPositions', 'keyspace', keyspace);
    const body = { keyspace };
    if (behind !== undefined) body.behind = checkNumber('getPositions', 'behind', behind, { min: 0, max: 1000, integer: true });
    const r = await this._call('keyshard.v1.AdminService/GetPositions', body, opts);
    return {
      min: u64(r.min), max: u64(r.max), spread: u64(r.spread),
      runs: (r.runs ?? []).map((x) => ({ first: x.first ?? 0, count: x.count ?? 0, position: u64(x.position) })),
      behind: (r.behind ?? []).map((x) => ({ bucket: x.bucket ?? 0, position: u64(x.position), member: x.member ?? '', token: u64(x.token) })),
      epoch: u64(r.epoch), revision: u64(r.revision),
    };
  }

  // --- MapService -------------------------------------------------------------

  /** getMap(keyspace, {sinceEpoch, wait}) -> {map, changed}; wait: seconds (long poll, at most 60). */
  async getMap(keyspace, { sinceEpoch, wait, ...opts } = {}) {
    checkName('getMap', 'keyspace', keyspace);
    const body = { keyspace };
    const se = u64In('getMap', 'sinceEpoch', sinceEpoch);
    if (se !== undefined) body.sinceEpoch = se;
    const w = durationIn('getMap', 'wait', wait);
    if (w !== undefined) body.wait = w;
    const r = await this._call('keyshard.v1.MapService/GetMap', body, { ...opts, wait: longPollWait(wait) });
    return { map: mapOut(r.map), changed: r.changed ?? false };
  }

  /** lookup(keyspace, keys) -> {epoch, owners: [{key, bucket, member, address}]} */
  async lookup(keyspace, keys, opts) {
    checkName('lookup', 'keyspace', keyspace);
    if (!Array.isArray(keys)) throw new TypeError(`lookup: keys must be an array of strings, not ${describe(keys)}`);
    keys.forEach((k, i) => checkString('lookup', `keys[${i}]`, k));
    const r = await this._call('keyshard.v1.MapService/Lookup', { keyspace, keys }, opts);
    return {
      epoch: u64(r.epoch),
      owners: (r.owners ?? []).map((o) => ({ key: o.key ?? '', bucket: o.bucket ?? 0, member: o.member ?? '', address: o.address ?? '' })),
    };
  }

  // --- HotKeyService ----------------------------------------------------------

  /** reportHotKeys(pool, producer, [{key, rate}]) -> {pool, version} */
  async reportHotKeys(pool, producer, keys, opts) {
    checkName('reportHotKeys', 'pool', pool);
    checkName('reportHotKeys', 'producer', producer);
    if (!Array.isArray(keys)) throw new TypeError(`reportHotKeys: keys must be an array of {key, rate}, not ${describe(keys)}`);
    const ks = keys.map((k, i) => {
      checkObject('reportHotKeys', `keys[${i}]`, k);
      return { key: checkString('reportHotKeys', `keys[${i}].key`, k.key, { nonEmpty: true }), rate: checkNumber('reportHotKeys', `keys[${i}].rate`, k.rate, { min: 0 }) };
    });
    const r = await this._call('keyshard.v1.HotKeyService/ReportHotKeys', { pool, producer, keys: ks }, opts);
    return { pool: hotKeyPoolOut(r.pool), version: u64(r.version) };
  }

  /** getOverflowSet(pool, {sinceVersion, wait}) -> {set: {pool, version, keys}, changed} */
  async getOverflowSet(pool, { sinceVersion, wait, ...opts } = {}) {
    checkName('getOverflowSet', 'pool', pool);
    const body = { pool };
    const sv = u64In('getOverflowSet', 'sinceVersion', sinceVersion);
    if (sv !== undefined) body.sinceVersion = sv;
    const w = durationIn('getOverflowSet', 'wait', wait);
    if (w !== undefined) body.wait = w;
    const r = await this._call('keyshard.v1.HotKeyService/GetOverflowSet', body, { ...opts, wait: longPollWait(wait) });
    return { set: overflowSetOut(r.set), changed: r.changed ?? false };
  }

  // --- TenantPoolService (the calls clients of a pool need) -------------------

  /** putTenantPool({name, policy, leaseTtl}) -> the pool as stored (raw JSON policy). */
  async putTenantPool(pool, opts) {
    checkObject('putTenantPool', 'pool', pool);
    checkName('putTenantPool', 'pool.name', pool.name);
    const body = { name: pool.name, policy: checkObject('putTenantPool', 'pool.policy', pool.policy) };
    const lt = durationIn('putTenantPool', 'pool.leaseTtl', pool.leaseTtl);
    if (lt !== undefined) body.leaseTtl = lt;
    const r = await this._call('keyshard.v1.TenantPoolService/PutTenantPool', { pool: body }, opts);
    return r.pool ?? {};
  }

  /** getPoolSnapshot(pool, {sinceVersion, wait}) -> {snapshot (raw JSON, version as BigInt), changed} */
  async getPoolSnapshot(pool, { sinceVersion, wait, ...opts } = {}) {
    checkName('getPoolSnapshot', 'pool', pool);
    const body = { pool };
    const sv = u64In('getPoolSnapshot', 'sinceVersion', sinceVersion);
    if (sv !== undefined) body.sinceVersion = sv;
    const w = durationIn('getPoolSnapshot', 'wait', wait);
    if (w !== undefined) body.wait = w;
    const r = await this._call('keyshard.v1.TenantPoolService/GetPoolSnapshot', body, { ...opts, wait: longPollWait(wait) });
    const s = r.snapshot ?? {};
    return { snapshot: { ...s, version: u64(s.version), members: (s.members ?? []).map(memberOut), tenants: s.tenants ?? [] }, changed: r.changed ?? false };
  }

  /** getTenants(pool, tenants, {limit}) -> {version, tenants: [{assignment, rate, rateKnown, known}], total} */
  async getTenants(pool, tenants = [], { limit, ...opts } = {}) {
    checkName('getTenants', 'pool', pool);
    if (!Array.isArray(tenants)) throw new TypeError(`getTenants: tenants must be an array of strings, not ${describe(tenants)}`);
    tenants.forEach((t, i) => checkString('getTenants', `tenants[${i}]`, t, { nonEmpty: true }));
    const body = { pool, tenants };
    if (limit !== undefined) body.limit = checkNumber('getTenants', 'limit', limit, { min: 0, max: 10000, integer: true });
    const r = await this._call('keyshard.v1.TenantPoolService/GetTenants', body, opts);
    return {
      version: u64(r.version),
      tenants: (r.tenants ?? []).map((t) => ({ assignment: t.assignment ?? {}, rate: t.rate ?? 0, rateKnown: t.rateKnown ?? false, known: t.known ?? false })),
      total: r.total ?? 0,
    };
  }

  /**
   * reportLoad(pool, reporter, seq, [{tenant, count}], {period}) -> {outcome, version}.
   * period: the seconds the counts were counted over (the leader spreads
   * them over that much time); omitted: placed at their arrival.
   */
  async reportLoad(pool, reporter, seq, counts, opts) {
    checkName('reportLoad', 'pool', pool);
    checkName('reportLoad', 'reporter', reporter);
    const s = u64In('reportLoad', 'seq', seq, { optional: false });
    if (!Array.isArray(counts)) throw new TypeError(`reportLoad: counts must be an array of {tenant, count}, not ${describe(counts)}`);
    const cs = counts.map((c, i) => {
      checkObject('reportLoad', `counts[${i}]`, c);
      return { tenant: checkString('reportLoad', `counts[${i}].tenant`, c.tenant, { nonEmpty: true }), count: u64In('reportLoad', `counts[${i}].count`, c.count, { optional: false }) };
    });
    const body = { pool, reporter, seq: s, counts: cs };
    const period = durationIn('reportLoad', 'period', opts?.period);
    if (period !== undefined) body.period = period;
    const r = await this._call('keyshard.v1.TenantPoolService/ReportLoad', body, opts);
    return { outcome: r.outcome ?? 'REPORT_OUTCOME_UNSPECIFIED', version: u64(r.version) };
  }
}

function longPollWait(wait) {
  return wait ? Math.min(wait, 60) + LONG_POLL_MARGIN : 0;
}

export { durationOut };
