"""Typed results of Keyshard calls (small dataclasses built from JSON answers)."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ._wire import parse_dur, u64

__all__ = ["Keyspace", "Member", "MemberStatus", "Map", "Owner", "LookupResult",
           "HotKeyPool", "Grant"]


@dataclass(frozen=True)
class Keyspace:
    """A keyspace. lease_ttl and drain_timeout are seconds; mode is
    "KEYSPACE_MODE_EXCLUSIVE" or "KEYSPACE_MODE_STREAM"."""
    name: str
    buckets: int = 0
    hash: str = "xxh64"
    mode: str = "KEYSPACE_MODE_EXCLUSIVE"
    lease_ttl: float = 0.0
    drain_timeout: float = 0.0

    @property
    def stream(self) -> bool:
        return self.mode == "KEYSPACE_MODE_STREAM"

    @classmethod
    def from_json(cls, d: Optional[Dict[str, Any]]) -> "Keyspace":
        d = d or {}
        return cls(name=d.get("name", ""), buckets=int(d.get("buckets", 0)),
                   hash=d.get("hash") or "xxh64",
                   mode=d.get("mode") or "KEYSPACE_MODE_EXCLUSIVE",
                   lease_ttl=parse_dur(d.get("leaseTtl", d.get("lease_ttl"))),
                   drain_timeout=parse_dur(d.get("drainTimeout", d.get("drain_timeout"))))


@dataclass(frozen=True)
class Member:
    """A member of a keyspace (or of a tenant pool)."""
    id: str
    address: str = ""
    weight: float = 0.0
    zone: str = ""
    metadata: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Optional[Dict[str, Any]]) -> "Member":
        d = d or {}
        return cls(id=d.get("id", ""), address=d.get("address", ""),
                   weight=float(d.get("weight", 0) or 0), zone=d.get("zone", ""),
                   metadata=dict(d.get("metadata") or {}))


@dataclass(frozen=True)
class MemberStatus:
    """ListMembers: a member and its bucket counts."""
    member: Member
    target_buckets: int = 0
    granted_buckets: int = 0
    releasing_buckets: int = 0
    draining: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "MemberStatus":
        return cls(member=Member.from_json(d.get("member")),
                   target_buckets=int(d.get("targetBuckets", 0)),
                   granted_buckets=int(d.get("grantedBuckets", 0)),
                   releasing_buckets=int(d.get("releasingBuckets", 0)),
                   draining=bool(d.get("draining", False)))


@dataclass(frozen=True)
class Map:
    """A keyspace's map at one epoch. owners[b] is 0 (unassigned) or i,
    meaning members[i-1] owns bucket b."""
    keyspace: str
    epoch: int
    buckets: int
    hash: str
    members: List[Member]
    owners: List[int]

    def owner_of(self, bucket: int) -> Optional[Member]:
        """The member owning bucket, or None if it is unassigned."""
        i = self.owners[bucket] if 0 <= bucket < len(self.owners) else 0
        return self.members[i - 1] if 0 < i <= len(self.members) else None

    @classmethod
    def from_json(cls, d: Optional[Dict[str, Any]]) -> "Map":
        d = d or {}
        buckets = int(d.get("buckets", 0))
        owners = [int(o) for o in d.get("owners") or []]
        if len(owners) < buckets:
            owners += [0] * (buckets - len(owners))
        return cls(keyspace=d.get("keyspace", ""), epoch=u64(d.get("epoch")), buckets=buckets,
                   hash=d.get("hash") or "xxh64",
                   members=[Member.from_json(m) for m in d.get("members") or []], owners=owners)


@dataclass(frozen=True)
class Owner:
    """Lookup: a key, its bucket and owner ("" when unassigned)."""
    key: str
    bucket: int
    member: str
    address: str


@dataclass(frozen=True)
class LookupResult:
    epoch: int
    owners: List[Owner]


@dataclass(frozen=True)
class HotKeyPool:
    """A hot-key pool; thresholds in msg/s, durations in seconds."""
    name: str
    threshold: float = 0.0
    low_threshold: float = 0.0
    cooldown: float = 0.0
    report_threshold: float = 0.0
    report_max_age: float = 0.0
    max_keys: int = 0

    @classmethod
    def from_json(cls, d: Optional[Dict[str, Any]]) -> "HotKeyPool":
        d = d or {}
        return cls(name=d.get("name", ""), threshold=float(d.get("threshold", 0) or 0),
                   low_threshold=float(d.get("lowThreshold", 0) or 0),
                   cooldown=parse_dur(d.get("cooldown")),
                   report_threshold=float(d.get("reportThreshold", 0) or 0),
                   report_max_age=parse_dur(d.get("reportMaxAge")),
                   max_keys=int(d.get("maxKeys", 0) or 0))


@dataclass(frozen=True)
class Grant:
    """A bucket granted to a worker at a fencing token (plain value; the
    Worker hands its handler a worker.Grant with valid() and cancelled)."""
    bucket: int
    token: int
    from_position: int = 0
