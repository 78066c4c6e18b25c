"""What the two Sky dialects (sky-uk/kafka-message-scheduler, Avro or JSON values) share.

Key = schedule id; value = a schedule (time in epoch milliseconds, topic, key, value, headers) or null.
A null value with ``schedule:expired=true`` is a write-back (ours, naming the version in
``x-scheduler-source-offset``; or the Sky scheduler's, which completes the version pending at that
point): COMPLETE. Any other null value cancels. A schedule is delivered as exactly its key, value and
headers; the write-back after delivery carries ``schedule:expired=true`` and ``x-scheduler-source-offset``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from ..protocol import SOURCE_OFFSET
from .common import (
    ACTION_COMPLETE,
    Check,
    DecodeSettings,
    due_checks,
    duplicate_reasons,
    first_reason,
    header,
    header_fields,
    missing_key_checks,
    no_headers,
    offset_completes,
    reasons,
    reasons_if,
    record_key_sid,
    source_offset_header,
    target_reason,
    value_size_checks,
)

EXPIRED = "schedule:expired"
NULL_VALUE_ONCE = (EXPIRED, SOURCE_OFFSET)


@dataclass(frozen=True)
class Schedule:
    """A dialect's view of the schedule in a record's value (read only when the value is not null)."""

    malformed: Column  # the reason the value is not a schedule at all, or null (then the checks below apply)
    time_ms: Column  # long; null when missing or not a number (``time_reason`` says which)
    time_reason: Column  # reason text or null
    topic: Column  # text
    key: Column
    value: Column
    headers: Column  # array<struct<key,value>>
    checks: tuple[Check, ...] = ()  # the schedule's other field errors


def header_texts() -> Column:
    """The headers a null value is read by: for the dialect's ``parsed_columns``."""
    return header_fields({"expired": EXPIRED, "source_offset": SOURCE_OFFSET}, duplicates=NULL_VALUE_ONCE)


def request_columns(schedule: Schedule, texts: Column, settings: DecodeSettings) -> dict[str, Column]:
    """``texts``: the dialect's parsed ``header_texts()``."""
    add = F.col("value").isNotNull()
    expired = F.coalesce(F.lower(F.trim(texts["expired"])) == "true", F.lit(False))
    complete = ~add & expired
    action = F.when(add, F.lit("ADD")).when(complete, F.lit(ACTION_COMPLETE)).otherwise(F.lit("CANCEL"))
    completes, offset_reason = offset_completes(texts["source_offset"], SOURCE_OFFSET)
    due_ms = schedule.time_ms

    all_reasons = F.concat(
        reasons(*missing_key_checks()),
        reasons_if(add, schedule.malformed),
        reasons_if(
            add & schedule.malformed.isNull(),
            *schedule.checks,
            first_reason(
                (schedule.time_reason.isNotNull(), schedule.time_reason),
                (due_ms < 0, F.concat(F.lit("time "), due_ms.cast("string"), F.lit(" is negative"))),
                *due_checks(due_ms, settings),
            ),
            target_reason(schedule.topic, "topic", settings),
            *value_size_checks(settings, schedule.value),
        ),
        # the record's own headers only matter when its value is null
        F.when(~add, duplicate_reasons(texts["duplicates"])).otherwise(F.array().cast("array<string>")),
        reasons_if(complete, offset_reason),
    )
    return {
        "_reasons": all_reasons,
        "_sid": record_key_sid(),
        "_action": action,
        "_due_ms": F.when(add, due_ms),
        "_dest": F.when(add, schedule.topic),
        "_key": F.when(add, schedule.key),
        "_value": F.when(add, schedule.value),
        "_headers": F.when(add, schedule.headers).otherwise(no_headers()),
        "_completes": F.when(complete, completes),
        "_wb_headers": F.when(add, F.array(header(EXPIRED, F.lit("true")), source_offset_header())),
    }
