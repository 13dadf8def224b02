// tools/chaos-worker.mjs against a real server and a fenced sink.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client } from '../index.js';
import { startServer, waitFor } from '../testlib/server.mjs';

const script = path.join(path.dirname(fileURLToPath(import.meta.url)), '../tools/chaos-worker.mjs');

// A fenced sink as internal/chaos/sink.go: a write or an acquire claim
// with a token below the highest seen for its bucket is refused (409).
async function sink() {
  const recs = [];
  const highest = new Map();
  const srv = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      const r = JSON.parse(body);
      r.path = req.url;
      if ((req.url === '/write') !== (r.kind === 'write') || !r.worker) {
        res.writeHead(400).end('writes go to /write, events to /event, and both name their worker');
        return;
      }
      if (r.kind === 'write' || r.kind === 'acquire') {
        const t = BigInt(r.token);
        if (t < (highest.get(r.bucket) ?? 0n)) r.refused = true;
        else highest.set(r.bucket, t);
      }
      recs.push(r);
      res.writeHead(r.refused ? 409 : 204).end();
    });
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${srv.address().port}`, recs, close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(r); }) };
}

let server, s;
before(async () => {
  server = await startServer();
  s = await sink();
  const c = new Client(server.url);
  await c.createKeyspace({ name: 'chaos', buckets: 16, leaseTtl: 3, drainTimeout: 5 });
  await c.close();
});
after(async () => {
  await s?.close();
  await server?.stop();
});

function run(id, extra = []) {
  const p = spawn(process.execPath, [script, '--server', server.url, '--sink', s.url, '--keyspace', 'chaos', '--id', id, '--interval', '20ms', ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  p.stderrText = '';
  p.stderr.on('data', (d) => (p.stderrText += d));
  p.exited = new Promise((r) => p.on('exit', (code) => r(code)));
  return p;
}

test('chaos workers: acquire, write with tokens, hand over on SIGTERM (drain), exit 0', async () => {
  const w1 = run('n1');
  await waitFor(() => new Set(s.recs.filter((r) => r.kind === 'write' && r.worker === 'n1').map((r) => r.bucket)).size === 16, { what: 'n1 writing all 16 buckets' });
  const w2 = run('n2', ['--release-delay', '50ms']);
  await waitFor(() => s.recs.some((r) => r.kind === 'write' && r.worker === 'n2'), { what: 'n2 writing' });
  w1.kill('SIGTERM');
  assert.equal(await w1.exited, 0, w1.stderrText);
  await waitFor(() => new Set(s.recs.filter((r) => r.kind === 'acquire' && r.worker === 'n2').map((r) => r.bucket)).size === 16, { what: 'n2 acquiring all 16' });
  w2.kill('SIGTERM');
  assert.equal(await w2.exited, 0, w2.stderrText);

  const kinds = (id) => s.recs.filter((r) => r.worker === id && r.path === '/event').map((r) => r.kind);
  for (const id of ['n1', 'n2']) {
    const k = kinds(id);
    assert.ok(k.includes('joined') && k.includes('draining') && k.includes('left'), `${id}: ${k.join(',')}`);
  }
  const n1 = s.recs.filter((r) => r.worker === 'n1');
  assert.ok(n1.every((r) => r.pid > 0 && typeof r.token === 'string' && r.mono > 0));
  assert.ok(!s.recs.some((r) => r.refused), 'no write refused');
  assert.ok(!s.recs.some((r) => r.fenced), 'nothing fenced');
  // per bucket: an acquire only after the previous holder's release; writes only between them
  const holder = new Map();
  for (const r of s.recs) {
    if (r.kind === 'acquire') {
      assert.ok(!holder.has(r.bucket), `bucket ${r.bucket} acquired by ${r.worker} while ${holder.get(r.bucket)} holds it`);
      holder.set(r.bucket, r.worker);
    } else if (r.kind === 'release') {
      assert.equal(holder.get(r.bucket), r.worker);
      holder.delete(r.bucket);
    } else if (r.kind === 'write') {
      assert.equal(holder.get(r.bucket), r.worker, `write to ${r.bucket} by ${r.worker} not holding it`);
    }
  }
  assert.equal(holder.size, 0);
});

test('chaos worker: bad arguments exit non-zero with a clear message', async () => {
  const p = spawn(process.execPath, [script, '--id', 'x'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  p.stderr.on('data', (d) => (err += d));
  const code = await new Promise((r) => p.on('exit', r));
  assert.notEqual(code, 0);
  assert.match(err, /--server, --sink, --keyspace and --id are required/);
  const p2 = spawn(process.execPath, [script, '--server', 'http://x', '--sink', 'http://y', '--id', 'x', '--interval', '20 parsecs'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err2 = '';
  p2.stderr.on('data', (d) => (err2 += d));
  assert.notEqual(await new Promise((r) => p2.on('exit', r)), 0);
  assert.match(err2, /--interval "20 parsecs": not a duration/);
});

test('chaos worker: a drain that does not finish within --drain-timeout exits 2', async () => {
  const w = run('stuck', ['--block-release', '--drain-timeout', '1s']);
  await waitFor(() => s.recs.some((r) => r.kind === 'write' && r.worker === 'stuck'), { what: 'stuck writing' });
  w.kill('SIGTERM');
  assert.equal(await w.exited, 2, w.stderrText);
  assert.match(w.stderrText, /drain did not finish/);
  // stopped at the timeout: every bucket released as fenced, no write after its release
  const rel = s.recs.filter((r) => r.worker === 'stuck' && r.kind === 'release');
  assert.ok(rel.length > 0 && rel.every((r) => r.fenced), JSON.stringify(rel));
});
