#!/usr/bin/env python3
"""A Synapse-style event writer on Keyshard (Python client, stdlib only).

Each writer process owns the rooms whose bucket (room id -> bucket, with
the keyspace's hash) it is granted, generates events for them, and writes
them to SQLite fenced by the grant's token:

    UPDATE rooms SET last_seq = last_seq + 1, fence = ?, writer = ?
     WHERE room_id = ? AND fence <= ?        -- 0 rows: a newer owner exists; stop

Run two of them against one server and watch rooms move between them:

    go run ./cmd/keyshard serve --data-dir ./keyshard-data &
    python3 examples/python-event-writer/writer.py --server http://127.0.0.1:7400 --id writer-1
    python3 examples/python-event-writer/writer.py --server http://127.0.0.1:7400 --id writer-2

Ctrl-C (or SIGTERM) hands the writer's rooms over gracefully and exits.
"""
import argparse
import logging
import os
import random
import signal
import sqlite3
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))

import keyshard  # noqa: E402

log = logging.getLogger("event-writer")

SCHEMA = """
CREATE TABLE IF NOT EXISTS rooms (
  room_id  TEXT PRIMARY KEY,
  fence    INTEGER NOT NULL DEFAULT 0,
  last_seq INTEGER NOT NULL DEFAULT 0,
  writer   TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS events (
  room_id TEXT NOT NULL,
  seq     INTEGER NOT NULL,
  writer  TEXT NOT NULL,
  fence   INTEGER NOT NULL,
  body    TEXT NOT NULL,
  PRIMARY KEY (room_id, seq)
);
"""


def open_db(path):
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA busy_timeout=30000")
    return db


def write_event(db, room, writer, fence, body):
    """Appends one event to room, fenced: False if a newer owner exists."""
    db.execute("BEGIN IMMEDIATE")
    try:
        cur = db.execute("UPDATE rooms SET last_seq = last_seq + 1, fence = ?, writer = ? "
                         "WHERE room_id = ? AND fence <= ?", (fence, writer, room, fence))
        if cur.rowcount == 0:
            db.execute("ROLLBACK")
            return False
        seq = db.execute("SELECT last_seq FROM rooms WHERE room_id = ?", (room,)).fetchone()[0]
        db.execute("INSERT INTO events (room_id, seq, writer, fence, body) VALUES (?, ?, ?, ?, ?)",
                   (room, seq, writer, fence, body))
        db.execute("COMMIT")
        return True
    except BaseException:
        db.execute("ROLLBACK")
        raise


class RoomWriter:
    """The Worker's handler: one generator thread per held bucket."""

    def __init__(self, args, rooms_by_bucket):
        self.args = args
        self.rooms_by_bucket = rooms_by_bucket
        self.lock = threading.Lock()
        self.running = {}   # bucket -> (stop event, thread)
        self.written = 0

    def acquire(self, grant):
        rooms = self.rooms_by_bucket.get(grant.bucket, [])
        if not rooms:
            return
        stop = threading.Event()
        t = threading.Thread(target=self.generate, args=(grant, rooms, stop), daemon=True)
        with self.lock:
            self.running[grant.bucket] = (stop, t)
        t.start()

    def release(self, bucket, grant):
        with self.lock:
            st = self.running.pop(bucket, None)
        if st is not None:
            st[0].set()
            st[1].join()  # no write of the grant is in flight once release returns

    def generate(self, grant, rooms, stop):
        db = open_db(self.args.db)
        try:
            while not stop.wait(random.uniform(0.5, 1.5) * self.args.interval):
                if not grant.valid():      # fence deadline passed or grant cancelled: stop at once
                    return
                room = random.choice(rooms)
                body = "event from %s at token %d" % (self.args.id, grant.token)
                if not write_event(db, room, self.args.id, grant.token, body):
                    log.warning("room %s: a newer owner exists (token > %d); stopping bucket %d",
                                room, grant.token, grant.bucket)
                    return
                with self.lock:
                    self.written += 1
        finally:
            db.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="http://127.0.0.1:7400", help="Keyshard URL(s), comma-separated")
    p.add_argument("--id", required=True, help="this writer's member id")
    p.add_argument("--keyspace", default="rooms")
    p.add_argument("--buckets", type=int, default=256, help="buckets, if the keyspace is created")
    p.add_argument("--lease-ttl", type=float, default=10.0, help="lease TTL (s), if the keyspace is created")
    p.add_argument("--drain-timeout", type=float, default=10.0, help="drain timeout (s), if created")
    p.add_argument("--db", default=os.path.join(os.getcwd(), "events.db"), help="SQLite file")
    p.add_argument("--rooms", type=int, default=100, help="number of rooms in the generator")
    p.add_argument("--interval", type=float, default=0.1, help="seconds between events of one bucket")
    p.add_argument("--duration", type=float, default=0, help="leave after this many seconds (0: run until signalled)")
    p.add_argument("--token", default=os.environ.get("KEYSHARD_TOKEN"), help="bearer token (env KEYSHARD_TOKEN)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s " + args.id + " %(levelname)s %(message)s")

    client = keyshard.Client(args.server, token=args.token)
    try:
        ks = client.get_keyspace(args.keyspace)
    except keyshard.NotFound:
        try:
            ks = client.create_keyspace(args.keyspace, buckets=args.buckets, lease_ttl=args.lease_ttl,
                                        drain_timeout=args.drain_timeout)
            log.info("created keyspace %s (%d buckets)", ks.name, ks.buckets)
        except keyshard.AlreadyExists:
            ks = client.get_keyspace(args.keyspace)

    db = open_db(args.db)
    db.executescript(SCHEMA)
    rooms = ["!room%04d:example.org" % i for i in range(args.rooms)]
    db.executemany("INSERT OR IGNORE INTO rooms (room_id) VALUES (?)", [(r,) for r in rooms])
    db.close()
    rooms_by_bucket = {}
    for r in rooms:
        rooms_by_bucket.setdefault(keyshard.bucket(r, ks.buckets, ks.hash), []).append(r)

    h = RoomWriter(args, rooms_by_bucket)
    w = keyshard.Worker(client, args.keyspace, args.id, h, address="pid-%d" % os.getpid(),
                        on_event=lambda e: e.kind in ("joined", "fenced", "session-lost", "rejoined", "left")
                        and log.info("%s %s", e.kind, e.err or ""))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    w.start()
    end = time.monotonic() + args.duration if args.duration > 0 else None
    last = 0.0
    while not stop.wait(0.2):
        if w.wait(0):
            log.error("the worker stopped: %s", w.error)
            return 1
        if end is not None and time.monotonic() >= end:
            break
        if time.monotonic() - last > 5:
            last = time.monotonic()
            log.info("holding %d buckets, %d events written", len(w.held()), h.written)
    log.info("leaving: handing rooms over")
    ok = w.close(args.drain_timeout + 10)
    client.close()
    log.info("left (%s); %d events written", "drained" if ok else "drain timed out", h.written)
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
