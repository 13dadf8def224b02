"""Runs two examples/python-event-writer writers against a real server."""
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import unittest

import support
from support import unique, wait_for
import keyshard as ks

WRITER = os.path.join(support.REPO, "examples", "python-event-writer", "writer.py")


class EventWriterTest(unittest.TestCase):
    def test_two_writers_fenced(self):
        srv = support.server()
        d = tempfile.mkdtemp(prefix="event-writer-")
        db = os.path.join(d, "events.db")
        name = unique("rooms")
        c = ks.Client(srv.url)
        self.addCleanup(c.close)
        c.create_keyspace(name, buckets=32, lease_ttl=3, drain_timeout=5)
        procs = []
        self.addCleanup(shutil.rmtree, d, True)

        def start(mid):
            with open(os.path.join(d, mid + ".log"), "wb") as logf:
                p = subprocess.Popen([sys.executable, WRITER, "--server", srv.url, "--id", mid, "--keyspace", name,
                                      "--db", db, "--rooms", "40", "--interval", "0.05"],
                                     stdout=subprocess.DEVNULL, stderr=logf)
            procs.append(p)
            return p

        def count(sql, *a):
            try:
                con = sqlite3.connect(db, timeout=30)
                try:
                    return con.execute(sql, a).fetchone()[0]
                finally:
                    con.close()
            except sqlite3.OperationalError:
                return 0

        def held(mid):
            members, _ = c.list_members(name)
            return sum(m.granted_buckets for m in members if m.member.id == mid)

        try:
            p1 = start("writer-1")
            wait_for(lambda: count("SELECT count(*) FROM events WHERE writer='writer-1'") > 20, 30,
                     what="writer-1's events")
            p2 = start("writer-2")
            wait_for(lambda: count("SELECT count(*) FROM events WHERE writer='writer-2'") > 20, 30,
                     what="writer-2's events")
            p1.send_signal(signal.SIGTERM)
            self.assertEqual(p1.wait(30), 0)
            wait_for(lambda: held("writer-2") == 32, 30, what="writer-2 holding every bucket")
            n = count("SELECT count(*) FROM events")
            wait_for(lambda: count("SELECT count(*) FROM events") > n + 20, 30, what="more events")
            p2.send_signal(signal.SIGTERM)
            self.assertEqual(p2.wait(30), 0)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()

        con = sqlite3.connect(db)
        rows = con.execute("SELECT room_id, seq, writer, fence FROM events ORDER BY room_id, seq").fetchall()
        rooms = con.execute("SELECT room_id, fence, last_seq FROM rooms").fetchall()
        con.close()
        self.assertGreater(len(rows), 60)
        self.assertEqual({r[2] for r in rows}, {"writer-1", "writer-2"})
        last = {}
        for room, seq, writer, fence in rows:
            prev = last.get(room)
            if prev is not None:
                self.assertEqual(seq, prev[0] + 1, "room %s: seq gap" % room)
                self.assertGreaterEqual(fence, prev[1], "room %s: write at fence %d after fence %d" % (room, fence, prev[1]))
            last[room] = (seq, fence)
        for room, fence, last_seq in rooms:
            if room in last:
                self.assertEqual((last_seq, fence), last[room])


if __name__ == "__main__":
    unittest.main()
