"""The driver's two clocks: a timed writer that writes prepared deliveries at their due instant, and the
wake-up ticks that make the job run a micro-batch only when there is something to do.

Prepared deliveries come out of a micro-batch up to ``--lookahead`` before they are due (the state keeps
them until a batch after their due time retires them, so a crash loses nothing). The writer holds them in
memory, at most ``max_held`` records, and writes each with its own producer at its due time, off the batch
path: no batch waits for a due time. A later batch may withdraw one (a replace or cancel read before it was
written).

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
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from confluent_kafka import Producer

log = logging.getLogger(__name__)

TICK_WAKE = b"wake"
TICK_REPORT = b"report"  # every shard reports its timers (see WheelProcessor)


def producer_config(bootstrap_servers: str, **extra) -> dict:
    return {"bootstrap.servers": bootstrap_servers, "acks": "all", "linger.ms": 0, "compression.type": "lz4",
            "enable.idempotence": True, "message.max.bytes": 8 * 1024 * 1024,
            # Java's default partitioner, which Spark's Kafka sink uses: a key goes to the same partition
            # whichever path writes its delivery.
            "partitioner": "murmur2_random", "log_level": 3, **extra}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _wait_until_due(cond: threading.Condition, closed: Callable[[], bool], next_due_ms: Callable[[], Optional[int]],
                    take_due: Callable[[int], list]) -> Optional[list]:
    """With ``cond`` held: wait until ``take_due(now)`` takes something, and return it; None once closed. Waits
    until the next due instant (at most 1 s: ``add``/``hold`` notify, but a clock may jump)."""
    while not closed():
        now = _now_ms()
        taken = take_due(now)
        if taken:
            return taken
        due = next_due_ms()
        cond.wait(max(0.0005, min((due - now) / 1000 if due is not None else 1.0, 1.0)))
    return None


@dataclass(order=True)
class Held:
    due_ms: int
    delivery_id: str
    records: list = field(compare=False)  # (topic, partition, key, value, headers): the delivery, its copies


class TimedWriter:
    """Holds prepared deliveries and writes each at its due instant."""

    def __init__(self, bootstrap_servers: str, max_held: int = 20_000, producer: Optional[Producer] = None):
        self.max_held = max_held
        self._producer = producer or Producer(producer_config(bootstrap_servers))
        self._heap: list[Held] = []
        self._held: dict[str, Held] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._writing: Optional[int] = None  # due time of the slice being written, if any
        self._anonymous = 0
        self.written = 0
        self.withdrawn = 0
        self.failed = 0
        self.lateness_ms: list[int] = []  # of the last writes, for the batch line
        self._thread = threading.Thread(target=self._run, name="timed-writer", daemon=True)
        self._thread.start()

    @property
    def held(self) -> int:
        return len(self._held)

    def room(self) -> int:
        return max(0, self.max_held - len(self._held))

    def hold(self, rows: Iterable) -> int:
        """Rows of (delivery_id, due_ms, kind, topic, partition, key, value, headers, ...); a delivery and its
        write-back or history copy share the delivery id. A row without due time (a rejection) or already due
        is written at once. Returns how many deliveries were new."""
        added = 0
        with self._cond:
            for delivery_id, due_ms, kind, topic, partition, key, value, headers, *_ in rows:
                if delivery_id is None:  # a rejection: nothing withdraws it
                    self._anonymous += 1
                    delivery_id = f"\0{self._anonymous}"
                due_ms = due_ms or 0
                record = (topic, partition, key, value, [(h["key"], h["value"]) if isinstance(h, dict) else
                                                         (h[0], h[1]) for h in headers or ()])
                held = self._held.get(delivery_id)
                if held is None:
                    held = self._held[delivery_id] = Held(due_ms, delivery_id, [])
                    heapq.heappush(self._heap, held)
                    added += 1
                elif held.records and kind == "deliver" and any(r[0] == topic for r in held.records):
                    continue  # emitted again (a replay of the batch): held once
                held.records.append(record)
            self._cond.notify()
        return added

    def withdraw(self, delivery_ids: Iterable[str]) -> int:
        """Drop deliveries not written yet; returns how many were held."""
        dropped = 0
        with self._cond:
            for delivery_id in delivery_ids:
                held = self._held.pop(delivery_id, None)
                if held is not None:
                    held.records = []  # left in the heap, skipped when it comes up
                    dropped += 1
        self.withdrawn += dropped
        return dropped

    def wait_written(self, up_to_ms: int, timeout: float = 300.0) -> bool:
        """Until every held delivery due by ``up_to_ms`` is written and acknowledged: a batch that retires
        prepared schedules from state must not commit before that."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                pending = self._heap and self._heap[0].due_ms <= up_to_ms
                busy = self._writing is not None and self._writing <= up_to_ms
                if not pending and not busy:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        self._producer.flush(timeout)

    def _take_due(self, now: int) -> list[Held]:
        """Called with the lock held: the deliveries due by ``now`` that were not withdrawn."""
        taken = []
        while self._heap and self._heap[0].due_ms <= now:
            held = heapq.heappop(self._heap)
            if self._held.get(held.delivery_id) is held:
                del self._held[held.delivery_id]
                taken.append(held)
        return taken

    def _run(self) -> None:
        while True:
            with self._cond:
                taken = _wait_until_due(self._cond, lambda: self._closed,
                                        lambda: self._heap[0].due_ms if self._heap else None, self._take_due)
                if taken is None:
                    return
                self._writing = taken[-1].due_ms
            try:
                self._write(taken)
            finally:
                with self._cond:
                    self._writing = None
                    self._cond.notify_all()

    def _write(self, taken: list[Held]) -> None:
        errors = []

        def on_delivery(err, _msg):
            if err is not None:
                errors.append(err)

        started = _now_ms()
        for held in taken:
            for topic, partition, key, value, headers in held.records:
                kwargs = {} if partition is None else {"partition": int(partition)}
                while True:
                    try:
                        self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery,
                                               **kwargs)
                        break
                    except BufferError:
                        self._producer.poll(0.01)
        self._producer.flush()
        self.written += len(taken)
        self.lateness_ms = [started - h.due_ms for h in taken[-1000:]]
        if errors:
            self.failed += len(errors)
            log.error("timed writer: %d record(s) not written: %s", len(errors), errors[0])


class Wakeups:
    """Writes a tick to the ticks topic at every armed timer instant (and a report tick at start)."""

    def __init__(self, bootstrap_servers: str, topic: str, producer: Optional[Producer] = None):
        self.topic = topic
        self._producer = producer or Producer(producer_config(bootstrap_servers))
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
    def next_instant(self) -> Optional[int]:
        with self._cond:
            return self._instants[0] if self._instants else None

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
                if _wait_until_due(self._cond, lambda: self._closed,
                                   lambda: self._instants[0] if self._instants else None, self._take_due) is None:
                    return
            try:
                self.tick()
            except Exception as exc:  # the broker may be away for a while: the next instant tries again
                log.warning("wake-up tick not written: %s", exc)
