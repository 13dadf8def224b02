"""Keyshard client for Python (standard library only, Python >= 3.9).

    from keyshard import Client, Worker, Router, bucket

See clients/python/README.md.
"""
import logging as _logging

from ._hash import HASH_MODES, bucket, buckets_of, xxh64
from .client import Cancel, Client
from .errors import (Aborted, AlreadyExists, Canceled, Closed, DataLoss, DeadlineExceeded,
                     FailedPrecondition, Internal, InvalidArgument, KeyshardError, NotFound,
                     OutOfRange, PermissionDenied, ResourceExhausted, SessionLost,
                     Unauthenticated, Unavailable, Unimplemented, Unknown, WrongOwner,
                     decode_wrong_owner, encode_wrong_owner)
from .hotkeys import Detector, HotKeys
from .pools import LoadReporter, PoolFollower, report_load
from .router import Router
from .types import HotKeyPool, Keyspace, LookupResult, Map, Member, MemberStatus, Owner
from .worker import Event, Grant, Handler, NotGranted, Worker

__version__ = "0.1.0"

# Logs go to the "keyshard" logger (reconnects and retries at WARNING,
# session loss and fences at ERROR); silent unless the application
# configures logging.
_logging.getLogger("keyshard").addHandler(_logging.NullHandler())

__all__ = [
    "bucket", "buckets_of", "xxh64", "HASH_MODES", "Client", "Cancel", "Router", "HotKeys", "Detector", "PoolFollower", "LoadReporter", "report_load", "Worker", "Grant",
    "Event", "Handler", "NotGranted", "Keyspace", "Member", "MemberStatus", "Map", "Owner",
    "LookupResult", "HotKeyPool", "KeyshardError", "Canceled", "Unknown", "InvalidArgument",
    "DeadlineExceeded", "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable",
    "DataLoss", "Unauthenticated", "WrongOwner", "SessionLost", "Closed", "decode_wrong_owner",
    "encode_wrong_owner",
]
