// examples/node-ingest against a real server: one very hot key ends up in
// the overflow partition, and no other key does; every event is counted.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, repoRoot } from '../testlib/server.mjs';

let server;
before(async () => { server = await startServer(); });
after(async () => { await server?.stop(); });

test('node-ingest routes a very hot key to its overflow partition, keyed, and nothing else', async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'node-ingest-'));
  const p = spawn(process.execPath, [
    path.join(repoRoot, 'examples/node-ingest/ingest.mjs'), '--server', server.url, '--pool', 'ingest-example',
    '--threshold', '300', '--rate', '1500', '--hot-share', '0.5', '--hot-key', 'phc_demo:user-hot', '--out', out,
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  p.stderr.on('data', (d) => (stderr += d));
  const lines = [];
  let buf = '';
  let overflowSeconds = 0;
  const exited = new Promise((r) => p.on('exit', r));
  // stop it once the hot key has gone to overflow for two summaries (or give up after 60 s)
  await new Promise((resolve) => {
    const giveUp = setTimeout(resolve, 60000);
    p.stdout.on('data', (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = JSON.parse(buf.slice(0, i));
        buf = buf.slice(i + 1);
        lines.push(line);
        if (line.overflow > 0 && ++overflowSeconds >= 2) {
          clearTimeout(giveUp);
          resolve();
        }
      }
    });
  });
  p.kill('SIGTERM');
  assert.equal(await exited, 0, stderr);
  for (const l of buf.split('\n').filter(Boolean)) lines.push(JSON.parse(l));
  const final = lines.find((l) => l.final);
  assert.ok(final, `no final summary: ${JSON.stringify(lines)}\n${stderr}`);
  assert.ok(final.overflow > 0, `nothing went to overflow: ${JSON.stringify(lines)}\n${stderr}`);
  assert.equal(final.produced, final.main + final.overflow);
  assert.deepEqual(final.overflowSet, ['phc_demo:user-hot']);

  let overflowLines = 0, mainLines = 0;
  for (const f of fs.readdirSync(out)) {
    const recs = fs.readFileSync(path.join(out, f), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
    if (f.startsWith('overflow-')) {
      overflowLines += recs.length;
      assert.ok(recs.every((r) => r.key === 'phc_demo:user-hot'), `${f} holds another key`);
    } else {
      mainLines += recs.length;
    }
  }
  assert.equal(overflowLines, final.overflow);
  assert.equal(mainLines, final.main, 'every event is in a file');
  fs.rmSync(out, { recursive: true, force: true });
});
