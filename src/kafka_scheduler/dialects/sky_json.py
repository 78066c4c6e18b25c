"""The Sky dialect with JSON values:
``{"time": ms, "topic": "...", "key": "<base64>", "value": "<base64>"|null, "headers": {"name": "<base64>"}}``
(``headers`` absent or null: none; ``value`` absent: null).

The value is parsed once, as the only element of a JSON array (``[`` value ``]``): that makes the
parser read to the end, so text after the object (a second object, garbage) is malformed rather than
ignored. Every field is read as text (a number's digits, an object's JSON), so a field of the wrong
type gets a precise reason instead of silently reading as absent; ``headers`` is then parsed as an
object of strings, and everything base64 is decoded, once per record in the same step.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from . import sky
from .common import LONG_MAX, DecodeSettings, base64_bytes, bound, first_reason, no_headers, quoted

_ENVELOPE = "array<struct<time:string,topic:string,key:string,value:string,headers:string>>"
_HEADERS = "map<string,string>"
TIME_REGEX = r"^-?\d+$"


def _headers(entries: Column) -> Column:
    """The headers object's entries (null: not an object of strings), decoded."""

    def checked(decoded: Column) -> Column:
        return F.struct(
            entries.isNotNull().alias("ok"),
            F.transform(decoded, lambda h: F.struct(h["key"].alias("key"), h["value"].alias("value"))).alias("headers"),
            # the names of the headers whose value is not base64 ('': none)
            F.array_join(
                F.transform(
                    F.filter(decoded, lambda h: h["text"].isNotNull() & h["value"].isNull()), lambda h: quoted(h["key"])
                ),
                ", ",
            ).alias("bad"),
        )

    return bound(
        F.transform(
            entries,
            lambda h: F.struct(
                h["key"].alias("key"), h["value"].alias("text"), base64_bytes(h["value"]).alias("value")
            ),
        ),
        checked,
    )


def _fields(s: Column) -> Column:
    """The schedule's fields as written and decoded."""
    time = s["time"]
    return F.struct(
        time.alias("time_text"),
        # too many digits for a long: far beyond any guard rail (or negative)
        F.when(
            time.rlike(TIME_REGEX),
            F.coalesce(time.try_cast("bigint"), F.when(time.startswith("-"), -LONG_MAX).otherwise(LONG_MAX)),
        ).alias("time"),
        s["topic"].alias("topic"),
        s["key"].alias("key_text"),
        base64_bytes(s["key"]).alias("key"),
        s["value"].alias("value_text"),
        base64_bytes(s["value"]).alias("value"),
        s["headers"].alias("headers_text"),
        bound(F.map_entries(F.from_json(s["headers"], _HEADERS)), _headers).alias("headers"),
    )


def parsed_columns(settings: DecodeSettings) -> dict[str, Column]:
    text = F.col("value").cast("string")
    envelope = F.from_json(F.concat(F.lit("["), text, F.lit("]")), _ENVELOPE, {"mode": "PERMISSIVE"})
    return {
        "_sky_json_headers": sky.header_texts(),
        "_sky_json": F.struct(
            F.size(envelope).alias("count"),
            F.get(F.transform(envelope, _fields), 0).alias("schedule"),
            text.rlike(r"\}\s*$").alias("ends_with_brace"),
        ),
    }


def request_columns(settings: DecodeSettings) -> dict[str, Column]:
    parsed = F.col("_sky_json")
    schedule = parsed["schedule"]  # null unless the value is one JSON object
    one_object = F.coalesce((parsed["count"] == 1) & schedule.isNotNull() & parsed["ends_with_brace"], F.lit(False))

    def base64_reason(name: str) -> Column:
        return F.when(
            schedule[f"{name}_text"].isNotNull() & schedule[name].isNull(), F.lit(f"invalid base64 in {name}")
        )

    time_text, headers = schedule["time_text"], schedule["headers"]
    return sky.request_columns(
        sky.Schedule(
            malformed=F.when(~one_object, F.lit("malformed JSON schedule (expected one JSON object)")),
            time_ms=schedule["time"],
            time_reason=first_reason(
                (time_text.isNull(), F.lit("missing time")),
                (
                    schedule["time"].isNull(),
                    F.concat(F.lit("invalid time "), quoted(time_text), F.lit(" (expected epoch milliseconds)")),
                ),
            ),
            topic=schedule["topic"],
            key=schedule["key"],
            value=schedule["value"],
            headers=F.coalesce(headers["headers"], no_headers()),
            checks=(
                F.when(schedule["key_text"].isNull(), F.lit("missing key")).otherwise(base64_reason("key")),
                base64_reason("value"),
                first_reason(
                    (
                        schedule["headers_text"].isNotNull() & ~headers["ok"],
                        F.lit("invalid headers (expected an object of base64 strings)"),
                    ),
                    (headers["bad"] != "", F.concat(F.lit("invalid base64 in headers "), headers["bad"])),
                ),
            ),
        ),
        F.col("_sky_json_headers"),
        settings,
    )
