"""The request encoders of every dialect, decoded back independently (no Kafka, no Spark)."""

from __future__ import annotations

import base64
import io
import json
from datetime import UTC, datetime, timedelta, timezone

import fastavro
import pytest

from kafka_scheduler.client.encoders import DIALECTS, RequestError, effective_due, encode
from kafka_scheduler.client.scheduler_client import request_headers

UTC = UTC
DUE = datetime(2026, 5, 24, 12, 30, 0, 250000, tzinfo=UTC)  # Unix 1779625800.25
DUE_S = 1779625800
NON_NATIVE = [d for d in DIALECTS if d != "native"]

# The contract's Sky writer schema, written out here rather than imported: the test decodes on its own.
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
SKY_SCHEMA_WITHOUT_HEADERS = fastavro.parse_schema(
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


def schedule(dialect, action="schedule", **overrides):
    args = dict(
        request_id="r-1",
        topic="orders",
        due=DUE,
        key=b"user-42",
        value=b"\x00payload\xff",
        headers=[("trace", "abc"), ("raw", b"\xff\x00")],
    )
    args.update(overrides)
    return encode(dialect, action, **args)


def read_avro(value: bytes) -> dict:
    stream = io.BytesIO(value)
    record = fastavro.schemaless_reader(stream, SKY_SCHEMA)
    assert stream.read() == b"", "trailing bytes after the Avro record"
    return record


def read_json(value: bytes) -> dict:
    document = json.loads(value.decode("utf-8"))
    return {
        "time": document["time"],
        "topic": document["topic"],
        "key": base64.b64decode(document["key"], validate=True),
        "value": None if document["value"] is None else base64.b64decode(document["value"], validate=True),
        "headers": {name: base64.b64decode(v, validate=True) for name, v in document["headers"].items()},
    }


# ---------------------------------------------------------------- karafka


def test_karafka_schedule():
    key, value, headers = schedule("karafka", target_partition=3, partition_key="tenant-7")
    assert key == b"r-1"
    assert value == b"\x00payload\xff"
    assert headers == [
        ("schedule_schema_version", b"1.0.0"),
        ("schedule_source_type", b"schedule"),
        ("schedule_target_epoch", str(DUE_S + 1).encode()),  # .25 s rounded up
        ("schedule_target_topic", b"orders"),
        ("schedule_target_key", b"user-42"),
        ("schedule_target_partition", b"3"),
        ("schedule_target_partition_key", b"tenant-7"),
        ("trace", b"abc"),
        ("raw", b"\xff\x00"),
    ]


def test_karafka_schedule_without_key_or_partition():
    _, value, headers = schedule("karafka", key=None, value=None, headers=[])
    names = [name for name, _ in headers]
    assert names == [
        "schedule_schema_version",
        "schedule_source_type",
        "schedule_target_epoch",
        "schedule_target_topic",
    ]
    assert value is None


def test_karafka_replace_is_the_same_record_as_schedule():
    assert schedule("karafka", "replace") == schedule("karafka", "schedule") == schedule("karafka", "ADD")


def test_karafka_cancel():
    key, value, headers = encode("karafka", "cancel", request_id="r-1")
    assert (key, value) == (b"r-1", None)
    assert dict(headers) == {"schedule_schema_version": b"1.0.0", "schedule_source_type": b"cancel"}
    assert len(headers) == 2


@pytest.mark.parametrize("partition", [-1, "2", 1.5, True])
def test_karafka_bad_partition(partition):
    with pytest.raises(RequestError, match="partition"):
        schedule("karafka", target_partition=partition)


def test_karafka_partition_zero_is_kept():
    assert ("schedule_target_partition", b"0") in schedule("karafka", target_partition=0).headers


# ---------------------------------------------------------------- rounding


@pytest.mark.parametrize(
    "due,seconds",
    [
        (datetime(2026, 5, 24, 12, 30, tzinfo=UTC), DUE_S),
        (datetime(2026, 5, 24, 12, 30, 0, 1, tzinfo=UTC), DUE_S + 1),
        (datetime(2026, 5, 24, 12, 30, 0, 999999, tzinfo=UTC), DUE_S + 1),
        (datetime(2026, 5, 24, 12, 30, 1, tzinfo=UTC), DUE_S + 1),
        (datetime(2026, 5, 24, 14, 30, 0, 1, tzinfo=timezone(timedelta(hours=2))), DUE_S + 1),
        (datetime(1970, 1, 1, tzinfo=UTC), 0),
    ],
)
def test_second_dialects_round_up_to_the_second(due, seconds):
    karafka = dict(schedule("karafka", due=due).headers)
    etf1 = dict(schedule("etf1", due=due).headers)
    assert karafka["schedule_target_epoch"] == etf1["scheduler-epoch"] == str(seconds).encode()
    assert effective_due("karafka", due) == effective_due("etf1", due) == datetime.fromtimestamp(seconds, UTC)
    assert effective_due("karafka", due) >= due


@pytest.mark.parametrize(
    "due,millis",
    [
        (datetime(2026, 5, 24, 12, 30, tzinfo=UTC), DUE_S * 1000),
        (datetime(2026, 5, 24, 12, 30, 0, 1, tzinfo=UTC), DUE_S * 1000 + 1),
        (datetime(2026, 5, 24, 12, 30, 0, 1000, tzinfo=UTC), DUE_S * 1000 + 1),
        (datetime(2026, 5, 24, 12, 30, 0, 1001, tzinfo=UTC), DUE_S * 1000 + 2),
    ],
)
def test_sky_rounds_up_to_the_millisecond(due, millis):
    assert read_avro(schedule("sky-avro", due=due).value)["time"] == millis
    assert read_json(schedule("sky-json", due=due).value)["time"] == millis
    assert effective_due("sky-avro", due) == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis)


@pytest.mark.parametrize("dialect", NON_NATIVE)
def test_due_before_1970_is_rejected(dialect):
    with pytest.raises(RequestError, match="1970"):
        schedule(dialect, due=datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC))


# ---------------------------------------------------------------- etf1


def test_etf1_schedule():
    key, value, headers = schedule("etf1")
    assert key == b"r-1"
    assert value == b"\x00payload\xff"
    assert headers == [
        ("scheduler-epoch", str(DUE_S + 1).encode()),
        ("scheduler-target-topic", b"orders"),
        ("scheduler-target-key", b"user-42"),
        ("trace", b"abc"),
        ("raw", b"\xff\x00"),
    ]


def test_etf1_without_key_has_no_target_key():
    assert "scheduler-target-key" not in dict(schedule("etf1", key=None).headers)


def test_etf1_cancel_is_a_bare_tombstone():
    assert encode("etf1", "cancel", request_id="r-1") == (b"r-1", None, [])


def test_etf1_cannot_schedule_a_null_value():
    with pytest.raises(RequestError, match="null value"):
        schedule("etf1", value=None)


def test_etf1_empty_value_is_fine():
    assert schedule("etf1", value=b"").value == b""


def test_etf1_replace_is_the_same_record_as_schedule():
    assert schedule("etf1", "REPLACE") == schedule("etf1")


# ---------------------------------------------------------------- sky


def test_sky_avro_schedule():
    key, value, headers = schedule("sky-avro")
    assert key == b"r-1"
    assert headers == []
    assert not value.startswith(b"\x00\x00\x00\x00")  # no registry magic byte and id
    assert read_avro(value) == {
        "time": DUE_S * 1000 + 250,
        "topic": "orders",
        "key": b"user-42",
        "value": b"\x00payload\xff",
        "headers": {"trace": b"abc", "raw": b"\xff\x00"},
    }


def test_sky_avro_decodes_with_the_older_schema_too():
    record = fastavro.schemaless_reader(
        io.BytesIO(schedule("sky-avro", headers=[]).value), SKY_SCHEMA, SKY_SCHEMA_WITHOUT_HEADERS
    )
    assert record == {"time": DUE_S * 1000 + 250, "topic": "orders", "key": b"user-42", "value": b"\x00payload\xff"}


def test_sky_avro_without_key_or_value():
    record = read_avro(schedule("sky-avro", key=None, value=None, headers=[]).value)
    assert record["key"] == b""
    assert record["value"] is None
    assert record["headers"] == {}


def test_sky_json_schedule():
    key, value, headers = schedule("sky-json")
    assert key == b"r-1"
    assert headers == []
    document = json.loads(value)
    assert set(document) == {"time", "topic", "key", "value", "headers"}
    assert isinstance(document["time"], int)
    assert document["key"] == base64.b64encode(b"user-42").decode()
    assert read_json(value) == {
        "time": DUE_S * 1000 + 250,
        "topic": "orders",
        "key": b"user-42",
        "value": b"\x00payload\xff",
        "headers": {"trace": b"abc", "raw": b"\xff\x00"},
    }


def test_sky_json_null_value_and_no_key():
    document = json.loads(schedule("sky-json", key=None, value=None, headers=[]).value)
    assert document["value"] is None
    assert document["key"] == ""
    assert document["headers"] == {}


def test_sky_json_is_utf8():
    value = schedule("sky-json", headers=[("café", "1")]).value
    assert "café".encode() in value
    assert read_json(value)["headers"] == {"café": b"1"}


@pytest.mark.parametrize("dialect", ["sky-avro", "sky-json"])
def test_sky_cancel_is_a_bare_tombstone(dialect):
    assert encode(dialect, "cancel", request_id="r-1") == (b"r-1", None, [])


@pytest.mark.parametrize("dialect", ["sky-avro", "sky-json"])
def test_sky_replace_is_the_same_record_as_schedule(dialect):
    assert schedule(dialect, "replace") == schedule(dialect)


@pytest.mark.parametrize("dialect", ["sky-avro", "sky-json"])
def test_sky_header_map_limits(dialect):
    with pytest.raises(RequestError, match="null header value"):
        schedule(dialect, headers=[("a", None)])
    with pytest.raises(RequestError, match="twice"):
        schedule(dialect, headers=[("a", "1"), ("a", "2")])


# ---------------------------------------------------------------- rules shared by the dialects


@pytest.mark.parametrize("dialect", NON_NATIVE)
@pytest.mark.parametrize("action", ["schedule", "replace", "cancel"])
def test_non_native_dialects_need_a_request_id(dialect, action):
    with pytest.raises(RequestError, match="request id is required.*record key"):
        schedule(dialect, action, request_id=None)
    with pytest.raises(RequestError, match="empty"):
        schedule(dialect, action, request_id="")


@pytest.mark.parametrize(
    "dialect,name",
    [
        ("native", "X-Scheduler-Action"),
        ("karafka", "schedule_target_topic"),
        ("karafka", "Schedule_Anything"),
        ("karafka", "x-scheduler-source-offset"),
        ("etf1", "scheduler-epoch"),
        ("etf1", "SCHEDULER-KEY"),
        ("etf1", "x-scheduler-delivery-id"),
        ("sky-avro", "x-scheduler-delivery-id"),
        ("sky-json", "x-scheduler-source-offset"),
    ],
)
def test_reserved_header_names(dialect, name):
    with pytest.raises(RequestError, match=f"header '{name}'.*reserved"):
        schedule(dialect, headers=[("ok", "1"), (name, "x")])


@pytest.mark.parametrize(
    "dialect,name",
    [
        ("karafka", "scheduler-epoch"),
        ("karafka", "schedule-note"),
        ("etf1", "schedule_target_topic"),
        ("etf1", "my-scheduler-note"),
        ("sky-json", "schedule_target_topic"),
        ("sky-avro", "scheduler-epoch"),
    ],
)
def test_other_dialects_prefixes_are_plain_headers(dialect, name):
    record = schedule(dialect, headers=[(name, "x")])
    if dialect.startswith("sky"):
        decoded = read_avro(record.value) if dialect == "sky-avro" else read_json(record.value)
        assert decoded["headers"] == {name: b"x"}
    else:
        assert record.headers[-1] == (name, b"x")


@pytest.mark.parametrize("dialect", ["native", "etf1", "sky-avro", "sky-json"])
def test_partition_options_are_karafka_only(dialect):
    with pytest.raises(RequestError, match="only supported by the karafka dialect"):
        schedule(dialect, target_partition=1)
    with pytest.raises(RequestError, match="only supported by the karafka dialect"):
        schedule(dialect, partition_key="k")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_schedule_needs_a_topic_and_a_due_time(dialect):
    with pytest.raises(RequestError, match="destination topic"):
        schedule(dialect, topic=None)
    with pytest.raises(RequestError, match="due time"):
        schedule(dialect, due=None)


def test_unknown_dialect_and_action():
    with pytest.raises(RequestError, match="unknown dialect 'kaspr'"):
        schedule("kaspr")
    with pytest.raises(RequestError, match="unknown action 'DELETE'"):
        schedule("karafka", "DELETE")


def test_native_encoding_is_the_native_request():
    key, value, headers = schedule("native", "REPLACE")
    assert (key, value) == (b"user-42", b"\x00payload\xff")
    assert headers == request_headers("REPLACE", "orders", DUE, "r-1", [("trace", "abc"), ("raw", b"\xff\x00")])
    assert encode("native", "cancel", request_id="r-1") == (None, None, request_headers("CANCEL", request_id="r-1"))
    assert schedule("native", request_id=None).headers[-1] == ("x-scheduler-deliver-at", b"2026-05-24T12:30:00.250Z")
    with pytest.raises(RequestError, match="replace needs the request id"):
        schedule("native", "replace", request_id=None)
