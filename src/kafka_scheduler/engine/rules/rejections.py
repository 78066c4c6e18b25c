"""What a rejection record carries beyond the request's (or the delivery's) own key, value and headers: the reason
texts the scheduler writes after decoding (a destination's refusal, an expiry) and the headers that name the reason,
the due time and the request's source. Each text and header set is written once here, in Python (the timed writer,
the herd tasks, the processor) with its Spark SQL twin beside it (``*_column``: the sink and the decoders); the twins
import pyspark when called, so the rules stay free of Spark. tests/unit/test_rejections.py checks that the two give
the same bytes.

A text is a template: its Python form fills the slots with ``str.format``, its Spark form concatenates the literal
parts with the slots' columns cast to text. The classes these texts fall in are rejection_classes.py's.
"""

from __future__ import annotations

import string
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from ...delivery_ids import source_columns, source_of
from ...protocol import DUE_MS, REJECTION_REASON, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC

if TYPE_CHECKING:
    from pyspark.sql import Column

Header = tuple[str, bytes]
HeaderColumn = tuple[str, "Column"]

EXPIRED = "expired: due {due}, not delivered within its max lateness of {max_lateness_ms} ms"
# What a destination refused at delivery: the sink tells from the broker's metadata before writing, the timed writer
# and the herd tasks from a record's delivery report.
TOPIC_MISSING = "destination topic '{topic}' does not exist"
NOT_AUTHORIZED = "not authorized to write to destination topic '{topic}'"
PARTITION_MISSING = (
    "destination partition {partition} of topic '{topic}' does not exist (it has {partitions} partitions)"
)
TOO_LARGE = "record of {size} bytes (key, value and headers) is too large for destination topic '{topic}' ({limit})"
REFUSED = "destination topic '{topic}' refused the record ({error})"
# Said of a rejection the rejections topic would refuse whole: it goes without the value.
VALUE_LEFT_OUT = "its value is left out: the rejections topic takes no record that large"

ISO_INSTANT_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"  # Spark's pattern of iso_instant's text
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def text(template: str, **slots) -> str:
    return template.format(**slots)


def text_column(template: str, **slots: Column) -> Column:
    """``text`` in Spark SQL: the template's literal parts and its slots' columns, cast to text."""
    from pyspark.sql import functions as F

    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        if literal:
            parts.append(F.lit(literal))
        if name is not None:
            parts.append(slots[name].cast("string"))
    return F.concat(*parts)


def iso_instant(ms: int) -> str:
    """An instant in epoch milliseconds as ISO-8601 UTC text with milliseconds (whole milliseconds: no float)."""
    return (_EPOCH + timedelta(milliseconds=int(ms))).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_instant_column(ms: Column) -> Column:
    """``iso_instant`` in Spark SQL (the session's time zone is UTC: session.py)."""
    from pyspark.sql import functions as F

    return F.date_format(F.timestamp_millis(ms), ISO_INSTANT_FORMAT)


def expired_reason(due_ms: int, max_lateness_ms: int) -> str:
    """The reason of a delivery rejected as expired."""
    return text(EXPIRED, due=iso_instant(due_ms), max_lateness_ms=max_lateness_ms)


def expired_reason_column(due_ms: Column, max_lateness_ms: Column) -> Column:
    return text_column(EXPIRED, due=iso_instant_column(due_ms), max_lateness_ms=max_lateness_ms)


def reason_header(reason: str) -> Header:
    return REJECTION_REASON, reason.encode()


def reason_header_column(reason: Column) -> HeaderColumn:
    from pyspark.sql import functions as F

    return REJECTION_REASON, F.encode(reason, "UTF-8")


def source_headers(topic: str, partition, offset) -> list[Header]:
    """The request a rejection comes from: its topic, partition and offset, as text."""
    return [
        (SOURCE_TOPIC, topic.encode()),
        (SOURCE_PARTITION, str(partition).encode()),
        (SOURCE_OFFSET, str(offset).encode()),
    ]


def source_header_columns(topic: Column, partition: Column, offset: Column) -> list[HeaderColumn]:
    return [(SOURCE_TOPIC, topic), (SOURCE_PARTITION, partition.cast("string")), (SOURCE_OFFSET, offset.cast("string"))]


def rejection_headers(reasons: list[str], topic: str, partition, offset) -> list[Header]:
    """A rejected request's: each reason, then its source (the decoders' twin: dialects/common.normalize)."""
    return [reason_header(reason) for reason in reasons] + source_headers(topic, partition, offset)


def refusal_headers(reason: str, delivery_id: str) -> list[Header]:
    """A delivery its destination refused: the reason and the source its delivery id names."""
    return [reason_header(reason), *source_headers(*source_of(delivery_id))]


def refusal_header_columns(reason: Column, delivery_id: Column) -> list[HeaderColumn]:
    return [reason_header_column(reason), *source_header_columns(*source_columns(delivery_id))]


def expiry_headers(due_ms: int, max_lateness_ms: int, delivery_id: str) -> list[Header]:
    """A delivery later than its max lateness: the reason, its due time and the source its delivery id names."""
    return [
        reason_header(expired_reason(due_ms, max_lateness_ms)),
        (DUE_MS, str(due_ms).encode()),
        *source_headers(*source_of(delivery_id)),
    ]


def expiry_header_columns(due_ms: Column, max_lateness_ms: Column, delivery_id: Column) -> list[HeaderColumn]:
    return [
        reason_header_column(expired_reason_column(due_ms, max_lateness_ms)),
        (DUE_MS, due_ms.cast("string")),
        *source_header_columns(*source_columns(delivery_id)),
    ]
