"""--lookahead: deliveries due soon are prepared a batch early and held by the sink until their
due time. Still never early; a cancel that arrives before the window still cancels."""

import pytest

from .support import at, ms_of, native, wait_until


@pytest.fixture(scope="module")
def scheduler(scheduler_factory):
    process = scheduler_factory(app_id="lookahead", extra_args=("--lookahead", "2s"))
    process.start()
    # Past the slow first batch, so the schedules below are held, not overdue.
    wait_until(lambda: "first batch done" in process.log(), 120, "the first batch")
    yield process
    assert process.stop() == 0, process.log()[-3000:]


def test_held_deliveries_are_never_early_and_cancel_still_works(kafka, scheduler):
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)
    dues = {f"h{i}".encode(): at(3 + i * 0.7) for i in range(6)}
    for key, due in dues.items():
        kafka.produce(requests, key=key, value=key, headers=native(topic, due, key.decode()), partition=0)
    kafka.produce(requests, key=b"gone", value=b"x", headers=native(topic, at(9), "gone"), partition=0)
    kafka.produce(requests, headers=native(request_id="gone", action="CANCEL"), partition=0)
    kafka.produce(requests, key=b"last", value=b"x", headers=native(topic, at(11), "last"), partition=0)
    reader.wait_for(lambda r: r.key == b"last", timeout=120, what="the last delivery")
    records = {r.key: r for r in reader.poll()}
    assert set(records) == set(dues) | {b"last"}, "the cancelled schedule was delivered"
    for key, due in dues.items():
        assert records[key].timestamp_ms >= ms_of(due), f"{key} delivered before its due time"
    held = [line for line in scheduler.log().splitlines() if "delivered" in line and "write " in line]
    assert held, "no batch delivered anything"
