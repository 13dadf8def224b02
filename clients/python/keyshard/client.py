"""Client: the Keyshard HTTP/JSON (Connect) API over http.client.

Thread-safe: every thread gets its own keep-alive connection per replica.
Every call is bounded by a timeout; long polls by their wait plus a margin.
"""
import http.client
import json
import logging
import socket
import threading
import time
import urllib.parse
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import errors as E
from ._wire import check_int, check_num, check_str, dur, parse_dur, parse_time, u64
from .types import HotKeyPool, Keyspace, LookupResult, Map, MemberStatus, Owner

__all__ = ["Client", "Cancel", "LONG_POLL_MARGIN"]

log = logging.getLogger("keyshard")

# A long poll is given its wait plus this much to answer.
LONG_POLL_MARGIN = 5.0
# With several replicas, each is given at most this long (plus any wait)
# before the call moves on to the next one.
DEFAULT_REPLICA_TIMEOUT = 5.0

_SERVICES = ("AdminService", "MemberService", "MapService", "HotKeyService", "TenantPoolService")


class Cancel:
    """Cancels blocking calls from another thread: cancel() makes the call
    in flight (and later ones made with this Cancel) fail with Closed at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._socks: List[socket.socket] = []

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleeps up to timeout; True if cancelled meanwhile."""
        return self._event.wait(timeout)

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _attach(self, s: Optional[socket.socket]) -> bool:
        if s is None:
            return not self._event.is_set()
        with self._lock:
            if self._event.is_set():
                return False
            self._socks.append(s)
            return True

    def _detach(self, s: Optional[socket.socket]) -> None:
        with self._lock:
            try:
                self._socks.remove(s)  # type: ignore[arg-type]
            except ValueError:
                pass


class _Endpoint:
    def __init__(self, url: str) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("url: %r is not an http:// or https:// URL with a host" % url)
        self.url = url.rstrip("/")
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.path = u.path.rstrip("/")

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


class _ThreadConns(dict):
    """One thread's connections (replica index -> connection); closed
    when the thread ends and its thread-local state is freed."""

    def __del__(self) -> None:
        for c in self.values():
            try:
                c.close()
            except Exception:
                pass


class _Transient(Exception):
    """A transport failure: the replica may be down; try the next one."""


class Client:
    """A connection to a Keyshard cluster.

    url: one server URL ("http://127.0.0.1:7400") or several replicas'
    URLs separated by commas. A call goes first to the replica that
    answered last; on a connection error, a timeout or an "unavailable"
    answer it moves to the next replica (each tried once per call).
    token: the bearer token, if the server requires one.
    timeout: the default bound of a call, in seconds (long polls: their
    wait plus LONG_POLL_MARGIN).
    replica_timeout: with several replicas, how long one replica is given
    before the call moves on (plus a long poll's wait).

    The constructor does no IO. Safe for use from many threads.
    """

    def __init__(self, url: str, token: Optional[str] = None, timeout: float = 10.0,
                 replica_timeout: float = DEFAULT_REPLICA_TIMEOUT) -> None:
        check_str(url, "url")
        if token is not None:
            check_str(token, "token")
        self.timeout = check_num(timeout, "timeout", positive=True)
        self.replica_timeout = check_num(replica_timeout, "replica_timeout", positive=True)
        urls = [u.strip() for u in url.split(",") if u.strip()]
        if not urls:
            raise ValueError("url: no URL in %r" % url)
        self._eps = [_Endpoint(u) for u in urls]
        self._headers = {"Content-Type": "application/json", "Connect-Protocol-Version": "1",
                         "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = "Bearer " + token
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pref = 0
        # every live connection, for close(); a thread's connections are
        # closed when it ends
        self._conns: "weakref.WeakSet[http.client.HTTPConnection]" = weakref.WeakSet()
        self._closed = False

    # --- transport ----------------------------------------------------------

    @property
    def urls(self) -> List[str]:
        return [e.url for e in self._eps]

    def close(self) -> None:
        """Closes every connection; later calls raise Closed."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
            self._conns = weakref.WeakSet()
        for c in conns:
            try:
                c.close()
            except Exception:
                pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _conn(self, i: int, timeout: float) -> Tuple[http.client.HTTPConnection, bool]:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = _ThreadConns()
        c = conns.get(i)
        if c is not None:
            return c, True
        c = self._eps[i].connect(timeout)
        conns[i] = c
        with self._lock:
            self._conns.add(c)
        return c, False

    def _drop(self, i: int) -> None:
        conns = getattr(self._local, "conns", None) or {}
        c = conns.pop(i, None)
        if c is not None:
            with self._lock:
                self._conns.discard(c)
            try:
                c.close()
            except Exception:
                pass

    def _attempt(self, i: int, path: str, body: bytes, limit: float,
                 cancel: Optional[Cancel]) -> Tuple[int, bytes]:
        """One HTTP exchange with replica i, within limit seconds."""
        ep = self._eps[i]
        deadline = time.monotonic() + limit
        headers = dict(self._headers)
        headers["Connect-Timeout-Ms"] = str(max(1, int(limit * 1000)))
        for retry in (True, False):
            c, reused = self._conn(i, limit)
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Transient("no answer within %.3gs" % limit)
            sock = None
            try:
                c.timeout = left
                if c.sock is None:
                    c.connect()
                c.sock.settimeout(left)
                sock = c.sock
                if cancel is not None and not cancel._attach(sock):
                    raise E.Closed("canceled", "cancelled")
                c.request("POST", ep.path + path, body=body, headers=headers)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout()
                c.sock.settimeout(left)
                resp = c.getresponse()
                data = resp.read()
                if resp.will_close:
                    self._drop(i)
                return resp.status, data
            except E.Closed:
                self._drop(i)
                raise
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as ex:
                self._drop(i)
                if cancel is not None and cancel.cancelled:
                    raise E.Closed("canceled", "cancelled")
                if reused and retry:
                    continue  # a keep-alive connection the server had closed
                raise _Transient(str(ex) or type(ex).__name__)
            except socket.timeout:
                self._drop(i)
                if cancel is not None and cancel.cancelled:
                    raise E.Closed("canceled", "cancelled")
                raise _Transient("no answer within %.3gs" % limit)
            except (OSError, http.client.HTTPException) as ex:
                self._drop(i)
                if cancel is not None and cancel.cancelled:
                    raise E.Closed("canceled", "cancelled")
                raise _Transient(str(ex) or type(ex).__name__)
            finally:
                if cancel is not None and sock is not None:
                    cancel._detach(sock)
        raise _Transient("connection closed")  # not reached

    def call(self, service: str, method: str, body: Optional[Dict[str, Any]] = None,
             timeout: Optional[float] = None, wait: float = 0.0,
             cancel: Optional[Cancel] = None) -> Dict[str, Any]:
        """Calls keyshard.v1.<service>/<method> with the JSON body and
        returns the decoded answer. timeout bounds the whole call (default:
        the client's, or for a long poll its wait plus LONG_POLL_MARGIN,
        per replica with several); wait (seconds) is the long-poll wait the
        body asks for: each replica is given replica_timeout + wait.
        Without a wait, with several replicas, each is given at most
        replica_timeout and a share of what is left of timeout. cancel
        (a Cancel) interrupts the call from another thread. Raises a
        KeyshardError subclass; Unavailable names every URL tried."""
        check_str(service, "service")
        check_str(method, "method")
        if service.startswith("keyshard.v1."):
            service = service[len("keyshard.v1."):]
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise TypeError("body: want a dict, got %s" % type(body).__name__)
        n = len(self._eps)
        check_num(wait, "wait")
        if timeout is None:
            if wait and n > 1:
                timeout = (self.replica_timeout + wait) * n
            else:
                timeout = self.timeout + (wait + LONG_POLL_MARGIN if wait else 0.0)
        else:
            check_num(timeout, "timeout", positive=True)
        if self._closed:
            raise E.Closed("canceled", "the client is closed")
        payload = json.dumps(body, separators=(",", ":")).encode("utf-8")
        path = "/keyshard.v1.%s/%s" % (service, method)
        start = time.monotonic()
        first = self._pref
        tried: List[str] = []
        last: Optional[E.KeyshardError] = None
        for k in range(n):
            if cancel is not None and cancel.cancelled:
                raise E.Closed("canceled", "cancelled")
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                break
            if n == 1:
                limit = left
            elif wait:
                # a long poll: each replica may hold it for its wait
                limit = min(left, self.replica_timeout + wait)
            else:
                # a share of what is left for each replica still to try
                limit = min(left / (n - k), self.replica_timeout)
            i = (first + k) % n
            url = self._eps[i].url
            try:
                status, data = self._attempt(i, path, payload, limit, cancel)
            except _Transient as ex:
                tried.append("%s: %s" % (url, ex))
                last = None
                if k + 1 < n:
                    log.warning("keyshard: replica %s unavailable (%s); trying the next", url, ex)
                continue
            if status == 200:
                self._pref = i
                try:
                    out = json.loads(data or b"{}")
                except ValueError:
                    raise E.Internal("internal", "%s%s: the answer is not JSON: %r" % (url, path, data[:200]))
                return out if isinstance(out, dict) else {}
            try:
                doc = json.loads(data) if data else None
            except ValueError:
                doc = None
            err = E.error_from_body(status, doc, fallback="HTTP %d from %s: %s" % (
                status, url, data[:200].decode("utf-8", "replace")))
            if isinstance(err, E.Unavailable):
                tried.append("%s: %s" % (url, err.message))
                last = err
                continue
            self._pref = i
            raise err
        if not tried:
            tried.append("no replica tried within %.3gs" % timeout)
        msg = "%s/%s: no replica answered (tried %s)" % (service, method, "; ".join(tried))
        details = last.details if last is not None else []
        raise E.Unavailable("unavailable", msg, details)

    # --- admin --------------------------------------------------------------

    def create_keyspace(self, name: str, buckets: int = 4096, hash: str = "xxh64",
                        mode: str = "exclusive", lease_ttl: Optional[float] = None,
                        drain_timeout: Optional[float] = None,
                        timeout: Optional[float] = None) -> Keyspace:
        """Creates a keyspace (mode "exclusive" or "stream"; seconds for
        lease_ttl and drain_timeout; None: the server's default)."""
        return Keyspace.from_json(self.call("AdminService", "CreateKeyspace", {
            "keyspace": _keyspace_json(name, buckets, hash, mode, lease_ttl, drain_timeout)},
            timeout=timeout).get("keyspace"))

    def get_keyspace(self, name: str, timeout: Optional[float] = None) -> Keyspace:
        check_str(name, "name")
        return Keyspace.from_json(self.call("AdminService", "GetKeyspace", {"name": name},
                                            timeout=timeout).get("keyspace"))

    def list_keyspaces(self, timeout: Optional[float] = None) -> List[Keyspace]:
        r = self.call("AdminService", "ListKeyspaces", {}, timeout=timeout)
        return [Keyspace.from_json(k) for k in r.get("keyspaces") or []]

    def update_keyspace(self, name: str, lease_ttl: Optional[float] = None,
                        drain_timeout: Optional[float] = None,
                        timeout: Optional[float] = None) -> Keyspace:
        """Changes a keyspace's lease TTL and/or drain timeout (seconds)."""
        check_str(name, "name")
        ks: Dict[str, Any] = {"name": name}
        if lease_ttl is not None:
            ks["leaseTtl"] = dur(lease_ttl, "lease_ttl")
        if drain_timeout is not None:
            ks["drainTimeout"] = dur(drain_timeout, "drain_timeout")
        return Keyspace.from_json(self.call("AdminService", "UpdateKeyspace", {"keyspace": ks},
                                            timeout=timeout).get("keyspace"))

    def list_members(self, keyspace: str, timeout: Optional[float] = None) -> Tuple[List[MemberStatus], int]:
        """The keyspace's members and the map epoch."""
        check_str(keyspace, "keyspace")
        r = self.call("AdminService", "ListMembers", {"keyspace": keyspace}, timeout=timeout)
        return [MemberStatus.from_json(m) for m in r.get("members") or []], u64(r.get("epoch"))

    def drain_member(self, keyspace: str, member: str, timeout: Optional[float] = None) -> None:
        check_str(keyspace, "keyspace")
        check_str(member, "member")
        self.call("AdminService", "DrainMember", {"keyspace": keyspace, "member": member}, timeout=timeout)

    def status(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Status: {"replica", "leader", "keyspaces": [{"keyspace": Keyspace,
        "epoch", "members", "unassigned_buckets", "handoffs_in_flight",
        "draining_members", "releasing_buckets", "members_without_buckets"}],
        "replicas": [{"id", "url", "leader"}], "store": {"healthy", "error",
        "endpoints", "db_size_bytes", "revision", "latency"}}. A member token
        may read it.

        members_without_buckets counts the active members (kept alive once,
        not draining) that the current map gives no bucket: while there are
        at least as many buckets, nonzero means a map the leader has not
        written yet (a join held back by the rebalance gap). A keyspace has
        settled when unassigned_buckets, handoffs_in_flight,
        releasing_buckets and members_without_buckets are all 0."""
        r = self.call("AdminService", "Status", {}, timeout=timeout)
        st = r.get("store") or {}
        return {"replica": r.get("replica", ""), "leader": r.get("leader", ""),
                "keyspaces": [{"keyspace": Keyspace.from_json(k.get("keyspace")),
                               "epoch": u64(k.get("epoch")), "members": int(k.get("members", 0)),
                               "unassigned_buckets": int(k.get("unassignedBuckets", 0)),
                               "handoffs_in_flight": int(k.get("handoffsInFlight", 0)),
                               "draining_members": int(k.get("drainingMembers", 0)),
                               "releasing_buckets": int(k.get("releasingBuckets", 0)),
                               "members_without_buckets": int(k.get("membersWithoutBuckets", 0))}
                              for k in r.get("keyspaces") or []],
                "replicas": [{"id": x.get("id", ""), "url": x.get("url", ""), "leader": bool(x.get("leader"))}
                             for x in r.get("replicas") or []],
                "store": {"healthy": bool(st.get("healthy")), "error": st.get("error", ""),
                          "endpoints": list(st.get("endpoints") or []), "db_size_bytes": u64(st.get("dbSizeBytes")),
                          "revision": u64(st.get("revision")), "latency": parse_dur(st.get("latency"))}}

    def history(self, keyspace: str, limit: int = 0, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        """The latest epochs of keyspace's map, newest first (limit 0: 50;
        at most 500): [{"epoch", "time" (Unix seconds), "reason" ("create",
        "join", "leave", "crash", "drain", "load", "update", "import"),
        "members", "moved_buckets", "moves": [(from, to, buckets)],
        "detail"}]. Any replica answers; a member token may read it."""
        check_str(keyspace, "keyspace")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= 500:
            raise ValueError("limit: want an int in 0..500, got %r" % (limit,))
        r = self.call("AdminService", "GetKeyspaceHistory", {"keyspace": keyspace, "limit": limit}, timeout=timeout)
        return [{"epoch": u64(c.get("epoch")), "time": parse_time(c.get("time")),
                 "reason": str(c.get("reason", "MOVE_REASON_UNSPECIFIED")).replace("MOVE_REASON_", "").lower(),
                 "members": list(c.get("members") or []), "moved_buckets": int(c.get("movedBuckets", 0)),
                 "moves": [(m.get("from", ""), m.get("to", ""), int(m.get("buckets", 0))) for m in c.get("moves") or []],
                 "detail": c.get("detail", "")} for c in r.get("changes") or []]

    def buckets(self, keyspace: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Every bucket of keyspace in runs of alike buckets: {"epoch",
        "buckets", "stream", "runs": [{"first", "count", "owner", "holder",
        "token", "state" ("unassigned", "granted", "releasing",
        "awaiting-grant"), "position"}]}; owner and holder are member ids
        ("" none). Any replica answers; a member token may read it."""
        check_str(keyspace, "keyspace")
        r = self.call("AdminService", "GetBuckets", {"keyspace": keyspace}, timeout=timeout)
        ms = list(r.get("members") or [])

        def member(i: Any) -> str:
            i = int(i or 0)
            return ms[i - 1] if 0 < i <= len(ms) else ""
        return {"epoch": u64(r.get("epoch")), "buckets": int(r.get("buckets", 0)), "stream": bool(r.get("stream")),
                "runs": [{"first": int(x.get("first", 0)), "count": int(x.get("count", 0)),
                          "owner": member(x.get("owner")), "holder": member(x.get("holder")), "token": u64(x.get("token")),
                          "state": str(x.get("state", "BUCKET_STATE_UNSPECIFIED")).replace("BUCKET_STATE_", "").lower().replace("_", "-"),
                          "position": u64(x.get("position"))} for x in r.get("runs") or []]}

    def put_hot_key_pool(self, name: str, threshold: float, low_threshold: Optional[float] = None,
                         cooldown: Optional[float] = None, report_threshold: Optional[float] = None,
                         report_max_age: Optional[float] = None, max_keys: Optional[int] = None,
                         timeout: Optional[float] = None) -> HotKeyPool:
        """Creates or replaces a hot-key pool (rates in msg/s, durations in s)."""
        check_str(name, "name")
        p: Dict[str, Any] = {"name": name, "threshold": check_num(threshold, "threshold", positive=True)}
        if low_threshold is not None:
            p["lowThreshold"] = check_num(low_threshold, "low_threshold")
        if cooldown is not None:
            p["cooldown"] = dur(cooldown, "cooldown")
        if report_threshold is not None:
            p["reportThreshold"] = check_num(report_threshold, "report_threshold")
        if report_max_age is not None:
            p["reportMaxAge"] = dur(report_max_age, "report_max_age")
        if max_keys is not None:
            p["maxKeys"] = check_int(max_keys, "max_keys")
        return HotKeyPool.from_json(self.call("AdminService", "PutHotKeyPool", {"pool": p},
                                              timeout=timeout).get("pool"))

    def list_hot_key_pools(self, timeout: Optional[float] = None) -> List[HotKeyPool]:
        r = self.call("AdminService", "ListHotKeyPools", {}, timeout=timeout)
        return [HotKeyPool.from_json(p) for p in r.get("pools") or []]

    def get_positions(self, keyspace: str, behind: int = 0, timeout: Optional[float] = None) -> Dict[str, Any]:
        """A stream keyspace's positions: {"min", "max", "spread", "runs":
        [{"first", "count", "position"}], "behind": [{"bucket", "position",
        "member", "token"}], "epoch", "revision"} (ints)."""
        check_str(keyspace, "keyspace")
        body: Dict[str, Any] = {"keyspace": keyspace}
        if check_int(behind, "behind", 0, 1000):
            body["behind"] = behind
        r = self.call("AdminService", "GetPositions", body, timeout=timeout)
        return {"min": u64(r.get("min")), "max": u64(r.get("max")), "spread": u64(r.get("spread")),
                "runs": [{"first": int(x.get("first", 0)), "count": int(x.get("count", 0)),
                          "position": u64(x.get("position"))} for x in r.get("runs") or []],
                "behind": [{"bucket": int(x.get("bucket", 0)), "position": u64(x.get("position")),
                            "member": x.get("member", ""), "token": u64(x.get("token"))}
                           for x in r.get("behind") or []],
                "epoch": u64(r.get("epoch")), "revision": u64(r.get("revision"))}

    # --- maps -----------------------------------------------------------------

    def get_map(self, keyspace: str, since_epoch: int = 0, wait: float = 0.0,
                timeout: Optional[float] = None, cancel: Optional[Cancel] = None) -> Tuple[Map, bool]:
        """The keyspace's map, and whether it is newer than since_epoch.
        With wait > 0 (seconds, at most 60) a long poll."""
        check_str(keyspace, "keyspace")
        check_int(since_epoch, "since_epoch")
        body: Dict[str, Any] = {"keyspace": keyspace, "sinceEpoch": str(since_epoch)}
        if wait:
            body["wait"] = dur(wait, "wait")
        r = self.call("MapService", "GetMap", body, timeout=timeout, wait=wait, cancel=cancel)
        return Map.from_json(r.get("map")), bool(r.get("changed", False))

    def lookup(self, keyspace: str, keys: Sequence[str], timeout: Optional[float] = None) -> LookupResult:
        """Asks the server for the owners of keys (no local hashing)."""
        check_str(keyspace, "keyspace")
        if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
            raise TypeError("keys: want a list of str, got %s" % type(keys).__name__)
        for i, k in enumerate(keys):
            if not isinstance(k, str):
                raise TypeError("keys[%d]: want a str, got %s" % (i, type(k).__name__))
        r = self.call("MapService", "Lookup", {"keyspace": keyspace, "keys": list(keys)}, timeout=timeout)
        return LookupResult(epoch=u64(r.get("epoch")), owners=[
            Owner(key=o.get("key", ""), bucket=int(o.get("bucket", 0)), member=o.get("member", ""),
                  address=o.get("address", "")) for o in r.get("owners") or []])


def _keyspace_json(name: str, buckets: int, hash: str, mode: str, lease_ttl: Optional[float],
                   drain_timeout: Optional[float]) -> Dict[str, Any]:
    check_str(name, "name")
    check_int(buckets, "buckets", 1, 65536)
    if hash not in ("xxh64", "synapse-sha256"):
        raise ValueError("hash: %r is not a hash mode; want xxh64 or synapse-sha256" % (hash,))
    modes = {"exclusive": "KEYSPACE_MODE_EXCLUSIVE", "stream": "KEYSPACE_MODE_STREAM",
             "KEYSPACE_MODE_EXCLUSIVE": "KEYSPACE_MODE_EXCLUSIVE", "KEYSPACE_MODE_STREAM": "KEYSPACE_MODE_STREAM"}
    if mode not in modes:
        raise ValueError("mode: %r is not a keyspace mode; want exclusive or stream" % (mode,))
    ks: Dict[str, Any] = {"name": name, "buckets": buckets, "hash": hash, "mode": modes[mode]}
    if lease_ttl is not None:
        ks["leaseTtl"] = dur(lease_ttl, "lease_ttl")
    if drain_timeout is not None:
        ks["drainTimeout"] = dur(drain_timeout, "drain_timeout")
    return ks
