"""The commands that send requests to the scheduler: schedule, replace, cancel, pause and resume (the client install's
commands: nothing here needs Spark)."""

from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

from ..config import OPTION_NAMES, add_arguments, check_kafka_settings, env_name, kafka_settings, resolve, shown_default
from .command_line import CommandError


def add_parsers(commands) -> None:
    """The request commands, on the top parser's subcommands."""
    schedule = commands.add_parser(
        "schedule",
        help="schedule a message",
        description=textwrap.fill(
            "Send a request to deliver a message to --to at --at (a native ADD, or a schedule in another --dialect)."
        ),
        epilog=DIALECT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _sender_arguments(schedule)
    _message_arguments(schedule, id_required=False, cron=True)
    _dialect_arguments(schedule, message=True)
    schedule.set_defaults(handler=cmd_schedule)

    replace = commands.add_parser(
        "replace",
        help="replace a pending schedule",
        description=textwrap.fill(
            "Send a REPLACE request: the schedule with --id now "
            "delivers this message at --at (an unknown id acts as "
            "a new schedule)."
        ),
        epilog=DIALECT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _sender_arguments(replace)
    _message_arguments(replace, id_required=True)
    _dialect_arguments(replace, message=True)
    replace.set_defaults(handler=cmd_schedule)

    cancel = commands.add_parser(
        "cancel",
        help="cancel a pending schedule",
        description=textwrap.fill("Send a CANCEL request for --id (an unknown id is a no-op)."),
        epilog=DIALECT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _sender_arguments(cancel)
    cancel.add_argument("--id", required=True, metavar="ID", help="request id of the schedule")
    cancel.add_argument(
        "--cron",
        action="store_true",
        help="cancel the recurring schedule (cron) with this id: crons and one-shots have ids of "
        "their own (native only)",
    )
    _dialect_arguments(cancel, message=False)
    cancel.set_defaults(handler=cmd_cancel)

    for name, what in (
        (
            "pause",
            "Send a CRON_PAUSE: no firings of the cron --id until it is resumed (those "
            "already prepared are withdrawn). An unknown or paused id is a no-op.",
        ),
        (
            "resume",
            "Send a CRON_RESUME: the cron --id fires again; with the replay policy the "
            "firings missed while paused are delivered at once, with skip they are not. An "
            "unknown or running id is a no-op.",
        ),
    ):
        command = commands.add_parser(
            name, help=f"{name} a recurring schedule (cron)", description=textwrap.fill(what + " Native only.")
        )
        _sender_arguments(command)
        command.add_argument("--id", required=True, metavar="ID", help="the cron's id")
        _dialect_arguments(command, message=False, native_only=True)
        command.set_defaults(handler=cmd_cron_action)


# ---------------------------------------------------------------- handlers


def _client(args: argparse.Namespace, config=None, cron_min_interval: int | None = None):
    from ..client.scheduler_client import SchedulerClient

    config = config or resolve(args)
    check_kafka_settings(config)
    # librdkafka's own connection chatter would break the one-line error rule; failures still surface.
    return SchedulerClient(
        config.bootstrap_servers,
        app_id=config.app_id,
        producer_config={**kafka_settings(config), "log_level": 0},
        dialect=args.dialect,
        requests_topic=args.requests_topic,
        cron_min_interval=cron_min_interval,
    )


def _check_dialect(args: argparse.Namespace) -> None:
    """Dialect options that do not fit together: one line, before any connection."""
    from ..client.encoders import DIALECTS

    if args.dialect not in DIALECTS:  # only reachable through the environment variable
        raise CommandError(f"KAFKA_SCHEDULER_DIALECT={args.dialect!r}: use one of {', '.join(DIALECTS)}")
    if args.dialect != "karafka":
        for flag, value in (
            ("--partition", getattr(args, "partition", None)),
            ("--partition-key", getattr(args, "partition_key", None)),
        ):
            if value is not None:
                raise CommandError(f"{flag} is only supported with --dialect karafka (not {args.dialect})")
    if args.dialect != "native":
        if args.requests_topic is None:
            raise CommandError(
                f"--requests-topic is required with --dialect {args.dialect}: the topic the "
                f"scheduler reads as a {args.dialect} input (e.g. schedules)"
            )
        if args.id is None:
            raise CommandError(f"--id is required with --dialect {args.dialect}: the request id is the record key")
    if getattr(args, "partition", None) is not None and args.partition < 0:
        raise CommandError(f"--partition {args.partition}: must be 0 or more")


def _headers(pairs: Sequence[str]) -> list[tuple[str, str]]:
    headers = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CommandError(f"--header {pair!r}: expected NAME=VALUE")
        headers.append((name, value))
    return headers


def _value(args: argparse.Namespace) -> bytes | None:
    if args.value_file is not None:
        try:
            return Path(args.value_file).read_bytes()
        except OSError as exc:
            raise CommandError(f"--value-file: {exc.strerror}: {args.value_file}") from None
    return None if args.value is None else args.value.encode()


def _via(args: argparse.Namespace) -> str:
    return "" if args.dialect == "native" else f" ({args.dialect} on {args.requests_topic})"


def cmd_schedule(args: argparse.Namespace) -> int:
    from ..client.scheduler_client import encode, format_instant, parse_due

    if getattr(args, "cron", None) is not None:
        return _schedule_cron(args)
    for flag, value in (
        ("--timezone", getattr(args, "timezone", None)),
        ("--missed", getattr(args, "missed", None)),
        ("--start-at", getattr(args, "start_at", None)),
        ("--end-at", getattr(args, "end_at", None)),
    ):
        if value is not None:
            raise CommandError(f"{flag} is for a recurring schedule: give --cron EXPR")
    if args.at is None:
        raise CommandError("give --at WHEN (or --cron EXPR for a recurring schedule)")
    action = "REPLACE" if args.command == "replace" else "ADD"
    _check_dialect(args)
    # Everything is checked before a connection is opened, so bad input costs one line and no network.
    due, headers, value = parse_due(args.at), _headers(args.header), _value(args)
    encode(
        args.dialect,
        action,
        request_id=args.id,
        topic=args.to,
        due=due,
        key=args.key,
        value=value,
        headers=headers,
        target_partition=args.partition,
        partition_key=args.partition_key,
        max_lateness=args.max_lateness,
    )
    with _client(args) as client:
        due = client.schedule(
            args.to,
            due,
            value=value,
            key=args.key,
            headers=headers,
            request_id=args.id,
            action=action,
            target_partition=args.partition,
            partition_key=args.partition_key,
            max_lateness=args.max_lateness,
        )
    ident = f" id={args.id}" if args.id else ""
    print(
        f"sent {action.lower() if action == 'REPLACE' else 'schedule'}{ident}{_via(args)}: deliver to {args.to} "
        f"at {format_instant(due)}"
    )
    return 0


def _schedule_cron(args: argparse.Namespace) -> int:
    from ..client.scheduler_client import encode_cron, parse_due

    if args.at is not None:
        raise CommandError("--at and --cron do not go together: a recurring schedule fires at its expression's times")
    if args.dialect != "native":
        raise CommandError(f"--cron: the {args.dialect} dialect has no recurring schedules (native only)")
    if args.id is None:
        raise CommandError("--cron needs --id: the cron's id, to pause, resume, replace or cancel it")
    if args.partition is not None or args.partition_key is not None:
        raise CommandError("--partition and --partition-key are karafka only")
    headers, value = _headers(args.header), _value(args)
    start = None if args.start_at is None else parse_due(args.start_at)
    end = None if args.end_at is None else parse_due(args.end_at)
    config = resolve(args)
    # The job's minimum when given (flag, variable, --config file); otherwise the job's default, which a refusal names.
    min_interval = config.cron_min_interval if config.given_by("cron_min_interval") else None
    encode_cron(
        "native",
        "add",
        request_id=args.id,
        topic=args.to,
        expr=args.cron,
        key=args.key,
        value=value,
        headers=headers,
        timezone=args.timezone,
        missed=args.missed,
        start_at=start,
        end_at=end,
        max_lateness=args.max_lateness,
        min_interval=min_interval,
    )
    with _client(args, config, min_interval) as client:
        client.cron(
            args.to,
            args.cron,
            value=value,
            key=args.key,
            headers=headers,
            request_id=args.id,
            timezone=args.timezone,
            missed=args.missed,
            start_at=start,
            end_at=end,
            max_lateness=args.max_lateness,
        )
    extra = "".join(
        f", {name} {value}"
        for name, value in (
            ("in", args.timezone),
            ("missed", args.missed),
            ("from", args.start_at),
            ("until", args.end_at),
            ("max lateness", args.max_lateness),
        )
        if value
    )
    print(f"sent cron id={args.id}: deliver to {args.to} at every '{args.cron}'{extra}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from ..client.scheduler_client import encode, encode_cron

    _check_dialect(args)
    if getattr(args, "cron", False):
        encode_cron(args.dialect, "cancel", request_id=args.id)
        with _client(args) as client:
            client.cancel(args.id, cron=True)
        print(f"sent cron cancel id={args.id}")
        return 0
    encode(args.dialect, "CANCEL", request_id=args.id)
    with _client(args) as client:
        client.cancel(args.id)
    print(f"sent cancel id={args.id}{_via(args)}")
    return 0


def cmd_cron_action(args: argparse.Namespace) -> int:
    """pause, resume."""
    from ..client.scheduler_client import encode_cron

    _check_dialect(args)
    encode_cron(args.dialect, args.command, request_id=args.id)
    with _client(args) as client:
        getattr(client, args.command)(args.id)
    print(f"sent cron {args.command} id={args.id}")
    return 0


# ---------------------------------------------------------------- arguments


def _sender_arguments(parser: argparse.ArgumentParser) -> None:
    """Where requests go: the servers, the app and the Kafka options, as for `run` (flags, variables, --config)."""
    add_arguments(parser, names={"config", "bootstrap_servers", "app_id", "kafka_options"})


DIALECT_HELP = """\
dialects (--dialect):
  native    x-scheduler-* headers on <app-id>-schedule-requests (the default)
  karafka   Karafka envelope: key = id, schedule_* headers; due time in whole seconds
  etf1      ETF1 schedule: key = id, scheduler-* headers; due time in whole seconds;
            a null value cancels, so --value or --value-file is needed
  sky-avro  Sky schedule: key = id, value = Avro binary (no magic byte)
  sky-json  Sky schedule: key = id, value = JSON with base64 key, value and headers
Every dialect but native needs --id (the record key) and --requests-topic (the topic
the scheduler reads with that dialect: `run --input TOPIC:DIALECT`; it must exist).
Karafka and ETF1 carry Unix seconds: the due time is rounded up to the next second,
so it is never early. A replace in those dialects is the same record as a schedule
(the latest record for an id wins); a cancel is the id with a null value.
"""


def _dialect_arguments(parser: argparse.ArgumentParser, message: bool, native_only: bool = False) -> None:
    """--dialect and --requests-topic; a ``native_only`` command (the cron actions) has no --dialect: its requests
    are native whatever KAFKA_SCHEDULER_DIALECT says, on a native input topic."""
    from ..client.encoders import DIALECTS

    if native_only:
        parser.set_defaults(dialect="native")
        parser.add_argument(
            "--requests-topic",
            metavar="TOPIC",
            help="topic to write the request to: a native input of the job [default <app-id>-schedule-requests]",
        )
        return
    parser.add_argument(
        "--dialect",
        default=os.environ.get("KAFKA_SCHEDULER_DIALECT", "native"),
        choices=DIALECTS,
        metavar="{" + ",".join(DIALECTS) + "}",
        help="wire format of the request (see below) [env KAFKA_SCHEDULER_DIALECT; default native]",
    )
    parser.add_argument(
        "--requests-topic",
        metavar="TOPIC",
        help="topic to write the request to [default <app-id>-schedule-requests for native; "
        "required for the other dialects]",
    )
    if message:
        parser.add_argument("--partition", type=int, metavar="N", help="karafka only: deliver to partition N of --to")
        parser.add_argument(
            "--partition-key",
            metavar="TEXT",
            help="karafka only: pick the delivery partition by hashing TEXT (Kafka's murmur2 "
            "partitioner), without making it the key",
        )


def _message_arguments(parser: argparse.ArgumentParser, id_required: bool, cron: bool = False) -> None:
    parser.add_argument("--to", required=True, metavar="TOPIC", help="destination topic")
    parser.add_argument(
        "--at",
        required=not cron,
        metavar="WHEN",
        help="due time: ISO-8601 with a zone (2026-05-24T12:30:00Z, ...+02:00) or relative "
        "(+30s, +5m, +2h, +1d)" + (" (or --cron for a recurring schedule)" if cron else ""),
    )
    if cron:
        recurring = parser.add_argument_group("recurring schedules (native only; Kaspr's CRON_ADD)")
        recurring.add_argument(
            "--cron",
            metavar="EXPR",
            help="deliver at every firing of this cron expression instead of --at: five fields, "
            "or six with the seconds last ('* * * * * */5': every 5 s), or an alias "
            "(@hourly); --id names the cron",
        )
        recurring.add_argument(
            "--timezone", metavar="ZONE", help="IANA time zone of the expression (Europe/Paris; default UTC)"
        )
        recurring.add_argument(
            "--missed",
            choices=("replay", "skip"),
            help="firings missed while the job was down or the cron paused: replay (the default: "
            "delivered at once, in order) or skip",
        )
        recurring.add_argument("--start-at", metavar="WHEN", help="no firing before this instant")
        recurring.add_argument("--end-at", metavar="WHEN", help="no firing after this instant")
        setting = OPTION_NAMES["cron_min_interval"]
        recurring.add_argument(
            setting.flag,
            dest=setting.name,
            metavar=setting.metavar,
            help="the job's own --cron-min-interval: the cron is checked against it before it is sent, as the job "
            "will check it (an expression the job would reject fails here with the job's reason) "
            f"[env {env_name(setting)}; default {shown_default(setting)}, the job's default]",
        )
    parser.add_argument(
        "--max-lateness",
        metavar="DURATION",
        help="native only: not delivered (rejected as expired) if it would go out later than this "
        "after its due time (each firing's, for a cron): 10m, 1h30m, PT10M or milliseconds",
    )
    parser.add_argument("--key", help="key of the delivered record (default: none)")
    value = parser.add_mutually_exclusive_group()
    value.add_argument("--value", help="value of the delivered record (default: null, a tombstone)")
    value.add_argument("--value-file", metavar="FILE", help="read the value's bytes from FILE")
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a header of the delivered record; repeat for more",
    )
    parser.add_argument(
        "--id",
        required=id_required,
        metavar="ID",
        help="request id, to replace or cancel the schedule later"
        + ("" if id_required else " (optional for native; the other dialects need it)"),
    )
