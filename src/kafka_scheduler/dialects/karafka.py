"""The Karafka dialect: an envelope record whose key is the schedule id, value the payload, and
``schedule_*`` headers that say what to do with it.

- ``schedule_source_type``: ``schedule`` (ADD: the latest request wins), ``cancel`` (CANCEL) or
  ``tombstone`` (a write-back read back: COMPLETE of the version at ``x-scheduler-source-offset``,
  else at Karafka's own ``schedule_source_offset``, else the version pending at that point).
- ``schedule_schema_version`` ``MAJOR[.MINOR[.PATCH]]``: major 1 only (a newer one is never guessed),
  checked for every source type.
- schedule: ``schedule_target_epoch`` (Unix seconds, fraction allowed), ``schedule_target_topic``,
  optional ``schedule_target_key``, ``schedule_target_partition``, ``schedule_target_partition_key``
  (the explicit partition wins when both are given).
- Delivered with every envelope header plus ``schedule_source_topic/partition/offset/key``; the
  write-back is the envelope's headers with ``schedule_source_type=tombstone`` and the offset (both ways).
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
    target_reason,
    value_size_checks,
)

SCHEMA_VERSION = "schedule_schema_version"
SOURCE_TYPE = "schedule_source_type"
TARGET_EPOCH = "schedule_target_epoch"
TARGET_TOPIC = "schedule_target_topic"
TARGET_KEY = "schedule_target_key"
TARGET_PARTITION = "schedule_target_partition"
TARGET_PARTITION_KEY = "schedule_target_partition_key"
# Added to the delivered record (and, for the offset, to the write-back):
SOURCE_TOPIC_H = "schedule_source_topic"
SOURCE_PARTITION_H = "schedule_source_partition"
SOURCE_OFFSET_H = "schedule_source_offset"
SOURCE_KEY_H = "schedule_source_key"

ACTION_OF_TYPE = {"schedule": "ADD", "cancel": "CANCEL", "tombstone": ACTION_COMPLETE}
SUPPORTED_MAJOR = 1
VERSION_REGEX = r"^\d+(\.\d+){0,2}$"
EPOCH_REGEX = r"^\d+(\.\d+)?$"
NEGATIVE_EPOCH_REGEX = r"^-\d+(\.\d+)?$"
PARTITION_REGEX = r"^\d{1,10}$"

# Headers that must not appear twice: always, in a schedule, in a tombstone.
ALWAYS_ONCE = (SCHEMA_VERSION, SOURCE_TYPE)
SCHEDULE_ONCE = (TARGET_EPOCH, TARGET_TOPIC, TARGET_KEY, TARGET_PARTITION, TARGET_PARTITION_KEY)
TOMBSTONE_ONCE = (SOURCE_OFFSET, SOURCE_OFFSET_H)


def parsed_columns(settings: DecodeSettings) -> dict[str, Column]:
    return {
        "_karafka": header_fields(
            {
                "version": SCHEMA_VERSION,
                "type": SOURCE_TYPE,
                "epoch": TARGET_EPOCH,
                "topic": TARGET_TOPIC,
                "partition": TARGET_PARTITION,
                "ours": SOURCE_OFFSET,
                "theirs": SOURCE_OFFSET_H,
            },
            duplicates=ALWAYS_ONCE + SCHEDULE_ONCE + TOMBSTONE_ONCE,
            raw={"key": TARGET_KEY, "partition_key": TARGET_PARTITION_KEY},
        )
    }


def _version_reason(version: Column) -> Column:
    major = F.coalesce(
        F.regexp_extract(version, r"^(\d+)", 1).try_cast("bigint"),  # too long: certainly newer
        F.lit(SUPPORTED_MAJOR + 1),
    )
    well_formed = version.rlike(VERSION_REGEX)
    return first_reason(
        (version.isNull(), F.lit(f"missing {SCHEMA_VERSION}")),
        (
            well_formed & (major > SUPPORTED_MAJOR),
            F.concat(
                F.lit(f"{SCHEMA_VERSION} "),
                quoted(version),
                F.lit(f" is newer than {SUPPORTED_MAJOR}.x (not supported)"),
            ),
        ),
        (
            ~well_formed | (major < SUPPORTED_MAJOR),
            F.concat(
                F.lit(f"unsupported {SCHEMA_VERSION} "),
                quoted(version),
                F.lit(f" (expected {SUPPORTED_MAJOR}.x, like {SUPPORTED_MAJOR}.0.0)"),
            ),
        ),
    )


def _write_back_headers() -> Column:
    """The envelope headers with ``schedule_source_type`` set to ``tombstone``, any earlier source
    offsets dropped, then ``schedule_source_offset`` and ``x-scheduler-source-offset`` naming this record."""
    offset = F.col("offset").cast("string")
    kept = F.filter(headers_or_empty(), lambda h: ~F.lower(h["key"]).isin(SOURCE_OFFSET_H, SOURCE_OFFSET))
    retyped = F.transform(
        kept,
        lambda h: F.when(
            F.lower(h["key"]) == SOURCE_TYPE,
            F.struct(h["key"].alias("key"), F.lit("tombstone").cast("binary").alias("value")),
        ).otherwise(h),
    )
    return F.concat(retyped, F.array(header(SOURCE_OFFSET_H, offset), header(SOURCE_OFFSET, offset)))


def request_columns(settings: DecodeSettings) -> dict[str, Column]:
    parsed = F.col("_karafka")
    version, source_type, epoch, topic, partition_text, ours, theirs = (
        parsed[name] for name in ("version", "type", "epoch", "topic", "partition", "ours", "theirs")
    )

    action = F.coalesce(*[F.when(source_type == name, F.lit(action)) for name, action in ACTION_OF_TYPE.items()])
    add = F.coalesce(action == "ADD", F.lit(False))
    complete = F.coalesce(action == ACTION_COMPLETE, F.lit(False))

    due_ms = seconds_to_due_ms(epoch)
    partition = F.when(partition_text.rlike(PARTITION_REGEX), partition_text.try_cast("int"))
    # a tombstone: ours names the offset in x-scheduler-source-offset, Karafka's in schedule_source_offset
    completes_ours, ours_reason = offset_completes(ours, SOURCE_OFFSET)
    completes_theirs, theirs_reason = offset_completes(theirs, SOURCE_OFFSET_H)
    applicable = (
        F.when(add, F.array(*map(F.lit, ALWAYS_ONCE + SCHEDULE_ONCE)))
        .when(complete, F.array(*map(F.lit, ALWAYS_ONCE + TOMBSTONE_ONCE)))
        .otherwise(F.array(*map(F.lit, ALWAYS_ONCE)))
    )

    all_reasons = F.concat(
        duplicate_reasons(F.array_intersect(parsed["duplicates"], applicable)),
        reasons(
            *missing_key_checks(),
            _version_reason(version),
            first_reason(
                (source_type.isNull(), F.lit(f"missing {SOURCE_TYPE}")),
                (
                    action.isNull(),
                    F.concat(
                        F.lit(f"unknown {SOURCE_TYPE} "),
                        quoted(source_type),
                        F.lit(" (expected schedule, cancel or tombstone)"),
                    ),
                ),
            ),
        ),
        reasons_if(
            add,
            first_reason(
                (epoch.isNull(), F.lit(f"missing {TARGET_EPOCH}")),
                (
                    epoch.rlike(NEGATIVE_EPOCH_REGEX),
                    F.concat(F.lit(f"{TARGET_EPOCH} "), quoted(epoch), F.lit(" is negative")),
                ),
                (
                    ~epoch.rlike(EPOCH_REGEX),
                    F.concat(
                        F.lit(f"invalid {TARGET_EPOCH} "),
                        quoted(epoch),
                        F.lit(" (expected Unix seconds, like 1893456000 or 1893456000.5)"),
                    ),
                ),
                *due_checks(due_ms, settings),
            ),
            target_reason(topic, TARGET_TOPIC, settings),
            (
                partition_text.isNotNull() & partition.isNull(),
                F.concat(
                    F.lit(f"invalid {TARGET_PARTITION} "),
                    quoted(partition_text),
                    F.lit(" (expected a partition number, like 0)"),
                ),
            ),
            *value_size_checks(settings),
        ),
        reasons_if(complete, F.coalesce(ours_reason, F.when(ours.isNull(), theirs_reason))),
    )

    delivered_headers = F.concat(
        headers_or_empty(),
        F.array(
            header(SOURCE_TOPIC_H, F.col("topic")),
            header(SOURCE_PARTITION_H, F.col("partition").cast("string")),
            header(SOURCE_OFFSET_H, F.col("offset").cast("string")),
            header(SOURCE_KEY_H, F.col("key")),
        ),
    )
    return {
        "_reasons": all_reasons,
        "_sid": record_key_sid(),
        "_action": action,
        "_due_ms": F.when(add, due_ms),
        "_dest": F.when(add, topic),
        "_key": F.when(add, parsed["key"]),
        "_value": F.when(add, F.col("value")),
        "_headers": F.when(add, delivered_headers).otherwise(no_headers()),
        "_completes": F.when(complete, F.coalesce(completes_ours, F.when(ours.isNull(), completes_theirs))),
        "_partition": F.when(add, partition),
        "_partition_key": F.when(add & partition.isNull(), parsed["partition_key"]),
        "_wb_headers": F.when(add, _write_back_headers()),
    }
