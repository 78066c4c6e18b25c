"""CANCELs read as they arrive, so that a delivery prepared ahead is withdrawn before its instant however long the
batch that applies the CANCEL takes.

A delivery prepared ahead waits in the driver's timed writer until its instant (timed_writer.py). A CANCEL of it
reaches the writer as a withdrawal from the batch that applies it: one batch cycle after it was sent at best, and a
cycle is seconds on a loaded machine, so a CANCEL sent that close to the due time came too late and the delivery went
out (bench mixed: most cancels sent 2 s before the due time missed, with or without a herd; docs/measurements.md).
``CancelWatcher`` reads the native inputs itself, read_committed as the job does, and hands every valid CANCEL to
the writer at once (``TimedWriter.cancel_early``), which drops what it supersedes.

What a CANCEL supersedes, without the state: the requests of one id are applied in log order (docs/protocols.md,
"Order"): within a partition by offset, across partitions by the time the broker stamped on each request (a running
maximum per partition, so a partition's own order is never broken). A version's delivery id names the request that
made it (``<topic>-<partition>-<offset>``), so the writer can tell which of what it holds, or is handed later by a
batch that had not read the CANCEL yet, the CANCEL supersedes: a version made before it in its partition, or in another
partition by a request stamped earlier (``ArrivalTimes`` keeps the stamps of the requests read since the watcher
started; a request it never read was in the log before it started, or applied by a committed batch: earlier). The
batch that applies the CANCEL then withdraws nothing, and the state retires the version as it would a written one:
a crash in between loses nothing either, since the CANCEL is not committed and the next run's first batch reads it
beside the version it emits again. Only CANCEL: a REPLACE identical to its version keeps that version (a no-op
only the state can tell), and crons have ids of their own (CRON_CANCEL, CRON_PAUSE are the state's).

The watcher also counts the requests of an id that arrive in another partition than the id's request before them
(``keyed_apart``): a producer that keys them apart relies on the broker's clocks to order them.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from array import array
from collections.abc import Callable, Iterable
from itertools import islice
from typing import NamedTuple

from ...delivery_ids import is_firing, request_of
from ...protocol import ACTION, CRON_SID_PREFIX, NATIVE_SINGLE_HEADERS, REQUEST_ID, schedule_sid

log = logging.getLogger(__name__)

SINGLE_HEADERS = frozenset(NATIVE_SINGLE_HEADERS)
# CANCELs kept for deliveries not handed over yet (until a committed batch has read them): beyond this many, the
# oldest are left to the batches that apply them.
MAX_REMEMBERED = 100_000
# Ids whose last request's partition is kept, to count requests of one id keyed apart: the most recent ones.
MAX_IDS_FOLLOWED = 100_000
FORGET_EVERY_S = 1.0
PARTITIONS_EVERY_S = 30.0
KEYED_APART_LOG_EVERY_S = 60.0
READ_AT_ONCE = 1000  # messages handed to the timed writer in one go, at most
READ_LAG_ALLOWED_MS = 1000  # a read whose newest record is older than this is behind (CancelWatcher.read)
READ_SEEN_S = 2.0  # a partition read within this long is one the read may still be behind on (CancelWatcher._through)


def first_headers(headers: Iterable | None) -> dict[str, bytes | None] | None:
    """The first value of each header name, lower-cased, as the native decoder reads them; None when a header of
    SINGLE_HEADERS comes twice (the decoder rejects the request)."""
    if not headers:
        return {}
    if type(headers) is list:
        # Every record read passes here (a backlog's million): names all str (str.lower refuses any other), none
        # twice, told in one pass.
        try:
            first = {str.lower(name): value for name, value in reversed(headers)}
        except (TypeError, ValueError):
            first = None
        if first is not None and len(first) == len(headers):
            return first
    return first_headers_one_by_one(headers)


def first_headers_one_by_one(headers: Iterable) -> dict[str, bytes | None] | None:
    """``first_headers`` for any headers: names of bytes, a name given twice."""
    first: dict[str, bytes | None] = {}
    for name, value in headers:
        lowered = name.lower() if type(name) is str else bytes(name).decode("utf-8", "replace").lower()
        if lowered not in first:
            first[lowered] = value
        elif lowered in SINGLE_HEADERS:
            return None
    return first


def _action(first: dict[str, bytes | None]) -> str:
    action = first.get(ACTION)
    return "ADD" if action is None else bytes(action).decode("utf-8", "replace").strip(" ").upper()


def native_cancel_sid(topic: str, headers: Iterable | None, first: dict | None = None) -> bytes | None:
    """The state's id of the schedule a record of native input ``topic`` cancels, if it is a valid CANCEL; else
    None (``request_sids``). ``first``: ``first_headers(headers)``, when the caller has it."""
    first = first_headers(headers) if first is None else first
    return None if first is None else request_sids(topic, first)[1]


def native_request_sid(topic: str, headers: Iterable | None, first: dict | None = None) -> bytes | None:
    """The id a native request names (a one-shot's, or a cron's for a cron action), if it names one: to follow the
    partitions an id's requests arrive in. Not a verdict on the request's validity (``request_sids``)."""
    first = first_headers(headers) if first is None else first
    return None if first is None else request_sids(topic, first)[0]


def request_sids(topic: str, first: dict[str, bytes | None]) -> tuple[bytes | None, bytes | None]:
    """From a record's ``first_headers``: the id it names (a one-shot's, or a cron's for a cron action), and the id
    of the schedule it cancels if it is a valid CANCEL. The native decoder's rules for a CANCEL (dialects/native.py),
    in Python: header names compare case-insensitively and the first header of a name counts; the action, as text
    (invalid UTF-8 replaced), stripped of spaces and upper-cased, is CANCEL; no header of SINGLE_HEADERS comes twice
    (``first_headers`` is None then: the caller passes {}); the request id is not empty (any bytes).
    tests/unit/test_early_cancels.py checks this against the decoder over hostile records. The read of a backlog
    calls this for every record."""
    request_id = first.get(REQUEST_ID)
    if not request_id:
        return None, None
    if first.get(ACTION) is None:
        return schedule_sid(topic, bytes(request_id)), None
    action = _action(first)
    if action.startswith("CRON_"):
        return schedule_sid(topic, bytes(request_id), CRON_SID_PREFIX), None
    sid = schedule_sid(topic, bytes(request_id))
    return sid, sid if action == "CANCEL" else None


def made_before(delivery_id: str, request: Arrival, times: ArrivalTimes | None = None) -> bool:
    """Whether the version named ``delivery_id`` (``<topic>-<partition>-<offset>`` of the request that made it) was
    made before ``request`` in log order: before it in its partition, or in another partition by a request stamped
    earlier (a tie goes to the lower partition, as the batches order them); a request ``times`` did not read came
    before. Cron firings (``...@instant``: a CANCEL never touches a cron) and ids of another form: never."""
    if is_firing(delivery_id):
        return False
    try:
        _, made_in, made_at = request_of(delivery_id)
        made_in, made_at = int(made_in), int(made_at)
    except ValueError:
        return False
    if made_in == request.partition:
        return made_at < request.offset
    stamped = None if times is None else times.stamp(request.topic, made_in, made_at)
    return stamped is None or (stamped, made_in) < (request.stamp, request.partition)


class Arrival(NamedTuple):
    """Where a request was read and the broker's stamp on it (the running maximum of its partition's stamps)."""

    topic: str
    partition: int
    offset: int
    stamp: int


class ArrivalTimes:
    """The stamps of the input records read since the watcher started, per partition, as two growing arrays (offsets
    ascending): 16 bytes a record, dropped once a committed batch has read them."""

    def __init__(self):
        self._partitions: dict[tuple[str, int], tuple[array, array]] = {}

    def __len__(self) -> int:
        return sum(len(offsets) for offsets, _ in self._partitions.values())

    def note(self, topic: str, partition: int, offset: int, timestamp: int) -> Arrival:
        """A record read (in offset order within its partition): its arrival, the stamp a running maximum."""
        found = self._partitions.get((topic, partition))
        if found is None:
            found = self._partitions[topic, partition] = (array("q"), array("q"))
        offsets, stamps = found
        stamp = max(timestamp, stamps[-1]) if stamps else timestamp
        if not offsets or offset > offsets[-1]:
            offsets.append(offset)
            stamps.append(stamp)
        return Arrival(topic, partition, offset, stamp)

    def stamp(self, topic: str, partition: int, offset: int) -> int | None:
        found = self._partitions.get((topic, partition))
        if found is None:
            return None
        offsets, stamps = found
        at = bisect.bisect_left(offsets, offset)
        return stamps[at] if at < len(offsets) and offsets[at] == offset else None

    def forget(self, committed: dict[str, dict[int, int]]) -> None:
        """Drop the records before the next offset a committed batch reads."""
        for (topic, partition), (offsets, stamps) in list(self._partitions.items()):
            cut = bisect.bisect_left(offsets, committed.get(topic, {}).get(partition, 0))
            if cut:
                del offsets[:cut]
                del stamps[:cut]


class EarlyCancels:
    """The CANCELs read early that no committed batch has read yet: sid -> [Arrival]."""

    def __init__(self, limit: int = MAX_REMEMBERED):
        self.limit = limit
        self._cancels: dict[bytes, list[Arrival]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, sid: bytes, cancel: Arrival) -> None:
        if self._count >= self.limit:
            return  # the batch that applies it withdraws what it cancels, as without this
        self._cancels.setdefault(sid, []).append(cancel)
        self._count += 1

    def supersede(self, sid: bytes | None, delivery_id: str, times: ArrivalTimes | None = None) -> bool:
        """Whether a CANCEL read early supersedes the version ``delivery_id`` of ``sid``."""
        return sid is not None and any(made_before(delivery_id, c, times) for c in self._cancels.get(sid, ()))

    def forget(self, committed: dict[str, dict[int, int]]) -> None:
        """Drop those before the next offset a committed batch reads (per topic and partition)."""
        for sid in list(self._cancels):
            kept = [c for c in self._cancels[sid] if c.offset >= committed.get(c.topic, {}).get(c.partition, 0)]
            self._count -= len(self._cancels[sid]) - len(kept)
            if kept:
                self._cancels[sid] = kept
            else:
                del self._cancels[sid]


class KeyedApart:
    """Counts the requests of an id that arrive in another partition than the id's request before them (of at least
    the ``limit`` ids seen last, at most twice as many: a plain dict, trimmed now and then, costs less a record than
    an exact window)."""

    def __init__(self, limit: int = MAX_IDS_FOLLOWED):
        self.limit = limit
        self.count = 0
        self._last: dict[bytes, int] = {}

    def note(self, sid: bytes, partition: int) -> bool:
        last = self._last
        before = last.pop(sid, None)
        last[sid] = partition
        if len(last) > 2 * self.limit:
            self._last = dict(islice(last.items(), len(last) - self.limit, None))
        if before is not None and before != partition:
            self.count += 1
            return True
        return False


class CancelWatcher:
    """Reads the native input topics from their end as the job runs and hands the writer what it reads
    (``read_early``: each record's arrival, the id a valid CANCEL cancels, and with ``early`` the ADDs and REPLACEs
    to hold early); every second tells it which a committed batch has read (``committed()``: the next offset to read
    per topic and partition). Counts the requests of an id keyed apart (``keyed_apart``), calling ``on_keyed_apart``
    with each new count, and tells ``on_behind`` how far behind its read is."""

    def __init__(
        self,
        writer,
        topics: list[str],
        consumer_settings: dict,
        committed: Callable[[], dict[str, dict[int, int]]],
        on_keyed_apart: Callable[[int], None] | None = None,
        early: Callable | None = None,
        on_behind: Callable[[float], None] | None = None,
    ):
        self.writer, self.topics, self.committed = writer, list(topics), committed
        self.keyed_apart = KeyedApart()
        self.on_keyed_apart = on_keyed_apart
        # (arrival, timestamp, key, value, headers) -> the ADD or REPLACE to hold early, or None (early_requests.py)
        self.early = early
        # Called after each read with how far behind it is (now minus the newest record's broker timestamp, in
        # seconds; 0 when nothing more was waiting): a CANCEL read late may come after its schedule was written.
        self.on_behind = on_behind
        self._next_apart_log = 0.0
        self._newest: dict[tuple[str, int], tuple[int, float]] = {}  # per partition: newest broker time read, when
        self._next_offset: dict[tuple[str, int], int] = {}  # per partition: the offset after the newest read
        # (topic, partition) -> the consumer's high watermark as last fetched (None: not known); set by the consumer
        self.high_watermark: Callable[[str, int], int | None] | None = None
        self._settings = consumer_settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cancel-watcher", daemon=True)

    def start(self) -> CancelWatcher:
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def read(self, messages: Iterable, more_waiting: bool = False) -> None:
        """Messages of the native inputs, in the order consumed; ``more_waiting``: the consumer had more at once. The
        read is behind then, or when the newest record read is older than READ_LAG_ALLOWED_MS (the consumer's queue
        can run dry between fetches while the broker holds more), and the writer holds back what is due after what
        has been read (``read_through``)."""
        records = []
        apart = 0
        newest_ms = 0
        read_to: dict[tuple[str, int], tuple[int, int]] = {}  # per partition: newest broker time, next offset
        note_apart = self.keyed_apart.note
        for message in messages:
            if message.error() is not None:
                continue
            topic, partition, offset, headers = (
                message.topic(),
                message.partition(),
                message.offset(),
                message.headers(),
            )
            timestamp = message.timestamp()[1]
            first = first_headers(headers) or {}  # the headers read once for every use below
            named, cancelled = request_sids(topic, first)
            if named is not None and note_apart(named, partition):
                apart += 1
            records.append(
                (topic, partition, offset, timestamp, cancelled, (message.key(), message.value(), headers, first))
            )
            if timestamp > newest_ms:
                newest_ms = timestamp
            seen = read_to.get((topic, partition))
            read_to[topic, partition] = (timestamp if seen is None or timestamp > seen[0] else seen[0], offset + 1)
        if records:
            self.writer.read_early(records, self.early)
            if self.on_behind is not None:
                self.on_behind(time.time() - newest_ms / 1000)
        through = self._through(read_to)
        behind = more_waiting or (bool(records) and time.time() * 1000 - newest_ms > READ_LAG_ALLOWED_MS)
        self.writer.read_through(through if behind else None)
        if apart:
            if self.on_keyed_apart is not None:
                self.on_keyed_apart(apart)
            now = time.monotonic()
            if now >= self._next_apart_log:
                self._next_apart_log = now + KEYED_APART_LOG_EVERY_S
                log.warning(
                    "%d request(s) of one id so far arrived in another partition than the id's request before them: "
                    "they are ordered by the broker's timestamps; give an id's requests the same record key to keep "
                    "them in one partition",
                    self.keyed_apart.count,
                )

    def _through(self, read_to: dict[tuple[str, int], tuple[int, int]]) -> int | None:
        """While behind: the broker time up to which every partition read in the last READ_SEEN_S seconds has been
        read (the oldest of their newest records; a partition read from one batch of messages to the next is one
        still catching up, and so is one the broker holds more of (``_unread_left``); a partition that went quiet
        has been read to its end). ``read_to``: what the last messages read of each partition, its newest broker
        time and the offset after its last record."""
        now = time.monotonic()
        for key, (timestamp, next_offset) in read_to.items():
            newest = self._newest.get(key)
            self._newest[key] = (max(timestamp, newest[0]) if newest else timestamp, now)
            self._next_offset[key] = max(next_offset, self._next_offset.get(key, 0))
        recent = [
            stamp for key, (stamp, seen) in self._newest.items() if now - seen <= READ_SEEN_S or self._unread_left(key)
        ]
        return min(recent, default=None)

    def _unread_left(self, key: tuple[str, int]) -> bool:
        """Whether the broker holds records of a partition past those read (its high watermark, as the consumer last
        fetched it): not quiet, though the consumer has not handed any of it over lately. A CANCEL keyed apart in a
        partition the consumer left unread for seconds went out after its schedule (2026-12-08 backlog trace)."""
        if self.high_watermark is None:
            return False
        high = self.high_watermark(*key)
        return high is not None and high > self._next_offset.get(key, 0)

    def _run(self) -> None:
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        consumer = Consumer(
            {
                **self._settings,
                "group.id": "kafka-scheduler-cancel-watcher",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "latest",
                "fetch.wait.max.ms": 50,
                "log_level": 3,
            }
        )
        assigned: set[tuple[str, int]] = set()
        next_look = next_forget = 0.0

        def high_watermark(topic: str, partition: int) -> int | None:
            try:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            except Exception:  # not fetched yet
                return None
            return high if high >= 0 else None

        self.high_watermark = high_watermark
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_look:
                    next_look = now + PARTITIONS_EVERY_S
                    try:
                        metadata = consumer.list_topics(timeout=10)
                        found = {
                            (t, p) for t in self.topics if t in metadata.topics for p in metadata.topics[t].partitions
                        }
                        if found - assigned:
                            # From the end: what was there before is the batches' to apply, as without the watcher.
                            consumer.incremental_assign(
                                [TopicPartition(t, p, OFFSET_END) for t, p in sorted(found - assigned)]
                            )
                            assigned |= found
                    except Exception as exc:  # the broker away for a while: the batches apply the CANCELs
                        log.debug("cancel watcher: partitions not looked up: %s", exc)
                if now >= next_forget:
                    next_forget = now + FORGET_EVERY_S
                    try:
                        self.writer.forget_cancels(self.committed())
                    except Exception as exc:
                        log.debug("cancel watcher: committed offsets not read: %s", exc)
                if not assigned:
                    self._stop.wait(0.5)
                    continue
                # One message waited for, then what else is there at once: consume(n, timeout) would hold what
                # came first until n arrived or the timeout passed.
                first = consumer.poll(0.2)
                if first is not None:
                    messages = [first, *consumer.consume(READ_AT_ONCE - 1, timeout=0)]
                    self.read(messages, more_waiting=len(messages) >= READ_AT_ONCE)
                else:
                    self.writer.read_through(None)
                    if self.on_behind is not None:
                        self.on_behind(0.0)
        except Exception as exc:  # only an early path: the batches still apply every CANCEL
            log.warning("cancel watcher stopped (CANCELs now act when their batch runs): %s", exc)
        finally:
            consumer.close()
