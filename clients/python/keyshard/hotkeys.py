"""Cluster-wide hot keys: report heavy hitters, follow the overflow set.

HotKeys reports the producer's heavy hitters (ReportHotKeys, every
interval) and follows the pool's overflow set (GetOverflowSet long
polls). It fails open: while the control plane is unreachable it keeps
the last set and retries with backoff. Detector is a bounded-memory local
heavy-hitter detector (space-saving top-k with exponentially decaying
rates) whose top() can be passed as report.
"""
import logging
import math
import threading
import time
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

from . import errors as E
from ._backoff import Backoff
from ._follow import follow
from ._wire import check_num, check_str, u64
from .client import Cancel, Client

__all__ = ["HotKeys", "Detector"]

log = logging.getLogger("keyshard")

POLL_WAIT = 30.0
MAX_REPORT_KEYS = 1024
MAX_KEY_BYTES = 512

ReportFn = Callable[[float], Iterable[Tuple[str, float]]]


class Detector:
    """Space-saving top-k heavy hitters with exponentially decaying counts.

    Memory is bounded by capacity keys. observe(key, n) counts n events of
    key now; rate(key) and top(min_rate) give decayed rates in events/s,
    upper bounds (a key that entered by evicting another inherits its
    count, as in space-saving). half_life (s) sets how fast rates follow
    changes. Thread-safe.
    """

    def __init__(self, capacity: int = 128, half_life: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError("capacity: want a positive int")
        self.half_life = check_num(half_life, "half_life", positive=True)
        self.capacity = capacity
        self._lam = math.log(2) / self.half_life
        self._clock = clock
        self._t0 = clock()
        # counts are stored scaled by exp(lam * (t - t0)): decay is implicit
        self._c: Dict[str, float] = {}
        self._lock = threading.Lock()

    def _scale(self, now: float) -> float:
        x = self._lam * (now - self._t0)
        if x > 500:  # rebase before floats overflow
            f = math.exp(-x)
            self._c = {k: v * f for k, v in self._c.items()}
            self._t0 = now
            x = 0.0
        return math.exp(x)

    def observe(self, key: str, n: float = 1.0) -> None:
        with self._lock:
            w = n * self._scale(self._clock())
            c = self._c
            if key in c:
                c[key] += w
            elif len(c) < self.capacity:
                c[key] = w
            else:
                victim = min(c, key=c.__getitem__)
                c[key] = c.pop(victim) + w

    def rate(self, key: str) -> float:
        with self._lock:
            v = self._c.get(key)
            if v is None:
                return 0.0
            return v / self._scale(self._clock()) * self._lam

    def top(self, min_rate: float = 0.0) -> List[Tuple[str, float]]:
        """Keys with a rate >= min_rate, highest first."""
        with self._lock:
            f = self._lam / self._scale(self._clock())
            out = [(k, v * f) for k, v in self._c.items() if v * f >= min_rate]
        out.sort(key=lambda kr: -kr[1])
        return out


class HotKeys:
    """Reports a producer's heavy hitters to pool and follows its overflow set.

    report(min_rate) returns (key, rate) pairs for the keys whose local
    rate is at least min_rate (the pool's report_threshold, learned from
    the answers; 0 before the first answer); it is called every interval
    seconds. on_set(frozenset_of_keys) is called on the follower thread
    when the set changes. Start with start() (or a with block); close()
    stops it.
    """

    def __init__(self, client: Client, pool: str, producer: str,
                 report: Optional[ReportFn] = None, interval: float = 1.0,
                 on_set: Optional[Callable[[FrozenSet[str]], None]] = None,
                 poll_wait: float = POLL_WAIT) -> None:
        if not isinstance(client, Client):
            raise TypeError("client: want a keyshard.Client, got %s" % type(client).__name__)
        check_str(pool, "pool")
        check_str(producer, "producer")
        if report is not None and not callable(report):
            raise TypeError("report: want a callable(min_rate) -> [(key, rate)]")
        if on_set is not None and not callable(on_set):
            raise TypeError("on_set: want a callable")
        self._c = client
        self.pool = pool
        self.producer = producer
        self._report = report
        self.interval = check_num(interval, "interval", positive=True)
        self._on_set = on_set
        self._wait = check_num(poll_wait, "poll_wait", positive=True)
        self._lock = threading.Lock()
        self._set: FrozenSet[str] = frozenset()
        self._rates: Dict[str, float] = {}
        self._version = 0
        self._changed = threading.Condition(self._lock)
        self.report_threshold = 0.0
        self.reports = 0
        self.report_failures = 0
        self.follow_failures = 0
        self.last_error: Optional[BaseException] = None
        self._cancel = Cancel()
        self._threads: List[threading.Thread] = []

    def start(self) -> "HotKeys":
        if not self._threads:
            for fn, name in ((self._report_loop, "report"), (self._follow, "follow")):
                if fn == self._report_loop and self._report is None:
                    continue
                t = threading.Thread(target=fn, name="keyshard-hotkeys-" + name, daemon=True)
                self._threads.append(t)
                t.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._cancel.cancel()
        for t in self._threads:
            t.join(timeout)

    def __enter__(self) -> "HotKeys":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> int:
        return self._version

    def is_hot(self, key: str) -> bool:
        """Whether key is in the pool's overflow set (as last seen)."""
        return key in self._set

    def set(self) -> FrozenSet[str]:
        """The overflow set's keys as last seen (kept while unreachable)."""
        return self._set

    def rates(self) -> Dict[str, float]:
        """The overflow set's keys with their summed rates."""
        with self._lock:
            return dict(self._rates)

    def wait_version(self, version: int, timeout: float) -> bool:
        """Waits until the set's version is at least version."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._version < version:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def report_once(self) -> None:
        """Makes one report now (also what the background loop does)."""
        min_rate = self.report_threshold
        keys = list(self._report(min_rate)) if self._report is not None else []
        seen = set()
        good: List[Tuple[str, float]] = []
        for k, r in keys:
            if not isinstance(k, str) or not k or len(k.encode("utf-8")) > MAX_KEY_BYTES or k in seen:
                continue
            try:
                r = float(r)
            except (TypeError, ValueError):
                continue
            if math.isnan(r) or math.isinf(r) or r <= 0 or r < min_rate:
                continue
            seen.add(k)
            good.append((k, r))
        good.sort(key=lambda kr: -kr[1])
        body = {"pool": self.pool, "producer": self.producer,
                "keys": [{"key": k, "rate": r} for k, r in good[:MAX_REPORT_KEYS]]}
        resp = self._c.call("HotKeyService", "ReportHotKeys", body,
                            timeout=max(self.interval, 5.0), cancel=self._cancel)
        t = float((resp.get("pool") or {}).get("reportThreshold", 0) or 0)
        if t > 0 and not math.isinf(t):
            self.report_threshold = t
        self.reports += 1

    def _report_loop(self) -> None:
        b = Backoff(0.1, 10.0)
        while not self._cancel.cancelled:
            start = time.monotonic()
            wait = self.interval
            try:
                self.report_once()
                b.reset()
            except E.Closed:
                return
            except Exception as ex:
                if self._cancel.cancelled:
                    return
                self.report_failures += 1
                self.last_error = ex
                log.warning("keyshard: hot-key report failed; retrying: %s", ex)
                wait = max(wait, b.next())
            if self._cancel.wait(max(0.0, wait - (time.monotonic() - start))):
                return

    def _follow(self) -> None:
        def fetch(first: bool) -> Dict[str, Any]:
            body = {"pool": self.pool, "sinceVersion": str(self._version), "wait": "%gs" % self._wait}
            return self._c.call("HotKeyService", "GetOverflowSet", body, wait=self._wait, cancel=self._cancel)

        def failed(ex: Exception) -> None:  # fail open: keep the last set
            self.follow_failures += 1
            self.last_error = ex
            log.warning("keyshard: overflow set of pool %s: %s; keeping the last set", self.pool, ex)

        def apply(r: Dict[str, Any]) -> None:
            s = r.get("set") or {}
            v = u64(s.get("version"))
            if v <= self._version:
                return
            rates = {k.get("key", ""): float(k.get("rate", 0) or 0) for k in s.get("keys") or []}
            with self._lock:
                self._version = v
                self._rates = rates
                self._set = frozenset(rates)
                self._changed.notify_all()
            if self._on_set is not None:
                try:
                    self._on_set(self._set)
                except Exception:
                    log.exception("keyshard: on_set failed")

        follow(self._cancel, fetch, apply, failed, 10.0)
