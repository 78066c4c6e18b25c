"""The native (Kaspr-style) dialect: ``x-scheduler-*`` headers on the record to deliver.

Besides ADD, REPLACE and CANCEL, Kaspr's recurring schedules: CRON_ADD (a cron expression instead of a due time),
CRON_PAUSE, CRON_RESUME and CRON_CANCEL, in an id space of their own. What Spark SQL cannot check without a
Python call per record (the expression itself, the time zone, the minimum interval) the state processor checks:
it rejects such a CRON_ADD with the request's headers as read (``raw_headers``), as the decoder would.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from ..protocol import (
    ACTION,
    ACTIONS,
    CRON_ACTIONS,
    CRON_END_AT,
    CRON_EXPR,
    CRON_MISSED_FIRE_POLICY,
    CRON_POLICIES,
    CRON_SID_PREFIX,
    CRON_START_AT,
    CRON_TIMEZONE,
    DELIVER_AT,
    DELIVER_TO,
    MAX_LATENESS,
    NATIVE_SINGLE_HEADERS,
    PREFIX,
    REQUEST_ID,
)
from .common import (
    DecodeSettings,
    bound,
    client_sid,
    destination_rules,
    due_checks,
    duplicate_reasons,
    first_reason,
    header_fields,
    headers_or_empty,
    internal_sid,
    reasons,
    reasons_if,
    value_size_checks,
)

# ISO-8601 instant with an explicit zone: Z or a numeric offset. Fractions up to nanoseconds.
INSTANT_REGEX = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}(:?\d{2})?)$"
ZONELESS_REGEX = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?$"
# Durations of x-scheduler-max-lateness, lower-cased: milliseconds, units (1h30m, 10m, 250ms, 2d), or ISO-8601
# (PT10M, P1DT2H, PT0.5S). Each part at most 9 digits.
MILLIS_REGEX = r"^\d{1,12}$"
UNITS_REGEX = r"^(?:(\d{1,9})d)?(?:(\d{1,9})h)?(?:(\d{1,9})m(?!s))?(?:(\d{1,9})s)?(?:(\d{1,9})ms)?$"
ISO_DURATION_REGEX = r"^p(?:(\d{1,9})d)?(?:t(?:(\d{1,9})h)?(?:(\d{1,9})m)?(?:(\d{1,9})(?:\.(\d{1,3}))?s)?)?$"
ALL_ACTIONS = (*ACTIONS, *CRON_ACTIONS)


def _due_ms(text):
    """Epoch milliseconds of an ISO instant, rounded up so a sub-millisecond due time is never early."""
    parsed = F.try_to_timestamp(F.when(text.rlike(INSTANT_REGEX), text))
    fraction = F.rpad(F.regexp_extract(text, r"\.(\d+)", 1), 9, "0")
    below_ms = F.substring(fraction, 4, 6) != F.lit("000000")
    return F.unix_millis(parsed) + F.when(below_ms, 1).otherwise(0)


def _part(text: Column, regex: str, group: int, factor: int) -> Column:
    return F.coalesce(F.regexp_extract(text, regex, group).try_cast("long"), F.lit(0)) * F.lit(factor)


def duration_ms(raw: Column) -> Column:
    """Milliseconds of a duration (see the regexes above); null when it is none of them (or empty)."""
    text = F.lower(F.trim(raw))
    units = (
        _part(text, UNITS_REGEX, 1, 86_400_000)
        + _part(text, UNITS_REGEX, 2, 3_600_000)
        + _part(text, UNITS_REGEX, 3, 60_000)
        + _part(text, UNITS_REGEX, 4, 1000)
        + _part(text, UNITS_REGEX, 5, 1)
    )
    millis = F.rpad(F.regexp_extract(text, ISO_DURATION_REGEX, 5), 3, "0")
    iso = (
        _part(text, ISO_DURATION_REGEX, 1, 86_400_000)
        + _part(text, ISO_DURATION_REGEX, 2, 3_600_000)
        + _part(text, ISO_DURATION_REGEX, 3, 60_000)
        + _part(text, ISO_DURATION_REGEX, 4, 1000)
        + F.coalesce(millis.try_cast("long"), F.lit(0))
    )
    return (
        F.when(text.rlike(MILLIS_REGEX), text.try_cast("long"))
        .when((text != "") & text.rlike(UNITS_REGEX), units)
        .when(~text.isin("p", "pt") & ~text.endswith("t") & text.rlike(ISO_DURATION_REGEX), iso)
    )


def _instant_reasons(text: Column, ms: Column, name: str) -> Column:
    """Why an optional instant header (present; ``ms``: its ``_due_ms``) is not one: the reason, or null."""
    quoted = F.concat(F.lit("'"), text, F.lit("'"))
    return first_reason(
        (
            text.rlike(ZONELESS_REGEX),
            F.concat(F.lit(f"{name} "), quoted, F.lit(" has no time zone (add Z or an offset like +02:00)")),
        ),
        (
            ms.isNull(),
            F.concat(F.lit(f"unparseable {name} "), quoted, F.lit(" (expected ISO-8601 like 2026-05-24T12:30:00Z)")),
        ),
    )


def parsed_columns(settings: DecodeSettings) -> dict[str, Column]:
    """The request headers, each looked up once per record (the checks read them many times), and what only a
    CRON_ADD or a max lateness needs: the bounds and the lateness parsed, their reasons. Those are computed in this
    step so that the decode of all five dialects, one projection, stays one compiled method under the JVM's 64 KB
    (with every dialect, this step has more fields than Spark compiles whole: it runs interpreted)."""
    fields = header_fields(
        {
            "action": ACTION,
            "to": DELIVER_TO,
            "at": DELIVER_AT,
            "expr": CRON_EXPR,
            "policy": CRON_MISSED_FIRE_POLICY,
            "tz": CRON_TIMEZONE,
            "start": CRON_START_AT,
            "end": CRON_END_AT,
            "lateness": MAX_LATENESS,
        },
        duplicates=NATIVE_SINGLE_HEADERS,
        raw={"request_id": REQUEST_ID},
    )
    return {"_native": bound(fields, _with_cron_and_lateness)}


def _with_cron_and_lateness(parsed: Column) -> Column:
    expr, policy_text, start_text, end_text, lateness_text = (
        parsed["expr"],
        parsed["policy"],
        parsed["start"],
        parsed["end"],
        parsed["lateness"],
    )
    policy = F.lower(F.trim(policy_text))
    start_ms, end_ms, lateness_ms = _due_ms(start_text), _due_ms(end_text), duration_ms(lateness_text)
    cron_reasons = reasons(
        F.when(expr.isNull() | (F.trim(expr) == ""), F.lit(f"missing {CRON_EXPR}")),
        F.when(
            policy_text.isNotNull() & ~policy.isin(*CRON_POLICIES),
            F.concat(F.lit(f"invalid {CRON_MISSED_FIRE_POLICY} '"), policy_text, F.lit("' (expected replay or skip)")),
        ),
        F.when(start_text.isNotNull(), _instant_reasons(start_text, start_ms, CRON_START_AT)),
        F.when(end_text.isNotNull(), _instant_reasons(end_text, end_ms, CRON_END_AT)),
        F.when(end_ms < start_ms, F.lit(f"{CRON_END_AT} is before {CRON_START_AT}")),
    )
    lateness_reason = F.when(
        lateness_text.isNotNull() & (lateness_ms.isNull() | (lateness_ms <= 0)),
        F.concat(
            F.lit(f"invalid {MAX_LATENESS} '"),
            lateness_text,
            F.lit("' (expected a positive duration like 10m, 1h30m, PT10M, or milliseconds)"),
        ),
    )
    return (
        parsed.withField("policy_name", policy)
        .withField("start_ms", start_ms)
        .withField("end_ms", end_ms)
        .withField("lateness_ms", lateness_ms)
        .withField("cron_reasons", cron_reasons)
        .withField("lateness_reason", lateness_reason)
    )


def request_columns(settings: DecodeSettings) -> dict[str, Column]:
    parsed = F.col("_native")
    action_text, to, at = parsed["action"], parsed["to"], parsed["at"]
    request_id = parsed["request_id"]  # any bytes: ids are compared as bytes
    id_bytes = F.coalesce(F.length(request_id), F.lit(0))

    action = F.coalesce(F.upper(F.trim(action_text)), F.lit("ADD"))
    one_shot = action.isin("ADD", "REPLACE")
    cron_add = action == F.lit("CRON_ADD")
    is_cron = action.isin(*CRON_ACTIONS)
    needs_id = action.isin("REPLACE", "CANCEL", *CRON_ACTIONS)
    due_ms = _due_ms(at)

    expr, tz, policy = parsed["expr"], parsed["tz"], parsed["policy_name"]
    start_ms, end_ms, lateness_ms = parsed["start_ms"], parsed["end_ms"], parsed["lateness_ms"]

    quoted_at = F.concat(F.lit("'"), at, F.lit("'"))
    valid_name, allowed, invalid_name_text, not_allowed_text = destination_rules(to, settings)
    destination_reason = first_reason(
        (to.isNull() | (F.trim(to) == ""), F.lit(f"missing {DELIVER_TO}")),
        (~valid_name, invalid_name_text),
        (~allowed, not_allowed_text),
    )
    all_reasons = F.concat(
        duplicate_reasons(parsed["duplicates"]),
        reasons(
            (
                ~action.isin(*ALL_ACTIONS),
                F.concat(
                    F.lit(f"unknown {ACTION} '"),
                    action_text,
                    F.lit("' (expected ADD, REPLACE, CANCEL, CRON_ADD, CRON_PAUSE, CRON_RESUME or CRON_CANCEL)"),
                ),
            ),
            (needs_id & (id_bytes == 0), F.lit(f"missing {REQUEST_ID}")),
            (~needs_id & (F.length(request_id) == 0), F.lit(f"empty {REQUEST_ID}")),
        ),
        # What one-shots and crons share is checked (and compiled) once for both, in the order of their reasons.
        reasons_if(one_shot | cron_add, destination_reason),
        reasons_if(
            one_shot,
            first_reason(
                (at.isNull(), F.lit(f"missing {DELIVER_AT}")),
                (
                    at.rlike(ZONELESS_REGEX),
                    F.concat(
                        F.lit(f"{DELIVER_AT} "), quoted_at, F.lit(" has no time zone (add Z or an offset like +02:00)")
                    ),
                ),
                (
                    due_ms.isNull(),
                    F.concat(
                        F.lit(f"unparseable {DELIVER_AT} "),
                        quoted_at,
                        F.lit(" (expected ISO-8601 like 2026-05-24T12:30:00Z)"),
                    ),
                ),
                *due_checks(due_ms, settings),
            ),
        ),
        F.when(cron_add, parsed["cron_reasons"]).otherwise(F.array().cast("array<string>")),
        reasons_if(one_shot | cron_add, parsed["lateness_reason"], *value_size_checks(settings)),
    )

    sid = (
        F.when(is_cron, client_sid(request_id, CRON_SID_PREFIX))
        .when(id_bytes > 0, client_sid(request_id))
        .otherwise(internal_sid())
    )
    stripped_headers = F.filter(headers_or_empty(), lambda h: ~F.lower(h["key"]).startswith(PREFIX))

    return {
        "_reasons": all_reasons,
        "_sid": sid,
        "_action": action,
        "_due_ms": F.when(one_shot, due_ms),
        "_dest": F.when(one_shot | cron_add, to),
        "_key": F.col("key"),
        "_value": F.col("value"),
        "_headers": stripped_headers,
        "_max_lateness_ms": F.when(one_shot | cron_add, lateness_ms),
        "_cron_expr": F.when(cron_add, F.trim(expr)),
        "_cron_tz": F.when(cron_add, F.trim(tz)),
        "_cron_policy": F.when(cron_add, F.coalesce(policy, F.lit("replay"))),
        "_cron_start_ms": F.when(cron_add, start_ms),
        "_cron_end_ms": F.when(cron_add, end_ms),
        "_raw_headers": F.when(cron_add, headers_or_empty()),
    }
