"""The herd writer: what a batch prepares beyond the timed writer's room, written at its due instants outside the
batches.

A herd (more prepared deliveries than ``--max-held``) used to be written by the batch that prepared it: the batch
slept until the herd's instant and wrote it slice by slice, and no other batch ran meanwhile, so requests sent
during the lead waited (late deliveries, cancels read too late). Now the batch keeps the herd's records in Spark
(``RecordSink`` checkpoints them locally, off the micro-batch's plan) and hands them here with their slices; this
thread writes each slice once its last due time has passed, leaving out the delivery ids later batches withdrew,
and the batch commits at once.

Nothing is lost in a crash: the state keeps prepared schedules until a batch after their due time retires them,
and such a batch waits (``wait_written``) until every slice due by its time is written, as it does for the timed
writer. A herd not yet written when the job stops is emitted again by the next run, with the same delivery ids.
Writing itself is the ``HerdSlices`` given (the sink's: herd_slices.SparkHerdSlices, a Spark job per write), so a herd
is not funnelled through this process.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .due_queue import RETRY_PAUSE_S, DueQueue, now_ms, wait_until_due

log = logging.getLogger(__name__)

# A slice numbered n holds the deliveries due in ((n - 1) * width, n * width]: written once n * width has passed.
HOLD_SLICE_MS = 50
# How long the numbers of handed slices are kept for ``covers``: well past any herd's instant.
HANDED_KEPT_MS = 600_000
WRITE_ATTEMPTS = 3  # a slice whose write fails this often fails the writer: batches fail, the next run re-emits it


def slice_start_ms(number: int) -> int:
    """The earliest due time a slice can hold."""
    return (number - 1) * HOLD_SLICE_MS + 1


def slice_number_of(due_ms: int) -> int:
    """The slice a delivery due at ``due_ms`` goes to (the sink's ``slice_of`` in Spark SQL)."""
    return -(-due_ms // HOLD_SLICE_MS)


def slice_end_ms(number: int) -> int:
    """The latest due time a slice can hold: it is written once this has passed."""
    return number * HOLD_SLICE_MS


@dataclass(order=True)
class _Slice:
    number: int
    seq: int
    records: Any = field(compare=False)  # what ``HerdSlices.write`` gets: the herd's records (the sink's: a DataFrame)
    deliveries: int = field(compare=False)
    # A graceful stop may cut a slice at its instant: what is due by this was written, the rest waits.
    written_through: int | None = field(default=None, compare=False)

    @property
    def first_due_ms(self) -> int:
        """The earliest due time of what it still holds."""
        start = slice_start_ms(self.number)
        return start if self.written_through is None else max(start, self.written_through + 1)


@dataclass
class _Herd:
    records: Any
    slices_left: int


class HerdSlices(Protocol):
    """How the herd writer's herds are written."""

    def write(self, records: Any, numbers: list, withdrawn: frozenset, after: int | None, through: int | None) -> None:
        """Write slices ``numbers`` of a herd's records (one, or all those of the herd due by now when the writer is
        behind) less the delivery ids in ``withdrawn``, only those due after ``after`` and by ``through`` where not
        None (a graceful stop's instant cuts a slice)."""

    def release(self, records: Any) -> None:
        """Every slice of the herd is written."""

    def before_retry(self) -> None:
        """A failed write is about to be tried again."""


class HerdWriter(DueQueue):
    """Writes handed herds slice by slice at their due instants, with ``slices``."""

    def __init__(self, slices: HerdSlices, retry_pause_s: float = RETRY_PAUSE_S):
        super().__init__()
        self._slices = slices
        # Called after each slice with its deliveries (as handed) and how long after its end the write finished.
        self.on_written: Callable[[int, int], None] | None = None
        self._retry_pause_s = retry_pause_s
        self._heap: list[_Slice] = []
        self._herds: dict[int, _Herd] = {}  # by id(records)
        self._withdrawn: set = set()
        self._closed = False
        self._seq = 0
        self.written = 0  # deliveries, as handed (less none withdrawn: the write's count is Spark's)
        # The numbers of the slices handed lately (a frozenset replaced whole: read without the lock)
        self._handed_numbers: frozenset[int] = frozenset()
        self._thread = threading.Thread(target=self._run, name="herd-writer", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Deliveries handed and not written yet."""
        with self._cond:
            return sum(s.deliveries for s in self._heap)

    def hand(self, records: Any, slices: Iterable[tuple[int, int]]) -> int:
        """A herd's records and its slices as (number, deliveries). Returns how many deliveries it holds."""
        slices = list(slices)
        if not slices:
            self._slices.release(records)
            return 0
        with self._cond:
            recent = slice_number_of(now_ms() - HANDED_KEPT_MS)
            self._handed_numbers = frozenset(
                {n for n in self._handed_numbers if n >= recent} | {number for number, _ in slices}
            )
            self._herds[id(records)] = _Herd(records, len(slices))
            for number, deliveries in slices:
                self._seq += 1
                heapq.heappush(self._heap, _Slice(number, self._seq, records, deliveries))
            self._cond.notify_all()
        return sum(deliveries for _, deliveries in slices)

    def covers(self, due_ms: int) -> bool:
        """Whether a herd handed lately has a slice that may hold deliveries due at ``due_ms``."""
        return slice_number_of(due_ms) in self._handed_numbers

    def withdraw(self, delivery_ids: Iterable[str]) -> bool:
        """Deliveries a later batch withdrew (a replace or cancel read before their due time): left out of every
        slice written from now on. Kept while herds are pending (a withdrawn id never comes back); returns whether
        they were."""
        with self._cond:
            if self._heap:
                self._withdrawn.update(delivery_ids)
                return True
            return False

    def _earliest_queued(self) -> int | None:
        """A slice is waited for from the first due time it may hold (a stop may have cut it there)."""
        return self._heap[0].first_due_ms if self._heap else None

    def close(self, timeout: float = 30.0) -> None:
        """Stop: a slice being written is finished, the rest is dropped (the state keeps it)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _due_at(self, piece: _Slice) -> int | None:
        """When what may be written of a slice is all due: its end, or a stop's instant within it."""
        if self._through is None:
            return slice_end_ms(piece.number)
        if piece.first_due_ms > self._through:
            return None
        return min(slice_end_ms(piece.number), self._through)

    def _next_due(self) -> int | None:
        return self._due_at(self._heap[0]) if self._heap else None

    def _take_due(self, now: int) -> list[_Slice]:
        """The first slice due, and with it every other slice of its herd due by ``now`` (unless a stop is under
        way): a writer behind catches up in one write."""
        due = self._next_due()
        if due is None or due > now:
            return []
        taken = [heapq.heappop(self._heap)]
        if self._through is None:
            records = taken[0].records
            later = [s for s in self._heap if s.records is records and slice_end_ms(s.number) <= now]
            if later:
                self._heap = [s for s in self._heap if not (s.records is records and slice_end_ms(s.number) <= now)]
                heapq.heapify(self._heap)
                taken += sorted(later)
        return taken

    def _run(self) -> None:
        while True:
            with self._cond:
                taken = wait_until_due(self._cond, lambda: self._closed, self._next_due, self._take_due)
                if taken is None:
                    return
                first, last = taken[0], taken[-1]
                self._writing = first.first_due_ms  # what may be due earliest among them
                withdrawn = frozenset(self._withdrawn)
                # Cut at a stop's instant within the slice: the rest stays (the next run emits it again).
                through = (
                    self._through if self._through is not None and self._through < slice_end_ms(last.number) else None
                )
            try:
                self._write(taken, withdrawn, through)
            except BaseException as exc:
                log.error(
                    "herd writer: deliveries due by %d not written: %s",
                    slice_end_ms(last.number),
                    " ".join(str(exc).split())[:300],
                )
                with self._cond:
                    self.failure = exc
                    self._writing = None
                    self._cond.notify_all()
                return
            with self._cond:
                self._writing = None
                if through is not None:
                    last.written_through = through
                    heapq.heappush(self._heap, last)
                    self._cond.notify_all()
                    continue
                self.written += sum(s.deliveries for s in taken)
                herd = self._herds[id(first.records)]
                herd.slices_left -= len(taken)
                done = herd.slices_left == 0
                if done:
                    del self._herds[id(first.records)]
                if not self._heap:
                    self._withdrawn.clear()
                self._cond.notify_all()
            if done:
                self._slices.release(first.records)

    def _write(self, taken: list[_Slice], withdrawn: frozenset, through: int | None) -> None:
        started = now_ms()
        first, end_ms = taken[0], slice_end_ms(taken[-1].number)
        deliveries = sum(s.deliveries for s in taken)
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                self._slices.write(first.records, [s.number for s in taken], withdrawn, first.written_through, through)
                break
            except Exception as exc:
                if attempt == WRITE_ATTEMPTS:
                    raise
                log.warning(
                    "herd writer: writing %d deliveries due by %d failed (%s); trying again in %.0fs",
                    deliveries,
                    end_ms,
                    " ".join(str(exc).split())[:200],
                    self._retry_pause_s,
                )
                time.sleep(self._retry_pause_s)
                self._slices.before_retry()
        finished = now_ms()
        log.info(
            "herd writer: %d deliveries due by %d (%d slice(s)) written %d-%d ms after",
            deliveries,
            end_ms,
            len(taken),
            started - end_ms,
            finished - end_ms,
        )
        if self.on_written is not None and through is None:
            self.on_written(deliveries, finished - end_ms)
