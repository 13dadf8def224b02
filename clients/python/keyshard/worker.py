"""Worker: a member of a keyspace that joins, keeps its session alive,
fences itself, and calls a handler as buckets are granted and taken back.

Mirrors the Go SDK's client.Worker (see README "What a worker in any
language must do").
"""
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import errors as E
from ._hash import bucket as _bucket
from ._backoff import Backoff
from ._wire import check_num, check_str, parse_dur, u64
from .client import Cancel, Client
from .router import Router
from .types import Keyspace

__all__ = ["Worker", "Grant", "Event", "Handler", "fence_margin"]

log = logging.getLogger("keyshard")

KEEPALIVE_RETRY = 0.05
POLL_WAIT = 30.0
MAX_FENCE_MARGIN = 12 * 3600.0

Clock = Callable[[], float]


def fence_margin(ttl: float, margin: Optional[float] = None) -> float:
    """The fence margin for a lease TTL: margin, or max(TTL/10, 0.5 s);
    at most TTL/2."""
    if margin is None or margin <= 0:
        margin = max(ttl / 10.0, 0.5)
    return min(margin, ttl / 2.0)


class _Session:
    """One Join: its fence deadline (newest acknowledged keep-alive send +
    TTL - margin) on the worker's monotonic clock."""

    def __init__(self, sid: str, ttl: float, margin: float, sent: float, keyspace: Keyspace,
                 clock: Clock) -> None:
        self.id = sid
        self.ttl = ttl
        self.margin = margin
        self.keyspace = keyspace
        self.clock = clock
        self._lock = threading.Lock()
        self.deadline = sent + ttl - margin
        self.void = False
        self.acked = False
        # guarded by Worker._mu:
        self.fenced = False
        self.self_fenced = False
        self.released: Dict[int, int] = {}
        self.finals: Dict[int, "tuple[int, int]"] = {}  # bucket -> (token, position)
        self.pending: List["Grant"] = []
        self.releasing = 0  # handoffs whose release() is due or running (see _release_loop)
        self.held: List["Grant"] = []
        self.rev = 0
        self.min_rev = 0
        self.kick = threading.Event()
        self.cancel = Cancel()      # cancels the session's blocking calls
        self.ended = threading.Event()

    def valid(self) -> bool:
        """Within the fence deadline now. Once False, always False."""
        with self._lock:
            if not self.void and self.clock() >= self.deadline:
                self.void = True
            return not self.void

    def renewed(self, sent: float, ttl: float) -> bool:
        """A keep-alive sent at sent was acknowledged (ttl: the lease time
        left, at most the session's TTL). False if the session was void."""
        with self._lock:
            if not self.void and self.clock() >= self.deadline:
                self.void = True
            if self.void:
                return False
            self.acked = True
            d = sent + min(ttl, self.ttl) - self.margin
            if d > self.deadline:
                self.deadline = d
            return True

    def end(self) -> None:
        with self._lock:
            self.void = True


class Grant:
    """A bucket granted to the worker at a fencing token.

    Pass token to every resource you write (fence column). Call valid()
    right before each write: it is False once the session's fence deadline
    passed (checked on the clock, so also in a process just resumed from
    a pause) or the grant was cancelled. cancelled (a threading.Event) is
    set when the grant ends: at a self-fence or loss before release() is
    called, after release() returned for a handoff.
    In a stream keyspace, from_position is where the bucket's work
    starts (the bucket's committed position).
    """

    __slots__ = ("bucket", "token", "from_position", "cancelled", "_s")

    def __init__(self, bucket: int, token: int, from_position: int, session: Optional[_Session]) -> None:
        self.bucket = bucket
        self.token = token
        self.from_position = from_position
        self.cancelled = threading.Event()
        self._s = session

    def valid(self) -> bool:
        if self.cancelled.is_set():
            return False
        if self._s is not None and not self._s.valid():
            self.cancelled.set()
            return False
        return True

    @property
    def position(self) -> int:
        """Stream keyspaces: where the bucket's work starts (from_position)."""
        return self.from_position

    @property
    def deadline(self) -> float:
        """The session's fence deadline (worker clock, time.monotonic by default)."""
        return self._s.deadline if self._s is not None else 0.0

    @property
    def session(self) -> str:
        return self._s.id if self._s is not None else ""

    def __repr__(self) -> str:
        return "Grant(bucket=%d, token=%d, from_position=%d)" % (self.bucket, self.token, self.from_position)


@dataclass
class Event:
    """Something that happened to a Worker. kind: "joined", "acquired",
    "released", "fenced", "session-lost", "rejoined", "left", "renewed",
    "release-recorded", "committed"."""
    kind: str
    session: str = ""
    grant: Optional[Grant] = None
    err: Optional[BaseException] = None
    deadline: float = 0.0
    final: Optional[int] = None
    time: float = 0.0


class Handler:
    """The interface a Worker's handler implements (duck typing is fine).

    acquire(grant) is called when a bucket is granted; release(bucket,
    grant) when the grant ends. For one bucket the calls alternate and
    never overlap. For a handoff release is called with the grant still
    valid: finish in-flight work and return; the Release RPC is sent after
    it returns. After a self-fence grant.cancelled is set first: stop at
    once. In a stream keyspace, an optional final_position(bucket) -> int
    or None gives the position handed over with the release.
    """

    def acquire(self, grant: Grant) -> None:  # pragma: no cover
        pass

    def release(self, bucket: int, grant: Grant) -> None:  # pragma: no cover
        pass


class _GrantState:
    __slots__ = ("g", "s", "ending", "how", "acquired", "skipped", "releasing", "done")

    def __init__(self, g: Grant, s: _Session) -> None:
        self.g = g
        self.s = s
        self.ending = False
        self.how = ""           # "handoff" or "fence"
        self.acquired = False
        self.skipped = False
        self.releasing = False  # counted in s.releasing, from its end as a handoff until release() returned
        self.done = threading.Event()


# How long released buckets wait for the other handoffs of their burst (those
# whose release() is still due or running) before they are sent without
# them. Real time (time.monotonic), not the worker's clock.
_RELEASE_COALESCE = 0.002


class _SessionGone(Exception):
    pass


class _BucketQueue:
    """Runs tasks in order per bucket on a thread pool: never two of one
    bucket at once."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._q: Dict[int, List[Callable[[], None]]] = {}
        self._idle = threading.Condition(self._lock)

    def submit(self, b: int, fn: Callable[[], None]) -> None:
        with self._lock:
            q = self._q.get(b)
            if q is not None:
                q.append(fn)
                return
            self._q[b] = []
        self._pool.submit(self._run, b, fn)

    def _run(self, b: int, fn: Callable[[], None]) -> None:
        while True:
            try:
                fn()
            except Exception:
                log.exception("keyshard: worker task for bucket %d failed", b)
            with self._lock:
                q = self._q[b]
                if not q:
                    del self._q[b]
                    self._idle.notify_all()
                    return
                fn = q.pop(0)

    def wait_idle(self, timeout: Optional[float]) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._q:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
            return True


class Worker:
    """A member of keyspace: joins as member_id, keeps its session alive
    (KeepAlive at once, then every TTL/3 counted from the send), fences
    itself past its fence deadline, follows its grants (GetGrants long
    polls) and calls handler.acquire(grant) / handler.release(bucket,
    grant) on its own threads, never concurrently for one bucket.

    start() runs it in background threads; run() blocks until it stops;
    close(timeout) drains (releases everything gracefully) then leaves.
    on_event(Event) is called, serialized, from the worker's threads.
    fence_margin: seconds (default max(TTL/10, 0.5), at most TTL/2).
    replace: take over member_id from a live session (a restarted process).
    Handlers and on_event must not call close() (close waits for them).
    """

    def __init__(self, client: Client, keyspace: str, member_id: str, handler: Any,
                 address: str = "", weight: float = 1, zone: str = "", replace: bool = False,
                 fence_margin: Optional[float] = None,
                 on_event: Optional[Callable[[Event], None]] = None,
                 metadata: Optional[Dict[str, str]] = None,
                 max_handler_threads: int = 64,
                 clock: Clock = time.monotonic) -> None:
        if not isinstance(client, Client):
            raise TypeError("client: want a keyshard.Client, got %s" % type(client).__name__)
        check_str(keyspace, "keyspace")
        check_str(member_id, "member_id")
        check_str(address, "address", required=False)
        check_str(zone, "zone", required=False)
        check_num(weight, "weight", positive=True)
        if handler is None or not callable(getattr(handler, "acquire", None)) or \
                not callable(getattr(handler, "release", None)):
            raise TypeError("handler: want an object with acquire(grant) and release(bucket, grant)")
        if not isinstance(replace, bool):
            raise TypeError("replace: want a bool")
        if fence_margin is not None:
            check_num(fence_margin, "fence_margin", positive=True)
            if fence_margin >= MAX_FENCE_MARGIN:
                raise ValueError("fence_margin: %r is not below %r s" % (fence_margin, MAX_FENCE_MARGIN))
        if on_event is not None and not callable(on_event):
            raise TypeError("on_event: want a callable")
        if metadata is not None and (not isinstance(metadata, dict) or
                                     not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
            raise TypeError("metadata: want a dict of str to str")
        self._c = client
        self.keyspace = keyspace
        self.member_id = member_id
        self._member: Dict[str, Any] = {"id": member_id, "weight": weight}
        if address:
            self._member["address"] = address
        if zone:
            self._member["zone"] = zone
        if metadata:
            self._member["metadata"] = dict(metadata)
        self._h = handler
        self._replace = replace
        self._margin = fence_margin
        self._on_event = on_event
        self._clock = clock
        self._router = Router(client, keyspace)
        self._mu = threading.RLock()
        self._emit_mu = threading.Lock()
        self._grants: Dict[int, _GrantState] = {}
        self._cur: Optional[_Session] = None
        self._last_ttl = 0.0
        self._keyspace: Optional[Keyspace] = None
        self._pool = ThreadPoolExecutor(max_workers=max_handler_threads, thread_name_prefix="keyshard-handler")
        self._bq = _BucketQueue(self._pool)
        self._draining = threading.Event()
        self._stop = Cancel()      # hard stop: end everything now
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._changed = threading.Condition(self._mu)
        self._release_coalesce = _RELEASE_COALESCE

    # --- public API -----------------------------------------------------------

    def start(self) -> "Worker":
        """Starts the worker in background threads (non-blocking)."""
        with self._mu:
            if self._thread is not None:
                return self
            if self._draining.is_set():
                raise E.Closed("canceled", "the worker was closed before it started")
            self._thread = threading.Thread(target=self._main, name="keyshard-worker-" + self.member_id,
                                            daemon=True)
            self._thread.start()
        return self

    def run(self) -> None:
        """Starts the worker and blocks until it stops (after close(), or
        on a permanent error, which it raises). Ctrl-C drains and leaves."""
        self.start()
        try:
            while not self._done.wait(0.5):
                pass
        except KeyboardInterrupt:
            self.close()
        if self._error is not None:
            raise self._error

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the worker stopped; True if it did."""
        return self._done.wait(timeout)

    @property
    def error(self) -> Optional[BaseException]:
        """Why the worker stopped by itself (a permanent error), if it did."""
        return self._error

    @property
    def session(self) -> str:
        s = self._cur
        return s.id if s is not None else ""

    def close(self, timeout: float = 30.0) -> bool:
        """Leaves gracefully: asks the server to move every bucket away,
        releases them as asked (handlers' release run), and waits until
        the server ended the session, for at most timeout seconds; then
        stops at once, ending what is left as a self-fence does. Returns
        True if the drain completed. Idempotent."""
        check_num(timeout, "timeout")
        self._draining.set()
        with self._mu:
            t = self._thread
            self._changed.notify_all()
        if t is None:
            self._router.close()
            self._done.set()
            self._pool.shutdown(wait=False)
            return True
        ok = self._done.wait(timeout)
        if not ok:
            self._hard_stop()
            self._done.wait(10.0)
        return ok

    def __enter__(self) -> "Worker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def held(self) -> List[Grant]:
        """The grants the worker acts on, by bucket: acquired, not being
        released, and valid."""
        with self._mu:
            out = [gs.g for gs in self._grants.values() if gs.acquired and not gs.ending and gs.g.valid()]
        out.sort(key=lambda g: g.bucket)
        return out

    def owns(self, key: Union[str, bytes]) -> Grant:
        """The grant of key's bucket if the worker holds it (as held()
        counts it). Otherwise raises WrongOwner naming the owner under the
        worker's map, or NotGranted if the map names this worker but the
        grant has not arrived (or not joined yet, or fencing)."""
        ks = self._keyspace
        if ks is None:
            raise NotGranted("unavailable", "the worker has not joined yet")
        b = _bucket(key, ks.buckets, ks.hash)
        with self._mu:
            gs = self._grants.get(b)
            if gs is not None and gs.acquired and not gs.ending:
                if not gs.g.valid():
                    raise NotGranted("unavailable", "bucket %d: the session's fence deadline passed; "
                                     "the worker is fencing" % b)
                return gs.g
        m = self._router.map
        if m is None:
            raise NotGranted("unavailable", "bucket %d: no map yet" % b)
        owner = m.owner_of(b)
        if owner is not None and owner.id == self.member_id:
            raise NotGranted("unavailable", "bucket %d: not granted yet" % b)
        if owner is None:
            raise E.WrongOwner(b, "", "", m.epoch)
        return _raise_wrong_owner(b, owner.id, owner.address, m.epoch)

    def wait_held(self, n: int, timeout: float) -> bool:
        """Waits until the worker holds at least n buckets."""
        end = time.monotonic() + timeout
        with self._mu:
            while len(self.held()) < n:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.1))
            return True

    def commit(self, position: int, exceptions: Optional[Dict[int, int]] = None,
               timeout: Optional[float] = None) -> int:
        """Stream keyspaces: commits position for every held bucket, except
        those in exceptions ({bucket: position}). max_token is the highest
        token among the session's grants; released buckets with a final
        position are listed at it until the release is done. Returns the
        revision. List as exceptions the buckets not caught up to position
        (just granted, catching up) or ahead of it. Raises SessionLost
        without a live session, FailedPrecondition for a position that
        would go backwards ("backwards" in the message)."""
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise TypeError("position: want a non-negative int")
        exc = dict(exceptions or {})
        for b, p in exc.items():
            if isinstance(b, bool) or not isinstance(b, int) or isinstance(p, bool) or not isinstance(p, int):
                raise TypeError("exceptions: want a dict of int bucket to int position")
        with self._mu:
            s = self._cur
            if s is None or s.fenced or not s.valid():
                raise E.SessionLost("aborted", "no live session to commit for")
            tokens = {b: gs.g.token for b, gs in self._grants.items() if gs.s is s}
            finals = {b: f for b, f in s.finals.items() if b not in tokens and b not in exc}
        for b in exc:
            if b not in tokens:
                raise ValueError("exceptions: bucket %d is not held by the worker" % b)
        max_token = max(tokens.values(), default=0)
        for probed in (False, True):
            items = [{"bucket": b, "token": str(tokens[b]), "position": str(p)} for b, p in exc.items()]
            items += [{"bucket": b, "token": str(tok), "position": str(p)} for b, (tok, p) in finals.items()]
            items.sort(key=lambda e: e["bucket"])
            mt = max([max_token] + [tok for tok, _ in finals.values()])
            body: Dict[str, Any] = {"session": s.id, "maxToken": str(mt), "position": str(position)}
            if items:
                body["exceptions"] = items
            try:
                r = self._c.call("MemberService", "Commit", body, timeout=timeout)
            except E.FailedPrecondition as ex:
                if probed or not finals or "backwards" in ex.message.lower():
                    raise
                finals = self._probe_finals(s, finals, timeout)
                continue
            except E.NotFound as ex:
                raise E.SessionLost("aborted", "commit: session %s ended: %s" % (s.id, ex.message))
            rev = u64(r.get("revision"))
            self._emit(Event("committed", session=s.id))
            return rev
        raise AssertionError("not reached")

    def _probe_finals(self, s: _Session, finals: Dict[int, "tuple[int, int]"],
                      timeout: Optional[float]) -> Dict[int, "tuple[int, int]"]:
        """Which released buckets the server still holds for s (releasing
        each again at its final position); forgets the others."""
        kept = {}
        for b, (tok, p) in finals.items():
            try:
                self._c.call("MemberService", "Release", {
                    "session": s.id, "buckets": [{"bucket": b, "token": str(tok)}],
                    "positions": [{"bucket": b, "token": str(tok), "position": str(p)}]}, timeout=timeout)
                kept[b] = (tok, p)
            except (E.InvalidArgument, E.FailedPrecondition):
                with self._mu:
                    if s.finals.get(b, (None,))[0] == tok:
                        del s.finals[b]
        return kept

    # --- internals: events ------------------------------------------------------

    def _emit(self, ev: Event) -> None:
        ev.time = self._clock()
        if self._on_event is None:
            return
        with self._emit_mu:
            try:
                self._on_event(ev)
            except Exception:
                log.exception("keyshard: on_event failed")

    def _notify(self) -> None:
        with self._mu:
            self._changed.notify_all()

    def _hard_stop(self) -> None:
        self._stop.cancel()
        with self._mu:
            s = self._cur
        if s is not None:
            s.cancel.cancel()

    # --- internals: the session loop ---------------------------------------------

    def _main(self) -> None:
        try:
            self._router.start()
            self._loop()
        except E.Closed:
            pass
        except BaseException as ex:  # a permanent error
            self._error = ex
            log.error("keyshard: worker %s stopped: %s", self.member_id, ex)
        finally:
            with self._mu:
                for gs in list(self._grants.values()):
                    self._end_grant(gs, "fence")
            self._bq.wait_idle(5.0 if self._stopping() else 30.0)
            self._router.close()
            self._pool.shutdown(wait=False)
            self._done.set()
            self._notify()

    def _stopping(self) -> bool:
        return self._stop.cancelled

    def _loop(self) -> None:
        rejoin = Backoff(0.1, 10.0)
        fenced = ""
        first = True
        while True:
            s = self._join(first, fenced)
            if s is None:
                return
            with self._mu:
                self._cur = s
                self._last_ttl = s.ttl
                self._keyspace = s.keyspace
            self._emit(Event("joined" if first else "rejoined", session=s.id))
            cause = self._run_session(s)
            with self._mu:
                self._cur = None
            if cause is None:
                self._emit(Event("left", session=s.id))
                return
            if self._stopping():
                return
            fenced = s.id if s.self_fenced else ""
            lost = E.SessionLost("aborted", "session %s: %s" % (s.id, cause))
            log.error("keyshard: session %s lost; re-joining: %s", s.id, cause)
            self._emit(Event("session-lost", session=s.id, err=lost))
            if self._draining.is_set():
                return
            first = False
            if s.acked:
                rejoin.reset()
                continue
            rejoin.limit = min(max(s.ttl, 1.0), 10.0)
            if self._stop.wait(rejoin.next()):
                return

    def _join(self, first: bool, fenced: str) -> Optional[_Session]:
        body: Dict[str, Any] = {"keyspace": self.keyspace, "member": self._member,
                                "replace": self._replace or bool(fenced)}
        if fenced:
            body["fencedSession"] = fenced
        b = Backoff(0.1, 10.0)
        while not self._draining.is_set() and not self._stopping():
            ttl = self._last_ttl
            within = ttl - fence_margin(ttl, self._margin) if ttl > 0 else \
                self._c.replica_timeout * len(self._c.urls)
            sent = self._clock()
            try:
                r = self._c.call("MemberService", "Join", body, timeout=within, cancel=self._stop)
                try:
                    s = self._new_session(r, sent)
                except E.KeyshardError:
                    self._abandon(r.get("session", ""))
                    raise
                if s.valid():
                    return s
                err: BaseException = E.Unavailable("unavailable", "the Join's answer came after the "
                                                   "session's fence deadline")
            except E.Closed:
                return None
            except E.KeyshardError as ex:
                err = ex
            if isinstance(err, (E.Unavailable, E.Aborted, E.Unknown)):
                body["replace"] = True  # our Join may have created a session nobody keeps alive
            if isinstance(err, (E.InvalidArgument, E.NotFound, E.FailedPrecondition,
                                E.Unauthenticated, E.PermissionDenied)) or \
                    (first and isinstance(err, E.AlreadyExists)):
                if isinstance(err, E.AlreadyExists):
                    raise type(err)(err.code, "join keyspace %r as %r: %s (pass replace=True to take over "
                                    "the id from a live session)" % (self.keyspace, self.member_id, err.message))
                raise type(err)(err.code, "join keyspace %r as %r: %s" % (  # type: ignore[union-attr]
                    self.keyspace, self.member_id, getattr(err, "message", err)))
            log.warning("keyshard: join failed; retrying: %s", err)
            if self._stop.wait(b.next()):
                return None
            if self._draining.is_set():
                return None
        return None

    def _abandon(self, sid: str) -> None:
        """Tries once to end a session the worker will not use."""
        if not sid:
            return
        try:
            self._c.call("MemberService", "Leave", {"session": sid}, timeout=self._c.replica_timeout)
        except E.KeyshardError as ex:
            log.warning("keyshard: could not leave unusable session %s; it ends when its lease expires: %s",
                        sid, ex)

    def _new_session(self, r: Dict[str, Any], sent: float) -> _Session:
        ks = Keyspace.from_json(r.get("keyspace"))
        ttl = parse_dur(r.get("leaseTtl")) or ks.lease_ttl
        sid = r.get("session", "")
        if not sid or ttl <= 0:
            raise E.Internal("internal", "join: the answer lacks the session or its lease TTL")
        if ks.hash not in ("xxh64", "synapse-sha256"):
            raise E.InvalidArgument("invalid_argument", "the keyspace's hash %r is not supported by this "
                                    "client; upgrade it" % ks.hash)
        return _Session(sid, ttl, fence_margin(ttl, self._margin), sent, ks, self._clock)

    def _run_session(self, s: _Session) -> Optional[BaseException]:
        """Serves one session. None: left; else why it was lost."""
        ended: "queue.Queue[BaseException]" = queue.Queue()

        def guard(fn: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    fn()
                except BaseException as ex:
                    ended.put(ex)
            return run

        threads = [threading.Thread(target=guard(lambda: self._keep(s)), daemon=True,
                                    name="keyshard-keepalive"),
                   threading.Thread(target=guard(lambda: self._follow(s)), daemon=True,
                                    name="keyshard-grants"),
                   threading.Thread(target=guard(lambda: self._release_loop(s)), daemon=True,
                                    name="keyshard-release")]
        for t in threads:
            t.start()
        leaving = False
        cause: Optional[BaseException] = None
        while cause is None:
            if self._stopping():
                cause = E.Closed("canceled", "stopped")
                break
            if not leaving and self._draining.is_set():
                leaving = True
                lt = threading.Thread(target=guard(lambda: self._leave(s)), daemon=True, name="keyshard-leave")
                lt.start()
                threads.append(lt)
            try:
                cause = ended.get(timeout=0.05)
            except queue.Empty:
                continue
        left = leaving and isinstance(cause, _SessionGone)
        self._fence(s, cause, report=not left and not self._stopping())
        s.cancel.cancel()
        s.ended.set()
        for t in threads:
            t.join(10.0)
        # every handler call of the session returns before the next session
        self._wait_session_grants(s)
        if left:
            return None
        if not isinstance(cause, _SessionGone) and not self._stopping():
            s.self_fenced = True
            if self._draining.is_set():
                self._hand_back(s)
        return cause

    def _wait_session_grants(self, s: _Session) -> None:
        while True:
            with self._mu:
                pending = [gs for gs in self._grants.values() if gs.s is s]
            if not pending:
                return
            for gs in pending:
                gs.done.wait(0.1)
            if self._stopping():
                # a hard stop does not wait for stuck handlers past a bound
                end = time.monotonic() + 5.0
                for gs in pending:
                    gs.done.wait(max(0.0, end - time.monotonic()))
                return

    # --- keep-alives and fencing ----------------------------------------------------

    def _keepalive_rpc(self, s: _Session, timeout: float) -> Dict[str, Any]:
        """One KeepAlive call (a seam for tests)."""
        return self._c.call("MemberService", "KeepAlive", {"session": s.id}, timeout=timeout, cancel=s.cancel)

    def _keep(self, s: _Session) -> None:
        """Renews s and self-fences when its fence deadline passes. The
        first keep-alive goes at once, the next ones TTL/3 after the
        previous one was sent; one call in flight at a time (on a caller
        thread with its own connection), bounded by the fence deadline; a
        failed call is retried after 50 ms, doubling up to TTL/9."""
        requests: "queue.Queue[Optional[Tuple[float, float]]]" = queue.Queue()
        results: "queue.Queue[tuple]" = queue.Queue()

        def caller() -> None:
            while True:
                req = requests.get()
                if req is None:
                    return
                sent, left = req
                try:
                    results.put((sent, self._keepalive_rpc(s, left), None))
                except BaseException as ex:
                    results.put((sent, None, ex))
        threading.Thread(target=caller, daemon=True, name="keyshard-keepalive-call").start()
        try:
            self._keep_loop(s, requests, results)
        finally:
            requests.put(None)

    def _keep_loop(self, s: _Session, requests: "queue.Queue[Optional[Tuple[float, float]]]",
                   results: "queue.Queue[tuple]") -> None:
        interval = s.ttl / 3.0
        retry = Backoff(KEEPALIVE_RETRY, max(interval / 3.0, KEEPALIVE_RETRY), jitter=False)
        clock = self._clock
        inflight = False
        due = False
        next_at = 0.0

        def send() -> bool:
            nonlocal inflight, next_at
            sent = clock()
            left = s.deadline - sent
            if left <= 0:
                return False
            inflight = True
            next_at = sent + interval  # counted from this send, not from its answer
            requests.put((sent, left))
            return True

        def fenced() -> None:
            cause = E.SessionLost("aborted", "lease deadline passed: no keep-alive acknowledged in time "
                                  "(lease TTL %gs, margin %gs)" % (s.ttl, s.margin))
            self._fence(s, cause, report=True)
            raise cause

        if not send():
            fenced()
        while True:
            if s.ended.is_set():
                return
            now = clock()
            if not s.valid():
                fenced()
            wake = (s.deadline if inflight else min(s.deadline, next_at)) - now
            try:
                sent, resp, err = results.get(timeout=max(0.0, min(wake, 0.25)))
            except queue.Empty:
                if s.ended.is_set():
                    return
                if not s.valid():
                    fenced()
                if clock() >= next_at:
                    if inflight:
                        due = True
                    elif not send():
                        fenced()
                continue
            inflight = False
            if err is None:
                ttl = s.ttl
                left_ttl = parse_dur((resp or {}).get("ttl"))
                if 0 < left_ttl < ttl:
                    ttl = left_ttl  # the server renewed after we sent, so sent + left is still early
                if not s.renewed(sent, ttl):
                    fenced()  # acknowledged, but only after the deadline had passed
                retry.reset()
                self._emit(Event("renewed", session=s.id, deadline=s.deadline))
            elif isinstance(err, E.NotFound):
                raise _SessionGone("keep-alive: the server ended the session: %s" % err)
            elif isinstance(err, E.Closed) or s.ended.is_set():
                return
            else:
                log.warning("keyshard: keep-alive failed; retrying: %s", err)
                due = False
                next_at = clock() + retry.next()
            if due:
                due = False
                if not send():
                    fenced()

    def _fence(self, s: _Session, cause: BaseException, report: bool) -> None:
        with self._mu:
            if s.fenced:
                return
            s.fenced = True
            s.end()
            for gs in list(self._grants.values()):
                if gs.s is s:
                    s.held.append(gs.g)
                    self._end_grant(gs, "fence")
            self._changed.notify_all()
        if report:
            log.error("keyshard: self-fenced: stopped acting on every bucket of session %s: %s", s.id, cause)
            self._emit(Event("fenced", session=s.id, err=cause))

    # --- grants ---------------------------------------------------------------------

    def _follow(self, s: _Session) -> None:
        b = Backoff(0.1, 5.0)
        while not s.ended.is_set():
            with self._mu:
                since, min_rev = s.rev, max(s.rev, s.min_rev)
            body = {"session": s.id, "sinceRevision": str(since), "minRevision": str(min_rev),
                    "wait": "%ds" % int(POLL_WAIT)}
            try:
                r = self._c.call("MemberService", "GetGrants", body, wait=POLL_WAIT, cancel=s.cancel)
            except E.Closed:
                return
            except E.NotFound as ex:
                raise _SessionGone("grants: the server ended the session: %s" % ex)
            except E.KeyshardError as ex:
                if s.ended.is_set():
                    return
                log.warning("keyshard: get grants failed; retrying: %s", ex)
                if s.cancel.wait(b.next()):
                    return
                continue
            b.reset()
            self._reconcile(s, r)

    def _reconcile(self, s: _Session, r: Dict[str, Any]) -> None:
        with self._mu:
            if s.fenced or s.ended.is_set():
                return
            rev = u64(r.get("revision"))
            if rev:
                if rev < s.rev:
                    return
                s.rev = rev
            granted: Dict[int, "tuple[int, int]"] = {}
            for g in r.get("grants") or []:
                granted[int(g.get("bucket", 0))] = (u64(g.get("token")), u64(g.get("from")))
            for bk, tok in list(s.released.items()):
                g = granted.get(bk)
                if g is None or g[0] != tok:
                    del s.released[bk]
            for bk, gs in list(self._grants.items()):
                if gs.s is not s:
                    continue
                g = granted.get(bk)
                if g is None or g[0] != gs.g.token:
                    log.warning("keyshard: the server took back bucket %d without a release; stopping it", bk)
                    self._end_grant(gs, "fence")
            for bk, (tok, frm) in granted.items():
                if s.released.get(bk) == tok:
                    continue
                gs = self._grants.get(bk)
                if gs is not None and gs.s is s and gs.g.token == tok:
                    continue
                f = s.finals.get(bk)
                if f is not None and f[0] != tok:
                    del s.finals[bk]
                self._start_grant(s, Grant(bk, tok, frm, s))
            for bk in r.get("release") or []:
                gs = self._grants.get(int(bk))
                if gs is not None and gs.s is s:
                    self._end_grant(gs, "handoff")
            self._changed.notify_all()

    def _start_grant(self, s: _Session, g: Grant) -> None:
        gs = _GrantState(g, s)
        self._grants[g.bucket] = gs
        self._bq.submit(g.bucket, lambda: self._acquire(gs))

    def _end_grant(self, gs: _GrantState, how: str) -> None:
        if how == "fence":
            gs.g.cancelled.set()
            gs.how = "fence"
        if not gs.ending:
            gs.ending = True
            gs.how = how
            if how == "handoff" and not gs.s.fenced:
                gs.releasing = True
                gs.s.releasing += 1
            self._bq.submit(gs.g.bucket, lambda: self._release(gs))

    def _acquire(self, gs: _GrantState) -> None:
        with self._mu:
            if gs.ending:
                gs.skipped = True  # ended before it started: no acquire, no release
                return
        err: Optional[BaseException] = None
        try:
            self._h.acquire(gs.g)
        except Exception as ex:
            err = ex
            log.error("keyshard: acquire of bucket %d failed; it stays held until released: %s", gs.g.bucket, ex)
        with self._mu:
            gs.acquired = True
            self._changed.notify_all()
        self._emit(Event("acquired", session=gs.s.id, grant=gs.g, err=err))

    def _release(self, gs: _GrantState) -> None:
        b = gs.g.bucket
        final: Optional[int] = None
        fp = getattr(self._h, "final_position", None)
        if gs.skipped:
            if callable(fp):
                final = gs.g.from_position
        else:
            err: Optional[BaseException] = None
            try:
                self._h.release(b, gs.g)
            except Exception as ex:
                err = ex
                log.error("keyshard: release of bucket %d failed; releasing it anyway: %s", b, ex)
            gs.g.cancelled.set()
            if callable(fp):
                try:
                    final = fp(b)
                except Exception:
                    log.exception("keyshard: final_position failed")
                if final is None:
                    final = gs.g.from_position
            with self._mu:
                handoff = gs.how == "handoff" and not gs.s.fenced
            self._emit(Event("released", session=gs.s.id, grant=gs.g, err=err,
                             final=final if handoff else None))
        gs.g.cancelled.set()
        with self._mu:
            if self._grants.get(b) is gs:
                del self._grants[b]
            if gs.releasing:
                gs.releasing = False
                gs.s.releasing -= 1
                gs.s.kick.set()  # the release loop may be waiting for this one
            if gs.how == "handoff" and not gs.s.fenced:
                if final is not None:
                    gs.s.finals[b] = (gs.g.token, final)
                gs.s.released[b] = gs.g.token
                gs.s.pending.append(gs.g)
                gs.s.kick.set()
            gs.done.set()
            self._changed.notify_all()

    # --- release RPCs and leave -------------------------------------------------------

    def _release_loop(self, s: _Session) -> None:
        """Tells the server about released buckets, one call at a time. A
        map change usually ends many grants at once, whose release()
        handlers return within microseconds of each other: the loop sends
        once none of them is still running, so that the burst goes in one
        call rather than one call for the first bucket and, a round trip
        later, one for the rest. A slow handler holds the others back by
        at most _release_coalesce (from the first pending bucket); buckets
        released while a call is in flight go in the next."""
        bound: Optional[float] = None  # time.monotonic() deadline while released buckets wait for their burst
        while not s.ended.is_set():
            wait = 0.1 if bound is None else max(0.0, bound - time.monotonic())
            if not s.kick.wait(wait) and bound is None:
                continue
            s.kick.clear()
            while True:
                with self._mu:
                    if s.pending and s.releasing and (bound is None or time.monotonic() < bound):
                        # More of the burst is coming: wait for its kick, or the bound.
                        if bound is None:
                            bound = time.monotonic() + self._release_coalesce
                        break
                    batch, s.pending = s.pending, []
                bound = None
                if not batch:
                    break
                if not self._send_release(s, batch, True):
                    return

    def _send_release(self, s: _Session, batch: List[Grant], positions: bool) -> bool:
        b = Backoff(0.1, 5.0)
        while True:
            body: Dict[str, Any] = {"session": s.id, "buckets": [
                {"bucket": g.bucket, "token": str(g.token)} for g in batch]}
            finals: Dict[int, int] = {}
            if positions:
                with self._mu:
                    for g in batch:
                        f = s.finals.get(g.bucket)
                        if f is not None and f[0] == g.token:
                            finals[g.bucket] = f[1]
                if finals:
                    body["positions"] = [{"bucket": bk, "token": str(s.finals[bk][0]), "position": str(p)}
                                         for bk, p in finals.items()]
            try:
                r = self._c.call("MemberService", "Release", body, cancel=s.cancel)
            except E.Closed:
                return False
            except E.NotFound:
                return True  # the session is gone; the keep-alive loop sees it too
            except (E.InvalidArgument, E.FailedPrecondition) as ex:
                if len(batch) > 1:
                    for g in batch:
                        if not self._send_release(s, [g], positions):
                            return False
                    return True
                if isinstance(ex, E.FailedPrecondition) and finals:
                    log.warning("keyshard: the server refused a release's final position; releasing at "
                                "the committed position: %s", ex)
                    with self._mu:
                        s.finals.pop(batch[0].bucket, None)
                    return self._send_release(s, batch, False)
                log.warning("keyshard: the server refused a release; bucket %d is no longer held at "
                            "token %d: %s", batch[0].bucket, batch[0].token, ex)
                return True
            except E.KeyshardError as ex:
                if s.ended.is_set():
                    return False
                log.warning("keyshard: release failed; retrying: %s", ex)
                if s.cancel.wait(b.next()):
                    return False
                continue
            with self._mu:
                s.min_rev = max(s.min_rev, u64(r.get("revision")))
            for g in batch:
                self._emit(Event("release-recorded", session=s.id, grant=g, final=finals.get(g.bucket)))
            return True

    def _leave(self, s: _Session) -> None:
        b = Backoff(0.1, 5.0)
        while not s.ended.is_set():
            try:
                self._c.call("MemberService", "Leave", {"session": s.id}, cancel=s.cancel)
                return
            except E.Closed:
                return
            except E.NotFound as ex:
                raise _SessionGone("leave: the session is gone: %s" % ex)
            except (E.InvalidArgument, E.FailedPrecondition, E.Unauthenticated, E.PermissionDenied) as ex:
                log.error("keyshard: leave refused; waiting for the session to end: %s", ex)
                return
            except E.KeyshardError as ex:
                log.warning("keyshard: leave failed; retrying: %s", ex)
                if s.cancel.wait(b.next()):
                    return

    def _hand_back(self, s: _Session) -> None:
        """After a self-fence while leaving: release what the fenced
        session held, best effort, so its buckets need not wait for the
        lease to expire."""
        with self._mu:
            held = dict(s.released)
            for g in s.pending + s.held:
                held[g.bucket] = g.token
            s.pending, s.held = [], []
            min_rev = max(s.rev, s.min_rev)
        s.cancel = Cancel()
        s.ended.clear()
        try:
            r = self._c.call("MemberService", "GetGrants", {"session": s.id, "minRevision": str(min_rev)},
                             timeout=s.ttl, cancel=self._stop)
            for g in r.get("grants") or []:
                held[int(g.get("bucket", 0))] = u64(g.get("token"))
        except E.NotFound:
            s.ended.set()
            return
        except E.KeyshardError as ex:
            log.warning("keyshard: cannot read the fenced session's grants: %s", ex)
        if held:
            batch = [Grant(bk, tok, 0, None) for bk, tok in sorted(held.items())]
            t = threading.Timer(s.ttl, s.cancel.cancel)
            t.daemon = True
            t.start()
            try:
                self._send_release(s, batch, False)
            finally:
                t.cancel()
        s.ended.set()


class NotGranted(E.Unavailable):
    """The map names this worker for the key's bucket, but the grant has
    not arrived (or the worker has not joined, or is fencing): retry soon."""


def _raise_wrong_owner(bucket: int, owner: str, address: str, epoch: int) -> Grant:
    raise E.WrongOwner(bucket, owner, address, epoch)
