"""Exactly-once delivery (``--exactly-once``): every record the job writes goes out in a Kafka transaction
that also appends what it wrote to the app's ledger topic, and nothing in the ledger is written again.

Why a ledger and not just the batch id: deliveries are written by the driver's timed writer at their due
instant, outside any micro-batch, and a batch that is re-run after a crash may emit a different set of
deliveries than its first run (it fires the timers due by its new time). So each record is identified by
its delivery id and destination topic (a delivery, its write-back and its history copy share the id),
and the transaction that writes it appends that key to the ledger. At start the driver reads the ledger
back (read_committed) after ``init_transactions`` has fenced the previous driver and aborted what it left
open; a record whose key is there is not written again. A consumer reading with
``isolation.level=read_committed`` therefore sees each record once.

A herd (what a batch prepares beyond the timed writer's room) is written by the executors, each task in its own
transactions under a transactional id of its own (``transactional_id(app, "herd-<partition>")``), with the same
ledger entries; the driver then reads the ledger's new records (``catch_up``), so that a retry or a trim knows
what they committed.

The ledger only has to remember records their schedule could still be emitted for: once a committed batch
has fired every timer due by a time, schedules due by then have left state. ``trim`` forgets those keys and
deletes the ledger records that hold only such keys.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import threading
import time
from collections.abc import Iterable
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from .producing import Record, produce_record, refused_as_rejection, send_sorting_refusals

log = logging.getLogger(__name__)

LEDGER_MAX_BYTES = 512 * 1024  # per ledger record: under the broker's default max.message.bytes (1 MiB)
LEDGER_LOAD_TIMEOUT_S = 120.0
TXN_TIMEOUT_MS = 300_000  # a transaction's records and its commit; slices are split well below this
MAX_RECORDS_PER_TXN = 20_000
RETRY_PAUSE_S = 0.5
# What a record in an aborted transaction reports when it did not fail itself: not written, try again.
ABORTED = KafkaError(KafkaError._FAIL, "its transaction was aborted")


def transactional_id(app_id: str, member: str = "") -> str:
    """One per app for the driver: a new driver fences the one before it, whose open transaction is aborted. A
    ``member`` (an executor's herd task) has one of its own; a task's retry fences the attempt before it."""
    return f"kafka-scheduler-{app_id}" + (f"/{member}" if member else "")  # no app id holds a "/"


def herd_member(partition: int) -> str:
    """The transactional id's member of the herd task that writes ``partition`` (``transactional_id``)."""
    return f"herd-{partition}"


class LedgerKeyed(NamedTuple):
    """What the sender needs of a record's schedule (the timed writer's ``Held`` has the same fields)."""

    delivery_id: str
    due_ms: int


def ledger_key(delivery_id: str, topic: str) -> str:
    return f"{delivery_id}\t{topic}"


class FencedError(RuntimeError):
    """Another driver of this app took over the transactional id: this one must stop writing."""


class TransactionalSender:
    """Writes (held, record) pairs in transactions with their ledger entries; thread-safe (one transaction at a
    time)."""

    def __init__(
        self,
        producer_settings: dict,
        app_id: str,
        ledger_topic: str,
        consumer_settings: dict | None = None,
        member: str = "",
    ):
        self.ledger_topic = ledger_topic
        self.producer_settings = producer_settings
        self._app_id = app_id
        self._producer = Producer(
            {
                **producer_settings,
                "transactional.id": transactional_id(app_id, member),
                "transaction.timeout.ms": TXN_TIMEOUT_MS,
                "linger.ms": 5,
            }
        )
        self._consumer_settings = consumer_settings or {"bootstrap.servers": producer_settings["bootstrap.servers"]}
        self._admin: AdminClient | None = None  # made at the first trim (a herd task never trims)
        # Herd tasks may have committed ledger records this sender has not read yet: a trim deletes nothing past
        # what it has read (a delete removes every record before its offset, known or not).
        self._foreign_writes = False
        self._settled_once = False
        self._lock = threading.Lock()
        self._written: dict[str, int] = {}  # ledger key -> due_ms of its schedule
        self._by_due: list[tuple[int, str]] = []
        # (offset after a ledger record, its latest due_ms), in offset order: a trim deletes every record before one.
        self._ledger_ends: list[tuple[int, int]] = []
        self._position: int | None = None  # the ledger read up to here (catch_up)
        self.skipped = 0  # records not written because the ledger has them (a re-run after a crash)
        self.transactions = 0
        self.aborted = 0
        self.fenced = False

    def start(self, timeout: float = LEDGER_LOAD_TIMEOUT_S) -> int:
        """Fence the previous driver and read the ledger back; returns how many keys it holds."""
        self._producer.init_transactions(timeout)
        return self.catch_up(timeout)

    def start_writing(self, timeout: float = LEDGER_LOAD_TIMEOUT_S) -> None:
        """An executor's herd task: fence the attempt before it; it reads nothing back (the driver tells it what to
        leave out)."""
        self._producer.init_transactions(timeout)

    def catch_up(self, timeout: float = LEDGER_LOAD_TIMEOUT_S, settled: bool = False) -> int:
        """Read the ledger from where this sender last read it to its end (read_committed): the keys and records
        other writers of this app committed (the executors' herd tasks; at start, the previous drivers). Returns
        how many keys it holds. Not under the sender's lock: a transaction of its own open meanwhile must commit.
        ``settled``: no herd task writes any more (their job ended, or they were fenced)."""
        # earliest: a trim's delete moving the start past this position must not send the consumer to the end.
        consumer = Consumer(
            {
                **self._consumer_settings,
                "group.id": "kafka-scheduler-ledger",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
                "log_level": 3,
            }
        )
        try:
            partition = TopicPartition(self.ledger_topic, 0)
            # read_committed: the high offset is the last stable one (an open transaction's records wait).
            low, high = consumer.get_watermark_offsets(partition, timeout=30)
            position = low if self._position is None else max(low, self._position)
            consumer.assign([TopicPartition(self.ledger_topic, 0, position)])
            deadline = time.monotonic() + timeout
            while position < high:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"exactly-once: could not read the ledger {self.ledger_topic} to its end "
                        f"(at offset {position} of {high}) in {timeout:.0f}s"
                    )
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    entries = _ledger_entries(message.value())
                    with self._lock:
                        self._remember(entries)
                        self._note_ledger_record(message.offset() + 1, max((d for _, d in entries), default=0))
                # Aborted records and transaction markers are skipped by the consumer; its position moves past them.
                [current] = consumer.position([partition])
                if current.offset >= 0:
                    position = current.offset
        finally:
            consumer.close()
        with self._lock:
            self._position = max(position, self._position or 0)
            if settled:
                self._foreign_writes = False
                self._settled_once = True
        return len(self._written)

    @property
    def unsettled(self) -> bool:
        """Herd tasks may have committed what this sender has not read: a failed herd write not settled since, or,
        before this driver's first settled read, a previous driver's tasks (one whose id start did not fence may
        have held the ledger's start-up read back with a transaction left open)."""
        with self._lock:
            return self._foreign_writes or not self._settled_once

    def foreign_writes_begin(self) -> None:
        """Herd tasks are about to write: until a ``catch_up(settled=True)`` the trim stays behind what was read."""
        with self._lock:
            self._foreign_writes = True

    def fence_members(self, members: Iterable[str], timeout: float = 30.0) -> None:
        """Abort what herd tasks (``member`` ids) left open, and fence them: a task killed or failed half way holds
        its transaction open until the transaction timeout, and read_committed readers (this one's catch_up too)
        stop before it."""
        for member in members:
            producer = Producer({**self.producer_settings, "transactional.id": transactional_id(self._app_id, member)})
            producer.init_transactions(timeout)
            producer.flush(timeout)

    def _note_ledger_record(self, end: int, latest: int) -> None:
        ends = self._ledger_ends
        at = bisect.bisect_left(ends, (end, -1))
        if at == len(ends) or ends[at][0] != end:
            ends.insert(at, (end, latest))

    def written_keys(self, after_ms: int | None, through_ms: int | None) -> list[str]:
        """Ledger keys held of schedules due after ``after_ms`` and by ``through_ms`` (None: no bound)."""
        low = -1 if after_ms is None else after_ms
        high = float("inf") if through_ms is None else through_ms
        with self._lock:
            return [key for key, due_ms in self._written.items() if low < due_ms <= high]

    def _remember(self, entries: Iterable[tuple[str, int]]) -> None:
        """Ledger keys (with their schedules' due times) written: never written again until trimmed."""
        for key, due_ms in entries:
            if key not in self._written:
                self._written[key] = due_ms
                heapq.heappush(self._by_due, (due_ms, key))

    def send(self, items: list) -> list:
        """Write (held, record) pairs not in the ledger in transactions; returns (held, record, error) of those
        not written: the ones a destination refused, and, when a transaction aborted, everything in it."""
        failures = []
        with self._lock:
            fresh = []
            for held, record in items:
                if held.delivery_id[:1] != "\0" and ledger_key(held.delivery_id, record.topic) in self._written:
                    self.skipped += 1
                else:
                    fresh.append((held, record))
            for start in range(0, len(fresh), MAX_RECORDS_PER_TXN):
                failures += self._transaction(fresh[start : start + MAX_RECORDS_PER_TXN])
        return failures

    def _transaction(self, items: list) -> list:
        if self.fenced:
            raise FencedError("exactly-once: another driver of this app took over; this one writes nothing more")
        producer = self._producer
        failed: list = []  # refused in the callback: the commit fails and the transaction is aborted
        refused: list = []  # refused before sending: left out of the transaction, which commits without them
        produced = []

        def on_delivery(held, record):
            def callback(err, _msg):
                if err is not None:
                    failed.append((held, record, err))

            return callback

        self._begin()
        for held, record in items:
            error = produce_record(producer, record, on_delivery(held, record))
            if error is None:
                produced.append((held, record))
            else:
                refused.append((held, record, error))
        entries = [(ledger_key(h.delivery_id, r.topic), h.due_ms) for h, r in produced if h.delivery_id[:1] != "\0"]
        ledger_offsets: list = []
        for lines, latest in _ledger_records(entries):
            self._produce_ledger(lines, latest, ledger_offsets)
        if self._commit():
            self.transactions += 1
            self._remember(entries)
            for end, latest in ledger_offsets:
                self._note_ledger_record(end, latest)
            return refused
        self.aborted += 1
        known = {id(r) for _, r, _ in failed}
        return refused + failed + [(h, r, ABORTED) for h, r in produced if id(r) not in known]

    def _begin(self) -> None:
        while True:
            try:
                self._producer.begin_transaction()
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal():
                    self._fenced(error)
                if not error.txn_requires_abort():
                    raise
                self._abort()

    def _fenced(self, error: KafkaError) -> None:
        self.fenced = True
        raise FencedError(
            f"exactly-once: the transactional producer failed for good ({error.str()}); another "
            "driver of this app may have started"
        ) from None

    def _produce_ledger(self, lines: str, latest: int, offsets: list) -> None:
        def callback(err, msg):
            if err is None:
                offsets.append((msg.offset() + 1, latest))

        error = produce_record(self._producer, Record(self.ledger_topic, 0, None, lines.encode(), None), callback)
        if error is not None:
            raise KafkaException(error)

    def _commit(self) -> bool:
        """Commit; False if the transaction had to be aborted (a record refused, the broker away too long)."""
        producer = self._producer
        while True:
            try:
                producer.commit_transaction(60)
                return True
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal():
                    self._fenced(error)
                if error.txn_requires_abort():
                    log.warning("exactly-once: transaction aborted (%s); its records are written again", error.str())
                    self._abort()
                    return False
                if not error.retriable():
                    self._abort()
                    return False
                time.sleep(RETRY_PAUSE_S)  # a broker away: the commit is tried again

    def _abort(self) -> None:
        while True:
            try:
                self._producer.abort_transaction(60)
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal():
                    self._fenced(error)
                time.sleep(RETRY_PAUSE_S)

    def trim(self, through_ms: int) -> int:
        """Forget keys of schedules due by ``through_ms`` (a committed batch fired every timer due by then) and
        delete the ledger records holding only such keys; returns how many keys were forgotten."""
        forgotten = 0
        with self._lock:
            while self._by_due and self._by_due[0][0] <= through_ms:
                _, key = heapq.heappop(self._by_due)
                if self._written.pop(key, None) is not None:
                    forgotten += 1
            read = self._position if self._foreign_writes else None
            trimmed = 0
            while (
                trimmed < len(self._ledger_ends)
                and self._ledger_ends[trimmed][1] <= through_ms
                and (read is None or self._ledger_ends[trimmed][0] <= read)
            ):
                trimmed += 1
            end = self._ledger_ends[trimmed - 1][0] if trimmed else None
            del self._ledger_ends[:trimmed]
        if end is not None:
            # Not waited for: a ledger record left a little longer costs a few bytes at the next start.
            if self._admin is None:
                self._admin = AdminClient(self._consumer_settings)
            self._admin.delete_records([TopicPartition(self.ledger_topic, 0, end)])
        return forgotten

    def abort_open(self) -> None:
        """A herd task failing half way: abort the transaction it may have open (nothing open: nothing happens)."""
        try:
            self._producer.abort_transaction(10)
        except KafkaException:
            pass

    @property
    def remembered(self) -> int:
        return len(self._written)

    def close(self, timeout: float = 10.0) -> None:
        self._producer.flush(timeout)


# What each task of a herd's write reports (herd_slices.SparkHerdSlices): a failure fails the write.
HERD_TASK_RESULT = "partition int, written long, failure string"


# A herd task's first transaction is this small, and each next one four times the last (up to MAX_RECORDS_PER_TXN): a
# consumer reading read_committed sees a transaction's records only at its commit, so the first ones come sooner.
FIRST_HERD_TXN_RECORDS = 1_000


def write_herd_partition(producer_settings: dict, app_id: str, ledger_topic: str, rejections_topic: str | None):
    """The ``mapInArrow`` function with which the executors write a herd: each task its partition's records, in
    transactions of FIRST_HERD_TXN_RECORDS growing to MAX_RECORDS_PER_TXN records with their ledger entries, under
    the transactional id of its partition. A record its destination refuses goes to ``rejections_topic`` instead,
    as the timed writer does. Stops at the first transaction that fails otherwise and reports it: the driver fences
    the tasks' ids and tries the write again, less what the ledger then holds. A retried task (a cluster retries a
    failed one) writes nothing and says so: what its earlier attempt committed is not in the job's input yet."""

    def write(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId()
        schema = pa.schema([("partition", pa.int32()), ("written", pa.int64()), ("failure", pa.string())])
        if context.attemptNumber() > 0:  # (no stage retries here: the stage reads no shuffle)
            yield pa.RecordBatch.from_pylist(
                [
                    {
                        "partition": partition,
                        "written": 0,
                        "failure": "a retried task writes nothing (the driver writes the slice again)",
                    }
                ],
                schema=schema,
            )
            return
        sender = TransactionalSender(producer_settings, app_id, ledger_topic, member=herd_member(partition))
        sender.start_writing()
        written, failure, size = 0, None, FIRST_HERD_TXN_RECORDS
        items: list = []
        try:
            for batch in batches:
                items += herd_items(batch)
                while len(items) >= size and not failure:
                    failure = _send_herd_items(sender, items[:size], rejections_topic)
                    written += 0 if failure else size
                    del items[:size]
                    size = min(MAX_RECORDS_PER_TXN, 4 * size)
                if failure:
                    break
            if items and not failure:
                failure = _send_herd_items(sender, items, rejections_topic)
                written += 0 if failure else len(items)
        except BaseException:
            sender.abort_open()
            raise
        finally:
            sender.close()
        yield pa.RecordBatch.from_pylist(
            [{"partition": partition, "written": written, "failure": failure}], schema=schema
        )

    return write


def herd_items(batch) -> list:
    """A herd's Arrow rows (``HERD_COLUMNS``) as the sender's (LedgerKeyed, Record) pairs; column by column (a row at a
    time costs a Python object per cell more)."""
    column = batch.column
    headers = column("headers")
    offsets = headers.offsets.to_pylist()
    pairs = list(zip(headers.values.field("key").to_pylist(), headers.values.field("value").to_pylist()))
    return [
        (LedgerKeyed(delivery_id, due_ms or 0), Record(topic, partition, key, value, pairs[start:end]))
        for delivery_id, due_ms, topic, partition, key, value, start, end in zip(
            column("delivery_id").to_pylist(),
            column("due_ms").to_pylist(),
            column("topic").to_pylist(),
            column("partition").to_pylist(),
            column("key").to_pylist(),
            column("value").to_pylist(),
            offsets,
            offsets[1:],
        )
    ]


def _send_herd_items(sender: TransactionalSender, items: list, rejections_topic: str | None) -> str | None:
    """Send in transactions, sorting out refusals as the timed writer does (producing.send_sorting_refusals); the
    records refused go to the rejections topic. Returns what went wrong with the first record not written, or
    None."""
    refused, failures = send_sorting_refusals(sender.send, items, again_once=True)
    if refused and rejections_topic:
        failures += sender.send(
            [
                (held, refused_as_rejection(record, held.delivery_id, rejections_topic, error))
                for held, record, error in refused
            ]
        )
    else:
        failures += refused
    if not failures:
        return None
    _, record, error = failures[0]
    return f"{record.topic}: {error.str() if isinstance(error, KafkaError) else error}"


def _ledger_entries(value: bytes) -> list[tuple[str, int]]:
    """The (key, due_ms) entries of a ledger record ("key<TAB>due_ms" lines; a key holds one tab itself)."""
    entries = []
    for line in value.decode().splitlines():
        key, _, due = line.rpartition("\t")
        entries.append((key, int(due)))
    return entries


def _ledger_records(entries: list) -> Iterable[tuple[str, int]]:
    """Ledger entries ("key<TAB>due_ms" lines) in records of at most LEDGER_MAX_BYTES, each with its latest due."""
    lines: list[str] = []
    size = 0
    latest = 0
    for key, due_ms in entries:
        line = f"{key}\t{due_ms}"
        if lines and size + len(line) + 1 > LEDGER_MAX_BYTES:
            yield "\n".join(lines), latest
            lines, size, latest = [], 0, 0
        lines.append(line)
        size += len(line) + 1
        latest = max(latest, due_ms)
    if lines:
        yield "\n".join(lines), latest
