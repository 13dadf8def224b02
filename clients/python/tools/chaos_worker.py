#!/usr/bin/env python3
"""A chaos worker: one keyshard.Worker that reports grants and releases to
a fenced sink and writes to it for every bucket it holds, passing the
grant's fencing token. Same CLI and behaviour as `keyshard chaos worker`.

    python3 clients/python/tools/chaos_worker.py --server URL[,URL...] \
        --sink URL --keyspace K --id ID [--interval 20ms] [--release-delay 0s] \
        [--drain-timeout 30s] [--replace] [--block-release] [--log-level info]

On SIGTERM/SIGINT it posts "draining", leaves gracefully (bounded by
--drain-timeout) and exits 0, or 2 if the drain timed out.
"""
import argparse
import http.client
import json
import logging
import os
import queue
import re
import signal
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import keyshard  # noqa: E402

log = logging.getLogger("chaos-worker")

_DUR = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(s: str) -> float:
    """A Go duration ("20ms", "1.5s", "2m", "1m30s", "0") in seconds."""
    s = s.strip()
    if s in ("0", ""):
        return 0.0
    pos, total = 0, 0.0
    for m in _DUR.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise argparse.ArgumentTypeError("%r is not a duration (want e.g. 20ms, 1.5s, 2m)" % s)
    return total


def mono_ns() -> int:
    """The machine's monotonic clock (CLOCK_MONOTONIC) in ns: the clock of
    every worker's records, whatever its language."""
    return time.monotonic_ns()


class Sink:
    """Posts records to the sink; one keep-alive connection per thread."""

    def __init__(self, url: str, worker: str) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError("--sink: %r is not an http:// URL" % url)
        self.host, self.port, self.base = u.hostname, u.port or 80, u.path.rstrip("/")
        self.worker, self.pid = worker, os.getpid()
        self._local = threading.local()
        # grants whose release() returned, carried on the next post
        self._rl = threading.Lock()
        self._released: list = []
        self.queue: "queue.Queue" = queue.Queue(maxsize=1024)
        self._qt = threading.Thread(target=self._drain_queue, daemon=True, name="sink-events")
        self._qt.start()

    def post(self, path: str, rec: dict) -> int:
        """Sends one record; returns the sink's status (0 if unreachable)."""
        rec["worker"], rec["pid"] = self.worker, self.pid
        with self._rl:
            if self._released:
                rec["released"], self._released = self._released, []
        rec.setdefault("mono", mono_ns())
        if "token" in rec:
            rec["token"] = str(rec["token"])
        body = json.dumps(rec).encode()
        for attempt in (0, 1):
            c = getattr(self._local, "c", None)
            if c is None:
                c = self._local.c = http.client.HTTPConnection(self.host, self.port, timeout=5)
            try:
                c.request("POST", self.base + path, body=body, headers={"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                return r.status
            except (OSError, http.client.HTTPException) as ex:
                c.close()
                self._local.c = None
                if attempt:
                    log.warning("report to the sink failed: kind=%s err=%s", rec.get("kind"), ex)
        return 0

    def released(self, bucket: int, token: int) -> None:
        """Notes that release() of a grant returned; the next post carries it."""
        with self._rl:
            self._released.append({"bucket": bucket, "token": str(token), "mono": mono_ns()})

    def event(self, rec: dict) -> None:
        """Queues a lifecycle event (never blocks the library)."""
        rec.setdefault("mono", mono_ns())
        try:
            self.queue.put_nowait(rec)
        except queue.Full:
            log.warning("event queue full; dropping %s", rec.get("kind"))

    def _drain_queue(self) -> None:
        while True:
            rec = self.queue.get()
            if rec is None:
                return
            self.post("/event", rec)

    def flush(self) -> None:
        self.queue.put(None)
        self._qt.join(10)


class BucketWork:
    """One grant's writes: due at next_at, until stopped."""

    def __init__(self, grant: keyshard.Grant, next_at: float) -> None:
        self.grant = grant
        self.next_at = next_at
        self.n = 0
        self.stopped = False   # write no more (release, refused write, fence)
        self.writing = False   # a write is in flight
        self.done = threading.Event()  # stopped and no write in flight


class Handler:
    """Writes every held bucket every interval from one writer thread (a
    thread per bucket would have tens of threads contend for the
    interpreter lock with the library's own), and reports acquires and
    releases to the sink."""

    def __init__(self, sink: Sink, interval: float, release_delay: float, block_release: bool) -> None:
        self.sink = sink
        self.interval = interval
        self.release_delay = release_delay
        self.block_release = block_release
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)
        self.buckets = {}
        threading.Thread(target=self._writer, daemon=True, name="writer").start()

    def acquire(self, g: keyshard.Grant) -> None:
        if self.sink.post("/event", {"kind": "acquire", "bucket": g.bucket, "token": g.token}) == 409:
            log.error("the sink refused the claim of a new grant: bucket=%d token=%d", g.bucket, g.token)
        with self.cv:
            self.buckets[g.bucket] = BucketWork(g, time.monotonic() + self.interval)
            self.cv.notify()

    def _writer(self) -> None:
        while True:
            with self.cv:
                while True:
                    now = time.monotonic()
                    due = [bw for bw in self.buckets.values() if not bw.stopped and bw.next_at <= now]
                    if due:
                        break
                    waiting = [bw.next_at for bw in self.buckets.values() if not bw.stopped]
                    self.cv.wait(min(waiting) - now if waiting else None)
                for bw in due:
                    bw.writing = True
                    bw.next_at += self.interval
                    if bw.next_at < now:
                        bw.next_at = now + self.interval
            for bw in due:
                g = bw.grant
                refused = False
                if g.valid():  # right before each write
                    bw.n += 1
                    refused = self.sink.post("/write", {"kind": "write", "bucket": g.bucket, "token": g.token, "n": bw.n}) == 409
                    if refused:
                        log.warning("write refused: a newer owner exists; stopping bucket=%d token=%d", g.bucket, g.token)
                with self.cv:
                    bw.writing = False
                    if refused or not g.valid():
                        bw.stopped = True
                    if bw.stopped:
                        bw.done.set()

    def _stop(self, bw: BucketWork) -> None:
        """Stops bw's writes and returns once none is in flight."""
        with self.cv:
            bw.stopped = True
            if self.buckets.get(bw.grant.bucket) is bw:
                del self.buckets[bw.grant.bucket]
            if not bw.writing:
                bw.done.set()
        bw.done.wait()

    def release(self, bucket: int, g: keyshard.Grant) -> None:
        with self.lock:
            bw = self.buckets.get(bucket)  # it keeps writing until _stop
        if bw is None:
            self.sink.post("/event", {"kind": "release", "bucket": bucket, "err": "Release without a preceding Acquire"})
            return
        fenced = not bw.grant.valid()
        rec = {"kind": "releasing", "bucket": bucket, "token": bw.grant.token}
        if fenced:
            rec["fenced"] = True
        self.sink.post("/event", rec)
        if not fenced and self.block_release:
            log.warning("Release is stuck until the grant is cancelled: bucket=%d", bucket)
            bw.grant.cancelled.wait()
        if not fenced and self.release_delay > 0:
            bw.grant.cancelled.wait(self.release_delay)
        self._stop(bw)
        rec = {"kind": "release", "bucket": bucket, "token": bw.grant.token}
        if fenced or not bw.grant.valid():
            rec["fenced"] = True
        self.sink.post("/event", rec)


KINDS = {"joined": "joined", "fenced": "fenced", "session-lost": "session-lost",
         "rejoined": "rejoined", "left": "left"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Keyshard chaos worker (Python client)")
    p.add_argument("--server", default="", help="Keyshard server URL(s), comma-separated")
    p.add_argument("--sink", default="", help="fenced sink URL")
    p.add_argument("--keyspace", default="chaos", help="keyspace to join")
    p.add_argument("--id", default="", help="member id")
    p.add_argument("--interval", type=go_duration, default=0.02, help="time between two writes of one held bucket")
    p.add_argument("--release-delay", type=go_duration, default=0.0, help="how long a handoff's release keeps writing")
    p.add_argument("--block-release", action="store_true", help="a handoff's release hangs until the grant is cancelled")
    p.add_argument("--drain-timeout", type=go_duration, default=30.0, help="how long the graceful leave may take")
    p.add_argument("--replace", action="store_true", help="take over the member id from a live session")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warn", "error"])
    a = p.parse_args(argv)
    level = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}[a.log_level]
    logging.basicConfig(stream=sys.stderr, level=level,
                        format="time=%(asctime)s level=%(levelname)s worker=" + (a.id or "?") + " msg=%(message)s")
    if not a.server or not a.sink or not a.id or not a.keyspace or a.interval <= 0:
        print("chaos worker: --server, --sink, --keyspace and --id are required and --interval must be positive",
              file=sys.stderr)
        return 1
    if a.drain_timeout <= 0:
        a.drain_timeout = 30.0
    try:
        sink = Sink(a.sink, a.id)
        client = keyshard.Client(a.server)
    except (ValueError, TypeError) as ex:
        print("chaos worker: %s" % ex, file=sys.stderr)
        return 1

    def on_event(ev: keyshard.Event) -> None:
        if ev.kind == "released" and ev.grant is not None:
            sink.released(ev.grant.bucket, ev.grant.token)
            return
        kind = KINDS.get(ev.kind)
        if kind is None:
            return
        rec = {"kind": kind, "session": ev.session}
        if ev.err is not None:
            rec["err"] = str(ev.err)
        sink.event(rec)

    h = Handler(sink, a.interval, a.release_delay, a.block_release)
    w = keyshard.Worker(client, a.keyspace, a.id, h, address="pid-%d" % os.getpid(),
                        replace=a.replace, on_event=on_event)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    w.start()
    while not stop.wait(0.2):
        if w.wait(0):
            print("chaos worker: the worker stopped by itself: %s" % w.error, file=sys.stderr)
            sink.flush()
            return 1
    log.info("stopping: draining")
    sink.post("/event", {"kind": "draining"})
    ok = w.close(a.drain_timeout)
    sink.flush()
    client.close()
    if not ok:
        log.error("drain did not finish within %gs", a.drain_timeout)
        return 2
    log.info("drained; exiting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
