"""The contract between the state step and the driver: the rows the processor emits (``OUTPUT_SCHEMA``), the kinds of
record among them, and the names of the outcome rows that report counts and the batch's clock. The dialects' decoders
write the request kinds (``KIND_REQUEST``, ``KIND_REJECT``). Within the driver, the rows the sink hands its timed
writer and its herd tasks (``WriterRow``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from pyspark.sql.types import StructType

from .rules.fields import HEADERS_DDL
from .spark.ddl import spark_field, spark_type

KIND_REQUEST = "request"

KIND_REJECT = "reject"

HEADERS_TYPE = spark_type(HEADERS_DDL)

# What the processor emits: records to write (deliver, reject) and per-outcome counts (outcome). Headers leave
# Python as two lists of primitives, names and values, and a delivery's id as a column of its own: ``record_rows``
# zips them into (key, value) structs in the JVM. As a list of structs they cost each row a dict per header built
# by the processor and another by PySpark's conversion to Arrow, most of a herd's Python time (docs/measurements.md).
# The columns' types are the field table's (engine/rules/fields.py); their order is this contract's own.
OUTPUT_SCHEMA = StructType(
    [
        spark_field("kind"),
        spark_field("topic"),  # destination topic; for outcome rows, the outcome name
        spark_field("key"),
        spark_field("value"),
        spark_field("header_names"),
        spark_field("header_values"),
        spark_field("delivery_id"),  # deliveries only: record_rows adds it as the last header
        spark_field("due_ms"),
        spark_field("n"),
        # deliveries only: the explicit partition, or the partitioner hash of a partition key (the sink takes it
        # modulo the destination's partition count); the write-back to send and whether to copy to history
        spark_field("partition"),
        spark_field("partition_hash"),
        spark_field("wb_topic"),
        spark_field("wb_partition"),
        spark_field("wb_key"),
        spark_field("wb_headers"),
        spark_field("history"),
        # deliveries only: emitted ahead of its due time, for the driver's timed writer (see ``batch.apply_requests``)
        spark_field("prepared"),
        # deliveries (and expired ones): later than due + this, the sink or the timed writer rejects it as expired
        spark_field("max_lateness_ms"),
        # deliveries only: the schedule's id in the state, by which a CANCEL read early finds it (early_cancels.py)
        spark_field("sid"),
    ]
)

OUTPUT_COLUMNS = OUTPUT_SCHEMA.names

KIND_DELIVER = "deliver"

KIND_EXPIRED = "expired"  # a delivery written later than its max lateness would allow: the sink rejects it

KIND_OUTCOME = "outcome"

OUTCOME_REJECTED = "rejected"

REJECTIONS_SHARD = -1

# Rows besides deliveries, rejections and outcomes: a timer instant the shard armed (``due_ms``), for the
# driver's wake-ups; a delivery id (``key``) the timed writer must drop; a tick record (input only).
KIND_TIMER = "timer"

KIND_WITHDRAW = "withdraw"

KIND_TICK = "tick"

# The values of the driver's tick records (engine/driver/wakeups.py) and the shards each reaches
# (engine/spark/query.py): a wake-up tick none (reading it runs a batch, which fires the expired timers), a
# report tick every shard (each reports its armed timers).
TICK_WAKE = b"wake"
TICK_REPORT = b"report"

# Kinds of the records the sink derives from deliveries (the processor emits deliver and reject).
KIND_HISTORY = "history"

KIND_WRITE_BACK = "write-back"

# Outcome rows "index_entries:<shard>" (n: entries of the shard's id index after a handler call; due_ms: the
# index version) are reports, not requests: kept apart, last value per shard.
INDEX_ENTRIES_PREFIX = "index_entries:"

# Outcome rows name their labels after the outcome: "scheduled@<input topic>", "rejected@<input topic>@<reason
# class>" (topic names cannot hold "@"). "delivered_at_once@<input topic>" counts schedules due when read: a
# report on requests already counted, not an outcome.
LABEL_SEPARATOR = "@"

DELIVERED_AT_ONCE = "delivered_at_once"

# Outcome rows "batch_time" (n and due_ms: the processing time the state's rules used) report the batch's clock:
# what it retired from state was due by then (a graceful stop waits for a batch past the stop to retire what the
# timed writer wrote).
BATCH_TIME = "batch_time"

# Outcome rows "skipped_firings" count firings of skip crons missed while the job was down (not delivered): a report,
# not a request outcome.
SKIPPED_FIRINGS = "skipped_firings"


def outcome_key(name: str, *labels: str) -> str:
    return LABEL_SEPARATOR.join((name, *labels))


class WriterRow(NamedTuple):
    """A record the sink hands the timed writer (``TimedWriter.hold``, ``write_now``): a delivery, its write-back or
    history copy (which share its delivery id and due time), or a rejection (no delivery id, no due time: written at
    once). The sink selects ``WRITER_COLUMNS`` and makes one of each row (``writer_rows``)."""

    delivery_id: str | None
    due_ms: int | None
    kind: str  # KIND_DELIVER, KIND_WRITE_BACK, KIND_HISTORY, KIND_REJECT
    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list | None  # (key, value) structs or pairs
    held: bool = False  # prepared ahead of its due time (the batch's count of deliveries held)
    max_lateness_ms: int | None = None  # a delivery's: written later than due + this, it is rejected as expired
    sid: bytes | None = None  # a delivery's schedule id in the state, by which a CANCEL read early finds it


WRITER_COLUMNS = WriterRow._fields

# What a herd task reads of a herd's rows (exactly_once.herd_items): the record and its ledger key's delivery id and
# due time; the rest only the timed writer reads.
HERD_COLUMNS = tuple(name for name in WRITER_COLUMNS if name not in ("kind", "held", "max_lateness_ms", "sid"))


def writer_rows(rows: Iterable) -> Iterator[WriterRow]:
    """Rows of a selection of ``WRITER_COLUMNS`` (Spark's, in that order) as WriterRows, as they come."""
    return map(WriterRow._make, rows)
