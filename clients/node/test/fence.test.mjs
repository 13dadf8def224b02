// Fencing logic with an injectable clock, and the Detector.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { Client, Worker, Lease, Grant, fenceMargin, Detector, NotGranted } from '../index.js';

function fakeClock(t = 1000) {
  return { t, now() { return this.t; }, advance(ms) { this.t += ms; } };
}

test('fence margin: max(TTL/10, 500 ms), at most TTL/2; an explicit margin is capped at TTL/2', () => {
  assert.equal(fenceMargin(10000), 1000);
  assert.equal(fenceMargin(3000), 500);
  assert.equal(fenceMargin(800), 400);
  assert.equal(fenceMargin(10000, 2000), 2000);
  assert.equal(fenceMargin(3000, 2000), 1500);
});

test('lease: deadline = send time of the newest acknowledged keep-alive + TTL − margin; void for good once passed', () => {
  const clk = fakeClock(0);
  const l = new Lease({ ttl: 3000, margin: 500, sent: 0, clock: clk });
  assert.equal(l.deadline, 2500);
  clk.advance(1000);
  // a keep-alive sent at 1000, acknowledged at 1900: the deadline counts from the send
  const sent = clk.now();
  clk.advance(900);
  assert.ok(l.renewed(sent, 3000));
  assert.equal(l.deadline, 3500);
  // the server says less time is left than the TTL: the deadline uses it
  assert.ok(l.renewed(clk.now(), 1200));
  assert.equal(l.deadline, 3500, 'a deadline never moves back');
  // an older keep-alive acknowledged late does not move it back either
  assert.ok(l.renewed(500, 3000));
  assert.equal(l.deadline, 3500);
  clk.t = 3499;
  assert.ok(l.valid());
  clk.t = 3500;
  assert.equal(l.valid(), false);
  // a renewal acknowledged after the deadline does not bring it back
  assert.equal(l.renewed(3400, 3000), false);
  clk.t = 0;
  assert.equal(l.valid(), false);
});

test('grant.valid() compares the clock with the fence deadline and aborts grant.signal', () => {
  const clk = fakeClock(0);
  const l = new Lease({ ttl: 3000, margin: 500, sent: 0, clock: clk });
  const ac = new AbortController();
  const g = new Grant({ bucket: 3, token: 7n, from: 0n }, 's', l, ac);
  assert.ok(g.valid());
  assert.equal(g.signal.aborted, false);
  clk.advance(2500);
  assert.equal(g.valid(), false);
  assert.ok(g.signal.aborted);
  assert.match(g.signal.reason.message, /lease deadline passed/);
});

// A fake control plane that grants bucket 0 and then acknowledges nothing
// more, for a Worker on a fake clock.
async function fakeServer() {
  const calls = [];
  const srv = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      const m = req.url.split('/').pop();
      calls.push(m);
      const send = (o) => { res.writeHead(200, { 'Content-Type': 'application/json' }); res.end(JSON.stringify(o)); };
      const ks = { name: 'k', buckets: 4, hash: 'xxh64', leaseTtl: '3s' };
      switch (m) {
        case 'Join': return send({ session: 'k/w/1', leaseTtl: '3s', keyspace: ks });
        case 'KeepAlive': return send({ ttl: '3s' });
        case 'GetGrants': {
          const b = JSON.parse(body);
          if (b.sinceRevision === '0') return send({ grants: [{ bucket: 0, token: '5' }], revision: '2', epoch: '1' });
          return; // hang: the long poll answers nothing
        }
        case 'GetMap': {
          const b = JSON.parse(body);
          if (!b.sinceEpoch || b.sinceEpoch === '0') return send({ map: { keyspace: 'k', epoch: '1', buckets: 4, members: [{ id: 'w', address: 'a' }, { id: 'x', address: 'b' }], owners: [1, 2, 2, 2] }, changed: true });
          return;
        }
        default: return send({});
      }
    });
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${srv.address().port}`, calls, close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(r); }) };
}

test('a worker resumed past its fence deadline stops at once, before any timer ran', async () => {
  const f = await fakeServer();
  const c = new Client(f.url);
  const clk = fakeClock(10000);
  let acquired = null;
  const released = [];
  const w = new Worker(c, 'k', { id: 'w', address: 'a', clock: clk }, {
    acquire(g) { acquired = g; },
    release(b, g) { released.push([b, g.valid()]); },
  });
  try {
    await w.start();
    while (!acquired || w.held().length === 0 || !w.router.map) await new Promise((r) => setTimeout(r, 5));
    assert.equal(acquired.bucket, 0);
    assert.equal(acquired.token, 5n);
    const key0 = findKey(w, 0), key1 = findKey(w, 1);
    assert.equal(w.owns(key0), acquired);
    assert.throws(() => w.owns(key1), { name: 'WrongOwner', owner: 'x', address: 'b', bucket: 1, epoch: 1n });
    assert.ok(acquired.valid());
    // the process "pauses" past its deadline: the clock jumps, no timer has run
    clk.advance(60000);
    assert.equal(acquired.valid(), false);
    assert.ok(acquired.signal.aborted);
    assert.deepEqual(w.held(), []);
    assert.throws(() => w.owns(key0), NotGranted);
  } finally {
    await w.close({ timeout: 2 }).catch(() => {});
    await c.close();
    await f.close();
  }
  assert.deepEqual(released, [[0, false]], 'release() was called once, with the grant no longer valid');
});

function findKey(w, b) {
  for (let i = 0; ; i++) if (w.bucket(`key-${i}`) === b) return `key-${i}`;
}

test('Detector: bounded memory, heavy hitters found, decayed rates, a key seen once never reported', () => {
  const clk = fakeClock(0);
  const d = new Detector({ capacity: 16, halfLife: 1, clock: clk });
  for (let s = 0; s < 50; s++) {
    for (let i = 0; i < 100; i++) {
      d.observe('hot');
      d.observe(`fresh-${s}-${i}`); // a new key every time
    }
    clk.advance(100); // 1000 messages/s of "hot"
  }
  assert.equal(d.size, 16);
  const top = d.top(100);
  assert.equal(top[0].key, 'hot');
  assert.ok(top[0].rate > 800 && top[0].rate < 1300, `rate ${top[0].rate}`);
  assert.ok(top.every((k) => k.key === 'hot'), JSON.stringify(top.map((k) => k.key)));
  // decay: two half-lives later, a quarter
  const r = d.rate('hot');
  clk.advance(2000);
  assert.ok(Math.abs(d.rate('hot') - r / 4) < 1e-6 * r);
  // long idle periods renormalize without losing the order
  clk.advance(1e7);
  d.observe('late', 5);
  assert.equal(d.top(0)[0].key, 'late');
});
