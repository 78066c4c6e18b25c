"""The timed writer on a fake producer: each record at its due instant, never before; withdrawn ones never;
rejections (no delivery id, no due time) at once; ``wait_written`` returns once what is due is written."""

import time

from confluent_kafka import KafkaError, KafkaException

from kafka_scheduler.engine.contract import KIND_DELIVER, KIND_HISTORY, KIND_REJECT, TICK_REPORT, TICK_WAKE, WriterRow
from kafka_scheduler.engine.driver.producing import send_sorting_refusals
from kafka_scheduler.engine.driver.timed_writer import TimedWriter
from kafka_scheduler.engine.driver.wakeups import Wakeups

from ..integration.support import wait_until


class FakeProducer:
    def __init__(self):
        self.sent = []  # (wall ms, topic, key)
        self.values = []
        self.headers = []

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None, **kwargs):
        self.sent.append((int(time.time() * 1000), topic, key))
        self.values.append(value)
        self.headers.append(headers)
        if on_delivery is not None:
            on_delivery(None, None)

    def poll(self, timeout):
        return 0

    def flush(self, timeout=None):
        return 0


def row(delivery_id, due_ms, key, kind=KIND_DELIVER, topic="out") -> WriterRow:
    return WriterRow(delivery_id, due_ms, kind, topic, None, key, b"v", [("h", b"1")])


def test_each_record_at_its_due_time_withdrawn_ones_never_rejections_at_once():
    producer = FakeProducer()
    writer = TimedWriter("unused", max_held=10, producer=producer)
    try:
        now = int(time.time() * 1000)
        writer.hold(
            [
                row("a", now + 300, b"a"),
                row("a", now + 300, b"a", kind=KIND_HISTORY, topic="hist"),
                row("b", now + 150, b"b"),
                row("c", now + 200, b"c"),
                row(None, None, b"bad", kind=KIND_REJECT),
                row(None, None, b"bad2", kind=KIND_REJECT),
            ]
        )
        assert writer.held == 5 and writer.room() == 5
        assert writer.withdraw(["c", "unknown"]) == 1
        assert writer.wait_written(now + 300, timeout=10)
        sent = {(topic, key): at for at, topic, key in producer.sent}
        assert set(sent) == {("out", b"a"), ("hist", b"a"), ("out", b"b"), ("out", b"bad"), ("out", b"bad2")}
        assert (
            sent[("out", b"a")] >= now + 300 and sent[("hist", b"a")] >= now + 300 and sent[("out", b"b")] >= now + 150
        )
        assert sent[("out", b"bad")] < now + 150, "a rejection waits for nothing"
        assert writer.written == 4 and writer.withdrawn == 1 and writer.held == 0
    finally:
        writer.close()


def test_wait_written_times_out_while_something_due_is_not_written():
    class StuckProducer(FakeProducer):
        def flush(self, timeout=None):
            time.sleep(0.5)
            return 0

    writer = TimedWriter("unused", producer=StuckProducer())
    try:
        now = int(time.time() * 1000)
        writer.hold([row("a", now, b"a")])
        assert not writer.wait_written(now, timeout=0.1)
        assert writer.wait_written(now, timeout=5)
    finally:
        writer.close()


def test_wakeups_tick_once_per_instant_never_before_it():
    producer = FakeProducer()
    wakeups = Wakeups("unused", "ticks", producer=producer)
    try:
        now = int(time.time() * 1000)
        wakeups.start()  # the report tick
        wakeups.add([now + 200, now + 100, now + 200, None])
        assert wakeups.next_instant == now + 100
        wait_until(lambda: wakeups.ticks >= 3, 60, "two wake-up ticks after the report tick")
        at = [sent_at for sent_at, _, _ in producer.sent]
        assert at[1] >= now + 100 and at[2] >= now + 200, "a tick before its instant"
        assert wakeups.next_instant is None
        wakeups.add([now + 200])  # already ticked for and passed: ticks again (a timer re-armed at that instant)
        wait_until(lambda: wakeups.ticks == 4, 10, "the tick of a passed instant")
    finally:
        wakeups.close()
    assert [topic for _, topic, _ in producer.sent] == ["ticks"] * 4
    assert producer.values == [TICK_REPORT, TICK_WAKE, TICK_WAKE, TICK_WAKE]


class RefusingProducer(FakeProducer):
    """Refuses records to some topics as a broker would: in the delivery report, or before sending (as librdkafka does
    for a record over its own size limit); fails the first attempt at a 'flaky' topic with a transient error."""

    def __init__(self, in_report: dict, at_produce: dict):
        super().__init__()
        self.in_report, self.at_produce = in_report, at_produce
        self.records = []  # (topic, key, value, headers) actually accepted
        self.flaky_failures = 1

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None, **kwargs):
        if topic in self.at_produce:
            raise KafkaException(KafkaError(self.at_produce[topic]))
        if topic == "flaky" and self.flaky_failures:
            self.flaky_failures -= 1
            on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), None)
            return
        if topic in self.in_report:
            on_delivery(KafkaError(self.in_report[topic]), None)
            return
        self.records.append((topic, key, value, headers))
        super().produce(topic, value, key, headers, on_delivery, **kwargs)


def test_a_record_its_destination_refuses_becomes_a_rejection_with_the_reason_and_the_others_go_out():
    producer = RefusingProducer(
        {"denied": KafkaError.TOPIC_AUTHORIZATION_FAILED, "gone": KafkaError._UNKNOWN_TOPIC},
        {"small": KafkaError.MSG_SIZE_TOO_LARGE},
    )
    writer = TimedWriter("unused", producer=producer, rejections_topic="app-schedule-rejections")
    try:
        now = int(time.time() * 1000)
        writer.hold(
            [
                row("req-0-1", now + 50, b"a", topic="denied"),
                row("req-0-2", now + 50, b"b", topic="small"),
                row("req-1-3", now + 50, b"c", topic="gone"),
                row("req-1-4", now + 50, b"d"),
                row("req-1-5", now + 50, b"e", topic="flaky"),
            ]
        )
        assert writer.wait_written(now + 50, timeout=10)
        delivered = {(t, k) for t, k, _, _ in producer.records if t != "app-schedule-rejections"}
        assert delivered == {("out", b"d"), ("flaky", b"e")}, "a transient error is retried, not rejected"
        rejected = {k: dict(h) for t, k, _, h in producer.records if t == "app-schedule-rejections"}
        assert set(rejected) == {b"a", b"b", b"c"}
        assert rejected[b"a"]["x-scheduler-rejection-reason"] == (
            b"not authorized to write to destination topic 'denied'"
        )
        assert rejected[b"b"]["x-scheduler-rejection-reason"].startswith(
            b"record of 4 bytes (key, value and headers) is too large for destination topic 'small'"
        )
        assert rejected[b"c"]["x-scheduler-rejection-reason"] == b"destination topic 'gone' does not exist"
        assert (
            rejected[b"c"]["x-scheduler-source-topic"],
            rejected[b"c"]["x-scheduler-source-partition"],
            rejected[b"c"]["x-scheduler-source-offset"],
        ) == (b"req", b"1", b"3")
        assert rejected[b"a"]["h"] == b"1", "the record's own headers are kept"
        assert writer.refused == 3 and writer.retried == 1 and writer.failed == 0
    finally:
        writer.close()


def test_a_delivery_the_writer_would_write_later_than_its_max_lateness_goes_to_rejections_as_expired():
    """One delivery is handed over 2 s after its due time with a max lateness of 1 s (written late: a batch held it
    up), another one with 10 s: the first becomes a rejection with the reason, its due time and its source (a cron
    firing's id names its activating request), its history copy is not written; the second is delivered."""

    class HeaderProducer(FakeProducer):
        def __init__(self):
            super().__init__()
            self.headers = []

        def produce(self, topic, value=None, key=None, headers=None, on_delivery=None, **kwargs):
            self.headers.append((topic, key, headers))
            super().produce(topic, value=value, key=key, on_delivery=on_delivery)

    producer = HeaderProducer()
    writer = TimedWriter("unused", max_held=10, producer=producer, rejections_topic="rejections")
    reported = []
    writer.on_written = lambda lateness, refused, expired: reported.append((len(lateness), refused, expired))
    headers = producer.headers
    try:
        now = int(time.time() * 1000)
        due = now - 2000
        writer.hold(
            [
                WriterRow(
                    "requests-3-42@1767225600000",
                    due,
                    KIND_DELIVER,
                    "out",
                    None,
                    b"late",
                    b"v",
                    [("h", b"1")],
                    max_lateness_ms=1000,
                ),
                WriterRow("requests-3-42@1767225600000", due, KIND_HISTORY, "hist", None, b"late", b"v", []),
                WriterRow("requests-0-7", due, KIND_DELIVER, "out", None, b"fine", b"v", [], max_lateness_ms=10_000),
            ]
        )
        assert writer.wait_written(now, timeout=10)
        sent = {(topic, key) for _, topic, key in producer.sent}
        assert sent == {("rejections", b"late"), ("out", b"fine")}
        assert writer.expired == 1 and sum(e for _, _, e in reported) == 1
        rejection = next(h for topic, key, h in headers if topic == "rejections")
        names = dict(rejection)
        assert names["x-scheduler-rejection-reason"].decode().startswith("expired: due ")
        assert (
            names["x-scheduler-rejection-reason"]
            .decode()
            .endswith(", not delivered within its max lateness of 1000 ms")
        )
        assert names["x-scheduler-due-ms"] == str(due).encode()
        assert (
            names["x-scheduler-source-topic"],
            names["x-scheduler-source-partition"],
            names["x-scheduler-source-offset"],
        ) == (b"requests", b"3", b"42")
        assert rejection[0] == ("h", b"1")
    finally:
        writer.close()


def test_sorting_refusals_tries_size_refusals_alone_and_resends_an_aborted_rest_once():
    """A broker refuses a partition's batch larger than max.message.bytes whole: those records are tried alone; in
    transactions (again_once) the records an aborted transaction took along are sent once more."""
    size, denied, aborted = (
        KafkaError(code)
        for code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError._FATAL)
    )
    big, alone_too_big, fine, forbidden = (("held", (name,)) for name in ("big", "alone-too-big", "fine", "forbidden"))
    calls = []

    def send(items):
        calls.append([record[0] for _, record in items])
        failures = []
        for held, record in items:
            if record[0] == "forbidden":
                failures.append((held, record, denied))
            elif record[0] == "alone-too-big" or (record[0] == "big" and len(items) > 1):
                failures.append((held, record, size))
            elif record[0] == "fine" and len(calls) == 1:
                failures.append((held, record, aborted))  # the first transaction aborted by the refusals
        return failures

    refused, failed = send_sorting_refusals(send, [big, alone_too_big, fine, forbidden], again_once=True)
    assert [r[1][0] for r in refused] == ["forbidden", "alone-too-big"] and failed == []
    assert calls == [["big", "alone-too-big", "fine", "forbidden"], ["fine"], ["big"], ["alone-too-big"]]
    calls.clear()
    refused, failed = send_sorting_refusals(send, [big, alone_too_big, fine, forbidden])
    assert [r[1][0] for r in refused] == ["forbidden", "alone-too-big"] and [f[1][0] for f in failed] == ["fine"]
    assert calls == [["big", "alone-too-big", "fine", "forbidden"], ["big"], ["alone-too-big"]]


def test_while_the_watcher_is_behind_a_delivery_due_after_what_it_has_read_waits_for_it():
    """A CANCEL appended before a delivery's due time must be read before the delivery is written: while the
    watcher's read is behind (read_through), what is due after what it has read is held back; caught up, it goes."""
    producer = FakeProducer()
    writer = TimedWriter("unused", max_held=10, producer=producer)

    def sent():
        return sorted(key for _, _, key in producer.sent)

    try:
        now = int(time.time() * 1000)
        writer.read_through(now - 5_000)  # behind: read up to 5 s ago
        # All three are due already: one take would write them all, were it not for the watcher.
        writer.hold([row("a", now - 6_000, b"a"), row("b", now - 5_500, b"b"), row("c", now - 1_000, b"c")])
        wait_until(lambda: sent() == [b"a", b"b"], 5, "what is due before what the watcher has read")
        assert writer.held == 1
        writer.read_through(now - 900)  # still behind, but past its due time
        wait_until(lambda: writer.held == 0, 5, "the delivery the watcher has read past")
        writer.hold([row("d", now - 500, b"d"), row("e", now - 950, b"e")])
        wait_until(lambda: b"e" in sent(), 5, "the delivery due before what the watcher has read")
        assert writer.held == 1
        writer.read_through(None)  # caught up
        wait_until(lambda: writer.held == 0, 5, "everything due, once the watcher has caught up")
    finally:
        writer.close()


def test_a_watcher_that_stops_telling_holds_nothing_back_for_long(monkeypatch):
    from kafka_scheduler.engine.driver import timed_writer

    monkeypatch.setattr(timed_writer, "READ_GATE_STALE_S", 0.3)
    producer = FakeProducer()
    writer = TimedWriter("unused", max_held=10, producer=producer)
    try:
        now = int(time.time() * 1000)
        writer.read_through(now - 60_000)
        writer.hold([row("a", now, b"a")])
        wait_until(lambda: writer.held == 0, 5, "the delivery, once the watcher's word is stale")
        assert producer.sent[0][0] >= now + 250  # held until the watcher's word went stale
    finally:
        writer.close()


def test_the_read_gate_holds_a_delivery_back_at_most_its_limit_past_the_due_time(monkeypatch):
    """A read minutes behind must not hold the batches up (each waits for what is due by its time)."""
    from kafka_scheduler.engine.driver import timed_writer

    monkeypatch.setattr(timed_writer, "READ_GATE_MAX_HOLD_MS", 300)
    monkeypatch.setattr(timed_writer, "READ_GATE_STALE_S", 60.0)  # the watcher's word still holds
    producer = FakeProducer()
    writer = TimedWriter("unused", max_held=10, producer=producer)
    try:
        now = int(time.time() * 1000)
        writer.read_through(now - 600_000)
        writer.hold([row("a", now, b"a")])
        wait_until(lambda: writer.held == 0, 5, "the delivery, once held back for the limit")
        assert producer.sent[0][0] >= now + 300
        assert writer.wait_written(now + 300, timeout=5)
    finally:
        writer.close()
