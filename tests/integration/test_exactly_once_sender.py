"""The exactly-once writer against the real broker, without Spark: what a driver wrote is not written again
by the next one, what it left open is aborted, it is fenced, and the ledger is trimmed."""

from __future__ import annotations

import os
import uuid

import pytest
from confluent_kafka import KafkaException, TopicPartition

from kafka_scheduler.engine.contract import KIND_DELIVER, WriterRow
from kafka_scheduler.engine.driver.exactly_once import FencedError, TransactionalSender
from kafka_scheduler.engine.driver.held import Held
from kafka_scheduler.engine.driver.producing import Record, producer_config
from kafka_scheduler.engine.driver.timed_writer import TimedWriter
from kafka_scheduler.kafka.topics import admin_client, ensure_topics

from .support import wait_until


def items(topic: str, ids: range, due_ms: int = 1_000) -> list:
    """(held, record) pairs: a delivery per id, and a history copy of the first with the same id."""
    pairs = [
        (Held(due_ms + i, f"req-0-{i}", []), Record(topic, None, f"k{i}".encode(), f"v{i}".encode(), [])) for i in ids
    ]
    first = pairs[0][0]
    return pairs + [(first, Record(topic + "-history", None, b"copy", b"v", []))]


@pytest.fixture
def app(kafka, broker):
    app_id = f"eo-{uuid.uuid4().hex[:8]}"
    topic = kafka.topic("deliveries")
    ledger = f"{app_id}-schedule-ledger"
    ensure_topics(admin_client(broker.bootstrap_servers), [ledger, topic + "-history"], 1)

    def sender(member: str = "") -> TransactionalSender:
        """The driver's sender, or with ``member`` an executor's herd task's (which reads no ledger back)."""
        made = TransactionalSender(producer_config(broker.bootstrap_servers), app_id, ledger, member=member)
        if member:
            made.start_writing()
        else:
            made.start()
        return made

    return topic, ledger, sender


def test_a_second_driver_writes_nothing_the_first_committed(kafka, app):
    topic, _ledger, sender = app
    first = sender()
    assert first.send(items(topic, range(5))) == []
    second = sender()
    assert second.remembered == 6, "the ledger is read back: 5 deliveries and a history copy"
    assert second.send(items(topic, range(8))) == []
    assert second.skipped == 6
    reader = kafka.reader(topic, topic + "-history", committed=True)
    records = reader.read_to_end()
    assert sorted(r.key for r in records if r.topic == topic) == sorted(f"k{i}".encode() for i in range(8))
    assert [r.key for r in records if r.topic != topic] == [b"copy"]


def test_a_transaction_left_open_is_aborted_and_its_driver_fenced(kafka, app, broker):
    topic, _ledger, sender = app
    zombie = sender()
    producer = zombie._producer
    producer.begin_transaction()
    producer.produce(topic, key=b"left-open", value=b"v")
    producer.flush(10)
    successor = sender()
    assert successor.send(items(topic, range(2))) == []
    with pytest.raises(KafkaException):
        producer.commit_transaction(10)
    with pytest.raises(FencedError):
        zombie.send(items(topic, range(3, 4)))
    committed = kafka.reader(topic, committed=True).read_to_end()
    assert sorted(r.key for r in committed) == [b"k0", b"k1"], "the open transaction's record is not visible"


def test_trim_forgets_what_a_committed_batch_retired_and_deletes_its_ledger_records(kafka, app, broker):
    topic, ledger, sender = app
    first = sender()
    first.send(items(topic, range(3), due_ms=1_000))
    first.send(items(topic, range(10, 13), due_ms=50_000))
    assert first.trim(40_000) == 4  # three deliveries and the history copy due at 1000
    admin = admin_client(broker.bootstrap_servers)

    def ledger_start() -> int:
        return kafka.reader(ledger).consumer.get_watermark_offsets(TopicPartition(ledger, 0), timeout=10)[0]

    wait_until(lambda: ledger_start() > 0, 30, "the first ledger record deleted")
    assert admin is not None
    second = sender()
    assert second.remembered == 4, "only the later transaction's keys are read back"
    assert second.send(items(topic, range(10, 13), due_ms=50_000)) == []
    assert second.skipped == 4


def test_refused_records_become_rejections_once_and_the_rest_of_their_transaction_is_written_once(kafka, app, broker):
    topic, _ledger, sender = app
    small = f"small-{uuid.uuid4().hex[:8]}"
    ensure_topics(admin_client(broker.bootstrap_servers), [small], 1, config={"max.message.bytes": "2000"})
    rejections = topic + "-history"
    writer = TimedWriter(broker.bootstrap_servers, sender=sender(), rejections_topic=rejections)
    try:
        # Partition 5 of a one-partition topic is refused before sending (the transaction commits without it); a
        # record over max.message.bytes is refused by the broker, which aborts its whole transaction (written
        # again by the writer).
        rows = [
            WriterRow("req-0-1", 0, KIND_DELIVER, topic, None, b"ok", b"v", []),
            WriterRow("req-0-2", 0, KIND_DELIVER, topic, 5, b"no-partition", b"v", []),
            WriterRow("req-0-3", 0, KIND_DELIVER, small, None, b"too-large", os.urandom(5000), []),
            WriterRow("req-0-4", 0, KIND_DELIVER, small, None, b"fits", b"v", []),
        ]
        writer.write_now(rows)
        writer.write_now(rows)
        reader = kafka.reader(topic, rejections, small, committed=True)
        expected = [(rejections, b"no-partition"), (rejections, b"too-large"), (small, b"fits"), (topic, b"ok")]
        wait_until(lambda: len(reader.poll()) >= len(expected), 30, "every record or its rejection")
        got = sorted((r.topic, r.key) for r in reader.read_to_end())
        assert got == sorted(expected), got
        assert writer.sender.aborted >= 1
    finally:
        writer.close()


def test_what_a_herd_task_commits_the_driver_reads_back_leaves_out_and_keeps_through_a_trim(kafka, app):
    topic, ledger, sender = app
    driver = sender()
    assert driver.unsettled, "before its first settled read, a previous driver's herd tasks may have written"
    driver.send(items(topic, range(3), due_ms=1_000))
    driver.foreign_writes_begin()
    task = sender(member="herd-0")
    assert task.send(items(topic, range(10, 15), due_ms=5_000)) == []
    task.close()
    driver.send(items(topic, range(20, 22), due_ms=2_000))  # a ledger record after the task's, due earlier
    herd_keys = sorted(f"req-0-{i}\t{topic}" for i in range(10, 15)) + [f"req-0-10\t{topic}-history"]
    assert driver.written_keys(4_999, 6_000) == []
    # While herd tasks may write, a trim deletes nothing the driver has not read (the task's record lies between).
    driver.trim(3_000)
    assert len(driver._ledger_ends) == 2, "no ledger record deleted past what was read"
    assert driver.unsettled
    driver.catch_up(settled=True)
    assert not driver.unsettled, "the next herd write may skip the read before it"
    assert sorted(driver.written_keys(4_999, 6_000)) == sorted(herd_keys)
    assert driver.send(items(topic, range(10, 15), due_ms=5_000)) == [] and driver.skipped == 6
    # Trimmed through 3000, only the first record may go: the task's (due up to 5014) lies before the last one.
    assert driver.trim(3_000) == 7, "the keys read back again are forgotten again"
    ledger_start = lambda: kafka.reader(ledger).consumer.get_watermark_offsets(TopicPartition(ledger, 0), timeout=10)[0]
    wait_until(lambda: ledger_start() > 0, 30, "the first ledger record deleted")
    successor = sender()
    assert sorted(successor.written_keys(4_999, 6_000)) == sorted(herd_keys), "the task's ledger record was kept"
    delivered = kafka.reader(topic, committed=True).read_to_end()
    assert sorted(r.key for r in delivered) == sorted(f"k{i}".encode() for i in [*range(3), *range(10, 15), 20, 21])


def test_fencing_a_herd_task_aborts_what_it_left_open(kafka, app):
    topic, _ledger, sender = app
    driver = sender()
    task = sender(member="herd-1")
    task._producer.begin_transaction()
    task._producer.produce(topic, key=b"left-open", value=b"v")
    task._producer.flush(10)
    driver.fence_members(["herd-1"])
    assert driver.send(items(topic, range(2))) == []
    driver.catch_up(timeout=30)  # not held back by the open transaction: it was aborted
    with pytest.raises(KafkaException):
        task._producer.commit_transaction(10)
    committed = kafka.reader(topic, committed=True).read_to_end()
    assert sorted(r.key for r in committed) == [b"k0", b"k1"], "the task's open transaction is not visible"
