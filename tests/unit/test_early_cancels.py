"""CANCELs read as they arrive (engine/driver/early_cancels.py): which records are valid native CANCELs (the same
verdict as the native decoder's, over hostile records), and what the timed writer drops for one: every version of its
id made before it in its partition, held now or handed over later by a batch that had not read it, and nothing else."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_scheduler import dialects
from kafka_scheduler.delivery_ids import delivery_id, request_of
from kafka_scheduler.engine.contract import KIND_DELIVER, KIND_HISTORY, WriterRow
from kafka_scheduler.engine.driver import early_cancels
from kafka_scheduler.engine.driver.early_cancels import (
    Arrival,
    ArrivalTimes,
    CancelWatcher,
    EarlyCancels,
    KeyedApart,
    first_headers,
    first_headers_one_by_one,
    made_before,
    native_cancel_sid,
    native_request_sid,
    request_sids,
)
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
    assert watcher_sids(headers)[1] == sid


def watcher_sids(headers):
    """What the watcher's read finds of a record's headers: the id it names, the id it cancels."""
    return request_sids(TOPIC, first_headers(headers) or {})


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
        or watcher_sids(records[o].headers)[1] != decided[o]
    ]
    assert not wrong, wrong[:5]


@pytest.mark.parametrize(
    "delivery_id,partition,offset,stamp,superseded",
    [
        ("app-schedule-requests-0-17", 0, 18, 0, True),
        ("app-schedule-requests-0-17", 0, 17, 0, False),  # the request itself
        ("app-schedule-requests-0-17", 0, 16, 9_999, False),  # a version made after the CANCEL in its partition
        ("app-schedule-requests-0-17", 1, 18, 1_001, True),  # another partition: stamped after the version's request
        ("app-schedule-requests-0-17", 1, 3, 999, False),  # another partition, stamped before it
        ("app-schedule-requests-0-17", 1, 3, 1_000, True),  # a tie: the lower partition's request comes first
        ("app-schedule-requests-1-17", 0, 3, 1_000, False),  # a tie, the version made in the higher partition
        ("app-schedule-requests-0-16", 1, 3, 0, True),  # a request never read early came before
        ("app-schedule-requests-0-17@1764590400000", 0, 99, 0, False),  # a cron's firing
        ("\0" + "3", 0, 99, 0, False),
    ],
)
def test_a_cancel_supersedes_the_versions_made_before_it_in_log_order(
    delivery_id, partition, offset, stamp, superseded
):
    times = ArrivalTimes()
    times.note(TOPIC, 0, 17, 1_000)
    times.note(TOPIC, 1, 17, 1_000)
    assert made_before(delivery_id, Arrival(TOPIC, partition, offset, stamp), times) == superseded


def test_arrival_stamps_are_a_running_maximum_per_partition_and_are_forgotten_once_committed():
    times = ArrivalTimes()
    assert [times.note(TOPIC, 0, o, t).stamp for o, t in ((5, 100), (6, 90), (8, 120))] == [100, 100, 120]
    assert times.stamp(TOPIC, 0, 6) == 100 and times.stamp(TOPIC, 0, 7) is None and times.stamp(TOPIC, 1, 6) is None
    times.forget({TOPIC: {0: 8}})
    assert times.stamp(TOPIC, 0, 6) is None and times.stamp(TOPIC, 0, 8) == 120 and len(times) == 1


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
    writer.read_early([(TOPIC, 1, 30, 5_000, None, None)])  # an ADD in partition 1, stamped after the CANCELs below
    writer.hold(
        [
            row("r-1", 10, later(60)),
            row("r-1", 10, later(60), kind=KIND_HISTORY),
            row("r-1", 30, later(60), partition=1),
            row("r-2", 11, later(60)),
        ]
    )
    assert writer.held == 3
    assert writer.cancel_early(TOPIC, sid, 0, 20, 2_000) == 1  # the version from offset 10 (and its history copy)
    assert writer.held == 2 and writer.withdrawn_early == 1
    assert writer.cancel_early(TOPIC, f"id:{TOPIC}/r-3".encode(), 0, 40, 2_001) == 0
    assert writer.cancel_early(TOPIC, sid, 0, 21, 2_002) == 0  # already gone; partition 1's was made after it
    assert writer.take_withdrawn_early() == 1 and writer.take_withdrawn_early() == 0
    # What a batch withdraws later is no longer held: nothing counted twice.
    assert writer.withdraw([f"{TOPIC}-0-10"]) == 0


def test_a_cancel_read_before_its_version_is_handed_over_drops_it_when_it_is(writer):
    sid = f"id:{TOPIC}/r-1".encode()
    assert writer.cancel_early(TOPIC, sid, 0, 20, 2_000) == 0
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
    writer.cancel_early(TOPIC, sid, 0, 12, 2_000)
    assert writer.wait_written(later(0.5), timeout=10)
    assert [(topic, key) for _, topic, key in writer._producer.sent] == [("orders", b"r-2")]


def test_cancels_kept_for_later_are_bounded():
    kept = EarlyCancels(limit=2)
    for offset in range(5):
        kept.add(b"id:x", Arrival(TOPIC, 0, offset, offset))
    assert len(kept) == 2
    kept.forget({TOPIC: {0: 1}})
    assert len(kept) == 1


def test_a_cancel_keyed_apart_drops_the_versions_stamped_before_it_in_other_partitions(writer):
    """Requests of one id from different partitions are ordered by the broker's stamps: a CANCEL in partition 1
    drops a version made in partition 0 by a request stamped before it, and not one stamped after it."""
    sid = f"id:{TOPIC}/r-1".encode()
    writer.read_early([(TOPIC, 0, 10, 1_000, None, None), (TOPIC, 0, 11, 3_000, None, None)])
    writer.hold([row("r-1", 10, later(60)), row("r-1", 11, later(60))])
    assert writer.read_early([(TOPIC, 1, 4, 2_000, sid, None)]) == 1
    assert writer.held == 1 and writer.withdraw([f"{TOPIC}-0-11"]) == 1  # the later ADD's version was kept
    # Handed over after the CANCEL was read (a batch that had not read it): a version stamped before it goes too.
    writer.read_early([(TOPIC, 0, 12, 1_500, None, None)])  # stamped 1,500 but after 3,000 in its partition: 3,000
    writer.hold([row("r-1", 9, later(60)), row("r-1", 12, later(60))])
    assert writer.held == 1 and writer.withdraw([f"{TOPIC}-0-12"]) == 1


class FakeMessage:
    def __init__(self, partition, offset, timestamp, headers, topic=TOPIC, key=None, value=b"v"):
        self._values = (topic, partition, offset, (1, timestamp), headers)
        self._key, self._value = key, value

    def error(self):
        return None

    def key(self):
        return self._key

    def value(self):
        return self._value

    def topic(self):
        return self._values[0]

    def partition(self):
        return self._values[1]

    def offset(self):
        return self._values[2]

    def timestamp(self):
        return self._values[3]

    def headers(self):
        return self._values[4]


def test_the_watcher_counts_the_requests_of_an_id_keyed_apart_and_cancels_across_partitions(writer):
    counts = []
    watcher = CancelWatcher(writer, [TOPIC], {}, dict, on_keyed_apart=counts.append)
    add = [("x-scheduler-request-id", b"r-1"), ("x-scheduler-deliver-to", b"orders")]
    writer.hold([row("r-1", 10, later(60))])
    watcher.read([FakeMessage(0, 10, 1_000, add), FakeMessage(0, 11, 1_100, add)])
    assert counts == [] and writer.held == 1
    watcher.read([FakeMessage(1, 3, 2_000, cancel(b"r-1")), FakeMessage(2, 3, 2_100, cancel(b"r-2"))])
    assert counts == [1] and watcher.keyed_apart.count == 1 and writer.held == 0


def test_the_watcher_tells_how_far_behind_its_read_is_from_the_newest_record(writer):
    behind = []
    watcher = CancelWatcher(writer, [TOPIC], {}, dict, on_behind=behind.append)
    now_ms = int(time.time() * 1000)
    add = [("x-scheduler-request-id", b"r-1"), ("x-scheduler-deliver-to", b"orders")]
    watcher.read([FakeMessage(1, 3, now_ms - 5_000, add), FakeMessage(0, 10, now_ms - 8_000, add)])
    assert len(behind) == 1 and 5.0 <= behind[0] < 6.0  # the newest record, whatever its partition
    watcher.read([])
    assert len(behind) == 1  # nothing read, nothing told


def test_ids_keyed_apart_are_counted_per_id_and_the_ids_followed_are_bounded():
    apart = KeyedApart(limit=2)
    notes = ((b"a", 0), (b"a", 0), (b"a", 1), (b"b", 1), (b"c", 1), (b"a", 0), (b"d", 1), (b"e", 1), (b"f", 1))
    assert [apart.note(sid, p) for sid, p in notes] == [False, False, True, False, False, True, False, False, False]
    # a, four ids back, still followed (at most twice the limit); f made five: trimmed to the last two (e, f)
    assert [apart.note(sid, p) for sid, p in ((b"a", 1), (b"e", 0))] == [False, True]
    assert apart.count == 3


@pytest.mark.parametrize(
    "headers,sid",
    [
        (cancel(b"r-1"), b"id:app-schedule-requests/r-1"),
        ([("x-scheduler-request-id", b"r-1")], b"id:app-schedule-requests/r-1"),  # an ADD
        (cancel(b"r-1", "CRON_PAUSE"), b"cron:app-schedule-requests/r-1"),
        (cancel(b""), None),
        ([("x-scheduler-deliver-to", b"orders")], None),  # an ADD without id: nothing can follow it
    ],
)
def test_a_native_request_names_its_id(headers, sid):
    assert native_request_sid(TOPIC, headers) == sid
    assert watcher_sids(headers)[0] == sid


HEADER_NAMES = st.sampled_from(
    ["x-scheduler-action", "X-Scheduler-Action", "x-scheduler-request-id", "X-SCHEDULER-DELIVER-AT", "trace", "Trace"]
)


@given(
    st.lists(
        st.tuples(
            st.one_of(HEADER_NAMES, HEADER_NAMES.map(str.encode), st.text(max_size=3)),
            st.one_of(st.none(), st.binary(max_size=3)),
        ),
        max_size=6,
    )
)
def test_the_headers_read_at_once_are_those_read_one_by_one(headers):
    """The one-pass reading of a record's headers (first_headers on a list) against the plain loop: names of bytes,
    names given twice in another case, SINGLE_HEADERS twice (None)."""
    assert first_headers(headers) == first_headers_one_by_one(headers)


class GateRecordingWriter:
    def __init__(self):
        self.read = []
        self.through = []

    def read_early(self, records, early=None):
        self.read += records
        return 0

    def read_through(self, through_ms):
        self.through.append(through_ms)


def test_the_watcher_tells_the_writer_how_far_it_has_read_every_partition_while_it_is_behind():
    """Behind (the consumer had more at once, or the newest record read is over READ_LAG_ALLOWED_MS old), the writer
    is told the oldest of the newest broker times read per partition read lately; caught up, None. A partition that
    went quiet stops counting after READ_SEEN_S."""
    writer = GateRecordingWriter()
    watcher = CancelWatcher(writer, [TOPIC], {}, dict)
    add = [("x-scheduler-request-id", b"r-1"), ("x-scheduler-deliver-to", b"orders")]
    now = int(time.time() * 1000)
    watcher.read([FakeMessage(0, 1, now, add), FakeMessage(1, 1, now + 2, add), FakeMessage(0, 2, now + 1, add)], True)
    assert writer.through == [now + 1]  # partition 0 read up to now + 1, partition 1 up to now + 2
    watcher.read([FakeMessage(1, 2, now + 3, add)], more_waiting=True)
    assert writer.through[-1] == now + 1  # partition 0 was read lately and may still be behind
    watcher.read([FakeMessage(0, 3, now + 4, add)], more_waiting=False)
    assert writer.through[-1] is None  # caught up: a fresh record, nothing more at once
    watcher.read([FakeMessage(0, 4, now - 5_000, add), FakeMessage(1, 3, now - 4_000, add)], more_waiting=False)
    assert writer.through[-1] == now + 3  # nothing more at once, but old records: behind all the same
    watcher.read([], more_waiting=False)
    assert writer.through[-1] is None
    for key in watcher._newest:
        stamp, _ = watcher._newest[key]
        watcher._newest[key] = (stamp, time.monotonic() - early_cancels.READ_SEEN_S - 1)
    watcher.read([FakeMessage(1, 4, now - 3_000, add)], more_waiting=True)
    assert writer.through[-1] == now + 3  # partition 0 went quiet: read to its end; partition 1's newest stays


def test_a_partition_the_consumer_left_unread_for_a_while_still_holds_the_gate_back():
    """A partition not read for READ_SEEN_S counts as quiet only if the broker holds nothing past what was read (its
    high watermark as last fetched): the consumer may serve other partitions for seconds while it is behind."""
    writer = GateRecordingWriter()
    watcher = CancelWatcher(writer, [TOPIC], {}, dict)
    add = [("x-scheduler-request-id", b"r-1"), ("x-scheduler-deliver-to", b"orders")]
    now = int(time.time() * 1000)
    watcher.read([FakeMessage(0, 10, now - 9_000, add), FakeMessage(1, 20, now - 8_000, add)], more_waiting=True)
    for key in watcher._newest:
        stamp, _ = watcher._newest[key]
        watcher._newest[key] = (stamp, time.monotonic() - early_cancels.READ_SEEN_S - 1)
    high = {0: 11, 1: 500}  # partition 0 read to its end, partition 1 not
    watcher.high_watermark = lambda topic, partition: high[partition]
    watcher.read([FakeMessage(0, 11, now - 1_000, add)], more_waiting=True)
    assert writer.through[-1] == now - 8_000  # held back at what partition 1 was read up to
    high[1] = 21  # read to its end after all: quiet
    watcher.read([FakeMessage(0, 12, now - 500, add)], more_waiting=True)
    assert writer.through[-1] == now - 500
    watcher.high_watermark = lambda topic, partition: None  # not known: as before, quiet once not read lately
    watcher.read([FakeMessage(0, 13, now - 400, add)], more_waiting=True)
    assert writer.through[-1] == now - 400
