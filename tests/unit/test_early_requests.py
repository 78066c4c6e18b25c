"""Native ADDs and REPLACEs read as they arrive (engine/driver/early_requests.py): what the driver decodes in Python
is a request the job's decoder accepts with the same fields, over hostile records and the client's own encoding."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from kafka_scheduler import dialects
from kafka_scheduler.client.encoders import encode_native
from kafka_scheduler.engine.driver.early_cancels import Arrival
from kafka_scheduler.engine.driver.early_requests import (
    due_ms_of,
    early_decoder,
    lateness_ms_of,
    native_early_request,
)
from kafka_scheduler.kafka.topics import Destination

from .. import hostile_records as hr
from .test_hostile_decode import NOW, NOW_MS, SETTINGS, context
from .test_native_decode import KAFKA_SCHEMA

TOPIC = "app-schedule-requests"


def client_records(rng: random.Random, count: int) -> list[hr.Hostile]:
    """Requests as the client encodes them: every form of due time, id, lateness and headers it writes."""
    records = []
    for n in range(count):
        due = NOW + timedelta(milliseconds=rng.choice([-5_000, 0, 1, 999, 3_000, 86_400_000, rng.randint(1, 10**10)]))
        request_id = None if n % 7 == 0 else rng.choice(["r-1", "r é", "x" * 40])
        encoded = encode_native(
            rng.choice(["ADD", "REPLACE"]) if n % 3 and request_id else "ADD",
            request_id=request_id,
            topic=rng.choice(["orders", "orders-2.x"]),
            due=due,
            key=rng.choice([None, b"", b"k"]),
            value=rng.choice([None, b"", b"v" * rng.randint(1, 100)]),
            headers=rng.choice([(), (("trace", b"1"),), (("a", None), ("b", b"\xff"))]),
            max_lateness=rng.choice([None, 1, "10m", "PT1H", timedelta(seconds=3)]),
        )
        if encoded.headers and encoded.headers[0][1] == b"ADD" and n % 2:
            encoded = encoded._replace(headers=encoded.headers[1:])  # an ADD may leave its action out
        records.append(
            hr.Hostile("native", encoded.key, encoded.value, list(encoded.headers), hr.EITHER, None, "client")
        )
    return records


def by_hand() -> list[hr.Hostile]:
    """Edges the generator may miss: each field at the border of what the decoder takes."""
    base = {"x-scheduler-deliver-to": b"orders", "x-scheduler-deliver-at": b"2026-12-24T18:00:00Z"}

    def request(**changes):
        fields = {**base, **{k.replace("_", "-"): v for k, v in changes.items()}}
        headers = [(name if name.startswith("x-") else f"x-scheduler-{name}", v) for name, v in fields.items()]
        return hr.Hostile("native", b"k", b"v", [(n, v) for n, v in headers if v is not ...], hr.EITHER, None, "hand")

    far = (NOW + timedelta(days=100 * 365 + 1)).strftime("%Y-%m-%dT%H:%M:%SZ").encode()
    return [
        *(request(max_lateness=v) for v in (b"0", b"0ms", b"-5", b" ", b"", b"pt0s", b"1", b"\xff", None)),
        *(request(request_id=v) for v in (b"", b" ", b"\x00", None)),
        request(action=b"REPLACE", request_id=...),
        request(action=b"REPLACE", request_id=b"r"),
        request(action=b" add "),
        request(action=b"ADD\t"),
        request(deliver_at=far),
        *(
            request(deliver_to=v)
            for v in (b"__consumer_offsets", b"app-schedule-requests", b".", b"..", b"a/b", b"\xff")
        ),
        *(request(deliver_to=v) for v in (b"a" * 249, b"a" * 250, b" orders", None)),
        hr.Hostile("native", b"k", b"v" * 5_000_000, request().headers, hr.EITHER, None, "hand"),
    ]


def test_what_the_driver_decodes_early_the_decoder_accepts_with_the_same_fields(spark):
    chooser, ctx = hr.RandomChooser(random.Random(20261203)), context(huge_bytes=2_000)
    records = [hr.hostile(chooser, ctx, "native", garbage_share=0.2) for _ in range(3_000)]
    records += by_hand()
    records += client_records(random.Random(7), 600)
    rows = [(r.key, r.value, TOPIC, 0, offset, NOW, 0, r.headers) for offset, r in enumerate(records)]
    decoded = {
        row["src_offset"]: row
        for row in dialects.decode(spark.createDataFrame(rows, KAFKA_SCHEMA), {TOPIC: "native"}, SETTINGS).collect()
    }
    assert len(decoded) == len(records)
    early = {}
    for offset, r in enumerate(records):
        found = native_early_request(Arrival(TOPIC, 0, offset, NOW_MS), NOW_MS, r.key, r.value, r.headers, SETTINGS)
        if found is not None:
            early[offset] = found
    wrong = []
    for offset, found in early.items():
        row = decoded[offset]
        theirs = (
            row["kind"],
            row["action"],
            bytes(row["sid"]),
            row["due_ms"],
            row["topic"],
            None if row["key"] is None else bytes(row["key"]),
            None if row["value"] is None else bytes(row["value"]),
            tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in row["headers"]),
            row["max_lateness_ms"],
            row["delivery_id"],
        )
        ours = (
            "request",
            found.action,
            found.sid,
            found.due_ms,
            found.topic,
            found.key,
            found.value,
            found.headers,
            found.max_lateness_ms,
            found.delivery_id,
        )
        if theirs != ours:
            wrong.append((offset, records[offset].headers, theirs, ours))
    assert not wrong, wrong[:3]
    # The early path is worth its keep: it takes what the client writes, and a share of the rest.
    client_offsets = range(len(records) - 600, len(records))
    accepted = [o for o in client_offsets if o in early]
    requests = [o for o in client_offsets if decoded[o]["kind"] == "request"]
    assert len(accepted) == len(requests) > 300, (len(accepted), len(requests))
    assert len(early) > len(accepted) + 100


@pytest.mark.parametrize(
    "text,due",
    [
        ("2026-12-24T18:00:00Z", 1_798_135_200_000),
        ("2026-12-24T18:00:00.5Z", 1_798_135_200_500),
        ("2026-12-24T18:00:00.0005Z", 1_798_135_200_001),  # below a millisecond: rounded up, never early
        ("2026-12-24T18:00:00.000000001Z", 1_798_135_200_001),
        ("2024-02-29T00:00:00Z", 1_709_164_800_000),
        ("2026-02-29T00:00:00Z", None),  # no such day: the decoder's to judge
        ("2026-12-24T18:00:60Z", None),
        ("2026-12-24T18:00:00+00:00", None),  # another spelling: the decoder's
        ("2026-12-24t18:00:00Z", None),
        ("\uff12026-12-24T18:00:00Z", None),  # a digit outside ASCII
        (None, None),
    ],
)
def test_due_times_as_the_client_writes_them(text, due):
    assert due_ms_of(text) == due


@pytest.mark.parametrize(
    "text,ms",
    [
        ("600000", 600_000),
        (" 10M ", 600_000),
        ("1h30m", 5_400_000),
        ("250ms", 250),
        ("PT0.5S", 500),
        ("p1d", 86_400_000),
        ("", None),
        ("pt", None),
        ("10x", None),
        ("\u0661\u0660", None),  # digits outside ASCII
    ],
)
def test_lateness_as_the_decoder_reads_it(text, ms):
    assert lateness_ms_of(text) == ms


def test_a_destination_rule_given_as_a_regex_leaves_every_request_to_the_batches():
    headers = list(encode_native("ADD", topic="orders", due=datetime(2030, 1, 1, tzinfo=UTC)).headers)
    arrival = Arrival(TOPIC, 0, 1, NOW_MS)
    assert native_early_request(arrival, NOW_MS, None, b"v", headers, SETTINGS) is not None
    regex = SETTINGS.__class__(**{**SETTINGS.__dict__, "allowed_destinations": "orders.*"})
    assert native_early_request(arrival, NOW_MS, None, b"v", headers, regex) is None


@pytest.mark.parametrize(
    "destination, value_bytes, taken",
    [
        (Destination(1, True, None), 100, True),
        (Destination(1, True, 2000), 100, True),
        (Destination(1, True, 2000), 5000, False),  # the sink makes a rejection of it (lz4 would let it through)
        (Destination(1, True, 2000), 1700, False),  # the key, the headers and the framing count too
        (Destination(1, False, None), 100, False),  # not writable: a rejection
        (None, 100, False),  # not looked up yet, or missing
    ],
)
def test_only_a_request_the_sink_would_write_as_it_is_goes_out_early(destination, value_bytes, taken):
    decode = early_decoder(SETTINGS, 10_000, {"orders": destination}.get)
    due = (datetime.now(UTC) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ").encode()
    headers = [("x-scheduler-deliver-to", b"orders"), ("x-scheduler-deliver-at", due), ("x-scheduler-request-id", b"r")]
    request = decode(Arrival(TOPIC, 0, 5, NOW_MS), NOW_MS, b"k", b"v" * value_bytes, headers)
    assert (request is not None) == taken
