"""What the driver keeps of the requests it read before a batch applied them, so that the timed writer's early path
agrees with the state (engine/driver/early_cancels.py reads them, timed_writer.py acts on them).

* A CANCEL, or an ADD or REPLACE read early, acts on the versions of its id made before it in log order: a version a
  batch hands over later (one that had not read the requests) is dropped if any of them is a CANCEL or differs from
  it; ADDs and REPLACEs identical to it are no-ops (the state keeps that version and its delivery id, and their own
  early deliveries are the ones dropped). An ADD or REPLACE left to the batches (another request of its id read
  early) is remembered too, for what it does to the versions before it.
* A version held early is written only once every batch-made version that could be identical to it has been
  handed over: the *frontier* is the instant up to which the last committed batch handed over everything it holds
  (its time plus the lookahead), and an early version due after it waits.
* What was written early is remembered until a committed batch has read its request, so that no batch writes it
  again.

Everything here is forgotten once a committed batch has read the request it came from: the state applied it.
"""

from __future__ import annotations

from typing import NamedTuple

from .early_cancels import Arrival, ArrivalTimes, made_before

# Requests kept for versions not handed over yet: beyond this many, the oldest are left to the batches.
MAX_REMEMBERED = 100_000

# What makes two versions of one-shot identical as the early path sees them: due time, destination, key, value, the
# delivered headers (less the delivery id) and the max lateness.
Content = tuple


class Superseding(NamedTuple):
    """A request read early that acts on the versions of its id made before it."""

    arrival: Arrival
    content: Content | None  # None: a CANCEL; else the version an ADD or REPLACE makes
    delivery_id: str | None  # that version's


def committed_past(arrival: Arrival, committed: dict[str, dict[int, int]]) -> bool:
    return arrival.offset < committed.get(arrival.topic, {}).get(arrival.partition, 0)


class EarlyBook:
    """The requests read early that no committed batch has read yet, per id, the versions written early, and the
    frontier."""

    def __init__(self, limit: int = MAX_REMEMBERED):
        self.limit = limit
        self.frontier_ms: int | None = None
        self._by_sid: dict[bytes, list[Superseding]] = {}
        self._count = 0
        self.written_early: dict[str, Arrival] = {}  # delivery id -> the request it came from

    def __len__(self) -> int:
        return self._count

    def add(self, sid: bytes, superseding: Superseding) -> bool:
        if self._count >= self.limit:
            return False  # the batch that applies it withdraws what it supersedes, as without this
        self._by_sid.setdefault(sid, []).append(superseding)
        self._count += 1
        return True

    def after(self, sid: bytes | None, delivery_id: str, times: ArrivalTimes | None) -> list[Superseding]:
        """The requests read early of ``sid`` that come after the version ``delivery_id``, in log order."""
        if sid is None:
            return []
        after = [s for s in self._by_sid.get(sid, ()) if made_before(delivery_id, s.arrival, times)]
        return sorted(after, key=lambda s: (s.arrival.stamp, s.arrival.partition, s.arrival.offset))

    def first_after(self, sid: bytes | None, delivery_id: str, times: ArrivalTimes | None) -> Superseding | None:
        """The earliest request read early of ``sid`` that comes after the version ``delivery_id`` in log order."""
        after = self.after(sid, delivery_id, times)
        return after[0] if after else None

    def requests_of(self, sid: bytes) -> list[Superseding]:
        """The requests of ``sid`` read early, in the order read."""
        return list(self._by_sid.get(sid, ()))

    def advance(self, frontier_ms: int) -> bool:
        """A committed batch handed over everything due by ``frontier_ms``; returns whether the frontier moved."""
        if self.frontier_ms is not None and frontier_ms <= self.frontier_ms:
            return False
        self.frontier_ms = frontier_ms
        return True

    def may_write(self, due_ms: int) -> bool:
        return self.frontier_ms is not None and due_ms <= self.frontier_ms

    def forget(self, committed: dict[str, dict[int, int]]) -> None:
        for sid in list(self._by_sid):
            kept = [s for s in self._by_sid[sid] if not committed_past(s.arrival, committed)]
            self._count -= len(self._by_sid[sid]) - len(kept)
            if kept:
                self._by_sid[sid] = kept
            else:
                del self._by_sid[sid]
        for delivery_id, arrival in list(self.written_early.items()):
            if committed_past(arrival, committed):
                del self.written_early[delivery_id]
