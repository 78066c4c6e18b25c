"""Request encoders: the key, value and headers of a schedule, replace or cancel request in each dialect.

Pure functions, no Kafka I/O; ``SchedulerClient`` and the ``schedule``/``replace``/``cancel`` commands
produce what they return. The wire formats are those of the contract (``protocols.md``):

- ``native``: the user's key, value and headers plus ``x-scheduler-*`` headers; the due time is sent to
  the millisecond.
- ``karafka``: key = request id, value = payload, ``schedule_*`` headers.
- ``etf1``: key = request id, value = payload, ``scheduler-*`` headers; a null value cancels.
- ``sky-avro`` / ``sky-json``: key = request id, value = the schedule (Avro binary without a magic byte, or
  UTF-8 JSON with base64 fields); a null value cancels.

Recurring schedules (Kaspr's CRON_ADD, CRON_PAUSE, CRON_RESUME, CRON_CANCEL: ``encode_cron``) and expiry
(``x-scheduler-max-lateness``) exist in the native dialect only; the others have neither.

Karafka and ETF1 carry the due time in whole Unix seconds: it is rounded *up* to the next second, so a
schedule is never delivered early (up to a second late instead). Sky carries milliseconds (rounded up).
In the non-native dialects the request id is required (it is the record key) and a REPLACE is the same
record as a schedule: the latest record for an id wins.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from ..protocol import (
    ACTION,
    CRON_END_AT,
    CRON_EXPR,
    CRON_MISSED_FIRE_POLICY,
    CRON_POLICIES,
    CRON_START_AT,
    CRON_TIMEZONE,
    DELIVER_AT,
    DELIVER_TO,
    DIALECT_NAMES,
    MAX_LATENESS,
    PREFIX,
    REQUEST_ID,
    SKY_AVRO_SCHEMA,
)

DIALECTS = DIALECT_NAMES

Bytes = str | bytes | None
HeaderList = Iterable[tuple[str, Bytes]]
Headers = list[tuple[str, bytes | None]]

# Header name prefixes a dialect reads itself; user headers may not start with them (compared ignoring case).
RESERVED_PREFIXES = {
    "native": (PREFIX,),
    "karafka": ("schedule_", PREFIX),
    "etf1": ("scheduler-", PREFIX),
    "sky-avro": (PREFIX,),
    "sky-json": (PREFIX,),
}

KARAFKA_SCHEMA_VERSION = "1.0.0"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ACTIONS = {"add": "ADD", "schedule": "ADD", "replace": "REPLACE", "cancel": "CANCEL"}


class RequestError(ValueError):
    """A request the scheduler would reject, caught before it is sent (or one this install cannot encode)."""


# fastavro is an extra: a client-only install sends the other dialects without it.
AVRO_MISSING = 'the sky-avro dialect needs fastavro, which is not installed: pip install "kafka-scheduler[avro]"'


class EncodedRequest(NamedTuple):
    key: bytes | None
    value: bytes | None
    headers: Headers


# ---------------------------------------------------------------- shared helpers


def _as_bytes(value: Bytes) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def format_instant(instant: datetime) -> str:
    """UTC, millisecond precision, trailing Z: the form the scheduler parses."""
    utc = instant.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _epoch_micros(due: datetime) -> int:
    if not isinstance(due, datetime) or due.tzinfo is None:
        raise RequestError("the due time must be an aware datetime")
    return (due - _EPOCH) // timedelta(microseconds=1)


def epoch_seconds_up(due: datetime) -> int:
    """Unix seconds of ``due``, rounded up to a whole second (never early)."""
    return -(-_epoch_micros(due) // 1_000_000)


def epoch_millis_up(due: datetime) -> int:
    """Unix milliseconds of ``due``, rounded up to a whole millisecond (never early)."""
    return -(-_epoch_micros(due) // 1_000)


def effective_due(dialect: str, due: datetime) -> datetime:
    """The due instant the scheduler will read back from a request of ``dialect`` for ``due``."""
    _check_dialect(dialect)
    if dialect in ("karafka", "etf1"):
        return datetime.fromtimestamp(epoch_seconds_up(due), UTC)
    if dialect in ("sky-avro", "sky-json"):
        return _EPOCH + timedelta(milliseconds=epoch_millis_up(due))
    utc = due.astimezone(UTC)
    return utc.replace(microsecond=utc.microsecond // 1000 * 1000)


def _check_dialect(dialect: str) -> None:
    if dialect not in DIALECTS:
        raise RequestError(f"unknown dialect {dialect!r}: use one of {', '.join(DIALECTS)}")


def _action(action: str) -> str:
    normalized = _ACTIONS.get(str(action).strip().lower())
    if normalized is None:
        raise RequestError(f"unknown action {action!r}: use schedule, replace or cancel")
    return normalized


def user_headers(dialect: str, headers: HeaderList) -> Headers:
    """``headers`` as (name, bytes) pairs; names reserved by ``dialect`` raise RequestError."""
    prefixes = RESERVED_PREFIXES[dialect]
    result: Headers = []
    for name, value in headers:
        lowered = name.lower()
        for prefix in prefixes:
            if lowered.startswith(prefix):
                owner = "the scheduler" if prefix == PREFIX else f"the {dialect} dialect"
                raise RequestError(f"header {name!r}: names starting with {prefix} are reserved for {owner}")
        result.append((name, _as_bytes(value)))
    return result


def _request_id(dialect: str, request_id: str | None) -> bytes:
    if request_id is None:
        raise RequestError(f"a request id is required for the {dialect} dialect: it is the record key")
    if request_id == "":
        raise RequestError("the request id must not be empty")
    return request_id.encode() if isinstance(request_id, str) else bytes(request_id)


def _target(dialect: str, topic: str | None, due: datetime | None) -> None:
    if not topic:
        raise RequestError(f"a {dialect} schedule needs a destination topic")
    if due is None:
        raise RequestError(f"a {dialect} schedule needs a due time")
    if _epoch_micros(due) < 0 and dialect != "native":
        raise RequestError(f"due time {due.isoformat()} is before 1970: the {dialect} dialect cannot carry it")


def _karafka_only(dialect: str, target_partition, partition_key) -> None:
    if target_partition is not None or partition_key is not None:
        raise RequestError(
            f"a target partition or partition key is only supported by the karafka dialect, not {dialect}"
        )


# ---------------------------------------------------------------- native


def request_headers(
    action: str,
    deliver_to: str | None = None,
    deliver_at: datetime | None = None,
    request_id: str | None = None,
    headers: HeaderList = (),
) -> Headers:
    """The record headers of a native request: the user's headers plus the ``x-scheduler-*`` ones."""
    result = user_headers("native", headers)
    result.append((ACTION, action.encode()))
    if deliver_to is not None:
        result.append((DELIVER_TO, deliver_to.encode()))
    if deliver_at is not None:
        result.append((DELIVER_AT, format_instant(deliver_at).encode()))
    if request_id is not None:
        if request_id == "":
            raise RequestError("the request id must not be empty")
        result.append((REQUEST_ID, request_id.encode()))
    return result


def encode_native(
    action: str,
    *,
    request_id: str | None = None,
    topic: str | None = None,
    due: datetime | None = None,
    key: Bytes = None,
    value: Bytes = None,
    headers: HeaderList = (),
    target_partition: int | None = None,
    partition_key: Bytes = None,
    max_lateness: Lateness = None,
) -> EncodedRequest:
    _karafka_only("native", target_partition, partition_key)
    action = _action(action)
    if action == "CANCEL":
        if request_id is None:
            raise RequestError("a cancel needs the request id")
        return EncodedRequest(None, None, request_headers("CANCEL", request_id=request_id))
    if action == "REPLACE" and request_id is None:
        raise RequestError("a replace needs the request id")
    _target("native", topic, due)
    result = request_headers(action, topic, due, request_id, headers)
    if max_lateness is not None:
        result.append((MAX_LATENESS, str(lateness_ms(max_lateness)).encode()))
    return EncodedRequest(_as_bytes(key), _as_bytes(value), result)


# ---------------------------------------------------------------- native: recurring schedules and expiry

Lateness = str | int | timedelta | None
Interval = str | int | timedelta | None  # the job's --cron-min-interval: "5s" (as the job reads it), ms, a timedelta
# As the scheduler reads x-scheduler-max-lateness: milliseconds, units (10m, 1h30m, 250ms, 2d) or ISO-8601 (PT10M).
_UNITS = re.compile(r"^(?:(\d{1,9})d)?(?:(\d{1,9})h)?(?:(\d{1,9})m(?!s))?(?:(\d{1,9})s)?(?:(\d{1,9})ms)?$")
_ISO_DURATION = re.compile(r"^p(?:(\d{1,9})d)?(?:t(?:(\d{1,9})h)?(?:(\d{1,9})m)?(?:(\d{1,9})(?:\.(\d{1,3}))?s)?)?$")
_CRON_ACTIONS = {"pause": "CRON_PAUSE", "resume": "CRON_RESUME", "cancel": "CRON_CANCEL"}


def lateness_ms(value: Lateness) -> int:
    """Milliseconds of a max lateness: a timedelta, an int (ms), or text as the scheduler reads it ("10m", "1h30m",
    "PT10M", "600000"). Raises RequestError unless it is a positive duration."""
    if isinstance(value, timedelta):
        ms = value // timedelta(milliseconds=1)
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        text = str(value).strip().lower()
        if re.fullmatch(r"\d{1,12}", text):
            ms = int(text)
        elif text and (units := _UNITS.match(text)):
            d, h, m, s, milli = (int(g or 0) for g in units.groups())
            ms = (((d * 24 + h) * 60 + m) * 60 + s) * 1000 + milli
        elif text not in ("p", "pt") and not text.endswith("t") and (iso := _ISO_DURATION.match(text)):
            d, h, m, s = (int(g or 0) for g in iso.groups()[:4])
            ms = (((d * 24 + h) * 60 + m) * 60 + s) * 1000 + int((iso.group(5) or "0").ljust(3, "0"))
        else:
            raise RequestError(f"max lateness {value!r}: expected a duration like 10m, 1h30m, PT10M, or milliseconds")
    if ms <= 0:
        raise RequestError(f"max lateness {value!r}: must be more than 0")
    return ms


def check_cron(expr: str | None, timezone: str | None = None, min_interval: Interval = None) -> None:
    """Refuse a cron the job would reject, with the job's own reason (engine/rules/cron.py ``problem``): an invalid
    expression, one that never fires, an unknown time zone, or firings closer together than the job's
    ``--cron-min-interval``. ``min_interval``: that setting (a duration as the job reads it, "5s", milliseconds or a
    timedelta); None takes the job's default, and a refusal on it says so."""
    from ..config import OPTION_NAMES
    from ..config_values import format_duration_ms
    from ..engine.rules.cron import problem

    if not expr or not expr.strip():
        raise RequestError("a cron needs an expression, e.g. '*/5 * * * *' or, with seconds last, '* * * * * */5'")
    expr, zone = expr.strip(), None if timezone is None else timezone.strip()
    reason = problem(expr, zone, 0)  # the expression and the zone, as the job reads them (trimmed)
    if reason is not None:
        raise RequestError(reason)
    setting = OPTION_NAMES["cron_min_interval"]
    try:
        if isinstance(min_interval, timedelta):
            min_interval_ms = setting.parse(f"{min_interval // timedelta(milliseconds=1)}ms")
        elif isinstance(min_interval, int) and not isinstance(min_interval, bool):
            min_interval_ms = setting.parse(f"{min_interval}ms")
        else:
            min_interval_ms = setting.default if min_interval is None else setting.parse(str(min_interval))
    except ValueError as exc:
        raise RequestError(f"the cron minimum interval {min_interval!r}: {exc}") from None
    reason = problem(expr, zone, min_interval_ms)
    if reason is not None:
        if min_interval is None:
            reason += (
                f"; {format_duration_ms(min_interval_ms)} is the job's default: if the job runs with another "
                f"--cron-min-interval, give it here too"
            )
        raise RequestError(reason)


def encode_cron(
    dialect: str,
    action: str,
    *,
    request_id: str,
    topic: str | None = None,
    expr: str | None = None,
    key: Bytes = None,
    value: Bytes = None,
    headers: HeaderList = (),
    timezone: str | None = None,
    missed: str | None = None,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    max_lateness: Lateness = None,
    min_interval: Interval = None,
) -> EncodedRequest:
    """A recurring schedule's request, as Kaspr's producers write it: ``add`` (CRON_ADD: deliver ``key``, ``value``
    and ``headers`` to ``topic`` at every firing of ``expr``; in ``timezone``, UTC by default; ``missed``: replay or
    skip; bounds ``start_at``/``end_at``; ``max_lateness`` for every firing), ``pause``, ``resume`` or ``cancel``.
    Native only: the other dialects have no crons. An ``add`` the job would reject is refused (``check_cron``; its
    ``min_interval``: the job's ``--cron-min-interval``, by default the job's default)."""
    _check_dialect(dialect)
    if dialect != "native":
        raise RequestError(
            f"the {dialect} dialect has no recurring schedules: send crons as native requests (the "
            f"scheduler reads them on <app-id>-schedule-requests)"
        )
    if not request_id:
        raise RequestError("a cron needs its request id (its cron id)")
    name = str(action).strip().lower()
    if name in ("add", "cron_add", "schedule"):
        if not topic:
            raise RequestError("a cron needs a destination topic")
        check_cron(expr, timezone, min_interval)
        if missed is not None and missed not in CRON_POLICIES:
            raise RequestError(f"missed-fire policy {missed!r}: use replay or skip")
        if start_at is not None and end_at is not None and end_at < start_at:
            raise RequestError("the cron's end is before its start")
        result = user_headers("native", headers)
        result += [
            (ACTION, b"CRON_ADD"),
            (DELIVER_TO, topic.encode()),
            (REQUEST_ID, request_id.encode()),
            (CRON_EXPR, expr.strip().encode()),
        ]
        if missed is not None:
            result.append((CRON_MISSED_FIRE_POLICY, missed.encode()))
        if timezone is not None:
            result.append((CRON_TIMEZONE, timezone.encode()))
        for header, instant in ((CRON_START_AT, start_at), (CRON_END_AT, end_at)):
            if instant is not None:
                if instant.tzinfo is None:
                    raise RequestError(f"{header}: give an aware datetime")
                result.append((header, format_instant(instant).encode()))
        if max_lateness is not None:
            result.append((MAX_LATENESS, str(lateness_ms(max_lateness)).encode()))
        return EncodedRequest(_as_bytes(key), _as_bytes(value), result)
    bare = name[5:] if name.startswith("cron_") else name
    if bare not in _CRON_ACTIONS:
        raise RequestError(f"unknown cron action {action!r}: use add, pause, resume or cancel")
    return EncodedRequest(None, None, [(ACTION, _CRON_ACTIONS[bare].encode()), (REQUEST_ID, request_id.encode())])


# ---------------------------------------------------------------- karafka


def encode_karafka(
    action: str,
    *,
    request_id: str | None = None,
    topic: str | None = None,
    due: datetime | None = None,
    key: Bytes = None,
    value: Bytes = None,
    headers: HeaderList = (),
    target_partition: int | None = None,
    partition_key: Bytes = None,
) -> EncodedRequest:
    """Karafka envelope: key = request id, value = payload, ``schedule_*`` headers, then the user's."""
    action = _action(action)
    record_key = _request_id("karafka", request_id)
    version = ("schedule_schema_version", KARAFKA_SCHEMA_VERSION.encode())
    if action == "CANCEL":
        return EncodedRequest(record_key, None, [version, ("schedule_source_type", b"cancel")])
    _target("karafka", topic, due)
    extra = user_headers("karafka", headers)
    result: Headers = [
        version,
        ("schedule_source_type", b"schedule"),
        ("schedule_target_epoch", str(epoch_seconds_up(due)).encode()),
        ("schedule_target_topic", topic.encode()),
    ]
    if key is not None:
        result.append(("schedule_target_key", _as_bytes(key)))
    if target_partition is not None:
        if isinstance(target_partition, bool) or not isinstance(target_partition, int) or target_partition < 0:
            raise RequestError(f"target partition {target_partition!r}: must be a non-negative integer")
        result.append(("schedule_target_partition", str(target_partition).encode()))
    if partition_key is not None:
        result.append(("schedule_target_partition_key", _as_bytes(partition_key)))
    return EncodedRequest(record_key, _as_bytes(value), result + extra)


# ---------------------------------------------------------------- etf1


def encode_etf1(
    action: str,
    *,
    request_id: str | None = None,
    topic: str | None = None,
    due: datetime | None = None,
    key: Bytes = None,
    value: Bytes = None,
    headers: HeaderList = (),
    target_partition: int | None = None,
    partition_key: Bytes = None,
) -> EncodedRequest:
    """ETF1 schedule: key = request id, value = payload, ``scheduler-*`` headers, then the user's."""
    _karafka_only("etf1", target_partition, partition_key)
    action = _action(action)
    record_key = _request_id("etf1", request_id)
    if action == "CANCEL":
        return EncodedRequest(record_key, None, [])
    _target("etf1", topic, due)
    if value is None:
        raise RequestError("the etf1 dialect cannot schedule a null value: a null value cancels the schedule")
    extra = user_headers("etf1", headers)
    result: Headers = [
        ("scheduler-epoch", str(epoch_seconds_up(due)).encode()),
        ("scheduler-target-topic", topic.encode()),
    ]
    if key is not None:
        result.append(("scheduler-target-key", _as_bytes(key)))
    return EncodedRequest(record_key, _as_bytes(value), result + extra)


# ---------------------------------------------------------------- sky


def _sky_schedule(dialect: str, topic, due, key, value, headers) -> dict:
    _target(dialect, topic, due)
    mapped: dict[str, bytes] = {}
    for name, header_value in user_headers(dialect, headers):
        if header_value is None:
            raise RequestError(f"header {name!r}: the {dialect} dialect cannot carry a null header value")
        if name in mapped:
            raise RequestError(f"header {name!r} given twice: the {dialect} dialect keeps headers in a map")
        mapped[name] = header_value
    # The schema's key is not nullable: without a key the delivered record has an empty key.
    return {
        "time": epoch_millis_up(due),
        "topic": topic,
        "key": _as_bytes(key) or b"",
        "value": _as_bytes(value),
        "headers": mapped,
    }


def encode_sky_avro(
    action: str,
    *,
    request_id: str | None = None,
    topic: str | None = None,
    due: datetime | None = None,
    key: Bytes = None,
    value: Bytes = None,
    headers: HeaderList = (),
    target_partition: int | None = None,
    partition_key: Bytes = None,
) -> EncodedRequest:
    """Sky schedule in Avro binary (schema ``SKY_AVRO_SCHEMA``, no magic byte); a cancel is a null value."""
    _karafka_only("sky-avro", target_partition, partition_key)
    action = _action(action)
    record_key = _request_id("sky-avro", request_id)
    if action == "CANCEL":
        return EncodedRequest(record_key, None, [])
    record = _sky_schedule("sky-avro", topic, due, key, value, headers)
    try:
        from fastavro import parse_schema, schemaless_writer
    except ModuleNotFoundError as exc:
        if exc.name != "fastavro":
            raise
        raise RequestError(AVRO_MISSING) from None

    out = io.BytesIO()
    schemaless_writer(out, parse_schema(SKY_AVRO_SCHEMA), record)
    return EncodedRequest(record_key, out.getvalue(), [])


def encode_sky_json(
    action: str,
    *,
    request_id: str | None = None,
    topic: str | None = None,
    due: datetime | None = None,
    key: Bytes = None,
    value: Bytes = None,
    headers: HeaderList = (),
    target_partition: int | None = None,
    partition_key: Bytes = None,
) -> EncodedRequest:
    """Sky schedule as UTF-8 JSON with base64 key, value and header values; a cancel is a null value."""
    _karafka_only("sky-json", target_partition, partition_key)
    action = _action(action)
    record_key = _request_id("sky-json", request_id)
    if action == "CANCEL":
        return EncodedRequest(record_key, None, [])
    record = _sky_schedule("sky-json", topic, due, key, value, headers)

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    document = {
        "time": record["time"],
        "topic": record["topic"],
        "key": b64(record["key"]),
        "value": None if record["value"] is None else b64(record["value"]),
        "headers": {name: b64(data) for name, data in record["headers"].items()},
    }
    return EncodedRequest(record_key, json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode(), [])


# ---------------------------------------------------------------- dispatch


ENCODERS = {
    "native": encode_native,
    "karafka": encode_karafka,
    "etf1": encode_etf1,
    "sky-avro": encode_sky_avro,
    "sky-json": encode_sky_json,
}


def encode(
    dialect: str,
    action: str,
    *,
    request_id: str | None = None,
    topic: str | None = None,
    due: datetime | None = None,
    key: Bytes = None,
    value: Bytes = None,
    headers: HeaderList = (),
    target_partition: int | None = None,
    partition_key: Bytes = None,
    max_lateness: Lateness = None,
) -> EncodedRequest:
    """The record of a ``schedule``/``replace``/``cancel`` request (also ``ADD``/``REPLACE``/``CANCEL``) in
    ``dialect``. ``topic``, ``due``, ``key``, ``value`` and ``headers`` describe the message to deliver;
    ``target_partition`` and ``partition_key`` pick its partition (karafka only); ``max_lateness`` (native only):
    not delivered, but rejected as expired, if it would go out later than due + this. Raises RequestError for a
    request the scheduler would reject. Crons: ``encode_cron``."""
    _check_dialect(dialect)
    if max_lateness is not None:
        if dialect != "native":
            raise RequestError(
                f"the {dialect} dialect has no max lateness (x-scheduler-max-lateness): it is a native request header"
            )
        return encode_native(
            action,
            request_id=request_id,
            topic=topic,
            due=due,
            key=key,
            value=value,
            headers=headers,
            target_partition=target_partition,
            partition_key=partition_key,
            max_lateness=max_lateness,
        )
    return ENCODERS[dialect](
        action,
        request_id=request_id,
        topic=topic,
        due=due,
        key=key,
        value=value,
        headers=headers,
        target_partition=target_partition,
        partition_key=partition_key,
    )
