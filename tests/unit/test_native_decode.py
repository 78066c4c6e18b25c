"""The native (Kaspr-style) dialect decoder, on a real local SparkSession.

Every case is one Kafka record with a unique source offset; all cases are decoded and
collected in one go (one Spark job) and the tests look their rows up by offset.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kafka_scheduler import dialects
from kafka_scheduler.dialects.common import NORMALIZED_COLUMNS, DecodeSettings
from kafka_scheduler.engine.rules.entries import entry_bytes
from kafka_scheduler.engine.rules.schedule import Schedule
from kafka_scheduler.protocol import REJECTIONS_SID

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)

REQUESTS = "app-schedule-requests"
REJECTIONS = "app-schedule-rejections"
HISTORY = "app-schedule-history"

SETTINGS = DecodeSettings(
    rejections_topic=REJECTIONS,
    own_topics=(REQUESTS, REJECTIONS, HISTORY),
    allowed_destinations=None,
    max_value_bytes=100,
    max_ahead_ms=100 * 365 * 86_400_000,
)
ALLOW_LIST_SETTINGS = DecodeSettings(
    rejections_topic=REJECTIONS,
    own_topics=(REQUESTS, REJECTIONS, HISTORY),
    allowed_destinations="orders-.*",
    max_value_bytes=100,
    max_ahead_ms=100 * 365 * 86_400_000,
)

BASE_TS = datetime(2026, 1, 1, tzinfo=UTC)
AT = "2030-06-01T10:00:00Z"

ACT, TO, AT_H, ID = ("x-scheduler-action", "x-scheduler-deliver-to", "x-scheduler-deliver-at", "x-scheduler-request-id")


def ms(text: str) -> int:
    """Epoch milliseconds of a whole-millisecond ISO instant (reference computation in Python)."""
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int((parsed - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(milliseconds=1))


def h(name, value):
    return (name, value.encode() if isinstance(value, str) else value)


def ts_of(offset: int) -> datetime:
    return BASE_TS + timedelta(milliseconds=offset * 1000 + 7)


def ts_ms_of(offset: int) -> int:
    return ms("2026-01-01T00:00:00Z") + offset * 1000 + 7


# offset -> (key, value, headers, partition); partition 0 unless given.
CASES: dict[int, tuple] = {}


def case(offset, headers, key=b"k", value=b"v", partition=0):
    assert offset not in CASES
    CASES[offset] = (key, value, headers, partition)
    return offset


# ---------------------------------------------------------------- valid requests

ODD_KEY = b"\xff\xfe\x00key\x80"
ODD_VALUE = b"\x80\x81\xc3(\x00\xfftail"
VALID_ADD = case(
    10,
    [
        h("trace", b"\x01\xff"),
        h("X-Scheduler-Action", "ADD"),
        h("x-scheduler-deliver-to", "orders"),
        h("trace", b"\x02"),
        h("X-SCHEDULER-DELIVER-AT", "2030-01-02T03:04:05.678Z"),
        h("nullh", None),
        h("x-scheduler-REQUEST-id", "r-1"),
        h("X-Scheduler-Trace", "internal"),
        h("Content-Type", "application/octet-stream"),
    ],
    key=ODD_KEY,
    value=ODD_VALUE,
    partition=3,
)
ADD_NO_ID = case(11, [h(ACT, "ADD"), h(TO, "orders"), h(AT_H, AT)])
NO_ACTION = case(12, [h(TO, "orders"), h(AT_H, AT), h(ID, "r-12")])
REPLACE_LOWER = case(13, [h(ACT, "replace"), h(TO, "orders"), h(AT_H, AT), h(ID, "r-13")])
REPLACE_UPPER = case(14, [h(ACT, "REPLACE"), h(TO, "orders"), h(AT_H, AT), h(ID, "r-14")])
CANCEL_PADDED = case(15, [h(ACT, " Cancel "), h(ID, "r-15")], key=None, value=None)
CANCEL_UPPER = case(16, [h(ACT, "CANCEL"), h(ID, "r-16")], key=None, value=None)
PLUS_TWO = case(17, [h(TO, "orders"), h(AT_H, "2030-06-01T12:00:00+02:00")])
MINUS_FIVE_THIRTY = case(18, [h(TO, "orders"), h(AT_H, "2030-06-01T04:30:00-05:30")])
HALF_MICRO = case(19, [h(TO, "orders"), h(AT_H, "2030-06-01T10:00:00.0005Z")])
EXACT_MS = case(20, [h(TO, "orders"), h(AT_H, "2030-06-01T10:00:00.123Z")])
NANO_ABOVE = case(21, [h(TO, "orders"), h(AT_H, "2030-06-01T10:00:00.123000001Z")])
SUB_MS = case(22, [h(TO, "orders"), h(AT_H, "2030-06-01T10:00:00.1239Z")])
NULL_VALUE = case(23, [h(TO, "orders"), h(AT_H, AT), h(ID, "r-23")], value=None)
VALUE_AT_LIMIT = case(24, [h(TO, "orders"), h(AT_H, AT)], value=b"x" * 100)
WHOLE_SECOND = case(25, [h(TO, "orders"), h(AT_H, "2030-06-01T10:00:00Z")])
# Ids are bytes: any bytes, invalid UTF-8 included, are a valid id, kept exactly.
BINARY_ID = case(26, [h(TO, "orders"), h(AT_H, AT), h(ID, b"\xff\xfe\x00\x80")])
CANCEL_BINARY_ID = case(27, [h(ACT, "CANCEL"), h(ID, b"\xc3(")], key=None, value=None)

# ---------------------------------------------------------------- rejections (single error each)

MISSING_AT = case(40, [h(TO, "orders"), h(ID, "r-40")])
MISSING_TO = case(41, [h(AT_H, AT)])
REPLACE_NO_ID = case(42, [h(ACT, "REPLACE"), h(TO, "orders"), h(AT_H, AT)])
CANCEL_NO_ID = case(43, [h(ACT, "CANCEL")])
AT_TOMORROW = case(44, [h(TO, "orders"), h(AT_H, "tomorrow")])
AT_FEB_30 = case(45, [h(TO, "orders"), h(AT_H, "2026-02-30T10:00:00Z")])
AT_ZONELESS = case(46, [h(TO, "orders"), h(AT_H, "2026-05-24T12:30:00")])
UNKNOWN_ACTION = case(47, [h(ACT, "DELETE"), h(TO, "orders"), h(AT_H, AT), h(ID, "r-47")])
TO_INTERNAL = case(48, [h(TO, "__consumer_offsets"), h(AT_H, AT)])
TO_OWN_HISTORY = case(49, [h(TO, HISTORY), h(AT_H, AT)])
TO_OWN_REQUESTS = case(50, [h(TO, REQUESTS), h(AT_H, AT)])
TO_BAD_NAME = case(51, [h(TO, "a b"), h(AT_H, AT)])
TOO_FAR = case(52, [h(TO, "orders"), h(AT_H, "2300-01-01T00:00:00Z")])
TOO_LARGE = case(53, [h(TO, "orders"), h(AT_H, AT)], value=b"x" * 101)
DUPLICATE_AT = case(54, [h(TO, "orders"), h(AT_H, AT), h("X-Scheduler-Deliver-At", AT)])
TO_OWN_REJECTIONS = case(55, [h(TO, REJECTIONS), h(AT_H, AT)])
GARBAGE_ACTION = case(56, [h(ACT, b"\xff\xfeADD"), h(TO, "orders"), h(AT_H, AT)])
GARBAGE_TO = case(57, [h(TO, b"ord\xffers"), h(AT_H, AT)])
GARBAGE_AT = case(58, [h(TO, "orders"), h(AT_H, b"2030-06-01T10:00:00Z\xff")])
EMPTY_ID = case(59, [h(TO, "orders"), h(AT_H, AT), h(ID, b"")])

# ---------------------------------------------------------------- rejections (several errors)

TWO_ERRORS = case(60, [h("user", b"\x00\xff"), h(ACT, "ADD")], key=ODD_KEY, value=ODD_VALUE, partition=5)
NULL_HEADERS = case(61, None)

# ---------------------------------------------------------------- recurring schedules (Kaspr's cron actions) and expiry

EXPR, POLICY, TZ, START, END, LATE = (
    "x-scheduler-cron-expr",
    "x-scheduler-cron-missed-fire-policy",
    "x-scheduler-cron-timezone",
    "x-scheduler-cron-start-at",
    "x-scheduler-cron-end-at",
    "x-scheduler-max-lateness",
)
CRON_FULL = case(
    100,
    [
        h("trace", b"\x01"),
        h(ACT, "CRON_ADD"),
        h(TO, "orders"),
        h(ID, "c-1"),
        h(EXPR, " * * * * * */5 "),
        h(POLICY, "Skip"),
        h(TZ, "Europe/Paris"),
        h(START, "2030-01-01T00:00:00Z"),
        h(END, "2030-02-01T00:00:00+01:00"),
        h(LATE, "PT10M"),
        h("X-Scheduler-Whatever", "x"),
    ],
    key=b"ck",
    value=b"tick",
    partition=2,
)
CRON_KASPR = case(101, [h(ACT, "CRON_ADD"), h(TO, "orders"), h(ID, "c-2"), h(EXPR, "@hourly")])
CRON_WITH_AT = case(
    102,
    [
        h(ACT, "cron_add"),
        h(TO, "orders"),
        h(ID, "c-3"),
        h(EXPR, "*/5 * * * *"),
        h(AT_H, "ignored"),
        h(POLICY, "replay"),
    ],
)
CRON_PAUSE = case(103, [h(ACT, "CRON_PAUSE"), h(ID, "c-1")], key=None, value=None)
CRON_RESUME = case(104, [h(ACT, "CRON_RESUME"), h(ID, "c-1")], key=None, value=None)
CRON_CANCEL = case(105, [h(ACT, "CRON_CANCEL"), h(ID, "c-1")], key=None, value=None)
CRON_NO_ID = case(110, [h(ACT, "CRON_ADD"), h(TO, "orders"), h(EXPR, "@hourly")])
CRON_NO_EXPR = case(111, [h(ACT, "CRON_ADD"), h(TO, "orders"), h(ID, "c-11")])
CRON_NO_TO = case(112, [h(ACT, "CRON_ADD"), h(ID, "c-12"), h(EXPR, "@hourly")])
CRON_BAD_POLICY = case(
    113, [h(ACT, "CRON_ADD"), h(TO, "orders"), h(ID, "c-13"), h(EXPR, "@hourly"), h(POLICY, "later")]
)
CRON_ZONELESS_START = case(
    114, [h(ACT, "CRON_ADD"), h(TO, "orders"), h(ID, "c-14"), h(EXPR, "@hourly"), h(START, "2030-01-01T00:00:00")]
)
CRON_BAD_END = case(115, [h(ACT, "CRON_ADD"), h(TO, "orders"), h(ID, "c-15"), h(EXPR, "@hourly"), h(END, "soon")])
CRON_END_FIRST = case(
    116,
    [
        h(ACT, "CRON_ADD"),
        h(TO, "orders"),
        h(ID, "c-16"),
        h(EXPR, "@hourly"),
        h(START, "2030-01-02T00:00:00Z"),
        h(END, "2030-01-01T00:00:00Z"),
    ],
)
CRON_PAUSE_NO_ID = case(117, [h(ACT, "CRON_PAUSE")])
CRON_TWO_EXPRS = case(118, [h(ACT, "CRON_ADD"), h(TO, "orders"), h(ID, "c-18"), h(EXPR, "@hourly"), h(EXPR, "@daily")])
LATENESS = {
    "10m": 600_000,
    "1h30m": 5_400_000,
    "250ms": 250,
    "PT10M": 600_000,
    "pt0.5s": 500,
    "P1DT2H": 93_600_000,
    "60000": 60_000,
    " 2d ": 172_800_000,
    "PT1M30.25S": 90_250,
}
LATENESS_CASES = {
    case(120 + i, [h(TO, "orders"), h(AT_H, AT), h(LATE, text)]): ms_ for i, (text, ms_) in enumerate(LATENESS.items())
}
BAD_LATENESS = {
    case(140 + i, [h(TO, "orders"), h(AT_H, AT), h(LATE, text)]): text
    for i, text in enumerate(["10x", "0", "PT", "", "P", "-5m", "1.5h", "m"])
}

# ---------------------------------------------------------------- decoded with the allow-list settings

ALLOWED_ORDERS = case(90, [h(TO, "orders-1"), h(AT_H, AT)])
NOT_ALLOWED_PAYMENTS = case(91, [h(TO, "payments"), h(AT_H, AT)])
ALLOW_LIST_OFFSETS = {ALLOWED_ORDERS, NOT_ALLOWED_PAYMENTS}


def decode(rows, settings):
    return dialects.decode(rows, {REQUESTS: "native"}, settings)


def _rows(offsets):
    return [
        (key, value, REQUESTS, partition, offset, ts_of(offset), 0, headers)
        for offset, (key, value, headers, partition) in sorted(CASES.items())
        if offset in offsets
    ]


@pytest.fixture(scope="module")
def decoded(spark):
    """src_offset -> collected row (as a dict), for every case, from one collect()."""
    default_offsets = set(CASES) - ALLOW_LIST_OFFSETS
    plain = decode(spark.createDataFrame(_rows(default_offsets), KAFKA_SCHEMA), SETTINGS)
    allow_list = decode(spark.createDataFrame(_rows(ALLOW_LIST_OFFSETS), KAFKA_SCHEMA), ALLOW_LIST_SETTINGS)
    result = plain.unionByName(allow_list)
    assert tuple(result.columns) == NORMALIZED_COLUMNS
    rows = result.collect()
    by_offset = {row["src_offset"]: row.asDict(recursive=True) for row in rows}
    assert len(rows) == len(CASES) == len(by_offset)
    return by_offset


def blob(value):
    return None if value is None else bytes(value)


def headers_of(row):
    return [(hd["key"], blob(hd["value"])) for hd in row["headers"]]


def expect_request(row, action, sid=None):
    assert row["kind"] == "request", row
    assert row["action"] == action
    if sid is not None:
        assert row["sid"] == sid


def reasons_of(row):
    return [blob(v).decode() for k, v in headers_of(row) if k == "x-scheduler-rejection-reason"]


def expect_rejection(row, offset, *fragments):
    """A rejection carrying exactly one reason per fragment, each containing that fragment."""
    key, value, headers, partition = CASES[offset]
    assert row["kind"] == "reject", row
    assert row["sid"] == REJECTIONS_SID
    assert row["topic"] == REJECTIONS
    assert row["due_ms"] is None
    assert blob(row["key"]) == key
    assert blob(row["value"]) == value
    reasons = reasons_of(row)
    assert len(reasons) == len(fragments), reasons
    for fragment in fragments:
        assert any(fragment in reason for reason in reasons), (fragment, reasons)
    assert headers_of(row) == (
        list(headers or [])
        + [("x-scheduler-rejection-reason", r.encode()) for r in reasons]
        + [
            ("x-scheduler-source-topic", REQUESTS.encode()),
            ("x-scheduler-source-partition", str(partition).encode()),
            ("x-scheduler-source-offset", str(offset).encode()),
        ]
    )
    assert row["delivery_id"] == f"{REQUESTS}-{partition}-{offset}"
    assert (row["src_topic"], row["src_partition"], row["src_offset"]) == (REQUESTS, partition, offset)
    assert row["src_ts_ms"] == ts_ms_of(offset)
    return reasons


# ---------------------------------------------------------------- valid requests


def test_valid_add_with_id_is_decoded_exactly(decoded):
    row = decoded[VALID_ADD]
    assert row == {
        "sid": f"id:{REQUESTS}/r-1".encode(),
        "kind": "request",
        "action": "ADD",
        "due_ms": ms("2030-01-02T03:04:05.678Z"),
        "topic": "orders",
        "key": row["key"],
        "value": row["value"],
        "headers": row["headers"],
        "delivery_id": f"{REQUESTS}-3-{VALID_ADD}",
        "src_topic": REQUESTS,
        "src_partition": 3,
        "src_offset": VALID_ADD,
        "src_ts_ms": ts_ms_of(VALID_ADD),
        "entry_bytes": row["entry_bytes"],
        # native has no write-back, partition choice or completion
        "completes": None,
        "partition": None,
        "partition_key": None,
        "wb_topic": None,
        "wb_partition": None,
        "wb_key": None,
        "wb_headers": None,
        "history": False,
        # no expiry, not a cron
        "max_lateness_ms": None,
        "cron_expr": None,
        "cron_tz": None,
        "cron_policy": None,
        "cron_start_ms": None,
        "cron_end_ms": None,
        "raw_headers": None,
    }
    assert row["due_ms"] == 1893553445678
    assert blob(row["key"]) == ODD_KEY
    assert blob(row["value"]) == ODD_VALUE
    # every x-scheduler-* header is gone (whatever its case); the others stay, in order, duplicates and
    # null values included
    assert headers_of(row) == [
        ("trace", b"\x01\xff"),
        ("trace", b"\x02"),
        ("nullh", None),
        ("Content-Type", b"application/octet-stream"),
    ]
    # The decoder's size estimate is the one the Spark-free layer computes.
    assert row["entry_bytes"] == entry_bytes(
        Schedule(row["due_ms"], "orders", ODD_KEY, ODD_VALUE, tuple(headers_of(row)), row["delivery_id"])
    )


def test_binary_request_ids_are_valid_ids_kept_byte_exact(decoded):
    expect_request(decoded[BINARY_ID], "ADD", sid=REQUESTS.encode().join([b"id:", b"/\xff\xfe\x00\x80"]))
    expect_request(decoded[CANCEL_BINARY_ID], "CANCEL", sid=REQUESTS.encode().join([b"id:", b"/\xc3("]))


def test_add_without_id_gets_an_offset_sid(decoded):
    row = decoded[ADD_NO_ID]
    expect_request(row, "ADD", sid=f"offset:{REQUESTS}/0/{ADD_NO_ID}".encode())
    assert row["topic"] == "orders"
    assert row["due_ms"] == ms(AT)
    assert headers_of(row) == []
    assert row["delivery_id"] == f"{REQUESTS}-0-{ADD_NO_ID}"


def test_missing_action_defaults_to_add(decoded):
    row = decoded[NO_ACTION]
    expect_request(row, "ADD", sid=f"id:{REQUESTS}/r-12".encode())
    assert (row["topic"], row["due_ms"]) == ("orders", ms(AT))


@pytest.mark.parametrize("offset,rid", [(REPLACE_LOWER, "r-13"), (REPLACE_UPPER, "r-14")])
def test_replace_any_case(decoded, offset, rid):
    row = decoded[offset]
    expect_request(row, "REPLACE", sid=f"id:{REQUESTS}/{rid}".encode())
    assert (row["topic"], row["due_ms"]) == ("orders", ms(AT))
    assert blob(row["key"]) == b"k" and blob(row["value"]) == b"v"
    assert headers_of(row) == []


@pytest.mark.parametrize("offset,rid", [(CANCEL_PADDED, "r-15"), (CANCEL_UPPER, "r-16")])
def test_cancel_any_case_and_padding(decoded, offset, rid):
    row = decoded[offset]
    expect_request(row, "CANCEL", sid=f"id:{REQUESTS}/{rid}".encode())
    assert row["due_ms"] is None
    assert row["delivery_id"] == f"{REQUESTS}-0-{offset}"


@pytest.mark.parametrize(
    "offset,utc",
    [
        (PLUS_TWO, "2030-06-01T10:00:00Z"),
        (MINUS_FIVE_THIRTY, "2030-06-01T10:00:00Z"),
        (WHOLE_SECOND, "2030-06-01T10:00:00Z"),
        (EXACT_MS, "2030-06-01T10:00:00.123Z"),
    ],
)
def test_due_time_is_exact_utc_millis(decoded, offset, utc):
    row = decoded[offset]
    expect_request(row, "ADD")
    assert row["due_ms"] == ms(utc)


@pytest.mark.parametrize(
    "offset,utc",
    [
        (HALF_MICRO, "2030-06-01T10:00:00.001Z"),  # .0005 -> up to the next millisecond
        (NANO_ABOVE, "2030-06-01T10:00:00.124Z"),  # .123000001 -> .124
        (SUB_MS, "2030-06-01T10:00:00.124Z"),  # .1239 -> .124
    ],
)
def test_fractional_due_time_rounds_up(decoded, offset, utc):
    row = decoded[offset]
    expect_request(row, "ADD")
    assert row["due_ms"] == ms(utc)


def test_null_value_stays_null(decoded):
    row = decoded[NULL_VALUE]
    expect_request(row, "ADD", sid=f"id:{REQUESTS}/r-23".encode())
    assert row["value"] is None
    assert blob(row["key"]) == b"k"


def test_value_at_the_limit_is_accepted(decoded):
    row = decoded[VALUE_AT_LIMIT]
    expect_request(row, "ADD")
    assert blob(row["value"]) == b"x" * 100


# ---------------------------------------------------------------- rejections


@pytest.mark.parametrize(
    "offset,fragment",
    [
        (MISSING_AT, "missing x-scheduler-deliver-at"),
        (MISSING_TO, "missing x-scheduler-deliver-to"),
        (REPLACE_NO_ID, "missing x-scheduler-request-id"),
        (CANCEL_NO_ID, "missing x-scheduler-request-id"),
        (AT_TOMORROW, "unparseable"),
        (AT_FEB_30, "unparseable"),
        (AT_ZONELESS, "no time zone"),
        (UNKNOWN_ACTION, "unknown x-scheduler-action"),
        (TO_INTERNAL, "is not allowed"),
        (TO_OWN_HISTORY, "is not allowed"),
        (TO_OWN_REQUESTS, "is not allowed"),
        (TO_OWN_REJECTIONS, "is not allowed"),
        (TO_BAD_NAME, "invalid destination topic name"),
        (TOO_FAR, "days ahead"),
        (TOO_LARGE, "too large"),
        (DUPLICATE_AT, "duplicate header"),
        (GARBAGE_ACTION, "unknown x-scheduler-action"),
        (GARBAGE_TO, "invalid destination topic name"),
        (GARBAGE_AT, "unparseable"),
        (EMPTY_ID, "empty x-scheduler-request-id"),
    ],
    ids=[
        "missing-at",
        "missing-to",
        "replace-no-id",
        "cancel-no-id",
        "tomorrow",
        "feb-30",
        "zoneless",
        "unknown-action",
        "internal-topic",
        "own-history",
        "own-requests",
        "own-rejections",
        "bad-name",
        "too-far",
        "too-large",
        "duplicate-at",
        "garbage-action",
        "garbage-to",
        "garbage-at",
        "empty-id",
    ],
)
def test_single_error_rejection(decoded, offset, fragment):
    expect_rejection(decoded[offset], offset, fragment)


def test_rejection_reasons_name_the_input(decoded):
    assert "'tomorrow'" in reasons_of(decoded[AT_TOMORROW])[0]
    assert "'2026-05-24T12:30:00'" in reasons_of(decoded[AT_ZONELESS])[0]
    assert "'DELETE'" in reasons_of(decoded[UNKNOWN_ACTION])[0]
    assert "'__consumer_offsets'" in reasons_of(decoded[TO_INTERNAL])[0]
    assert "101" in reasons_of(decoded[TOO_LARGE])[0]
    assert "x-scheduler-deliver-at" in reasons_of(decoded[DUPLICATE_AT])[0]


def test_reasons_quoting_invalid_utf8_input_are_valid_utf8(decoded):
    # The invalid bytes show as U+FFFD; the reason header itself is always readable text.
    assert "'\ufffd\ufffdADD'" in reasons_of(decoded[GARBAGE_ACTION])[0]
    assert "'ord\ufffders'" in reasons_of(decoded[GARBAGE_TO])[0]


def test_two_errors_give_two_reason_headers(decoded):
    reasons = expect_rejection(
        decoded[TWO_ERRORS], TWO_ERRORS, "missing x-scheduler-deliver-to", "missing x-scheduler-deliver-at"
    )
    assert len(reasons) == 2
    assert blob(decoded[TWO_ERRORS]["key"]) == ODD_KEY
    assert headers_of(decoded[TWO_ERRORS])[:2] == [("user", b"\x00\xff"), (ACT, b"ADD")]


def test_record_without_headers_is_rejected(decoded):
    expect_rejection(
        decoded[NULL_HEADERS], NULL_HEADERS, "missing x-scheduler-deliver-to", "missing x-scheduler-deliver-at"
    )


def test_every_case_has_exactly_one_outcome(decoded):
    kinds = {offset: row["kind"] for offset, row in decoded.items()}
    assert set(kinds.values()) == {"request", "reject"}
    assert all(row["action"] is None for row in decoded.values() if row["kind"] == "reject")
    assert all(row["sid"] != REJECTIONS_SID for row in decoded.values() if row["kind"] == "request")


# ---------------------------------------------------------------- allow-list


def test_allow_list_accepts_a_matching_topic(decoded):
    row = decoded[ALLOWED_ORDERS]
    expect_request(row, "ADD")
    assert row["topic"] == "orders-1"


def test_allow_list_rejects_others(decoded):
    reasons = expect_rejection(decoded[NOT_ALLOWED_PAYMENTS], NOT_ALLOWED_PAYMENTS, "not allowed")
    assert "'payments'" in reasons[0]


# ---------------------------------------------------------------- recurring schedules and expiry


def test_cron_add_is_decoded_with_its_definition_and_its_headers_as_read(decoded):
    row = decoded[CRON_FULL]
    expect_request(row, "CRON_ADD", sid=f"cron:{REQUESTS}/c-1".encode())
    assert row["topic"] == "orders" and row["due_ms"] is None
    assert (row["cron_expr"], row["cron_tz"], row["cron_policy"]) == ("* * * * * */5", "Europe/Paris", "skip")
    assert (row["cron_start_ms"], row["cron_end_ms"]) == (ms("2030-01-01T00:00:00Z"), ms("2030-01-31T23:00:00Z"))
    assert row["max_lateness_ms"] == 600_000
    assert blob(row["key"]) == b"ck" and blob(row["value"]) == b"tick"
    assert headers_of(row) == [("trace", b"\x01")]  # every x-scheduler-* header stripped
    _key, _value, headers, _partition = CASES[CRON_FULL]
    assert [(hd["key"], blob(hd["value"])) for hd in row["raw_headers"]] == headers  # for a rejection by the rules
    assert row["delivery_id"] == f"{REQUESTS}-2-{CRON_FULL}"
    # The size estimate counts the expression and the zone, as the Spark-free layer does.
    from kafka_scheduler.engine.rules.schedule import Cron

    assert row["entry_bytes"] == entry_bytes(
        Schedule(0, "orders", b"ck", b"tick", (("trace", b"\x01"),), "", cron=Cron("* * * * * */5", "Europe/Paris"))
    )


def test_a_kaspr_cron_add_defaults_to_replay_in_utc_and_ignores_deliver_at(decoded):
    row = decoded[CRON_KASPR]
    expect_request(row, "CRON_ADD", sid=f"cron:{REQUESTS}/c-2".encode())
    assert (
        row["cron_expr"],
        row["cron_tz"],
        row["cron_policy"],
        row["cron_start_ms"],
        row["cron_end_ms"],
        row["max_lateness_ms"],
    ) == ("@hourly", None, "replay", None, None, None)
    row = decoded[CRON_WITH_AT]
    expect_request(row, "CRON_ADD", sid=f"cron:{REQUESTS}/c-3".encode())
    assert row["due_ms"] is None and row["cron_policy"] == "replay"


@pytest.mark.parametrize(
    "offset,action", [(CRON_PAUSE, "CRON_PAUSE"), (CRON_RESUME, "CRON_RESUME"), (CRON_CANCEL, "CRON_CANCEL")]
)
def test_pause_resume_and_cancel_of_a_cron_name_its_id_in_the_cron_id_space(decoded, offset, action):
    row = decoded[offset]
    expect_request(row, action, sid=f"cron:{REQUESTS}/c-1".encode())
    assert row["cron_expr"] is None and row["raw_headers"] is None and row["topic"] is None


@pytest.mark.parametrize(
    "offset,fragment",
    [
        (CRON_NO_ID, "missing x-scheduler-request-id"),
        (CRON_NO_EXPR, "missing x-scheduler-cron-expr"),
        (CRON_NO_TO, "missing x-scheduler-deliver-to"),
        (CRON_BAD_POLICY, "invalid x-scheduler-cron-missed-fire-policy 'later' (expected replay or skip)"),
        (CRON_ZONELESS_START, "x-scheduler-cron-start-at '2030-01-01T00:00:00' has no time zone"),
        (CRON_BAD_END, "unparseable x-scheduler-cron-end-at 'soon'"),
        (CRON_END_FIRST, "x-scheduler-cron-end-at is before x-scheduler-cron-start-at"),
        (CRON_PAUSE_NO_ID, "missing x-scheduler-request-id"),
        (CRON_TWO_EXPRS, "duplicate header x-scheduler-cron-expr"),
    ],
    ids=[
        "no-id",
        "no-expr",
        "no-to",
        "bad-policy",
        "zoneless-start",
        "bad-end",
        "end-first",
        "pause-no-id",
        "two-exprs",
    ],
)
def test_bad_cron_requests_are_rejected_with_a_reason(decoded, offset, fragment):
    expect_rejection(decoded[offset], offset, fragment)


def test_max_lateness_takes_durations_iso_8601_and_milliseconds(decoded):
    for offset, expected in LATENESS_CASES.items():
        row = decoded[offset]
        expect_request(row, "ADD")
        assert row["max_lateness_ms"] == expected, CASES[offset]


def test_a_bad_max_lateness_is_rejected(decoded):
    for offset, text in BAD_LATENESS.items():
        reasons = expect_rejection(decoded[offset], offset, "invalid x-scheduler-max-lateness")
        assert f"'{text}'" in reasons[0]


def test_unknown_actions_name_the_cron_actions_too(decoded):
    assert reasons_of(decoded[UNKNOWN_ACTION]) == [
        "unknown x-scheduler-action 'DELETE' (expected ADD, REPLACE, CANCEL, CRON_ADD, CRON_PAUSE, CRON_RESUME or "
        "CRON_CANCEL)"
    ]
