"""A small Python client that produces native scheduling requests.

    from kafka_scheduler.client import SchedulerClient
    with SchedulerClient("127.0.0.1:9092", app_id="kafka-scheduler") as client:
        client.schedule("reminders", "+30s", value=b"hello", request_id="r-1")
        client.replace("reminders", "2026-12-24T18:00:00Z", value=b"later", request_id="r-1")
        client.cancel("r-1")

Requests that carry an id go to a partition chosen from the id, so every request for
one id is read in the order it was sent.
"""

from __future__ import annotations

import re
import zlib
from datetime import datetime, timedelta, timezone
from typing import Iterable, Optional, Union

from confluent_kafka import KafkaException, Producer

from .config import REQUESTS_SUFFIX
from .protocol import ACTION, DELIVER_AT, DELIVER_TO, PREFIX, REQUEST_ID

When = Union[str, datetime, timedelta]
HeaderList = Iterable[tuple[str, Optional[Union[str, bytes]]]]

_RELATIVE = re.compile(r"^\+(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_RELATIVE_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


class RequestError(ValueError):
    """A request the scheduler would reject, caught before it is sent."""


def parse_due(when: When, now: Optional[datetime] = None) -> datetime:
    """``+30s``/``+5m``/``+2h``/``+1d``/``+250ms``, an ISO-8601 instant with a zone, a timedelta or an aware datetime."""
    now = now or datetime.now(timezone.utc)
    if isinstance(when, timedelta):
        return now + when
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise RequestError("the due time has no time zone; give an aware datetime")
        return when.astimezone(timezone.utc)
    text = str(when).strip()
    relative = _RELATIVE.match(text)
    if relative:
        return now + timedelta(**{_RELATIVE_UNITS[relative.group(2)]: float(relative.group(1))})
    try:
        parsed = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise RequestError(f"cannot read due time {text!r}: use ISO-8601 like 2026-05-24T12:30:00Z, "
                           "or +30s, +5m, +2h, +1d") from None
    if parsed.tzinfo is None:
        raise RequestError(f"due time {text!r} has no time zone: add Z or an offset like +02:00")
    return parsed.astimezone(timezone.utc)


def format_instant(instant: datetime) -> str:
    """UTC, millisecond precision, trailing Z: the form the scheduler parses."""
    utc = instant.astimezone(timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def request_headers(action: str, deliver_to: Optional[str] = None, deliver_at: Optional[datetime] = None,
                    request_id: Optional[str] = None, headers: HeaderList = ()) -> list[tuple[str, Optional[bytes]]]:
    """The record headers of a native request: the user's headers plus the ``x-scheduler-*`` ones."""
    result: list[tuple[str, Optional[bytes]]] = []
    for name, value in headers:
        if name.lower().startswith(PREFIX):
            raise RequestError(f"header {name!r}: names starting with {PREFIX} are reserved for the scheduler")
        result.append((name, value.encode() if isinstance(value, str) else value))
    result.append((ACTION, action.encode()))
    if deliver_to is not None:
        result.append((DELIVER_TO, deliver_to.encode()))
    if deliver_at is not None:
        result.append((DELIVER_AT, format_instant(deliver_at).encode()))
    if request_id is not None:
        if request_id == "":
            raise RequestError("the request id must not be empty")
        result.append((REQUEST_ID, request_id.encode()))
    return result


def _as_bytes(value: Optional[Union[str, bytes]]) -> Optional[bytes]:
    return value.encode() if isinstance(value, str) else value


class SchedulerClient:
    def __init__(self, bootstrap_servers: str, app_id: str = "kafka-scheduler",
                 producer_config: Optional[dict] = None):
        self.requests_topic = app_id + REQUESTS_SUFFIX
        self._bootstrap_servers = bootstrap_servers
        self._producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True,
                                   "linger.ms": 5, **(producer_config or {})})
        self._partitions: Optional[int] = None
        self._errors: list[str] = []

    def _partition_for(self, request_id: Optional[str]) -> Optional[int]:
        if request_id is None:
            return None
        if self._partitions is None:
            try:
                metadata = self._producer.list_topics(self.requests_topic, timeout=10)
            except KafkaException as exc:
                raise RequestError(f"cannot read topic metadata from {self._bootstrap_servers}: {exc}") from None
            topic = metadata.topics.get(self.requests_topic)
            if topic is None or topic.error is not None or not topic.partitions:
                raise RequestError(f"topic {self.requests_topic} does not exist: is the scheduler app running?")
            self._partitions = len(topic.partitions)
        return zlib.crc32(request_id.encode()) % self._partitions

    def _send(self, key, value, headers, request_id: Optional[str]) -> None:
        def on_delivery(err, _msg):
            if err is not None:
                self._errors.append(str(err))

        partition = self._partition_for(request_id)
        extra = {} if partition is None else {"partition": partition}
        self._producer.produce(self.requests_topic, key=_as_bytes(key), value=_as_bytes(value), headers=headers,
                               on_delivery=on_delivery, **extra)
        self._producer.poll(0)

    def schedule(self, topic: str, at: When, value: Optional[Union[str, bytes]] = None,
                 key: Optional[Union[str, bytes]] = None, headers: HeaderList = (),
                 request_id: Optional[str] = None, action: str = "ADD") -> datetime:
        """Deliver ``key``/``value``/``headers`` to ``topic`` at ``at``; returns the due instant (UTC)."""
        due = parse_due(at)
        self._send(key, value, request_headers(action, topic, due, request_id, headers), request_id)
        return due

    def replace(self, topic: str, at: When, value: Optional[Union[str, bytes]] = None,
                key: Optional[Union[str, bytes]] = None, headers: HeaderList = (), *, request_id: str) -> datetime:
        return self.schedule(topic, at, value, key, headers, request_id, action="REPLACE")

    def cancel(self, request_id: str) -> None:
        self._send(None, None, request_headers("CANCEL", request_id=request_id), request_id)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every request is acknowledged by the broker; raises if any failed."""
        if self._producer.flush(timeout) > 0:
            raise RequestError(f"{len(self._producer)} requests not acknowledged within {timeout:.0f}s "
                               f"(is a broker reachable at {self._bootstrap_servers}?)")
        if self._errors:
            errors, self._errors = self._errors, []
            raise RequestError("requests failed: " + "; ".join(errors))

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> "SchedulerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
