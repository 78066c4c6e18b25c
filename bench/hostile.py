"""The hostile-input scenario: --count generated records in every dialect through the real job, counters checked.

    kafka-scheduler bench hostile [--count 1000000]

One job reads a topic of each dialect (native, karafka, etf1, sky-avro, sky-json; one partition each) with
--max-value-bytes 1000 and --max-requests-per-batch 100000, restarted once after its first batch (see below).
The records come from the test suite's generator (tests/hostile_records.py, seeded):
valid requests with fields removed, duplicated, spoiled or oversized, out-of-range epochs, doctored Avro,
malformed JSON, raw garbage; ids reused, so replaces and cancels find something; due times from a day ago
to ten years ahead, so part is delivered (and written back) during the run. Produced as fast as the
producer goes, one dialect after the other in turn. Then the run waits until the job has committed every
record of its inputs (those sent and the write-backs of its deliveries) and checks: the job is alive, the
outcome counts it logged add up to the records it read, the logged rejections lie between the records the
contract rejects and those plus the ones the generator leaves open, and the rejections topic holds the
logged rejections plus the undeliverable deliveries. Figures: records sent and read, per outcome, rate.
"""

from __future__ import annotations

import random
import re
import time
import uuid
from collections import Counter

from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_scheduler.engine.spark.checkpoint import committed_offsets, last_committed_batch

from .harness import Environment, log, wait_until

MAX_VALUE_BYTES = 1000
MAX_REQUESTS_PER_BATCH = 100_000  # a batch of hostile records (~800 bytes each) well within the default 1g heap
SEED = 20261126


def _ends(bootstrap: str, topics: list[str]) -> dict[str, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-ends-{uuid.uuid4()}", "log_level": 3})
    try:
        ends = {}
        for topic in topics:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            ends[topic] = sum(
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in partitions
            )
        return ends
    finally:
        consumer.close()


def hostile(env: Environment, args) -> dict:
    from tests import hostile_records as hr  # the test suite's generator (the bench runs from a checkout)

    app_id = f"bench-hostile-{uuid.uuid4().hex[:6]}"
    inputs = {"native": f"{app_id}-schedule-requests"}
    for dialect in hr.DIALECTS[1:]:
        inputs[dialect] = env.topic(dialect.replace("-", ""), partitions=1, log_append_time=False)
    destinations = (env.topic("hostile-out", partitions=2), env.topic("hostile-out", partitions=2))
    scheduler = env.scheduler(
        app_id,
        extra_args=(
            "--max-value-bytes",
            str(MAX_VALUE_BYTES),
            "--max-requests-per-batch",
            str(MAX_REQUESTS_PER_BATCH),
            *[a for d, t in inputs.items() for a in ("--input", f"{t}:{d}")],
            *args.scheduler_args,
        ),
    ).start()
    # On a new checkpoint with a non-native input the job reads without --max-requests-per-batch for as long as
    # it runs, not only in its first batch (engine.query.reads_all_first), and a backlog of a million records in
    # one batch exhausts its heap (OutOfMemoryError, first run of this scenario). Restarted once the first batch
    # has committed, it reads capped batches.
    wait_until(lambda: last_committed_batch(scheduler.checkpoint) is not None, 600, "the first batch")
    scheduler.stop()
    scheduler.start()
    own = (inputs["native"], f"{app_id}-schedule-rejections", f"{app_id}-schedule-history", *inputs.values())
    ctx = hr.Context(
        destinations=destinations,
        forbidden=own,
        max_value_bytes=MAX_VALUE_BYTES,
        now_ms=int(time.time() * 1000),
        huge_bytes=2000,
    )
    chooser = hr.RandomChooser(random.Random(SEED))
    producer = Producer(
        {
            "bootstrap.servers": env.bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "acks": "all",
            "enable.idempotence": True,
            "queue.buffering.max.messages": 1_000_000,
            "message.max.bytes": 8_000_000,
            "log_level": 3,
        }
    )
    failed = []
    expected: Counter = Counter()
    per_dialect: Counter = Counter()

    def on_delivery(err, _msg):
        if err is not None:
            failed.append(str(err))

    log(f"hostile: producing {args.count:,} generated records in {len(inputs)} dialects")
    started = time.time()
    for i in range(args.count):
        dialect = hr.DIALECTS[i % len(hr.DIALECTS)]
        if i % 10_000 == 0:  # due times follow the clock
            ctx = hr.Context(
                ctx.destinations,
                ctx.forbidden,
                ctx.max_value_bytes,
                int(time.time() * 1000),
                huge_bytes=ctx.huge_bytes,
                ids=ctx.ids[-10_000:],
                serial=ctx.serial,
            )
            if i % 100_000 == 0 and i:
                scheduler.sample_memory()
                log(f"  {i:,} produced")
        record = hr.hostile(chooser, ctx, dialect)
        expected[record.expect] += 1
        per_dialect[dialect] += 1
        while True:
            try:
                producer.produce(
                    inputs[dialect],
                    key=record.key,
                    value=record.value,
                    headers=record.headers,
                    partition=0,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(300)
    produced_s = time.time() - started
    if failed:
        raise RuntimeError(f"{len(failed)} records were not acknowledged by the broker: {failed[:3]}")
    log(
        f"produced {args.count:,} in {produced_s:.1f}s ({args.count / produced_s:,.0f}/s); waiting for the job to "
        f"read every record (write-backs of its deliveries included)"
    )

    topics = list(inputs.values())
    progress = {}

    def caught_up():
        if scheduler.process.poll() is not None:
            causes = list(
                dict.fromkeys(
                    m.group(0)[:300] for m in re.finditer(r"[\w.$]*(?:Error|Exception)\b[^\n]*", scheduler.log())
                )
            )  # first ones first: the root cause
            raise RuntimeError(
                f"the job stopped (exit code {scheduler.process.returncode}); errors logged: {causes[:5]}"
            )
        scheduler.sample_memory()
        ends = _ends(env.bootstrap, topics)
        committed = committed_offsets(scheduler.checkpoint)
        read = sum(sum(committed.get(t, {}).values()) for t in topics)
        progress.update(read=read, ends=sum(ends.values()))
        # Deliveries due within seconds of the last send: their write-backs are in by then.
        if time.time() < started + produced_s + 10 or read < sum(ends.values()):
            return None
        return ends if ends == _ends(env.bootstrap, topics) else None

    ends = wait_until(
        caught_up,
        args.time_budget,
        "the job to read every input record",
        interval=1,
        progress=lambda: f"{progress.get('read', 0):,} of {progress.get('ends', 0):,} read",
    )
    finished = time.time()
    alive = scheduler.process.poll() is None
    text = scheduler.log()
    outcomes: Counter = Counter()
    for match in re.finditer(r"batch \d+: (\d+) requests \(([^)]*)\)", text):
        for part in match.group(2).split(", "):
            n, _, name = part.partition(" ")
            outcomes[name] += int(n)
    dead_lettered = sum(int(n) for n in re.findall(r"(\d+) undeliverable, sent to rejections", text))
    rejections_topic = _ends(env.bootstrap, [f"{app_id}-schedule-rejections"])[f"{app_id}-schedule-rejections"]
    read = sum(ends.values())
    figures = {
        "records_sent": args.count,
        "records_read": read,
        "write_backs_read": read - args.count,
        "outcomes": dict(sorted(outcomes.items())),
        "outcomes_total": sum(outcomes.values()),
        "expected_rejections_at_least": expected[hr.REJECT],
        "expected_requests_at_least": expected[hr.REQUEST],
        "left_open_by_the_generator": expected[hr.EITHER],
        "dead_lettered": dead_lettered,
        "rejections_topic_records": rejections_topic,
        "produced_per_s": round(args.count / produced_s),
        "read_per_s": round(read / (finished - started)),
        "seconds": round(finished - started, 1),
        "job_alive": alive,
        "peak_rss_total_mib": round(sum(scheduler.peak_rss.values()) / 2**20),
    }
    problems = []
    if not alive:
        problems.append("the job stopped")
    if sum(outcomes.values()) != read:
        problems.append(f"outcomes add up to {sum(outcomes.values()):,}, not the {read:,} records read")
    if not expected[hr.REJECT] <= outcomes["rejected"] <= expected[hr.REJECT] + expected[hr.EITHER]:
        problems.append("the rejected count is outside what the generator expects")
    if rejections_topic != outcomes["rejected"] + dead_lettered:
        problems.append("the rejections topic does not hold the rejected and undeliverable records")
    figures["check"] = "passed" if not problems else "FAILED: " + "; ".join(problems)
    if problems:
        figures["error"] = figures["check"]
    scheduler.stop()
    return figures
