// Test support (not a test file): a real `keyshard serve`, a pausable TCP
// proxy, and a condition poller. KEYSHARD_BIN names the binary; without
// it the binary is built with `go build` from the repository root.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '../../..');

let built = null;
export function keyshardBin() {
  if (process.env.KEYSHARD_BIN) return process.env.KEYSHARD_BIN;
  if (built) return built;
  const dir = path.join(os.tmpdir(), `keyshard-node-tests-${process.getuid?.() ?? 0}`);
  fs.mkdirSync(dir, { recursive: true });
  const tmp = path.join(dir, `keyshard.${process.pid}.tmp`);
  execFileSync('go', ['build', '-o', tmp, './cmd/keyshard'], { cwd: repoRoot, stdio: ['ignore', 'ignore', 'inherit'] });
  const out = path.join(dir, 'keyshard');
  fs.renameSync(tmp, out); // atomic: concurrent test files never run a half-written binary
  built = out;
  return out;
}

/** startServer() -> {url, stop(), log()}: a fresh single-replica server on a loopback port. */
export async function startServer({ args = [], timeout = 60000 } = {}) {
  const bin = keyshardBin();
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'keyshard-node-data-'));
  const proc = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--data-dir', dataDir, '--replica', 'r1', '--log-level', 'info', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  const url = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`keyshard serve did not start within ${timeout} ms:\n${log}`)), timeout);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /msg="keyshard serving" listen=(\S+)/.exec(log);
      if (m) {
        clearTimeout(t);
        resolve(`http://${m[1]}`);
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(t);
      reject(new Error(`keyshard serve exited with ${code}:\n${log}`));
    });
  });
  proc.removeAllListeners('exit');
  return {
    url,
    log: () => log,
    async stop() {
      if (proc.exitCode === null) {
        const exited = new Promise((r) => proc.once('exit', r));
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(t);
      }
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/**
 * A TCP proxy to target (host:port) that can be paused: while paused it
 * forwards nothing (connections open meanwhile hang, as behind a cut
 * link); resume() drops those connections so that clients reconnect.
 */
export async function startProxy(targetURL) {
  const target = new URL(targetURL);
  const conns = new Set();
  let paused = false;
  let closed = false;
  const held = new Set();
  const server = net.createServer((client) => {
    client.on('error', () => {});
    if (closed) {
      client.destroy(); // accepted before close() but delivered after
      return;
    }
    if (paused) {
      held.add(client);
      client.pause();
      client.on('close', () => held.delete(client));
      return;
    }
    const up = net.connect(Number(target.port), target.hostname);
    up.on('error', () => client.destroy());
    client.on('error', () => up.destroy());
    client.pipe(up);
    up.pipe(client);
    const c = { client, up };
    conns.add(c);
    const drop = () => { conns.delete(c); client.destroy(); up.destroy(); };
    client.on('close', drop);
    up.on('close', drop);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    pause() {
      paused = true;
      for (const { client, up } of conns) {
        client.unpipe(up);
        up.unpipe(client);
        client.pause();
        up.pause();
        held.add(client);
        held.add(up);
      }
      conns.clear();
    },
    resume() {
      paused = false;
      for (const s of held) s.destroy();
      held.clear();
    },
    async close() {
      closed = true;
      for (const s of held) s.destroy();
      for (const { client, up } of conns) { client.destroy(); up.destroy(); }
      await new Promise((r) => server.close(r));
    },
  };
}

/** waitFor(cond, {timeout, what}) polls cond() (sync or async) until truthy. */
export async function waitFor(cond, { timeout = 30000, interval = 25, what = 'condition' } = {}) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, interval));
  }
}
