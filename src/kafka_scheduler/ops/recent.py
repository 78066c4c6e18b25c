"""What happened lately, kept in memory for the status page: delivery lateness over the last hour, and the last
rejections. Fed where the Prometheus metrics are (metrics.py), so the page and a scrape count the same events.

Both are bounded whatever the traffic: a herd of millions of deliveries in a minute adds counts to one minute's
slot, not samples.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque

SLOT_S = 60
WINDOW_S = 3600
# Lateness is kept rounded up to the next step of a 2% geometric scale from 1 ms: bounded keys per minute, and a
# percentile read from them is at most 2% (or 1 ms) above the exact one.
STEP = 1.02
FLOOR_S = 0.001
REJECTIONS_KEPT = 50


def _key(seconds: float) -> int:
    if seconds <= FLOOR_S:
        return 0
    return math.ceil(math.log(seconds / FLOOR_S) / math.log(STEP) - 1e-9)


def _value(key: int) -> float:
    return 0.0 if key == 0 else FLOOR_S * STEP**key


class LatenessWindow:
    """Deliveries' lateness per minute slot over the last hour: exact count and max, percentiles to 2%."""

    def __init__(self, window_s: int = WINDOW_S, slot_s: int = SLOT_S):
        self.window_s, self.slot_s = window_s, slot_s
        self._slots: dict[int, tuple[Counter, list]] = {}  # slot start (s) -> (key -> n, [max])
        self._lock = threading.Lock()

    def add(self, seconds: float, n: int = 1, now: float | None = None) -> None:
        if n <= 0:
            return
        now = time.time() if now is None else now
        slot = int(now // self.slot_s * self.slot_s)
        seconds = max(0.0, seconds)
        with self._lock:
            counts, top = self._slots.setdefault(slot, (Counter(), [0.0]))
            counts[_key(seconds)] += n
            top[0] = max(top[0], seconds)
            for old in [s for s in self._slots if s <= now - self.window_s - self.slot_s]:
                del self._slots[old]

    def stats(self, now: float | None = None, span_s: float | None = None) -> dict:
        """count, p50_s, p99_s, max_s over the last ``span_s`` (default: the window), by whole slots."""
        now = time.time() if now is None else now
        since = now - (span_s or self.window_s)
        with self._lock:
            kept = [
                (slot, Counter(counts), top[0])
                for slot, (counts, top) in self._slots.items()
                if slot + self.slot_s > since
            ]
        total: Counter = Counter()
        for _, counts, _ in kept:
            total.update(counts)
        return summarize(total, max((top for _, _, top in kept), default=None))

    def per_slot(self, now: float | None = None) -> list[dict]:
        """One entry per slot of the window, oldest first, empty slots included (for a sparkline)."""
        now = time.time() if now is None else now
        current = int(now // self.slot_s * self.slot_s)
        with self._lock:
            slots = {slot: (Counter(counts), top[0]) for slot, (counts, top) in self._slots.items()}
        found = []
        for slot in range(current - self.window_s + self.slot_s, current + 1, self.slot_s):
            counts, top = slots.get(slot, (Counter(), None))
            found.append({"start": slot, **summarize(counts, top)})
        return found


def summarize(counts: Counter, top: float | None) -> dict:
    n = sum(counts.values())
    if not n:
        return {"count": 0, "p50_s": None, "p99_s": None, "max_s": None}
    return {
        "count": n,
        "p50_s": min(_percentile(counts, n, 0.50), top),
        "p99_s": min(_percentile(counts, n, 0.99), top),
        "max_s": top,
    }


def _percentile(counts: Counter, n: int, q: float) -> float:
    rank = max(1, math.ceil(q * n))  # the nearest-rank percentile
    seen = 0
    for key in sorted(counts):
        seen += counts[key]
        if seen >= rank:
            return _value(key)
    return _value(max(counts))


class RecentRejections:
    """The last rejections, newest first: per batch, input topic and reason class, how many (the batch summary has
    counts, not the texts; the texts are in the rejections topic)."""

    def __init__(self, kept: int = REJECTIONS_KEPT):
        self._entries: deque = deque(maxlen=kept)
        self._lock = threading.Lock()

    def add(self, at_s: float, input_topic: str | None, dialect: str, reason_class: str, count: int) -> None:
        with self._lock:
            self._entries.append(
                {
                    "at": at_s,
                    "input_topic": input_topic,
                    "dialect": dialect,
                    "reason_class": reason_class,
                    "count": count,
                }
            )

    def entries(self) -> list[dict]:
        with self._lock:
            return list(reversed(self._entries))
