"""tools/chaos_worker.py against a real server and a fenced sink."""
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import unittest

import support
from support import unique, wait_for
import keyshard as ks

SCRIPT = os.path.join(support.PYROOT, "tools", "chaos_worker.py")


class Sink(http.server.BaseHTTPRequestHandler):
    """A fenced sink as internal/chaos's: /write accepted (204) if its
    token is at least the bucket's highest; an acquire raises the fence."""
    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    recs = []
    fence = {}

    def do_POST(self):
        rec = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ok = self.path in ("/write", "/event") and (self.path == "/write") == (rec.get("kind") == "write") \
            and rec.get("worker")
        status = 400
        if ok:
            with self.lock:
                b, tok = rec.get("bucket", 0), int(rec.get("token", "0"))
                refused = False
                if rec["kind"] in ("write", "acquire"):
                    refused = tok < self.fence.get(b, 0)
                    if not refused:
                        self.fence[b] = tok
                rec["refused"] = refused
                self.recs.append(rec)
            status = 409 if refused else 204
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


class ChaosWorkerTest(unittest.TestCase):
    def test_contract(self):
        srv = support.server()
        sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
        sink.daemon_threads = True
        threading.Thread(target=sink.serve_forever, daemon=True).start()
        self.addCleanup(sink.server_close)
        self.addCleanup(sink.shutdown)
        sink_url = "http://127.0.0.1:%d" % sink.server_port
        name = unique("chaos")
        c = ks.Client(srv.url)
        self.addCleanup(c.close)
        c.create_keyspace(name, buckets=16, lease_ttl=3, drain_timeout=5)
        procs = []

        def start(mid):
            p = subprocess.Popen([sys.executable, SCRIPT, "--server", srv.url, "--sink", sink_url, "--keyspace", name,
                                  "--id", mid, "--interval", "20ms", "--release-delay", "50ms", "--drain-timeout", "20s"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            return p

        def recs(kind, worker=None):
            with Sink.lock:
                return [r for r in Sink.recs if r["kind"] == kind and (worker is None or r["worker"] == worker)]

        try:
            a = start("py-a")
            wait_for(lambda: len(recs("acquire", "py-a")) == 16, 30, what="py-a's acquires")
            wait_for(lambda: len(recs("write", "py-a")) > 16, 30, what="py-a's writes")
            b = start("py-b")
            wait_for(lambda: len(recs("acquire", "py-b")) == 8, 30, what="py-b's acquires")
            a.send_signal(signal.SIGTERM)
            self.assertEqual(a.wait(30), 0)
            wait_for(lambda: len(recs("acquire", "py-b")) == 16, 30, what="py-b taking over")
            b.send_signal(signal.SIGTERM)
            self.assertEqual(b.wait(30), 0)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        with Sink.lock:
            all_recs = list(Sink.recs)
        kinds = {r["kind"] for r in all_recs}
        self.assertTrue({"joined", "acquire", "write", "releasing", "release", "draining", "left"} <= kinds, kinds)
        self.assertFalse([r for r in all_recs if r.get("refused")], "no write or claim refused")
        for r in all_recs:
            self.assertIsInstance(r["pid"], int)
            self.assertGreater(r["mono"], 0)
        # per bucket: acquire, writes, releasing, release of one holder at a time
        holder = {}
        for r in all_recs:
            if r["kind"] == "acquire":
                self.assertNotIn(r["bucket"], holder, r)
                holder[r["bucket"]] = (r["worker"], r["token"])
            elif r["kind"] == "write":
                self.assertEqual(holder.get(r["bucket"]), (r["worker"], r["token"]), r)
            elif r["kind"] == "release":
                self.assertEqual(holder.pop(r["bucket"]), (r["worker"], r["token"]), r)
        self.assertEqual(holder, {})


if __name__ == "__main__":
    unittest.main()
