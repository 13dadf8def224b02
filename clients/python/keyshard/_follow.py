"""The long-poll loop Router, HotKeys and PoolFollower share."""
import logging
from typing import Any, Callable

from . import errors as E
from ._backoff import Backoff
from .client import Cancel

log = logging.getLogger("keyshard")


def follow(cancel: Cancel, fetch: Callable[[bool], Any], apply: Callable[[Any], None],
           failed: Callable[[Exception], None], cap: float) -> None:
    """Runs until cancel: fetch(first) is one long poll (first is True
    until one answered), apply(answer) takes each answer in, failed(ex)
    each failure, after which the loop waits a backoff (0.1 s doubling up
    to cap) and tries again, keeping what it had. It returns when cancel
    is cancelled or the client is closed."""
    b = Backoff(0.1, cap)
    first = True
    while not cancel.cancelled:
        try:
            r = fetch(first)
        except E.Closed:
            return
        except Exception as ex:  # keep the last answer; retry
            if cancel.cancelled:
                return
            failed(ex)
            if cancel.wait(b.next()):
                return
            continue
        b.reset()
        first = False
        apply(r)
