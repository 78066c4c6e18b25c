"""Kafka administration the scheduler needs: its own topics, and which destination topics exist."""

from __future__ import annotations

import logging
import time
from typing import Optional

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

log = logging.getLogger(__name__)


class KafkaUnreachable(RuntimeError):
    pass


def admin_client(bootstrap_servers: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3})


def wait_for_broker(bootstrap_servers: str, timeout: float = 30.0) -> AdminClient:
    admin = admin_client(bootstrap_servers)
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if admin.list_topics(timeout=min(5.0, max(0.5, deadline - time.monotonic()))).brokers:
                return admin
        except KafkaException as exc:
            last_error = exc
        time.sleep(0.2)
    raise KafkaUnreachable(f"no Kafka broker answered at {bootstrap_servers} within {timeout:.0f}s"
                           + (f" ({last_error})" if last_error else ""))


def ensure_topics(admin: AdminClient, names: list[str], partitions: int, timeout: float = 30.0,
                  config: Optional[dict] = None) -> list[str]:
    """Create the topics that do not exist yet (with topic ``config``); returns the names created."""
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = [name for name in names if name not in existing]
    if not wanted:
        return []
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config or {}) for name in wanted],
                                  operation_timeout=timeout)
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":  # another process won the race: fine
                raise
    # Topic metadata propagates asynchronously; wait until every name is listed.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set(names) <= set(admin.list_topics(timeout=timeout).topics):
            break
        time.sleep(0.1)
    return created


class TopicDirectory:
    """Which topics exist, cached; a name not seen before triggers one metadata refresh."""

    def __init__(self, admin: AdminClient, refresh_seconds: float = 30.0):
        self._admin = admin
        self._refresh_seconds = refresh_seconds
        self._known: dict[str, int] = {}  # topic -> partition count
        self._fetched_at = float("-inf")

    def _refresh(self) -> None:
        self._known = {name: len(topic.partitions)
                       for name, topic in self._admin.list_topics(timeout=30).topics.items()}
        self._fetched_at = time.monotonic()

    def _look_up(self, names: set[str]) -> None:
        stale = time.monotonic() - self._fetched_at > self._refresh_seconds
        if stale or not names <= self._known.keys():
            self._refresh()

    def missing(self, names: set[str]) -> set[str]:
        self._look_up(names)
        return names - self._known.keys()

    def partition_counts(self, names: set[str]) -> dict[str, int]:
        """Partition counts of the topics among ``names`` that exist."""
        self._look_up(names)
        return {name: self._known[name] for name in names if name in self._known}
