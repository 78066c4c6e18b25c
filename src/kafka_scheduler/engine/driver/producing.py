"""Writing records with a confluent-kafka producer, as the timed writer and the herd tasks (exactly_once.py) both do:
the producers' settings, handing a record over, telling a destination's refusals from other failures, and the
rejection a refused or expired delivery becomes."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from confluent_kafka import KafkaError, KafkaException, Producer

from ..rules.rejections import (
    NOT_AUTHORIZED,
    REFUSED,
    TOO_LARGE,
    TOPIC_MISSING,
    expiry_headers,
    refusal_headers,
    text,
)

# The largest record the scheduler's producers (these and Spark's Kafka sink) write.
PRODUCER_MAX_BYTES = 8 * 1024 * 1024

# Errors with which a destination refuses a record for good: retrying cannot help, so the record goes to the
# rejections topic with the reason. The sink checks destinations before a batch's records reach the writer; these
# are what changed since (a topic deleted, an ACL added). Any other error (a broker away) is retried.
REFUSALS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.POLICY_VIOLATION,
    }
)


class Record(NamedTuple):
    """One record to produce (partition None: the producer's partitioner picks it)."""

    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list | None  # (name, value) pairs


def producer_config(bootstrap_servers: str, **extra) -> dict:
    return {
        "bootstrap.servers": bootstrap_servers,
        "acks": "all",
        "linger.ms": 0,
        "compression.type": "lz4",
        "enable.idempotence": True,
        "message.max.bytes": PRODUCER_MAX_BYTES,
        # Java's default partitioner, which Spark's Kafka sink uses: a key goes to the same partition
        # whichever path writes its delivery.
        "partitioner": "murmur2_random",
        "log_level": 3,
        **extra,
    }


def header_pairs(headers) -> list:
    """Headers as (name, value) pairs, from Spark's (key, value) structs, dicts or pairs."""
    return [(h["key"], h["value"]) if isinstance(h, dict) else (h[0], h[1]) for h in headers or ()]


def produce_record(producer: Producer, record: Record, on_delivery) -> KafkaError | None:
    """Hand one record to ``producer``, waiting while its queue is full; the error if the producer refused it before
    sending (too large, unknown topic or partition)."""
    kwargs = {} if record.partition is None else {"partition": int(record.partition)}
    while True:
        try:
            producer.produce(
                record.topic,
                value=record.value,
                key=record.key,
                headers=record.headers,
                on_delivery=on_delivery,
                **kwargs,
            )
            return None
        except BufferError:
            producer.poll(0.01)
        except KafkaException as exc:
            return exc.args[0]


def send_sorting_refusals(send: Callable[[list], list], items: list, again_once: bool = False) -> tuple[list, list]:
    """Send (held, record) pairs with ``send`` (it returns the (held, record, error) it could not write); then
    (refused, failed): the records their destination refused, and the ones not written for another reason.
    librdkafka sends a partition's records as one batch, and a broker refuses a batch larger than the topic's
    max.message.bytes whole: records refused for their size are tried again one by one before they count as
    refused. With ``again_once``, the records that failed without a refusal of their own (a transaction aborted
    by another record's refusal takes them along) are sent once more first."""
    failures = send(items)
    if again_once and failures:
        again = [(held, record) for held, record, error in failures if error.code() not in REFUSALS]
        failures = [f for f in failures if f[2].code() in REFUSALS] + (send(again) if again else [])
    size = KafkaError.MSG_SIZE_TOO_LARGE
    alone = [(held, record) for held, record, error in failures if error.code() == size]
    failures = [f for f in failures if f[2].code() != size]
    for item in alone:
        failures += send([item])
    return ([f for f in failures if f[2].code() in REFUSALS], [f for f in failures if f[2].code() not in REFUSALS])


def refusal_reason(record: Record, error: KafkaError) -> str:
    """Why ``record``'s destination refused it, from the error of its delivery report (the sink's twin, from the
    broker's metadata: sink_columns.dead_letter_columns)."""
    code = error.code()
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return text(NOT_AUTHORIZED, topic=record.topic)
    if code in (KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART):
        return text(TOPIC_MISSING, topic=record.topic)
    if code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE):
        size = (
            len(record.key or b"")
            + len(record.value or b"")
            + sum(len(k.encode()) + len(v or b"") for k, v in record.headers)
        )
        return text(TOO_LARGE, size=size, topic=record.topic, limit=error.str())
    return text(REFUSED, topic=record.topic, error=error.str())


def refused_as_rejection(record: Record, delivery_id: str, rejections_topic: str, error: KafkaError) -> Record:
    """A refused record as a rejection: its key, value and headers, the reason and its request's source."""
    headers = [*record.headers, *refusal_headers(refusal_reason(record, error), delivery_id)]
    return Record(rejections_topic, None, record.key, record.value, headers)


def expired_as_rejection(
    record: Record, delivery_id: str, due_ms: int, max_lateness_ms: int, rejections_topic: str
) -> Record:
    """A delivery later than its max lateness as a rejection (the sink's twin: sink_columns.expiry_columns): its
    key, value and headers, the reason ``expired: ...``, ``x-scheduler-due-ms`` and its request's source."""
    headers = [*record.headers, *expiry_headers(due_ms, max_lateness_ms, delivery_id)]
    return Record(rejections_topic, None, record.key, record.value, headers)
