"""The vocabulary shared by the client, the dialects and the engine: names on the wire (the native request
headers, the headers the scheduler writes), the dialect names, the Sky Avro schema, and the forms of schedule ids.

Kept free of Spark imports so the client library stays light.
"""

PREFIX = "x-scheduler-"
ACTION = PREFIX + "action"
DELIVER_TO = PREFIX + "deliver-to"
DELIVER_AT = PREFIX + "deliver-at"
REQUEST_ID = PREFIX + "request-id"
REQUEST_HEADERS = (ACTION, DELIVER_TO, DELIVER_AT, REQUEST_ID)
ACTIONS = ("ADD", "REPLACE", "CANCEL")
# Recurring schedules (Kaspr's cron actions, issue 19): the request id names the cron.
CRON_EXPR = PREFIX + "cron-expr"
CRON_MISSED_FIRE_POLICY = PREFIX + "cron-missed-fire-policy"
CRON_TIMEZONE = PREFIX + "cron-timezone"
CRON_START_AT = PREFIX + "cron-start-at"
CRON_END_AT = PREFIX + "cron-end-at"
MAX_LATENESS = PREFIX + "max-lateness"
CRON_ACTIONS = ("CRON_ADD", "CRON_PAUSE", "CRON_RESUME", "CRON_CANCEL")

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
CRON_SID_PREFIX = b"cron:"
INTERNAL_SID_PREFIX = b"offset:"
REJECTIONS_SID = b"\x00rejections"

# What a pending schedule costs in state beyond its key, value and headers: the size limits count it.
ENTRY_OVERHEAD_BYTES = 32
