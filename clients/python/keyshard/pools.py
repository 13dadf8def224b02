"""Tenant pools: follow a pool's snapshot (GetPoolSnapshot long polls),
answer targets(tenant) and serves(member, tenant); report load."""
import logging
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import errors as E
from ._follow import follow
from ._wire import check_num, check_str, dur, parse_time, u64
from .client import Cancel, Client

__all__ = ["PoolFollower", "LoadReporter", "parse_time"]

log = logging.getLogger("keyshard")

POLL_WAIT = 30.0


class _Tenant:
    __slots__ = ("size", "members", "spans")

    def __init__(self, d: Dict[str, Any]) -> None:
        self.size = int(d.get("size", 0) or 0)
        # members served (subset plus removed within the lookback)
        self.members = frozenset(m.get("member", "") for m in d.get("members") or [])
        spans: List[Tuple[float, List[str]]] = []
        for sp in d.get("targets") or []:
            spans.append((parse_time(sp.get("from")), sorted(sp.get("members") or [])))
        spans.sort(key=lambda x: x[0])
        self.spans = spans

    def targets(self, now: float) -> List[str]:
        cur: List[str] = []
        for frm, members in self.spans:
            if frm <= now:
                cur = members
            else:
                break
        return cur


class PoolFollower:
    """Follows a tenant pool's snapshot in a daemon thread.

    targets(tenant) -> the members to read the tenant from now;
    serves(member, tenant) -> whether member serves it (subset, or removed
    within the lookback). For a tenant the snapshot does not list, both ask
    GetTenants (which answers for unknown tenants too) and cache the answer
    until the snapshot's version changes. Keeps the last snapshot while the
    server is unreachable (stale).
    """

    def __init__(self, client: Client, pool: str, poll_wait: float = POLL_WAIT,
                 clock=time.time) -> None:
        if not isinstance(client, Client):
            raise TypeError("client: want a keyshard.Client, got %s" % type(client).__name__)
        check_str(pool, "pool")
        self._c = client
        self.pool = pool
        self._wait = check_num(poll_wait, "poll_wait", positive=True)
        self._clock = clock
        self._lock = threading.Condition()
        self._version = 0
        self._tenants: Dict[str, _Tenant] = {}
        self._members: List[Dict[str, Any]] = []
        self._unknown: Dict[str, _Tenant] = {}
        self._loaded = False
        self.stale = False
        self.error: Optional[BaseException] = None
        self._cancel = Cancel()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "PoolFollower":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="keyshard-pool-" + self.pool, daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._cancel.cancel()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> "PoolFollower":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> int:
        return self._version

    def wait_ready(self, timeout: float = 10.0) -> None:
        self.start()
        end = time.monotonic() + timeout
        with self._lock:
            while not self._loaded:
                left = end - time.monotonic()
                if left <= 0:
                    raise E.Unavailable("unavailable", "pool %r: no snapshot within %.3gs%s" % (
                        self.pool, timeout, ": %s" % self.error if self.error else ""))
                self._lock.wait(left)

    def wait_version(self, version: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._lock:
            while self._version < version:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def members(self) -> List[Dict[str, Any]]:
        """The pool's members as placed ({"id", "address", "zone", "weight"})."""
        return list(self._members)

    def known(self, tenant: str) -> bool:
        return tenant in self._tenants

    def _tenant(self, tenant: str, timeout: Optional[float]) -> _Tenant:
        check_str(tenant, "tenant")
        t = self._tenants.get(tenant)
        if t is not None:
            return t
        t = self._unknown.get(tenant)
        if t is not None:
            return t
        r = self._c.call("TenantPoolService", "GetTenants", {"pool": self.pool, "tenants": [tenant]},
                         timeout=timeout)
        for st in r.get("tenants") or []:
            a = st.get("assignment") or {}
            if a.get("tenant") == tenant:
                t = _Tenant(a)
                break
        else:
            t = _Tenant({})
        with self._lock:
            if len(self._unknown) > 10000:
                self._unknown.clear()
            self._unknown[tenant] = t
        return t

    def targets(self, tenant: str, timeout: Optional[float] = None) -> List[str]:
        """The members to read tenant from now (sorted)."""
        return list(self._tenant(tenant, timeout).targets(self._clock()))

    def serves(self, member: str, tenant: str, timeout: Optional[float] = None) -> bool:
        """Whether member serves tenant (in its subset, or removed within the lookback)."""
        check_str(member, "member")
        t = self._tenant(tenant, timeout)
        return member in t.members or member in t.targets(self._clock())

    def _run(self) -> None:
        def fetch(first: bool) -> Dict[str, Any]:
            body: Dict[str, Any] = {"pool": self.pool, "sinceVersion": str(self._version)}
            wait = self._wait if self._loaded else 0.0
            if wait:
                body["wait"] = "%gs" % wait
            return self._c.call("TenantPoolService", "GetPoolSnapshot", body, wait=wait, cancel=self._cancel)

        def failed(ex: Exception) -> None:
            with self._lock:
                self.stale, self.error = True, ex
                self._lock.notify_all()
            log.warning("keyshard: pool %s snapshot: %s; keeping the last one", self.pool, ex)

        def apply(r: Dict[str, Any]) -> None:
            snap = r.get("snapshot") or {}
            v = u64(snap.get("version"))
            with self._lock:
                self.stale, self.error = False, None
                if v > self._version or not self._loaded:
                    self._tenants = {a.get("tenant", ""): _Tenant(a) for a in snap.get("tenants") or []}
                    self._members = list(snap.get("members") or [])
                    self._unknown = {}
                    self._version = v
                self._loaded = True
                self._lock.notify_all()

        follow(self._cancel, fetch, apply, failed, 10.0)


class LoadReporter:
    """Reports request counts per tenant (ReportLoad) with a rising seq.

    add(tenant, n) counts requests; flush() sends the counts since the
    previous report (one report at a time; a failed report is retried
    with the same seq and counts, so it counts once), with the time they
    were counted over (period), so that a late report does not read as a
    burst at the leader.
    """

    def __init__(self, client: Client, pool: str, reporter: str) -> None:
        if not isinstance(client, Client):
            raise TypeError("client: want a keyshard.Client, got %s" % type(client).__name__)
        self._c = client
        self.pool = check_str(pool, "pool")
        self.reporter = check_str(reporter, "reporter")
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._counts: Dict[str, int] = {}
        self._seq = 0
        self._taken = time.monotonic()
        self._unsent: Optional[Tuple[int, Dict[str, int], float]] = None

    def add(self, tenant: str, n: int = 1) -> None:
        check_str(tenant, "tenant")
        with self._lock:
            self._counts[tenant] = self._counts.get(tenant, 0) + n

    def flush(self, timeout: Optional[float] = None) -> str:
        """Sends one report; returns its outcome (REPORT_OUTCOME_COUNTED, ...)."""
        with self._send_lock:
            if self._unsent is None:
                now = time.monotonic()
                with self._lock:
                    counts, self._counts = self._counts, {}
                self._seq += 1
                self._unsent = (self._seq, counts, max(now - self._taken, 0.0))
                self._taken = now
            seq, counts, period = self._unsent
            r = report_load(self._c, self.pool, self.reporter, seq, counts, timeout=timeout, period=period)
            self._unsent = None
            return r


def report_load(client: Client, pool: str, reporter: str, seq: int, counts: Mapping[str, int],
                timeout: Optional[float] = None, period: Optional[float] = None) -> str:
    """One ReportLoad call: counts per tenant since the reporter's previous
    report, seq starting at 1 and rising by one, and period, the seconds
    they were counted over (None: the leader places them at their
    arrival). Returns the outcome."""
    check_str(pool, "pool")
    check_str(reporter, "reporter")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError("seq: want an int >= 1")
    items = []
    for t, n in counts.items():
        check_str(t, "counts key")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError("counts[%r]: want an int >= 0" % t)
        items.append({"tenant": t, "count": str(n)})
    body: Dict[str, Any] = {"pool": pool, "reporter": reporter, "seq": str(seq), "counts": items}
    if period is not None:
        body["period"] = dur(period, "period")
    r = client.call("TenantPoolService", "ReportLoad", body, timeout=timeout)
    return str(r.get("outcome", "REPORT_OUTCOME_UNSPECIFIED"))
