"""The timed writer on a fake producer: each record at its due instant, never before; withdrawn ones never;
rejections (no delivery id, no due time) at once; ``wait_written`` returns once what is due is written."""

import time

from kafka_scheduler.timed_writer import TICK_REPORT, TICK_WAKE, TimedWriter, Wakeups

from ..integration.support import wait_until


class FakeProducer:
    def __init__(self):
        self.sent = []  # (wall ms, topic, key)
        self.values = []

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None, **kwargs):
        self.sent.append((int(time.time() * 1000), topic, key))
        self.values.append(value)
        if on_delivery is not None:
            on_delivery(None, None)

    def poll(self, timeout):
        return 0

    def flush(self, timeout=None):
        return 0


def row(delivery_id, due_ms, key, kind="deliver", topic="out"):
    return (delivery_id, due_ms, kind, topic, None, key, b"v", [("h", b"1")])


def test_each_record_at_its_due_time_withdrawn_ones_never_rejections_at_once():
    producer = FakeProducer()
    writer = TimedWriter("unused", max_held=10, producer=producer)
    try:
        now = int(time.time() * 1000)
        writer.hold([row("a", now + 300, b"a"), row("a", now + 300, b"a", kind="history", topic="hist"),
                     row("b", now + 150, b"b"), row("c", now + 200, b"c"), row(None, None, b"bad", kind="reject"),
                     row(None, None, b"bad2", kind="reject")])
        assert writer.held == 5 and writer.room() == 5
        assert writer.withdraw(["c", "unknown"]) == 1
        assert writer.wait_written(now + 300, timeout=10)
        sent = {(topic, key): at for at, topic, key in producer.sent}
        assert set(sent) == {("out", b"a"), ("hist", b"a"), ("out", b"b"), ("out", b"bad"), ("out", b"bad2")}
        assert sent[("out", b"a")] >= now + 300 and sent[("hist", b"a")] >= now + 300 and sent[("out", b"b")] >= now + 150
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
        wait_until(lambda: wakeups.ticks >= 3, 10, "two wake-up ticks after the report tick")
        at = [sent_at for sent_at, _, _ in producer.sent]
        assert at[1] >= now + 100 and at[2] >= now + 200, "a tick before its instant"
        assert wakeups.next_instant is None
        wakeups.add([now + 200])  # already ticked for and passed: ticks again (a timer re-armed at that instant)
        wait_until(lambda: wakeups.ticks == 4, 10, "the tick of a passed instant")
    finally:
        wakeups.close()
    assert [topic for _, topic, _ in producer.sent] == ["ticks"] * 4
    assert producer.values == [TICK_REPORT, TICK_WAKE, TICK_WAKE, TICK_WAKE]
