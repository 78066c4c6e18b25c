"""The input lag: every few seconds, the input topics' latest offsets (one admin look-up) against the end offsets of
the query's last batch, into the metrics."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from .metrics import SchedulerMetrics

log = logging.getLogger(__name__)

LAG_EVERY_S = 5.0


def end_offsets(progress: dict | None, topics) -> dict:
    """{(topic, partition): offset} the last batch read to, from a query's lastProgress."""
    found: dict = {}
    for source in (progress or {}).get("sources") or ():
        offsets = source.get("endOffset")
        offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
        for topic, partitions in (offsets or {}).items():
            if topic in topics:
                for partition, offset in partitions.items():
                    found[(topic, int(partition))] = int(offset)
    return found


class LagWatcher:
    """Every ``every`` seconds: the input topics' latest offsets (one admin look-up) against the end offsets of
    the query's last batch."""

    def __init__(
        self, metrics: SchedulerMetrics, admin, progress: Callable[[], dict | None], topics, every: float = LAG_EVERY_S
    ):
        self.metrics, self.admin, self.progress, self.topics, self.every = metrics, admin, progress, set(topics), every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-watcher", daemon=True)

    def start(self) -> LagWatcher:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.every + 1)

    def _run(self) -> None:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        while not self._stop.wait(self.every):
            try:
                ends = end_offsets(self.progress(), self.topics)
                if not ends:
                    continue
                futures = self.admin.list_offsets(
                    {TopicPartition(t, p): OffsetSpec.latest() for t, p in ends}, request_timeout=self.every
                )
                latest = {(tp.topic, tp.partition): future.result(self.every).offset for tp, future in futures.items()}
                self.metrics.record_lag(ends, latest)
            except Exception as exc:  # a broker away for a while: the next round tries again
                log.debug("input lag not read: %s", exc)
