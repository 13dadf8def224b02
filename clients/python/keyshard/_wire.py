"""JSON mapping helpers: durations, 64-bit ints, argument checks."""
import datetime
import math
import re
from typing import Any, Optional

_DUR_RE = re.compile(r"^(-?\d+(?:\.\d*)?)s$")
_FRAC = re.compile(r"\.(\d+)")


def dur(seconds: float, name: str) -> str:
    """seconds (int or float, >= 0) as a protobuf JSON duration ("1.5s")."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError("%s: want seconds as a number, got %s" % (name, type(seconds).__name__))
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError("%s: %r is not a non-negative number of seconds" % (name, seconds))
    if isinstance(seconds, int):
        return "%ds" % seconds
    s = ("%.9f" % seconds).rstrip("0").rstrip(".")
    return s + "s"


def parse_dur(v: Any) -> float:
    """A JSON duration ("10s", "1.5s") as seconds; 0.0 for None or ""."""
    if not v:
        return 0.0
    m = _DUR_RE.match(str(v))
    if not m:
        raise ValueError("bad duration %r" % (v,))
    return float(m.group(1))


def u64(v: Any) -> int:
    """A JSON 64-bit int (a string or a number; absent: 0)."""
    if v is None or v == "":
        return 0
    return int(v)


def check_str(v: Any, name: str, required: bool = True) -> str:
    if not isinstance(v, str):
        raise TypeError("%s: want a str, got %s" % (name, type(v).__name__))
    if required and not v:
        raise ValueError("%s: is required (empty)" % name)
    return v


def check_int(v: Any, name: str, lo: int = 0, hi: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("%s: want an int, got %s" % (name, type(v).__name__))
    if v < lo or (hi is not None and v > hi):
        if hi is None:
            raise ValueError("%s: %d is below %d" % (name, v, lo))
        raise ValueError("%s: %d is outside [%d, %d]" % (name, v, lo, hi))
    return v


def check_num(v: Any, name: str, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError("%s: want a number, got %s" % (name, type(v).__name__))
    if math.isnan(v) or math.isinf(v) or v < 0 or (positive and v == 0):
        raise ValueError("%s: %r is not a %s number" % (name, v, "positive" if positive else "non-negative"))
    return float(v)


def parse_time(s: Optional[str]) -> float:
    """An RFC 3339 timestamp as Unix seconds (0.0 for None or "")."""
    if not s:
        return 0.0
    t = s.replace("Z", "+00:00")
    t = _FRAC.sub(lambda m: "." + (m.group(1) + "000000")[:6], t, count=1)
    return datetime.datetime.fromisoformat(t).timestamp()
