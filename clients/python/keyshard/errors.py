"""Keyshard errors: one exception class per error code, and WrongOwner."""
import base64
from typing import Any, Dict, List, Optional, Tuple, Type

__all__ = [
    "KeyshardError", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded",
    "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented", "Internal",
    "Unavailable", "DataLoss", "Unauthenticated", "WrongOwner", "SessionLost",
    "Closed", "error_from_body", "decode_wrong_owner", "encode_wrong_owner",
]


class KeyshardError(Exception):
    """An error answered by a Keyshard server (or found by the client).

    code is the Connect error code ("not_found", "unavailable", ...),
    message the server's text, details the decoded error details: a list
    of dicts {"type": ..., "value": <bytes>} plus, for a WrongOwner
    detail, "wrong_owner": a WrongOwner exception.
    """

    code = "unknown"

    def __init__(self, code: Optional[str] = None, message: str = "",
                 details: Optional[List[Dict[str, Any]]] = None) -> None:
        if code is not None:
            self.code = code
        self.message = message
        self.details = list(details or [])
        super().__init__("%s: %s" % (self.code, message) if message else self.code)

    def wrong_owner(self) -> Optional["WrongOwner"]:
        """The WrongOwner detail of this error, if it carries one."""
        for d in self.details:
            wo = d.get("wrong_owner")
            if wo is not None:
                return wo
        return None


class Canceled(KeyshardError):
    code = "canceled"


class Unknown(KeyshardError):
    code = "unknown"


class InvalidArgument(KeyshardError):
    code = "invalid_argument"


class DeadlineExceeded(KeyshardError):
    code = "deadline_exceeded"


class NotFound(KeyshardError):
    code = "not_found"


class AlreadyExists(KeyshardError):
    code = "already_exists"


class PermissionDenied(KeyshardError):
    code = "permission_denied"


class ResourceExhausted(KeyshardError):
    code = "resource_exhausted"


class FailedPrecondition(KeyshardError):
    code = "failed_precondition"


class Aborted(KeyshardError):
    code = "aborted"


class OutOfRange(KeyshardError):
    code = "out_of_range"


class Unimplemented(KeyshardError):
    code = "unimplemented"


class Internal(KeyshardError):
    code = "internal"


class Unavailable(KeyshardError):
    """The server could not be reached or answered "unavailable": retry."""
    code = "unavailable"


class DataLoss(KeyshardError):
    code = "data_loss"


class Unauthenticated(KeyshardError):
    code = "unauthenticated"


class SessionLost(KeyshardError):
    """A worker's session ended or its fence deadline passed (client-side)."""
    code = "aborted"


class Closed(KeyshardError):
    """The client, router or worker was closed."""
    code = "canceled"


_BY_CODE: Dict[str, Type[KeyshardError]] = {
    c.code: c for c in (
        Canceled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
        PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
        Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)
}


class WrongOwner(FailedPrecondition):
    """A key's bucket is owned by another member.

    Raised by Worker.owns; applications may raise it themselves to answer
    a misrouted request (encode_wrong_owner gives the detail to send).
    owner is "" when the bucket is unassigned.
    """

    def __init__(self, bucket: int, owner: str = "", address: str = "", epoch: int = 0,
                 message: str = "") -> None:
        self.bucket = int(bucket)
        self.owner = owner
        self.address = address
        self.epoch = int(epoch)
        if not message:
            if owner:
                message = "bucket %d is owned by %r at %r (map epoch %d)" % (bucket, owner, address, epoch)
            else:
                message = "bucket %d is not assigned (map epoch %d)" % (bucket, epoch)
        super().__init__("failed_precondition", message)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, WrongOwner) and
                (self.bucket, self.owner, self.address, self.epoch) ==
                (other.bucket, other.owner, other.address, other.epoch))

    def __hash__(self) -> int:
        return hash((self.bucket, self.owner, self.address, self.epoch))

    def __repr__(self) -> str:
        return "WrongOwner(bucket=%d, owner=%r, address=%r, epoch=%d)" % (
            self.bucket, self.owner, self.address, self.epoch)


# --- a tiny protobuf codec for WrongOwner -----------------------------------

def _varint(buf: bytes, i: int) -> Tuple[int, int]:
    shift = 0
    out = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _put_varint(out: bytearray, v: int) -> None:
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def decode_wrong_owner(raw: bytes) -> WrongOwner:
    """Decodes a keyshard.v1.WrongOwner message (binary protobuf)."""
    bucket, owner, address, epoch = 0, "", "", 0
    i = 0
    while i < len(raw):
        key, i = _varint(raw, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(raw, i)
            if field == 1:
                bucket = v & 0xFFFFFFFF
            elif field == 4:
                epoch = v
        elif wt == 2:
            n, i = _varint(raw, i)
            if i + n > len(raw):
                raise ValueError("truncated field %d" % field)
            s = raw[i:i + n]
            i += n
            if field == 2:
                owner = s.decode("utf-8")
            elif field == 3:
                address = s.decode("utf-8")
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            raise ValueError("unsupported wire type %d" % wt)
    return WrongOwner(bucket, owner, address, epoch)


def encode_wrong_owner(wo: WrongOwner) -> bytes:
    """Encodes wo as a binary keyshard.v1.WrongOwner message."""
    out = bytearray()
    if wo.bucket:
        out.append(0x08)
        _put_varint(out, wo.bucket)
    for field, s in ((2, wo.owner), (3, wo.address)):
        if s:
            b = s.encode("utf-8")
            out.append(field << 3 | 2)
            _put_varint(out, len(b))
            out += b
    if wo.epoch:
        out.append(0x20)
        _put_varint(out, wo.epoch)
    return bytes(out)


def _b64(s: str) -> bytes:
    s = s.strip()
    pad = "=" * (-len(s) % 4)
    if "-" in s or "_" in s:
        return base64.urlsafe_b64decode(s + pad)
    return base64.b64decode(s + pad)


def error_from_body(status: int, body: Any, fallback: str = "") -> KeyshardError:
    """The exception for a non-200 answer with a Connect JSON error body."""
    code = ""
    message = fallback
    details: List[Dict[str, Any]] = []
    if isinstance(body, dict):
        code = str(body.get("code") or "")
        message = str(body.get("message") or fallback)
        for d in body.get("details") or []:
            if not isinstance(d, dict):
                continue
            entry: Dict[str, Any] = {"type": d.get("type", "")}
            try:
                entry["value"] = _b64(str(d.get("value", "")))
            except (ValueError, TypeError):
                entry["value"] = b""
            if entry["type"] in ("keyshard.v1.WrongOwner", "type.googleapis.com/keyshard.v1.WrongOwner"):
                try:
                    entry["wrong_owner"] = decode_wrong_owner(entry["value"])
                except ValueError:
                    pass
            details.append(entry)
    if not code:
        code = _code_for_status(status)
    for d in details:
        wo = d.get("wrong_owner")
        if wo is not None and code == "failed_precondition":
            err = WrongOwner(wo.bucket, wo.owner, wo.address, wo.epoch, message=message)
            err.details = details
            return err
    cls = _BY_CODE.get(code, Unknown)
    return cls(code, message, details)


def _code_for_status(status: int) -> str:
    return {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
            404: "unimplemented", 408: "deadline_exceeded", 409: "aborted",
            412: "failed_precondition", 413: "resource_exhausted", 415: "internal",
            429: "unavailable", 431: "resource_exhausted", 502: "unavailable",
            503: "unavailable", 504: "unavailable"}.get(status, "unknown")
