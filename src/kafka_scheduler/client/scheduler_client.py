"""A small Python client that produces scheduling requests, in the native dialect or another one.

    from kafka_scheduler.client.scheduler_client import SchedulerClient
    with SchedulerClient("127.0.0.1:9092", app_id="kafka-scheduler") as client:
        client.schedule("reminders", "+30s", value=b"hello", request_id="r-1")
        client.replace("reminders", "2026-12-24T18:00:00Z", value=b"later", request_id="r-1")
        client.cancel("r-1")

    # the same in Karafka's format, on a topic the scheduler reads with `--input schedules:karafka`
    with SchedulerClient("127.0.0.1:9092", dialect="karafka", requests_topic="schedules") as client:
        client.schedule("reminders", "+30s", value=b"hello", request_id="r-1")

    # recurring (native only): every weekday at 9:00 in Paris; firings more than 10 minutes late are not delivered
    with SchedulerClient("127.0.0.1:9092") as client:
        client.cron("reminders", "0 9 * * 1-5", value=b"standup", request_id="standup", timezone="Europe/Paris",
                    max_lateness="10m")
        client.pause("standup"); client.resume("standup"); client.cancel("standup", cron=True)

Native requests that carry an id go to a partition chosen from the id (crc32), so every request
for one id is read in the order it was sent. In the other dialects the record key is the request
id and the producer's murmur2 partitioner (as in Java clients) picks the partition, with the same
effect. Karafka and ETF1 carry whole seconds: their due times are rounded up to the next second.
The encoding itself is in ``kafka_scheduler.client.encoders``.
"""

from __future__ import annotations

import re
import zlib
from datetime import UTC, datetime, timedelta

from confluent_kafka import KafkaException, Producer

from ..config import OPTION_NAMES, REQUESTS_SUFFIX
from ..kafka.topics import client_error_text
from .encoders import (  # noqa: F401
    DIALECTS,
    HeaderList,
    Interval,
    Lateness,
    RequestError,
    effective_due,
    encode,
    encode_cron,
    format_instant,
    request_headers,
)

When = str | datetime | timedelta

_RELATIVE = re.compile(r"^\+(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_RELATIVE_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_due(when: When, now: datetime | None = None) -> datetime:
    """``+30s``/``+5m``/``+2h``/``+1d``/``+250ms``, an ISO-8601 instant with a zone, a timedelta or an aware
    datetime."""
    now = now or datetime.now(UTC)
    if isinstance(when, timedelta):
        return now + when
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise RequestError("the due time has no time zone; give an aware datetime")
        return when.astimezone(UTC)
    text = str(when).strip()
    relative = _RELATIVE.match(text)
    if relative:
        return now + timedelta(**{_RELATIVE_UNITS[relative.group(2)]: float(relative.group(1))})
    try:
        parsed = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise RequestError(
            f"cannot read due time {text!r}: use ISO-8601 like 2026-05-24T12:30:00Z, or +30s, +5m, +2h, +1d"
        ) from None
    if parsed.tzinfo is None:
        raise RequestError(f"due time {text!r} has no time zone: add Z or an offset like +02:00")
    return parsed.astimezone(UTC)


class SchedulerClient:
    """Produces requests to ``requests_topic`` in ``dialect`` (one of ``DIALECTS``).

    ``requests_topic`` defaults to ``<app-id>-schedule-requests`` for the native dialect; for the others it
    is required: the topic the scheduler reads with that dialect (``run --input TOPIC:DIALECT``).
    ``cron_min_interval``: the job's ``--cron-min-interval`` ("5s", milliseconds or a timedelta), which ``cron``
    checks an expression against before sending it; None: the job's default.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        app_id: str = OPTION_NAMES["app_id"].default,
        producer_config: dict | None = None,
        *,
        dialect: str = "native",
        requests_topic: str | None = None,
        cron_min_interval: Interval = None,
    ):
        if dialect not in DIALECTS:
            raise RequestError(f"unknown dialect {dialect!r}: use one of {', '.join(DIALECTS)}")
        if requests_topic is None and dialect != "native":
            raise RequestError(
                f"the {dialect} dialect needs requests_topic: the topic the scheduler reads as a "
                f"{dialect} input (e.g. schedules)"
            )
        if requests_topic == "":
            raise RequestError("requests_topic must not be empty")
        self.dialect = dialect
        self.cron_min_interval = cron_min_interval
        self.requests_topic = requests_topic or app_id + REQUESTS_SUFFIX
        self._bootstrap_servers = bootstrap_servers
        config = {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "linger.ms": 5}
        if dialect != "native":
            # Keyed by request id; the same partitioner as the Java clients that Karafka/ETF1/Sky users run.
            config["partitioner"] = "murmur2_random"
        # What the client itself reports (authentication, TLS, connection): the reason behind a metadata timeout.
        self._client_errors: list[str] = []
        config["error_cb"] = lambda error: self._client_errors.append(error.str())
        self._producer = Producer({**config, **(producer_config or {})})
        self._partitions: int | None = None
        self._errors: list[str] = []

    def _topic_partitions(self) -> int:
        if self._partitions is None:
            try:
                metadata = self._producer.list_topics(self.requests_topic, timeout=10)
            except KafkaException as exc:
                self._producer.poll(0)  # serves the error callbacks
                why = "; ".join(dict.fromkeys(client_error_text(error) for error in self._client_errors)) or str(exc)
                raise RequestError(f"cannot read topic metadata from {self._bootstrap_servers}: {why}") from None
            topic = metadata.topics.get(self.requests_topic)
            if topic is None or topic.error is not None or not topic.partitions:
                if self.dialect == "native":
                    raise RequestError(f"topic {self.requests_topic} does not exist: is the scheduler app running?")
                raise RequestError(
                    f"topic {self.requests_topic} does not exist: create it (the scheduler does not "
                    f"create the topics of {self.dialect} inputs)"
                )
            self._partitions = len(topic.partitions)
        return self._partitions

    def _partition_for(self, request_id: str | None) -> int | None:
        if self.dialect != "native":
            self._topic_partitions()  # a clear error for a missing topic; the partitioner hashes the key
            return None
        if request_id is None:
            return None
        return zlib.crc32(request_id.encode()) % self._topic_partitions()

    def _send(self, key, value, headers, request_id: str | None) -> None:
        def on_delivery(err, _msg):
            if err is not None:
                self._errors.append(str(err))

        partition = self._partition_for(request_id)
        extra = {} if partition is None else {"partition": partition}
        self._producer.produce(
            self.requests_topic, key=key, value=value, headers=headers, on_delivery=on_delivery, **extra
        )
        self._producer.poll(0)

    def schedule(
        self,
        topic: str,
        at: When,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        headers: HeaderList = (),
        request_id: str | None = None,
        action: str = "ADD",
        *,
        target_partition: int | None = None,
        partition_key: str | bytes | None = None,
        max_lateness: Lateness = None,
    ) -> datetime:
        """Deliver ``key``/``value``/``headers`` to ``topic`` at ``at``; returns the due instant (UTC) as sent
        (rounded up to the second for karafka and etf1). ``target_partition``/``partition_key``: karafka only.
        ``max_lateness`` (native only; "10m", "PT10M", milliseconds or a timedelta): if it would go out later than
        that after ``at``, it is not delivered but rejected as expired."""
        due = parse_due(at)
        record = encode(
            self.dialect,
            action,
            request_id=request_id,
            topic=topic,
            due=due,
            key=key,
            value=value,
            headers=headers,
            target_partition=target_partition,
            partition_key=partition_key,
            max_lateness=max_lateness,
        )
        self._send(*record, request_id)
        return due if self.dialect == "native" else effective_due(self.dialect, due)

    def replace(
        self,
        topic: str,
        at: When,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        headers: HeaderList = (),
        *,
        request_id: str,
        target_partition: int | None = None,
        partition_key: str | bytes | None = None,
        max_lateness: Lateness = None,
    ) -> datetime:
        return self.schedule(
            topic,
            at,
            value,
            key,
            headers,
            request_id,
            action="REPLACE",
            target_partition=target_partition,
            partition_key=partition_key,
            max_lateness=max_lateness,
        )

    def cancel(self, request_id: str, cron: bool = False) -> None:
        """Cancel the pending schedule ``request_id``, or with ``cron`` the recurring one (crons and one-shots have
        ids of their own: a CANCEL never touches a cron)."""
        if cron:
            self._send(*encode_cron(self.dialect, "cancel", request_id=request_id), request_id)
            return
        self._send(*encode(self.dialect, "CANCEL", request_id=request_id), request_id)

    def cron(
        self,
        topic: str,
        expr: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        headers: HeaderList = (),
        *,
        request_id: str,
        timezone: str | None = None,
        missed: str | None = None,
        start_at: When | None = None,
        end_at: When | None = None,
        max_lateness: Lateness = None,
    ) -> None:
        """A recurring schedule (Kaspr's CRON_ADD; native only): deliver ``key``/``value``/``headers`` to ``topic`` at
        every firing of ``expr`` (croniter's syntax: five fields, or six with the seconds last; aliases like
        @hourly), in ``timezone`` (IANA; default UTC), between ``start_at`` and ``end_at``. ``missed``: ``replay``
        (default) delivers the firings missed while the job was down or the cron paused, ``skip`` does not. The
        same ``request_id`` replaces it. A cron the job would reject (an invalid expression, one that never fires,
        an unknown zone, firings closer together than the job's minimum interval) raises RequestError with the
        job's reason, and nothing is sent."""
        record = encode_cron(
            self.dialect,
            "add",
            request_id=request_id,
            topic=topic,
            expr=expr,
            key=key,
            value=value,
            headers=headers,
            timezone=timezone,
            missed=missed,
            start_at=None if start_at is None else parse_due(start_at),
            end_at=None if end_at is None else parse_due(end_at),
            max_lateness=max_lateness,
            min_interval=self.cron_min_interval,
        )
        self._send(*record, request_id)

    def pause(self, request_id: str) -> None:
        """No firings of the cron ``request_id`` until resumed (those prepared are withdrawn)."""
        self._send(*encode_cron(self.dialect, "pause", request_id=request_id), request_id)

    def resume(self, request_id: str) -> None:
        """Firings again; with ``replay`` those missed while paused are delivered at once, with ``skip`` not."""
        self._send(*encode_cron(self.dialect, "resume", request_id=request_id), request_id)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every request is acknowledged by the broker; raises if any failed."""
        if self._producer.flush(timeout) > 0:
            raise RequestError(
                f"{len(self._producer)} requests not acknowledged within {timeout:.0f}s "
                f"(is a broker reachable at {self._bootstrap_servers}?)"
            )
        if self._errors:
            errors, self._errors = self._errors, []
            raise RequestError("requests failed: " + "; ".join(errors))

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> SchedulerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
