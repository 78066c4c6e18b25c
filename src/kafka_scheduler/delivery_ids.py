"""Delivery ids, written once: their grammar, in Python and in Spark SQL side by side.

A version's delivery id names the request that made it, its source: ``<topic>-<partition>-<offset>``. A cron's
firing is ``<activation>@<instant>``: the delivery id of the request that activated the cron (CRON_ADD or
CRON_RESUME), "@", and the firing instant in epoch milliseconds, e.g. "requests-0-42@1767225600000". Topic names may
hold "-" but never "@"; partitions and offsets are digits. A firing's source is its activating request: every reader
of an id takes it so (the rejection headers, CANCELs read early, inspect and list).

The Spark SQL twins (``*_column``) build and read the same ids in the JVM, for the decoders and the sink; they import
pyspark when called, so this module stays importable without it (protocol.py, which the client imports, reads
``request_of`` from here).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

SEPARATOR = "-"
FIRING_SEPARATOR = "@"
REJECTION_PREFIX = "reject:"

# The source (topic, partition, offset) of any delivery id, a firing's instant left aside. [0-9], not \d: Python's \d
# matches the digits of every script, Java's (Spark's regexp_extract) only ASCII ones.
SOURCE_PATTERN = r"^(.*)-([0-9]+)-([0-9]+)(?:@-?[0-9]+)?$"
_SOURCE = re.compile(SOURCE_PATTERN)


def delivery_id(topic: str, partition: int, offset: int) -> str:
    """The delivery id of the request at ``offset`` of ``topic``'s ``partition`` (``delivery_id_column``)."""
    return f"{topic}{SEPARATOR}{partition}{SEPARATOR}{offset}"


def firing_id(activation: str, due_ms: int) -> str:
    """The delivery id of a cron's firing: the activating request's delivery id and the firing instant. The same
    firing of the same activation always gets the same id (a crash re-emits it with it); a resume is a new
    activation, so a firing withdrawn by a pause and replayed after the resume never shares an id with its
    struck-out row."""
    return f"{activation}{FIRING_SEPARATOR}{int(due_ms)}"


def activation_of(delivery_id: str) -> str:
    """A firing's activation (the delivery id of the request that activated its cron); any other id as it is."""
    return delivery_id.split(FIRING_SEPARATOR, 1)[0]


def is_firing(delivery_id: str) -> bool:
    return FIRING_SEPARATOR in delivery_id


def request_of(delivery_id: str) -> tuple[str, str, str]:
    """The input topic, partition and offset (as text) of the request a delivery id names (a firing's: its activating
    request's). ValueError for an id of another form."""
    match = _SOURCE.match(delivery_id)
    if match is None:
        raise ValueError(f"not a delivery id: {delivery_id!r}")
    return match.group(1, 2, 3)


def source_of(delivery_id: str) -> tuple[str, str, str]:
    """``request_of``, or three empty texts for an id of another form, as its Spark twin (``source_columns``) reads
    one: what a rejection names as its source."""
    match = _SOURCE.match(delivery_id)
    return ("", "", "") if match is None else match.group(1, 2, 3)


def rejection_id(topic: str, partition: int, offset: int) -> str:
    """With exactly-once, a rejection's id (its ledger key's): named after the rejected request, apart from the
    delivery ids (``rejection_id_column``)."""
    return SEPARATOR.join((REJECTION_PREFIX, delivery_id(topic, partition, offset)))


def delivery_id_column(topic: Column, partition: Column, offset: Column) -> Column:
    """``delivery_id`` in Spark SQL."""
    from pyspark.sql import functions as F

    return F.concat_ws(SEPARATOR, topic, partition.cast("string"), offset.cast("string"))


def source_columns(delivery_id: Column) -> tuple[Column, Column, Column]:
    """``source_of`` in Spark SQL: topic, partition and offset, as text."""
    from pyspark.sql import functions as F

    return tuple(F.regexp_extract(delivery_id, SOURCE_PATTERN, group) for group in (1, 2, 3))


def rejection_id_column(topic: Column, partition: Column, offset: Column) -> Column:
    """``rejection_id`` in Spark SQL (of the source headers' values: a part missing is left out)."""
    from pyspark.sql import functions as F

    return F.concat_ws(SEPARATOR, F.lit(REJECTION_PREFIX), topic, partition.cast("string"), offset.cast("string"))
