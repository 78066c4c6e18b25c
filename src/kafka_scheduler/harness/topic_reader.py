"""Reading topics whole, from outside the job: what the tests, the benchmarks and the crash suite read deliveries,
rejections and history with. Every partition of the topics is assigned (no consumer group), from the beginning.

``TopicReader.take`` decides what is kept of each record: a ``Record`` by default; the benchmarks keep figures,
the crash suite its own delivery rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from .waiting import wait_until


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list
    timestamp_ms: int

    @classmethod
    def of(cls, message) -> Record:
        return cls(
            message.topic(),
            message.partition(),
            message.offset(),
            message.key(),
            message.value(),
            list(message.headers() or []),
            message.timestamp()[1],
        )

    def header(self, name: str) -> bytes | None:
        values = [v for k, v in self.headers if k == name]
        assert len(values) == 1, f"expected one {name} header, got {self.headers}"
        return values[0]

    def header_values(self, name: str) -> list:
        return [v for k, v in self.headers if k == name]


class TopicReader:
    """Reads every partition of ``topics`` from the beginning, handing each record to ``take``.

    ``committed``: read as an exactly-once consumer does (isolation.level=read_committed)."""

    def __init__(self, bootstrap: str, topics: Sequence[str], committed: bool = False, settings: dict | None = None):
        self.bootstrap = bootstrap
        self.committed = committed
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"reader-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "log_level": 3,
                "fetch.max.bytes": 50_000_000,
                "isolation.level": "read_committed" if committed else "read_uncommitted",
                **(settings or {}),
            }
        )
        metadata = self.consumer.list_topics(timeout=10)
        self.partitions = [TopicPartition(t, p, 0) for t in topics for p in metadata.topics[t].partitions]
        self.consumer.assign(self.partitions)
        self.records: list[Record] = []

    def take(self, message) -> None:
        self.records.append(Record.of(message))

    def poll(self, seconds: float = 0.2, max_records: int = 10_000) -> list[Record]:
        """Read what arrives within ``seconds``; ``records`` so far."""
        for message in self.consumer.consume(max_records, seconds):
            if message.error() is None:
                self.take(message)
        return self.records

    def positions(self) -> dict[tuple[str, int], int]:
        """Where reading stands per partition: the position, not the last record read (with read_committed it
        moves past transaction markers too)."""
        return {(tp.topic, tp.partition): tp.offset for tp in self.consumer.position(self.partitions) if tp.offset >= 0}

    def ends(self) -> dict[tuple[str, int], int]:
        """The current end (high watermark) of each partition."""
        return {
            (tp.topic, tp.partition): self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            for tp in self.partitions
        }

    def caught_up(self, ends: dict | None = None) -> bool:
        """Whether every partition has been read up to ``ends`` (default: its end now)."""
        positions = self.positions()
        return all(end == 0 or positions.get(tp, -1) >= end for tp, end in (ends or self.ends()).items())

    def wait_for(
        self,
        predicate: Callable[[Record], bool],
        count: int = 1,
        timeout: float = 60.0,
        what: str = "records",
        guard: Callable[[], None] | None = None,
    ) -> list[Record]:
        """The records matching ``predicate``, once there are ``count`` of them."""

        def matching():
            found = [r for r in self.poll() if predicate(r)]
            return found if len(found) >= count else None

        return wait_until(matching, timeout, f"{count} {what}", guard=guard)

    def read_to_end(self, timeout: float = 30.0) -> list[Record]:
        """Poll until every partition has been read up to its end as it was when this was called."""
        ends = self.ends()

        def caught_up() -> bool:
            self.poll()
            return self.caught_up(ends)

        wait_until(caught_up, timeout, f"reading to the end of {sorted(ends)}")
        return self.records

    def close(self) -> None:
        self.consumer.close()
