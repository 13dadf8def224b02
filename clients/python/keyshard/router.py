"""Router: follows a keyspace's map and answers key -> owner locally."""
import logging
import threading
import time
from typing import Any, Callable, Optional, Union

from . import errors as E
from ._hash import bucket as _bucket
from ._follow import follow
from ._wire import check_num, check_str
from .client import Cancel, Client
from .types import Map, Member

__all__ = ["Router"]

log = logging.getLogger("keyshard")

POLL_WAIT = 30.0


class Router:
    """Follows the map of keyspace with GetMap long polls (since_epoch,
    wait 30 s) in a daemon thread, and answers owner(key) from its local
    copy, hashing keys with the keyspace's hash mode.

    When the server is unreachable it keeps the last map and sets stale.
    on_change(map) is called on the router's thread after each new map
    (it must not block for long). Start it with start() (the constructor
    does no IO) or use it as a context manager; close() stops it.
    """

    def __init__(self, client: Client, keyspace: str,
                 on_change: Optional[Callable[[Map], None]] = None,
                 poll_wait: float = POLL_WAIT) -> None:
        if not isinstance(client, Client):
            raise TypeError("client: want a keyshard.Client, got %s" % type(client).__name__)
        check_str(keyspace, "keyspace")
        if on_change is not None and not callable(on_change):
            raise TypeError("on_change: want a callable")
        self._c = client
        self.keyspace = keyspace
        self.on_change = on_change
        self._wait = check_num(poll_wait, "poll_wait", positive=True)
        self._cond = threading.Condition()
        self._map: Optional[Map] = None
        self._stale = False
        self._error: Optional[BaseException] = None
        self._cancel = Cancel()
        self._thread: Optional[threading.Thread] = None

    # --- lifecycle ----------------------------------------------------------

    def start(self) -> "Router":
        """Starts following the map (non-blocking). Idempotent."""
        with self._cond:
            if self._thread is None and not self._cancel.cancelled:
                self._thread = threading.Thread(target=self._run, name="keyshard-router-" + self.keyspace,
                                                daemon=True)
                self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stops following; the last map stays readable."""
        self._cancel.cancel()
        with self._cond:
            self._cond.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def __enter__(self) -> "Router":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float = 10.0) -> Map:
        """Waits for the first map; raises Unavailable (or the error that
        keeps it from loading, such as NotFound) after timeout seconds."""
        self.start()
        end = time.monotonic() + check_num(timeout, "timeout")
        with self._cond:
            while self._map is None:
                left = end - time.monotonic()
                if left <= 0 or self._cancel.cancelled:
                    err = self._error
                    if isinstance(err, E.KeyshardError):
                        raise type(err)(err.code, "keyspace %r: no map within %.3gs: %s" % (
                            self.keyspace, timeout, err.message), err.details)
                    raise E.Unavailable("unavailable", "keyspace %r: no map within %.3gs%s" % (
                        self.keyspace, timeout, ": %s" % err if err else ""))
                self._cond.wait(left)
            return self._map

    # --- reading --------------------------------------------------------------

    @property
    def map(self) -> Optional[Map]:
        """The current map (None before the first one arrived)."""
        return self._map

    @property
    def epoch(self) -> int:
        m = self._map
        return m.epoch if m is not None else 0

    @property
    def stale(self) -> bool:
        """True while the last attempt to follow the map failed (the map
        may be outdated)."""
        return self._stale

    @property
    def error(self) -> Optional[BaseException]:
        """The last error following the map, if the last attempt failed."""
        return self._error

    def _need(self) -> Map:
        m = self._map
        if m is None:
            raise E.Unavailable("unavailable", "keyspace %r: no map yet (call wait_ready)" % self.keyspace)
        return m

    def bucket(self, key: Union[str, bytes]) -> int:
        """The bucket of key under the keyspace's hash and bucket count."""
        m = self._need()
        return _bucket(key, m.buckets, m.hash)

    def owner(self, key: Union[str, bytes]) -> Optional[Member]:
        """The member owning key's bucket (id, address, ...), or None if the
        bucket is unassigned. Raises Unavailable before the first map."""
        m = self._need()
        return m.owner_of(_bucket(key, m.buckets, m.hash))

    def bucket_owner(self, bucket: int) -> Optional[Member]:
        return self._need().owner_of(bucket)

    def wait_epoch(self, epoch: int, timeout: float) -> bool:
        """Waits until the router's map is at epoch or newer; False on timeout."""
        self.start()
        end = time.monotonic() + check_num(timeout, "timeout")
        with self._cond:
            while self.epoch < epoch:
                left = end - time.monotonic()
                if left <= 0 or self._cancel.cancelled:
                    return False
                self._cond.wait(left)
            return True

    # --- the follower -----------------------------------------------------------

    def _run(self) -> None:
        def fetch(first: bool) -> Any:
            return self._c.get_map(self.keyspace, since_epoch=self.epoch,
                                   wait=0.0 if first else self._wait, cancel=self._cancel)

        def failed(ex: Exception) -> None:
            with self._cond:
                self._stale = True
                self._error = ex
                self._cond.notify_all()
            log.warning("keyshard: router %s: get map failed: %s", self.keyspace, ex)

        def apply(answer: Any) -> None:
            m, _ = answer
            with self._cond:
                self._stale = False
                self._error = None
                # epoch 0: the keyspace has no map yet (just created)
                newer = m.epoch > 0 and (self._map is None or m.epoch > self._map.epoch)
                if newer:
                    self._map = m
                self._cond.notify_all()
            if newer and self.on_change is not None:
                try:
                    self.on_change(m)
                except Exception:
                    log.exception("keyshard: router on_change failed")

        follow(self._cancel, fetch, apply, failed, 5.0)
