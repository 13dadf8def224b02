import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import {
  Client, KeyshardError, InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, PermissionDenied, Unauthenticated,
  Unavailable, DeadlineExceeded, ResourceExhausted, Unimplemented, Internal, Aborted, WrongOwner, decodeWrongOwner, encodeWrongOwner,
  Router, Worker, HotKeys, Detector,
} from '../index.js';

// A fake server answering canned errors: path -> [status, body].
async function fake(routes) {
  const seen = [];
  const srv = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      seen.push({ path: req.url, body, auth: req.headers.authorization });
      const r = routes(req.url, body);
      if (r === 'hang') return; // never answers
      const [status, out] = r;
      res.writeHead(status, { 'Content-Type': 'application/json' });
      res.end(typeof out === 'string' ? out : JSON.stringify(out));
    });
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${srv.address().port}`, seen,
    close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(r); }),
  };
}

test('every error code decodes to its class, with code, message and details', async () => {
  const codes = {
    invalid_argument: InvalidArgument, not_found: NotFound, already_exists: AlreadyExists, failed_precondition: FailedPrecondition,
    permission_denied: PermissionDenied, unauthenticated: Unauthenticated, unavailable: Unavailable, deadline_exceeded: DeadlineExceeded,
    resource_exhausted: ResourceExhausted, unimplemented: Unimplemented, internal: Internal, aborted: Aborted,
  };
  let current = '';
  const f = await fake(() => [400, { code: current, message: `msg ${current}`, details: [{ type: 'x.Y', value: '' }] }]);
  const c = new Client(f.url, { timeout: 5 });
  try {
    for (const [code, cls] of Object.entries(codes)) {
      current = code;
      const err = await c.getKeyspace('k').then(() => null, (e) => e);
      assert.ok(err instanceof cls, `${code}: got ${err?.name}`);
      assert.ok(err instanceof KeyshardError);
      assert.equal(err.code, code);
      assert.equal(err.message, `msg ${code}`);
      assert.deepEqual(err.details, [{ type: 'x.Y', value: '' }]);
    }
  } finally {
    await c.close();
    await f.close();
  }
});

test('a WrongOwner detail decodes to WrongOwner; apps construct and encode it', async () => {
  const wo = new WrongOwner(17, 'writer-2', '10.0.0.2:9000', 12345678901234567890n);
  assert.ok(wo instanceof FailedPrecondition);
  assert.equal(wo.code, 'failed_precondition');
  assert.deepEqual(decodeWrongOwner(wo.details[0].value), { bucket: 17, owner: 'writer-2', address: '10.0.0.2:9000', epoch: 12345678901234567890n });
  // bytes as protoc would encode them: 08 11 12 01 61 1a 01 62 20 05
  assert.deepEqual([...encodeWrongOwner({ bucket: 17, owner: 'a', address: 'b', epoch: 5n })], [0x08, 0x11, 0x12, 0x01, 0x61, 0x1a, 0x01, 0x62, 0x20, 0x05]);
  const f = await fake(() => [400, wo.toConnectError()]);
  const c = new Client(f.url);
  try {
    const err = await c.lookup('k', ['a']).then(() => null, (e) => e);
    assert.ok(err instanceof WrongOwner, err?.name);
    assert.equal(err.bucket, 17);
    assert.equal(err.owner, 'writer-2');
    assert.equal(err.address, '10.0.0.2:9000');
    assert.equal(err.epoch, 12345678901234567890n);
  } finally {
    await c.close();
    await f.close();
  }
});

test('bad input rejects with TypeError/RangeError naming the argument, before any IO', async () => {
  const f = await fake(() => [200, {}]);
  const c = new Client(f.url, { token: 't0k' });
  try {
    await assert.rejects(c.createKeyspace({ name: 'k', buckets: 'many' }), { name: 'TypeError', message: /keyspace\.buckets/ });
    await assert.rejects(c.createKeyspace({ name: 'k', buckets: 70000 }), { name: 'RangeError', message: /keyspace\.buckets/ });
    await assert.rejects(c.createKeyspace({ name: 'k', bucket: 8 }), { name: 'RangeError', message: /keyspace\.bucket is not a keyspace field/ });
    await assert.rejects(c.createKeyspace({ name: 'k', leaseTtl: '10s' }), { name: 'TypeError', message: /keyspace\.leaseTtl must be a number of seconds/ });
    await assert.rejects(c.createKeyspace({ name: 'k', leaseTtl: -1 }), { name: 'RangeError', message: /keyspace\.leaseTtl/ });
    await assert.rejects(c.createKeyspace({ buckets: 8 }), { name: 'TypeError', message: /keyspace\.name/ });
    await assert.rejects(c.createKeyspace({ name: 'bad name!' }), { name: 'RangeError', message: /keyspace\.name/ });
    await assert.rejects(c.getKeyspace(), { name: 'TypeError', message: /getKeyspace: name/ });
    await assert.rejects(c.getMap('k', { sinceEpoch: -1 }), { name: 'RangeError', message: /sinceEpoch/ });
    await assert.rejects(c.getMap('k', { wait: 'soon' }), { name: 'TypeError', message: /wait/ });
    await assert.rejects(c.lookup('k', 'a'), { name: 'TypeError', message: /keys must be an array/ });
    await assert.rejects(c.lookup('k', ['a', 3]), { name: 'TypeError', message: /keys\[1\]/ });
    await assert.rejects(c.drainMember('k'), { name: 'TypeError', message: /member/ });
    await assert.rejects(c.putHotKeyPool({ name: 'p', threshold: 0 }), { name: 'RangeError', message: /pool\.threshold/ });
    await assert.rejects(c.reportHotKeys('p', 'prod', [{ key: 'a', rate: -1 }]), { name: 'RangeError', message: /keys\[0\]\.rate/ });
    await assert.rejects(c.call('AdminService', 'Status', 'x'), { name: 'TypeError', message: /body/ });
    assert.throws(() => new Client(''), { name: 'RangeError', message: /names no replica/ });
    assert.throws(() => new Client('ftp://x'), { name: 'RangeError', message: /scheme/ });
    assert.throws(() => new Client(f.url, { timeout: 0 }), { name: 'RangeError', message: /options\.timeout/ });
    assert.throws(() => new Client(f.url, { tokn: 'x' }), { name: 'RangeError', message: /unknown option "tokn"/ });
    assert.throws(() => new Router(c, ''), { name: 'RangeError', message: /keyspace/ });
    assert.throws(() => new Router({}, 'k'), { name: 'TypeError', message: /client must be a Client/ });
    const h = { acquire() {}, release() {} };
    assert.throws(() => new Worker(c, 'k', { address: 'a' }, h), { name: 'TypeError', message: /member\.id/ });
    assert.throws(() => new Worker(c, 'k', { id: 'w', weight: -1 }, h), { name: 'RangeError', message: /member\.weight/ });
    assert.throws(() => new Worker(c, 'k', { id: 'w', fenceMargin: 0 }, h), { name: 'RangeError', message: /fenceMargin/ });
    assert.throws(() => new Worker(c, 'k', { id: 'w' }, { acquire() {} }), { name: 'TypeError', message: /handler\.release/ });
    assert.throws(() => new HotKeys(c, { pool: 'p', producer: 'x', report: 5 }), { name: 'TypeError', message: /options\.report/ });
    assert.throws(() => new Detector({ capacity: 0 }), { name: 'RangeError', message: /capacity/ });
    assert.equal(f.seen.length, 0, 'no request was sent');
    await c.status();
    assert.equal(f.seen[0].auth, 'Bearer t0k');
    assert.equal(f.seen[0].path, '/keyshard.v1.AdminService/Status');
  } finally {
    await c.close();
    await f.close();
  }
});

test('an unreachable server rejects with Unavailable naming the URL, within the timeout', async () => {
  const c = new Client('http://127.0.0.1:9', { timeout: 2 });
  const t0 = Date.now();
  const err = await c.status().then(() => null, (e) => e);
  assert.ok(err instanceof Unavailable, err?.name);
  assert.match(err.message, /127\.0\.0\.1:9/);
  assert.ok(Date.now() - t0 < 2500);
  // a server that never answers: Unavailable at the timeout, not a hang
  const f = await fake(() => 'hang');
  const c2 = new Client(f.url, { timeout: 0.5 });
  const t1 = Date.now();
  const err2 = await c2.status().then(() => null, (e) => e);
  assert.ok(err2 instanceof Unavailable, err2?.name);
  assert.match(err2.message, new RegExp(`${f.url.replace(/[.:/]/g, (m) => '\\' + m)} did not answer`));
  assert.ok(Date.now() - t1 < 2000, `took ${Date.now() - t1} ms`);
  await c2.close();
  await f.close();
});

test('calls move to the next replica on unavailable, a timeout or a connection error, and stay there', async () => {
  const down = await fake(() => [503, { code: 'unavailable', message: 'etcd unreachable' }]);
  const hang = await fake(() => 'hang');
  const up = await fake(() => [200, { replica: 'r2', leader: 'r2' }]);
  const c = new Client([down.url, 'http://127.0.0.1:9', hang.url, up.url], { timeout: 5, replicaTimeout: 0.3 });
  try {
    const s = await c.status();
    assert.equal(s.replica, 'r2');
    assert.equal(down.seen.length, 1);
    assert.equal(hang.seen.length, 1);
    await c.status();
    assert.equal(down.seen.length, 1, 'the answering replica is preferred next');
    assert.equal(up.seen.length, 2);
    // a refusal other than unavailable does not move on
    const bad = await fake(() => [400, { code: 'invalid_argument', message: 'no' }]);
    const c2 = new Client([bad.url, up.url]);
    await assert.rejects(c2.status(), InvalidArgument);
    assert.equal(up.seen.length, 2);
    await c2.close();
    await bad.close();
  } finally {
    await c.close();
    await Promise.all([down.close(), hang.close(), up.close()]);
  }
});

test('every replica failing rejects with Unavailable naming each', async () => {
  const c = new Client('http://127.0.0.1:9,http://127.0.0.1:7', { timeout: 2 });
  const err = await c.listKeyspaces().then(() => null, (e) => e);
  assert.ok(err instanceof Unavailable);
  assert.match(err.message, /all 2 replicas failed/);
  assert.match(err.message, /127\.0\.0\.1:9/);
  assert.match(err.message, /127\.0\.0\.1:7/);
});

test('a long poll at a replica that calls moved away from is re-sent to the new one', async () => {
  // a: long polls hang, other calls answer unavailable; b: answers everything
  const a = await fake((p) => (p.endsWith('/GetMap') ? 'hang' : [503, { code: 'unavailable', message: 'cut off' }]));
  const b = await fake((p) => (p.endsWith('/GetMap') ? [200, { map: { keyspace: 'k', epoch: '7', buckets: 1 }, changed: true }] : [200, {}]));
  const c = new Client([a.url, b.url], { timeout: 60, replicaTimeout: 30 });
  try {
    const t0 = Date.now();
    const poll = c.getMap('k', { sinceEpoch: 6, wait: 30 });
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(a.seen.filter((x) => x.path.endsWith('/GetMap')).length, 1);
    await c.status(); // fails at a, answered by b: calls move to b
    const r = await poll;
    assert.equal(r.map.epoch, 7n);
    assert.ok(Date.now() - t0 < 5000, `the long poll took ${Date.now() - t0} ms`);
    assert.equal(b.seen.filter((x) => x.path.endsWith('/GetMap')).length, 1);
  } finally {
    await c.close();
    await Promise.all([a.close(), b.close()]);
  }
});
