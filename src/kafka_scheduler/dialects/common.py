"""What every dialect decodes into: one normalized request row per Kafka record, in Spark SQL.

A dialect is a module with ``request_columns(settings) -> dict[str, Column]``: the ``_*`` columns that
``normalize`` reads, as expressions over the Kafka source columns (key, value, headers, topic,
partition, offset, timestamp); and optionally ``parsed_columns(settings)``: costly parses (Avro, JSON)
computed once per record in a step before, named ``_<dialect>_*``, which ``request_columns`` may read.
``decode`` (dialects/__init__.py) picks each record's dialect by its topic. Valid requests have
``kind = 'request'``; invalid ones
have ``kind = 'reject'`` and already carry the finished rejection record (original
key, value and headers plus the reason and source headers), addressed to the
rejections topic. Everything here is JVM-side Spark SQL: no Python UDF touches a row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..delivery_ids import delivery_id_column
from ..engine.contract import KIND_REJECT, KIND_REQUEST
from ..engine.rules.fields import HEADERS_DDL, OPTIONAL, REQUEST_COLUMNS, fields_in
from ..engine.rules.rejections import reason_header_column, source_header_columns
from ..protocol import (
    CLIENT_SID_PREFIX,
    ENTRY_OVERHEAD_BYTES,
    INTERNAL_SID_PREFIX,
    REJECTIONS_SID,
    SOURCE_OFFSET,
)

HEADER_TYPE = HEADERS_DDL


# The columns of a normalized request row, in order: engine/rules/fields.py describes each.
NORMALIZED_COLUMNS = REQUEST_COLUMNS

# Actions of normalized requests; COMPLETE is a write-back read back ("that version was delivered").
ACTION_COMPLETE = "COMPLETE"

# Kafka topic names: 1-249 of these characters, and not '.' or '..'.
TOPIC_NAME_REGEX = r"^[A-Za-z0-9._-]{1,249}$"


@dataclass(frozen=True)
class DecodeSettings:
    """The guard rails, as the decoders need them."""

    rejections_topic: str
    own_topics: tuple[str, ...]
    allowed_destinations: str | None  # a regex that must match the whole name; None = built-in rule
    max_value_bytes: int
    max_ahead_ms: int

    @classmethod
    def from_config(cls, config) -> DecodeSettings:
        return cls(
            rejections_topic=config.rejections_topic,
            own_topics=config.own_topics,
            allowed_destinations=config.allowed_destinations,
            max_value_bytes=config.max_value_bytes,
            max_ahead_ms=config.max_ahead_days * 86_400_000,
        )


# The request columns a dialect may leave out, with their types (normalize fills them with null).
OPTIONAL_COLUMNS = {f"_{field.name}": field.ddl for field in fields_in(OPTIONAL)}


def headers_or_empty() -> Column:
    return F.coalesce(F.col("headers"), F.array().cast(HEADER_TYPE))


def headers_named(name: str) -> Column:
    """The request headers whose key equals ``name`` (case-insensitively)."""
    return F.filter(headers_or_empty(), lambda h: F.lower(h["key"]) == name)


def binary(data: bytes) -> Column:
    return F.unhex(F.lit(data.hex()))


def first_header_bytes(name: str) -> Column:
    return F.try_element_at(headers_named(name), F.lit(1))["value"]


def first_header_text(name: str) -> Column:
    """The header's value as text. Invalid UTF-8 becomes U+FFFD: such a value fails every check
    on text (names, instants, actions) and is rejected, and the reason stays readable."""
    return F.make_valid_utf8(first_header_bytes(name).cast("string"))


def client_sid(request_id: Column, prefix: bytes = CLIENT_SID_PREFIX) -> Column:
    """A client id (bytes, any bytes) scoped to the record's topic (crons: ``prefix`` CRON_SID_PREFIX)."""
    return F.concat(binary(prefix), F.encode(F.concat(F.col("topic"), F.lit("/")), "UTF-8"), request_id)


def internal_sid() -> Column:
    return F.concat(
        binary(INTERNAL_SID_PREFIX),
        F.encode(
            F.concat_ws("/", F.col("topic"), F.col("partition").cast("string"), F.col("offset").cast("string")), "UTF-8"
        ),
    )


def entry_bytes(key: Column, value: Column, headers: Column) -> Column:
    """Same estimate as ``entries.entry_bytes`` (engine/rules/)."""
    header_bytes = F.aggregate(
        headers,
        F.lit(0).cast("long"),
        lambda total, h: total + F.octet_length(h["key"]) + F.coalesce(F.length(h["value"]), F.lit(0)),
    )
    return (
        F.lit(ENTRY_OVERHEAD_BYTES).cast("long")
        + F.coalesce(F.length(key), F.lit(0))
        + F.coalesce(F.length(value), F.lit(0))
        + header_bytes
    )


def header(key: str, value: Column) -> Column:
    return F.struct(F.lit(key).alias("key"), value.cast("binary").alias("value"))


Check = tuple[Column, Column] | Column  # (condition, reason text), or a reason text that is null when fine


def reasons(*checks: Check) -> Column:
    """An array of the reason texts whose condition holds (empty when the request is valid)."""
    return F.array_compact(F.array(*(check if isinstance(check, Column) else F.when(*check) for check in checks)))


def reasons_if(condition: Column, *checks: Check) -> Column:
    """``reasons(*checks)`` when ``condition`` holds, else none: a guard shared by many checks is written
    (and compiled) once, which keeps the generated code of a dialect with many checks small."""
    return F.when(condition, reasons(*checks)).otherwise(F.array().cast("array<string>"))


def first_reason(*checks: tuple[Column, Column]) -> Column:
    """The text of the first check whose condition holds, else null: one reason per field, and each
    condition compiled once (the later ones may assume the earlier ones did not hold)."""
    return reduce(lambda chain, check: chain.when(*check), checks[1:], F.when(*checks[0]))


def destination_rules(topic: Column, settings: DecodeSettings) -> tuple[Column, Column, Column, Column]:
    """Whether the topic is a valid name and allowed, and the two reason texts."""
    shown = F.concat(F.lit("'"), topic, F.lit("'"))
    # The app's own topics and its inputs are never destinations: a delivery there would loop.
    if settings.allowed_destinations is not None:
        allowed = topic.rlike(f"^(?:{settings.allowed_destinations})$") & ~topic.isin(*settings.own_topics)
    else:
        allowed = ~topic.startswith("__") & ~topic.isin(*settings.own_topics)
    valid_name = topic.rlike(TOPIC_NAME_REGEX) & ~topic.isin(".", "..")
    return (
        valid_name,
        allowed,
        F.concat(F.lit("invalid destination topic name "), shown),
        F.concat(F.lit("destination topic "), shown, F.lit(" is not allowed")),
    )


def destination_checks(topic: Column, settings: DecodeSettings) -> list[tuple[Column, Column]]:
    """Guard rails on a destination topic that is present."""
    valid_name, allowed, invalid_text, not_allowed_text = destination_rules(topic, settings)
    return [(~valid_name, invalid_text), (valid_name & ~allowed, not_allowed_text)]


def due_checks(due_ms: Column, settings: DecodeSettings) -> list[tuple[Column, Column]]:
    limit_days = settings.max_ahead_ms // 86_400_000
    # Measured from the record's timestamp, not current_timestamp(): Spark folds the latter into a literal that
    # changes every batch, so every micro-batch would compile the whole decode again.
    sent_ms = F.unix_millis(F.col("timestamp"))
    return [(due_ms > sent_ms + F.lit(settings.max_ahead_ms), F.lit(f"due time is more than {limit_days} days ahead"))]


def value_size_checks(settings: DecodeSettings, value: Column | None = None) -> list[tuple[Column, Column]]:
    """The size limit on the value to deliver: the record's value unless the dialect wraps it (Sky)."""
    size = F.coalesce(F.length(F.col("value") if value is None else value), F.lit(0))
    return [
        (
            size > settings.max_value_bytes,
            F.concat(
                F.lit("value too large: "),
                size.cast("string"),
                F.lit(f" bytes, the limit is {settings.max_value_bytes}"),
            ),
        )
    ]


def delivery_id() -> Column:
    """This record's delivery id (delivery_ids.py)."""
    return delivery_id_at(F.col("offset"))


def delivery_id_at(offset: Column) -> Column:
    """The delivery id of the request at ``offset`` in this record's topic and partition."""
    return delivery_id_column(F.col("topic"), F.col("partition"), offset)


def source_offset_header() -> Column:
    """``x-scheduler-source-offset`` naming this record's offset: every write-back carries it."""
    return header(SOURCE_OFFSET, F.col("offset").cast("string"))


def record_key_sid() -> Column:
    """Dialects whose record key is the schedule id: the id scoped to the record's topic."""
    return client_sid(F.col("key"))


def missing_key_checks() -> list[tuple[Column, Column]]:
    return [(F.col("key").isNull() | (F.length("key") == 0), F.lit("missing schedule id (the record key is empty)"))]


def normalize(decoded: DataFrame, settings: DecodeSettings) -> DataFrame:
    """Turn a dialect's decoded frame into NORMALIZED_COLUMNS.

    ``decoded`` has the Kafka source columns plus: ``_reasons`` (array<string>),
    ``_sid`` (binary), ``_action``, ``_due_ms``, ``_dest``, ``_key``, ``_value``, ``_headers``
    (the record to deliver, for valid requests); and where the dialect has them, ``_completes``
    (string), ``_partition`` (int), ``_partition_key`` (binary), ``_wb_headers`` (the write-back's
    headers; null: none) and ``_history`` (boolean).
    """

    def optional(name: str) -> Column:
        return F.col(name) if name in decoded.columns else F.lit(None).cast(OPTIONAL_COLUMNS[name])

    rejected = F.size("_reasons") > 0
    # The record's headers, then rejections.rejection_headers: each reason, the record's source.
    rejection_headers = F.concat(
        headers_or_empty(),
        F.transform("_reasons", lambda r: header(*reason_header_column(r))),
        F.array(*[header(*h) for h in source_header_columns(F.col("topic"), F.col("partition"), F.col("offset"))]),
    )

    def pick(if_rejected: Column, if_valid: Column) -> Column:
        return F.when(rejected, if_rejected).otherwise(if_valid)

    return decoded.select(
        pick(binary(REJECTIONS_SID), F.col("_sid")).alias("sid"),
        pick(F.lit(KIND_REJECT), F.lit(KIND_REQUEST)).alias("kind"),
        pick(F.lit(None).cast("string"), F.col("_action")).alias("action"),
        pick(F.lit(None).cast("long"), F.col("_due_ms")).alias("due_ms"),
        pick(F.lit(settings.rejections_topic), F.col("_dest")).alias("topic"),
        pick(F.col("key"), F.col("_key")).alias("key"),
        pick(F.col("value"), F.col("_value")).alias("value"),
        pick(rejection_headers, F.col("_headers")).alias("headers"),
        delivery_id().alias("delivery_id"),
        F.col("topic").alias("src_topic"),
        F.col("partition").alias("src_partition"),
        F.col("offset").alias("src_offset"),
        F.unix_millis(F.col("timestamp")).alias("src_ts_ms"),
        pick(
            F.lit(None).cast("long"),
            entry_bytes(F.col("_key"), F.col("_value"), F.col("_headers"))
            + F.when(
                optional("_wb_headers").isNotNull(),
                entry_bytes(F.col("key"), F.lit(None).cast("binary"), optional("_wb_headers"))
                - F.lit(ENTRY_OVERHEAD_BYTES),
            ).otherwise(F.lit(0))
            + F.coalesce(F.octet_length(optional("_cron_expr")), F.lit(0))
            + F.coalesce(F.octet_length(optional("_cron_tz")), F.lit(0)),
        ).alias("entry_bytes"),
        pick(F.lit(None).cast("string"), optional("_completes")).alias("completes"),
        pick(F.lit(None).cast("int"), optional("_partition")).alias("partition"),
        pick(F.lit(None).cast("binary"), optional("_partition_key")).alias("partition_key"),
        *[
            pick(F.lit(None).cast(type_name), F.when(optional("_wb_headers").isNotNull(), column)).alias(name)
            for name, column, type_name in (
                ("wb_topic", F.col("topic"), "string"),
                ("wb_partition", F.col("partition"), "int"),
                ("wb_key", F.col("key"), "binary"),
                ("wb_headers", optional("_wb_headers"), HEADER_TYPE),
            )
        ],
        pick(F.lit(False), F.coalesce(optional("_history"), F.lit(False))).alias("history"),
        *[
            pick(F.lit(None).cast(OPTIONAL_COLUMNS[f"_{name}"]), optional(f"_{name}")).alias(name)
            for name in (
                "max_lateness_ms",
                "cron_expr",
                "cron_tz",
                "cron_policy",
                "cron_start_ms",
                "cron_end_ms",
                "raw_headers",
            )
        ],
    )


# ---------------------------------------------------------------- shared by the key-addressed dialects
# (Karafka, ETF1, Sky: the record key is the schedule id, and the scheduler writes back after delivery)

LONG_MAX = 2**63 - 1
BASE64_REGEX = r"^[A-Za-z0-9+/]*={0,2}$"
OFFSET_REGEX = r"^\d{1,19}$"


def quoted(text: Column) -> Column:
    return F.concat(F.lit("'"), text, F.lit("'"))


def header_fields(texts: dict[str, str], duplicates: Sequence[str] = (), raw: dict[str, str] | None = None) -> Column:
    """For ``parsed_columns``: a struct of the first value of each header in ``texts`` (field -> header
    name) as text (as ``first_header_text``), of each in ``raw`` as bytes, and ``duplicates``: those of
    ``duplicates`` that more than one header has. Names compare case-insensitively; each header name is
    lower-cased once per record, and the checks that read the fields stay small."""
    headers = headers_or_empty()

    def fields(names: Column) -> Column:
        def first(name: str) -> Column:
            position = F.array_position(names, F.lit(name)).cast("int")  # 1-based; 0: absent (get: null)
            return F.get(headers, position - 1)["value"]

        repeated = F.filter(
            F.array(*[F.lit(n) for n in duplicates]).cast("array<string>"),
            lambda n: F.size(F.filter(names, lambda k: k == n)) > 1,
        )
        return F.struct(
            *[F.make_valid_utf8(first(name).cast("string")).alias(field) for field, name in texts.items()],
            *[first(name).alias(field) for field, name in (raw or {}).items()],
            repeated.alias("duplicates"),
        )

    return bound(F.transform(headers, lambda h: F.lower(h["key"])), fields)


def bound(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body(value)`` with ``value`` computed once however often ``body`` reads it (a lambda binds it).
    For ``parsed_columns`` that use one costly result several times."""
    return F.get(F.transform(F.array(value), body), 0)


def duplicate_reasons(names: Column) -> Column:
    """One reason per duplicated header name (``header_fields(...)["duplicates"]``, maybe filtered)."""
    return F.transform(names, lambda n: F.concat(F.lit("duplicate header "), n))


def seconds_to_due_ms(text: Column) -> Column:
    """Epoch milliseconds of Unix seconds written ``DIGITS[.DIGITS]``, rounded up (ceil(seconds*1000)):
    never early. Too large for a long: ``LONG_MAX``, which the due-time guard rail then rejects."""
    whole = F.regexp_extract(text, r"^(\d+)", 1).try_cast("bigint")
    fraction = F.regexp_extract(text, r"\.(\d+)$", 1)
    below_ms = F.substr(fraction, F.lit(4)).rlike("[1-9]")  # all of it: a 1 after a million zeros is still late
    millis = F.substring(F.concat(fraction, F.lit("000")), 1, 3).cast("int") + F.when(below_ms, 1).otherwise(0)
    return F.coalesce(F.try_add(F.try_multiply(whole, F.lit(1000)), millis), F.lit(LONG_MAX))


def base64_bytes(text: Column) -> Column:
    """Standard base64 (padding optional, no whitespace) decoded; null when ``text`` is null or not base64."""
    return F.when(text.rlike(BASE64_REGEX), F.try_to_binary(text, F.lit("base64")))


def offset_completes(text: Column, name: str) -> tuple[Column, Column]:
    """A write-back's offset header ``text`` (null: absent): the delivery id it completes (null: the
    pending version), and the reason when it is not an offset (else null)."""
    offset = F.when(text.rlike(OFFSET_REGEX), text.try_cast("bigint"))
    return (
        F.when(offset.isNotNull(), delivery_id_at(offset)),
        F.when(
            text.isNotNull() & offset.isNull(),
            F.concat(F.lit(f"invalid {name} "), quoted(text), F.lit(" (expected an offset, like 42)")),
        ),
    )


def target_reason(topic: Column, name: str, settings: DecodeSettings) -> Column:
    """A required destination topic (null or empty: missing) and the guard rails on it: the reason, or null."""
    valid_name, allowed, invalid_text, not_allowed_text = destination_rules(topic, settings)
    return first_reason(
        (topic.isNull() | (topic == ""), F.lit(f"missing {name}")),
        (~valid_name, invalid_text),
        (~allowed, not_allowed_text),
    )


def no_headers() -> Column:
    return F.array().cast(HEADER_TYPE)
