"""Rejection texts and headers (engine/rules/rejections.py): each written once, in Python and in Spark SQL, and the two
give the same bytes for the same inputs; so do the rejections the sink makes in Spark and the timed writer in Python
of the same refused or expired delivery, and the decoders' rejections and the processor's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_scheduler.config import Config
from kafka_scheduler.engine.rules.rejections import (
    EXPIRED,
    NOT_AUTHORIZED,
    PARTITION_MISSING,
    REFUSED,
    TOO_LARGE,
    TOPIC_MISSING,
    expired_reason,
    expired_reason_column,
    expiry_header_columns,
    expiry_headers,
    iso_instant,
    iso_instant_column,
    refusal_header_columns,
    refusal_headers,
    rejection_headers,
    text,
    text_column,
)

from .test_delivery_ids import offsets, partitions, topics

# Epoch milliseconds from 1970 to the end of year 9999 (what ISO-8601's four-digit years hold).
instants = st.one_of(
    st.integers(0, 253_402_300_799_999),
    st.sampled_from([0, 999, 1_767_225_600_123, 4_102_444_800_001, 253_402_300_799_999]),
)
sizes = st.integers(0, 2**40)
notes = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)


def headers_of(row_headers) -> list:
    return [(h["key"], bytes(h["value"])) for h in row_headers]


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(topics, partitions, sizes, notes, instants, st.integers(0, 2**40), offsets), min_size=1, max_size=40
    )
)
def test_each_text_is_the_same_in_python_and_in_spark(spark, rows):
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(
        rows, "topic string, partition int, size bigint, note string, due bigint, lateness bigint, count bigint"
    )
    c = F.col
    spark_texts = frame.select(
        text_column(TOPIC_MISSING, topic=c("topic")),
        text_column(NOT_AUTHORIZED, topic=c("topic")),
        text_column(PARTITION_MISSING, partition=c("partition"), topic=c("topic"), partitions=c("count")),
        text_column(TOO_LARGE, size=c("size"), topic=c("topic"), limit=c("note")),
        text_column(REFUSED, topic=c("topic"), error=c("note")),
        expired_reason_column(c("due"), c("lateness")),
        iso_instant_column(c("due")),
    ).collect()
    python_texts = [
        (
            text(TOPIC_MISSING, topic=topic),
            text(NOT_AUTHORIZED, topic=topic),
            text(PARTITION_MISSING, partition=partition, topic=topic, partitions=count),
            text(TOO_LARGE, size=size, topic=topic, limit=note),
            text(REFUSED, topic=topic, error=note),
            expired_reason(due, lateness),
            iso_instant(due),
        )
        for topic, partition, size, note, due, lateness, count in rows
    ]
    assert [tuple(row) for row in spark_texts] == python_texts


def test_the_expiry_reason_reads_as_before():
    assert (
        expired_reason(1000, 10)
        == "expired: due 1970-01-01T00:00:01.000Z, not delivered within its max lateness of 10 ms"
    )
    assert text(EXPIRED, due="x", max_lateness_ms=5) == "expired: due x, not delivered within its max lateness of 5 ms"
    # Whole milliseconds: far instants too (a float of seconds would lose the last millisecond).
    assert iso_instant(253_402_300_799_999) == "9999-12-31T23:59:59.999Z"


@settings(max_examples=10, deadline=None)
@given(st.lists(st.tuples(topics, partitions, offsets, st.one_of(st.none(), instants), instants, notes), min_size=1))
def test_each_header_set_is_the_same_in_python_and_in_spark(spark, rows):
    from pyspark.sql import functions as F

    from kafka_scheduler.delivery_ids import delivery_id, firing_id
    from kafka_scheduler.engine.driver.sink_columns import headers_array

    ids = [
        (delivery_id(t, p, o) if at is None else firing_id(delivery_id(t, p, o), at), due, note)
        for t, p, o, at, due, note in rows
    ]
    frame = spark.createDataFrame(ids, "delivery_id string, due bigint, note string")
    c = F.col
    got = frame.select(
        headers_array(refusal_header_columns(c("note"), c("delivery_id"))).alias("refusal"),
        headers_array(expiry_header_columns(c("due"), F.lit(60_000).cast("long"), c("delivery_id"))).alias("expiry"),
    ).collect()
    assert [(headers_of(r["refusal"]), headers_of(r["expiry"])) for r in got] == [
        (refusal_headers(note, i), expiry_headers(due, 60_000, i)) for i, due, note in ids
    ]


DELIVERY_COLUMNS = (
    "kind string, topic string, partition int, key binary, value binary, "
    "headers array<struct<key:string,value:binary>>, due_ms bigint, wb_topic string, wb_partition int, wb_key binary, "
    "wb_headers array<struct<key:string,value:binary>>, history boolean, max_lateness_ms bigint, prepared boolean, "
    "delivery_id string, sid binary"
)
HEADERS = [("h", b"1")]


def delivery(topic: str, delivery_id: str, due_ms: int, max_lateness_ms: int | None = None) -> tuple:
    """A row of the sink's records (DELIVERY_COLUMNS): a delivery to ``topic``."""
    headers = [*HEADERS, ("x-scheduler-delivery-id", delivery_id.encode())]
    return (
        "deliver",
        topic,
        None,
        b"k",
        b"v",
        headers,
        due_ms,
        *[None] * 4,
        False,
        max_lateness_ms,
        False,
        delivery_id,
        None,
    )


def test_the_sink_and_the_timed_writer_reject_a_refused_or_expired_delivery_alike(spark):
    """A delivery whose topic is missing or denied, and one later than its max lateness: the sink's rejection (Spark,
    from metadata and at its write) and the timed writer's (Python, from a delivery report and at its instant) carry
    the same headers; a firing's source is its activating request."""
    from confluent_kafka import KafkaError

    from kafka_scheduler.engine.driver.producing import Record, expired_as_rejection, refused_as_rejection
    from kafka_scheduler.engine.driver.sink_columns import SinkColumns
    from kafka_scheduler.engine.driver.sink_plan import Refusals

    config = Config()
    columns = SinkColumns(config)
    missing, denied, late = "app-requests-0-17", "app-requests-2-5@1767225600000", "in-3-9@1000"
    records = spark.createDataFrame(
        [delivery("gone", missing, 1000), delivery("denied", denied, 1000), delivery("out", late, 1000, 10)],
        DELIVERY_COLUMNS,
    )
    dead, _ = columns.dead_letter(records, Refusals(missing={"gone"}, denied={"denied"}), {})
    expired = columns.expire(records.filter("topic = 'out'"), 1010, None)
    in_spark = {r["delivery_id"]: headers_of(r["headers"]) for r in dead.filter("kind = 'reject'").collect()}
    in_spark |= {r["delivery_id"]: headers_of(r["headers"]) for r in expired.collect()}

    def refused(topic: str, delivery_id: str, code: int) -> list:
        record = Record(topic, None, b"k", b"v", [*HEADERS, ("x-scheduler-delivery-id", delivery_id.encode())])
        return refused_as_rejection(record, delivery_id, config.rejections_topic, KafkaError(code)).headers

    record = Record("out", None, b"k", b"v", [*HEADERS, ("x-scheduler-delivery-id", late.encode())])
    in_python = {
        missing: refused("gone", missing, KafkaError._UNKNOWN_TOPIC),
        denied: refused("denied", denied, KafkaError.TOPIC_AUTHORIZATION_FAILED),
        late: expired_as_rejection(record, late, 1000, 10, config.rejections_topic).headers,
    }
    assert in_spark == in_python
    assert dict(in_python[denied])["x-scheduler-source-offset"] == b"5"


def test_the_decoders_rejection_headers_are_the_processors(spark):
    """A request the native decoder rejects carries its headers, each reason and its source, in that order: what
    ``rejection_headers`` gives the processor's rejections (output.rejections_frame)."""
    from kafka_scheduler import dialects

    from .test_hostile_decode import NOW, SETTINGS
    from .test_native_decode import KAFKA_SCHEMA

    own = [("x-scheduler-action", b"ADD"), ("x-scheduler-deliver-to", b"not a topic!")]
    rows = [(b"k", b"v", "app-in-1", 3, 2**40, NOW, 0, own)]
    row = dialects.decode(spark.createDataFrame(rows, KAFKA_SCHEMA), {"app-in-1": "native"}, SETTINGS).collect()[0]
    assert row["kind"] == "reject"
    headers = headers_of(row["headers"])
    reasons = [value.decode() for name, value in headers if name == "x-scheduler-rejection-reason"]
    assert len(reasons) >= 2, "a request with several faults rejected for each"
    assert headers == own + rejection_headers(reasons, "app-in-1", 3, 2**40)
