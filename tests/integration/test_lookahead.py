"""--lookahead: deliveries due soon are prepared a batch early and held by the sink until their
due time. Still never early, each exactly once; a cancel that arrives before the window still cancels."""

from collections import Counter

import pytest

from .support import at, batch_lines, ms_of, native, wait_until


@pytest.fixture(scope="module")
def scheduler(scheduler_factory):
    # 4 s: more than a batch cycle even on a busy 2-core machine (seen: 3-4 s a batch), so deliveries
    # really are prepared before they are due and held.
    process = scheduler_factory(app_id="lookahead", extra_args=("--lookahead", "4s"))
    process.start().warm_up()  # so the schedules below are held, not overdue
    yield process
    assert process.stop() == 0, process.log()[-3000:]


def test_held_deliveries_are_never_early_arrive_once_and_cancel_still_works(kafka, scheduler):
    mark = scheduler.mark()
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)
    # Sent with one producer, in one go: due times stay a few seconds ahead even on a loaded machine.
    dues = {f"h{i}".encode(): at(6 + i * 0.8) for i in range(6)}
    dues[b"last"] = at(14)
    batch = [
        dict(key=key, value=key, headers=native(topic, due, key.decode()), partition=0)
        for key, due in dues.items()
        if key != b"last"
    ]
    batch += [
        dict(key=b"gone", value=b"gone", headers=native(topic, at(12), "gone"), partition=0),
        dict(headers=native(request_id="gone", action="CANCEL"), partition=0),
        dict(key=b"last", value=b"last", headers=native(topic, dues[b"last"], "last"), partition=0),
    ]
    sent = kafka.produce_many(requests, batch)
    delivery_ids = {
        record["key"]: f"{requests}-{partition}-{offset}".encode()
        for record, (partition, offset) in zip(batch, sent)
        if record.get("key") is not None
    }
    reader.wait_for(lambda r: r.key == b"last", timeout=120, what="the last delivery", guard=scheduler.assert_running)
    records = reader.read_to_end()

    keys = Counter(r.key for r in records)
    assert keys == Counter(dict.fromkeys(dues, 1)), f"expected each schedule once and nothing cancelled: {keys}"
    ids = Counter(r.header("x-scheduler-delivery-id") for r in records)
    assert ids == Counter(delivery_ids[k] for k in dues), ids
    for record in records:
        assert record.timestamp_ms >= ms_of(dues[record.key]), f"{record.key} delivered before its due time"

    # The scheduler's own account: the batch that wrote "last" logs its line just after the write.
    wait_until(
        lambda: sum(b.delivered for b in batch_lines(scheduler.log_since(mark))) >= len(dues),
        30,
        "the batch lines of these deliveries",
        guard=scheduler.assert_running,
    )
    lines = batch_lines(scheduler.log_since(mark))
    assert sum(b.delivered for b in lines) == len(dues), scheduler.log_since(mark)
    held = sum(b.held for b in lines)
    assert 0 < held <= len(dues), f"no delivery was held until due (--lookahead ignored?):\n{scheduler.log_since(mark)}"
