"""Helpers for the integration tests: producing with an independent client, the job as a subprocess with the tests'
own checks, and parsing its batch lines. Running the job, reading topics and waiting come from the project's harness
(kafka_scheduler.harness), which the demo, the benchmarks and the crash suite use too."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from kafka_scheduler.client.encoders import format_instant
from kafka_scheduler.engine.spark.checkpoint import committed_offsets, last_committed_batch
from kafka_scheduler.harness.job_process import JobProcess
from kafka_scheduler.harness.topic_reader import Record, TopicReader  # noqa: F401 (the tests' names)
from kafka_scheduler.harness.waiting import wait_until
from kafka_scheduler.kafka.topics import admin_client, ensure_topics


def metric_samples(text: str) -> dict:
    """{(sample name, sorted label pairs): value} of a scrape's text."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@dataclass
class Kafka:
    bootstrap: str
    readers: list = field(default_factory=list)

    def topic(self, prefix: str = "t", partitions: int = 1) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        ensure_topics(admin_client(self.bootstrap), [name], partitions)
        return name

    def reader(self, *topics: str, committed: bool = False) -> TopicReader:
        """``committed``: read as an exactly-once consumer does (isolation.level=read_committed)."""
        reader = TopicReader(self.bootstrap, list(topics), committed)
        self.readers.append(reader)
        return reader

    def produce(self, topic: str, key=None, value=None, headers=None, partition: int | None = None):
        """Produce one record synchronously with an independent client; returns (partition, offset)."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "log_level": 3, "message.max.bytes": 10_000_000})
        result = {}

        def on_delivery(err, msg):
            result["err"], result["msg"] = err, msg

        extra = {} if partition is None else {"partition": partition}
        producer.produce(topic, key=key, value=value, headers=headers or [], on_delivery=on_delivery, **extra)
        producer.flush(30)
        assert result.get("err") is None, result.get("err")
        return result["msg"].partition(), result["msg"].offset()

    def produce_many(self, topic: str, records: list[dict]) -> list[tuple[int, int]]:
        """Produce records (dicts of key, value, headers, partition) with one producer, in order;
        returns the (partition, offset) of each."""
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "log_level": 3,
                "message.max.bytes": 10_000_000,
                "enable.idempotence": True,
            }
        )
        results: list = [None] * len(records)

        def on_delivery(i):
            def callback(err, msg):
                results[i] = (err, msg)

            return callback

        for i, record in enumerate(records):
            extra = {} if record.get("partition") is None else {"partition": record["partition"]}
            producer.produce(
                topic,
                key=record.get("key"),
                value=record.get("value"),
                headers=record.get("headers") or [],
                on_delivery=on_delivery(i),
                **extra,
            )
            producer.poll(0)
        assert producer.flush(60) == 0, "records still unsent after 60 s"
        errors = [r[0] for r in results if r is None or r[0] is not None]
        assert not errors, errors[:5]
        return [(msg.partition(), msg.offset()) for _, msg in results]


class SchedulerProcess(JobProcess):
    """The job as a subprocess (the harness's JobProcess), with what the tests ask of it beyond that."""

    def mark(self, timeout: float = 60.0) -> int:
        """A log position for ``log_since``: the batch lines after it are of batches that began after this call.

        Waits for the commit of the batch after the last committed one (the batch in flight, if any:
        its line, logged before its commit, then falls before the mark). Without that, the batch that
        delivered an earlier test's last record could log its line after the mark and count as this test's.
        """
        before = last_committed_batch(self.checkpoint_dir)
        target = 0 if before is None else before + 1
        self.wake()  # an idle job runs no batch by itself

        def committed() -> bool:
            last = last_committed_batch(self.checkpoint_dir)  # batch 0 is a commit too: not `or -1`
            return last is not None and last >= target

        wait_until(
            committed,
            timeout,
            f"scheduler {self.app_id} to commit batch {target}",
            interval=0.05,
            guard=self.assert_running,
        )
        return self.log_path.stat().st_size

    def wait_applied(self, topic: str, partition: int, offset: int, timeout: float = 90.0) -> None:
        """Wait for a committed batch that read input ``topic`` past ``offset`` in ``partition`` (the record there
        starts one)."""

        def applied() -> bool:
            return committed_offsets(self.checkpoint_dir).get(topic, {}).get(partition, 0) > offset

        wait_until(
            applied,
            timeout,
            f"scheduler {self.app_id} to commit a batch past {topic}-{partition} offset {offset}",
            interval=0.05,
            guard=self.assert_running,
        )

    def warm_up(self, timeout: float = 180.0) -> SchedulerProcess:
        """Wait until a schedule due at once is delivered: past the slow first batches (the first with requests
        starts the state processor's Python workers), so what a test schedules next is not late for that."""
        kafka = Kafka(self.bootstrap)
        topic = kafka.topic("warm-up")
        reader = kafka.reader(topic)
        try:
            kafka.produce(f"{self.app_id}-schedule-requests", key=b"warm-up", headers=native(topic, at(0), "warm-up"))
            reader.wait_for(
                lambda r: r.key == b"warm-up", timeout=timeout, what="the warm-up delivery", guard=self.assert_running
            )
        finally:
            reader.close()
        return self

    def outcomes_since(self, mark: int, expected: int, timeout: float = 30.0) -> Counter:
        """Request outcomes logged since ``mark``, once at least ``expected`` requests were counted
        (a batch logs its line just after its write, so a delivery can be seen before the line)."""

        def enough():
            counts = outcome_counts(self.log_since(mark))
            return (counts,) if sum(counts.values()) >= expected else None

        try:
            return wait_until(
                enough, timeout, f"{expected} request outcomes in the log of {self.app_id}", guard=self.assert_running
            )[0]
        except TimeoutError as error:
            raise AssertionError(
                f"{error}; logged since the mark: {dict(outcome_counts(self.log_since(mark)))}"
            ) from None


# One micro-batch that did something, as engine.batch_summary.BatchSummary.log_line writes it, e.g.
# "batch 42: 3 requests (1 cancelled, 2 scheduled); 5 delivered (3 held until due) (max lateness 0.05s) ..."
BATCH_LINE = re.compile(
    r"(?:^|\bINFO\s+)batch (?P<batch>\d+): (?:(?P<requests>\d+) requests \((?P<outcomes>[^)]*)\); )?"
    r"(?P<delivered>\d+) delivered(?: \((?P<held>\d+) held until due\))?"
    r"(?:.*?(?P<dead>\d+) undeliverable, sent to rejections)?"
)


@dataclass
class BatchLine:
    batch: int
    outcomes: Counter
    delivered: int
    held: int
    dead_lettered: int


def parse_batch_line(line: str) -> BatchLine | None:
    """The counts of one batch log line; None for any other line. Fails on a line it half understands."""
    match = BATCH_LINE.search(line)
    if match is None:
        return None
    outcomes: Counter = Counter()
    for part in (match["outcomes"] or "").split(", "):
        if part:
            n, name = part.split(" ", 1)
            outcomes[name] += int(n)
    if match["requests"] is not None:
        assert sum(outcomes.values()) == int(match["requests"]), f"outcomes do not add up in {line!r}"
    return BatchLine(
        int(match["batch"]), outcomes, int(match["delivered"]), int(match["held"] or 0), int(match["dead"] or 0)
    )


def batch_lines(log: str) -> list[BatchLine]:
    return [parsed for parsed in map(parse_batch_line, log.splitlines()) if parsed is not None]


def outcome_counts(log: str) -> Counter:
    """Request outcomes (scheduled, replaced, replace_noop, cancelled, cancel_noop, rejected) summed over a log."""
    total: Counter = Counter()
    for line in batch_lines(log):
        total.update(line.outcomes)
    return total


def at(seconds: float) -> str:
    """An ISO instant ``seconds`` from now."""
    return format_instant(datetime.now(UTC) + timedelta(seconds=seconds))


def ms_of(instant: str) -> int:
    return int(datetime.fromisoformat(instant.replace("Z", "+00:00")).timestamp() * 1000)


def native(to=None, deliver_at=None, request_id=None, action=None, extra=()):
    """Headers of a native request, written out by hand (not with the project's client)."""
    headers = list(extra)
    if action is not None:
        headers.append(("x-scheduler-action", action.encode()))
    if to is not None:
        headers.append(("x-scheduler-deliver-to", to.encode()))
    if deliver_at is not None:
        headers.append(("x-scheduler-deliver-at", deliver_at.encode()))
    if request_id is not None:
        # bytes pass as they are: any non-empty byte sequence is a valid id
        headers.append(("x-scheduler-request-id", request_id if isinstance(request_id, bytes) else request_id.encode()))
    return headers
