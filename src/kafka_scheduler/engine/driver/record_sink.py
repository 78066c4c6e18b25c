"""Writes each micro-batch's records to Kafka: deliveries, write-backs, rejections and history copies.

Runs as the query's ``foreachBatch`` function. One Spark job summarises the batch
(outcome counts, destination topics and partitions, the largest record per topic); deliveries
that their destination would refuse (topic or partition does not exist, not authorized, record
too large) are diverted to the rejections topic instead of failing the batch; then one Kafka
write sends every record kind. The batch is kept as a lazy local checkpoint, so the stateful step runs once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import cached_property, partial, reduce

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ...config import Config
from ...kafka.topics import TopicDirectory
from ..contract import KIND_DELIVER, KIND_HISTORY, KIND_WRITE_BACK, OUTCOME_REJECTED, writer_rows
from ..rules.fields import RECORD_COLUMNS
from .batch_summary import BatchSummary
from .exactly_once import TransactionalSender
from .herd_slices import SparkHerdSlices
from .herd_writer import HerdWriter
from .prepared_horizon import PreparedHorizon
from .sink_columns import SinkColumns, as_columns, records_but, sids_among, write_with_spark
from .sink_plan import (
    BatchDigest,
    Refusals,
    SliceLoad,
    all_to_timed_writer,
    digest,
    due_now_records,
    is_final,
    leave_prepared_out,
    refusals_of,
    refuses_batch,
    route_slices,
    written_by_ms,
)
from .timed_writer import TimedWriter
from .wakeups import Wakeups

log = logging.getLogger(__name__)


# Clock slack when exactly-once forgets ledger keys of schedules a committed batch retired.
LEDGER_TRIM_MARGIN_MS = 1000


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
        sender: TransactionalSender | None = None,
        kafka_write: Callable[[DataFrame], None] | None = None,
        offsets_read: Callable[[int], dict[str, dict[int, int]] | None] | None = None,
        horizon: PreparedHorizon | None = None,
    ):
        self.config = config
        # How far earlier runs of the checkpoint prepared: the early path's frontier (prepared_horizon.py).
        self.horizon = horizon or PreparedHorizon(None, None)
        self.topics = topics
        self.stop_requested = stop_requested
        self.on_batch = on_batch
        self.writer = writer
        self.wakeups = wakeups
        # With exactly-once, the timed writer's: the sink trims its ledger, the herd tasks write theirs beside it.
        self.sender = sender
        # batch id -> the next offset to read per input partition after it (None: not known until it commits)
        self.offsets_read = offsets_read
        self.columns = SinkColumns(config)
        # What the batch writes itself, and the herds' slices: Spark's Kafka sink.
        self.kafka_write = kafka_write or partial(write_with_spark, config=config)
        self.herd_slices = SparkHerdSlices(config, topics, self.columns, self.kafka_write, sender)
        # What a batch prepares beyond the writer's room (a herd) is written by this thread, outside the batches.
        self.herds = HerdWriter(self.herd_slices) if writer is not None else None
        if writer is not None:
            writer.herd_covers = self.herds.covers
        self._expiry_deadline: int | None = None  # the earliest due + max lateness of what the batch writes
        self._summary: BatchSummary | None = None  # the batch's, while it writes
        self.refused_batch: int | None = None  # set when a stop made it refuse a batch
        # A graceful stop with a timed writer (begin_stop): the writer writes nothing due after stop_at_ms, and the
        # first batch whose rules ran at or after it (final_batch) writes what is due by its time, retires it all
        # from state, and is the last.
        self.stop_at_ms: int | None = None
        self.final_batch: int | None = None
        self.batch_ends_ms: list[int] = []  # when this run's last two batches returned (exactly-once trims by them)
        self._spark_wrote = False  # whether this batch's deliveries went through Spark's Kafka sink, not the writer

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
        if refuses_batch(self.final_batch, self.stop_requested.is_set(), self.writer is not None):
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
        batch = batch.localCheckpoint(eager=False, storageLevel=StorageLevel.MEMORY_AND_DISK)
        self.herd_slices.batch_begins(batch)
        started = time.monotonic()
        try:
            read = self._summarise(batch, batch_id)
            summary, withdrawn = read.summary, read.withdrawn
            summary.compute_s = time.monotonic() - started
            # Before the batch commits the state's prepare marks: the next run's frontier waits for what they cover.
            self.horizon.note(summary.latest_prepared_due_ms)
            # Stopping, the writer writes nothing due after the stop; the batch past it writes what is due by its
            # own time at once (late by less than a batch, never early), and nothing prepared.
            final = is_final(stop_at_ms, summary.batch_time_ms)
            written_by = written_by_ms(final, summary.batch_time_ms, started_ms, stop_at_ms)
            if final:
                self.writer.write_through(written_by)
                self.herds.write_through(written_by)
            if withdrawn and self.writer is not None:
                summary.withdrawn = self.writer.withdraw(withdrawn)
                if self.herds.withdraw(withdrawn):
                    summary.withdrawn = len(withdrawn)  # each was held by one writer or the other
            if read.timers and self.wakeups is not None:
                self.wakeups.add(read.timers)
            if summary.delivered or summary.outcomes.get(OUTCOME_REJECTED) or summary.expired:
                try:
                    self._deliver(batch, read, final)
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
                    self._deliver(batch, read, final)
            if self.writer is not None:
                # The batch retires prepared schedules due by its time from state: it must not commit before
                # the writers wrote them. A writer this far behind is broken; failing the batch keeps them.
                for name, writer in (("timed writer", self.writer), ("herd writer", self.herds)):
                    if not writer.wait_written(written_by):
                        raise RuntimeError(
                            str(writer.failure)
                            if writer.failure is not None
                            else f"the {name} did not write the deliveries due before this batch in time"
                        )
                # And those CANCELs read as they arrived withdrew since the last batch (early_cancels.py), and what was
                # written from requests as they were read (early_requests.py): this batch's copies were left out.
                summary.withdrawn += self.writer.take_withdrawn_early()
                summary.count_early(self.writer.take_written_early())
                if summary.batch_time_ms is not None and not final:
                    # The batch handed over what it made of the requests it read: those are the state's now, and
                    # one read early only after this would act as new (a REPLACE's older version written).
                    read_by_batch = self.offsets_read(batch_id) if self.offsets_read is not None else None
                    if read_by_batch:
                        self.writer.forget_cancels(read_by_batch)
                    # Every version due by then that the state holds is handed over now: early versions due by
                    # then may be written (early_book.py).
                    self.writer.advance_frontier(self.horizon.frontier_ms(summary.batch_time_ms, self.config.lookahead))
            summary.written_at_ms = int(time.time() * 1000)
            summary.write_s = time.monotonic() - started - summary.compute_s
            summary.delivered -= summary.dead_lettered
            if self._spark_wrote:
                # Beside a herd (all of held), which the herd writer writes and counts.
                summary.written_by_batch = summary.delivered - summary.held
        finally:
            self.herd_slices.batch_ends(batch)
        self.batch_ends_ms = [*self.batch_ends_ms[-1:], int(time.time() * 1000)]
        if final:
            self.final_batch = batch_id
        elif stop_at_ms is not None and self.wakeups is not None:
            self.wakeups.report()  # this batch ran before the stop's instant: another one, past it
        if self.on_batch is not None:
            self.on_batch(summary)

    def _deliver(self, batch: DataFrame, read: BatchDigest, final: bool = False) -> None:
        """Write the batch's records, those their destination would refuse as rejections. ``final``: the last batch
        of a graceful stop writes nothing prepared (the state keeps it: the next run emits it again)."""
        summary = read.summary
        refusals = self._refusals(read)
        records, summary.dead_lettered = self._records(batch, read, refusals)
        self._summary = summary  # what the Spark writes (_save) count as expired goes here
        self._expiry_deadline = read.expiry_deadline
        if final and summary.prepared_records:
            records = records.filter(~self.columns.held)
            leave_prepared_out(summary)
        # Dead letters (a prepared delivery its destination would refuse) go out at once.
        due_now = due_now_records(summary, refusals, read.partitioned)
        summary.held = self._write(records, summary.prepared_records, due_now, summary)

    def close(self) -> None:
        """Before the Spark session stops: the herd writer writes nothing more (the state keeps what it held)."""
        if self.herds is not None:
            self.herds.close()

    def _trim_ledger(self) -> None:
        """With exactly-once: the batch before this one committed, and it was planned after the one before it
        returned, so it fired every timer due by then: what was due by then left state and cannot be emitted
        again. (The first batch of a run may be a re-run planned before the crash: never used as that bound.)"""
        if self.sender is not None and len(self.batch_ends_ms) == 2:
            self.sender.trim(self.batch_ends_ms[0] - LEDGER_TRIM_MARGIN_MS)

    def _save(self, records: DataFrame) -> None:
        """Write a batch's ``records`` now (what is expired by now counted in the batch's summary)."""
        if self.config.exactly_once:
            # Spark's Kafka sink is not transactional: the driver writes these too, in the ledger's transactions
            # (its writer rejects what is written later than its max lateness).
            self.writer.write_now(writer_rows(records.select(*self.columns.written_now_columns).toLocalIterator()))
            return
        self._spark_wrote = True
        self.kafka_write(self.columns.expire(records, self._expiry_deadline, self._summary))

    def _write(
        self, records: DataFrame, prepared_records: int, due_now: int = 1, summary: BatchSummary | None = None
    ) -> int:
        """What is due now at once; prepared deliveries (and their write-backs and copies, which carry their
        due time) to the timed writer, or, beyond the room it has, to the herd writer (herd_writer.py). Returns
        how many deliveries were held until their due time.

        When the writer has room for everything (the usual batch), everything goes to it in one Spark job,
        and what is due now is written at once by it: a Kafka write job less per batch. The batch then
        waits for the writer before it commits (``__call__``), as for prepared deliveries."""
        held, slice_of = self.columns.held, self.columns.slice_of
        if self.writer is not None and all_to_timed_writer(prepared_records, due_now, self.writer.room()):
            # The writer rejects what it would write later than its max lateness, these due now too.
            rows = list(writer_rows(records.select(*self.columns.writer_columns).collect()))
            # The batch's lateness is of what it writes: not of the versions written as their requests were read.
            earliest_due = self.writer.hold(rows)
            if summary is not None:
                summary.earliest_due_ms = earliest_due
            return sum(1 for row in rows if row.kind == KIND_DELIVER and row.held)
        early: dict[bytes, str] = {}
        if self.writer is not None:
            written_early = self.writer.written_early_ids()
            if written_early:
                # Written from their requests as they were read, before this batch: not again. (The timed writer
                # leaves them out itself in the branch above: a filter naming thousands of ids costs the batch's
                # Spark jobs more than the rest of their plan.)
                records = records_but(records, written_early)
            early = self.writer.early_unconfirmed()
        if not prepared_records:
            self._tell_early_versions(records, early)
            self._save(records)
            return 0
        # One pass over the batch (a herd's is a million rows): each held slice's load, and the batch's versions of
        # the ids held early, told to the writer before anything of the batch is written (_tell_early_versions).
        told = self._versions_of(early) if early else F.lit(False)
        rows = (
            records.groupBy(F.when(held, slice_of).alias("slice"))
            .agg(
                F.count(F.lit(1)).alias("records"),
                F.sum(F.when(F.col("kind") == KIND_DELIVER, 1).otherwise(0)).alias("deliveries"),
                F.min(F.col("due_ms") + F.col("max_lateness_ms")).alias("deadline"),
                F.collect_list(F.when(told, F.struct("sid", "delivery_id"))).alias("told"),
                F.min(F.when(self.columns.is_delivery, F.col("due_ms"))).alias("earliest_due"),
            )
            .collect()
        )
        # Of what the batch writes at once (the slice None): those written early are left out of these records.
        if summary is not None:
            summary.earliest_due_ms = next((row["earliest_due"] for row in rows if row["slice"] is None), None)
        if early:
            self.writer.emitted_by_batch((bytes(v["sid"]), v["delivery_id"]) for row in rows for v in row["told"])
        if due_now:
            self._save(records.filter(~held))
        loads = [
            SliceLoad(row["slice"], row["records"], row["deliveries"], row["deadline"])
            for row in rows
            if row["slice"] is not None
        ]
        small, big = route_slices(loads, self.writer.room())
        held_count = 0
        if small:
            numbers = [piece.number for piece in small]
            rows = records.filter(held & slice_of.isin(numbers)).select(*self.columns.writer_columns).collect()
            self.writer.hold(writer_rows(rows))
            held_count += sum(piece.deliveries for piece in small)
        if big:
            # Read by the herd writer from the batch's checkpoint (__call__), which is kept until the herd is written.
            herd = records.filter(held & slice_of.isin([piece.number for piece in big]))
            self.herd_slices.keep(herd, {piece.number: piece.deadline for piece in big})
            held_count += self.herds.hand(herd, sorted((piece.number, piece.deliveries) for piece in big))
            log.info(
                "herd writer: %d deliveries in %d slice(s) handed on", sum(piece.deliveries for piece in big), len(big)
            )
        return held_count

    def _tell_early_versions(self, records: DataFrame, early: dict[bytes, str]) -> None:
        """Before the batch writes deliveries itself: the timed writer's early versions (``early``) of the ids it
        writes are the batch's to decide (one Spark job, only while some are held early)."""
        if early:
            found = records.filter(self._versions_of(early)).select("sid", "delivery_id").collect()
            self.writer.emitted_by_batch((bytes(row["sid"]), row["delivery_id"]) for row in found)

    def _versions_of(self, early: dict[bytes, str]) -> Column:
        """The batch's deliveries of the ids the timed writer holds early versions of."""
        return self.columns.is_delivery & sids_among(early)

    def _refusals(self, read: BatchDigest) -> Refusals:
        """What the destinations of this batch's deliveries would refuse, from the broker's metadata (cached)."""
        known = self.topics.describe(set(read.per_topic) | {self.config.rejections_topic})
        return refusals_of(read.per_topic, read.largest, read.partitioned, known, self.config.rejections_topic)

    def _summarise(self, batch: DataFrame, batch_id: int) -> BatchDigest:
        """Outcome counts, deliveries per destination topic, the largest delivery per topic (key, value and header
        bytes), the highest explicit partition per topic that deliveries name (-1 when they only name partition
        keys), the timer instants the state armed and the delivery ids it withdrew, in one Spark job."""
        return digest(batch.groupBy("kind", "topic").agg(*self.columns.summary_columns).collect(), batch_id)

    def _records(self, batch: DataFrame, read: BatchDigest, refusals: Refusals) -> tuple[DataFrame, int]:
        """Deliveries, write-backs, rejections, dead letters and history copies (``kind`` and ``due_ms`` kept for
        the hold), and how many deliveries became dead letters."""
        columns = self.columns
        records = columns.expired_as_rejections(
            batch.filter(columns.record_kinds).withColumn("delivery_id", columns.delivery_id)
        )
        if read.partitioned:
            records = records.withColumn("partition", columns.partition_picked(refusals.counts))
        dead = refusals.of_topics(read.per_topic)
        beyond = refusals.beyond(read.partitioned)
        if refusals.any or beyond:
            records, row_count = columns.dead_letter(records, refusals, beyond)
            dead += row_count
        records = records.withColumns(columns.fitted_rejections(refusals.rejection_limit))
        parts = [records.select(*self._record_columns)]
        # Each part reads the whole batch again (and a herd's slices read it after the batch): only those it has.
        if KIND_WRITE_BACK in read.copies:
            # A write-back follows its delivery, and also a delivery that became a dead letter: either way the
            # version is finished, and a rebuild from the source topic must not try it again.
            parts.append(records.filter(columns.has_write_back).select(*columns.write_back_columns))
        if self.config.history or KIND_HISTORY in read.copies:
            deliveries = records.filter(columns.is_delivery)
            copied = deliveries if self.config.history else deliveries.filter(F.col("history"))
            parts.append(copied.select(*columns.history_columns))
        return reduce(DataFrame.unionByName, parts), dead

    @cached_property
    def _record_columns(self) -> list[Column]:
        return as_columns(RECORD_COLUMNS)
