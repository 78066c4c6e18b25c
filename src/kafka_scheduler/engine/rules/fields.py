"""The columns of a schedule's row, each defined once: its type in Arrow, in pandas and in Spark SQL, and the groups of
columns it is in.

A schedule moves through the job as a row: a normalized request that a dialect decodes (``REQUEST``, in Spark SQL), a
chunk row in state (``ENTRY``: the order is the chunk blob's, kept in checkpoints), a row the processor emits
(engine/contract.py OUTPUT_SCHEMA lists its columns in its own order) and a record row of the sink (``RECORD``). Each
list of columns, and each schema, is derived from ``FIELDS``; tests/unit/test_fields.py checks that the forms of each
type agree and tests/unit/test_stored_formats.py that the stored ones are as checkpoints hold them.

Spark-free: a field's Spark type is its DDL text, parsed on the Spark side (engine/spark/ddl.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# The groups of columns a field may be in.
REQUEST = "request"  # a normalized request row (dialects/common.py normalize), the schedule id first
OPTIONAL = "optional"  # request columns a dialect may leave out: normalize fills them with null
ENTRY = "entry"  # a chunk row: a schedule in state
INDEX = "index"  # what a chunk row carries to rebuild the id index from
CRON = "cron"  # a cron's definition (schedule.Cron)
RECORD = "record"  # a record row of the sink (engine/driver/record_sink.py): what it writes and the hold reads


@dataclass(frozen=True)
class FieldType:
    arrow: pa.DataType
    pandas: str  # the dtype in the rules' frames: nullable ints as Int32/Int64 (what a chunk reads back as)
    ddl: str  # Spark SQL

    @property
    def nullable_pandas(self) -> str:
        """The dtype in a frame whose rows may lack the column (the processor's output rows of every kind)."""
        return {"int64": "Int64", "int32": "Int32", "bool": "boolean"}.get(self.pandas, self.pandas)


TEXT = FieldType(pa.string(), "object", "string")
BYTES = FieldType(pa.binary(), "object", "binary")
LONG = FieldType(pa.int64(), "int64", "long")
NULLABLE_LONG = FieldType(pa.int64(), "Int64", "long")
INT = FieldType(pa.int32(), "int32", "int")
NULLABLE_INT = FieldType(pa.int32(), "Int32", "int")
FLAG = FieldType(pa.bool_(), "bool", "boolean")
NULLABLE_FLAG = FieldType(pa.bool_(), "boolean", "boolean")
HEADERS = FieldType(
    pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
    "object",
    "array<struct<key:string,value:binary>>",
)
TEXT_LIST = FieldType(pa.list_(pa.string()), "object", "array<string>")
BYTES_LIST = FieldType(pa.list_(pa.binary()), "object", "array<binary>")


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType
    groups: frozenset[str]

    @property
    def arrow(self) -> pa.DataType:
        return self.type.arrow

    @property
    def pandas(self) -> str:
        return self.type.pandas

    @property
    def ddl(self) -> str:
        return self.type.ddl


def _field(name: str, field_type: FieldType, *groups: str) -> Field:
    return Field(name, field_type, frozenset(groups))


# In the order of a chunk row (stored: never reorder the ENTRY fields); the other fields sit where their groups'
# orders want them. No field without a group but those of the processor's output rows alone (contract.OUTPUT_SCHEMA).
FIELDS = {
    f.name: f
    for f in (
        _field("kind", TEXT, REQUEST, RECORD),  # request | reject; in output and records: deliver, outcome, ...
        _field("action", TEXT, REQUEST),  # ADD | REPLACE | CANCEL | COMPLETE | CRON_* (requests only)
        _field("due_ms", LONG, REQUEST, ENTRY, RECORD),  # due time, epoch milliseconds, rounded up
        _field("topic", TEXT, REQUEST, ENTRY, RECORD),  # destination (requests) or the rejections topic (rejects)
        _field("key", BYTES, REQUEST, ENTRY, RECORD),
        _field("value", BYTES, REQUEST, ENTRY, RECORD),
        _field("headers", HEADERS, REQUEST, ENTRY, RECORD),  # to deliver (requests) or of the rejection (rejects)
        _field("header_names", TEXT_LIST),  # output: the headers as two lists of primitives (contract.py)
        _field("header_values", BYTES_LIST),
        _field("delivery_id", TEXT, REQUEST, ENTRY, RECORD),  # stable id of the version: source topic-partition-offset
        _field("src_topic", TEXT, REQUEST),  # the request's source record
        _field("src_partition", INT, REQUEST),
        _field("src_offset", LONG, REQUEST),
        _field("src_ts_ms", LONG, REQUEST),
        _field("entry_bytes", LONG, REQUEST, ENTRY),  # rough stored size, to bound chunks (entries.entry_bytes)
        _field("n", NULLABLE_LONG),  # output: an outcome row's count
        # COMPLETE only: the delivery id of the version a write-back completes; null: the pending one
        _field("completes", TEXT, REQUEST, OPTIONAL),
        # what some dialects add (null for native requests): see schedule.Schedule
        _field("partition", NULLABLE_INT, REQUEST, OPTIONAL, ENTRY, RECORD),  # explicit destination partition, or null
        # bytes that pick the destination partition (Kafka's murmur2 partitioner), or null
        _field("partition_key", BYTES, REQUEST, OPTIONAL, ENTRY),
        _field("partition_hash", NULLABLE_INT),  # output: the partitioner hash of the partition key
        _field("wb_topic", TEXT, REQUEST, ENTRY),  # the write-back to send after delivery (null: none):
        _field("wb_partition", NULLABLE_INT, REQUEST, ENTRY),  # the request's own topic and partition,
        _field("wb_key", BYTES, REQUEST, ENTRY),  # its key,
        _field("wb_headers", HEADERS, REQUEST, OPTIONAL, ENTRY),  # and the headers the dialect asks for (no value)
        _field("history", FLAG, REQUEST, OPTIONAL, ENTRY),  # copy to the history topic whatever --history says (ETF1)
        _field("prepared", NULLABLE_FLAG, RECORD),  # output: emitted ahead of its due time, for the timed writer
        # the schedule id (scoped per source topic: protocol.py CLIENT_SID_PREFIX, ...) and the digest of the version,
        # null without request id: a chunk's rows rebuild the index
        _field("sid", BYTES, REQUEST, ENTRY, INDEX, RECORD),
        _field("digest", BYTES, ENTRY, INDEX),
        # expiry (null: none), and a cron's definition (null for one-shots): see schedule.Cron
        # later than due + this: rejected as expired (native: x-scheduler-max-lateness), or null
        _field("max_lateness_ms", NULLABLE_LONG, REQUEST, OPTIONAL, ENTRY, RECORD),
        _field("cron_expr", TEXT, REQUEST, OPTIONAL, ENTRY, CRON),  # CRON_ADD (native) and firings; null otherwise
        _field("cron_tz", TEXT, REQUEST, OPTIONAL, ENTRY, CRON),
        _field("cron_policy", TEXT, REQUEST, OPTIONAL, ENTRY, CRON),
        _field("cron_start_ms", NULLABLE_LONG, REQUEST, OPTIONAL, ENTRY, CRON),
        _field("cron_end_ms", NULLABLE_LONG, REQUEST, OPTIONAL, ENTRY, CRON),
        _field("raw_headers", HEADERS, REQUEST, OPTIONAL),  # CRON_ADD: its headers as read, should the rules refuse it
    )
}


def fields_in(group: str) -> list[Field]:
    return [f for f in FIELDS.values() if group in f.groups]


def names_in(group: str) -> list[str]:
    return [f.name for f in fields_in(group)]


ENTRY_COLUMNS = names_in(ENTRY)
INDEX_COLUMNS = names_in(INDEX)
CRON_COLUMNS = names_in(CRON)
NULLABLE_INT_COLUMNS = tuple(f.name for f in fields_in(ENTRY) if f.pandas in ("Int32", "Int64"))
# The schedule id leads a request row (it names the row's shard); a chunk keeps it with the index's columns.
REQUEST_COLUMNS = ("sid", *(name for name in names_in(REQUEST) if name != "sid"))
RECORD_COLUMNS = names_in(RECORD)
HEADERS_DDL = HEADERS.ddl
HEADERS_ARROW = HEADERS.arrow
