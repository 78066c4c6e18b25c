"""The wake-up ticks that make the job run a micro-batch only when there is something to do.

Micro-batches without new input are off (``spark.sql.streaming.noDataMicroBatches.enabled=false``), so an
idle job costs next to nothing; timers then fire only when a batch runs. ``Wakeups`` keeps every timer
instant the state has armed (the processor reports each one) and writes a tick record to the app's ticks
topic when one comes due, which makes the source see new data and the next batch fire the timer. At start it
writes a report tick, on which every shard reports the timers it already has.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Iterable

from confluent_kafka import Producer

from ..contract import TICK_REPORT, TICK_WAKE
from .due_queue import wait_until_due
from .producing import producer_config

log = logging.getLogger(__name__)


class Wakeups:
    """Writes a tick to the ticks topic at every armed timer instant (and a report tick at start)."""

    def __init__(
        self, bootstrap_servers: str, topic: str, producer: Producer | None = None, client_options: dict | None = None
    ):
        self.topic = topic
        self._producer = producer or Producer(producer_config(bootstrap_servers, **(client_options or {})))
        self._instants: list[int] = []
        self._known: set[int] = set()
        self._cond = threading.Condition()
        self._closed = False
        self.ticks = 0
        self._thread = threading.Thread(target=self._run, name="wakeups", daemon=True)

    def start(self) -> None:
        self.tick(TICK_REPORT)
        self._thread.start()

    def add(self, instants: Iterable[int]) -> None:
        with self._cond:
            for instant in instants:
                if instant is not None and instant not in self._known:
                    self._known.add(instant)
                    heapq.heappush(self._instants, int(instant))
            self._cond.notify()

    @property
    def next_instant(self) -> int | None:
        with self._cond:
            return self._instants[0] if self._instants else None

    def report(self) -> None:
        """A report tick now: it reaches every shard, so the next batch runs the state's rules in each."""
        self.tick(TICK_REPORT)

    def tick(self, value: bytes = TICK_WAKE) -> None:
        self._producer.produce(self.topic, value=value)
        self._producer.flush(10)
        self.ticks += 1

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(5)

    def _take_due(self, now: int) -> list[int]:
        taken = []
        while self._instants and self._instants[0] <= now:
            taken.append(heapq.heappop(self._instants))
            self._known.discard(taken[-1])
        return taken

    def _run(self) -> None:
        while True:
            with self._cond:
                if (
                    wait_until_due(
                        self._cond,
                        lambda: self._closed,
                        lambda: self._instants[0] if self._instants else None,
                        self._take_due,
                    )
                    is None
                ):
                    return
            try:
                self.tick()
            except Exception as exc:  # the broker may be away for a while: the next instant tries again
                log.warning("wake-up tick not written: %s", exc)
