"""Karafka, ETF1 and Sky schedule topics read as they are, by one running job, checked from outside.

Requests are built by hand with an independent client (confluent-kafka records with raw headers; fastavro
for Sky Avro; json + base64 for Sky JSON), never with the project's encoders. Deliveries, write-backs,
history copies and rejections are read back from the broker.
"""

from __future__ import annotations

import base64
import io
import json
import math
import time
import uuid

import fastavro
import pytest
from confluent_kafka import Producer

from .support import Kafka

WAIT = 180  # seconds a test waits for a record before failing (a deadline: passing tests wait no longer)

SKY_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "AvroSchedule",
        "fields": [
            {"name": "time", "type": "long"},
            {"name": "topic", "type": "string"},
            {"name": "key", "type": "bytes"},
            {"name": "value", "type": ["null", "bytes"]},
            {"name": "headers", "type": {"type": "map", "values": "bytes"}},
        ],
    }
)
SKY_OLD_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "AvroSchedule",
        "fields": [
            {"name": "time", "type": "long"},
            {"name": "topic", "type": "string"},
            {"name": "key", "type": "bytes"},
            {"name": "value", "type": ["null", "bytes"]},
        ],
    }
)


def avro(record: dict, schema=SKY_SCHEMA) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def sky_json(time_ms, topic, key: bytes, value, headers=None) -> bytes:
    document = {
        "time": time_ms,
        "topic": topic,
        "key": base64.b64encode(key).decode(),
        "value": None if value is None else base64.b64encode(value).decode(),
    }
    if headers is not None:
        document["headers"] = {k: base64.b64encode(v).decode() for k, v in headers.items()}
    return json.dumps(document).encode()


def epoch_in(seconds: float) -> int:
    """Whole Unix seconds, at least ``seconds`` from now (Karafka and ETF1 have second precision)."""
    return math.ceil(time.time() + seconds)


def karafka(
    target_topic,
    epoch,
    source_type="schedule",
    version="1.0.0",
    target_key=None,
    partition=None,
    partition_key=None,
    extra=(),
):
    headers = [("schedule_schema_version", version.encode()), ("schedule_source_type", source_type.encode())]
    if epoch is not None:
        headers.append(("schedule_target_epoch", str(epoch).encode()))
    if target_topic is not None:
        headers.append(("schedule_target_topic", target_topic.encode()))
    if target_key is not None:
        headers.append(("schedule_target_key", target_key))
    if partition is not None:
        headers.append(("schedule_target_partition", str(partition).encode()))
    if partition_key is not None:
        headers.append(("schedule_target_partition_key", partition_key))
    return headers + list(extra)


def etf1(target_topic, epoch, target_key=None, extra=()):
    headers = list(extra)
    if epoch is not None:
        headers.append(("scheduler-epoch", str(epoch).encode()))
    if target_topic is not None:
        headers.append(("scheduler-target-topic", target_topic.encode()))
    if target_key is not None:
        headers.append(("scheduler-target-key", target_key))
    return headers


def delivery_id(record) -> bytes:
    return record.header("x-scheduler-delivery-id")


def kafka_partition_of(bootstrap: str, topic: str, key: bytes) -> int:
    """Where Java's default partitioner puts ``key`` in ``topic``: ask librdkafka's murmur2 partitioner by
    producing a probe record (an independent computation of what Karafka's partition key means)."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2", "log_level": 3})
    result = {}
    producer.produce(topic, key=key, value=b"probe", on_delivery=lambda err, msg: result.update(msg=msg))
    producer.flush(30)
    return result["msg"].partition()


@pytest.fixture(scope="module", params=["wheel"])
def scheduler(request, scheduler_factory, broker):
    """One job reading the native requests topic and one topic of every other dialect, on each state layout."""
    kafka = Kafka(broker.bootstrap_servers)
    topics = {
        "karafka": kafka.topic("karafka", partitions=2),
        "etf1": kafka.topic("etf1"),
        "sky-avro": kafka.topic("skyavro"),
        "sky-json": kafka.topic("skyjson"),
    }
    app_id = f"dialects-{request.param}-{uuid.uuid4().hex[:6]}"
    inputs = [f"{app_id}-schedule-requests:native"] + [f"{t}:{d}" for d, t in topics.items()]
    process = scheduler_factory(
        app_id=app_id, extra_args=[*(a for i in inputs for a in ("--input", i)), "--state-layout", request.param]
    )
    process.topics = topics
    yield process.start()
    assert process.stop() == 0, process.log()[-3000:]


@pytest.fixture
def topics(scheduler):
    """The input topic of each dialect of the running job."""
    return scheduler.topics


def rejections_of(kafka, scheduler):
    return kafka.reader(f"{scheduler.app_id}-schedule-rejections")


def rejected(reader, source_topic, offset, guard):
    """The rejection of the record at ``offset`` of ``source_topic``, and its reasons."""
    [record] = reader.wait_for(
        lambda r: (
            r.header_values("x-scheduler-source-topic") == [source_topic.encode()]
            and r.header_values("x-scheduler-source-offset") == [str(offset).encode()]
        ),
        timeout=WAIT,
        what=f"rejection of {source_topic}@{offset}",
        guard=guard,
    )
    return record, [v.decode() for v in record.header_values("x-scheduler-rejection-reason")]


# ---------------------------------------------------------------- Karafka


def test_karafka_schedule_is_delivered_with_trace_headers_and_written_back(kafka, scheduler, topics, broker):
    source = topics["karafka"]
    out = kafka.topic("out", partitions=3)
    reader, back = kafka.reader(out), kafka.reader(source)
    key = f"k-{uuid.uuid4().hex[:6]}".encode()
    epoch = epoch_in(3)
    headers = karafka(out, epoch, target_key=b"target\xff", partition_key=b"user-42", extra=[("trace", b"\x01")])
    partition, offset = kafka.produce(source, key=key, value=b"payload\x00", headers=headers, partition=1)

    [delivered] = reader.wait_for(
        lambda r: r.value == b"payload\x00", timeout=WAIT, what="delivery", guard=scheduler.assert_running
    )
    assert delivered.timestamp_ms >= epoch * 1000, "delivered before its due time"
    assert delivered.key == b"target\xff"
    assert delivered.partition == kafka_partition_of(broker.bootstrap_servers, out, b"user-42")
    assert delivered.headers == headers + [
        ("schedule_source_topic", source.encode()),
        ("schedule_source_partition", b"1"),
        ("schedule_source_offset", str(offset).encode()),
        ("schedule_source_key", key),
        ("x-scheduler-delivery-id", f"{source}-1-{offset}".encode()),
    ]

    [tombstone] = back.wait_for(
        lambda r: r.value is None and r.key == key, timeout=WAIT, what="write-back", guard=scheduler.assert_running
    )
    assert tombstone.partition == partition
    assert tombstone.header("schedule_source_type") == b"tombstone"
    assert tombstone.header("schedule_source_offset") == str(offset).encode()
    assert tombstone.header("x-scheduler-source-offset") == str(offset).encode()
    assert tombstone.header("trace") == b"\x01" and tombstone.header("schedule_target_topic") == out.encode()


def test_karafka_explicit_partition_cancel_and_newer_schema(kafka, scheduler, topics):
    source = topics["karafka"]
    out = kafka.topic("out", partitions=3)
    reader, rejections = kafka.reader(out), rejections_of(kafka, scheduler)
    run = uuid.uuid4().hex[:6]
    epoch = epoch_in(4)
    kafka.produce(source, key=f"p-{run}".encode(), value=b"to-2", headers=karafka(out, epoch, partition=2), partition=0)
    kafka.produce(source, key=f"c-{run}".encode(), value=b"cancelled", headers=karafka(out, epoch), partition=0)
    kafka.produce(source, key=f"c-{run}".encode(), value=None, headers=karafka(None, None, "cancel"), partition=0)
    _, newer = kafka.produce(
        source, key=f"n-{run}".encode(), value=b"v2", headers=karafka(out, epoch, version="2.0.0"), partition=0
    )
    _, beyond = kafka.produce(
        source, key=f"b-{run}".encode(), value=b"beyond", headers=karafka(out, epoch_in(0), partition=7), partition=0
    )
    kafka.produce(source, key=f"m-{run}".encode(), value=b"marker", headers=karafka(out, epoch + 1), partition=0)

    reader.wait_for(lambda r: r.value == b"marker", timeout=WAIT, what="marker", guard=scheduler.assert_running)
    values = {r.value: r for r in reader.poll()}
    assert values[b"to-2"].partition == 2
    assert b"cancelled" not in values and b"v2" not in values and b"beyond" not in values
    _, reasons = rejected(rejections, source, newer, scheduler.assert_running)
    assert any("schedule_schema_version" in r and "newer" in r for r in reasons), reasons
    _, reasons = rejected(rejections, source, beyond, scheduler.assert_running)
    assert reasons == [f"destination partition 7 of topic '{out}' does not exist (it has 3 partitions)"]


# ---------------------------------------------------------------- ETF1


def test_etf1_delivery_headers_history_and_tombstone(kafka, scheduler, topics):
    source = topics["etf1"]
    out = kafka.topic("out")
    history_topic = f"{scheduler.app_id}-schedule-history"
    reader, back, history = kafka.reader(out), kafka.reader(source), kafka.reader(history_topic)
    key = f"vid-{uuid.uuid4().hex[:6]}-online".encode()
    epoch = epoch_in(3)
    headers = etf1(out, epoch, target_key=b"vid1", extra=[("customer-header", b"dummy")])
    partition, offset = kafka.produce(source, key=key, value=b"video 1", headers=headers)

    [delivered] = reader.wait_for(
        lambda r: r.value == b"video 1", timeout=WAIT, what="delivery", guard=scheduler.assert_running
    )
    assert delivered.timestamp_ms >= epoch * 1000
    assert delivered.key == b"vid1"
    [request] = [r for r in back.read_to_end() if r.offset == offset]
    assert delivered.headers == headers + [
        ("scheduler-timestamp", str(request.timestamp_ms // 1000).encode()),
        ("scheduler-key", key),
        ("scheduler-topic", source.encode()),
        ("x-scheduler-delivery-id", f"{source}-{partition}-{offset}".encode()),
    ]

    [copy] = history.wait_for(lambda r: r.value == b"video 1", timeout=WAIT, what="history copy")
    assert copy.key == b"vid1" and delivery_id(copy) == delivery_id(delivered)
    [tombstone] = back.wait_for(lambda r: r.value is None and r.key == key, timeout=WAIT, what="tombstone")
    assert tombstone.header("x-scheduler-source-offset") == str(offset).encode()


def test_etf1_null_value_cancels_and_past_epoch_is_delivered_at_once(kafka, scheduler, topics):
    source = topics["etf1"]
    out = kafka.topic("out")
    reader, rejections = kafka.reader(out), rejections_of(kafka, scheduler)
    run = uuid.uuid4().hex[:6]
    kafka.produce(source, key=f"c-{run}".encode(), value=b"cancelled", headers=etf1(out, epoch_in(4)))
    kafka.produce(source, key=f"c-{run}".encode(), value=None)
    kafka.produce(source, key=f"past-{run}".encode(), value=b"past", headers=etf1(out, epoch_in(-3600)))
    _, bad = kafka.produce(source, key=f"bad-{run}".encode(), value=b"x", headers=etf1(out, -5))
    _, no_topic = kafka.produce(source, key=f"nt-{run}".encode(), value=b"x", headers=etf1(None, epoch_in(1)))
    _, no_key = kafka.produce(source, key=None, value=b"x", headers=etf1(out, epoch_in(1)))
    kafka.produce(source, key=f"m-{run}".encode(), value=b"marker", headers=etf1(out, epoch_in(5)))

    [marker] = reader.wait_for(
        lambda r: r.value == b"marker", timeout=WAIT, what="marker", guard=scheduler.assert_running
    )
    [past] = reader.wait_for(
        lambda r: r.value == b"past", timeout=WAIT, what="past-epoch delivery", guard=scheduler.assert_running
    )
    # Not held for anything: out no later than the marker due 5 s after it was sent (however slow the batches).
    assert past.timestamp_ms <= marker.timestamp_ms, "an overdue schedule waits for nothing"
    assert b"cancelled" not in {r.value for r in reader.poll()}
    for offset, word in ((bad, "epoch"), (no_topic, "scheduler-target-topic"), (no_key, "id")):
        _, reasons = rejected(rejections, source, offset, scheduler.assert_running)
        assert any(word in r for r in reasons), (word, reasons)


# ---------------------------------------------------------------- Sky


@pytest.mark.parametrize("dialect", ["sky-avro", "sky-json"])
def test_sky_delivers_the_schedule_exactly_and_writes_back_expired(kafka, scheduler, topics, dialect):
    source = topics[dialect]
    out = kafka.topic("out")
    reader, back, rejections = kafka.reader(out), kafka.reader(source), rejections_of(kafka, scheduler)
    run = uuid.uuid4().hex[:6]
    # The tombstone that cancels one of these acts through a batch (Sky's decoder is Spark SQL): a batch may read the
    # schedule without it, and the next one must come before the due time. 3 s was too little once on a loaded CI
    # machine (the cancelled schedule went out).
    due_ms = int(time.time() * 1000) + 8000

    def schedule(key, value, headers=None, old=False):
        if dialect == "sky-json":
            return sky_json(due_ms, out, key, value, headers)
        if old:
            return avro({"time": due_ms, "topic": out, "key": key, "value": value}, SKY_OLD_SCHEMA)
        return avro({"time": due_ms, "topic": out, "key": key, "value": value, "headers": headers or {}})

    id_full, id_null = f"full-{run}".encode(), f"null-{run}".encode()
    partition, offset = kafka.produce(
        source, key=id_full, value=schedule(b"k\xff", b"v\x00" + run.encode(), {"h1": b"\x01", "h2": b""})
    )
    kafka.produce(source, key=id_null, value=schedule(b"nk-" + run.encode(), None, old=True))
    kafka.produce(source, key=f"c-{run}".encode(), value=schedule(b"ck-" + run.encode(), b"cancelled"))
    kafka.produce(source, key=f"c-{run}".encode(), value=None)
    garbage = (
        b"{not json"
        if dialect == "sky-json"
        else avro({"time": due_ms, "topic": out, "key": b"x", "value": None, "headers": {}})[:-3]
    )
    _, bad = kafka.produce(source, key=f"bad-{run}".encode(), value=garbage)

    [delivered] = reader.wait_for(
        lambda r: r.value == b"v\x00" + run.encode(), timeout=WAIT, what="delivery", guard=scheduler.assert_running
    )
    assert delivered.timestamp_ms >= due_ms and delivered.key == b"k\xff"
    assert delivered.headers == [
        ("h1", b"\x01"),
        ("h2", b""),
        ("x-scheduler-delivery-id", f"{source}-{partition}-{offset}".encode()),
    ]
    [null_value] = reader.wait_for(lambda r: r.key == b"nk-" + run.encode(), timeout=WAIT, what="null delivery")
    assert null_value.value is None, "a null value is delivered as a tombstone"
    [tombstone] = back.wait_for(lambda r: r.value is None and r.key == id_full, timeout=WAIT, what="write-back")
    assert tombstone.partition == partition
    assert tombstone.header("schedule:expired") == b"true"
    assert tombstone.header("x-scheduler-source-offset") == str(offset).encode()
    _, reasons = rejected(rejections, source, bad, scheduler.assert_running)
    assert any(("JSON" if dialect == "sky-json" else "Avro") in r for r in reasons), reasons
    # The cancelled schedule was due with the others; a marker due after it proves it is not coming.
    due_ms += 1000
    kafka.produce(source, key=f"m-{run}".encode(), value=schedule(b"marker-" + run.encode(), b"m"))
    reader.wait_for(lambda r: r.key == b"marker-" + run.encode(), timeout=WAIT, what="marker")
    assert b"ck-" + run.encode() not in {r.key for r in reader.poll()}


def test_equal_keys_in_two_inputs_are_two_schedules(kafka, scheduler, topics):
    out = kafka.topic("out")
    reader = kafka.reader(out)
    key = f"same-{uuid.uuid4().hex[:6]}".encode()
    due_ms = int(time.time() * 1000) + 3000
    kafka.produce(topics["etf1"], key=key, value=b"from etf1", headers=etf1(out, math.ceil(due_ms / 1000)))
    kafka.produce(topics["sky-json"], key=key, value=sky_json(due_ms, out, b"k", b"from sky"))
    # a cancel of that key in a third topic touches neither
    kafka.produce(topics["sky-avro"], key=key, value=None)
    records = reader.wait_for(
        lambda r: True, count=2, timeout=WAIT, what="both deliveries", guard=scheduler.assert_running
    )
    assert sorted(r.value for r in records) == [b"from etf1", b"from sky"]
