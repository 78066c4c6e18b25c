"""Helpers for the integration tests: waiting on conditions, reading topics, producing
with an independent client, and running the scheduler as a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Optional

from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_scheduler.client import format_instant
from kafka_scheduler.topics import admin_client, ensure_topics


def wait_until(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.1):
    """Poll ``condition`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: list
    timestamp_ms: int

    def header(self, name: str) -> Optional[bytes]:
        values = [v for k, v in self.headers if k == name]
        assert len(values) == 1, f"expected one {name} header, got {self.headers}"
        return values[0]

    def header_values(self, name: str) -> list:
        return [v for k, v in self.headers if k == name]


class TopicReader:
    """Reads every partition of some topics from the beginning, accumulating records."""

    def __init__(self, bootstrap: str, topics: list[str]):
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4()}",
                                  "enable.auto.commit": False, "log_level": 3})
        metadata = self.consumer.list_topics(timeout=10)
        self.consumer.assign([TopicPartition(t, p, 0) for t in topics for p in metadata.topics[t].partitions])
        self.records: list[Record] = []

    def poll(self, seconds: float = 0.2) -> list[Record]:
        for message in self.consumer.consume(1000, seconds):
            if message.error() is None:
                self.records.append(Record(message.topic(), message.partition(), message.offset(), message.key(),
                                           message.value(), list(message.headers() or []),
                                           message.timestamp()[1]))
        return self.records

    def wait_for(self, predicate: Callable[[Record], bool], count: int = 1, timeout: float = 60.0,
                 what: str = "records") -> list[Record]:
        def matching():
            found = [r for r in self.poll() if predicate(r)]
            return found if len(found) >= count else None

        return wait_until(matching, timeout, f"{count} {what}")

    def close(self) -> None:
        self.consumer.close()


@dataclass
class Kafka:
    bootstrap: str
    readers: list = field(default_factory=list)

    def topic(self, prefix: str = "t", partitions: int = 1) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        ensure_topics(admin_client(self.bootstrap), [name], partitions)
        return name

    def reader(self, *topics: str) -> TopicReader:
        reader = TopicReader(self.bootstrap, list(topics))
        self.readers.append(reader)
        return reader

    def produce(self, topic: str, key=None, value=None, headers=None, partition: Optional[int] = None):
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


class SchedulerProcess:
    """`kafka-scheduler run` as a subprocess, with its log captured to a file."""

    def __init__(self, bootstrap: str, app_id: str, checkpoint_dir: Path, log_path: Path, extra_args=(),
                 launcher=(sys.executable, "-m", "kafka_scheduler")):
        self.app_id = app_id
        self.checkpoint_dir = checkpoint_dir
        self.log_path = log_path
        self.command = [*launcher, "run", "--bootstrap-servers", bootstrap,
                        "--app-id", app_id, "--checkpoint-dir", str(checkpoint_dir), *extra_args]
        self.process: Optional[subprocess.Popen] = None
        self._log_offset = 0

    def start(self, timeout: float = 180.0) -> "SchedulerProcess":
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_until(lambda: self.process.poll() is not None or "running: reading" in self.log(), timeout,
                   f"scheduler {self.app_id} to start")
        assert self.process.poll() is None, f"scheduler exited early:\n{self.log()[-3000:]}"
        return self

    def log(self) -> str:
        """What this run (since the last start) has logged."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def stop(self, timeout: float = 180.0) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"scheduler did not stop within {timeout:.0f}s:\n{self.log()[-3000:]}")




def at(seconds: float) -> str:
    """An ISO instant ``seconds`` from now."""
    return format_instant(datetime.now(timezone.utc) + timedelta(seconds=seconds))


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
        headers.append(("x-scheduler-request-id", request_id.encode()))
    return headers
