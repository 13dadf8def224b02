// Errors: KeyshardError (code, message, details) and one subclass per
// server code; WrongOwner, decoded from (and encodable to) the
// keyshard.v1.WrongOwner protobuf detail.

export class KeyshardError extends Error {
  /**
   * @param {string} code  a Connect code: "invalid_argument", "not_found", ...
   * @param {string} message
   * @param {object[]} [details]  the answer's details, as sent
   */
  constructor(code, message, details = [], options = undefined) {
    super(message, options);
    this.name = 'KeyshardError';
    this.code = code;
    this.details = details;
  }
}

const byCode = new Map();
function define(name, code) {
  const cls = {
    [name]: class extends KeyshardError {
      constructor(message, details = [], options = undefined) {
        super(code, message, details, options);
        this.name = name;
      }
    },
  }[name];
  byCode.set(code, cls);
  return cls;
}

export const Canceled = define('Canceled', 'canceled');
export const Unknown = define('Unknown', 'unknown');
export const InvalidArgument = define('InvalidArgument', 'invalid_argument');
export const DeadlineExceeded = define('DeadlineExceeded', 'deadline_exceeded');
export const NotFound = define('NotFound', 'not_found');
export const AlreadyExists = define('AlreadyExists', 'already_exists');
export const PermissionDenied = define('PermissionDenied', 'permission_denied');
export const ResourceExhausted = define('ResourceExhausted', 'resource_exhausted');
export const FailedPrecondition = define('FailedPrecondition', 'failed_precondition');
export const Aborted = define('Aborted', 'aborted');
export const OutOfRange = define('OutOfRange', 'out_of_range');
export const Unimplemented = define('Unimplemented', 'unimplemented');
export const Internal = define('Internal', 'internal');
export const Unavailable = define('Unavailable', 'unavailable');
export const DataLoss = define('DataLoss', 'data_loss');
export const Unauthenticated = define('Unauthenticated', 'unauthenticated');

/**
 * NotGranted: client-side only (code "not_granted"). The map gives the
 * key's bucket to this worker but its grant has not arrived, its
 * handler's acquire has not returned, or the session is fencing.
 */
export class NotGranted extends KeyshardError {
  constructor(message) {
    super('not_granted', message);
    this.name = 'NotGranted';
  }
}

/** Closed: the Client, Router, Worker or HotKeys was closed (code "canceled"). */
export class Closed extends KeyshardError {
  constructor(message = 'keyshard: closed') {
    super('canceled', message);
    this.name = 'Closed';
  }
}

export const WRONG_OWNER_TYPE = 'keyshard.v1.WrongOwner';

/**
 * WrongOwner: a key's bucket belongs to another member. Retry at address
 * once your map has reached epoch. owner is "" when the bucket is
 * unassigned at epoch. Servers answer it as failed_precondition with a
 * keyshard.v1.WrongOwner detail; toConnectError() builds that answer.
 */
export class WrongOwner extends FailedPrecondition {
  constructor(bucket, owner = '', address = '', epoch = 0n, message = undefined) {
    if (!Number.isInteger(bucket) || bucket < 0 || bucket > 0xffffffff) {
      throw new RangeError(`WrongOwner: bucket must be an integer in 0..2^32-1, not ${bucket}`);
    }
    epoch = BigInt(epoch);
    const msg = message ?? (owner === ''
      ? `keyshard: wrong owner: bucket ${bucket} is unassigned at epoch ${epoch}`
      : `keyshard: wrong owner: bucket ${bucket} belongs to ${JSON.stringify(owner)} at ${JSON.stringify(address)} (epoch ${epoch})`);
    const o = { bucket, owner, address, epoch };
    super(msg, [{ type: WRONG_OWNER_TYPE, value: Buffer.from(encodeWrongOwner(o)).toString('base64'), debug: { ...o, epoch: String(epoch) } }]);
    this.name = 'WrongOwner';
    this.bucket = bucket;
    this.owner = owner;
    this.address = address;
    this.epoch = epoch;
  }

  /** The Connect JSON error body ({code, message, details}) for a server to answer a misrouted request with (HTTP 400, as Connect maps failed_precondition). */
  toConnectError() {
    return { code: this.code, message: this.message, details: this.details.map(({ type, value }) => ({ type, value })) };
  }
}

// --- a tiny protobuf codec for WrongOwner ---------------------------------

function readVarint(b, pos) {
  let i = pos, result = 0n, s = 0n;
  for (; i < b.length; i++) {
    const x = b[i];
    result |= BigInt(x & 0x7f) << s;
    s += 7n;
    if (x < 0x80) return [result & 0xffffffffffffffffn, i + 1];
    if (s > 63n + 7n) break;
  }
  throw new Error('truncated or overlong varint');
}

function writeVarint(out, v) {
  v = BigInt.asUintN(64, BigInt(v));
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
}

/** decodeWrongOwner(bytes) -> {bucket, owner, address, epoch} */
export function decodeWrongOwner(bytes) {
  const b = bytes instanceof Uint8Array ? bytes : Buffer.from(bytes, 'base64');
  const o = { bucket: 0, owner: '', address: '', epoch: 0n };
  const dec = new TextDecoder();
  let i = 0;
  while (i < b.length) {
    let tag;
    [tag, i] = readVarint(b, i);
    const field = Number(tag >> 3n), wire = Number(tag & 7n);
    if (wire === 0) {
      let v;
      [v, i] = readVarint(b, i);
      if (field === 1) o.bucket = Number(BigInt.asUintN(32, v));
      else if (field === 4) o.epoch = v;
    } else if (wire === 2) {
      let len;
      [len, i] = readVarint(b, i);
      const end = i + Number(len);
      if (end > b.length) throw new Error('truncated length-delimited field');
      if (field === 2) o.owner = dec.decode(b.subarray(i, end));
      else if (field === 3) o.address = dec.decode(b.subarray(i, end));
      i = end;
    } else if (wire === 1) {
      i += 8;
    } else if (wire === 5) {
      i += 4;
    } else {
      throw new Error(`unsupported wire type ${wire}`);
    }
  }
  if (i > b.length) throw new Error('truncated field');
  return o;
}

/** encodeWrongOwner({bucket, owner, address, epoch}) -> Uint8Array */
export function encodeWrongOwner({ bucket = 0, owner = '', address = '', epoch = 0n }) {
  const out = [];
  const enc = new TextEncoder();
  if (bucket) { out.push(0x08); writeVarint(out, bucket); }
  for (const [tag, s] of [[0x12, owner], [0x1a, address]]) {
    if (!s) continue;
    const bs = enc.encode(s);
    out.push(tag);
    writeVarint(out, bs.length);
    for (const x of bs) out.push(x);
  }
  if (BigInt(epoch) !== 0n) { out.push(0x20); writeVarint(out, epoch); }
  return Uint8Array.from(out);
}

/**
 * fromAnswer(status, body, url) turns a non-200 answer into a
 * KeyshardError subclass (WrongOwner when the detail says so).
 */
export function fromAnswer(status, text, url) {
  let body = null;
  try { body = JSON.parse(text); } catch { /* not JSON */ }
  let code = body && typeof body.code === 'string' ? body.code : codeOfStatus(status);
  const message = body && typeof body.message === 'string' ? body.message : `HTTP ${status} from ${url}: ${String(text).slice(0, 200)}`;
  const details = body && Array.isArray(body.details) ? body.details : [];
  for (const d of details) {
    if (d && (d.type === WRONG_OWNER_TYPE || d.type === 'type.googleapis.com/' + WRONG_OWNER_TYPE) && typeof d.value === 'string') {
      try {
        const o = decodeWrongOwner(Buffer.from(d.value, 'base64'));
        const e = new WrongOwner(o.bucket, o.owner, o.address, o.epoch, message);
        e.details = details;
        return e;
      } catch { /* fall through: a plain error */ }
    }
  }
  const cls = byCode.get(code);
  if (!cls) return new KeyshardError(code, message, details);
  return new cls(message, details);
}

function codeOfStatus(status) {
  switch (status) {
    case 400: return 'invalid_argument';
    case 401: return 'unauthenticated';
    case 403: return 'permission_denied';
    case 404: return 'unimplemented';
    case 408: return 'deadline_exceeded';
    case 409: return 'already_exists';
    case 412: return 'failed_precondition';
    case 429: return 'resource_exhausted';
    case 502: case 503: case 504: return 'unavailable';
    case 501: return 'unimplemented';
    default: return 'unknown';
  }
}

export function errorClassOf(code) { return byCode.get(code); }
