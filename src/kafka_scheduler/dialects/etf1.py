"""The ETF1 dialect (etf1/kafka-message-scheduler): key = schedule id, value = payload, ``scheduler-*`` headers.

- value present: a schedule (ADD) due at ``scheduler-epoch`` (whole Unix seconds; a past one is
  delivered at once), to ``scheduler-target-topic`` with key ``scheduler-target-key`` (optional).
- value null: with ``x-scheduler-source-offset``, our own write-back (COMPLETE of that version);
  without, a cancel (ETF1's own tombstones too: after its delivery there is nothing left to cancel).
- Delivered with every request header plus ``scheduler-timestamp`` (the request's timestamp, Unix
  seconds), ``scheduler-key`` (the schedule id) and ``scheduler-topic`` (the source topic), and always
  copied to the history topic.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from ..protocol import SOURCE_OFFSET
from .common import (
    ACTION_COMPLETE,
    DecodeSettings,
    due_checks,
    duplicate_reasons,
    first_reason,
    header,
    header_fields,
    headers_or_empty,
    missing_key_checks,
    no_headers,
    offset_completes,
    quoted,
    reasons,
    reasons_if,
    record_key_sid,
    seconds_to_due_ms,
    source_offset_header,
    target_reason,
    value_size_checks,
)

EPOCH = "scheduler-epoch"
TARGET_TOPIC = "scheduler-target-topic"
TARGET_KEY = "scheduler-target-key"
# Added to the delivered record:
TIMESTAMP_H = "scheduler-timestamp"
KEY_H = "scheduler-key"
TOPIC_H = "scheduler-topic"

EPOCH_REGEX = r"^\d+$"
NEGATIVE_EPOCH_REGEX = r"^-\d+(\.\d+)?$"
FRACTION_EPOCH_REGEX = r"^\d+\.\d+$"
SCHEDULE_ONCE = (EPOCH, TARGET_TOPIC, TARGET_KEY)


def parsed_columns(settings: DecodeSettings) -> dict[str, Column]:
    return {
        "_etf1": header_fields(
            {"epoch": EPOCH, "topic": TARGET_TOPIC, "source_offset": SOURCE_OFFSET},
            duplicates=SCHEDULE_ONCE + (SOURCE_OFFSET,),
            raw={"key": TARGET_KEY},
        )
    }


def request_columns(settings: DecodeSettings) -> dict[str, Column]:
    parsed = F.col("_etf1")
    epoch, topic, source_offset = parsed["epoch"], parsed["topic"], parsed["source_offset"]

    add = F.col("value").isNotNull()
    complete = ~add & source_offset.isNotNull()
    action = F.when(add, F.lit("ADD")).when(complete, F.lit(ACTION_COMPLETE)).otherwise(F.lit("CANCEL"))
    due_ms = seconds_to_due_ms(epoch)
    completes, offset_reason = offset_completes(source_offset, SOURCE_OFFSET)
    applicable = F.when(add, F.array(*map(F.lit, SCHEDULE_ONCE))).when(complete, F.array(F.lit(SOURCE_OFFSET)))

    all_reasons = F.concat(
        reasons(*missing_key_checks()),
        duplicate_reasons(
            F.coalesce(F.array_intersect(parsed["duplicates"], applicable), F.array().cast("array<string>"))
        ),
        reasons_if(
            add,
            first_reason(
                (epoch.isNull(), F.lit(f"missing {EPOCH}")),
                (epoch.rlike(NEGATIVE_EPOCH_REGEX), F.concat(F.lit(f"{EPOCH} "), quoted(epoch), F.lit(" is negative"))),
                (
                    epoch.rlike(FRACTION_EPOCH_REGEX),
                    F.concat(F.lit(f"{EPOCH} "), quoted(epoch), F.lit(" is not a whole number of seconds")),
                ),
                (
                    ~epoch.rlike(EPOCH_REGEX),
                    F.concat(
                        F.lit(f"invalid {EPOCH} "), quoted(epoch), F.lit(" (expected Unix seconds, like 1893456000)")
                    ),
                ),
                *due_checks(due_ms, settings),
            ),
            target_reason(topic, TARGET_TOPIC, settings),
            *value_size_checks(settings),
        ),
        reasons_if(complete, offset_reason),
    )

    delivered_headers = F.concat(
        headers_or_empty(),
        F.array(
            header(TIMESTAMP_H, F.unix_seconds(F.col("timestamp")).cast("string")),
            header(KEY_H, F.col("key")),
            header(TOPIC_H, F.col("topic")),
        ),
    )
    return {
        "_reasons": all_reasons,
        "_sid": record_key_sid(),
        "_action": action,
        "_due_ms": F.when(add, due_ms),
        "_dest": F.when(add, topic),
        "_key": F.when(add, parsed["key"]),
        "_value": F.col("value"),
        "_headers": F.when(add, delivered_headers).otherwise(no_headers()),
        "_completes": F.when(complete, completes),
        "_wb_headers": F.when(add, F.array(source_offset_header())),
        "_history": add,
    }
