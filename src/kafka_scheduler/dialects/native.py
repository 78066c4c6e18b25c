"""The native (Kaspr-style) dialect: ``x-scheduler-*`` headers on the record to deliver."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from ..protocol import ACTION, ACTIONS, DELIVER_AT, DELIVER_TO, PREFIX, REQUEST_HEADERS, REQUEST_ID
from .common import DecodeSettings, client_sid, destination_rules, due_checks, duplicate_reasons, first_reason, \
    header_fields, headers_or_empty, internal_sid, reasons, reasons_if, value_size_checks


# ISO-8601 instant with an explicit zone: Z or a numeric offset. Fractions up to nanoseconds.
INSTANT_REGEX = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}(:?\d{2})?)$"
ZONELESS_REGEX = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?$"


def _due_ms(text):
    """Epoch milliseconds of an ISO instant, rounded up so a sub-millisecond due time is never early."""
    parsed = F.try_to_timestamp(F.when(text.rlike(INSTANT_REGEX), text))
    fraction = F.rpad(F.regexp_extract(text, r"\.(\d+)", 1), 9, "0")
    below_ms = F.substring(fraction, 4, 6) != F.lit("000000")
    return F.unix_millis(parsed) + F.when(below_ms, 1).otherwise(0)


def parsed_columns(settings: DecodeSettings) -> dict[str, Column]:
    """The request headers, each looked up once per record (the checks read them many times)."""
    return {"_native": header_fields({"action": ACTION, "to": DELIVER_TO, "at": DELIVER_AT},
                                     duplicates=REQUEST_HEADERS, raw={"request_id": REQUEST_ID})}


def request_columns(settings: DecodeSettings) -> dict[str, Column]:
    parsed = F.col("_native")
    action_text, to, at = parsed["action"], parsed["to"], parsed["at"]
    request_id = parsed["request_id"]  # any bytes: ids are compared as bytes
    id_bytes = F.coalesce(F.length(request_id), F.lit(0))

    action = F.coalesce(F.upper(F.trim(action_text)), F.lit("ADD"))
    targeted = action.isin("ADD", "REPLACE")
    needs_id = action.isin("REPLACE", "CANCEL")
    due_ms = _due_ms(at)

    quoted_at = F.concat(F.lit("'"), at, F.lit("'"))
    valid_name, allowed, invalid_name_text, not_allowed_text = destination_rules(to, settings)
    all_reasons = F.concat(
        duplicate_reasons(parsed["duplicates"]),
        reasons(
            (~action.isin(*ACTIONS),
             F.concat(F.lit(f"unknown {ACTION} '"), action_text, F.lit("' (expected ADD, REPLACE or CANCEL)"))),
            (needs_id & (id_bytes == 0), F.lit(f"missing {REQUEST_ID}")),
            (~needs_id & (F.length(request_id) == 0), F.lit(f"empty {REQUEST_ID}")),
        ),
        reasons_if(
            targeted,
            first_reason((to.isNull() | (F.trim(to) == ""), F.lit(f"missing {DELIVER_TO}")),
                         (~valid_name, invalid_name_text), (~allowed, not_allowed_text)),
            first_reason(
                (at.isNull(), F.lit(f"missing {DELIVER_AT}")),
                (at.rlike(ZONELESS_REGEX), F.concat(F.lit(f"{DELIVER_AT} "), quoted_at,
                                                    F.lit(" has no time zone (add Z or an offset like +02:00)"))),
                (due_ms.isNull(), F.concat(F.lit(f"unparseable {DELIVER_AT} "), quoted_at,
                                           F.lit(" (expected ISO-8601 like 2026-05-24T12:30:00Z)"))),
                *due_checks(due_ms, settings)),
            *value_size_checks(settings),
        ),
    )

    sid = F.when(id_bytes > 0, client_sid(request_id)).otherwise(internal_sid())
    stripped_headers = F.filter(headers_or_empty(), lambda h: ~F.lower(h["key"]).startswith(PREFIX))

    return {
        "_reasons": all_reasons,
        "_sid": sid,
        "_action": action,
        "_due_ms": F.when(targeted, due_ms),
        "_dest": F.when(targeted, to),
        "_key": F.col("key"),
        "_value": F.col("value"),
        "_headers": stripped_headers,
    }
