"""The timed writer: it writes prepared deliveries at their due instant, off the batch path.

Prepared deliveries come out of a micro-batch up to ``--lookahead`` before they are due (the state keeps
them until a batch after their due time retires them, so a crash loses nothing). The writer holds them in
memory, at most ``max_held`` records, and writes each with its own producer at its due time, off the batch
path: no batch waits for a due time. A later batch may withdraw one (a replace or cancel read before it was
written).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Producer

from ...config import Config
from ...protocol import DELIVERY_ID
from ..contract import KIND_DELIVER, KIND_HISTORY, WriterRow
from .batch_summary import EarlyTally
from .due_queue import RETRY_PAUSE_S, DueQueue, now_ms, wait_until_due
from .early_book import EarlyBook, Superseding, committed_past
from .early_cancels import Arrival, ArrivalTimes, made_before, native_request_sid
from .early_requests import EarlyRequest
from .exactly_once import FencedError, TransactionalSender
from .held import Held, counted_as, early_content, kind_of
from .producing import (
    Record,
    expired_as_rejection,
    header_pairs,
    produce_record,
    producer_config,
    refusal_reason,
    refused_as_rejection,
    send_sorting_refusals,
)

log = logging.getLogger(__name__)


# A watcher's word on how far it has read holds this long: one that stops telling (stopped, stuck) holds no
# delivery back for longer.
READ_GATE_STALE_S = 5.0
# The read gate holds a delivery back at most this long after its due time: a batch waits for what is due by its
# time before it commits (wait_written), and a read minutes behind must not hold the batches up (a CANCEL read
# later than this comes too late, as without the gate).
READ_GATE_MAX_HOLD_MS = 60_000


class TimedWriter(DueQueue):
    """Holds prepared deliveries and writes each at its due instant."""

    def __init__(
        self,
        bootstrap_servers: str,
        max_held: int = Config.max_held,
        producer: Producer | None = None,
        rejections_topic: str | None = None,
        sender: TransactionalSender | None = None,
        client_options: dict | None = None,
    ):
        super().__init__()
        self.max_held = max_held
        self.rejections_topic = rejections_topic
        # With exactly-once, every write goes through the sender's transactions (exactly_once.py).
        self.sender = sender
        self._producer = producer or (
            None if sender else Producer(producer_config(bootstrap_servers, **(client_options or {})))
        )
        self._heap: list[Held] = []
        self._held: dict[str, Held] = {}
        self._closed = False
        self._anonymous = 0
        self.written = 0
        self.withdrawn = 0
        self.failed = 0  # records neither written nor rejected (a rejection refused too): logged as errors
        self.refused = 0  # records a destination refused, written to the rejections topic instead
        self.retried = 0
        self.expired = 0  # deliveries later than their max lateness: written as rejections (expired) instead
        # CANCELs read from the inputs as they arrive (early_cancels.CancelWatcher), before a batch applies them:
        # the deliveries they withdrew, and those not reported in a batch's line yet.
        self.withdrawn_early = 0
        self._early_unreported = 0
        self._held_by_sid: dict[bytes, set[str]] = {}
        self._book = EarlyBook()  # the requests read early (early_book.py)
        self._arrivals = ArrivalTimes()  # of the input records read early: orders requests across partitions
        # Next offset to read per input partition after what batches have read (forget_cancels): a record below it is
        # one a batch applied before the watcher read it, and is not read early.
        self._read_by_batches: dict[str, dict[int, int]] = {}
        # Held early and not handed over by a batch yet: written once the frontier has passed their due time.
        self._early_heap: list[Held] = []
        self.written_early = 0  # deliveries written from a request read early, before a batch handed them over
        self._early_written_unreported = 0
        # What batches counted again of the versions written early, and left out: by how the batch counted them
        self._early_again = EarlyTally()
        self.early_left = 0  # held early, then left to the batches (the state decided otherwise, or not in time)
        # Whether a herd handed to the herd writer holds deliveries due then: an early delivery due in a herd's slice
        # is left to the batches (the herd writer's versions are not the timed writer's to compare with).
        self.herd_covers: Callable[[int], bool] = lambda due_ms: False
        # The watcher's read of the inputs while it is behind (read_through): (broker time, when told), else None.
        self._read_through: tuple[int, float] | None = None
        self.lateness_ms: list[int] = []  # of the last writes, for the batch line
        # Called after each write with the lateness (ms) of each delivery written, the number of records refused
        # (sent to rejections) and of deliveries expired: the metrics (ops/metrics.py). Rejections and dead letters
        # (no due time) are no deliveries; a record retried is counted when it is written.
        self.on_written: Callable[..., None] | None = None
        self._thread = threading.Thread(target=self._run, name="timed-writer", daemon=True)
        self._thread.start()

    @property
    def held(self) -> int:
        return len(self._held)

    def room(self) -> int:
        return max(0, self.max_held - len(self._held))

    def hold(self, rows: Iterable[WriterRow]) -> int | None:
        """A delivery and its write-back or history copy share the delivery id. A row without due time (a rejection)
        or already due is written at once. A delivery a CANCEL read early supersedes is dropped (``cancel_early``).
        Returns the earliest due time of the deliveries it writes at once (None: none), for the batch's lateness:
        those written early, as their requests were read, are not this batch's."""
        now_ms = int(time.time() * 1000)
        due_now: dict[str, int] = {}
        with self._cond:
            named: set[str] = set()
            for row in rows:
                delivery_id = self._named(row.delivery_id)
                if delivery_id in self._book.written_early:
                    self._early_again = self._early_again.plus(counted_as(row))
                    continue  # written from its request as it was read
                if row.kind == KIND_DELIVER and row.due_ms is not None and row.due_ms <= now_ms:
                    due_now[delivery_id] = row.due_ms
                record = Record(row.topic, row.partition, row.key, row.value, header_pairs(row.headers))
                held = self._held.get(delivery_id)
                if held is not None and held.early is not None and row.kind == KIND_DELIVER:
                    self._confirm(held)  # a batch hands over the version held early: the state's now
                    continue
                if held is None:
                    held = self._held[delivery_id] = Held(row.due_ms or 0, delivery_id, [])
                    heapq.heappush(self._heap, held)
                elif held.records and row.kind == KIND_DELIVER and any(r.topic == row.topic for r in held.records):
                    continue  # emitted again (a replay of the batch): held once
                held.records.append(record)
                held.kinds.append(row.kind)
                if row.kind == KIND_DELIVER and row.max_lateness_ms is not None:
                    held.max_lateness_ms = int(row.max_lateness_ms)
                if row.kind == KIND_DELIVER and row.sid is not None and held.sid is None:
                    held.sid = bytes(row.sid)
                    named.add(delivery_id)
            for delivery_id in named:
                held = self._held[delivery_id]
                if self._superseded_early(held):
                    self._drop_early(held)
                else:
                    self._held_by_sid.setdefault(held.sid, set()).add(delivery_id)
            self._cond.notify()
            # Those a CANCEL or a request read early dropped are not written.
            return min((due for delivery_id, due in due_now.items() if delivery_id in self._held), default=None)

    def _superseded_early(self, held: Held) -> bool:
        """Called with the lock held, for a version a batch hands over: whether a request read early of its id after
        it drops it (a CANCEL, or an ADD or REPLACE that differs from it). One identical to it is a no-op: the
        version stays, and the early one goes."""
        after = self._book.after(held.sid, held.delivery_id, self._arrivals)
        content = held.content()
        if any(s.content is None or s.content != content for s in after):
            return True
        for same in after:
            if same.delivery_id in self._book.written_early:
                # The frontier makes this impossible: every version an early one could equal is handed over before
                # the early one is written. Written once, under the early id.
                log.error(
                    "timed writer: %s handed over after its no-op %s was written", held.delivery_id, same.delivery_id
                )
                return True
            early = self._held.get(same.delivery_id)
            if early is not None and early.early is not None:
                self._leave_to_batches(early)
        return False

    def hold_early(self, request: EarlyRequest) -> bool:
        """A valid ADD or REPLACE read as it arrived, before a batch applied it: held as the version it makes, written
        at its due time once the frontier has passed it (early_book.py), and acting at once on the versions of its id
        made before it (dropped, unless identical: then the request is a no-op and nothing is held). Returns whether
        it is held. Left to the batches: a request whose id has a version held or written early and not yet handed
        over (only the state can tell how the two combine)."""
        with self._cond:
            delivery_id = request.delivery_id
            if delivery_id in self._held or delivery_id in self._book.written_early:
                return False
            sid = request.sid if request.has_id else None
            content = early_content(request)
            if sid is not None and (
                self._has_early_version(sid)
                or self._book.first_after(sid, delivery_id, self._arrivals) is not None
                or self._versions_read_before(sid, request.arrival)
            ):
                # Another request of its id read early (before it, or made after it): how the two combine is the
                # state's to say, so neither is written early; what it does to the versions before it stays known.
                self._leave_early_versions(sid)
                for held in self._held_before(sid, request.arrival):
                    if held.content() != content:
                        self._drop_early(held)  # a version it replaces, whatever came between
                self._book.add(sid, Superseding(request.arrival, content, delivery_id))
                return False
            earlier = self._held_before(sid, request.arrival)
            if any(held.content() == content for held in earlier):
                return False  # identical to the version it would replace: a no-op
            if sid is not None and not self._book.add(sid, Superseding(request.arrival, content, delivery_id)):
                return False
            for held in earlier:
                self._drop_early(held)
            record = Record(
                request.topic, None, request.key, request.value, [*request.headers, (DELIVERY_ID, delivery_id.encode())]
            )
            held = self._held[delivery_id] = Held(
                request.due_ms, delivery_id, [record], [KIND_DELIVER], request.max_lateness_ms, sid, request.arrival
            )
            if sid is not None:
                self._held_by_sid.setdefault(sid, set()).add(delivery_id)
            heapq.heappush(self._early_heap, held)
            self._cond.notify()
            return True

    def _held_before(self, sid: bytes | None, arrival: Arrival) -> list[Held]:
        """Called with the lock held: the versions of ``sid`` held that were made before ``arrival``."""
        return [
            self._held[d]
            for d in self._held_by_sid.get(sid, ())
            if d in self._held and made_before(d, arrival, self._arrivals)
        ]

    def _versions_read_before(self, sid: bytes, arrival: Arrival) -> bool:
        """Called with the lock held: whether an ADD or REPLACE of ``sid`` read early and not applied by a batch yet
        was made before ``arrival``. Its version may be left to the batches already (a second request of the id came),
        and the state may keep it: a request identical to it is a no-op, and its own early version would go out under
        another id."""
        return any(
            s.delivery_id is not None and made_before(s.delivery_id, arrival, self._arrivals)
            for s in self._book.requests_of(sid)
        )

    def _leave_early_versions(self, sid: bytes) -> None:
        """Called with the lock held: a request of ``sid`` the early path does not take changes what the state makes
        of the id, so the versions of ``sid`` held early and not handed over yet are the batches' to hand over."""
        for delivery_id in list(self._held_by_sid.get(sid, ())):
            held = self._held.get(delivery_id)
            if held is not None and held.early is not None:
                self._leave_to_batches(held)

    def _has_early_version(self, sid: bytes) -> bool:
        """Called with the lock held."""
        if any(self._held[d].early is not None for d in self._held_by_sid.get(sid, ()) if d in self._held):
            return True
        return any(s.delivery_id in self._book.written_early for s in self._book.requests_of(sid))

    def _confirm(self, held: Held) -> None:
        """Called with the lock held: a batch handed over the version held early; it is written as any other."""
        held.early = None
        heapq.heappush(self._heap, held)
        self._cond.notify()

    def _leave_to_batches(self, held: Held) -> None:
        """Called with the lock held: an early version the state did not take (or not in time) is not written."""
        self._forget_held(held)
        held.records = []
        self.early_left += 1

    def advance_frontier(self, frontier_ms: int) -> None:
        """A committed batch handed over every version due by ``frontier_ms`` it holds (its time plus the
        lookahead): the early versions due by then may be written."""
        with self._cond:
            if self._book.advance(frontier_ms):
                self._cond.notify()

    def early_unconfirmed(self) -> dict[bytes, str]:
        """sid -> delivery id of the versions held early and not handed over yet."""
        with self._cond:
            return {h.sid: d for d, h in self._held.items() if h.early is not None and h.sid is not None}

    def written_early_ids(self) -> list[str]:
        """The deliveries written early whose requests no committed batch has read yet: a batch must not write them
        again."""
        with self._cond:
            return list(self._book.written_early)

    def emitted_by_batch(self, versions: Iterable[tuple[bytes, str]]) -> None:
        """(sid, delivery id) of versions a batch writes itself (not through this writer): an early version of the
        same id is the batch's now, written by it or replaced by what it writes."""
        with self._cond:
            for sid, _ in versions:
                for delivery_id in list(self._held_by_sid.get(sid, ())):
                    held = self._held.get(delivery_id)
                    if held is not None and held.early is not None:
                        self._leave_to_batches(held)

    def read_early(self, records: Iterable[tuple], early: Callable[..., EarlyRequest | None] | None = None) -> int:
        """Input records read as they arrive, before a batch applied them, as (topic, partition, offset, broker's
        timestamp, the id a valid CANCEL cancels or None, (key, value, headers)), in the order read: their arrivals
        order the requests of an id across partitions, each CANCEL acts at once (``cancel_early``), and each record
        ``early(arrival, timestamp, key, value, headers)`` finds an ADD or REPLACE is held early (``hold_early``).
        Returns how many deliveries the CANCELs dropped."""
        dropped = 0
        with self._cond:
            for topic, partition, offset, timestamp, cancelled, fields in records:
                if offset < self._read_by_batches.get(topic, {}).get(partition, 0):
                    continue  # applied by a batch before it was read here: what it makes is the state's to hand over
                arrival = self._arrivals.note(topic, partition, offset, timestamp)
                if cancelled is not None:
                    dropped += self._cancel_early(cancelled, arrival)
                elif fields is not None:
                    request = None if early is None else early(arrival, timestamp, *fields)
                    if request is not None:
                        self.hold_early(request)
                    elif self._held_by_sid:
                        # Not one the early path can tell (far off, invalid, another action, not sure): if it names
                        # an id with a version held early, the batches decide what becomes of that version.
                        named = native_request_sid(topic, fields[2], fields[3] if len(fields) > 3 else None)
                        if named is not None:
                            self._leave_early_versions(named)
        return dropped

    def cancel_early(self, topic: str, sid: bytes, partition: int, offset: int, timestamp: int) -> int:
        """A valid CANCEL of ``sid`` read from input ``topic`` at (``partition``, ``offset``, stamped ``timestamp``)
        before a batch applied it: drop the deliveries of ``sid`` held from requests before it in log order (any
        request after it, an ADD again, is a version the CANCEL does not touch), and remember it for what a batch that
        has not read it yet hands over (``hold``) until a committed batch has read it (``forget_cancels``). Returns
        how many it dropped. A batch that applies the CANCEL later finds them gone: nothing is written that it would
        have withdrawn."""
        with self._cond:
            return self._cancel_early(sid, self._arrivals.note(topic, partition, offset, timestamp))

    def _cancel_early(self, sid: bytes, cancel: Arrival) -> int:
        """Called with the lock held."""
        self._book.add(sid, Superseding(cancel, None, None))
        dropped = 0
        for delivery_id in list(self._held_by_sid.get(sid, ())):
            held = self._held.get(delivery_id)
            if held is not None and made_before(delivery_id, cancel, self._arrivals):
                self._drop_early(held)
                dropped += 1
        return dropped

    def forget_cancels(self, committed: dict[str, dict[int, int]]) -> None:
        """Forget the CANCELs read early, and the arrivals, that a batch has read and handed over what it made of
        (next offset to read per input topic and partition: a committed batch's, or the running batch's once it has
        handed everything over): the state applied them, so no later batch hands over what they supersede. A record
        below these offsets that is read early after this is left out (``read_early``)."""
        with self._cond:
            for topic, partitions in committed.items():
                known = self._read_by_batches.setdefault(topic, {})
                for partition, offset in partitions.items():
                    known[partition] = max(offset, known.get(partition, 0))
            for held in list(self._held.values()):
                if held.early is not None and committed_past(held.early, committed):
                    self._leave_to_batches(held)  # read by a committed batch that did not hand it over
            self._book.forget(committed)
            self._arrivals.forget(committed)

    def take_written_early(self) -> EarlyTally:
        """Deliveries written early (not expired) since the last call, and what batches counted again of the versions
        written early since, and left out."""
        with self._cond:
            taken = self._early_again._replace(written=self._early_written_unreported)
            self._early_written_unreported, self._early_again = 0, EarlyTally()
            return taken

    def take_withdrawn_early(self) -> int:
        """Deliveries withdrawn by early CANCELs since the last call (for a batch's line)."""
        with self._cond:
            taken, self._early_unreported = self._early_unreported, 0
            return taken

    def _drop_early(self, held: Held) -> None:
        """Called with the lock held."""
        self._forget_held(held)
        held.records = []  # left in the heap, skipped when it comes up
        self.withdrawn_early += 1
        self._early_unreported += 1

    def _forget_held(self, held: Held) -> None:
        """Called with the lock held: ``held`` is no longer held (written, withdrawn)."""
        if self._held.get(held.delivery_id) is held:
            del self._held[held.delivery_id]
        if held.sid is not None:
            ids = self._held_by_sid.get(held.sid)
            if ids is not None:
                ids.discard(held.delivery_id)
                if not ids:
                    del self._held_by_sid[held.sid]

    def _named(self, delivery_id: str | None) -> str:
        """A row's delivery id, or one of its own for a row without (a rejection: nothing withdraws it)."""
        if delivery_id is not None:
            return delivery_id
        self._anonymous += 1
        return f"\0{self._anonymous}"

    def withdraw(self, delivery_ids: Iterable[str]) -> int:
        """Drop deliveries not written yet; returns how many were held."""
        dropped = 0
        with self._cond:
            for delivery_id in delivery_ids:
                held = self._held.get(delivery_id)
                if held is not None:
                    self._forget_held(held)
                    held.records = []  # left in the heap, skipped when it comes up
                    dropped += 1
        self.withdrawn += dropped
        return dropped

    def _earliest_queued(self) -> int | None:
        return self._heap[0].due_ms if self._heap else None  # the latest of a write in flight is in _writing

    def close(self, timeout: float = 10.0) -> None:
        """Stop writing; what is still held is dropped (the state keeps it: the next run emits it again)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self.sender is not None:
            self.sender.close(timeout)
        else:
            self._producer.flush(timeout)

    def read_through(self, through_ms: int | None) -> None:
        """The watcher's read of the inputs (early_cancels.CancelWatcher): None when it has read what there is, else
        the broker time up to which it has read the partitions it is reading. While it is behind, a delivery due
        later than that waits for it, so that a CANCEL appended before the due time is read before the delivery is
        written (keyed apart, it comes in another partition than its schedule)."""
        with self._cond:
            self._read_through = None if through_ms is None else (through_ms, time.monotonic())
            self._cond.notify_all()

    def _read_gate(self) -> int | None:
        """Called with the lock held: the latest due time that may be written while the watcher is behind."""
        if self._read_through is None:
            return None
        through, told = self._read_through
        if time.monotonic() - told > READ_GATE_STALE_S:
            return None  # a watcher that stopped telling (stopped, or stuck): CANCELs act with their batch
        return max(through, now_ms() - READ_GATE_MAX_HOLD_MS)

    def _next_due(self) -> int | None:
        """Called with the lock held: when the next write is due, if one may be written."""
        dues = [h[0].due_ms for h in (self._heap, self._early_heap) if h]
        if self._early_heap and not self._book.may_write(self._early_heap[0].due_ms):
            dues = [h[0].due_ms for h in (self._heap,) if h]  # waits for the frontier (advance_frontier notifies)
        due = min(dues, default=None)
        if due is None or (self._through is not None and due > self._through):
            return None
        gate = self._read_gate()
        if gate is not None and due > gate:
            return None  # waits for the watcher (read_through notifies)
        return due

    def _take_due(self, now: int) -> list[Held]:
        """Called with the lock held: the deliveries due by ``now`` (and by the stop's bound, and by what the watcher
        has read while it is behind) not withdrawn."""
        if self._through is not None:
            now = min(now, self._through)
        gate = self._read_gate()
        if gate is not None:
            now = min(now, gate)
        taken = []
        while self._heap and self._heap[0].due_ms <= now:
            held = heapq.heappop(self._heap)
            if self._held.get(held.delivery_id) is held:
                self._forget_held(held)
                taken.append(held)
        while (
            self._early_heap and self._early_heap[0].due_ms <= now and self._book.may_write(self._early_heap[0].due_ms)
        ):
            held = heapq.heappop(self._early_heap)
            if self._held.get(held.delivery_id) is not held or held.early is None:
                continue  # handed over by a batch (in the other heap now), or left to the batches
            if self.herd_covers(held.due_ms):
                self._leave_to_batches(held)
                continue
            self._forget_held(held)
            self._book.written_early[held.delivery_id] = held.early
            self.written_early += 1
            taken.append(held)
        return taken

    def _run(self) -> None:
        while True:
            with self._cond:
                taken = wait_until_due(self._cond, lambda: self._closed, self._next_due, self._take_due)
                if taken is None:
                    return
                self._writing = taken[-1].due_ms
            try:
                self._write(taken)
            except FencedError as exc:
                log.error("timed writer: %s", exc)
                self.failure = exc
                return
            finally:
                with self._cond:
                    self._writing = None
                    self._cond.notify_all()

    def _write(self, taken: list[Held]) -> None:
        started = now_ms()
        expired = [held for held in taken if held.expired_at(started)]
        if expired:
            # Later than its max lateness: the delivery goes to the rejections topic as expired, its history copy is
            # not written; what follows a delivery either way (a write-back) is.
            taken = [held for held in taken if not held.expired_at(started)]
            rejected = [
                Held(
                    held.due_ms,
                    held.delivery_id,
                    [
                        expired_as_rejection(
                            record, held.delivery_id, held.due_ms, held.max_lateness_ms, self.rejections_topic
                        )
                        if kind == KIND_DELIVER
                        else record
                        for record, kind in zip(held.records, held.record_kinds())
                        if kind != KIND_HISTORY
                    ],
                )
                for held in expired
                if self.rejections_topic
            ]
            lost = self._send([(held, record) for held in rejected for record in held.records])
            self.expired += len(expired)
            log.warning(
                "timed writer: %d delivery(ies) later than their max lateness, sent to rejections as "
                "expired (e.g. %s, due %d ms before)",
                len(expired),
                expired[0].delivery_id,
                started - expired[0].due_ms,
            )
            if lost:
                self.failed += len(lost)
                log.error("timed writer: %d expired record(s) not written as rejections: %s", len(lost), lost[0][2])
            if not taken:
                if self.on_written is not None:
                    self.on_written([], 0, len(expired))
                return
        early = sum(1 for held in taken if held.early is not None)  # those expired were counted as such, above
        if early:
            with self._cond:
                self._early_written_unreported += early
        # What failed without a refusal (a broker away, the rest of an aborted transaction) is held again and
        # retried after a pause, below.
        refused, failures = send_sorting_refusals(
            self._send, [(held, record) for held in taken for record in held.records]
        )
        again = [(held, record) for held, record, _ in failures]
        self.written += len(taken)
        self.lateness_ms = [started - h.due_ms for h in taken[-1000:]]
        if refused:
            rejections = [
                (held, refused_as_rejection(record, held.delivery_id, self.rejections_topic, error))
                for held, record, error in refused
                if self.rejections_topic and held.delivery_id[:1] != "\0"
            ]
            log.warning(
                "timed writer: %d record(s) refused by their destination, sent to rejections: %s",
                len(refused),
                refusal_reason(refused[0][1], refused[0][2]),
            )
            self.refused += len(rejections)
            lost = self._send(rejections) if rejections else []
            lost += [(h, r, e) for h, r, e in refused if not (self.rejections_topic and h.delivery_id[:1] != "\0")]
            if lost:
                self.failed += len(lost)
                log.error("timed writer: %d record(s) not written, not even as rejections: %s", len(lost), lost[0][2])
        if self.on_written is not None:
            failed = {id(held) for held, *_ in refused} | {id(held) for held, _ in again}
            # A delivery the batch expired comes as a rejection that keeps its due time and delivery id: no delivery.
            written = [h for h in taken if h.due_ms > 0 and h.delivery_id[:1] != "\0" and id(h) not in failed]
            self.on_written(
                [started - h.due_ms for h in written if "deliver" in h.record_kinds()],
                len(refused),
                len(expired),
            )
        if again:
            self.retried += len(again)
            log.warning(
                "timed writer: %d record(s) not written, retrying in %.0fs: %s",
                len(again),
                RETRY_PAUSE_S,
                failures[0][2],
            )
            with self._cond:
                for held, record in again:
                    pending = self._held.get(held.delivery_id)
                    if pending is None:  # due as before: a batch waiting for it keeps waiting (wait_written)
                        pending = self._held[held.delivery_id] = Held(
                            held.due_ms, held.delivery_id, [], max_lateness_ms=held.max_lateness_ms
                        )
                        heapq.heappush(self._heap, pending)
                    pending.records.append(record)
                    pending.kinds.append(kind_of(held, record))
            time.sleep(RETRY_PAUSE_S)

    def write_now(self, rows: Iterable[WriterRow], chunk: int = 10_000) -> int:
        """Write rows (as for ``hold``) at once from the calling thread, ``chunk`` at a time: with exactly-once, the
        batch's own writes (what does not fit in the writer) go through the same transactions. Returns how many."""
        taken: list[Held] = []
        count = 0
        for row in rows:
            lateness = row.max_lateness_ms if row.kind == KIND_DELIVER else None
            taken.append(
                Held(
                    row.due_ms or 0,
                    self._named(row.delivery_id),
                    [Record(row.topic, row.partition, row.key, row.value, header_pairs(row.headers))],
                    [row.kind],
                    None if lateness is None else int(lateness),
                )
            )
            if len(taken) >= chunk:
                count += len(taken)
                self._write(taken)
                taken = []
        if taken:
            count += len(taken)
            self._write(taken)
        return count

    def _send(self, items: list) -> list:
        """Produce (held, record) pairs and wait for the broker; returns (held, record, error) of those it refused."""
        if self.sender is not None:
            return self.sender.send(items)
        failures = []

        def on_delivery(held, record):
            def callback(err, _msg):
                if err is not None:
                    failures.append((held, record, err))

            return callback

        for held, record in items:
            error = produce_record(self._producer, record, on_delivery(held, record))
            if error is not None:  # refused before sending (too large, unknown topic or partition)
                failures.append((held, record, error))
        self._producer.flush()
        return failures
