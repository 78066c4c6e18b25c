"""The status page's buttons: each writes the native request a producer would write, to the input topic the
schedule was requested on, so it is in the log, replayable and ruled on exactly like any other request.

    CANCEL       a one-shot            (x-scheduler-action: CANCEL, x-scheduler-request-id: <id>)
    CRON_PAUSE   a recurring schedule  (the same two headers, the cron's id)
    CRON_RESUME
    CRON_CANCEL

The record goes to partition crc32(id) mod the topic's partitions, as ``SchedulerClient`` sends every request of an
id, so it is ordered with the producer's own requests for that id. Then the caller's thread (an HTTP request's, never
a batch) waits, bounded, until the job has committed a batch past the record's offset (the checkpoint's committed
offsets), so the state read after it shows the request's outcome.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from ..protocol import ACTION, CRON_ACTIONS, REQUEST_ID

log = logging.getLogger(__name__)

PAGE_ACTIONS = ("CANCEL",) + tuple(a for a in CRON_ACTIONS if a != "CRON_ADD")
ACTION_KIND = {"CANCEL": "one-shot", "CRON_PAUSE": "cron", "CRON_RESUME": "cron", "CRON_CANCEL": "cron"}
WAIT_S = 30.0  # how long an action waits for the batch that reads its request
WRITE_TIMEOUT_S = 15.0


class ActionError(ValueError):
    """A request the page cannot write (unknown action, missing id, not a native input): a 400."""


@dataclass(frozen=True)
class Written:
    action: str
    request_id: str
    topic: str
    partition: int
    offset: int

    def to_json(self) -> dict:
        return {
            "action": self.action,
            "id": self.request_id,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
        }


def request_record(action: str, request_id: str) -> tuple[None, None, list[tuple[str, bytes]]]:
    """Key, value and headers of the native request: as ``encode("native", "CANCEL", ...)`` writes a cancel."""
    return None, None, [(ACTION, action.encode()), (REQUEST_ID, request_id.encode())]


def partition_for(request_id: str, partitions: int) -> int:
    """SchedulerClient's choice for a native request with an id."""
    return zlib.crc32(request_id.encode()) % partitions


class RequestWriter:
    """Writes the page's requests (a confluent-kafka producer, made on the first action) and waits for them to be
    ruled on. ``inputs``: topic -> dialect of the job's inputs; ``committed()``: the next offset to read per topic and
    partition as of the last committed batch."""

    def __init__(
        self,
        settings: dict,
        inputs: dict[str, str],
        committed: Callable[[], dict],
        producer_factory: Callable[[dict], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.settings, self.inputs, self.committed = settings, inputs, committed
        self._factory = producer_factory
        self.clock, self.sleep = clock, sleep
        self._producer = None
        self._partitions: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def native_inputs(self) -> list[str]:
        return [t for t, d in self.inputs.items() if d == "native"]

    def check(self, action: object, request_id: object, input_topic: object) -> tuple[str, str, str]:
        """The action, id and topic of a page's request, or ActionError saying what is wrong."""
        if action not in PAGE_ACTIONS:
            raise ActionError(f"action {action!r}: use one of {', '.join(PAGE_ACTIONS)}")
        if not isinstance(request_id, str) or not request_id:
            raise ActionError("id: the request id of the schedule (a non-empty string)")
        native = self.native_inputs
        if input_topic is None and len(native) == 1:
            input_topic = native[0]
        if input_topic not in native:
            dialect = self.inputs.get(input_topic) if isinstance(input_topic, str) else None
            raise ActionError(
                f"input_topic {input_topic!r}: "
                + (
                    f"a {dialect} input; the page writes native requests only (cancel it in its own dialect: "
                    f"kafka-scheduler cancel --dialect {dialect})"
                    if dialect
                    else f"not an input of this job (its native inputs: {', '.join(native) or 'none'})"
                )
            )
        return action, request_id, input_topic

    def _producer_for(self):
        if self._producer is None:
            if self._factory is not None:
                self._producer = self._factory(self.settings)
            else:
                from confluent_kafka import Producer

                self._producer = Producer(
                    {**self.settings, "enable.idempotence": True, "acks": "all", "linger.ms": 0, "log_level": 0}
                )
        return self._producer

    def _partition_count(self, producer, topic: str) -> int:
        if topic not in self._partitions:
            metadata = producer.list_topics(topic, timeout=WRITE_TIMEOUT_S)
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                raise RuntimeError(f"topic {topic} has no partitions the page can write to")
            self._partitions[topic] = len(found.partitions)
        return self._partitions[topic]

    def write(self, action: str, request_id: str, topic: str) -> Written:
        """Write the request and wait for the broker's acknowledgement."""
        with self._lock:
            producer = self._producer_for()
            partition = partition_for(request_id, self._partition_count(producer, topic))
            key, value, headers = request_record(action, request_id)
            result: dict = {}

            def delivered(err, msg):
                result["error"], result["msg"] = err, msg

            producer.produce(topic, key=key, value=value, headers=headers, partition=partition, on_delivery=delivered)
            producer.flush(WRITE_TIMEOUT_S)
        if "msg" not in result:
            raise RuntimeError(f"the broker did not acknowledge the {action} request within {WRITE_TIMEOUT_S:.0f} s")
        if result["error"] is not None:
            raise RuntimeError(f"the {action} request was not written: {result['error']}")
        written = Written(action, request_id, topic, result["msg"].partition(), result["msg"].offset())
        return written

    def wait_ruled(self, written: Written, timeout: float = WAIT_S) -> bool:
        """True once a committed batch has read past the request's offset; False after ``timeout``."""
        deadline = self.clock() + timeout
        while True:
            if self.committed().get(written.topic, {}).get(written.partition, -1) > written.offset:
                return True
            if self.clock() >= deadline:
                return False
            self.sleep(0.2)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
