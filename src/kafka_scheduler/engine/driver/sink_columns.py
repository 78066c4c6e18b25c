"""The Spark SQL the record sink writes with: the columns of its summary job and of the rows it hands the timed
writer, the write-backs and history copies it derives, the rejections it makes of deliveries (dead letters, expired
ones, ones too large for the rejections topic), record sizes, and the Kafka write itself.

The expressions are built once per sink (``SinkColumns``): each function of pyspark.sql.functions is a round trip to
the JVM, and a batch's record plan takes some two hundred of them: built anew, a noticeable part of every batch
(docs/measurements.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from functools import cached_property

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ...config import Config, spark_kafka_options
from ...delivery_ids import rejection_id_column
from ...dialects.common import header
from ...protocol import DELIVERED_TO, DELIVERY_ID, DUE_MS, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC
from ..contract import (
    KIND_DELIVER,
    KIND_EXPIRED,
    KIND_HISTORY,
    KIND_REJECT,
    KIND_TIMER,
    KIND_WITHDRAW,
    KIND_WRITE_BACK,
    WRITER_COLUMNS,
)
from ..rules.rejections import (
    NOT_AUTHORIZED,
    PARTITION_MISSING,
    TOO_LARGE,
    TOPIC_MISSING,
    VALUE_LEFT_OUT,
    HeaderColumn,
    expiry_header_columns,
    reason_header_column,
    refusal_header_columns,
    text_column,
)
from .batch_summary import BatchSummary
from .herd_writer import HOLD_SLICE_MS
from .producing import PRODUCER_MAX_BYTES
from .sink_plan import HEADER_FRAMING_BYTES, RECORD_FRAMING_BYTES, Refusals

# Producer settings for the Kafka sink: wait for the broker's acknowledgement, batch and compress.
PRODUCER_OPTIONS = {
    "kafka.acks": "all",
    "kafka.linger.ms": "5",
    "kafka.compression.type": "lz4",
    "kafka.max.request.size": str(PRODUCER_MAX_BYTES),
}


def write_with_spark(records: DataFrame, config: Config) -> None:
    """Write records (topic, partition, key, value, headers) with Spark's Kafka sink."""
    records.select("topic", "partition", "key", "value", "headers").write.format("kafka").option(
        "kafka.bootstrap.servers", config.bootstrap_servers
    ).options(**PRODUCER_OPTIONS).options(**spark_kafka_options(config)).save()


def as_columns(columns: list) -> list[Column]:
    """Names as Columns: a name given to select is looked up as a JVM function call at every use."""
    return [F.col(c) if isinstance(c, str) else c for c in columns]


def headers_array(headers: Iterable[HeaderColumn]) -> Column:
    return F.array(*[header(name, value) for name, value in headers])


def payload_bytes() -> Column:
    """Key, value, header names and header values of a record, in bytes (sink_plan.record_payload_bytes in Python)."""
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
    """``sink_plan.framed_bytes`` in Spark (header framing is already in ``payload_bytes``)."""
    return payload + F.lit(RECORD_FRAMING_BYTES) + F.floor(payload / F.lit(8192)).cast("long")


def sql_string(value: str) -> str:
    """``value`` as a Spark SQL string literal (backslash escapes: spark.sql.parser.escapedStringLiterals is off)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def among(expression: str, values: Iterable[str]) -> Column:
    """Whether the SQL ``expression`` is one of ``values`` (null if it is null): an ``IN`` list parsed from one
    string, which Spark's optimizer turns into a hash set (InSet). ``Column.isin`` makes each value a literal of its
    own over py4j, ~100 µs each (a late batch names thousands of ids written early: building its filter took most
    of its write's 4-8 s), and an array literal is searched value by value for every row (a batch of 10,000 records
    against 10,000 ids: seconds). docs/measurements.md, a batch's cycle with millions pending."""
    values = list(values)
    if not values:
        return F.when(F.expr(expression).isNull(), F.lit(None)).otherwise(F.lit(False))
    return F.expr(f"({expression}) IN ({', '.join(map(sql_string, values))})")


def sids_among(sids: Iterable[bytes]) -> Column:
    """Whether a record's ``sid`` is one of ``sids`` (see ``among``)."""
    return among("hex(sid)", (bytes(sid).hex().upper() for sid in sids))


def records_but(records: DataFrame, delivery_ids: list[str]) -> DataFrame:
    """``records`` less those of ``delivery_ids``. A record without delivery id (a rejection) stays: NOT IN of a null
    is unknown, and a filter drops what is unknown."""
    return records.filter(F.col("delivery_id").isNull() | ~among("delivery_id", delivery_ids))


def expiry_headers() -> Column:
    """What a delivery rejected as expired gets beyond its own headers (rejections.expiry_headers)."""
    return headers_array(expiry_header_columns(F.col("due_ms"), F.col("max_lateness_ms"), F.col("delivery_id")))


class SinkColumns:
    """A sink's expressions, built once (its settings: the rejections and history topics, --history,
    --exactly-once)."""

    def __init__(self, config: Config):
        self.config = config
        self._fitted: tuple[int, dict[str, Column]] | None = None  # fitted_rejections's last limit and columns

    @cached_property
    def held(self) -> Column:
        """Prepared ahead of its due time (for the timed writer's hold)."""
        return F.coalesce(F.col("prepared"), F.lit(False))

    @cached_property
    def slice_of(self) -> Column:
        """The herd writer's slice of a record's due time."""
        return F.ceil(F.col("due_ms") / F.lit(HOLD_SLICE_MS)).cast("long")

    @cached_property
    def writer_columns(self) -> list[Column]:
        """The timed writer's rows (contract.WriterRow) of the sink's records."""
        return _writer_selection(held=self.held)

    @cached_property
    def written_now_columns(self) -> list[Column]:
        """The rows of records written at once through the timed writer (exactly-once): none held, and no schedule
        id (only the hold reads it)."""
        return _writer_selection(held=F.lit(False), sid=F.lit(None).cast("binary"))

    @cached_property
    def summary_columns(self) -> list[Column]:
        """The summary job's aggregates per kind and topic (sink_plan.digest reads them)."""
        prepared = self.held
        return [
            F.count(F.lit(1)).alias("records"),
            F.sum("n").alias("n"),
            F.min(F.when(~prepared, F.col("due_ms"))).alias("earliest_due"),
            F.max(F.when(prepared, F.col("due_ms"))).alias("latest_prepared_due"),
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

    @cached_property
    def record_kinds(self) -> Column:
        return F.col("kind").isin(KIND_DELIVER, KIND_REJECT, KIND_EXPIRED)

    @cached_property
    def is_delivery(self) -> Column:
        return F.col("kind") == KIND_DELIVER

    @cached_property
    def has_write_back(self) -> Column:
        return F.col("wb_headers").isNotNull()

    @cached_property
    def delivery_id(self) -> Column:
        def header_value(name: str) -> Column:
            # try_: a rejection has no delivery id (element_at of an empty array fails the batch in ANSI mode)
            return F.try_element_at(F.filter("headers", lambda h: h["key"] == name), F.lit(-1))["value"].cast("string")

        delivery_id = header_value(DELIVERY_ID)
        if self.config.exactly_once:
            # A request's rejection is written once too: it is named after its source record.
            delivery_id = F.coalesce(
                delivery_id,
                rejection_id_column(
                    header_value(SOURCE_TOPIC), header_value(SOURCE_PARTITION), header_value(SOURCE_OFFSET)
                ),
            )
        return delivery_id

    def partition_picked(self, counts: dict[str, int]) -> Column:
        """A delivery's partition: its own, or the one its partition key picks (the partitioner hash modulo the
        destination's partition count; ``counts``: per topic)."""
        count_of = (
            F.element_at(F.create_map(*[F.lit(x) for t, n in counts.items() for x in (t, n)]), F.col("topic"))
            if counts
            else F.lit(None).cast("int")
        )
        return F.coalesce(F.col("partition"), F.pmod(F.col("partition_hash"), count_of))

    @cached_property
    def write_back_columns(self) -> list[Column]:
        return as_columns(
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
    def history_columns(self) -> list[Column]:
        return as_columns(
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

    def expired_as_rejections(self, records: DataFrame) -> DataFrame:
        """Deliveries the state marked expired (due + max lateness before the batch's time) become rejections: the
        delivery's key, value and headers, the reason ``expired: ...`` with the due time, ``x-scheduler-due-ms`` and
        the request's source (a cron firing's is its activating request's)."""
        return records.withColumns(self.expiry_columns)

    @cached_property
    def expiry_columns(self) -> dict[str, Column]:
        expired = F.col("kind") == KIND_EXPIRED
        return {
            "kind": F.when(expired, F.lit(KIND_REJECT)).otherwise(F.col("kind")),
            "topic": F.when(expired, F.lit(self.config.rejections_topic)).otherwise(F.col("topic")),
            "partition": F.when(expired, F.lit(None)).otherwise(F.col("partition")),
            "headers": F.when(expired, F.concat("headers", expiry_headers())).otherwise(F.col("headers")),
            "history": F.when(expired, F.lit(False)).otherwise(F.col("history")),
            "prepared": F.when(expired, F.lit(False)).otherwise(F.col("prepared")),
        }

    def expire(self, records: DataFrame, deadline: int | None, summary: BatchSummary | None) -> DataFrame:
        """Just before Spark writes ``records`` (the sink's records): a delivery that would go out later than its due
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
                "headers": F.when(late_delivery, F.concat("headers", expiry_headers())).otherwise(F.col("headers")),
            }
        )

    def fitted_rejections(self, limit: int) -> dict[str, Column]:
        """A rejection carries its request's value and headers plus the reason: one the rejections topic would
        refuse as too large (a request rejected for its size, near the record limit) goes without its value.
        ``limit``: the largest framed record the rejections topic takes (it changes only with the topic's config)."""
        if self._fitted is None or self._fitted[0] != limit:
            too_large = (F.col("kind") == KIND_REJECT) & (framed_bytes_column(payload_bytes()) > F.lit(limit))
            note = header(*reason_header_column(F.lit(VALUE_LEFT_OUT)))
            # One projection: both columns judged on the record as it was.
            self._fitted = (
                limit,
                {
                    "value": F.when(too_large, F.lit(None).cast("binary")).otherwise(F.col("value")),
                    "headers": F.when(too_large, F.concat("headers", F.array(note))).otherwise(F.col("headers")),
                },
            )
        return self._fitted[1]

    def dead_letter(self, records: DataFrame, refusals: Refusals, beyond: dict[str, int]) -> tuple[DataFrame, int]:
        """Deliveries their destination would refuse (topic missing or not writable, partition missing, record too
        large) go to the rejections topic, with the reason and source (the timed writer's twin, from a delivery
        report: producing.refusal_reason). Returns the records and how many deliveries went that way for a reason
        of their own (a partition, a size) rather than their topic's: one more Spark job counts them."""
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
        topic = F.col("topic")
        why = per_topic({t: why for t, (_, why) in refusals.oversize.items()}) if refusals.oversize else F.lit("")
        reason = (
            F.when(no_topic, text_column(TOPIC_MISSING, topic=topic))
            .when(denied, text_column(NOT_AUTHORIZED, topic=topic))
            .when(
                no_partition,
                text_column(PARTITION_MISSING, partition=F.col("partition"), topic=topic, partitions=partitions_of),
            )
            .otherwise(
                F.concat(
                    text_column(TOO_LARGE, size=size, topic=topic, limit=why),
                    F.when(value_left_out, F.lit(f"; {VALUE_LEFT_OUT}")).otherwise(F.lit("")),
                )
            )
        )
        extra = headers_array(refusal_header_columns(reason, F.col("delivery_id")))
        return records.select(
            F.when(undeliverable, F.lit(KIND_REJECT)).otherwise(F.col("kind")).alias("kind"),
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


def _writer_selection(**expressions: Column) -> list[Column]:
    """``WRITER_COLUMNS`` in order, each the column of its name unless given."""
    return [expressions[name].alias(name) if name in expressions else F.col(name) for name in WRITER_COLUMNS]
