"""librdkafka's own log lines, kept out of what a person reads: connect retries above all are noise in normal
operation. ``KAFKA_SCHEDULER_LOG_LEVEL=DEBUG`` shows them."""

from __future__ import annotations

import logging


class KafkaClientLog:
    """A confluent-kafka ``logger``: librdkafka's own lines (connect retries above all) go to Python logging at
    DEBUG. The failure a person must see is reported by whoever uses the client, from its errors."""

    def __init__(self, name: str = "kafka_scheduler.librdkafka"):
        self._log = logging.getLogger(name)

    def log(self, _level: int, message: str, *args) -> None:
        self._log.debug(message, *args)


def quiet_client_config() -> dict:
    """Extra confluent-kafka settings for a client whose retry chatter nobody should read."""
    return {"logger": KafkaClientLog()}
