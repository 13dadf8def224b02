"""Integration tests against a real `keyshard serve` (see support.server)."""
import asyncio
import threading
import time
import types
import unittest

import support
from support import Recorder, check_no_overlap, unique, wait_for
import keyshard as ks


def setUpModule():
    global SRV
    SRV = support.server()


class IntegrationTest(unittest.TestCase):
    def setUp(self):
        self.c = ks.Client(SRV.url, timeout=10)
        self.addCleanup(self.c.close)
        self.workers = []

    def tearDown(self):
        for w in self.workers:
            w.close(10)

    def worker(self, ks_name, mid, h, **kw):
        w = ks.Worker(self.c, ks_name, mid, h, **kw)
        self.workers.append(w)
        return w

    def test_admin_calls(self):
        name = unique("admin")
        k = self.c.create_keyspace(name, buckets=64, lease_ttl=3, drain_timeout=5)
        self.assertEqual((k.name, k.buckets, k.hash, k.lease_ttl, k.drain_timeout), (name, 64, "xxh64", 3.0, 5.0))
        with self.assertRaises(ks.AlreadyExists):
            self.c.create_keyspace(name, buckets=64)
        self.assertIn(name, [x.name for x in self.c.list_keyspaces()])
        k = self.c.update_keyspace(name, lease_ttl=4)
        self.assertEqual(k.lease_ttl, 4.0)
        self.assertEqual(self.c.get_keyspace(name).lease_ttl, 4.0)
        with self.assertRaises(ks.FailedPrecondition):
            self.c.call("AdminService", "UpdateKeyspace", {"keyspace": {"name": name, "buckets": 32}})
        with self.assertRaises(ks.InvalidArgument) as cm:
            self.c.call("AdminService", "CreateKeyspace", {"keyspace": {"name": "x", "bucket": 3}})
        self.assertIn("bucket", cm.exception.message)
        with self.assertRaises(ks.NotFound):
            self.c.get_keyspace(unique("missing"))
        members, epoch = self.c.list_members(name)
        self.assertEqual(members, [])
        st = self.c.status()
        self.assertIn(name, [x["keyspace"].name for x in st["keyspaces"]])
        wait_for(lambda: self.c.get_map(name)[0].epoch > 0, 20, what="the keyspace's first map")
        res = self.c.lookup(name, ["!room:example.org"])
        self.assertEqual(res.owners[0].bucket, ks.bucket("!room:example.org", 64))
        self.assertEqual(res.owners[0].member, "")
        p = self.c.put_hot_key_pool(unique("pool"), threshold=100)
        self.assertGreater(p.report_threshold, 0)
        self.assertIn(p.name, [x.name for x in self.c.list_hot_key_pools()])
        sname = unique("stream")
        self.c.create_keyspace(sname, buckets=8, mode="stream")
        pos = self.c.get_positions(sname, behind=3)
        self.assertEqual(pos["max"], 0)

    def test_handoffs_no_overlap(self):
        name = unique("handoff")
        self.c.create_keyspace(name, buckets=32, lease_ttl=3, drain_timeout=5)
        log, lock = [], threading.Lock()
        events = []
        w1 = self.worker(name, "w1", Recorder("w1", log, lock, release_delay=0.01),
                         on_event=lambda e: events.append(("w1", e.kind)))
        w1.start()
        self.assertTrue(w1.wait_held(32, 20), "w1 holds everything")
        w2 = self.worker(name, "w2", Recorder("w2", log, lock, release_delay=0.01),
                         on_event=lambda e: events.append(("w2", e.kind)))
        w2.start()
        wait_for(lambda: len(w1.held()) == 16 and len(w2.held()) == 16, 30, what="an even split")
        # owns: a key of a bucket w2 holds is a WrongOwner at w1
        g2 = w2.held()[0]
        key = next(k for k in ("k%d" % i for i in range(10000)) if ks.bucket(k, 32) == g2.bucket)
        self.assertEqual(w2.owns(key).bucket, g2.bucket)
        wait_for(lambda: _wrong_owner(w1, key), 10, what="w1's map naming w2")
        self.assertTrue(w1.close(20))
        self.assertIn(("w1", "left"), events)
        self.assertTrue(w2.wait_held(32, 30))
        w3 = self.worker(name, "w3", Recorder("w3", log, lock))
        w3.start()
        wait_for(lambda: len(w3.held()) == 16, 30, what="w3 takes half")
        # The map's history, newest first, and every bucket held by w3.
        hist = self.c.history(name)
        self.assertEqual([h["epoch"] for h in hist], sorted((h["epoch"] for h in hist), reverse=True))
        self.assertEqual((hist[-1]["epoch"], hist[-1]["reason"]), (1, "create"))
        joins = [h["members"] for h in hist if h["reason"] == "join"]
        self.assertIn(["w3"], joins)
        self.assertIn(["w2"], joins)
        self.assertTrue(any(h["reason"] == "leave" and h["members"] == ["w1"] for h in hist), hist)
        with self.assertRaises(ValueError):
            self.c.history(name, limit=501)
        self.assertTrue(w2.close(20))
        self.assertTrue(w3.wait_held(32, 30))
        bs = self.c.buckets(name)
        self.assertEqual(bs["buckets"], 32)
        self.assertEqual(sum(r["count"] for r in bs["runs"]), 32)
        self.assertTrue(all(r["owner"] == "w3" for r in bs["runs"]), bs)
        st = self.c.status()
        self.assertTrue(st["store"]["healthy"])
        self.assertEqual([r["id"] for r in st["replicas"]], ["r1"])
        self.assertTrue(w3.close(20))
        check_no_overlap(self, log)
        self.assertEqual(sum(1 for r in log if r[1] == "acquire"), sum(1 for r in log if r[1] == "release"))

    def _release_burst(self, name, slow):
        """w1 holds all 16 buckets of name; w2 joins, so w1 hands half of
        them over at once. Returns (w1, st, n): w1's release handlers wait
        until the test adds their bucket to st.opened or the test ended
        (with slow, only the first one waits); st.entered lists the buckets whose handler was
        called, st.returned those whose handler returned, st.calls the
        buckets of each Release call w1 made; n is how many buckets w1
        hands over. st.cond guards st and is notified on every change."""
        self.c.create_keyspace(name, buckets=16, lease_ttl=3)
        st = types.SimpleNamespace(cond=threading.Condition(), entered=[], returned=[], opened=set(), calls=[],
                                   over=False)
        c1 = ks.Client(SRV.url, timeout=10)
        self.addCleanup(c1.close)
        call = c1.call

        def counting(service, method, body=None, **kw):
            r = call(service, method, body, **kw)
            if method == "Release":
                with st.cond:
                    st.calls.append(sorted(b["bucket"] for b in body["buckets"]))
                    st.cond.notify_all()
            return r
        c1.call = counting

        class Handler:
            def acquire(self, g):
                pass

            def release(self, bucket, g):
                with st.cond:
                    st.entered.append(bucket)
                    st.cond.notify_all()
                    if not slow or len(st.entered) == 1:
                        st.cond.wait_for(lambda: bucket in st.opened or st.over, 30)

        def on_event(e):
            if e.kind == "released":
                with st.cond:
                    st.returned.append(e.grant.bucket)
                    st.cond.notify_all()
        def over():
            with st.cond:
                st.over = True
                st.cond.notify_all()
        w1 = ks.Worker(c1, name, "w1", Handler(), on_event=on_event)
        self.addCleanup(w1.close, 10)
        self.addCleanup(over)  # runs first: w1's handlers no longer wait
        w1.start()
        self.assertTrue(w1.wait_held(16, 20), "w1 holds everything")
        r = ks.Router(self.c, name).start()
        self.addCleanup(r.close)
        self.worker(name, "w2", Recorder("w2", [], threading.Lock())).start()

        def to_w2():
            m = r.map
            return [b for b in range(16) if m is not None and (m.owner_of(b) or ks.Member("")).id == "w2"]
        n = len(wait_for(to_w2, 20, what="a map giving w2 buckets"))
        return w1, st, n

    def test_release_burst_in_one_call(self):
        w1, st, n = self._release_burst(unique("coalesce"), slow=False)
        # The bound would only cut the burst short on a descheduled thread:
        # lift it, so that what is tested is the wait for running handlers.
        w1._release_coalesce = 60.0
        with st.cond:
            self.assertTrue(st.cond.wait_for(lambda: len(st.entered) == n, 30), (st.entered, n))
            # Let the handlers return one at a time: each returned bucket
            # waits for the others rather than going alone.
            for b in list(st.entered):
                st.opened.add(b)
                st.cond.notify_all()
                self.assertTrue(st.cond.wait_for(lambda: b in st.returned, 30), b)
            self.assertTrue(st.cond.wait_for(lambda: st.calls, 30), "no Release call")
        self.assertEqual(st.calls, [sorted(st.entered)])

    def test_slow_release_handler_does_not_hold_back_the_burst(self):
        w1, st, n = self._release_burst(unique("coalesce-slow"), slow=True)
        sent = lambda: sorted(b for c in st.calls for b in c)
        with st.cond:
            # The first handler called blocks until the test opens it; the
            # others go to the server without it.
            self.assertTrue(st.cond.wait_for(lambda: len(sent()) == n - 1, 30), (st.entered, st.calls))
            slow = st.entered[0]
            self.assertNotIn(slow, sent())
            self.assertEqual(sorted(set(st.entered) - {slow}), sent())
            st.opened.add(slow)
            st.cond.notify_all()
            self.assertTrue(st.cond.wait_for(lambda: slow in sent(), 30), st.calls)
        self.assertEqual(st.calls[-1], [slow])

    def test_blocked_keepalives_fence_then_rejoin(self):
        name = unique("fence")
        ttl = 3.0
        self.c.create_keyspace(name, buckets=8, lease_ttl=ttl, drain_timeout=5)
        log, lock = [], threading.Lock()
        events = []
        blocked = threading.Event()
        unblock = threading.Event()
        acked_sends = []

        w = self.worker(name, "stuck", Recorder("stuck", log, lock),
                        on_event=lambda e: events.append((time.monotonic(), e.kind, e.session)))
        real = w._keepalive_rpc

        def rpc(s, timeout):
            sent = time.monotonic()
            if blocked.is_set():
                unblock.wait(timeout)
                raise ks.Unavailable("unavailable", "blocked by the test")
            r = real(s, timeout)
            acked_sends.append(sent)
            return r
        w._keepalive_rpc = rpc
        w.start()
        self.assertTrue(w.wait_held(8, 20))
        first = w.session
        grants = w.held()
        other = self.worker(name, "other", Recorder("other", log, lock))
        blocked.set()
        block_at = time.monotonic()
        wait_for(lambda: any(k == "fenced" for _, k, _ in events), 3 * ttl, what="the fence")
        fenced_at = next(t for t, k, _ in events if k == "fenced")
        last_ack = max(s for s in acked_sends if s <= block_at)
        # the server's lease lasts at least TTL after the last acknowledged send
        self.assertLess(fenced_at, last_ack + ttl)
        self.assertTrue(all(not g.valid() and g.cancelled.is_set() for g in grants))
        other.start()
        unblock.set()
        blocked.clear()
        wait_for(lambda: any(k == "rejoined" for _, k, _ in events), 30, what="the re-join")
        self.assertNotEqual(w.session, first)
        wait_for(lambda: len(w.held()) + len(other.held()) == 8, 30, what="every bucket held again")
        check_no_overlap(self, log)
        kinds = [k for _, k, _ in events if k not in ("renewed", "acquired", "released", "release-recorded")]
        self.assertEqual(kinds[:4], ["joined", "fenced", "session-lost", "rejoined"])

    def test_stream_commit_and_final_positions(self):
        name = unique("stream")
        self.c.create_keyspace(name, buckets=8, mode="stream", lease_ttl=3, drain_timeout=5)
        log, lock = [], threading.Lock()

        class StreamHandler(Recorder):
            def final_position(self, bucket):
                return 500 + bucket
        events = []
        w1 = self.worker(name, "s1", StreamHandler("s1", log, lock), on_event=lambda e: events.append(e))
        w1.start()
        self.assertTrue(w1.wait_held(8, 20))
        self.assertTrue(all(g.from_position == 0 for g in w1.held()))
        rev = w1.commit(100)
        self.assertGreater(rev, 0)
        pos = self.c.get_positions(name)
        self.assertEqual((pos["min"], pos["max"]), (100, 100))
        w2 = self.worker(name, "s2", Recorder("s2", log, lock))
        w2.start()
        wait_for(lambda: len(w2.held()) == 4, 30, what="s2 taking half")
        for g in w2.held():
            self.assertEqual(g.from_position, 500 + g.bucket)  # handed over with the release
        self.assertTrue(any(e.kind == "release-recorded" and e.final == 500 + e.grant.bucket for e in events))
        w1.commit(200)  # covers only what s1 still holds
        pos = self.c.get_positions(name)
        self.assertEqual(pos["min"], 200)
        self.assertEqual(pos["max"], max(500 + g.bucket for g in w2.held()))
        check_no_overlap(self, log)

    def test_worker_through_a_dead_replica(self):
        name = unique("replicas")
        self.c.create_keyspace(name, buckets=4, lease_ttl=3, drain_timeout=5)
        import socket
        hole = socket.socket()
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)             # accepts connections, never answers
        self.addCleanup(hole.close)
        c = ks.Client("http://127.0.0.1:%d,%s" % (hole.getsockname()[1], SRV.url), replica_timeout=1)
        self.addCleanup(c.close)
        events = []
        w = ks.Worker(c, name, "via-2", Recorder("via-2", [], threading.Lock()), on_event=lambda e: events.append(e.kind))
        self.workers.append(w)
        w.start()
        self.assertTrue(w.wait_held(4, 30))
        wait_for(lambda: events.count("renewed") >= 4, 30, what="keep-alives through the live replica")
        self.assertNotIn("fenced", events)
        self.assertEqual(w.error, None)

    def test_rejoin_after_the_server_ended_the_session(self):
        name = unique("lost")
        self.c.create_keyspace(name, buckets=4, lease_ttl=3, drain_timeout=5)
        log, lock = [], threading.Lock()
        events = []
        w = self.worker(name, "w", Recorder("w", log, lock), on_event=lambda e: events.append((e.kind, e.session)))
        w.start()
        self.assertTrue(w.wait_held(4, 20))
        first = w.session
        # someone else ends the session (here: a Leave on its behalf)
        self.c.call("MemberService", "Leave", {"session": first})
        wait_for(lambda: ("rejoined", w.session) in events and w.session != first, 30, what="a new session")
        self.assertIn(("session-lost", first), events)
        kinds = [k for k, _ in events if k in ("fenced", "session-lost", "rejoined")]
        self.assertEqual(kinds[:3], ["fenced", "session-lost", "rejoined"])  # as the Go SDK reports it
        self.assertTrue(w.wait_held(4, 30))
        check_no_overlap(self, log)

    def test_router_follows_epochs(self):
        name = unique("router")
        self.c.create_keyspace(name, buckets=16, hash="synapse-sha256", lease_ttl=3, drain_timeout=5)
        maps = []
        with ks.Router(self.c, name, on_change=maps.append) as r:
            m = r.wait_ready(10)
            self.assertEqual(m.hash, "synapse-sha256")
            self.assertIsNone(r.owner("!a:b"))
            e0 = r.epoch
            w = self.worker(name, "rw", Recorder("rw", [], threading.Lock()), address="10.0.0.9:9000")
            w.start()
            self.assertTrue(w.wait_held(16, 20))
            self.assertTrue(r.wait_epoch(e0 + 1, 20))
            wait_for(lambda: r.owner("!a:b") is not None, 20, what="an owner")
            o = r.owner("!a:b")
            self.assertEqual((o.id, o.address), ("rw", "10.0.0.9:9000"))
            self.assertEqual(r.bucket("!a:b"), ks.bucket("!a:b", 16, "synapse-sha256"))
            self.assertFalse(r.stale)
            self.assertGreater(maps[-1].epoch, e0)
            self.assertFalse(r.wait_epoch(r.epoch + 100, 0.2))

    def test_router_stale_when_unreachable(self):
        name = unique("stale")
        self.c.create_keyspace(name, buckets=4)
        proxy = support_proxy(SRV.addr)
        try:
            c = ks.Client(proxy.url, timeout=2)
            self.addCleanup(c.close)
            r = ks.Router(c, name, poll_wait=1)
            r.start()
            m = r.wait_ready(10)
            proxy.close()
            wait_for(lambda: r.stale, 20, what="the router noticing")
            self.assertIs(r.map, m)
            self.assertIsInstance(r.error, ks.Unavailable)
            r.close()
        finally:
            proxy.close()

    def test_hot_keys(self):
        pool = unique("hot")
        p = self.c.put_hot_key_pool(pool, threshold=100, cooldown=5)
        det = ks.Detector(capacity=16, half_life=1.0)
        stop = threading.Event()

        def feed():
            while not stop.is_set():
                for _ in range(30):
                    det.observe("user-1")
                det.observe("cold-%d" % int(time.monotonic() * 1000))
                time.sleep(0.1)
        t = threading.Thread(target=feed, daemon=True)
        t.start()
        self.addCleanup(stop.set)
        sets = []
        # two producers each reporting ~60/s of a key over a threshold of 100
        h1 = ks.HotKeys(self.c, pool, "p1", report=lambda m: [("user-1", 60.0)], interval=0.2, on_set=sets.append)
        h2 = ks.HotKeys(self.c, pool, "p2", report=det.top, interval=0.2)
        with h1, h2:
            wait_for(lambda: h1.is_hot("user-1") and h2.is_hot("user-1"), 30, what="the overflow set")
            self.assertGreater(h1.version, 0)
            self.assertEqual(h1.report_threshold, p.report_threshold)
            self.assertIn("user-1", sets[-1])
            self.assertFalse(h1.is_hot("cold-1"))
        stop.set()

    def test_pool_follower(self):
        pool = unique("gw")
        self.c.call("TenantPoolService", "PutTenantPool", {"pool": {
            "name": pool, "policy": {"capacityPerMember": 10, "minSize": 2}, "leaseTtl": "5s"}})
        sessions = []
        for m in ("gw-1", "gw-2", "gw-3"):
            r = self.c.call("TenantPoolService", "JoinPool", {"pool": pool, "member": {"id": m, "address": m + ":9095"}})
            self.c.call("TenantPoolService", "PoolKeepAlive", {"session": r["session"]})
            sessions.append(r["session"])
        with ks.PoolFollower(self.c, pool) as f:
            f.wait_ready(10)
            wait_for(lambda: len(f.members()) == 3, 30, what="the snapshot placing three members")
            t = f.targets("acme")   # a tenant the snapshot does not list: GetTenants
            self.assertEqual(len(t), 2)
            self.assertTrue(set(t) <= {"gw-1", "gw-2", "gw-3"})
            self.assertTrue(all(f.serves(m, "acme") for m in t))
            rep = ks.LoadReporter(self.c, pool, unique("frontend"))
            rep.add("acme", 250)
            self.assertEqual(rep.flush(), "REPORT_OUTCOME_COUNTED")
            with self.assertRaises(ValueError):
                ks.report_load(self.c, pool, "r", 0, {})
            with self.assertRaises(ValueError):
                ks.report_load(self.c, pool, "r", 1, {}, period=-1.0)
            self.assertEqual(ks.report_load(self.c, pool, unique("r"), 1, {"acme": 3}, period=0.5), "REPORT_OUTCOME_COUNTED")
        for s in sessions:
            self.c.call("TenantPoolService", "LeavePool", {"session": s, "endSession": True})

    def test_unreachable_raises_unavailable(self):
        c = ks.Client("http://127.0.0.1:9,http://127.0.0.1:19", timeout=1)
        t = time.monotonic()
        with self.assertRaises(ks.Unavailable) as cm:
            c.get_keyspace("x")
        self.assertLess(time.monotonic() - t, 2)
        self.assertIn("127.0.0.1:9", str(cm.exception))
        self.assertIn("127.0.0.1:19", str(cm.exception))

    def test_asyncio_to_thread(self):
        name = unique("aio")

        async def main():
            await asyncio.to_thread(self.c.create_keyspace, name, buckets=8, lease_ttl=3, drain_timeout=5)
            loop = asyncio.get_running_loop()
            got = asyncio.Event()
            h = Recorder("aio", [], threading.Lock())
            # callbacks run on the client's threads: hand them to the loop
            w = ks.Worker(self.c, name, "aio", h,
                          on_event=lambda e: e.kind == "acquired" and loop.call_soon_threadsafe(got.set))
            w.start()
            await asyncio.wait_for(got.wait(), 20)
            ok = await asyncio.to_thread(w.wait_held, 8, 20)
            closed = await asyncio.to_thread(w.close, 20)
            k = await asyncio.to_thread(self.c.get_keyspace, name)
            return ok, closed, k
        ok, closed, k = asyncio.run(main())
        self.assertTrue(ok and closed)
        self.assertEqual(k.buckets, 8)


class HeldJoinTest(unittest.TestCase):
    """Status on a serve of its own with a 10 s rebalance gap: a join the
    leader holds back shows in members_without_buckets while it is held
    (the test checks well within the gap, and does not wait it out)."""

    @classmethod
    def setUpClass(cls):
        cls.srv = support.Server(extra_args=["--rebalance-gap", "10s"])

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_members_without_buckets(self):
        c = ks.Client(self.srv.url, timeout=10)
        self.addCleanup(c.close)
        name = unique("held")
        c.create_keyspace(name, buckets=16, lease_ttl=30)

        def join(mid, keep_alive=True):
            s = c.call("MemberService", "Join", {"keyspace": name, "member": {"id": mid}})["session"]
            if keep_alive:
                c.call("MemberService", "KeepAlive", {"session": s})

        def status():
            return next(k for k in c.status()["keyspaces"] if k["keyspace"].name == name)

        # w1's map places unassigned buckets: it is not held back.
        join("w1")
        k = wait_for(lambda: (lambda k: k if k["unassigned_buckets"] == 0 else None)(status()), 20,
                     what="w1's map")
        self.assertEqual((k["members"], k["members_without_buckets"]), (1, 0))
        # w2 joins within the gap: its map waits, and Status counts it.
        join("w2")
        # w3 joins without a keep-alive: pending, no map gives it a bucket.
        join("w3", keep_alive=False)
        k = status()
        self.assertEqual((k["members"], k["unassigned_buckets"], k["members_without_buckets"]), (3, 0, 1), k)


def _wrong_owner(w, key):
    try:
        w.owns(key)
    except ks.WrongOwner as e:
        return e.owner == "w2"
    except ks.NotGranted:
        return False
    return False


class _Proxy:
    """A TCP proxy to the server that can be cut."""

    def __init__(self, target):
        import socket
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.l = socket.socket()
        self.l.bind(("127.0.0.1", 0))
        self.l.listen(64)
        self.url = "http://127.0.0.1:%d" % self.l.getsockname()[1]
        self.closed = False
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        while True:
            try:
                a, _ = self.l.accept()
            except OSError:
                return
            if self.closed:
                a.close()
                return
            b = socket.create_connection((self.host, self.port))
            self.conns += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(x, y), daemon=True).start()

    def _pipe(self, x, y):
        try:
            while True:
                d = x.recv(65536)
                if not d:
                    break
                y.sendall(d)
        except OSError:
            pass
        finally:
            for s in (x, y):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self):
        import socket
        self.closed = True
        try:
            self.l.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.l.close()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


def support_proxy(target):
    return _Proxy(target)


if __name__ == "__main__":
    unittest.main()
