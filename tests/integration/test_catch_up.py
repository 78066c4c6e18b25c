"""The catch-up of a new checkpoint with a Karafka, ETF1 or Sky input: its first batch reads every input to its end,
whatever --max-requests-per-batch says; every later batch reads at most that many records (a backlog, or a high
rate, must not make every batch as big as the whole topic: the driver ran out of memory on a million records)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from kafka_scheduler.engine.spark.checkpoint import committed_offsets, last_committed_batch

from .support import wait_until
from .test_dialects import WAIT, epoch_in, karafka

CAP = 40
BACKLOG = 3 * CAP  # produced before the start: the first batch reads it all
LATER = CAP  # produced after the first batch: read capped, like the write-backs of every delivery


def batch_end_offsets(checkpoint_dir: Path, batch: int) -> dict[str, int]:
    """Per topic, the offset the batch read up to, from Spark's offsets log ("v1", batch metadata, then one JSON
    line per source: topic -> partition -> end offset)."""
    lines = (checkpoint_dir / "offsets" / str(batch)).read_text().splitlines()
    ends: dict[str, int] = Counter()
    for line in lines[2:]:
        for topic, partitions in json.loads(line).items():
            ends[topic] += sum(int(offset) for offset in partitions.values())
    return dict(ends)


def end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-offsets", "log_level": 3})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def test_only_the_first_batch_of_a_catch_up_is_uncapped(scheduler_factory, kafka):
    source, out = kafka.topic("karafka"), kafka.topic("out")
    reader = kafka.reader(out)
    overdue = epoch_in(-60)
    kafka.produce_many(
        source, [{"key": b"b%d" % i, "value": b"b%d" % i, "headers": karafka(out, overdue)} for i in range(BACKLOG)]
    )
    job = scheduler_factory(extra_args=("--input", f"{source}:karafka", "--max-requests-per-batch", str(CAP))).start()
    checkpoint = job.checkpoint_dir
    wait_until(lambda: last_committed_batch(checkpoint) is not None, WAIT, "the first commit", guard=job.assert_running)
    assert batch_end_offsets(checkpoint, 0).get(source) == BACKLOG, "the first batch reads the whole backlog"

    kafka.produce_many(
        source, [{"key": b"l%d" % i, "value": b"l%d" % i, "headers": karafka(out, epoch_in(0))} for i in range(LATER)]
    )
    expected = {b"b%d" % i for i in range(BACKLOG)} | {b"l%d" % i for i in range(LATER)}
    reader.wait_for(
        lambda r: r.value in expected,
        count=len(expected),
        timeout=WAIT,
        what="every delivery",
        guard=job.assert_running,
    )
    # Each delivery is written back to the source (a tombstone): done once the job has read them all.
    wait_until(
        lambda: (
            committed_offsets(checkpoint).get(source, {}).get(0, -1)
            == end_offset(kafka.bootstrap, source)
            >= 2 * len(expected)
        ),
        WAIT,
        "the job to read every write-back",
        guard=job.assert_running,
    )

    last = last_committed_batch(checkpoint)
    read = [
        sum(batch_end_offsets(checkpoint, n).values()) - sum(batch_end_offsets(checkpoint, n - 1).values())
        for n in range(1, last + 1)
    ]
    assert read and max(read) <= CAP, f"records read by the batches after the first: {read}"
    assert sum(read) >= BACKLOG + 2 * LATER, read  # the backlog's write-backs, the later schedules and theirs
    delivered = Counter(r.value for r in reader.read_to_end())
    assert delivered == Counter(expected), {v: n for v, n in delivered.items() if n != 1 or v not in expected}
    assert "caught up: batch 0 read every input to its end" in job.log(), job.log()[-3000:]
    assert job.stop() == 0, job.log()[-3000:]
