"""Fencing arithmetic with an injectable clock (no server)."""
import unittest

import support  # noqa: F401
from keyshard.types import Keyspace
from keyshard.worker import Grant, _Session, fence_margin


class FakeClock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


class FencingTest(unittest.TestCase):
    def test_margin(self):
        self.assertEqual(fence_margin(10.0), 1.0)
        self.assertEqual(fence_margin(3.0), 0.5)      # max(TTL/10, 0.5)
        self.assertEqual(fence_margin(0.8), 0.4)      # at most TTL/2
        self.assertEqual(fence_margin(10.0, 2.0), 2.0)
        self.assertEqual(fence_margin(10.0, 7.0), 5.0)

    def test_deadline_follows_acknowledged_sends(self):
        clk = FakeClock()
        s = _Session("s", 10.0, 1.0, clk(), Keyspace("k"), clk)  # join sent at 1000
        g = Grant(3, 7, 0, s)
        self.assertEqual(s.deadline, 1009.0)
        clk.t = 1003.0
        sent = clk()
        clk.t = 1004.5                                   # answered 1.5 s later
        self.assertTrue(s.renewed(sent, 10.0))
        self.assertEqual(s.deadline, 1012.0)             # send time + TTL - margin, not answer time
        # the server says less lease is left than a TTL: use it
        self.assertTrue(s.renewed(1004.0, 8.0))
        self.assertEqual(s.deadline, 1012.0)             # never moves back
        clk.t = 1011.999
        self.assertTrue(g.valid())
        clk.t = 1012.0
        self.assertFalse(g.valid())                      # checked on the clock before any timer ran
        self.assertTrue(g.cancelled.is_set())
        # a renewal acknowledged after the deadline does not revive it
        self.assertFalse(s.renewed(1011.0, 10.0))
        clk.t = 1000.0
        self.assertFalse(s.valid())

    def test_resumed_after_pause(self):
        clk = FakeClock()
        s = _Session("s", 3.0, 0.5, clk(), Keyspace("k"), clk)
        g = Grant(0, 1, 0, s)
        self.assertTrue(g.valid())
        clk.t += 60  # a SIGSTOP / GC pause
        self.assertFalse(g.valid())

    def test_cancelled(self):
        clk = FakeClock()
        s = _Session("s", 3.0, 0.5, clk(), Keyspace("k"), clk)
        g = Grant(0, 1, 0, s)
        g.cancelled.set()
        self.assertFalse(g.valid())
        self.assertTrue(s.valid())


if __name__ == "__main__":
    unittest.main()
