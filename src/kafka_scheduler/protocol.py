"""Names on the wire: the native request headers and the headers the scheduler writes.

Kept free of Spark imports so the client library stays light.
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

# Request dialects an input topic can be read with (dialects/ has a decoder for each).
DIALECT_NAMES = ("native", "karafka", "etf1", "sky-avro", "sky-json")
