"""The client: send schedule, replace and cancel requests to the scheduler, in any dialect.

Needs confluent-kafka, and croniter to check a cron as the job will (and fastavro for the sky-avro dialect:
``pip install "kafka-scheduler[avro]"``); nothing here imports Spark, pandas or numpy.

    from kafka_scheduler.client import SchedulerClient
    with SchedulerClient("127.0.0.1:9092", app_id="kafka-scheduler") as client:
        client.schedule("reminders", "+30s", value=b"hello", request_id="r-1")

``encode`` returns the key, value and headers of a request without sending it; ``encode_cron`` those of a
recurring schedule's (native only).
"""

from .encoders import DIALECTS, EncodedRequest, RequestError, effective_due, encode, encode_cron, format_instant
from .scheduler_client import SchedulerClient, parse_due

__all__ = [
    "DIALECTS",
    "EncodedRequest",
    "RequestError",
    "SchedulerClient",
    "effective_due",
    "encode",
    "encode_cron",
    "format_instant",
    "parse_due",
]
