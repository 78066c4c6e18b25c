"""The Karafka, ETF1 and Sky (Avro, JSON) dialect decoders, on a real local SparkSession.

Every case is one Kafka record with a unique offset in its dialect's topic; each dialect's records are
one Kafka-shaped DataFrame, decoded alone, and all of them (plus the native test's records and a record
of a topic no input names) are decoded once more together, in one ``dialects.decode`` with every topic.
Everything is collected in one go; the tests look rows up by topic and offset. The records are built
by hand: raw headers, Avro with fastavro (or byte by byte where fastavro refuses), JSON text.
"""

from __future__ import annotations

import base64
import io
import json
from datetime import UTC, datetime, timedelta

import fastavro
import pytest
from pyspark.sql import functions as F

from kafka_scheduler import dialects
from kafka_scheduler.dialects.common import NORMALIZED_COLUMNS, DecodeSettings
from kafka_scheduler.protocol import ENTRY_OVERHEAD_BYTES, REJECTIONS_SID

from . import test_native_decode as native_cases

KAFKA_SCHEMA = native_cases.KAFKA_SCHEMA
NATIVE = native_cases.REQUESTS
REJECTIONS = native_cases.REJECTIONS
HISTORY = native_cases.HISTORY
KARAFKA, ETF1, SKY_AVRO, SKY_JSON = "karafka-schedules", "etf1-schedules", "sky-avro-schedules", "sky-json-schedules"
DIALECT_OF = {KARAFKA: "karafka", ETF1: "etf1", SKY_AVRO: "sky-avro", SKY_JSON: "sky-json"}
STRAY = "nobody-reads-this"

# Input topics are never destinations: they are among the app's own topics.
SETTINGS = DecodeSettings(
    rejections_topic=REJECTIONS,
    own_topics=(NATIVE, REJECTIONS, HISTORY, *DIALECT_OF),
    allowed_destinations=None,
    max_value_bytes=100,
    max_ahead_ms=100 * 365 * 86_400_000,
)

EPOCH_S = 1893456000  # 2030-01-01T00:00:00Z
EPOCH_MS = EPOCH_S * 1000
ODD_KEY = b"\xff\xfe\x00key\x80"
ODD_VALUE = b"\x80\x81\xc3(\x00\xfftail"


def ts_of(offset: int) -> datetime:
    return native_cases.ts_of(offset)


def seconds_of(offset: int) -> int:
    """The record timestamp in whole Unix seconds (ts_of adds 7 ms to a whole second)."""
    return int((ts_of(offset) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(seconds=1))


def h(name, value):
    return (name, value.encode() if isinstance(value, str) else value)


# topic -> offset -> (key, value, headers, partition)
CASES: dict[str, dict[int, tuple]] = {topic: {} for topic in DIALECT_OF}


def case(topic, offset, headers, key=b"id-1", value=b"payload", partition=0):
    assert offset not in CASES[topic]
    CASES[topic][offset] = (key, value, headers, partition)
    return offset


# ================================================================ Karafka

V, T, EP, TT, TK, TP, TPK = (
    "schedule_schema_version",
    "schedule_source_type",
    "schedule_target_epoch",
    "schedule_target_topic",
    "schedule_target_key",
    "schedule_target_partition",
    "schedule_target_partition_key",
)
SRC_OFF, OURS = "schedule_source_offset", "x-scheduler-source-offset"


def karafka(offset, headers, **kwargs):
    return case(KARAFKA, offset, headers, **kwargs)


def k_schedule(epoch="1893456000", topic="orders", *extra, version="1.0.0"):
    return [h(V, version), h(T, "schedule"), h(EP, epoch), h(TT, topic), *extra]


K_VALID_HEADERS = [
    h("trace", b"\x01\xff"),
    h(V, "1.0.0"),
    h(EP, "1893456000.0015"),
    h(T, "schedule"),
    h(TT, "orders"),
    h(TK, b"\x00tk\xff"),
    h(TPK, b"pk"),
    h("nullh", None),
]
K_VALID = karafka(100, K_VALID_HEADERS, key=ODD_KEY, value=ODD_VALUE, partition=2)
K_EXPLICIT_PARTITION = karafka(101, k_schedule("1893456000", "orders", h(TP, "3"), h(TPK, b"pk")))
K_WHOLE_SECONDS = karafka(102, k_schedule("1893456000"))
K_EXACT_MS = karafka(103, k_schedule("1893456000.123"))
K_SUB_MS = karafka(104, k_schedule("1893456000.1231"))
K_TINY = karafka(105, k_schedule("0.0001"))
K_HALF = karafka(106, k_schedule("1893456000.5"))
K_MAJOR_ONLY = karafka(107, k_schedule(version="1"))
K_MINOR = karafka(108, k_schedule(version="1.2"))
K_STALE_OFFSETS = karafka(
    109,
    [h(V, "1.0.0"), h(T, "schedule"), h(SRC_OFF, "5"), h(EP, "1893456000"), h(OURS, "6"), h(TT, "orders")],
    partition=1,
)
K_NAME_CASE = karafka(
    110,
    [
        h("Schedule_Schema_Version", "1.0.0"),
        h("SCHEDULE_SOURCE_TYPE", "schedule"),
        h("Schedule_Target_Epoch", "1893456000"),
        h("schedule_TARGET_topic", "orders"),
    ],
)
K_BINARY_KEY = karafka(111, k_schedule(), key=b"\xc3(\x00\xff")
K_NULL_PAYLOAD = karafka(112, k_schedule(), value=None)
K_CANCEL = karafka(120, [h(V, "1.0.0"), h(T, "cancel")], value=None, partition=2)
# Our write-back for K_VALID, written out by hand: the envelope headers with the type set to tombstone,
# then Karafka's and our offset headers.
K_OUR_WRITE_BACK = karafka(
    121,
    [
        h("trace", b"\x01\xff"),
        h(V, "1.0.0"),
        h(EP, "1893456000.0015"),
        h(T, "tombstone"),
        h(TT, "orders"),
        h(TK, b"\x00tk\xff"),
        h(TPK, b"pk"),
        h("nullh", None),
        h(SRC_OFF, "100"),
        h(OURS, "100"),
    ],
    key=ODD_KEY,
    value=None,
    partition=2,
)
K_OURS_WINS = karafka(122, [h(V, "1.0.0"), h(T, "tombstone"), h(SRC_OFF, "9"), h(OURS, "7")], value=None)
K_KARAFKA_TOMBSTONE = karafka(123, [h(V, "1.0.0"), h(T, "tombstone"), h(TT, "orders"), h(SRC_OFF, "42")], value=None)
K_BARE_TOMBSTONE = karafka(124, [h(V, "1.0.0"), h(T, "tombstone")], value=None)
K_LEADING_ZEROS = karafka(125, [h(V, "1.0.0"), h(T, "tombstone"), h(OURS, "007")], value=None)

K_NO_KEY = karafka(140, k_schedule(), key=None)
K_EMPTY_KEY = karafka(141, k_schedule(), key=b"")
K_NO_VERSION = karafka(142, [h(T, "schedule"), h(EP, "1893456000"), h(TT, "orders")])
K_NEWER = karafka(143, k_schedule(version="2.0.0"))
K_MUCH_NEWER = karafka(144, k_schedule(version="123456789012345678901234567890"))
K_OLDER = karafka(145, k_schedule(version="0.9"))
K_BAD_VERSION = karafka(146, k_schedule(version="v1"))
K_FOUR_PART_VERSION = karafka(147, k_schedule(version="1.0.0.0"))
K_NO_TYPE = karafka(148, [h(V, "1.0.0"), h(EP, "1893456000"), h(TT, "orders")])
K_UNKNOWN_TYPE = karafka(149, [h(V, "1.0.0"), h(T, "delete")], value=None)
K_TYPE_CASE = karafka(150, [h(V, "1.0.0"), h(T, "Schedule"), h(EP, "1893456000"), h(TT, "orders")])
K_NO_EPOCH = karafka(151, [h(V, "1.0.0"), h(T, "schedule"), h(TT, "orders")])
K_NEGATIVE_EPOCH = karafka(152, k_schedule("-5"))
K_WORD_EPOCH = karafka(153, k_schedule("soon"))
K_EXPONENT_EPOCH = karafka(154, k_schedule("1.8e9"))
K_EMPTY_EPOCH = karafka(155, k_schedule(""))
K_NO_TOPIC = karafka(156, [h(V, "1.0.0"), h(T, "schedule"), h(EP, "1893456000")])
K_EMPTY_TOPIC = karafka(157, k_schedule("1893456000", ""))
K_INTERNAL_TOPIC = karafka(158, k_schedule("1893456000", "__consumer_offsets"))
K_TO_REJECTIONS = karafka(159, k_schedule("1893456000", REJECTIONS))
K_TO_INPUT = karafka(160, k_schedule("1893456000", ETF1))
K_BAD_TOPIC_NAME = karafka(161, k_schedule("1893456000", "a b"))
K_NEGATIVE_PARTITION = karafka(162, k_schedule("1893456000", "orders", h(TP, "-1")))
K_WORD_PARTITION = karafka(163, k_schedule("1893456000", "orders", h(TP, "first")))
K_HUGE_PARTITION = karafka(164, k_schedule("1893456000", "orders", h(TP, "99999999999")))
K_TOO_FAR = karafka(165, k_schedule("10000000000"))  # year 2286
K_OVERFLOW_EPOCH = karafka(166, k_schedule("99999999999999999999.5"))
K_TOO_LARGE = karafka(167, k_schedule(), value=b"x" * 101)
K_DUPLICATE_VERSION = karafka(168, [*k_schedule(), h("SCHEDULE_SCHEMA_VERSION", "1.0.0")])
K_DUPLICATE_EPOCH = karafka(169, [*k_schedule(), h(EP, "1893456001")])
K_DUPLICATE_OURS = karafka(170, [h(V, "1.0.0"), h(T, "tombstone"), h(OURS, "1"), h(OURS, "2")], value=None)
K_BAD_OURS = karafka(171, [h(V, "1.0.0"), h(T, "tombstone"), h(OURS, "abc"), h(SRC_OFF, "1")], value=None)
K_BAD_THEIRS = karafka(172, [h(V, "1.0.0"), h(T, "tombstone"), h(SRC_OFF, "-1")], value=None)
K_NEWER_TOMBSTONE = karafka(173, [h(V, "2.0.0"), h(T, "tombstone"), h(OURS, "1")], value=None)
K_CANCEL_NO_VERSION = karafka(174, [h(T, "cancel")], value=None)
K_GARBAGE_TYPE = karafka(175, [h(V, "1.0.0"), h(T, b"sched\xffule"), h(EP, "1893456000"), h(TT, "orders")])
K_GARBAGE_TOPIC = karafka(176, k_schedule("1893456000", b"ord\xffers"))
K_GARBAGE_EPOCH = karafka(177, k_schedule(b"18934560\xff0"))
K_GARBAGE_VERSION = karafka(178, k_schedule(version=b"1.\xff"))
K_TWO_ERRORS = karafka(
    179, [h("user", b"\x00\xff"), h(V, "1.0.0"), h(T, "schedule")], key=ODD_KEY, value=ODD_VALUE, partition=5
)
K_NULL_HEADERS = karafka(180, None)
# A duplicated target header does not matter to a cancel (and is not reported for it).
K_CANCEL_DUPLICATE_TARGET = karafka(181, [h(V, "1.0.0"), h(T, "cancel"), h(TT, "a"), h(TT, "b")], value=None)

# ================================================================ ETF1

EPOCH, TARGET_TOPIC, TARGET_KEY = "scheduler-epoch", "scheduler-target-topic", "scheduler-target-key"


def etf1(offset, headers, **kwargs):
    return case(ETF1, offset, headers, **kwargs)


def e_schedule(epoch="1893456000", topic="online-videos", *extra):
    return [h(EPOCH, epoch), h(TARGET_TOPIC, topic), *extra]


# The example of ETF1's README.
E_VALID = etf1(
    200,
    [h(EPOCH, "1893456000"), h(TARGET_TOPIC, "online-videos"), h(TARGET_KEY, "vid1"), h("customer-header", "dummy")],
    key=b"vid1-online",
    value=b'"video 1"',
    partition=1,
)
E_NO_TARGET_KEY = etf1(201, e_schedule())
E_PAST = etf1(202, e_schedule("0"))
E_EMPTY_VALUE = etf1(203, e_schedule(), value=b"")
E_BINARY_KEY = etf1(204, e_schedule("1893456000", "online-videos", h(TARGET_KEY, b"\xff\x00")), key=b"\x80\xc3(")
E_NAME_CASE = etf1(205, [h("Scheduler-Epoch", "1893456000"), h("SCHEDULER-TARGET-TOPIC", "online-videos")])
E_CANCEL = etf1(210, [], value=None)
E_OWN_TOMBSTONE = etf1(211, e_schedule(), value=None)  # ETF1's own tombstones after a delivery: cancels
E_OUR_WRITE_BACK = etf1(212, [h(OURS, "200")], key=b"vid1-online", value=None, partition=1)

E_NO_KEY = etf1(230, e_schedule(), key=None)
E_EMPTY_KEY = etf1(231, e_schedule(), key=b"")
E_NO_EPOCH = etf1(232, [h(TARGET_TOPIC, "online-videos")])
E_NEGATIVE_EPOCH = etf1(233, e_schedule("-1"))
E_FRACTION_EPOCH = etf1(234, e_schedule("1893456000.5"))
E_WORD_EPOCH = etf1(235, e_schedule("tomorrow"))
E_EMPTY_EPOCH = etf1(236, e_schedule(""))
E_NO_TOPIC = etf1(237, [h(EPOCH, "1893456000")])
E_TO_INPUT = etf1(238, e_schedule("1893456000", ETF1))
E_GARBAGE_TOPIC = etf1(239, e_schedule("1893456000", b"vid\xffeos"))
E_TOO_FAR = etf1(240, e_schedule("99999999999"))
E_OVERFLOW_EPOCH = etf1(241, e_schedule("999999999999999999999"))
E_TOO_LARGE = etf1(242, e_schedule(), value=b"x" * 101)
E_DUPLICATE_EPOCH = etf1(243, [*e_schedule(), h("scheduler-epoch", "1893456001")])
E_BAD_OURS = etf1(244, [h(OURS, "x")], value=None)
E_DUPLICATE_OURS = etf1(245, [h(OURS, "1"), h(OURS, "1")], value=None)
E_GARBAGE_EPOCH = etf1(246, e_schedule(b"\xff"))
E_TWO_ERRORS = etf1(247, [h("user", b"\x00\xff")], key=ODD_KEY, value=ODD_VALUE, partition=3)

# ================================================================ Sky (Avro and JSON)

EXPIRED = "schedule:expired"
AVRO_FIELDS = [
    {"name": "time", "type": "long"},
    {"name": "topic", "type": "string"},
    {"name": "key", "type": "bytes"},
    {"name": "value", "type": ["null", "bytes"]},
]
AVRO_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "AvroSchedule",
        "fields": [*AVRO_FIELDS, {"name": "headers", "type": {"type": "map", "values": "bytes"}}],
    }
)
OLDER_AVRO_SCHEMA = fastavro.parse_schema({"type": "record", "name": "AvroSchedule", "fields": AVRO_FIELDS})


def avro(time=EPOCH_MS, topic="orders", key=b"k", value=b"v", headers=None, schema=AVRO_SCHEMA):
    record = {"time": time, "topic": topic, "key": key, "value": value}
    if schema is AVRO_SCHEMA:
        record["headers"] = {} if headers is None else headers
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def zigzag(n: int) -> bytes:
    """Avro's long encoding, for the records fastavro will not write (invalid UTF-8, odd blocks)."""
    n = (n << 1) ^ (n >> 63)
    out = b""
    while n > 0x7F:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n])


def avro_bytes(data: bytes) -> bytes:
    return zigzag(len(data)) + data


def sky_avro(offset, value, headers=(), **kwargs):
    return case(SKY_AVRO, offset, list(headers), value=value, **kwargs)


A_HEADERS = {"h2": b"\x01\xff", "h1": b"", "content-type": b"application/octet-stream"}
A_VALID_VALUE = avro(EPOCH_MS + 123, "orders", ODD_KEY, ODD_VALUE, A_HEADERS)
A_VALID = sky_avro(300, A_VALID_VALUE, [h("ignored", "x")], key=b"sched-1", partition=2)
A_NULL_PAYLOAD = sky_avro(301, avro(value=None))
A_OLDER = sky_avro(302, avro(EPOCH_MS, "orders", b"k", b"v", schema=OLDER_AVRO_SCHEMA))
A_OLDER_NULL_PAYLOAD = sky_avro(303, avro(value=None, schema=OLDER_AVRO_SCHEMA))
A_PAST = sky_avro(304, avro(time=0))
A_EMPTY_KEY_FIELD = sky_avro(305, avro(key=b""))
A_BINARY_RECORD_KEY = sky_avro(306, avro(), key=b"\xc3(\x00\xff")
A_CANCEL = sky_avro(310, None, partition=2)
A_SKY_EXPIRED = sky_avro(311, None, [h(EXPIRED, "true")])
A_OUR_WRITE_BACK = sky_avro(312, None, [h(EXPIRED, "true"), h(OURS, "300")], key=b"sched-1", partition=2)
A_EXPIRED_FALSE = sky_avro(313, None, [h(EXPIRED, "false")])
A_EXPIRED_UPPER = sky_avro(314, None, [h("Schedule:Expired", "TRUE")])
A_OFFSET_ONLY = sky_avro(315, None, [h(OURS, "300")])  # not expired: a cancel, whatever the offset

A_NO_KEY = sky_avro(330, avro(), key=None)
A_EMPTY_KEY = sky_avro(331, avro(), key=b"")
A_TRUNCATED_HEADERS = sky_avro(332, A_VALID_VALUE[:-3])  # would pass for the older schema, headers lost
A_TRUNCATED_EARLY = sky_avro(333, A_VALID_VALUE[:5])
A_TRAILING = sky_avro(334, avro() + b"\x00\x01")
A_GARBAGE = sky_avro(335, b"\xff\xff\xff\xff")
A_EMPTY_VALUE = sky_avro(336, b"")
A_NEGATIVE_TIME = sky_avro(337, avro(time=-5))
A_INTERNAL_TOPIC = sky_avro(338, avro(topic="__consumer_offsets"))
A_TO_INPUT = sky_avro(339, avro(topic=SKY_JSON))
A_EMPTY_TOPIC = sky_avro(340, avro(topic=""))
A_GARBAGE_TOPIC = sky_avro(341, zigzag(EPOCH_MS) + avro_bytes(b"ord\xffers") + avro_bytes(b"k") + zigzag(0) + zigzag(0))
A_GARBAGE_HEADER_NAME = sky_avro(
    342,
    zigzag(EPOCH_MS)
    + avro_bytes(b"orders")
    + avro_bytes(b"k")
    + zigzag(0)
    + zigzag(1)
    + avro_bytes(b"na\xffme")
    + avro_bytes(b"v")
    + zigzag(0),
)
A_TOO_FAR = sky_avro(343, avro(time=10**17))
A_TOO_LARGE = sky_avro(344, avro(value=b"x" * 101))
# Valid Avro, but not in its canonical form: a map block with a negative count and a byte size
# (Java's BlockingBinaryEncoder writes those). Encoded again it is shorter: rejected (see sky_avro.py).
A_NEGATIVE_BLOCK = sky_avro(
    345,
    zigzag(EPOCH_MS)
    + avro_bytes(b"orders")
    + avro_bytes(b"k")
    + zigzag(0)
    + zigzag(-1)
    + zigzag(4)
    + avro_bytes(b"a")
    + avro_bytes(b"1")
    + zigzag(0),
)
A_DUPLICATE_EXPIRED = sky_avro(346, None, [h(EXPIRED, "true"), h(EXPIRED, "true")])
A_BAD_OURS = sky_avro(347, None, [h(EXPIRED, "true"), h(OURS, "3x")])
A_TWO_ERRORS = sky_avro(348, avro(time=-1, topic="__x"), key=ODD_KEY, partition=3)


def json_value(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sky_json(offset, value, headers=(), **kwargs):
    if isinstance(value, dict):
        value = json.dumps(value)
    return case(SKY_JSON, offset, list(headers), value=None if value is None else json_value(value), **kwargs)


def schedule_json(**fields):
    base = {"time": EPOCH_MS, "topic": "orders", "key": b64(b"k"), "value": b64(b"v")}
    base.update(fields)
    return {name: value for name, value in base.items() if value is not ...}


J_VALID = sky_json(
    400,
    {
        "time": EPOCH_MS + 123,
        "topic": "orders",
        "key": b64(ODD_KEY),
        "value": b64(ODD_VALUE),
        "headers": {"h2": b64(b"\x01\xff"), "h1": "", "content-type": b64(b"text/plain")},
    },
    [h("ignored", "x")],
    key=b"sched-1",
    partition=2,
)
J_NULL_PAYLOAD = sky_json(401, schedule_json(value=None))
J_NO_PAYLOAD = sky_json(402, schedule_json(value=...))
J_NO_HEADERS = sky_json(403, schedule_json(headers=...))
J_NULL_HEADERS = sky_json(404, schedule_json(headers=None))
J_PRETTY = sky_json(405, "\n  " + json.dumps(schedule_json(headers={"a": b64(b"1")}), indent=2) + "\n\t ")
J_QUOTED_TIME = sky_json(406, schedule_json(time=str(EPOCH_MS)))
J_NULL_HEADER_VALUE = sky_json(407, schedule_json(headers={"n": None}))
J_DUPLICATE_HEADER = sky_json(
    408, f'{{"time": {EPOCH_MS}, "topic": "orders", "key": "aw==", "headers": {{"a": "MQ==", "a": "Mg=="}}}}'
)
J_UNPADDED = sky_json(409, schedule_json(key="YQ", value="YWI"))
J_EMPTY_OBJECT_HEADERS = sky_json(410, schedule_json(headers={}))
J_CANCEL = sky_json(420, None, partition=2)
J_SKY_EXPIRED = sky_json(421, None, [h(EXPIRED, "true")])
J_OUR_WRITE_BACK = sky_json(422, None, [h(EXPIRED, "true"), h(OURS, "400")], key=b"sched-1", partition=2)

J_NO_KEY = sky_json(430, schedule_json(), key=None)
J_EMPTY_KEY = sky_json(431, schedule_json(), key=b"")
J_OPEN_BRACE = sky_json(432, "{")
J_NOT_JSON = sky_json(433, "time=1")
J_TRAILING = sky_json(434, json.dumps(schedule_json()) + " x")
J_TWO_OBJECTS = sky_json(435, json.dumps(schedule_json()) + json.dumps(schedule_json()))
J_ARRAY = sky_json(436, json.dumps([schedule_json()]))
J_NULL_TEXT = sky_json(437, "null")
J_EMPTY_VALUE = sky_json(438, "")
J_NUMBER = sky_json(439, "5")
J_CLOSING_BRACKET = sky_json(440, json.dumps(schedule_json()) + "] x")
J_GARBAGE_TOPIC = sky_json(441, b'{"time": 1, "topic": "ord\xffers", "key": "aw=="}')
J_NO_TIME = sky_json(442, schedule_json(time=...))
J_NO_TOPIC = sky_json(443, schedule_json(topic=...))
J_NO_KEY_FIELD = sky_json(444, schedule_json(key=...))
J_NULL_KEY_FIELD = sky_json(445, schedule_json(key=None))
J_WORD_TIME = sky_json(446, schedule_json(time="soon"))
J_FRACTION_TIME = sky_json(447, schedule_json(time=1.5))
J_NEGATIVE_TIME = sky_json(448, schedule_json(time=-5))
J_BAD_KEY = sky_json(449, schedule_json(key="!!"))
J_SPACE_IN_VALUE = sky_json(450, schedule_json(value="YW Jj"))
J_BAD_PADDING = sky_json(451, schedule_json(value="YQ="))
J_BAD_HEADER = sky_json(452, schedule_json(headers={"x": "??"}))
J_BAD_HEADERS = sky_json(453, schedule_json(headers={"x": "??", "y": "YQ==", "z": "%"}))
J_HEADERS_LIST = sky_json(454, schedule_json(headers=[1]))
J_HEADERS_TEXT = sky_json(455, schedule_json(headers="abc"))
J_TO_INPUT = sky_json(456, schedule_json(topic=KARAFKA))
J_TOO_FAR = sky_json(457, schedule_json(time=10**17))
J_TOO_LARGE = sky_json(458, schedule_json(value=b64(b"x" * 101)))
J_LINE_BREAK = sky_json(459, schedule_json(value="YWJj\nZA=="))
J_TWO_ERRORS = sky_json(460, schedule_json(time=..., topic=...), key=ODD_KEY, partition=3)
J_OVERFLOW_TIME = sky_json(461, schedule_json(time=10**30))
J_DUPLICATE_OURS = sky_json(462, None, [h(EXPIRED, "true"), h(OURS, "1"), h(OURS, "2")])
J_EMPTY_TOPIC = sky_json(463, schedule_json(topic=""))

# ================================================================ decoding


def rows_of(topic):
    return [
        (key, value, topic, partition, offset, ts_of(offset), 0, headers)
        for offset, (key, value, headers, partition) in sorted(CASES[topic].items())
    ]


@pytest.fixture(scope="module")
def results(spark):
    """(run, topic, offset) -> collected row (a dict), run 'alone' or 'mixed', from one collect()."""
    native_offsets = set(native_cases.CASES) - native_cases.ALLOW_LIST_OFFSETS
    records = {topic: rows_of(topic) for topic in DIALECT_OF}
    records[NATIVE] = native_cases._rows(native_offsets)
    stray = [(b"k", b"v", STRAY, 0, 1, ts_of(1), 0, [])]
    inputs = {**DIALECT_OF, NATIVE: "native"}

    alone = [
        dialects.decode(spark.createDataFrame(rows, KAFKA_SCHEMA), {topic: inputs[topic]}, SETTINGS).withColumn(
            "run", F.lit("alone")
        )
        for topic, rows in records.items()
    ]
    # One frame, like the one Kafka source of all inputs.
    everything = spark.createDataFrame([row for rows in records.values() for row in rows] + stray, KAFKA_SCHEMA)
    mixed = dialects.decode(everything, inputs, SETTINGS).withColumn("run", F.lit("mixed"))
    for frame in [*alone, mixed]:
        assert tuple(frame.columns) == (*NORMALIZED_COLUMNS, "run")
    # Collected one frame at a time: Spark compiles a union of frames into one method, which the six decodes
    # together would outgrow (the job itself reads all its inputs through one Kafka source: one decode).
    rows = [row for frame in [*alone, mixed] for row in frame.collect()]
    by_key = {(row["run"], row["src_topic"], row["src_offset"]): row.asDict(recursive=True) for row in rows}
    assert len(by_key) == len(rows) == 2 * (sum(map(len, CASES.values())) + len(native_offsets)) + 1
    return by_key


@pytest.fixture(scope="module")
def decoded(results):
    """(topic, offset) -> row, each dialect decoded alone."""
    return {(topic, offset): row for (run, topic, offset), row in results.items() if run == "alone"}


def blob(value):
    return None if value is None else bytes(value)


def headers_of(row, field="headers"):
    return None if row[field] is None else [(hd["key"], blob(hd["value"])) for hd in row[field]]


def header_bytes(headers):
    return sum(len(name.encode()) + len(value or b"") for name, value in headers)


def expected_entry_bytes(key, value, headers, wb_key, wb_headers):
    size = ENTRY_OVERHEAD_BYTES + len(key or b"") + len(value or b"") + header_bytes(headers)
    return size if wb_headers is None else size + len(wb_key or b"") + header_bytes(wb_headers)


def expect_row(
    row,
    topic,
    offset,
    *,
    action,
    due_ms=None,
    dest=None,
    key=None,
    value=None,
    headers=(),
    completes=None,
    partition=None,
    partition_key=None,
    wb_headers=None,
    history=False,
    cron=None,
):
    """The whole normalized row of a valid request, every column (``cron``: the columns of expiry and crons that
    the request sets; null otherwise)."""
    record_key, _, _, src_partition = CASES[topic][offset]
    headers = list(headers)
    actual = dict(
        row,
        key=blob(row["key"]),
        value=blob(row["value"]),
        headers=headers_of(row),
        wb_key=blob(row["wb_key"]),
        wb_headers=headers_of(row, "wb_headers"),
        sid=blob(row["sid"]),
        partition_key=blob(row["partition_key"]),
    )
    written_back = wb_headers is not None
    assert actual == {
        "sid": b"id:" + topic.encode() + b"/" + record_key,
        "kind": "request",
        "action": action,
        "due_ms": due_ms,
        "topic": dest,
        "key": key,
        "value": value,
        "headers": headers,
        "delivery_id": f"{topic}-{src_partition}-{offset}",
        "src_topic": topic,
        "src_partition": src_partition,
        "src_offset": offset,
        "src_ts_ms": native_cases.ts_ms_of(offset),
        "entry_bytes": expected_entry_bytes(key, value, headers, record_key, wb_headers),
        "completes": completes,
        "partition": partition,
        "partition_key": partition_key,
        "wb_topic": topic if written_back else None,
        "wb_partition": src_partition if written_back else None,
        "wb_key": record_key if written_back else None,
        "wb_headers": None if wb_headers is None else list(wb_headers),
        "history": history,
        "run": "alone",
        **dict.fromkeys(CRON_AND_EXPIRY_COLUMNS),
        **(cron or {}),
    }


# The columns only a native request with a max lateness or a CRON_ADD fills in.
CRON_AND_EXPIRY_COLUMNS = (
    "max_lateness_ms",
    "cron_expr",
    "cron_tz",
    "cron_policy",
    "cron_start_ms",
    "cron_end_ms",
    "raw_headers",
)


def reasons_of(row):
    return [blob(v).decode() for k, v in headers_of(row) if k == "x-scheduler-rejection-reason"]


def expect_rejection(row, topic, offset, *fragments):
    """A rejection carrying exactly one reason per fragment, each containing its fragment."""
    key, value, headers, partition = CASES[topic][offset]
    assert row["kind"] == "reject", row
    assert blob(row["sid"]) == REJECTIONS_SID
    assert row["topic"] == REJECTIONS
    assert row["action"] is None and row["due_ms"] is None
    assert blob(row["key"]) == key
    assert blob(row["value"]) == value
    reasons = reasons_of(row)
    assert len(reasons) == len(fragments), reasons
    for fragment in fragments:
        assert sum(fragment in reason for reason in reasons) == 1, (fragment, reasons)
    assert headers_of(row) == (
        list(headers or [])
        + [("x-scheduler-rejection-reason", r.encode()) for r in reasons]
        + [
            ("x-scheduler-source-topic", topic.encode()),
            ("x-scheduler-source-partition", str(partition).encode()),
            ("x-scheduler-source-offset", str(offset).encode()),
        ]
    )
    assert row["delivery_id"] == f"{topic}-{partition}-{offset}"
    assert (row["src_topic"], row["src_partition"], row["src_offset"]) == (topic, partition, offset)
    assert all(
        row[c] is None
        for c in (
            "completes",
            "partition",
            "partition_key",
            "wb_topic",
            "wb_partition",
            "wb_key",
            "wb_headers",
            "entry_bytes",
        )
    )
    assert row["history"] is False
    return reasons


# ================================================================ Karafka: valid


def test_karafka_schedule_is_decoded_exactly(decoded):
    envelope = [(name, value) for name, value in K_VALID_HEADERS]
    expect_row(
        decoded[KARAFKA, K_VALID],
        KARAFKA,
        K_VALID,
        action="ADD",
        due_ms=EPOCH_MS + 2,  # 1893456000.0015 s = ...000001.5 ms, rounded up
        dest="orders",
        key=b"\x00tk\xff",
        value=ODD_VALUE,
        partition_key=b"pk",
        headers=envelope
        + [
            ("schedule_source_topic", KARAFKA.encode()),
            ("schedule_source_partition", b"2"),
            ("schedule_source_offset", b"100"),
            ("schedule_source_key", ODD_KEY),
        ],
        wb_headers=[
            ("trace", b"\x01\xff"),
            (V, b"1.0.0"),
            (EP, b"1893456000.0015"),
            (T, b"tombstone"),
            (TT, b"orders"),
            (TK, b"\x00tk\xff"),
            (TPK, b"pk"),
            ("nullh", None),
            (SRC_OFF, b"100"),
            (OURS, b"100"),
        ],
    )


def test_karafka_explicit_partition_wins_over_the_partition_key(decoded):
    row = decoded[KARAFKA, K_EXPLICIT_PARTITION]
    assert (row["kind"], row["partition"], row["partition_key"]) == ("request", 3, None)
    assert row["key"] is None  # no schedule_target_key: a null key


@pytest.mark.parametrize(
    "offset,due_ms",
    [
        (K_WHOLE_SECONDS, EPOCH_MS),
        (K_EXACT_MS, EPOCH_MS + 123),
        (K_SUB_MS, EPOCH_MS + 124),
        (K_TINY, 1),
        (K_HALF, EPOCH_MS + 500),
        (K_MAJOR_ONLY, EPOCH_MS),
        (K_MINOR, EPOCH_MS),
    ],
)
def test_karafka_due_time_is_never_early(decoded, offset, due_ms):
    row = decoded[KARAFKA, offset]
    assert (row["kind"], row["action"], row["due_ms"]) == ("request", "ADD", due_ms)


def test_karafka_write_back_replaces_earlier_offsets(decoded):
    row = decoded[KARAFKA, K_STALE_OFFSETS]
    assert row["kind"] == "request"
    assert headers_of(row, "wb_headers") == [
        (V, b"1.0.0"),
        (T, b"tombstone"),
        (EP, b"1893456000"),
        (TT, b"orders"),
        (SRC_OFF, b"109"),
        (OURS, b"109"),
    ]
    # the delivered record still has every envelope header, then the source headers
    assert headers_of(row)[:6] == CASES[KARAFKA][K_STALE_OFFSETS][2]


def test_karafka_header_names_are_case_insensitive(decoded):
    row = decoded[KARAFKA, K_NAME_CASE]
    assert (row["kind"], row["due_ms"], row["topic"]) == ("request", EPOCH_MS, "orders")
    assert headers_of(row, "wb_headers")[1] == ("SCHEDULE_SOURCE_TYPE", b"tombstone")


def test_karafka_binary_ids_are_kept_byte_exact(decoded):
    row = decoded[KARAFKA, K_BINARY_KEY]
    assert blob(row["sid"]) == b"id:" + KARAFKA.encode() + b"/\xc3(\x00\xff"
    assert blob(row["wb_key"]) == b"\xc3(\x00\xff"
    assert headers_of(row)[-1] == ("schedule_source_key", b"\xc3(\x00\xff")


def test_karafka_null_payload_stays_null(decoded):
    row = decoded[KARAFKA, K_NULL_PAYLOAD]
    assert (row["kind"], row["value"]) == ("request", None)


def test_karafka_cancel(decoded):
    expect_row(decoded[KARAFKA, K_CANCEL], KARAFKA, K_CANCEL, action="CANCEL")


@pytest.mark.parametrize(
    "offset,completes",
    [
        (K_OUR_WRITE_BACK, f"{KARAFKA}-2-100"),  # completes exactly the version K_VALID decoded
        (K_OURS_WINS, f"{KARAFKA}-0-7"),
        (K_KARAFKA_TOMBSTONE, f"{KARAFKA}-0-42"),
        (K_BARE_TOMBSTONE, None),  # the version pending at that point
        (K_LEADING_ZEROS, f"{KARAFKA}-0-7"),
    ],
)
def test_karafka_tombstones_complete_a_version(decoded, offset, completes):
    expect_row(decoded[KARAFKA, offset], KARAFKA, offset, action="COMPLETE", completes=completes)


@pytest.mark.parametrize(
    "offset,fragments",
    [
        (K_NO_KEY, ["missing schedule id"]),
        (K_EMPTY_KEY, ["missing schedule id"]),
        (K_NO_VERSION, ["missing schedule_schema_version"]),
        (K_NEWER, ["schedule_schema_version '2.0.0' is newer than 1.x"]),
        (K_MUCH_NEWER, ["is newer than 1.x"]),
        (K_OLDER, ["unsupported schedule_schema_version '0.9'"]),
        (K_BAD_VERSION, ["unsupported schedule_schema_version 'v1'"]),
        (K_FOUR_PART_VERSION, ["unsupported schedule_schema_version '1.0.0.0'"]),
        (K_NO_TYPE, ["missing schedule_source_type"]),
        (K_UNKNOWN_TYPE, ["unknown schedule_source_type 'delete'"]),
        (K_TYPE_CASE, ["unknown schedule_source_type 'Schedule'"]),
        (K_NO_EPOCH, ["missing schedule_target_epoch"]),
        (K_NEGATIVE_EPOCH, ["schedule_target_epoch '-5' is negative"]),
        (K_WORD_EPOCH, ["invalid schedule_target_epoch 'soon'"]),
        (K_EXPONENT_EPOCH, ["invalid schedule_target_epoch '1.8e9'"]),
        (K_EMPTY_EPOCH, ["invalid schedule_target_epoch ''"]),
        (K_NO_TOPIC, ["missing schedule_target_topic"]),
        (K_EMPTY_TOPIC, ["missing schedule_target_topic"]),
        (K_INTERNAL_TOPIC, ["destination topic '__consumer_offsets' is not allowed"]),
        (K_TO_REJECTIONS, [f"destination topic '{REJECTIONS}' is not allowed"]),
        (K_TO_INPUT, [f"destination topic '{ETF1}' is not allowed"]),
        (K_BAD_TOPIC_NAME, ["invalid destination topic name 'a b'"]),
        (K_NEGATIVE_PARTITION, ["invalid schedule_target_partition '-1'"]),
        (K_WORD_PARTITION, ["invalid schedule_target_partition 'first'"]),
        (K_HUGE_PARTITION, ["invalid schedule_target_partition '99999999999'"]),
        (K_TOO_FAR, ["due time is more than 36500 days ahead"]),
        (K_OVERFLOW_EPOCH, ["due time is more than 36500 days ahead"]),
        (K_TOO_LARGE, ["value too large: 101 bytes"]),
        (K_DUPLICATE_VERSION, ["duplicate header schedule_schema_version"]),
        (K_DUPLICATE_EPOCH, ["duplicate header schedule_target_epoch"]),
        (K_DUPLICATE_OURS, ["duplicate header x-scheduler-source-offset"]),
        (K_BAD_OURS, ["invalid x-scheduler-source-offset 'abc'"]),
        (K_BAD_THEIRS, ["invalid schedule_source_offset '-1'"]),
        (K_NEWER_TOMBSTONE, ["is newer than 1.x"]),
        (K_CANCEL_NO_VERSION, ["missing schedule_schema_version"]),
        # invalid UTF-8 shows as U+FFFD: the value fails its check, and the reason stays readable
        (K_GARBAGE_TYPE, ["unknown schedule_source_type 'sched\ufffdule'"]),
        (K_GARBAGE_TOPIC, ["invalid destination topic name 'ord\ufffders'"]),
        (K_GARBAGE_EPOCH, ["invalid schedule_target_epoch '18934560\ufffd0'"]),
        (K_GARBAGE_VERSION, ["unsupported schedule_schema_version '1.\ufffd'"]),
        (K_TWO_ERRORS, ["missing schedule_target_epoch", "missing schedule_target_topic"]),
        (K_NULL_HEADERS, ["missing schedule_schema_version", "missing schedule_source_type"]),
    ],
    ids=lambda p: str(p) if isinstance(p, int) else None,
)
def test_karafka_rejections(decoded, offset, fragments):
    expect_rejection(decoded[KARAFKA, offset], KARAFKA, offset, *fragments)


def test_karafka_cancel_ignores_target_headers(decoded):
    expect_row(decoded[KARAFKA, K_CANCEL_DUPLICATE_TARGET], KARAFKA, K_CANCEL_DUPLICATE_TARGET, action="CANCEL")


# ================================================================ ETF1


def test_etf1_schedule_is_decoded_exactly(decoded):
    expect_row(
        decoded[ETF1, E_VALID],
        ETF1,
        E_VALID,
        action="ADD",
        due_ms=EPOCH_MS,
        dest="online-videos",
        key=b"vid1",
        value=b'"video 1"',
        headers=[
            (EPOCH, b"1893456000"),
            (TARGET_TOPIC, b"online-videos"),
            (TARGET_KEY, b"vid1"),
            ("customer-header", b"dummy"),
            ("scheduler-timestamp", str(seconds_of(E_VALID)).encode()),
            ("scheduler-key", b"vid1-online"),
            ("scheduler-topic", ETF1.encode()),
        ],
        wb_headers=[(OURS, b"200")],
        history=True,
    )


def test_etf1_variants(decoded):
    assert decoded[ETF1, E_NO_TARGET_KEY]["key"] is None
    assert decoded[ETF1, E_PAST]["due_ms"] == 0  # ETF1 drops a past schedule; we deliver it at once
    assert blob(decoded[ETF1, E_EMPTY_VALUE]["value"]) == b""
    assert decoded[ETF1, E_EMPTY_VALUE]["action"] == "ADD"
    row = decoded[ETF1, E_BINARY_KEY]
    assert (blob(row["key"]), blob(row["sid"])) == (b"\xff\x00", b"id:" + ETF1.encode() + b"/\x80\xc3(")
    assert ("scheduler-key", b"\x80\xc3(") in headers_of(row)
    row = decoded[ETF1, E_NAME_CASE]
    assert (row["kind"], row["due_ms"], row["topic"]) == ("request", EPOCH_MS, "online-videos")


@pytest.mark.parametrize("offset", [E_CANCEL, E_OWN_TOMBSTONE])
def test_etf1_null_value_cancels(decoded, offset):
    expect_row(decoded[ETF1, offset], ETF1, offset, action="CANCEL")


def test_etf1_our_write_back_completes_its_version(decoded):
    expect_row(decoded[ETF1, E_OUR_WRITE_BACK], ETF1, E_OUR_WRITE_BACK, action="COMPLETE", completes=f"{ETF1}-1-200")


@pytest.mark.parametrize(
    "offset,fragments",
    [
        (E_NO_KEY, ["missing schedule id"]),
        (E_EMPTY_KEY, ["missing schedule id"]),
        (E_NO_EPOCH, ["missing scheduler-epoch"]),
        (E_NEGATIVE_EPOCH, ["scheduler-epoch '-1' is negative"]),
        (E_FRACTION_EPOCH, ["scheduler-epoch '1893456000.5' is not a whole number of seconds"]),
        (E_WORD_EPOCH, ["invalid scheduler-epoch 'tomorrow'"]),
        (E_EMPTY_EPOCH, ["invalid scheduler-epoch ''"]),
        (E_NO_TOPIC, ["missing scheduler-target-topic"]),
        (E_TO_INPUT, [f"destination topic '{ETF1}' is not allowed"]),
        (E_GARBAGE_TOPIC, ["invalid destination topic name 'vid\ufffdeos'"]),
        (E_TOO_FAR, ["due time is more than 36500 days ahead"]),
        (E_OVERFLOW_EPOCH, ["due time is more than 36500 days ahead"]),
        (E_TOO_LARGE, ["value too large: 101 bytes"]),
        (E_DUPLICATE_EPOCH, ["duplicate header scheduler-epoch"]),
        (E_BAD_OURS, ["invalid x-scheduler-source-offset 'x'"]),
        (E_DUPLICATE_OURS, ["duplicate header x-scheduler-source-offset"]),
        (E_GARBAGE_EPOCH, ["invalid scheduler-epoch '\ufffd'"]),
        (E_TWO_ERRORS, ["missing scheduler-epoch", "missing scheduler-target-topic"]),
    ],
    ids=lambda p: str(p) if isinstance(p, int) else None,
)
def test_etf1_rejections(decoded, offset, fragments):
    expect_rejection(decoded[ETF1, offset], ETF1, offset, *fragments)


# ================================================================ Sky (Avro)


def test_sky_avro_schedule_is_decoded_exactly(decoded):
    row = decoded[SKY_AVRO, A_VALID]
    # Avro maps have no order: the headers come in Spark's map order.
    assert sorted(headers_of(row)) == sorted(A_HEADERS.items())
    expect_row(
        row,
        SKY_AVRO,
        A_VALID,
        action="ADD",
        due_ms=EPOCH_MS + 123,
        dest="orders",
        key=ODD_KEY,
        value=ODD_VALUE,
        headers=headers_of(row),
        wb_headers=[(EXPIRED, b"true"), (OURS, b"300")],
    )


def test_sky_avro_variants(decoded):
    row = decoded[SKY_AVRO, A_NULL_PAYLOAD]
    assert (row["kind"], row["value"], blob(row["key"])) == ("request", None, b"k")
    row = decoded[SKY_AVRO, A_PAST]
    assert (row["kind"], row["due_ms"]) == ("request", 0)
    row = decoded[SKY_AVRO, A_EMPTY_KEY_FIELD]
    assert (row["kind"], blob(row["key"])) == ("request", b"")
    row = decoded[SKY_AVRO, A_BINARY_RECORD_KEY]
    assert blob(row["sid"]) == b"id:" + SKY_AVRO.encode() + b"/\xc3(\x00\xff"
    assert blob(row["wb_key"]) == b"\xc3(\x00\xff"


def test_sky_avro_older_schema_without_headers(decoded):
    expect_row(
        decoded[SKY_AVRO, A_OLDER],
        SKY_AVRO,
        A_OLDER,
        action="ADD",
        due_ms=EPOCH_MS,
        dest="orders",
        key=b"k",
        value=b"v",
        wb_headers=[(EXPIRED, b"true"), (OURS, str(A_OLDER).encode())],
    )
    row = decoded[SKY_AVRO, A_OLDER_NULL_PAYLOAD]
    assert (row["kind"], row["value"], row["headers"]) == ("request", None, [])


@pytest.mark.parametrize("offset", [A_CANCEL, A_EXPIRED_FALSE, A_OFFSET_ONLY])
def test_sky_avro_null_value_cancels(decoded, offset):
    expect_row(decoded[SKY_AVRO, offset], SKY_AVRO, offset, action="CANCEL")


@pytest.mark.parametrize(
    "offset,completes",
    [
        (A_SKY_EXPIRED, None),  # written by Sky: the version pending at that point
        (A_EXPIRED_UPPER, None),
        (A_OUR_WRITE_BACK, f"{SKY_AVRO}-2-300"),
    ],
)
def test_sky_avro_expired_tombstones_complete(decoded, offset, completes):
    expect_row(decoded[SKY_AVRO, offset], SKY_AVRO, offset, action="COMPLETE", completes=completes)


@pytest.mark.parametrize(
    "offset,fragments",
    [
        (A_NO_KEY, ["missing schedule id"]),
        (A_EMPTY_KEY, ["missing schedule id"]),
        (A_TRUNCATED_HEADERS, ["malformed Avro schedule"]),
        (A_TRUNCATED_EARLY, ["malformed Avro schedule (neither"]),
        (A_TRAILING, ["malformed Avro schedule: the value is 2 bytes longer"]),
        (A_GARBAGE, ["malformed Avro schedule"]),
        (A_EMPTY_VALUE, ["malformed Avro schedule"]),
        (A_NEGATIVE_TIME, ["time -5 is negative"]),
        (A_INTERNAL_TOPIC, ["destination topic '__consumer_offsets' is not allowed"]),
        (A_TO_INPUT, [f"destination topic '{SKY_JSON}' is not allowed"]),
        (A_EMPTY_TOPIC, ["missing topic"]),
        (A_GARBAGE_TOPIC, ["invalid destination topic name 'ord\ufffders'"]),
        (A_GARBAGE_HEADER_NAME, ["header name 'na\ufffdme' is not valid UTF-8"]),
        (A_TOO_FAR, ["due time is more than 36500 days ahead"]),
        (A_TOO_LARGE, ["value too large: 101 bytes"]),
        (A_NEGATIVE_BLOCK, ["malformed Avro schedule: the value is 1 bytes longer"]),
        (A_DUPLICATE_EXPIRED, ["duplicate header schedule:expired"]),
        (A_BAD_OURS, ["invalid x-scheduler-source-offset '3x'"]),
        (A_TWO_ERRORS, ["time -1 is negative", "destination topic '__x' is not allowed"]),
    ],
    ids=lambda p: str(p) if isinstance(p, int) else None,
)
def test_sky_avro_rejections(decoded, offset, fragments):
    expect_rejection(decoded[SKY_AVRO, offset], SKY_AVRO, offset, *fragments)


def test_truncated_current_record_is_not_taken_for_an_older_one(decoded):
    # Without the length check A_TRUNCATED_HEADERS decodes with the older schema, its headers lost.
    assert "bytes longer than the schedule" in reasons_of(decoded[SKY_AVRO, A_TRUNCATED_HEADERS])[0]


# ================================================================ Sky (JSON)


def test_sky_json_schedule_is_decoded_exactly(decoded):
    expect_row(
        decoded[SKY_JSON, J_VALID],
        SKY_JSON,
        J_VALID,
        action="ADD",
        due_ms=EPOCH_MS + 123,
        dest="orders",
        key=ODD_KEY,
        value=ODD_VALUE,
        headers=[("h2", b"\x01\xff"), ("h1", b""), ("content-type", b"text/plain")],  # in document order
        wb_headers=[(EXPIRED, b"true"), (OURS, b"400")],
    )


@pytest.mark.parametrize(
    "offset,value,headers",
    [
        (J_NULL_PAYLOAD, None, []),
        (J_NO_PAYLOAD, None, []),
        (J_NO_HEADERS, b"v", []),
        (J_NULL_HEADERS, b"v", []),
        (J_EMPTY_OBJECT_HEADERS, b"v", []),
        (J_PRETTY, b"v", [("a", b"1")]),
        (J_QUOTED_TIME, b"v", []),
        (J_NULL_HEADER_VALUE, b"v", [("n", None)]),
        (J_UNPADDED, b"ab", []),
    ],
)
def test_sky_json_variants(decoded, offset, value, headers):
    row = decoded[SKY_JSON, offset]
    assert (row["kind"], row["due_ms"], row["topic"], blob(row["value"]), headers_of(row)) == (
        "request",
        EPOCH_MS,
        "orders",
        value,
        headers,
    ), reasons_of(row) if row["kind"] == "reject" else row


def test_sky_json_keeps_a_repeated_header(decoded):
    assert headers_of(decoded[SKY_JSON, J_DUPLICATE_HEADER]) == [("a", b"1"), ("a", b"2")]
    assert blob(decoded[SKY_JSON, J_UNPADDED]["key"]) == b"a"


def test_sky_json_null_values(decoded):
    expect_row(decoded[SKY_JSON, J_CANCEL], SKY_JSON, J_CANCEL, action="CANCEL")
    expect_row(decoded[SKY_JSON, J_SKY_EXPIRED], SKY_JSON, J_SKY_EXPIRED, action="COMPLETE")
    expect_row(
        decoded[SKY_JSON, J_OUR_WRITE_BACK],
        SKY_JSON,
        J_OUR_WRITE_BACK,
        action="COMPLETE",
        completes=f"{SKY_JSON}-2-400",
    )


MALFORMED_JSON = "malformed JSON schedule"


@pytest.mark.parametrize(
    "offset,fragments",
    [
        (J_NO_KEY, ["missing schedule id"]),
        (J_EMPTY_KEY, ["missing schedule id"]),
        (J_OPEN_BRACE, [MALFORMED_JSON]),
        (J_NOT_JSON, [MALFORMED_JSON]),
        (J_TRAILING, [MALFORMED_JSON]),
        (J_TWO_OBJECTS, [MALFORMED_JSON]),
        (J_ARRAY, [MALFORMED_JSON]),
        (J_NULL_TEXT, [MALFORMED_JSON]),
        (J_EMPTY_VALUE, [MALFORMED_JSON]),
        (J_NUMBER, [MALFORMED_JSON]),
        (J_CLOSING_BRACKET, [MALFORMED_JSON]),
        (J_GARBAGE_TOPIC, ["invalid destination topic name 'ord\ufffders'"]),
        (J_NO_TIME, ["missing time"]),
        (J_NO_TOPIC, ["missing topic"]),
        (J_EMPTY_TOPIC, ["missing topic"]),
        (J_NO_KEY_FIELD, ["missing key"]),
        (J_NULL_KEY_FIELD, ["missing key"]),
        (J_WORD_TIME, ["invalid time 'soon'"]),
        (J_FRACTION_TIME, ["invalid time '1.5'"]),
        (J_NEGATIVE_TIME, ["time -5 is negative"]),
        (J_BAD_KEY, ["invalid base64 in key"]),
        (J_SPACE_IN_VALUE, ["invalid base64 in value"]),
        (J_BAD_PADDING, ["invalid base64 in value"]),
        (J_LINE_BREAK, ["invalid base64 in value"]),
        (J_BAD_HEADER, ["invalid base64 in headers 'x'"]),
        (J_BAD_HEADERS, ["invalid base64 in headers 'x', 'z'"]),
        (J_HEADERS_LIST, ["invalid headers"]),
        (J_HEADERS_TEXT, ["invalid headers"]),
        (J_TO_INPUT, [f"destination topic '{KARAFKA}' is not allowed"]),
        (J_TOO_FAR, ["due time is more than 36500 days ahead"]),
        (J_OVERFLOW_TIME, ["due time is more than 36500 days ahead"]),
        (J_TOO_LARGE, ["value too large: 101 bytes"]),
        (J_TWO_ERRORS, ["missing time", "missing topic"]),
        (J_DUPLICATE_OURS, ["duplicate header x-scheduler-source-offset"]),
    ],
    ids=lambda p: str(p) if isinstance(p, int) else None,
)
def test_sky_json_rejections(decoded, offset, fragments):
    expect_rejection(decoded[SKY_JSON, offset], SKY_JSON, offset, *fragments)


# ================================================================ all of them at once


def test_every_case_has_exactly_one_outcome(decoded):
    for (topic, _), row in decoded.items():
        if topic == NATIVE:
            continue
        assert row["kind"] in ("request", "reject")
        assert (row["kind"] == "reject") == (blob(row["sid"]) == REJECTIONS_SID)
        assert (row["action"] in ("ADD", "CANCEL", "COMPLETE")) == (row["kind"] == "request")
        # only schedules are written back, and only ETF1 always goes to history
        assert (row["wb_headers"] is not None) == (row["action"] == "ADD")
        assert row["history"] == (row["action"] == "ADD" and topic == ETF1)
        assert (row["due_ms"] is not None) == (row["action"] == "ADD")


def test_a_mixed_decode_gives_every_record_what_its_dialect_alone_gives(results, decoded):
    mixed = {(topic, offset): row for (run, topic, offset), row in results.items() if run == "mixed"}
    stray = mixed.pop((STRAY, 1))
    assert reasons_of(stray) == ["no dialect for this topic"]
    assert mixed.keys() == decoded.keys()
    for place, row in mixed.items():
        assert dict(row, run="alone") == decoded[place], place


def test_native_records_decode_as_the_native_tests_expect_in_the_mix(results):
    # A few of the native test's cases, checked again in the mixed decode.
    row = results["mixed", NATIVE, native_cases.VALID_ADD]
    assert (row["kind"], row["action"], row["due_ms"], row["topic"]) == (
        "request",
        "ADD",
        native_cases.ms("2030-01-02T03:04:05.678Z"),
        "orders",
    )
    assert headers_of(row) == [
        ("trace", b"\x01\xff"),
        ("trace", b"\x02"),
        ("nullh", None),
        ("Content-Type", b"application/octet-stream"),
    ]
    assert (row["completes"], row["wb_headers"], row["history"], row["partition"]) == (None, None, False, None)
    assert reasons_of(results["mixed", NATIVE, native_cases.TWO_ERRORS]) == [
        "missing x-scheduler-deliver-to",
        "missing x-scheduler-deliver-at",
    ]


def test_a_decode_of_all_five_dialects_compiles(spark):
    """Spark compiles each stage to one Java method; past the JVM's 64 KB it logs the failure and
    falls back to slower code, for every batch. A decode of every dialect stays under the limit."""
    rows = [(b"k", b"v", topic, 0, 1, ts_of(1), 0, []) for topic in (*DIALECT_OF, NATIVE)]
    frame = dialects.decode(spark.createDataFrame(rows, KAFKA_SCHEMA), {**DIALECT_OF, NATIVE: "native"}, SETTINGS)
    jvm = spark.sparkContext._jvm
    stages, pending = [], [frame._jdf.queryExecution().executedPlan()]
    while pending:
        plan = pending.pop()
        if plan.getClass().getSimpleName() == "WholeStageCodegenExec":
            stages.append(plan)
        children = plan.children().iterator()
        while children.hasNext():
            pending.append(children.next())
    assert stages
    for stage in stages:
        jvm.org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator.compile(stage.doCodeGen()._2())
