"""What the state processor (wheel_processor.WheelProcessor) emits: the output schema and its record kinds.

(The per-id layout's processor lived here until issue 7 retired it.)
"""

from __future__ import annotations

from pyspark.sql.types import ArrayType, BinaryType, BooleanType, IntegerType, LongType, StringType, StructField, \
    StructType

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))

# What the processor emits: records to write (deliver, reject) and per-outcome counts (outcome).
OUTPUT_SCHEMA = StructType([
    StructField("kind", StringType()),
    StructField("topic", StringType()),  # destination topic; for outcome rows, the outcome name
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("headers", HEADERS_TYPE),
    StructField("due_ms", LongType()),
    StructField("n", LongType()),
    # deliveries only: the explicit partition, or the partitioner hash of a partition key (the sink takes it
    # modulo the destination's partition count); the write-back to send and whether to copy to history
    StructField("partition", IntegerType()),
    StructField("partition_hash", IntegerType()),
    StructField("wb_topic", StringType()),
    StructField("wb_partition", IntegerType()),
    StructField("wb_key", BinaryType()),
    StructField("wb_headers", HEADERS_TYPE),
    StructField("history", BooleanType()),
    # deliveries only: emitted ahead of its due time, for the driver's timed writer (see wheel.apply_requests)
    StructField("prepared", BooleanType()),
])
OUTPUT_COLUMNS = OUTPUT_SCHEMA.names

KIND_DELIVER = "deliver"
KIND_OUTCOME = "outcome"
OUTCOME_REJECTED = "rejected"
