"""The vocabulary shared by the client, the dialects and the engine: names on the wire (the native request
headers, the headers the scheduler writes), the dialect names, the Sky Avro schema, and the forms of schedule ids.

Kept free of Spark imports so the client library stays light. Delivery ids have a module of their own
(delivery_ids.py, with their Spark SQL twins); ``request_of`` is read from here too.
"""

PREFIX = "x-scheduler-"
ACTION = PREFIX + "action"
DELIVER_TO = PREFIX + "deliver-to"
DELIVER_AT = PREFIX + "deliver-at"
REQUEST_ID = PREFIX + "request-id"
REQUEST_HEADERS = (ACTION, DELIVER_TO, DELIVER_AT, REQUEST_ID)
ACTIONS = ("ADD", "REPLACE", "CANCEL")

DELIVERY_ID = PREFIX + "delivery-id"
REJECTION_REASON = PREFIX + "rejection-reason"
SOURCE_TOPIC = PREFIX + "source-topic"
SOURCE_PARTITION = PREFIX + "source-partition"
SOURCE_OFFSET = PREFIX + "source-offset"
# On history records: where the delivery went and when it was due.
DELIVERED_TO = PREFIX + "delivered-to"
DUE_MS = PREFIX + "due-ms"

# Request dialects an input topic can be read with (dialects/ has a decoder for each, client/encoders.py an encoder).
DIALECT_NAMES = ("native", "karafka", "etf1", "sky-avro", "sky-json")

# The Sky writer schema of the contract (time in epoch milliseconds). Older Sky producers wrote it without
# ``headers``, which the decoder also reads.
SKY_AVRO_FIELDS = (
    {"name": "time", "type": "long"},
    {"name": "topic", "type": "string"},
    {"name": "key", "type": "bytes"},
    {"name": "value", "type": ["null", "bytes"]},
)
SKY_AVRO_HEADERS_FIELD = {"name": "headers", "type": {"type": "map", "values": "bytes"}}
SKY_AVRO_SCHEMA = {"type": "record", "name": "AvroSchedule", "fields": [*SKY_AVRO_FIELDS, SKY_AVRO_HEADERS_FIELD]}

# Schedule ids are bytes end to end (ids of the other dialects are Kafka keys: any bytes), scoped
# by input topic: b"id:<topic>/<request id bytes>". Topic names cannot contain "/", so the
# form is unambiguous. An ADD without request id gets b"offset:<topic>/<partition>/<offset>":
# nothing can refer to it. Rejections share one grouping key of their own.
CLIENT_SID_PREFIX = b"id:"
INTERNAL_SID_PREFIX = b"offset:"
REJECTIONS_SID = b"\x00rejections"

# What a pending schedule costs in state beyond its key, value and headers: the size limits count it.
ENTRY_OVERHEAD_BYTES = 32

# Recurring schedules (Kaspr's cron actions, on the native requests topic). A cron's id is scoped like a one-shot's
# but in an id space of its own, as in Kaspr: b"cron:<topic>/<request id bytes>" beside b"id:<topic>/...", so a
# CANCEL never touches a cron and a CRON_CANCEL never touches a one-shot.
CRON_EXPR = PREFIX + "cron-expr"
CRON_MISSED_FIRE_POLICY = PREFIX + "cron-missed-fire-policy"
CRON_TIMEZONE = PREFIX + "cron-timezone"
CRON_START_AT = PREFIX + "cron-start-at"
CRON_END_AT = PREFIX + "cron-end-at"
# For one-shots and every firing of a cron: a delivery that would go out later than its due time plus this is not
# delivered but rejected (reason "expired"). A duration: "10m", "PT10M", or milliseconds.
MAX_LATENESS = PREFIX + "max-lateness"
CRON_HEADERS = (CRON_EXPR, CRON_MISSED_FIRE_POLICY, CRON_TIMEZONE, CRON_START_AT, CRON_END_AT)
# The headers a native request may carry once only: a second one rejects the request (dialects/native.py).
NATIVE_SINGLE_HEADERS = (*REQUEST_HEADERS, *CRON_HEADERS, MAX_LATENESS)
CRON_ACTIONS = ("CRON_ADD", "CRON_PAUSE", "CRON_RESUME", "CRON_CANCEL")
CRON_POLICIES = ("replay", "skip")  # what happens to firings missed while the job was down or the cron paused
CRON_SID_PREFIX = b"cron:"


def schedule_sid(topic: str, request_id: bytes, prefix: bytes = CLIENT_SID_PREFIX) -> bytes:
    """A schedule's id in the state: its request id scoped to its input topic (crons: ``prefix`` CRON_SID_PREFIX).
    The decoders build the same in Spark (dialects/common.py: ``client_sid``)."""
    return prefix + topic.encode() + b"/" + request_id


# On every delivered firing, as Kaspr writes it: the firing's instant in Unix seconds.
CRON_FIRE_TIMESTAMP = PREFIX + "cron-fire-timestamp"
