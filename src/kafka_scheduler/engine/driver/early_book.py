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

Everything here is forgotten once a committed batch has read the request it came from: the state applied it, except
a CANCEL (``AppliedCancels``): batches cut each partition at its own offset, so a batch may apply a CANCEL before the
one after it applies the older request it cancels, read from another partition (a producer that keys them apart).
The state then holds the version as if never cancelled; the CANCEL, kept a while longer, drops that version when a
batch hands it over and the stamps prove its request the older.
"""

from __future__ import annotations

from typing import NamedTuple

from ...delivery_ids import delivery_id as delivery_id_of
from ...delivery_ids import is_firing, request_of
from .early_cancels import Arrival, ArrivalTimes, made_before

# Requests kept for versions not handed over yet: beyond this many, the oldest are left to the batches.
MAX_REMEMBERED = 100_000
# A CANCEL a committed batch applied is kept this long after its stamp, for a request of its id from another
# partition that a later batch reads (a backlog of 1,000,000 was read in 87-99 s: docs/measurements.md), and for this
# many CANCELs at most (the oldest go first).
APPLIED_CANCEL_KEPT_MS = 600_000
MAX_APPLIED_CANCELS = 100_000

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

    def forget(self, committed: dict[str, dict[int, int]], applied: AppliedCancels | None = None) -> None:
        """Forget what a committed batch has read (``committed``: the next offset it reads per topic and partition);
        its CANCELs go to ``applied``."""
        for sid in list(self._by_sid):
            kept = [s for s in self._by_sid[sid] if not committed_past(s.arrival, committed)]
            if applied is not None and len(kept) < len(self._by_sid[sid]):
                for gone in self._by_sid[sid]:
                    if gone.content is None and committed_past(gone.arrival, committed):
                        applied.add(sid, gone.arrival)
            self._count -= len(self._by_sid[sid]) - len(kept)
            if kept:
                self._by_sid[sid] = kept
            else:
                del self._by_sid[sid]
        for delivery_id, arrival in list(self.written_early.items()):
            if committed_past(arrival, committed):
                del self.written_early[delivery_id]


class AppliedCancels:
    """CANCELs read early that a committed batch has applied, kept ``APPLIED_CANCEL_KEPT_MS`` after their stamp: a
    version a later batch hands over (or the writer is about to write) is dropped if one of them comes after the
    request that made it, in another partition, as the stamps show (the state applied the two in the other order).
    A request whose stamp is not known (the watcher has not read it, or has forgotten it) is never taken as older:
    dropping a version made after the CANCEL would lose it."""

    def __init__(self, kept_ms: int = APPLIED_CANCEL_KEPT_MS, limit: int = MAX_APPLIED_CANCELS):
        self.kept_ms, self.limit = kept_ms, limit
        self._by_sid: dict[bytes, list[Arrival]] = {}  # in the order applied: the oldest first
        self._count = 0
        # Versions a kept CANCEL comes after, found as the watcher read their request (a batch may have applied it
        # already, or apply it later and forget its stamp): delivery id -> that CANCEL's stamp, for the expiry
        self._cancelled: dict[str, int] = {}

    def __len__(self) -> int:
        return self._count

    def add(self, sid: bytes, cancel: Arrival) -> None:
        self._by_sid.setdefault(sid, []).append(cancel)
        self._count += 1
        while self._count > self.limit:
            oldest = next(iter(self._by_sid))
            self._count -= len(self._by_sid.pop(oldest))

    def __bool__(self) -> bool:
        return bool(self._by_sid)

    def sids(self) -> list[bytes]:
        return list(self._by_sid)

    def note_request(self, sid: bytes, made: Arrival) -> bool:
        """A request of ``sid`` the watcher read (an ADD or REPLACE, or any request naming it): whether a kept CANCEL
        comes after it in another partition. If so, the version it makes is remembered as cancelled (``cancels``)
        however late a batch hands it over."""
        for cancel in self._by_sid.get(sid, ()):
            if (
                made.topic == cancel.topic
                and made.partition != cancel.partition
                and (made.stamp, made.partition) < (cancel.stamp, cancel.partition)
            ):
                self._cancelled[delivery_id_of(made.topic, made.partition, made.offset)] = cancel.stamp
                while len(self._cancelled) > self.limit:
                    del self._cancelled[next(iter(self._cancelled))]
                return True
        return False

    def expire(self, now_ms: int) -> None:
        for made, stamp in list(self._cancelled.items()):
            if stamp <= now_ms - self.kept_ms:
                del self._cancelled[made]
        for sid in list(self._by_sid):
            kept = [cancel for cancel in self._by_sid[sid] if cancel.stamp > now_ms - self.kept_ms]
            self._count -= len(self._by_sid[sid]) - len(kept)
            if kept:
                self._by_sid[sid] = kept
            else:
                del self._by_sid[sid]

    def cancels(self, sid: bytes | None, delivery_id: str, times: ArrivalTimes) -> bool:
        """Whether a CANCEL kept of ``sid`` comes after the request that made the version ``delivery_id``, in another
        partition: that request's stamp known and earlier (a tie goes to the lower partition, as batches order
        them). One in the same partition was applied in order by the batches: never."""
        if delivery_id in self._cancelled:
            return True
        cancels = self._by_sid.get(sid) if sid is not None else None
        if not cancels or is_firing(delivery_id):
            return False  # a CANCEL never touches a cron's firing
        try:
            made_topic, made_in, made_at = request_of(delivery_id)
            made_in, made_at = int(made_in), int(made_at)
        except ValueError:
            return False  # an id of another form
        for cancel in cancels:
            if made_topic != cancel.topic or made_in == cancel.partition:
                continue
            stamped = times.stamp(cancel.topic, made_in, made_at)
            if stamped is not None and (stamped, made_in) < (cancel.stamp, cancel.partition):
                return True
        return False
