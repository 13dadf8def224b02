"""Test support: a real `keyshard serve` shared by the suite, and helpers."""
import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)            # clients/python
REPO = os.path.dirname(os.path.dirname(PYROOT))
sys.path.insert(0, PYROOT)

_lock = threading.Lock()
_server = None


def wait_for(cond, timeout=30.0, interval=0.02, what="condition"):
    """Polls cond() until it is truthy; fails the test after timeout."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError("timed out after %gs waiting for %s" % (timeout, what))
        time.sleep(interval)


def keyshard_bin():
    b = os.environ.get("KEYSHARD_BIN")
    if b:
        return b
    d = tempfile.mkdtemp(prefix="keyshard-bin-")
    out = os.path.join(d, "keyshard")
    r = subprocess.run(["go", "build", "-o", out, "./cmd/keyshard"], cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise RuntimeError("go build failed:\n" + r.stdout.decode(errors="replace"))
    os.environ["KEYSHARD_BIN"] = out
    atexit.register(shutil.rmtree, d, True)
    return out


class Server:
    """A `keyshard serve` on a loopback port with a temporary data dir;
    extra_args are more flags for serve."""

    def __init__(self, extra_args=()):
        self.dir = tempfile.mkdtemp(prefix="keyshard-py-test-")
        self.log_path = os.path.join(self.dir, "serve.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [keyshard_bin(), "serve", "--listen", "127.0.0.1:0", "--data-dir", os.path.join(self.dir, "data"),
             "--replica", "r1", "--log-level", "info", *extra_args],
            stdout=subprocess.DEVNULL, stderr=self._log)
        end = time.monotonic() + 60
        self.addr = None
        while time.monotonic() < end:
            with open(self.log_path, "rb") as f:
                m = re.search(rb'msg="keyshard serving" listen=(\S+)', f.read())
            if m:
                self.addr = m.group(1).decode()
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.addr is None:
            self.stop()
            with open(self.log_path, "rb") as f:
                raise RuntimeError("keyshard serve did not start:\n" + f.read().decode(errors="replace")[-3000:])
        self.url = "http://" + self.addr

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def server():
    """The suite's shared server (started on first use, stopped at exit)."""
    global _server
    with _lock:
        if _server is None:
            _server = Server()
            atexit.register(_server.stop)
        return _server


_n = [0]


def unique(prefix):
    with _lock:
        _n[0] += 1
        return "%s-%d-%d" % (prefix, os.getpid() % 10000, _n[0])


class Recorder:
    """A handler that records acquire/release with timestamps."""

    def __init__(self, name, log, lock, release_delay=0.0):
        self.name, self.log, self.lock = name, log, lock
        self.release_delay = release_delay
        self.held = {}

    def acquire(self, g):
        with self.lock:
            self.log.append((time.monotonic(), "acquire", self.name, g.bucket, g.token))
            self.held[g.bucket] = g

    def release(self, bucket, g):
        if self.release_delay and g.valid():
            time.sleep(self.release_delay)
        with self.lock:
            self.log.append((time.monotonic(), "release", self.name, bucket, g.token))
            self.held.pop(bucket, None)


def check_no_overlap(tc: unittest.TestCase, log):
    """No bucket held by two holders at once; tokens strictly increase."""
    by_bucket = {}
    for t, kind, who, b, tok in sorted(log, key=lambda r: r[0]):
        by_bucket.setdefault(b, []).append((t, kind, who, tok))
    for b, evs in by_bucket.items():
        holder = None
        last_tok = 0
        for t, kind, who, tok in evs:
            if kind == "acquire":
                tc.assertIsNone(holder, "bucket %d acquired by %s (token %d) while %s holds it" % (b, who, tok, holder))
                tc.assertGreater(tok, last_tok, "bucket %d: token %d after %d" % (b, tok, last_tok))
                holder, last_tok = (who, tok), tok
            else:
                tc.assertEqual(holder, (who, tok), "bucket %d released by %s/%d, held by %s" % (b, who, tok, holder))
                holder = None
