"""CANCELs read as they arrive (engine/driver/early_cancels.py): which records are valid native CANCELs (the same
verdict as the native decoder's, over hostile records), and what the timed writer drops for one: every version of its
id made before it in its partition, held now or handed over later by a batch that had not read it, and nothing else."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from kafka_scheduler import dialects
from kafka_scheduler.delivery_ids import delivery_id, request_of
from kafka_scheduler.engine.contract import KIND_DELIVER, KIND_HISTORY, WriterRow
from kafka_scheduler.engine.driver.early_cancels import EarlyCancels, native_cancel_sid, superseded_by
from kafka_scheduler.engine.driver.timed_writer import TimedWriter

from .. import hostile_records as hr
from .test_hostile_decode import NOW, SETTINGS, context
from .test_native_decode import KAFKA_SCHEMA
from .test_timed_writer import FakeProducer

TOPIC = "app-schedule-requests"


def cancel(request_id, action="CANCEL", extra=()):
    return [
        ("x-scheduler-action", action if isinstance(action, (bytes, type(None))) else action.encode()),
        ("x-scheduler-request-id", request_id),
        *extra,
    ]


@pytest.mark.parametrize(
    "headers,sid",
    [
        (cancel(b"r-1"), b"id:app-schedule-requests/r-1"),
        (cancel(b"\xff\x00"), b"id:app-schedule-requests/\xff\x00"),  # ids are any bytes
        (cancel(b"r-1", " cancel "), b"id:app-schedule-requests/r-1"),  # spaces and case, as the decoder
        ([("X-Scheduler-Action", b"CANCEL"), ("X-SCHEDULER-REQUEST-ID", b"r")], b"id:app-schedule-requests/r"),
        (cancel(b"r-1", "\tCANCEL"), None),  # the decoder trims spaces only
        (cancel(b""), None),
        (cancel(None), None),
        (cancel(b"r-1", None), None),  # an action header without a value: an ADD
        (cancel(b"r-1", "CRON_CANCEL"), None),  # a cron's: the state's to apply
        (cancel(b"r-1", "REPLACE"), None),
        ([("x-scheduler-request-id", b"r-1")], None),  # no action: an ADD
        (cancel(b"r-1", extra=[("x-scheduler-action", b"CANCEL")]), None),  # duplicated: rejected
        (cancel(b"r-1", extra=[("X-Scheduler-Deliver-At", b"a"), ("x-scheduler-deliver-at", b"b")]), None),
        (cancel(b"r-1", extra=[("x-scheduler-deliver-to", b"not a topic!")]), b"id:app-schedule-requests/r-1"),
    ],
)
def test_a_valid_native_cancel_names_its_schedule(headers, sid):
    assert native_cancel_sid(TOPIC, headers) == sid


def test_the_verdict_is_the_native_decoders_over_hostile_records(spark):
    """Every native record of the hostile generator (valid requests with fields removed, duplicated, nulled, spoiled,
    respelled; raw garbage), decoded by the job's decoder: a CANCEL request where, and only where, the watcher
    finds a valid CANCEL, with the same schedule id."""
    chooser, ctx = hr.RandomChooser(random.Random(20261201)), context(huge_bytes=2_000)
    records = [hr.hostile(chooser, ctx, "native", garbage_share=0.2) for _ in range(3_000)]
    records += [
        hr.Hostile("native", None, None, h, hr.EITHER, None, "by hand")
        for h in (
            cancel(b"r", "CANCEL\u00a0"),
            cancel(b"r", "cancel"),
            cancel(b"r", "Cancel"),
            cancel(b"r", "\u0441ancel"),
            [("x-scheduler-action", b"CANCEL"), ("x-scheduler-request-id", b"a"), ("X-Scheduler-Request-Id", b"b")],
            [("x-scheduler-action\u212a", b"CANCEL"), ("x-scheduler-request-id", b"a")],
            [("x-scheduler-action", b"CAN\xffCEL"), ("x-scheduler-request-id", b"a")],
        )
    ]
    rows = [(r.key, r.value, TOPIC, 0, offset, NOW, 0, r.headers) for offset, r in enumerate(records)]
    frame = dialects.decode(spark.createDataFrame(rows, KAFKA_SCHEMA), {TOPIC: "native"}, SETTINGS)
    decided = {
        row["src_offset"]: bytes(row["sid"]) if (row["kind"], row["action"]) == ("request", "CANCEL") else None
        for row in frame.select("src_offset", "kind", "action", "sid").collect()
    }
    assert len(decided) == len(records)
    cancels = [o for o, sid in decided.items() if sid is not None]
    assert len(cancels) > 200, "the generator made too few valid CANCELs to say anything"
    wrong = [
        (o, records[o].headers, decided[o])
        for o in range(len(records))
        if native_cancel_sid(TOPIC, records[o].headers) != decided[o]
    ]
    assert not wrong, wrong[:5]


@pytest.mark.parametrize(
    "delivery_id,partition,offset,superseded",
    [
        ("app-schedule-requests-0-17", 0, 18, True),
        ("app-schedule-requests-0-17", 0, 17, False),  # the request itself
        ("app-schedule-requests-0-17", 0, 16, False),  # a version made after the CANCEL
        ("app-schedule-requests-0-17", 1, 18, False),  # another partition: the batch's to tell
        ("app-schedule-requests-0-17@1764590400000", 0, 99, False),  # a cron's firing
        ("\0" + "3", 0, 99, False),
    ],
)
def test_a_cancel_supersedes_the_versions_made_before_it_in_its_partition(delivery_id, partition, offset, superseded):
    assert superseded_by(delivery_id, partition, offset) == superseded


def test_a_delivery_id_names_the_request_the_decoders_read(spark):
    """``delivery_ids.request_of`` reads back what the decoders build (dialects/common.py ``delivery_id``), for topics
    with dashes and digits in their names; a cron firing's names its activating request."""
    rows = [
        (b"k", b"v", topic, partition, offset, NOW, 0, cancel(b"r"))
        for topic, partition, offset in (
            ("app-schedule-requests", 0, 17),
            ("a-1-2", 11, 0),
            ("x", 3, 9_007_199_254_740_993),
        )
    ]
    frame = dialects.decode(spark.createDataFrame(rows, KAFKA_SCHEMA), {r[2]: "native" for r in rows}, SETTINGS)
    named = {request_of(row["delivery_id"]) for row in frame.select("delivery_id").collect()}
    assert named == {(topic, str(partition), str(offset)) for _, _, topic, partition, offset, *_ in rows}
    assert request_of("a-1-2-11-0@1764590400000") == ("a-1-2", "11", "0")
    for malformed in ("no-dash", "t-0-x", "t-0-1@", "t-0-1@x"):
        with pytest.raises(ValueError):
            request_of(malformed)


def row(request_id: str, offset: int, due_ms: int, partition: int = 0, topic: str = TOPIC, kind: str = KIND_DELIVER):
    return WriterRow(
        delivery_id(topic, partition, offset),
        due_ms,
        kind,
        "orders",
        None,
        request_id.encode(),
        b"v",
        [],
        held=True,
        sid=f"id:{topic}/{request_id}".encode() if kind == KIND_DELIVER else None,
    )


@pytest.fixture
def writer():
    instance = TimedWriter("unused", producer=FakeProducer())
    yield instance
    instance.close()


def later(seconds: float) -> int:
    return int(datetime.now(UTC).timestamp() * 1000 + seconds * 1000)


def test_a_cancel_read_early_drops_what_the_writer_holds_of_its_id_and_nothing_else(writer):
    sid = f"id:{TOPIC}/r-1".encode()
    writer.hold(
        [
            row("r-1", 10, later(60)),
            row("r-1", 10, later(60), kind=KIND_HISTORY),
            row("r-1", 30, later(60), partition=1),
            row("r-2", 11, later(60)),
        ]
    )
    assert writer.held == 3
    assert writer.cancel_early(TOPIC, sid, 0, 20) == 1  # the version from offset 10 (and its history copy)
    assert writer.held == 2 and writer.withdrawn_early == 1
    assert writer.cancel_early(TOPIC, f"id:{TOPIC}/r-3".encode(), 0, 40) == 0
    assert writer.cancel_early(TOPIC, sid, 0, 21) == 0  # already gone; partition 1's is not this cancel's
    assert writer.take_withdrawn_early() == 1 and writer.take_withdrawn_early() == 0
    # What a batch withdraws later is no longer held: nothing counted twice.
    assert writer.withdraw([f"{TOPIC}-0-10"]) == 0


def test_a_cancel_read_before_its_version_is_handed_over_drops_it_when_it_is(writer):
    sid = f"id:{TOPIC}/r-1".encode()
    assert writer.cancel_early(TOPIC, sid, 0, 20) == 0
    # A batch that read the ADD (offset 10) but not the CANCEL hands the version over afterwards: dropped. One made
    # by an ADD after the CANCEL (offset 25) is a new version: kept.
    writer.hold([row("r-1", 10, later(60)), row("r-1", 25, later(60))])
    assert writer.held == 1 and writer.withdrawn_early == 1
    # Once a committed batch has read the CANCEL, the state has applied it: forgotten.
    writer.forget_cancels({TOPIC: {0: 21}})
    writer.hold([row("r-1", 5, later(60))])  # (no batch could hand this over now; forgotten, it is kept)
    assert writer.held == 2


def test_a_dropped_delivery_is_never_written_and_the_others_are(writer):
    sid = f"id:{TOPIC}/r-1".encode()
    writer.hold([row("r-1", 10, later(0.3)), row("r-2", 11, later(0.3))])
    writer.cancel_early(TOPIC, sid, 0, 12)
    assert writer.wait_written(later(0.5), timeout=10)
    assert [(topic, key) for _, topic, key in writer._producer.sent] == [("orders", b"r-2")]


def test_cancels_kept_for_later_are_bounded():
    kept = EarlyCancels(limit=2)
    for offset in range(5):
        kept.add(TOPIC, b"id:x", 0, offset)
    assert len(kept) == 2
    kept.forget({TOPIC: {0: 1}})
    assert len(kept) == 1
