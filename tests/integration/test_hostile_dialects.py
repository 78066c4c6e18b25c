"""Hostile input in every dialect through the real job: it keeps running and accounts for every record.

One job reads a topic of each dialect (native, karafka, etf1, sky-avro, sky-json). The test sends the
generator's mix (tests/hostile_records.py: valid requests with fields removed, duplicated, spoiled, oversized,
out-of-range epochs, doctored Avro, malformed JSON, raw garbage; ids reused so replaces and cancels find
something) and a few records of megabytes, then waits until the job has committed every input record,
write-backs of the deliveries included. Then: the job is still running; the outcome counts it logged add up
to the records it read (sent and written back); every record the contract rejects has exactly one rejection
and every record it accepts none; the logged "rejected" count is the number of those rejections.
(Decoder-level volume: tests/unit/test_hostile_decode.py; a million records: `kafka-scheduler bench hostile`.)
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter

from confluent_kafka import Consumer, TopicPartition

from kafka_scheduler.engine.spark.checkpoint import committed_offsets

from .. import hostile_records as hr
from .support import outcome_counts, wait_until

PER_DIALECT = 150
MAX_VALUE_BYTES = 1000
MIB = 2**20


def end_offsets(bootstrap: str, topics: list[str]) -> dict[str, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4()}", "log_level": 3})
    try:
        return {t: consumer.get_watermark_offsets(TopicPartition(t, 0), timeout=10, cached=False)[1] for t in topics}
    finally:
        consumer.close()


def huge(dialect_topic: dict[str, str], destination: str) -> list[tuple[str, hr.Hostile]]:
    """Records of megabytes the broker takes (it allows 8 MiB): a value over the limit, big headers, a huge id."""
    due = str(int(time.time()) + 2).encode()
    return [
        (
            "native",
            hr.Hostile(
                "native",
                b"k",
                b"v" * (7 * MIB),
                [("x-scheduler-deliver-to", destination.encode()), ("x-scheduler-deliver-at", b"2030-01-01T00:00:00Z")],
                hr.REJECT,
            ),
        ),
        (
            "native",
            hr.Hostile(
                "native",
                b"k",
                b"v",
                [
                    ("user", b"h" * (3 * MIB)),
                    ("x-scheduler-deliver-to", destination.encode()),
                    ("x-scheduler-deliver-at", b"2000-01-01T00:00:00Z"),
                ],
                hr.REQUEST,
                "ADD",
            ),
        ),
        (
            "karafka",
            hr.Hostile(
                "karafka",
                b"i" * (2 * MIB),
                b"v",
                [
                    ("schedule_schema_version", b"1.0.0"),
                    ("schedule_source_type", b"schedule"),
                    ("schedule_target_epoch", due),
                    ("schedule_target_topic", destination.encode()),
                ],
                hr.REQUEST,
                "ADD",
            ),
        ),
        (
            "etf1",
            hr.Hostile(
                "etf1",
                b"id-huge",
                b"v" * (5 * MIB),
                [("scheduler-epoch", due), ("scheduler-target-topic", destination.encode())],
                hr.REJECT,
            ),
        ),
        ("sky-json", hr.Hostile("sky-json", b"id-deep", b"[" * MIB + b"]" * MIB, [], hr.REJECT)),
        ("sky-avro", hr.Hostile("sky-avro", b"id-long", hr.zigzag(1) + hr.zigzag(2**31 - 9) + b"t", [], hr.REJECT)),
    ]


def test_a_hostile_mix_in_every_dialect_is_accounted_for(kafka, scheduler_factory):
    app_id = f"hostile-mix-{uuid.uuid4().hex[:6]}"
    inputs = {"native": f"{app_id}-schedule-requests"}
    for dialect in hr.DIALECTS[1:]:
        inputs[dialect] = kafka.topic(dialect.replace("-", ""))
    destinations = (kafka.topic("hostile-out"), kafka.topic("hostile-out"))
    scheduler = scheduler_factory(
        app_id=app_id,
        extra_args=(
            "--max-value-bytes",
            str(MAX_VALUE_BYTES),
            "--partitions",
            "1",
            *[a for d, t in inputs.items() for a in ("--input", f"{t}:{d}")],
        ),
    )
    scheduler.start()
    wait_until(lambda: "first batch done" in scheduler.log(), 120, "the first batch", guard=scheduler.assert_running)

    own = (inputs["native"], f"{app_id}-schedule-rejections", f"{app_id}-schedule-history", *inputs.values())
    ctx = hr.Context(
        destinations=destinations,
        forbidden=own,
        max_value_bytes=MAX_VALUE_BYTES,
        now_ms=int(time.time() * 1000),
        huge_bytes=10_000,
        due_offsets_ms=(-86_400_000, -1000, 0, 1000, 3000, 3_600_000),
    )
    chooser = hr.RandomChooser(random.Random(8))
    sent: dict[tuple[str, int], hr.Hostile] = {}
    batches = {dialect: [hr.hostile(chooser, ctx, dialect) for _ in range(PER_DIALECT)] for dialect in hr.DIALECTS}
    for dialect, record in huge(inputs, destinations[0]):
        batches[dialect].append(record)
    for dialect, records in batches.items():
        placed = kafka.produce_many(inputs[dialect], [dict(r.record(), partition=0) for r in records])
        sent.update({(inputs[dialect], offset): r for r, (_, offset) in zip(records, placed)})
    sent_at = time.time()

    topics = list(inputs.values())

    def caught_up():
        # Deliveries are due within seconds: after that every write-back is in its topic, and the job has
        # read every record once its committed offsets reach the ends.
        if time.time() < sent_at + 8:
            return None
        ends = end_offsets(kafka.bootstrap, topics)
        committed = committed_offsets(scheduler.checkpoint_dir)
        done = all(committed.get(t, {}).get(0, 0) >= end for t, end in ends.items())
        return ends if done and ends == end_offsets(kafka.bootstrap, topics) else None

    ends = wait_until(caught_up, 240, "the job to read every input record", interval=1, guard=scheduler.assert_running)
    scheduler.assert_running()
    read = sum(ends.values())
    outcomes = outcome_counts(scheduler.log())
    assert sum(outcomes.values()) == read, (
        f"{read} records read ({len(sent)} sent, the rest written back), outcomes {dict(outcomes)}"
    )
    # every write-back read back is a completion (as are the generated write-backs among the records sent)
    assert read > len(sent) and outcomes["completed"] + outcomes["complete_noop"] >= read - len(sent), outcomes

    rejections = kafka.reader(f"{app_id}-schedule-rejections").read_to_end()
    rejected: Counter = Counter()
    for record in rejections:
        reasons = record.header_values("x-scheduler-rejection-reason")
        if any(b"does not exist" in reason for reason in reasons):
            continue  # a valid schedule to a topic that does not exist: dead-lettered at delivery
        # the headers the job appends come last (a hostile record may carry its own of the same name)
        source = (
            record.header_values("x-scheduler-source-topic")[-1].decode(),
            int(record.header_values("x-scheduler-source-offset")[-1]),
        )
        rejected[source] += 1
    wrong = []
    for place, record in sent.items():
        allowed = {hr.REJECT: (1,), hr.REQUEST: (0,), hr.EITHER: (0, 1)}[record.expect]
        if rejected[place] not in allowed:
            wrong.append(
                f"{place} ({record.dialect}: {record.why}): expected {record.expect}, {rejected[place]} rejections"
            )
    assert not wrong, f"{len(wrong)} records went wrong:\n" + "\n".join(wrong[:20])
    assert set(rejected) <= set(sent), "a rejection of a record nobody sent"
    assert outcomes["rejected"] == sum(rejected.values()), (outcomes, sum(rejected.values()))
    expected = Counter(r.expect for r in sent.values())
    assert expected[hr.REJECT] >= len(sent) / 4 and expected[hr.REQUEST] >= len(sent) / 3, expected
    for name in ("scheduled", "replaced", "cancelled", "cancel_noop", "completed", "complete_noop"):
        assert outcomes[name] > 0, f"no {name} outcome: the mix lost its edge ({dict(outcomes)})"
