// JSON mapping helpers: durations, 64-bit numbers, argument checks.
import { describe } from './hash.js';

export { describe };

const NAME_RE = /^[A-Za-z0-9._:@-]{1,128}$/;

export function checkName(fn, arg, v) {
  if (typeof v !== 'string') throw new TypeError(`${fn}: ${arg} must be a string, not ${describe(v)}`);
  if (!NAME_RE.test(v)) throw new RangeError(`${fn}: ${arg} ${JSON.stringify(v)} must be 1-128 characters of [A-Za-z0-9._:@-]`);
  return v;
}

export function checkString(fn, arg, v, { optional = false, nonEmpty = false } = {}) {
  if (v === undefined && optional) return undefined;
  if (typeof v !== 'string') throw new TypeError(`${fn}: ${arg} must be a string, not ${describe(v)}`);
  if (nonEmpty && v === '') throw new RangeError(`${fn}: ${arg} must not be empty`);
  return v;
}

export function checkObject(fn, arg, v, { optional = false } = {}) {
  if (v === undefined && optional) return {};
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new TypeError(`${fn}: ${arg} must be an object, not ${describe(v)}`);
  return v;
}

export function checkNumber(fn, arg, v, { optional = false, min = -Infinity, max = Infinity, integer = false, above } = {}) {
  if (v === undefined && optional) return undefined;
  if (typeof v !== 'number' || Number.isNaN(v)) throw new TypeError(`${fn}: ${arg} must be a number, not ${describe(v)}`);
  if (!Number.isFinite(v) || v < min || v > max || (above !== undefined && !(v > above)) || (integer && !Number.isInteger(v))) {
    const range = above !== undefined ? `> ${above}` : `${min}..${max}`;
    throw new RangeError(`${fn}: ${arg} must be ${integer ? 'an integer' : 'a finite number'} in ${range}, not ${v}`);
  }
  return v;
}

export function checkBool(fn, arg, v) {
  if (v === undefined) return false;
  if (typeof v !== 'boolean') throw new TypeError(`${fn}: ${arg} must be a boolean, not ${describe(v)}`);
  return v;
}

/** Seconds (a number) -> "Ns" as the JSON mapping wants. */
export function durationIn(fn, arg, seconds, { optional = true } = {}) {
  if (seconds === undefined || seconds === null) {
    if (optional) return undefined;
    throw new TypeError(`${fn}: ${arg} is required (seconds, a number)`);
  }
  if (typeof seconds !== 'number') throw new TypeError(`${fn}: ${arg} must be a number of seconds, not ${describe(seconds)}`);
  if (!Number.isFinite(seconds) || seconds < 0) throw new RangeError(`${fn}: ${arg} must be a finite number of seconds >= 0, not ${seconds}`);
  return secondsString(seconds);
}

export function secondsString(seconds) {
  let s = seconds.toFixed(9);
  s = s.replace(/\.?0+$/, '');
  return `${s}s`;
}

/** "1.5s" -> 1.5 (seconds); undefined/"" -> 0. */
export function durationOut(v) {
  if (v === undefined || v === null || v === '') return 0;
  if (typeof v === 'number') return v;
  const m = /^(-?\d+(?:\.\d+)?)s$/.exec(v);
  return m ? Number(m[1]) : NaN;
}

/** A 64-bit JSON value (string, number or absent) -> BigInt. */
export function u64(v) {
  if (v === undefined || v === null || v === '') return 0n;
  return BigInt(v);
}

/** A request's 64-bit value (BigInt, safe integer or decimal string) -> decimal string. */
export function u64In(fn, arg, v, { optional = true } = {}) {
  if (v === undefined || v === null) {
    if (optional) return undefined;
    throw new TypeError(`${fn}: ${arg} is required`);
  }
  let b;
  if (typeof v === 'bigint') b = v;
  else if (typeof v === 'number' && Number.isSafeInteger(v)) b = BigInt(v);
  else if (typeof v === 'string' && /^\d+$/.test(v)) b = BigInt(v);
  else throw new TypeError(`${fn}: ${arg} must be a BigInt, a safe integer or a decimal string, not ${describe(v)}`);
  if (b < 0n || b > 0xffffffffffffffffn) throw new RangeError(`${fn}: ${arg} must be in 0..2^64-1, not ${b}`);
  return b.toString();
}

export function tsOut(v) {
  return v ? new Date(v) : null;
}

export function memberOut(m = {}) {
  return {
    id: m.id ?? '',
    address: m.address ?? '',
    weight: m.weight ?? 0,
    zone: m.zone ?? '',
    metadata: m.metadata ?? {},
  };
}

export function memberIn(fn, m) {
  checkObject(fn, 'member', m);
  const out = { id: checkName(fn, 'member.id', m.id) };
  if (m.address !== undefined) out.address = checkString(fn, 'member.address', m.address);
  if (m.weight !== undefined) out.weight = checkNumber(fn, 'member.weight', m.weight, { min: 0, max: 1e6 });
  if (m.zone !== undefined) out.zone = checkString(fn, 'member.zone', m.zone);
  if (m.metadata !== undefined) {
    checkObject(fn, 'member.metadata', m.metadata);
    for (const [k, v] of Object.entries(m.metadata)) checkString(fn, `member.metadata[${JSON.stringify(k)}]`, v);
    out.metadata = m.metadata;
  }
  return out;
}

const MODES = {
  exclusive: 'KEYSPACE_MODE_EXCLUSIVE',
  stream: 'KEYSPACE_MODE_STREAM',
  KEYSPACE_MODE_UNSPECIFIED: 'KEYSPACE_MODE_UNSPECIFIED',
  KEYSPACE_MODE_EXCLUSIVE: 'KEYSPACE_MODE_EXCLUSIVE',
  KEYSPACE_MODE_STREAM: 'KEYSPACE_MODE_STREAM',
};

export function keyspaceIn(fn, k, { requireName = true } = {}) {
  checkObject(fn, 'keyspace', k);
  const out = {};
  if (requireName || k.name !== undefined) out.name = checkName(fn, 'keyspace.name', k.name);
  if (k.buckets !== undefined) out.buckets = checkNumber(fn, 'keyspace.buckets', k.buckets, { min: 0, max: 65536, integer: true });
  if (k.hash !== undefined) {
    checkString(fn, 'keyspace.hash', k.hash);
    if (!['', 'xxh64', 'synapse-sha256'].includes(k.hash)) throw new RangeError(`${fn}: keyspace.hash must be "xxh64" or "synapse-sha256", not ${JSON.stringify(k.hash)}`);
    out.hash = k.hash;
  }
  if (k.mode !== undefined) {
    if (typeof k.mode !== 'string' || !(k.mode in MODES)) throw new RangeError(`${fn}: keyspace.mode must be "exclusive" or "stream" (or a KEYSPACE_MODE_* name), not ${describe(k.mode)}`);
    out.mode = MODES[k.mode];
  }
  const lt = durationIn(fn, 'keyspace.leaseTtl', k.leaseTtl);
  if (lt !== undefined) out.leaseTtl = lt;
  const dt = durationIn(fn, 'keyspace.drainTimeout', k.drainTimeout);
  if (dt !== undefined) out.drainTimeout = dt;
  for (const key of Object.keys(k)) {
    if (!['name', 'buckets', 'hash', 'mode', 'leaseTtl', 'drainTimeout'].includes(key)) {
      throw new RangeError(`${fn}: keyspace.${key} is not a keyspace field (name, buckets, hash, mode, leaseTtl, drainTimeout)`);
    }
  }
  return out;
}

export function keyspaceOut(k = {}) {
  return {
    name: k.name ?? '',
    buckets: k.buckets ?? 0,
    hash: k.hash || 'xxh64',
    mode: k.mode ?? 'KEYSPACE_MODE_UNSPECIFIED',
    leaseTtl: durationOut(k.leaseTtl),
    drainTimeout: durationOut(k.drainTimeout),
  };
}

export function mapOut(m = {}) {
  const buckets = m.buckets ?? 0;
  let owners = m.owners ?? [];
  if (owners.length < buckets) owners = owners.concat(new Array(buckets - owners.length).fill(0));
  return {
    keyspace: m.keyspace ?? '',
    epoch: u64(m.epoch),
    buckets,
    hash: m.hash || 'xxh64',
    members: (m.members ?? []).map(memberOut),
    owners,
  };
}

export function hotKeyPoolIn(fn, p) {
  checkObject(fn, 'pool', p);
  const out = { name: checkName(fn, 'pool.name', p.name), threshold: checkNumber(fn, 'pool.threshold', p.threshold, { above: 0 }) };
  if (p.lowThreshold !== undefined) out.lowThreshold = checkNumber(fn, 'pool.lowThreshold', p.lowThreshold, { min: 0 });
  if (p.reportThreshold !== undefined) out.reportThreshold = checkNumber(fn, 'pool.reportThreshold', p.reportThreshold, { min: 0 });
  if (p.maxKeys !== undefined) out.maxKeys = checkNumber(fn, 'pool.maxKeys', p.maxKeys, { min: 0, max: 2048, integer: true });
  const c = durationIn(fn, 'pool.cooldown', p.cooldown);
  if (c !== undefined) out.cooldown = c;
  const a = durationIn(fn, 'pool.reportMaxAge', p.reportMaxAge);
  if (a !== undefined) out.reportMaxAge = a;
  return out;
}

export function hotKeyPoolOut(p = {}) {
  return {
    name: p.name ?? '',
    threshold: p.threshold ?? 0,
    lowThreshold: p.lowThreshold ?? 0,
    cooldown: durationOut(p.cooldown),
    reportThreshold: p.reportThreshold ?? 0,
    reportMaxAge: durationOut(p.reportMaxAge),
    maxKeys: p.maxKeys ?? 0,
  };
}

export function overflowSetOut(s = {}) {
  return {
    pool: s.pool ?? '',
    version: u64(s.version),
    keys: (s.keys ?? []).map((k) => ({ key: k.key ?? '', rate: k.rate ?? 0, since: tsOut(k.since), coolingSince: tsOut(k.coolingSince) })),
  };
}
