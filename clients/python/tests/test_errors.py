"""Error decoding, replica failover and bad input, against a fake server."""
import base64
import http.server
import json
import socket
import threading
import time
import unittest

import support  # noqa: F401
import keyshard as ks
from keyshard.errors import decode_wrong_owner, encode_wrong_owner


class Fake(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answers = {}   # path -> (status, body bytes)
    seen = []
    delay = {}     # path -> seconds before answering

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(n)
        self.seen.append((self.server.server_port, self.path, body, dict(self.headers)))
        time.sleep(self.delay.get(self.path, 0))
        status, out = self.answers.get((self.server.server_port, self.path)) or \
            self.answers.get(self.path, (200, b"{}"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        try:
            self.wfile.write(out)
        except OSError:
            pass  # the client gave up (a test of timeouts)

    def log_message(self, *a):
        pass


def start_fake():
    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


def err(code, msg, details=None):
    d = {"code": code, "message": msg}
    if details:
        d["details"] = details
    return json.dumps(d).encode()


class ErrorsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.a = start_fake()
        cls.b = start_fake()
        cls.ua = "http://127.0.0.1:%d" % cls.a.server_port
        cls.ub = "http://127.0.0.1:%d" % cls.b.server_port

    @classmethod
    def tearDownClass(cls):
        for s in (cls.a, cls.b):
            s.shutdown()
            s.server_close()

    def client(self, *a, **kw):
        c = ks.Client(*a, **kw)
        self.addCleanup(c.close)
        return c

    def setUp(self):
        Fake.answers = {}
        Fake.seen = []
        Fake.delay = {}

    def test_codes(self):
        c = self.client(self.ua)
        for code, cls in [("invalid_argument", ks.InvalidArgument), ("not_found", ks.NotFound),
                          ("already_exists", ks.AlreadyExists), ("failed_precondition", ks.FailedPrecondition),
                          ("permission_denied", ks.PermissionDenied), ("unauthenticated", ks.Unauthenticated),
                          ("resource_exhausted", ks.ResourceExhausted), ("unimplemented", ks.Unimplemented),
                          ("internal", ks.Internal), ("deadline_exceeded", ks.DeadlineExceeded),
                          ("aborted", ks.Aborted)]:
            Fake.answers["/keyshard.v1.AdminService/GetKeyspace"] = (400, err(code, "bad %s" % code))
            with self.assertRaises(cls) as cm:
                c.get_keyspace("x")
            self.assertEqual(cm.exception.code, code)
            self.assertEqual(cm.exception.message, "bad %s" % code)
            self.assertIsInstance(cm.exception, ks.KeyshardError)
        # a non-JSON error body: the status decides
        Fake.answers["/keyshard.v1.AdminService/GetKeyspace"] = (401, b"nope")
        with self.assertRaises(ks.Unauthenticated):
            c.get_keyspace("x")

    def test_wrong_owner_detail(self):
        wo = ks.WrongOwner(7, "writer-2", "10.0.0.2:9000", 12345678901)
        raw = encode_wrong_owner(wo)
        self.assertEqual(decode_wrong_owner(raw), wo)
        # proto produced by the Go server for these fields, hand-encoded
        self.assertEqual(raw[:2], b"\x08\x07")
        detail = {"type": "keyshard.v1.WrongOwner", "value": base64.b64encode(raw).decode().rstrip("=")}
        Fake.answers["/keyshard.v1.MapService/Lookup"] = (400, err("failed_precondition", "moved", [detail]))
        c = self.client(self.ua)
        with self.assertRaises(ks.WrongOwner) as cm:
            c.lookup("k", ["a"])
        e = cm.exception
        self.assertEqual((e.bucket, e.owner, e.address, e.epoch), (7, "writer-2", "10.0.0.2:9000", 12345678901))
        self.assertIsInstance(e, ks.FailedPrecondition)
        self.assertEqual(e.wrong_owner(), wo)
        # constructible by applications
        self.assertIn("writer-2", str(ks.WrongOwner(1, "writer-2", "a:1", 3)))

    def test_failover_and_token(self):
        Fake.answers[(self.a.server_port, "/keyshard.v1.AdminService/Status")] = (503, err("unavailable", "no etcd"))
        Fake.answers[(self.b.server_port, "/keyshard.v1.AdminService/Status")] = (200, b'{"replica":"b","leader":"b"}')
        c = self.client(self.ua + "," + self.ub, token="secret")
        self.assertEqual(c.status()["replica"], "b")
        self.assertEqual(Fake.seen[-1][3].get("Authorization"), "Bearer secret")
        # the replica that answered is tried first next time
        Fake.seen = []
        c.status()
        self.assertEqual([s[0] for s in Fake.seen], [self.b.server_port])
        # every replica unavailable: Unavailable naming both
        Fake.answers[(self.b.server_port, "/keyshard.v1.AdminService/Status")] = (503, err("unavailable", "down"))
        with self.assertRaises(ks.Unavailable) as cm:
            c.status()
        self.assertIn(self.ua, str(cm.exception))
        self.assertIn(self.ub, str(cm.exception))

    def test_long_poll_not_cut_by_replica_timeout(self):
        # a long poll that a healthy replica holds for its wait is not
        # mistaken for an unresponsive replica
        Fake.answers["/keyshard.v1.MapService/GetMap"] = (200, b'{"map":{"epoch":"2","buckets":1},"changed":true}')
        Fake.delay["/keyshard.v1.MapService/GetMap"] = 1.0
        c = self.client(self.ua + "," + self.ub, replica_timeout=0.5)
        m, changed = c.get_map("k", since_epoch=1, wait=1)
        self.assertEqual(m.epoch, 2)
        self.assertEqual(len(Fake.seen), 1)
        # without a wait, the same delay moves the call to the next replica
        Fake.seen = []
        with self.assertRaises(ks.Unavailable):
            c.get_map("k", since_epoch=1)
        self.assertEqual(len(Fake.seen), 2)

    def test_json_mapping(self):
        Fake.answers["/keyshard.v1.MapService/GetMap"] = (200, json.dumps({"map": {
            "keyspace": "k", "epoch": "3", "buckets": 4, "hash": "xxh64",
            "members": [{"id": "m1", "address": "a:1"}], "owners": [1, 0, 1]}, "changed": True}).encode())
        c = self.client(self.ua)
        m, changed = c.get_map("k", since_epoch=2, wait=1.5)
        self.assertTrue(changed)
        self.assertEqual((m.epoch, m.owners), (3, [1, 0, 1, 0]))
        self.assertEqual(m.owner_of(0).id, "m1")
        self.assertIsNone(m.owner_of(1))
        body = json.loads(Fake.seen[-1][2])
        self.assertEqual(body, {"keyspace": "k", "sinceEpoch": "2", "wait": "1.5s"})
        c.create_keyspace("k2", buckets=8, lease_ttl=2, drain_timeout=0.25)
        body = json.loads(Fake.seen[-1][2])
        self.assertEqual(body["keyspace"]["leaseTtl"], "2s")
        self.assertEqual(body["keyspace"]["drainTimeout"], "0.25s")

    def test_bad_input_before_io(self):
        c = self.client(self.ua)
        with self.assertRaisesRegex(TypeError, "name"):
            c.get_keyspace(3)
        with self.assertRaisesRegex(ValueError, "name"):
            c.get_keyspace("")
        with self.assertRaisesRegex(ValueError, "buckets"):
            c.create_keyspace("k", buckets=0)
        with self.assertRaisesRegex(TypeError, "lease_ttl"):
            c.create_keyspace("k", lease_ttl="10s")
        with self.assertRaisesRegex(ValueError, "lease_ttl"):
            c.create_keyspace("k", lease_ttl=-1)
        with self.assertRaisesRegex(ValueError, "mode"):
            c.create_keyspace("k", mode="shared")
        with self.assertRaisesRegex(TypeError, "keys"):
            c.lookup("k", "abc")
        with self.assertRaisesRegex(TypeError, r"keys\[1\]"):
            c.lookup("k", ["a", 2])
        with self.assertRaisesRegex(ValueError, "threshold"):
            c.put_hot_key_pool("p", threshold=0)
        with self.assertRaisesRegex(TypeError, "body"):
            c.call("AdminService", "Status", [1])
        with self.assertRaisesRegex(ValueError, "url"):
            ks.Client("ftp://x")
        with self.assertRaisesRegex(TypeError, "url"):
            ks.Client(None)
        with self.assertRaisesRegex(ValueError, "timeout"):
            ks.Client(self.ua, timeout=0)
        with self.assertRaisesRegex(TypeError, "handler"):
            ks.Worker(c, "k", "m", object())
        with self.assertRaisesRegex(TypeError, "client"):
            ks.Router("http://x", "k")
        with self.assertRaisesRegex(ValueError, "member_id"):
            ks.Worker(c, "k", "", object())
        self.assertEqual(Fake.seen, [])

    def test_unreachable(self):
        # refused: nothing listens
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        url = "http://127.0.0.1:%d" % port
        c = self.client(url, timeout=2)
        t = time.monotonic()
        with self.assertRaises(ks.Unavailable) as cm:
            c.status()
        self.assertLess(time.monotonic() - t, 3)
        self.assertIn(url, str(cm.exception))
        # a listener that never answers: Unavailable within the timeout
        l = socket.socket()
        l.bind(("127.0.0.1", 0))
        l.listen(16)
        try:
            url2 = "http://127.0.0.1:%d" % l.getsockname()[1]
            c = self.client(url2 + "," + url, timeout=1.5)
            t = time.monotonic()
            with self.assertRaises(ks.Unavailable) as cm:
                c.get_keyspace("x")
            self.assertLess(time.monotonic() - t, 3)
            self.assertIn(url2, str(cm.exception))
            self.assertIn(url, str(cm.exception))
        finally:
            l.close()


if __name__ == "__main__":
    unittest.main()
