"""Writes each micro-batch's records to Kafka: deliveries, write-backs, rejections and history copies.

Runs as the query's ``foreachBatch`` function. One Spark job summarises the batch
(outcome counts, destination topics and partitions, the largest record per topic); deliveries
that their destination would refuse (topic or partition does not exist, not authorized, record
too large) are diverted to the rejections topic instead of failing the batch; then one Kafka
write sends every record kind. The batch is cached so the stateful step runs once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, reduce
from typing import NamedTuple

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ...config import Config, spark_kafka_options
from ...dialects.common import header
from ...kafka.topics import Destination, TopicDirectory
from ...protocol import (
    DELIVERED_TO,
    DELIVERY_ID,
    DUE_MS,
    REJECTION_REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
)
from ..contract import (
    KIND_DELIVER,
    KIND_EXPIRED,
    KIND_HISTORY,
    KIND_OUTCOME,
    KIND_REJECT,
    KIND_TIMER,
    KIND_WITHDRAW,
    KIND_WRITE_BACK,
)
from ..rules.fields import RECORD_COLUMNS  # the columns of _records's rows (kind and due_ms kept for the hold)
from .batch_summary import BatchSummary
from .exactly_once import HERD_TASK_RESULT, herd_member, write_herd_partition
from .herd_writer import HOLD_SLICE_MS, HerdWriter, slice_end_ms, slice_start_ms
from .timed_writer import PRODUCER_MAX_BYTES, TimedWriter, Wakeups

log = logging.getLogger(__name__)


# Producer settings for the Kafka sink: wait for the broker's acknowledgement, batch and compress.
PRODUCER_OPTIONS = {
    "kafka.acks": "all",
    "kafka.linger.ms": "5",
    "kafka.compression.type": "lz4",
    "kafka.max.request.size": str(PRODUCER_MAX_BYTES),
}

# A record's bytes in a record batch beyond its key, value and header bytes, with room to spare: the batch
# header (61 bytes), the record's and each header's varints, lz4's frame and a 4-byte header per 64 KiB block.
RECORD_FRAMING_BYTES = 128
HEADER_FRAMING_BYTES = 10


def framed_bytes(payload: int) -> int:
    """The most a record can take in a record batch, from its ``payload_bytes`` (which count header framing)."""
    return payload + RECORD_FRAMING_BYTES + payload // 8192


# Clock slack when exactly-once forgets ledger keys of schedules a committed batch retired.
LEDGER_TRIM_MARGIN_MS = 1000

# Withdrawn delivery ids up to this many leave a herd's slice through an IN list; more, through an anti-join.
WITHDRAWN_IN_LIST = 1000


class _HandedHerd(NamedTuple):
    batch: DataFrame  # the batch's checkpoint the herd is read from: kept until every herd read from it is written
    deadlines: dict  # per slice: its earliest expiry (due + max lateness)


class StopRequested(Exception):
    """Raised at the start of a batch once the stop is under way: the batch writes nothing and is not committed."""


class RecordSink:
    def __init__(
        self,
        config: Config,
        topics: TopicDirectory,
        stop_requested: threading.Event,
        on_batch: Callable[[BatchSummary], None] | None = None,
        writer: TimedWriter | None = None,
        wakeups: Wakeups | None = None,
    ):
        self.config = config
        self.topics = topics
        self.stop_requested = stop_requested
        self.on_batch = on_batch
        self.writer = writer
        self.wakeups = wakeups
        # What a batch prepares beyond the writer's room (a herd) is written by this thread, outside the batches.
        self.herds = (
            HerdWriter(self._write_herd_slice, release=self._release_herd, on_retry=self._look_up_again)
            if writer is not None
            else None
        )
        self._handed: dict[int, _HandedHerd] = {}  # per herd handed (by id)
        self._batch: DataFrame | None = None  # the batch being written, while it is
        self._expiry_deadline: int | None = None  # the earliest due + max lateness of what the batch writes
        self._copies: set[str] = set()  # which of write-backs and history copies the batch's records have
        self._summary: BatchSummary | None = None  # the batch's, while it writes
        self.refused_batch: int | None = None  # set when a stop made it refuse a batch
        # A graceful stop with a timed writer (begin_stop): the writer writes nothing due after stop_at_ms, and the
        # first batch whose rules ran at or after it (final_batch) writes what is due by its time, retires it all
        # from state, and is the last.
        self.stop_at_ms: int | None = None
        self.final_batch: int | None = None
        self.batch_ends_ms: list[int] = []  # when this run's last two batches returned (exactly-once trims by them)
        self._spark_wrote = False  # whether this batch's deliveries went through Spark's Kafka sink, not the writer
        self._fitted: tuple[int, dict[str, Column]] | None = None  # _fitted_rejections's last limit and columns

    def begin_stop(self) -> bool:
        """A stop was asked for. Without a timed writer nothing is written outside the batches: the batch in flight
        is the last. With one, what it wrote after the last batch's time is still in state, and a next run would
        emit it again: the writer stops at this instant, and one more batch, run by a report tick (it reaches every
        shard, so the batch reports its time), retires everything written. Returns whether that batch is awaited."""
        if self.writer is None:
            return False
        self.stop_at_ms = int(time.time() * 1000)
        self.writer.write_through(self.stop_at_ms)
        self.herds.write_through(self.stop_at_ms)
        if self.wakeups is not None:
            self.wakeups.report()
        return True

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        stop_at_ms = self.stop_at_ms
        if self.final_batch is not None or (self.stop_requested.is_set() and self.writer is None):
            self.refused_batch = batch_id
            raise StopRequested(f"stop requested before batch {batch_id}")
        started_ms = int(time.time() * 1000)
        self._spark_wrote = False
        self._trim_ledger()
        # Kept in Spark as it is first computed, cut from the micro-batch's plan (a local checkpoint, lazy: the
        # summary's job computes it, the state step runs once). A herd the batch prepares is then read from it by
        # the herd writer, after the batch has committed, with no copy of its own: a lost block fails that write
        # rather than running the stateful step again. Serialized (PySpark's MEMORY_AND_DISK): rows as bytes take
        # about half the room of row objects, and a block that went to disk is not unrolled into memory again at
        # every read. (A persisted batch and a checkpointed copy of the herd cost a 1,000,000 herd's batch 13 s
        # more, the copy spilling to disk: docs/measurements.md.)
        batch = self._batch = batch.localCheckpoint(eager=False, storageLevel=StorageLevel.MEMORY_AND_DISK)
        started = time.monotonic()
        try:
            summary, per_topic, largest, partitioned, timers, withdrawn = self._summarise(batch, batch_id)
            summary.compute_s = time.monotonic() - started
            # Stopping, the writer writes nothing due after the stop; the batch past it writes what is due by its
            # own time at once (late by less than a batch, never early), and nothing prepared.
            final = stop_at_ms is not None and summary.batch_time_ms is not None and summary.batch_time_ms >= stop_at_ms
            written_by_ms = (
                summary.batch_time_ms if final else started_ms if stop_at_ms is None else min(started_ms, stop_at_ms)
            )
            if final:
                self.writer.write_through(written_by_ms)
                self.herds.write_through(written_by_ms)
            if withdrawn and self.writer is not None:
                summary.withdrawn = self.writer.withdraw(withdrawn)
                if self.herds.withdraw(withdrawn):
                    summary.withdrawn = len(withdrawn)  # each was held by one writer or the other
            if timers and self.wakeups is not None:
                self.wakeups.add(timers)
            if summary.delivered or summary.outcomes.get("rejected") or summary.expired:
                try:
                    self._deliver(batch, summary, per_topic, largest, partitioned, final)
                except Exception as exc:
                    # Spark's Kafka sink fails the whole write on one refused record. The destinations were checked
                    # from metadata up to TopicDirectory's refresh interval old: a topic deleted or an ACL added
                    # since is seen on a fresh look, and the retry makes those deliveries rejections. Records the
                    # failed write got out go out again, with the same delivery ids (at-least-once).
                    log.warning(
                        "batch %d: the Kafka write failed (%s); looking up the destinations again and "
                        "writing the batch once more",
                        batch_id,
                        " ".join(str(exc).split())[:300],
                    )
                    self.topics.invalidate()
                    self._deliver(batch, summary, per_topic, largest, partitioned, final)
            if self.writer is not None:
                # The batch retires prepared schedules due by its time from state: it must not commit before
                # the writers wrote them. A writer this far behind is broken; failing the batch keeps them.
                for name, writer in (("timed writer", self.writer), ("herd writer", self.herds)):
                    if not writer.wait_written(written_by_ms):
                        raise RuntimeError(
                            str(writer.failure)
                            if writer.failure is not None
                            else f"the {name} did not write the deliveries due before this batch in time"
                        )
                # And those CANCELs read as they arrived withdrew since the last batch (early_cancels.py).
                summary.withdrawn += self.writer.take_withdrawn_early()
            summary.written_at_ms = int(time.time() * 1000)
            summary.write_s = time.monotonic() - started - summary.compute_s
            summary.delivered -= summary.dead_lettered
            if self._spark_wrote:
                # Beside a herd (all of held), which the herd writer writes and counts.
                summary.written_by_batch = summary.delivered - summary.held
        finally:
            self._batch = None
            self._release_unless_read(batch)
        self.batch_ends_ms = [*self.batch_ends_ms[-1:], int(time.time() * 1000)]
        if final:
            self.final_batch = batch_id
        elif stop_at_ms is not None and self.wakeups is not None:
            self.wakeups.report()  # this batch ran before the stop's instant: another one, past it
        if self.on_batch is not None:
            self.on_batch(summary)

    def _deliver(
        self,
        batch: DataFrame,
        summary: BatchSummary,
        per_topic: Counter,
        largest: dict[str, int],
        partitioned: dict[str, int],
        final: bool = False,
    ) -> None:
        """Write the batch's records, those their destination would refuse as rejections. ``final``: the last batch
        of a graceful stop writes nothing prepared (the state keeps it: the next run emits it again)."""
        refusals = self._refusals(per_topic, largest, partitioned)
        records, summary.dead_lettered = self._records(batch, refusals, per_topic, partitioned)
        self._summary = summary  # what the Spark writes (_save) count as expired goes here
        if final and summary.prepared_records:
            records = records.filter(~F.coalesce(F.col("prepared"), F.lit(False)))
            summary.delivered -= summary.prepared_deliveries
            summary.prepared_records = summary.prepared_deliveries = 0
        immediate = (
            summary.delivered - summary.prepared_deliveries + summary.outcomes.get("rejected", 0) + summary.expired
        )
        # Dead letters (a prepared delivery its destination would refuse) go out at once.
        summary.held = self._write(
            records,
            summary.prepared_records,
            max(1, immediate + summary.written_back) if immediate or refusals.any or partitioned else 0,
        )

    def close(self) -> None:
        """Before the Spark session stops: the herd writer writes nothing more (the state keeps what it held)."""
        if self.herds is not None:
            self.herds.close()

    def _trim_ledger(self) -> None:
        """With exactly-once: the batch before this one committed, and it was planned after the one before it
        returned, so it fired every timer due by then: what was due by then left state and cannot be emitted
        again. (The first batch of a run may be a re-run planned before the crash: never used as that bound.)"""
        sender = self.writer.sender if self.writer is not None else None
        if sender is not None and len(self.batch_ends_ms) == 2:
            sender.trim(self.batch_ends_ms[0] - LEDGER_TRIM_MARGIN_MS)

    def _save(self, records: DataFrame) -> None:
        """Write a batch's ``records`` now (what is expired by now counted in the batch's summary)."""
        if self.config.exactly_once:
            self._write_through_ledger(records)
            return
        self._spark_wrote = True
        self._spark_write(self._expire(records, self._expiry_deadline, self._summary))

    def _write_through_ledger(self, records: DataFrame) -> None:
        # Spark's Kafka sink is not transactional: the driver writes these too, in the ledger's transactions
        # (its writer rejects what is written later than its max lateness).
        self.writer.write_now(
            records.select(
                "delivery_id",
                "due_ms",
                "kind",
                "topic",
                "partition",
                "key",
                "value",
                "headers",
                F.lit(False).alias("held"),
                "max_lateness_ms",
            ).toLocalIterator()
        )

    def _spark_write(self, records: DataFrame) -> None:
        records.select("topic", "partition", "key", "value", "headers").write.format("kafka").option(
            "kafka.bootstrap.servers", self.config.bootstrap_servers
        ).options(**PRODUCER_OPTIONS).options(**spark_kafka_options(self.config)).save()

    def _write(self, records: DataFrame, prepared_records: int, immediate: int = 1) -> int:
        """What is due now at once; prepared deliveries (and their write-backs and copies, which carry their
        due time) to the timed writer, or, beyond the room it has, to the herd writer (herd_writer.py). Returns
        how many deliveries were held until their due time.

        When the writer has room for everything (the usual batch), everything goes to it in one Spark job,
        and what is due now is written at once by it: a Kafka write job less per batch. The batch then
        waits for the writer before it commits (``__call__``), as for prepared deliveries."""
        held = self._held
        if self.writer is not None and prepared_records + 2 * immediate <= self.writer.room():
            # The writer rejects what it would write later than its max lateness, these due now too.
            rows = records.select(*self._writer_columns).collect()
            self.writer.hold(rows)
            return sum(1 for row in rows if row["kind"] == KIND_DELIVER and row["held"])
        if not prepared_records:
            self._save(records)
            return 0
        if immediate:
            self._save(records.filter(~held))
        # Per slice of due time: the smallest slices (ordinary deliveries prepared beside a herd) to the timed writer
        # while it has room, the rest (the herd) to the herd writer, which writes a slice with a Spark job.
        rows = sorted(
            records.filter(held)
            .groupBy(self._slice_of.alias("slice"))
            .agg(
                F.count(F.lit(1)).alias("records"),
                F.sum(F.when(F.col("kind") == KIND_DELIVER, 1).otherwise(0)).alias("deliveries"),
                F.min(F.col("due_ms") + F.col("max_lateness_ms")).alias("deadline"),
            )
            .collect(),
            key=lambda row: row["records"],
        )
        room, small = self.writer.room(), []
        for row in rows:
            if row["records"] > room:
                break
            small.append(row)
            room -= row["records"]
        held_count = 0
        if small:
            numbers = [row["slice"] for row in small]
            self.writer.hold(
                records.filter(held & self._slice_of.isin(numbers)).select(*self._writer_columns).collect()
            )
            held_count += sum(row["deliveries"] for row in small)
        big = rows[len(small) :]
        if big:
            # Read by the herd writer from the batch's checkpoint (__call__), which it keeps until the herd is written.
            herd = records.filter(held & self._slice_of.isin([row["slice"] for row in big]))
            self._handed[id(herd)] = _HandedHerd(self._batch, {row["slice"]: row["deadline"] for row in big})
            held_count += self.herds.hand(herd, sorted((row["slice"], row["deliveries"]) for row in big))
            log.info(
                "herd writer: %d deliveries in %d slice(s) handed on", sum(row["deliveries"] for row in big), len(big)
            )
        return held_count

    @cached_property
    def _slice_of(self) -> Column:
        return F.ceil(F.col("due_ms") / F.lit(HOLD_SLICE_MS)).cast("long")

    def _write_herd_slice(
        self, herd: DataFrame, numbers: list, withdrawn: frozenset, after: int | None, through: int | None
    ) -> None:
        """The herd writer's ``write``: slices of a herd, less the withdrawn delivery ids, only what is due after
        ``after`` and by ``through`` where given."""
        records = (
            herd.filter(self._slice_of == numbers[0])
            if len(numbers) == 1
            else herd.filter(self._slice_of.isin(numbers))
        )
        if after is not None:
            records = records.filter(F.col("due_ms") > F.lit(after))
        if through is not None:
            records = records.filter(F.col("due_ms") <= F.lit(through))
        if withdrawn:
            if len(withdrawn) <= WITHDRAWN_IN_LIST:
                records = records.filter(~F.col("delivery_id").isin(sorted(withdrawn)))
            else:
                ids = herd.sparkSession.createDataFrame([(i,) for i in withdrawn], "delivery_id string")
                records = records.join(F.broadcast(ids), "delivery_id", "left_anti")
        # Its expired deliveries are rejections, as in a batch; they count in no batch's summary.
        deadlines = [self._handed[id(herd)].deadlines.get(n) for n in numbers]
        records = self._expire(records, min((d for d in deadlines if d is not None), default=None), None)
        if self.config.exactly_once:
            low = slice_start_ms(min(numbers)) - 1 if after is None else after
            high = slice_end_ms(max(numbers)) if through is None else through
            self._write_herd_transactions(records, low, high)
        else:
            self._spark_write(records)

    def _write_herd_transactions(self, records: DataFrame, after: int, through: int) -> None:
        """Exactly-once: each task writes its part of the herd in transactions of its own with their ledger
        entries (exactly_once.write_herd_partition); nothing goes through the driver. What the ledger already holds
        (an earlier attempt's committed transactions, a previous run's) is left out. A failed write fences the
        tasks' transactional ids (aborting what they left open) before it is tried again; afterwards the driver
        reads what the tasks committed into the ledger, so that a retry leaves it out and a trim keeps it."""
        sender = self.writer.sender
        if sender.unsettled:  # else every ledger record past the sender's position is its own, already known
            sender.catch_up()
        written = sender.written_keys(after, through)
        if written:
            keys = records.sparkSession.createDataFrame([(k,) for k in written], "ledger_key string")
            records = records.join(
                F.broadcast(keys), F.concat_ws("\t", "delivery_id", "topic") == keys["ledger_key"], "left_anti"
            )
        records = records.select("delivery_id", "due_ms", "topic", "partition", "key", "value", "headers")
        members = [herd_member(p) for p in range(records.rdd.getNumPartitions())]
        task = write_herd_partition(
            sender.producer_settings, self.config.app_id, self.config.ledger_topic, self.config.rejections_topic
        )
        sender.foreign_writes_begin()
        try:
            results = records.mapInArrow(task, HERD_TASK_RESULT).collect()
            failures = [row["failure"] for row in results if row["failure"]]
            if failures:
                raise RuntimeError(f"{len(failures)} task(s) of the herd's write failed, the first: {failures[0]}")
        except BaseException:
            try:
                sender.fence_members(members)
                sender.catch_up(settled=True)
            except Exception as exc:
                log.warning(
                    "herd writer: after a failed write, fencing its tasks or reading the ledger failed too (%s)",
                    " ".join(str(exc).split())[:200],
                )
            raise
        sender.catch_up(settled=True)

    def _look_up_again(self) -> None:
        """Before a failed herd write is tried again: a destination may have been deleted or denied since."""
        self.topics.invalidate()

    def _release_herd(self, herd: DataFrame) -> None:
        """The herd writer's ``release``: every slice of ``herd`` is written."""
        handed = self._handed.pop(id(herd), None)
        if handed is not None:
            self._release_unless_read(handed.batch)

    def _release_unless_read(self, batch: DataFrame) -> None:
        """Free a batch's checkpoint unless the batch is still being written or a herd handed on is read from it.
        Called from the batch (its end) and from the herd writer's thread (a herd written): whichever comes last
        frees it."""
        if batch is not self._batch and not any(h.batch is batch for h in list(self._handed.values())):
            _release_checkpoint(batch)

    @cached_property
    def _held(self) -> Column:
        return F.coalesce(F.col("prepared"), F.lit(False))

    @cached_property
    def _writer_columns(self) -> list:
        return _columns(
            [
                "delivery_id",
                "due_ms",
                "kind",
                "topic",
                "partition",
                "key",
                "value",
                "headers",
                self._held.alias("held"),
                "max_lateness_ms",
                "sid",
            ]
        )

    def _refusals(self, per_topic: Counter, largest: dict[str, int], partitioned: dict[str, int]) -> Refusals:
        """What the destinations of this batch's deliveries would refuse, from the broker's metadata (cached)."""
        known = self.topics.describe(set(per_topic) | {self.config.rejections_topic})
        destinations = {t: d for t, d in known.items() if t in per_topic}
        refusals = Refusals(
            missing=set(per_topic) - destinations.keys(), denied={t for t, d in destinations.items() if not d.writable}
        )
        for topic, destination in destinations.items():
            limit = record_limit(destination)
            if destination.writable and framed_bytes(largest.get(topic) or 0) > limit[0]:
                refusals.oversize[topic] = limit
        refusals.counts = {t: d.partitions for t, d in destinations.items() if t in partitioned and d.writable}
        rejections = known.get(self.config.rejections_topic)
        refusals.rejection_limit = record_limit(rejections)[0] if rejections is not None else PRODUCER_MAX_BYTES
        return refusals

    # The batch's expressions are built once: each function of pyspark.sql.functions is a round trip to the JVM, and a
    # batch's record plan takes some two hundred of them (measured: ~0.3 s of a batch on this machine,
    # docs/measurements.md).
    @cached_property
    def _summary_columns(self) -> list[Column]:
        prepared = self._held
        return [
            F.count(F.lit(1)).alias("records"),
            F.sum("n").alias("n"),
            F.min(F.when(~prepared, F.col("due_ms"))).alias("earliest_due"),
            F.count("wb_headers").alias("write_backs"),
            F.max("partition").alias("max_partition"),
            F.count("partition_hash").alias("hashed"),
            F.max_by("n", "due_ms").alias("last_n"),
            F.max(F.when(F.col("kind") == KIND_DELIVER, payload_bytes())).alias("largest"),
            F.sum(F.when(prepared, 1)).alias("prepared_deliveries"),
            F.sum(
                F.when(
                    prepared,
                    1
                    + F.when(F.col("wb_headers").isNotNull(), 1).otherwise(0)
                    + F.when(F.col("history") | F.lit(self.config.history), 1).otherwise(0),
                )
            ).alias("prepared_records"),
            F.collect_set(F.when(F.col("kind") == KIND_TIMER, F.col("due_ms"))).alias("timers"),
            F.collect_list(F.when(F.col("kind") == KIND_WITHDRAW, F.col("key").cast("string"))).alias("withdrawn"),
            F.min(F.col("due_ms") + F.col("max_lateness_ms")).alias("deadline"),
            F.count(F.when(F.col("history"), 1)).alias("history_copies"),
        ]

    def _summarise(
        self, batch: DataFrame, batch_id: int
    ) -> tuple[BatchSummary, Counter, dict[str, int], dict[str, int], list[int], list[str]]:
        """Outcome counts, deliveries per destination topic, the largest delivery per topic (key, value and header
        bytes), the highest explicit partition per topic that deliveries name (-1 when they only name partition
        keys), the timer instants the state armed and the delivery ids it withdrew, in one Spark job."""
        rows = batch.groupBy("kind", "topic").agg(*self._summary_columns).collect()
        summary = BatchSummary(batch_id)
        self._expiry_deadline = None  # the earliest due + max lateness of what the batch writes at once
        self._copies = set()
        per_topic: Counter = Counter()
        largest: dict[str, int] = {}
        partitioned: dict[str, int] = {}
        timers: list[int] = []
        withdrawn: list[str] = []
        for row in rows:
            if row["write_backs"] and row["kind"] in (KIND_DELIVER, KIND_REJECT, KIND_EXPIRED):
                self._copies.add(KIND_WRITE_BACK)
            if row["kind"] == KIND_TIMER:
                timers.extend(row["timers"])
            elif row["kind"] == KIND_WITHDRAW:
                withdrawn.extend(row["withdrawn"])
            elif row["kind"] == KIND_OUTCOME:
                summary.count_outcome(row["topic"], row["n"], row["last_n"])
            elif row["kind"] == KIND_EXPIRED:
                summary.expired += row["records"]
            elif row["kind"] == KIND_DELIVER:
                if row["deadline"] is not None:
                    self._expiry_deadline = (
                        row["deadline"]
                        if self._expiry_deadline is None
                        else min(self._expiry_deadline, row["deadline"])
                    )
                summary.delivered += row["records"]
                summary.written_back += row["write_backs"]
                if row["history_copies"]:
                    self._copies.add(KIND_HISTORY)
                per_topic[row["topic"]] += row["records"]
                largest[row["topic"]] = max(largest.get(row["topic"], 0), row["largest"] or 0)
                if row["max_partition"] is not None or row["hashed"]:
                    partitioned[row["topic"]] = -1 if row["max_partition"] is None else row["max_partition"]
                summary.prepared_records += row["prepared_records"] or 0
                summary.prepared_deliveries += row["prepared_deliveries"] or 0
                if row["earliest_due"] is not None and (
                    summary.earliest_due_ms is None or row["earliest_due"] < summary.earliest_due_ms
                ):
                    summary.earliest_due_ms = row["earliest_due"]
        return summary, per_topic, largest, partitioned, timers, withdrawn

    def _records(
        self, batch: DataFrame, refusals: Refusals, per_topic: Counter, partitioned: dict[str, int]
    ) -> tuple[DataFrame, int]:
        """Deliveries, write-backs, rejections, dead letters and history copies (``kind`` and ``due_ms`` kept for
        the hold), and how many deliveries became dead letters."""
        records = self._expired_as_rejections(
            batch.filter(self._record_kinds).withColumn("delivery_id", self._delivery_id)
        )
        counts = refusals.counts
        partition = F.col("partition")
        if partitioned:
            # The partition a partition key picks: the partitioner hash modulo the destination's partition count.
            count_of = (
                F.element_at(F.create_map(*[F.lit(x) for t, n in counts.items() for x in (t, n)]), F.col("topic"))
                if counts
                else F.lit(None).cast("int")
            )
            partition = F.coalesce(partition, F.pmod(F.col("partition_hash"), count_of))
        records = records.withColumn("partition", partition)
        dead = sum(per_topic[t] for t in refusals.missing | refusals.denied)
        beyond = {t: n for t, n in counts.items() if partitioned.get(t, -1) >= n}
        if refusals.any or beyond:
            records, row_count = self._dead_letter(records, refusals, beyond)
            dead += row_count
        records = records.withColumns(self._fitted_rejections(refusals.rejection_limit))
        parts = [records.select(*self._record_columns)]
        # Each part reads the whole batch again (and a herd's slices read it after the batch): only those it has.
        if KIND_WRITE_BACK in self._copies:
            # A write-back follows its delivery, and also a delivery that became a dead letter: either way the
            # version is finished, and a rebuild from the source topic must not try it again.
            parts.append(records.filter(self._has_write_back).select(*self._write_back_columns))
        if self.config.history or KIND_HISTORY in self._copies:
            deliveries = records.filter(self._is_delivery)
            copied = deliveries if self.config.history else deliveries.filter(F.col("history"))
            parts.append(copied.select(*self._history_columns))
        return reduce(DataFrame.unionByName, parts), dead

    @cached_property
    def _record_columns(self) -> list[Column]:
        return _columns(RECORD_COLUMNS)

    @cached_property
    def _record_kinds(self) -> Column:
        return F.col("kind").isin(KIND_DELIVER, KIND_REJECT, KIND_EXPIRED)

    @cached_property
    def _is_delivery(self) -> Column:
        return F.col("kind") == KIND_DELIVER

    @cached_property
    def _has_write_back(self) -> Column:
        return F.col("wb_headers").isNotNull()

    @cached_property
    def _delivery_id(self) -> Column:
        def header_value(name: str) -> Column:
            # try_: a rejection has no delivery id (element_at of an empty array fails the batch in ANSI mode)
            return F.try_element_at(F.filter("headers", lambda h: h["key"] == name), F.lit(-1))["value"].cast("string")

        delivery_id = header_value(DELIVERY_ID)
        if self.config.exactly_once:
            # A request's rejection is written once too: it is named after its source record.
            delivery_id = F.coalesce(
                delivery_id,
                F.concat_ws(
                    "-",
                    F.lit("reject:"),
                    header_value(SOURCE_TOPIC),
                    header_value(SOURCE_PARTITION),
                    header_value(SOURCE_OFFSET),
                ),
            )
        return delivery_id

    @cached_property
    def _write_back_columns(self) -> list:
        return _columns(
            [
                F.lit(KIND_WRITE_BACK).alias("kind"),
                F.col("wb_topic").alias("topic"),
                F.col("wb_partition").alias("partition"),
                F.col("wb_key").alias("key"),
                F.lit(None).cast("binary").alias("value"),
                F.col("wb_headers").alias("headers"),
                "due_ms",
                "prepared",
                "delivery_id",
                F.lit(None).cast("long").alias("max_lateness_ms"),
                F.lit(None).cast("binary").alias("sid"),
            ]
        )

    @cached_property
    def _history_columns(self) -> list:
        return _columns(
            [
                F.lit(KIND_HISTORY).alias("kind"),
                F.lit(self.config.history_topic).alias("topic"),
                F.lit(None).cast("int").alias("partition"),
                "key",
                "value",
                F.concat(
                    "headers",
                    F.array(header(DELIVERED_TO, F.col("topic")), header(DUE_MS, F.col("due_ms").cast("string"))),
                ).alias("headers"),
                "due_ms",
                "prepared",
                "delivery_id",
                "max_lateness_ms",
                F.lit(None).cast("binary").alias("sid"),
            ]
        )

    def _expired_as_rejections(self, records: DataFrame) -> DataFrame:
        """Deliveries the state marked expired (due + max lateness before the batch's time) become rejections: the
        delivery's key, value and headers, the reason ``expired: ...`` with the due time, ``x-scheduler-due-ms`` and
        the request's source (a cron firing's is its activating request's)."""
        return records.withColumns(self._expiry_columns)

    @cached_property
    def _expiry_columns(self) -> dict[str, Column]:
        expired = F.col("kind") == KIND_EXPIRED
        extra = _expiry_headers()
        return {
            "kind": F.when(expired, F.lit(KIND_REJECT)).otherwise(F.col("kind")),
            "topic": F.when(expired, F.lit(self.config.rejections_topic)).otherwise(F.col("topic")),
            "partition": F.when(expired, F.lit(None)).otherwise(F.col("partition")),
            "headers": F.when(expired, F.concat("headers", extra)).otherwise(F.col("headers")),
            "history": F.when(expired, F.lit(False)).otherwise(F.col("history")),
            "prepared": F.when(expired, F.lit(False)).otherwise(F.col("prepared")),
        }

    def _expire(self, records: DataFrame, deadline: int | None, summary: BatchSummary | None) -> DataFrame:
        """Just before Spark writes ``records`` (``_records``'s rows): a delivery that would go out later than its due
        time plus its max lateness is written as a rejection instead (``expired``), its history copy dropped. Only
        when ``deadline`` (the earliest due time plus max lateness among them) has passed: then one more Spark job
        counts them, into ``summary`` if given."""
        now_ms = int(time.time() * 1000)
        if deadline is None or now_ms <= deadline:
            return records
        late = F.col("max_lateness_ms").isNotNull() & (F.col("due_ms") + F.col("max_lateness_ms") < F.lit(now_ms))
        late_delivery = late & (F.col("kind") == KIND_DELIVER)
        count = records.filter(late_delivery).count()
        if not count:
            return records
        if summary is not None:
            summary.expired += count
            summary.delivered -= count
        return records.filter(~(late & (F.col("kind") == KIND_HISTORY))).withColumns(
            {
                "kind": F.when(late_delivery, F.lit(KIND_REJECT)).otherwise(F.col("kind")),
                "topic": F.when(late_delivery, F.lit(self.config.rejections_topic)).otherwise(F.col("topic")),
                "partition": F.when(late_delivery, F.lit(None)).otherwise(F.col("partition")),
                "headers": F.when(late_delivery, F.concat("headers", _expiry_headers())).otherwise(F.col("headers")),
            }
        )

    def _fitted_rejections(self, limit: int) -> dict[str, Column]:
        """A rejection carries its request's value and headers plus the reason: one the rejections topic would
        refuse as too large (a request rejected for its size, near the record limit) goes without its value.
        ``limit``: the largest framed record the rejections topic takes (it changes only with the topic's config)."""
        if self._fitted is None or self._fitted[0] != limit:
            too_large = (F.col("kind") == KIND_REJECT) & (framed_bytes_column(payload_bytes()) > F.lit(limit))
            note = header(
                REJECTION_REASON,
                F.encode(F.lit("its value is left out: the rejections topic takes no record that large"), "UTF-8"),
            )
            # One projection: both columns judged on the record as it was.
            self._fitted = (
                limit,
                {
                    "value": F.when(too_large, F.lit(None).cast("binary")).otherwise(F.col("value")),
                    "headers": F.when(too_large, F.concat("headers", F.array(note))).otherwise(F.col("headers")),
                },
            )
        return self._fitted[1]

    def _dead_letter(self, records: DataFrame, refusals: Refusals, beyond: dict[str, int]) -> tuple[DataFrame, int]:
        """Deliveries their destination would refuse (topic missing or not writable, partition missing, record too
        large) go to the rejections topic, with the reason and source. Returns the records and how many deliveries
        went that way for a reason of their own (a partition, a size) rather than their topic's."""
        is_delivery = F.col("kind") == KIND_DELIVER

        def topic_in(topics) -> Column:
            return is_delivery & F.col("topic").isin(*topics) if topics else F.lit(False)

        def per_topic(values: dict) -> Column:
            return F.element_at(F.create_map(*[F.lit(x) for t, v in values.items() for x in (t, v)]), F.col("topic"))

        no_topic, denied = topic_in(refusals.missing), topic_in(refusals.denied)
        partitions_of = per_topic(beyond) if beyond else F.lit(None).cast("int")
        no_partition = F.coalesce(
            is_delivery & F.col("partition").isNotNull() & (F.col("partition") >= partitions_of), F.lit(False)
        )
        size = payload_bytes()
        if refusals.oversize:
            limit_of = per_topic({t: limit for t, (limit, _) in refusals.oversize.items()})
            too_large = F.coalesce(is_delivery & (framed_bytes_column(size) > limit_of), F.lit(False))
            # Kept whole in the rejection if the rejections topic takes it; otherwise without its value.
            value_left_out = too_large & (framed_bytes_column(size) > F.lit(refusals.rejection_limit))
        else:
            too_large = value_left_out = F.lit(False)
        undeliverable = no_topic | denied | no_partition | too_large
        row_count = (
            records.filter((no_partition | too_large) & ~no_topic & ~denied).count()
            if beyond or refusals.oversize
            else 0
        )
        delivery_id = F.col("delivery_id")
        source = FIRING_SOURCE
        shown = F.concat(F.lit("'"), F.col("topic"), F.lit("'"))
        reason = (
            F.when(no_topic, F.concat(F.lit("destination topic "), shown, F.lit(" does not exist")))
            .when(denied, F.concat(F.lit("not authorized to write to destination topic "), shown))
            .when(
                no_partition,
                F.concat(
                    F.lit("destination partition "),
                    F.col("partition").cast("string"),
                    F.lit(" of topic "),
                    shown,
                    F.lit(" does not exist (it has "),
                    partitions_of.cast("string"),
                    F.lit(" partitions)"),
                ),
            )
            .otherwise(
                F.concat(
                    F.lit("record of "),
                    size.cast("string"),
                    F.lit(" bytes (key, value and headers) is too large for destination topic "),
                    shown,
                    F.lit(" ("),
                    per_topic({t: why for t, (_, why) in refusals.oversize.items()})
                    if refusals.oversize
                    else F.lit(""),
                    F.lit(")"),
                    F.when(
                        value_left_out,
                        F.lit("; its value is left out: the rejections topic takes no record that large"),
                    ).otherwise(F.lit("")),
                )
            )
        )
        extra = F.array(
            header(REJECTION_REASON, F.encode(reason, "UTF-8")),
            header(SOURCE_TOPIC, F.regexp_extract(delivery_id, source, 1)),
            header(SOURCE_PARTITION, F.regexp_extract(delivery_id, source, 2)),
            header(SOURCE_OFFSET, F.regexp_extract(delivery_id, source, 3)),
        )
        return records.select(
            F.when(undeliverable, F.lit("reject")).otherwise(F.col("kind")).alias("kind"),
            F.when(undeliverable, F.lit(self.config.rejections_topic)).otherwise(F.col("topic")).alias("topic"),
            F.when(undeliverable, F.lit(None)).otherwise(F.col("partition")).alias("partition"),
            "key",
            F.when(value_left_out, F.lit(None)).otherwise(F.col("value")).alias("value"),
            F.when(undeliverable, F.concat("headers", extra)).otherwise(F.col("headers")).alias("headers"),
            F.when(undeliverable, F.lit(None)).otherwise(F.col("due_ms")).alias("due_ms"),
            "wb_topic",
            "wb_partition",
            "wb_key",
            "wb_headers",
            "history",
            "max_lateness_ms",
            F.when(undeliverable, F.lit(False)).otherwise(F.col("prepared")).alias("prepared"),
            "delivery_id",
            "sid",
        ), row_count


@dataclass
class Refusals:
    """What a batch's destinations would refuse: the sink turns those deliveries into rejections."""

    missing: set = field(default_factory=set)  # topics that do not exist
    denied: set = field(default_factory=set)  # topics the broker does not let the scheduler write to
    oversize: dict = field(default_factory=dict)  # topic -> (largest framed record it takes, why) if one is larger
    counts: dict = field(default_factory=dict)  # partition counts of the topics deliveries name partitions of
    rejection_limit: int = PRODUCER_MAX_BYTES  # the largest framed record the rejections topic takes

    @property
    def any(self) -> bool:
        return bool(self.missing or self.denied or self.oversize)


def record_limit(destination: Destination) -> tuple[int, str]:
    """The largest framed record a topic takes, and why: its max.message.bytes or the producers' own limit."""
    if destination.max_message_bytes is not None and destination.max_message_bytes < PRODUCER_MAX_BYTES:
        return destination.max_message_bytes, f"max.message.bytes {destination.max_message_bytes}"
    return PRODUCER_MAX_BYTES, f"the scheduler writes records of at most {PRODUCER_MAX_BYTES} bytes"


def _columns(columns: list) -> list[Column]:
    """Names as Columns: a name given to select is looked up as a JVM function call at every use."""
    return [F.col(c) if isinstance(c, str) else c for c in columns]


# A delivery id's source request: topic, partition, offset (a cron firing's id ends with "@<instant>").
FIRING_SOURCE = r"^(.*)-(\d+)-(\d+)(?:@-?\d+)?$"


def _expiry_headers() -> Column:
    """What a delivery rejected as expired gets (``rejection_classes.expired_reason`` in Spark SQL)."""
    due = F.date_format(F.timestamp_millis(F.col("due_ms")), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")
    reason = F.concat(
        F.lit("expired: due "),
        due,
        F.lit(", not delivered within its max lateness of "),
        F.col("max_lateness_ms").cast("string"),
        F.lit(" ms"),
    )
    delivery_id = F.col("delivery_id")
    return F.array(
        header(REJECTION_REASON, F.encode(reason, "UTF-8")),
        header(DUE_MS, F.col("due_ms").cast("string")),
        header(SOURCE_TOPIC, F.regexp_extract(delivery_id, FIRING_SOURCE, 1)),
        header(SOURCE_PARTITION, F.regexp_extract(delivery_id, FIRING_SOURCE, 2)),
        header(SOURCE_OFFSET, F.regexp_extract(delivery_id, FIRING_SOURCE, 3)),
    )


def payload_bytes() -> Column:
    """Key, value, header names and header values of a record, in bytes."""
    headers = F.aggregate(
        F.coalesce(F.col("headers"), F.array()),
        F.lit(0).cast("long"),
        lambda total, h: (
            total
            + F.octet_length(h["key"])
            + F.coalesce(F.octet_length(h["value"]), F.lit(0))
            + F.lit(HEADER_FRAMING_BYTES)
        ),
    )
    return (F.coalesce(F.octet_length("key"), F.lit(0)) + F.coalesce(F.octet_length("value"), F.lit(0)) + headers).cast(
        "long"
    )


def framed_bytes_column(payload: Column) -> Column:
    """``framed_bytes`` in Spark (header framing is already in ``payload_bytes``)."""
    return payload + F.lit(RECORD_FRAMING_BYTES) + F.floor(payload / F.lit(8192)).cast("long")


def _release_checkpoint(batch: DataFrame) -> None:
    """Free the blocks of a batch's local checkpoint once it is written (and any herd read from it). PySpark has no
    call for it: through the plan's RDD; should that fail, Spark's context cleaner frees them once the RDD is
    unreachable."""
    try:
        batch._jdf.queryExecution().analyzed().rdd().unpersist(False)
    except Exception as exc:
        log.debug("a written batch's checkpoint is left to Spark's cleaner (%s)", exc)
