"""Capped exponential backoff with jitter, for retries."""
import random


class Backoff:
    """Capped exponential backoff with equal jitter: the n-th delay is
    uniform in [d/2, d) with d = min(limit, base * 2**n)."""

    def __init__(self, base: float = 0.1, limit: float = 10.0, jitter: bool = True) -> None:
        self.base = base
        self.limit = limit
        self.jitter = jitter
        self.n = 0

    def next(self) -> float:
        d = min(self.limit, self.base * (2 ** min(self.n, 30)))
        self.n += 1
        if self.jitter:
            return d / 2 + random.random() * d / 2
        return d

    def reset(self) -> None:
        self.n = 0
