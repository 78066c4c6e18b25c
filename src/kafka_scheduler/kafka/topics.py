"""Kafka administration the scheduler needs: its own topics, and which destination topics exist."""

from __future__ import annotations

import logging
import queue
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, replace

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient, ConfigResource, NewTopic

from ..config import ConfigError
from .client_log import quiet_client_config

log = logging.getLogger(__name__)


# While no broker answers: retry this often, and log a line this often.
BROKER_RETRY_S = 1.0
BROKER_NOTE_EVERY_S = 10.0
# Destination names looked up in the background for the early path, at most (each once).
MAX_BACKGROUND_LOOK_UPS = 10_000
# The early path waits this long at most for the look-up of a name it has not seen before (a local broker answers in
# milliseconds: without the wait, every request of a new destination read before the answer waits for a batch, 518
# at the start of `bench steady`), and this long in all per minute (names without end: hostile input).
FIRST_LOOK_UP_WAIT_S = 0.5
FIRST_LOOK_UP_WAITS_PER_MINUTE_S = 2.0


class KafkaUnreachable(RuntimeError):
    pass


# Errors a retry cannot mend: the broker answers but refuses these settings (what to check, by setting).
REFUSALS = {
    KafkaError._AUTHENTICATION: "the broker refused the credentials: check sasl.mechanism, sasl.username/"
    "sasl.password (or java.sasl.jaas.config)",
    KafkaError._SSL: "the TLS handshake failed: check security.protocol and the ssl.* settings",
}


_CLIENT_STATE = re.compile(r" \(after \d+ms in state \w+\)")


def client_error_text(text: str) -> str:
    """A librdkafka error as a person reads it: without the connection-state suffix that differs per retry."""
    return _CLIENT_STATE.sub("", text)


def _refusal(errors) -> str | None:
    for error in errors:
        if error.code() in REFUSALS:
            return f"{REFUSALS[error.code()]} ({client_error_text(error.str())})"
    return None


def admin_client(bootstrap_servers: str, settings: dict | None = None) -> AdminClient:
    """``settings``: config.kafka_settings(config), the passed-through Kafka options (SASL, TLS, ...)."""
    return AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3, **(settings or {})})


def broker_addresses(bootstrap_servers: str) -> list[tuple[str, int]]:
    """(host, port) of each bootstrap server; entries it cannot read are left out (the client then judges them)."""
    addresses = []
    for entry in bootstrap_servers.split(","):
        entry = entry.strip().split("://", 1)[-1]
        host, _, port = entry.rpartition(":")
        if host and port.isdigit():
            addresses.append((host.strip("[]"), int(port)))
    return addresses


def _no_connection(addresses: list[tuple[str, int]]) -> str | None:
    """Why none of ``addresses`` accepts a TCP connection, or None if one does. Probing first keeps librdkafka from
    logging a refused connect on every retry while the broker is away."""
    reasons = []
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=2.0):
                return None
        except OSError as exc:
            reasons.append(exc.strerror or str(exc))
    return ", ".join(dict.fromkeys(r.lower() for r in reasons)) or None


def wait_for_broker(
    bootstrap_servers: str,
    timeout: float | None = 30.0,
    stop: threading.Event | None = None,
    note_every: float = BROKER_NOTE_EVERY_S,
    settings: dict | None = None,
) -> AdminClient | None:
    """An admin client once a broker answers at ``bootstrap_servers``. While none does, logs one line at once and
    then one every ``note_every`` seconds. Raises KafkaUnreachable after ``timeout`` seconds (None: wait for good);
    returns None if ``stop`` is set while waiting. A broker that refuses the credentials or the TLS settings is
    not waited for: ConfigError, naming the settings to check."""
    addresses = broker_addresses(bootstrap_servers)
    admin: AdminClient | None = None
    # What the client reports through its error callback (authentication, TLS, transport); bounded, since the
    # returned client keeps the callback for the job's life.
    errors: deque = deque(maxlen=32)
    started = time.monotonic()
    noted_at: float | None = None
    reason = None
    while True:
        reason = _no_connection(addresses) if addresses else None
        if reason is None:
            # Quiet: librdkafka would print each failed reconnect; the wait says what is wrong, once.
            admin = admin or admin_client(
                bootstrap_servers, {**(settings or {}), "error_cb": errors.append, **quiet_client_config()}
            )
            try:
                if admin.list_topics(timeout=5.0).brokers:
                    if noted_at is not None:
                        log.info("broker: %s answered after %.0fs", bootstrap_servers, time.monotonic() - started)
                    return admin
                reason = "no broker in its metadata yet"
            except KafkaException as exc:
                reason = str(exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else exc)
            admin.poll(0)  # serves the error callback
            refused = _refusal(errors)
            if refused:
                raise ConfigError(f"Kafka at {bootstrap_servers}: {refused}")
            errors.clear()
        waited = time.monotonic() - started
        if timeout is not None and waited >= timeout:
            raise KafkaUnreachable(f"no Kafka broker answered at {bootstrap_servers} within {timeout:.0f}s ({reason})")
        if noted_at is None or time.monotonic() - noted_at >= note_every:
            noted_at = time.monotonic()
            log.warning(
                "broker: waiting for %s (%s)%s",
                bootstrap_servers,
                reason,
                f"; {waited:.0f}s so far" if waited >= 1 else "",
            )
        if stop is None:
            time.sleep(BROKER_RETRY_S)
        elif stop.wait(BROKER_RETRY_S):
            return None


# The topic setting that has the broker stamp each record with the time it appended it.
LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


def ensure_topics(
    admin: AdminClient, names: list[str], partitions: int, timeout: float = 30.0, config: dict | None = None
) -> list[str]:
    """Create the topics that do not exist yet (with topic ``config``); returns the names created."""
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = [name for name in names if name not in existing]
    if not wanted:
        return []
    futures = admin.create_topics(
        [NewTopic(name, partitions, 1, config=config or {}) for name in wanted], operation_timeout=timeout
    )
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


@dataclass(frozen=True)
class Destination:
    """What the sink needs to know of an existing destination topic before writing to it."""

    partitions: int
    writable: bool  # the broker says this client may write to it (always, on a broker without an authorizer)
    max_message_bytes: int | None  # the topic's max.message.bytes; None if the broker would not say


class TopicDirectory:
    """Which topics exist, whether the scheduler may write to them and how large a record they take; cached for
    ``refresh_seconds``, and a name not seen before is looked up at once."""

    def __init__(self, admin: AdminClient, refresh_seconds: float = 30.0):
        self._admin = admin
        self._refresh_seconds = refresh_seconds
        self._known: dict[str, Destination | None] = {}  # None: does not exist (or may not even be described)
        self._fetched_at: dict[str, float] = {}
        self._to_look_up: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._asked: set[str] = set()  # names handed to the background look-up
        self._looker: threading.Thread | None = None
        self._answered = threading.Condition()  # notified after each background look-up
        self._waits: deque[tuple[float, float]] = deque()  # (when, seconds) of the waits of the last minute
        self._asked_at: dict[str, float] = {}

    def describe(self, names: set[str]) -> dict[str, Destination]:
        """The destinations among ``names`` that exist (or that this client may not describe: not writable)."""
        now = time.monotonic()
        stale = {n for n in names if now - self._fetched_at.get(n, float("-inf")) > self._refresh_seconds}
        if stale:
            try:
                self._fetch(stale)
            except KafkaException as exc:
                if not stale <= self._known.keys():
                    raise
                # A broker away for a moment (a restart): what was known a little earlier still holds.
                log.warning(
                    "destinations: looking up %s failed (%s); using what was known before",
                    ", ".join(sorted(stale)),
                    exc,
                )
        return {n: self._known[n] for n in names if self._known.get(n) is not None}

    def invalidate(self) -> None:
        self._fetched_at.clear()

    def known(self, name: str, wait: bool = False) -> Destination | None:
        """What the last look-up found of ``name`` (None: missing, or not looked up yet). A name never looked up is
        looked up in the background, so that the next call knows it; the early path asks this of every request it
        reads, and must not wait for a batch to look it up. ``wait``: wait for that background look-up, at most
        FIRST_LOOK_UP_WAIT_S from the first ask of the name, and FIRST_LOOK_UP_WAITS_PER_MINUTE_S a minute in all."""
        destination = self._known.get(name)
        if destination is None and name not in self._fetched_at:
            if name not in self._asked:
                self._look_up_later(name)
            if wait and name in self._asked:
                destination = self._wait_for(name)
        return destination

    def _wait_for(self, name: str) -> Destination | None:
        asked_at = self._asked_at.get(name)
        now = time.monotonic()
        while self._waits and now - self._waits[0][0] > 60:
            self._waits.popleft()
        budget = FIRST_LOOK_UP_WAITS_PER_MINUTE_S - sum(seconds for _, seconds in self._waits)
        timeout = min(budget, (asked_at or now) + FIRST_LOOK_UP_WAIT_S - now)
        if timeout <= 0:
            return None
        with self._answered:
            self._answered.wait_for(lambda: name in self._fetched_at, timeout)
        self._waits.append((now, time.monotonic() - now))
        return self._known.get(name)

    def _look_up_later(self, name: str) -> None:
        if len(self._asked) >= MAX_BACKGROUND_LOOK_UPS:
            return  # names without end (hostile input): the batches look them up as they write them
        self._asked.add(name)
        self._asked_at[name] = time.monotonic()
        self._to_look_up.put(name)
        if self._looker is None:
            self._looker = threading.Thread(target=self._look_up, name="destination-look-up", daemon=True)
            self._looker.start()

    def _look_up(self) -> None:
        while True:
            name = self._to_look_up.get()
            if name in self._fetched_at:
                continue
            try:
                self._fetch({name})
            except KafkaException as exc:
                log.debug("destinations: looking up %s in the background failed: %s", name, exc)
            finally:
                with self._answered:
                    self._answered.notify_all()

    def _fetch(self, names: set[str]) -> None:
        found: dict[str, Destination | None] = {}
        futures = self._admin.describe_topics(
            TopicCollection(sorted(names)), include_authorized_operations=True, request_timeout=30
        )
        for name, future in futures.items():
            try:
                topic = future.result()
            except KafkaException as exc:
                code = exc.args[0].code() if exc.args else None
                if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:  # not even allowed to see it
                    found[name] = Destination(0, False, None)
                elif code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    found[name] = None
                else:
                    raise
                continue
            operations = topic.authorized_operations
            # No list (a broker too old to say, or none at all): writing is tried, and a refusal handled where the
            # record is written. A client that may describe a topic has a list with DESCRIBE at least.
            writable = not operations or bool({AclOperation.WRITE, AclOperation.ALL} & set(operations))
            found[name] = Destination(len(topic.partitions), writable, None)
        sized = [n for n, d in found.items() if d is not None and d.writable]
        if sized:
            limits = _max_message_bytes(self._admin, sized)
            for name in sized:
                found[name] = replace(found[name], max_message_bytes=limits.get(name))
        now = time.monotonic()
        for name, destination in found.items():
            self._known[name] = destination
            self._fetched_at[name] = now


def _max_message_bytes(admin: AdminClient, names: list[str]) -> dict[str, int]:
    """Each topic's max.message.bytes; topics whose configuration the broker will not describe are left out."""
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, n) for n in names], request_timeout=30)
    limits = {}
    for resource, future in futures.items():
        try:
            entry = future.result().get("max.message.bytes")
        except KafkaException:
            continue
        if entry is not None and entry.value is not None and entry.value.isdigit():
            limits[resource.name] = int(entry.value)
    return limits
