"""Hostile input at the decoder: every record, whatever its bytes, decodes to exactly one outcome.

Records of every dialect (tests/hostile_records.py: valid requests with fields removed, duplicated, nulled,
spoiled, oversized; epochs out of range; truncated and doctored Avro; malformed JSON; raw garbage) are
decoded together by one ``dialects.decode`` of all five dialects, as a job reading them all does, on a
local SparkSession (no Kafka). For each input row exactly one output row comes out: a request that is valid
(an action of its dialect, a due time and an allowed destination where it needs them, the value within the
limit) or a rejection carrying the original key, value and headers, at least one readable reason and the
source headers. Where the generator knows what the contract promises (most records) the outcome must be that.
A decode that throws fails the test like a lost or duplicated row.
"""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kafka_scheduler import dialects
from kafka_scheduler.dialects import common, karafka, native, sky_avro
from kafka_scheduler.dialects.common import DecodeSettings
from kafka_scheduler.protocol import REJECTION_REASON, REJECTIONS_SID, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC

from .. import hostile_records as hr
from .test_native_decode import KAFKA_SCHEMA

REJECTIONS, HISTORY = "app-schedule-rejections", "app-schedule-history"
TOPIC_OF = {
    "native": "app-schedule-requests",
    "karafka": "karafka-schedules",
    "etf1": "etf1-schedules",
    "sky-avro": "sky-avro-schedules",
    "sky-json": "sky-json-schedules",
}
INPUTS = {topic: dialect for dialect, topic in TOPIC_OF.items()}
OWN = (REJECTIONS, HISTORY, *INPUTS)
MAX_VALUE_BYTES = 100
SETTINGS = DecodeSettings(
    rejections_topic=REJECTIONS,
    own_topics=OWN,
    allowed_destinations=None,
    max_value_bytes=MAX_VALUE_BYTES,
    max_ahead_ms=100 * 365 * 86_400_000,
)
NOW = datetime(2026, 11, 26, 12, 0, 0, 7000, tzinfo=UTC)
NOW_MS = int((NOW - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(milliseconds=1))
ACTIONS = {
    "native": {"ADD", "REPLACE", "CANCEL"},
    "karafka": {"ADD", "CANCEL", "COMPLETE"},
    "etf1": {"ADD", "CANCEL", "COMPLETE"},
    "sky-avro": {"ADD", "CANCEL", "COMPLETE"},
    "sky-json": {"ADD", "CANCEL", "COMPLETE"},
}
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
EXAMPLES = 150  # hypothesis examples, up to 20 records each
BULK_PER_DIALECT = 1000  # seeded random records per dialect


def context(huge_bytes: int = 20_000) -> hr.Context:
    return hr.Context(
        destinations=("orders", "orders-2.x"),
        forbidden=OWN,
        max_value_bytes=MAX_VALUE_BYTES,
        now_ms=NOW_MS,
        huge_bytes=huge_bytes,
    )


def decode_all(spark, records: list[hr.Hostile]) -> dict:
    """(topic, offset) -> decoded rows of that record (a list: exactly one is right), from one collect()."""
    offsets = {}
    rows = []
    for record in records:
        topic = TOPIC_OF[record.dialect]
        offset = offsets[topic] = offsets.get(topic, -1) + 1
        rows.append((record.key, record.value, topic, 0, offset, NOW, 0, record.headers))
    frame = dialects.decode(spark.createDataFrame(rows, KAFKA_SCHEMA), INPUTS, SETTINGS)
    decoded: dict = {}
    for row in frame.collect():
        decoded.setdefault((row["src_topic"], row["src_offset"]), []).append(row.asDict())
    return decoded


def blob(value):
    return None if value is None else bytes(value)


def headers_of(row, name="headers") -> list:
    return [(h["key"], blob(h["value"])) for h in row[name] or []]


def problems(record: hr.Hostile, topic: str, offset: int, rows: list) -> list[str]:
    """What is wrong with the decode of one record (empty: nothing)."""
    if len(rows) != 1:
        return [f"{len(rows)} decoded rows"]
    row = rows[0]
    kind, action = row["kind"], row["action"]
    found = []
    if record.expect == hr.REJECT and kind != "reject":
        found.append(f"expected a rejection, got a {action} request")
    if record.expect == hr.REQUEST and (kind, action) != ("request", record.action):
        found.append(
            f"expected a {record.action} request, got {kind} {action}"
            + (f" {reasons_of(row)}" if kind == "reject" else "")
        )
    if row["delivery_id"] != f"{topic}-0-{offset}":
        found.append(f"delivery id {row['delivery_id']}")
    if kind == "reject":
        found += rejection_problems(record, topic, offset, row)
    elif kind == "request":
        found += request_problems(record, topic, row)
    else:
        found.append(f"kind {kind!r}")
    return found


def reasons_of(row) -> list[str]:
    return [v.decode("utf-8", "replace") for k, v in headers_of(row) if k == REJECTION_REASON]


def rejection_problems(record: hr.Hostile, topic: str, offset: int, row) -> list[str]:
    found = []
    if blob(row["sid"]) != REJECTIONS_SID or row["topic"] != REJECTIONS:
        found.append("a rejection not addressed to the rejections topic")
    if row["action"] is not None or row["due_ms"] is not None:
        found.append("a rejection with an action or a due time")
    if (blob(row["key"]), blob(row["value"])) != (record.key, record.value):
        found.append("the rejection altered the key or the value")
    headers = headers_of(row)
    if headers[: len(record.headers)] != record.headers:
        found.append("the rejection altered the headers")
    added = headers[len(record.headers) :]
    reasons = added[:-3]
    if not reasons or any(name != REJECTION_REASON or not value for name, value in reasons):
        found.append(f"rejection reasons {reasons!r}")
    else:
        for _, value in reasons:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                found.append(f"a reason that is not UTF-8: {value!r}")
    if added[-3:] != [(SOURCE_TOPIC, topic.encode()), (SOURCE_PARTITION, b"0"), (SOURCE_OFFSET, str(offset).encode())]:
        found.append(f"source headers {added[-3:]!r}")
    if row["wb_headers"] is not None or row["history"]:
        found.append("a rejection with a write-back or a history copy")
    return found


def request_problems(record: hr.Hostile, topic: str, row) -> list[str]:
    found = []
    dialect, action = record.dialect, row["action"]
    sid = blob(row["sid"])
    if action not in ACTIONS[dialect]:
        found.append(f"action {action!r}")
    if not (
        (sid.startswith(b"id:" + topic.encode() + b"/") and len(sid) > len(topic) + 4)
        or (dialect == "native" and action == "ADD" and sid == b"offset:%s/0/%d" % (topic.encode(), row["src_offset"]))
    ):
        found.append(f"schedule id {sid[:60]!r}")
    targeted = action in ("ADD", "REPLACE")
    if targeted:
        dest = row["topic"]
        if row["due_ms"] is None:
            found.append("no due time")
        elif row["due_ms"] > NOW_MS + SETTINGS.max_ahead_ms:
            found.append(f"due time {row['due_ms']} beyond the limit")
        if (
            dest is None
            or not TOPIC_NAME.fullmatch(dest)
            or dest in (".", "..")
            or dest.startswith("__")
            or dest in OWN
        ):
            found.append(f"destination {dest!r}")
        if len(blob(row["value"]) or b"") > MAX_VALUE_BYTES:
            found.append("value over the limit")
        if dialect != "native" and (row["wb_topic"], row["wb_partition"], blob(row["wb_key"])) != (
            topic,
            0,
            record.key,
        ):
            found.append("no write-back to the request's own topic, partition and key")
        if dialect == "native":
            kept = [(k, v) for k, v in record.headers if not k.lower().startswith("x-scheduler-")]
            if (blob(row["key"]), blob(row["value"]), headers_of(row)) != (record.key, record.value, kept):
                found.append("the delivery's key, value or headers differ from the request's")
        elif dialect in ("karafka", "etf1") and blob(row["value"]) != record.value:
            found.append("the delivered value differs from the request's")
    else:
        if row["due_ms"] is not None or row["wb_headers"] is not None or row["history"]:
            found.append(f"a {action} with a due time, a write-back or a history copy")
        completes = row["completes"]
        if completes is not None and (
            action != "COMPLETE" or not re.fullmatch(rf"{re.escape(topic)}-0-\d+", completes)
        ):
            found.append(f"completes {completes!r}")
    return found


def examine(spark, records: list[hr.Hostile]) -> tuple[list[str], dict, list]:
    """Decode ``records`` in one go: what went wrong (one line per record), the outcome counts per dialect, and
    the decoded rows of each record."""
    decoded = decode_all(spark, records)
    offsets: dict = {}
    wrong, counts, rows_of = [], {}, []
    for record in records:
        topic = TOPIC_OF[record.dialect]
        offset = offsets[topic] = offsets.get(topic, -1) + 1
        rows = decoded.pop((topic, offset), [])
        rows_of.append(rows)
        for problem in problems(record, topic, offset, rows):
            wrong.append(
                f"{record.dialect} #{offset} ({record.why}; key {(record.key or b'')[:30]!r}, value "
                f"{(record.value or b'')[:80]!r}, headers {[(k, (v or b'')[:30]) for k, v in record.headers]}"
                f"): {problem}"
            )
        if rows:
            outcome = "rejected" if rows[0]["kind"] == "reject" else rows[0]["action"]
            counts[record.dialect, outcome] = counts.get((record.dialect, outcome), 0) + 1
    wrong += [f"rows of no input record: {place}" for place in decoded]
    assert sum(counts.values()) == len(records) or wrong
    return wrong, counts, rows_of


def bulk(seed: int, per_dialect: int) -> list[hr.Hostile]:
    chooser = hr.RandomChooser(random.Random(seed))
    ctx = context(huge_bytes=5000)
    return [hr.hostile(chooser, ctx, dialect) for _ in range(per_dialect) for dialect in hr.DIALECTS]


def drawn(examples: int) -> list[hr.Hostile]:
    """Records drawn by hypothesis (its generation leans to edge cases: empty, minimal and maximal choices).

    A decode costs seconds of plan building whatever its size, so every example is collected first and decoded
    together (no shrinking: a failure lists every record that went wrong, with its bytes)."""
    records: list[hr.Hostile] = []

    @settings(
        max_examples=examples,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def collect(data):
        chooser = hr.DrawChooser(data)
        ctx = context()
        records.extend(
            hr.hostile(chooser, ctx, dialect) for dialect in hr.DIALECTS for _ in range(chooser.integer(0, 4))
        )

    collect()
    return records


def huge_records() -> list[hr.Hostile]:
    """Values and headers of megabytes, in every dialect (rejected as too large, or read as they are)."""
    mib = 2**20
    due = str(NOW_MS // 1000 + 60).encode()
    avro_topic = hr.zigzag(NOW_MS) + hr.avro_bytes(b"t" * (3 * mib)) + hr.avro_bytes(b"k") + b"\x00\x00"
    big_header = ("user", b"h" * (3 * mib))
    karafka_schedule = [
        ("schedule_schema_version", b"1.0.0"),
        ("schedule_source_type", b"schedule"),
        ("schedule_target_topic", b"orders"),
    ]
    return [
        hr.Hostile(
            "native",
            b"k",
            b"v" * (4 * mib),
            [("x-scheduler-deliver-to", b"orders"), ("x-scheduler-deliver-at", b"2030-01-01T00:00:00Z")],
            hr.REJECT,
        ),
        hr.Hostile(
            "native",
            b"k",
            b"v",
            [big_header, ("x-scheduler-deliver-to", b"orders"), ("x-scheduler-deliver-at", b"2030-01-01T00:00:00Z")],
            hr.REQUEST,
            "ADD",
        ),
        hr.Hostile(
            "native",
            b"k",
            b"v",
            [("x-scheduler-action", b"CANCEL"), ("x-scheduler-request-id", b"i" * (3 * mib))],
            hr.REQUEST,
            "CANCEL",
        ),
        hr.Hostile(
            "karafka",
            b"id" * mib,
            b"v",
            [*karafka_schedule, ("schedule_target_epoch", due + b"." + b"5" * mib)],
            hr.REQUEST,
            "ADD",
        ),
        hr.Hostile(
            "etf1", b"id", b"v" * (4 * mib), [("scheduler-epoch", due), ("scheduler-target-topic", b"o")], hr.REJECT
        ),
        hr.Hostile("sky-avro", b"id", avro_topic, [], hr.REJECT),
        # a few bytes claiming a string, bytes or map of gigabytes (Avro allocates what is declared)
        hr.Hostile("sky-avro", b"id", hr.zigzag(1) + hr.zigzag(2**31 - 9) + b"t", [], hr.REJECT),
        hr.Hostile("sky-avro", b"id", hr.zigzag(1) + hr.avro_bytes(b"t") + hr.zigzag(2**31 - 9) + b"k", [], hr.REJECT),
        hr.Hostile(
            "sky-avro",
            b"id",
            hr.zigzag(1)
            + hr.avro_bytes(b"t")
            + hr.avro_bytes(b"k")
            + b"\x00"
            + hr.zigzag(2**31 - 9)
            + hr.avro_bytes(b"n")
            + hr.avro_bytes(b"v")
            + b"\x00",
            [],
            hr.REJECT,
        ),
        hr.Hostile("sky-json", b"id", b'{"time": 1, "topic": "' + b"t" * (3 * mib) + b'", "key": ""}', [], hr.REJECT),
        hr.Hostile("sky-json", b"id", b"[" * mib + b"]" * mib, [], hr.REJECT),
        # a nonzero digit a million places after the point: still later than the whole second, never early
        hr.Hostile(
            "karafka",
            b"id",
            b"v",
            [*karafka_schedule, ("schedule_target_epoch", b"1893456000." + b"0" * mib + b"1")],
            hr.REQUEST,
            "ADD",
            "fraction",
        ),
    ]


@pytest.fixture(scope="module")
def generated():
    return {"drawn": drawn(EXAMPLES), "bulk": bulk(20261126, BULK_PER_DIALECT), "huge": huge_records()}


@pytest.fixture(scope="module")
def examined(spark, generated):
    """Every generated record, decoded in one go (a decode costs seconds however few records it has)."""
    everything = [record for records in generated.values() for record in records]
    wrong, counts, rows = examine(spark, everything)
    return wrong, counts, dict(zip(map(id, everything), rows))


def test_every_generated_record_decodes_to_one_outcome(generated, examined):
    assert len(generated["drawn"]) > EXAMPLES
    wrong = examined[0]
    assert not wrong, f"{len(wrong)} records went wrong:\n" + "\n".join(wrong[:12])


def test_a_bulk_of_records_keeps_its_edge(generated, examined):
    """The generator still reaches every outcome: rejections and each action, in every dialect."""
    counts = examined[1]
    for dialect in hr.DIALECTS:
        assert counts.get((dialect, "rejected"), 0) >= BULK_PER_DIALECT // 10, (dialect, counts)
        for action in ACTIONS[dialect]:
            assert counts.get((dialect, action), 0) >= BULK_PER_DIALECT // 30, (dialect, action, counts)
    records = generated["bulk"]
    assert sum(1 for r in records if r.expect == hr.EITHER) < len(records) / 5


def test_a_fraction_a_million_digits_long_still_rounds_up(generated, examined):
    [record] = [r for r in generated["huge"] if r.why == "fraction"]
    [row] = examined[2][id(record)]
    assert row["due_ms"] == 1893456000001


# ---------------------------------------------------------------- the property catches broken decoders


def _no_missing_destination(topic, name, settings):
    """target_reason without its first check: a schedule without a destination topic passes."""
    valid_name, allowed, invalid_text, not_allowed_text = common.destination_rules(topic, settings)
    return common.first_reason(
        (topic.isNotNull() & ~valid_name, invalid_text), (topic.isNotNull() & ~allowed, not_allowed_text)
    )


def _no_duplicate_reasons(names):
    return common.F.filter(common.duplicate_reasons(names), lambda reason: common.F.lit(False))


def _first_check_only(*checks):
    """first_reason keeping only its first check: Sky Avro stops checking that the schedule used every byte."""
    return common.first_reason(checks[0])


MUTANTS = {
    # Karafka stops rejecting a schedule without schedule_target_topic.
    "karafka: missing target topic": (karafka, "target_reason", _no_missing_destination),
    # Native stops rejecting duplicated x-scheduler-* headers.
    "native: duplicate headers": (native, "duplicate_reasons", _no_duplicate_reasons),
    # Sky Avro takes a value with bytes after the schedule, or a truncated current one for an older one.
    "sky-avro: trailing bytes": (sky_avro, "first_reason", _first_check_only),
}


def test_the_property_catches_decoders_that_drop_a_rejection(spark, monkeypatch):
    """Each mutant breaks one dialect; all are decoded in one go (one plan), each must show in its dialect."""
    for owner, name, replacement in MUTANTS.values():
        monkeypatch.setattr(owner, name, replacement)
    wrong, _, _ = examine(spark, bulk(7, 400))
    for mutant in MUTANTS:
        dialect = mutant.split(":")[0]
        assert any(line.startswith(dialect + " ") and "expected a rejection" in line for line in wrong), mutant
