"""The ``kafka-scheduler`` command."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path

from .. import __version__
from ..config import ConfigError, add_arguments, check_kafka_settings, kafka_settings, resolve

DESCRIPTION = """\
Delayed delivery for Apache Kafka: send a request now, and the scheduler delivers
its message to a target topic at the requested time. Requests with the same id
replace or cancel each other until then. Runs on Spark Structured Streaming.

commands:
  run       run the scheduler job (until Ctrl-C / SIGTERM)
  submit    run the job on a Spark cluster: spark-submit with the connector jars and the package
  config    config show: print the effective settings of `run` and where each came from
  broker    run a local single-node Kafka broker (development and tests)
  demo      start a local broker (if none) and the scheduler, and show a message arriving
  schedule  send a request to deliver a message later (--cron: at every firing of a cron expression)
  replace   replace the pending schedule with an id
  cancel    cancel the pending schedule with an id (--cron: the recurring one)
  pause     pause the recurring schedule with an id
  resume    resume the recurring schedule with an id
  inspect   pending schedules read from a checkpoint: counts per hour and day, one in full
  list      pending schedules read from a checkpoint, a page at a time, with filters
  bench     run a benchmark scenario (from a repository checkout)
  chaos     run the crash suite: kill -9 the job and restart the broker, check every delivery
            (from a repository checkout)

`pip install kafka-scheduler` gives the request commands (schedule, replace, cancel, pause, resume) and config;
run, submit, inspect, list and demo need the server install: pip install "kafka-scheduler[server]".

Every `run` option can also be set as an environment variable KAFKA_SCHEDULER_<NAME>,
e.g. KAFKA_SCHEDULER_BOOTSTRAP_SERVERS=host:9092, or in a TOML file (--config FILE);
a flag wins over the variable, which wins over the file. Kafka client options (SASL, TLS, ...)
reach every client: --kafka-option KEY=VALUE. Every option: docs/configuration.md.
"""


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad arguments: one line naming the problem, no usage dump and no traceback."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class CommandError(Exception):
    pass


# The commands that run Spark (bench and chaos drive the job too), and what they import beyond the client's
# confluent-kafka: the modules of the [server] extra of pyproject.toml (module: distribution).
SERVER_COMMANDS = ("run", "submit", "inspect", "list", "demo", "bench", "chaos")
SERVER_MODULES = {
    "pyspark": "pyspark",
    "pandas": "pandas",
    "pyarrow": "pyarrow",
    "google.protobuf": "protobuf",
    "prometheus_client": "prometheus-client",
    "croniter": "croniter",
}


def missing_server_packages() -> list[str]:
    """The distributions of the [server] extra whose module cannot be imported here (none are imported)."""
    missing = []
    for module, distribution in SERVER_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a missing parent package (google), or a module set to None
            found = False
        if not found:
            missing.append(distribution)
    return missing


def setup_logging() -> None:
    """Log lines on stderr at KAFKA_SCHEDULER_LOG_LEVEL (default INFO), py4j's only from WARNING up."""
    level = os.environ.get("KAFKA_SCHEDULER_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)-5s %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)


# ---------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace) -> int:
    from ..pipeline import run

    config = resolve(args)
    check_kafka_settings(config)
    return run(config, from_beginning=args.from_beginning)


# ---------------------------------------------------------------- submit


def cmd_submit(args: argparse.Namespace) -> int:
    from .submit import submit

    return submit(args)


# ---------------------------------------------------------------- config


def cmd_config_show(args: argparse.Namespace) -> int:
    from .config_show import as_json, as_toml

    config = resolve(args)
    check_kafka_settings(config)
    sys.stdout.write(as_json(config) if args.format == "json" else as_toml(config))
    return 0


# ---------------------------------------------------------------- inspect


def _instant_ms(text: str, flag: str) -> int:
    from datetime import datetime

    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CommandError(f"{flag} {text!r}: expected an ISO-8601 instant, e.g. 2026-12-24T18:00:00Z") from None
    if moment.tzinfo is None:
        raise CommandError(f"{flag} {text!r}: give a time zone (Z or +01:00)")
    return int(moment.astimezone(UTC).timestamp() * 1000)


def cmd_inspect(args: argparse.Namespace) -> int:
    import time

    from ..config import Config
    from ..engine.spark.checkpoint import last_committed_batch
    from ..engine.spark.state_reader import tool_session
    from ..ops.inspection import Filters, inspect_checkpoint, render_json, render_table

    checkpoint_dir = args.checkpoint_dir or Config(app_id=args.app_id).checkpoint_dir
    if not os.path.isdir(checkpoint_dir) and "://" not in checkpoint_dir:
        raise CommandError(f"no checkpoint at {checkpoint_dir} (--checkpoint-dir)")
    filters = Filters(
        ids=tuple(args.id),
        destination=args.destination,
        input_topic=args.input_topic,
        due_from_ms=_instant_ms(args.due_from, "--from") if args.due_from else None,
        due_until_ms=_instant_ms(args.due_until, "--to") if args.due_until else None,
    )
    batch = last_committed_batch(checkpoint_dir)
    if batch is None:
        raise CommandError(f"checkpoint {checkpoint_dir} has no committed batch yet: nothing to inspect")
    logging.getLogger(__name__).info("inspect: starting Spark to read %s (batch %d)", checkpoint_dir, batch)
    spark = tool_session(args.app_id, checkpoint_dir)
    try:
        found = inspect_checkpoint(spark, checkpoint_dir, filters, int(time.time() * 1000), batch, args.limit)
    finally:
        spark.stop()
    print(render_json(found) if args.format == "json" else render_table(found, filters))
    return 0


# ---------------------------------------------------------------- list


def cmd_list(args: argparse.Namespace) -> int:
    import json
    import time

    from ..config import Config
    from ..engine.spark.checkpoint import last_committed_batch
    from ..engine.spark.state_reader import CheckpointState, tool_session
    from ..ops.listing import BadPageToken, list_query, list_schedules, render_table

    values = {
        "due_after": args.due_after,
        "due_before": args.due_before,
        "destination": args.destination,
        "id_prefix": args.id_prefix,
        "kind": args.kind,
        "limit": args.limit,
        "page_token": args.page_token,
    }
    try:
        filters, limit, cursor = list_query(values)
    except BadPageToken as exc:
        raise CommandError(f"--page-token: {exc}") from None
    except ValueError as exc:
        raise CommandError("--" + str(exc).replace("_", "-", 1)) from None
    checkpoint_dir = args.checkpoint_dir or Config(app_id=args.app_id).checkpoint_dir
    if not os.path.isdir(checkpoint_dir) and "://" not in checkpoint_dir:
        raise CommandError(f"no checkpoint at {checkpoint_dir} (--checkpoint-dir)")
    batch = last_committed_batch(checkpoint_dir)
    if batch is None:
        raise CommandError(f"checkpoint {checkpoint_dir} has no committed batch yet: nothing to list")
    logging.getLogger(__name__).info("list: starting Spark to read %s (batch %d)", checkpoint_dir, batch)
    spark = tool_session(args.app_id, checkpoint_dir)
    try:
        as_of_ms = int(time.time() * 1000)
        started = time.monotonic()
        state = CheckpointState(spark, checkpoint_dir, batch)
        found = list_schedules(state, filters, limit, cursor, as_of_ms, batch)
        logging.getLogger(__name__).info(
            "list: page read in %.1fs (%d Spark jobs, %d time buckets; %s)",
            time.monotonic() - started,
            state.jobs,
            found.buckets_read,
            ", ".join(f"{k} {v:.1f}s" for k, v in found.phases_s.items()),
        )
    finally:
        spark.stop()
    print(json.dumps(found.to_json(), indent=2) if args.format == "json" else render_table(found))
    return 0


# ---------------------------------------------------------------- broker


def cmd_broker(args: argparse.Namespace) -> int:
    from ..kafka.local_broker import LocalBroker

    broker = LocalBroker(args.port, args.data_dir, heap=args.heap, auto_create_topics=args.auto_create_topics)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    logging.info("broker: starting on 127.0.0.1:%d, data in %s", args.port, Path(args.data_dir).resolve())
    broker.start()
    logging.info("broker: ready at %s; stop with Ctrl-C or SIGTERM", broker.bootstrap_servers)
    while not stop.wait(0.5):
        if broker.process.poll() is not None:
            logging.error("broker exited with code %s; see %s", broker.process.returncode, broker.log_file)
            return 1
    logging.info("broker: stopping")
    broker.stop()
    logging.info("broker: stopped")
    return 0


# ---------------------------------------------------------------- client commands


def _client(args: argparse.Namespace):
    from ..client.scheduler_client import SchedulerClient

    config = resolve(args)
    check_kafka_settings(config)
    # librdkafka's own connection chatter would break the one-line error rule; failures still surface.
    return SchedulerClient(
        config.bootstrap_servers,
        app_id=config.app_id,
        producer_config={**kafka_settings(config), "log_level": 0},
        dialect=args.dialect,
        requests_topic=args.requests_topic,
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
    )
    with _client(args) as client:
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


# ---------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import demo

    return demo(args)


# ---------------------------------------------------------------- bench


def _checkout_module(folder: str, module: str, what: str):
    """``folder.module`` of the repository checkout (bench/, chaos/ live next to src/, not in the package)."""
    import importlib

    from ..kafka.jars import PROJECT_ROOT

    if not (PROJECT_ROOT / folder / f"{module}.py").exists():
        raise CommandError(f"the {folder}/ folder is not here: {what} run from a checkout of the repository")
    sys.path.insert(0, str(PROJECT_ROOT))
    return importlib.import_module(f"{folder}.{module}")


def _bench_module():
    return _checkout_module("bench", "scenarios", "benchmarks")


def cmd_bench(args: argparse.Namespace) -> int:
    return _bench_module().main(args)


# ---------------------------------------------------------------- chaos


def _chaos_module():
    return _checkout_module("chaos", "suite", "the crash suite")  # it uses bench/'s harness too


def cmd_chaos(args: argparse.Namespace) -> int:
    return _chaos_module().main(args)


# ---------------------------------------------------------------- parser


def _sender_arguments(parser: argparse.ArgumentParser) -> None:
    """Where requests go: the servers, the app and the Kafka options, as for `run` (flags, variables, --config)."""
    add_arguments(parser, names={"config", "bootstrap_servers", "app_id", "kafka_options"})


def _client_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KAFKA_SCHEDULER_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        metavar="HOST:PORT",
        help="Kafka bootstrap servers [env KAFKA_SCHEDULER_BOOTSTRAP_SERVERS; default 127.0.0.1:9092]",
    )
    parser.add_argument(
        "--app-id",
        default=os.environ.get("KAFKA_SCHEDULER_APP_ID", "kafka-scheduler"),
        metavar="ID",
        help="the scheduler's app id: requests go to <app-id>-schedule-requests "
        "[env KAFKA_SCHEDULER_APP_ID; default kafka-scheduler]",
    )


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


def _dialect_arguments(parser: argparse.ArgumentParser, message: bool) -> None:
    from ..client.encoders import DIALECTS

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


CHECKOUT_COMMANDS = ("bench", "chaos")


def build_parser(checkout_commands: Sequence[str] = ()) -> argparse.ArgumentParser:
    """``checkout_commands``: which of CHECKOUT_COMMANDS get their full arguments (their module is imported)."""
    parser = OneLineErrorParser(
        prog="kafka-scheduler", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"kafka-scheduler {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)

    run = commands.add_parser(
        "run",
        help="run the scheduler job",
        description="Run the scheduler: read requests from <app-id>-schedule-requests (or the "
        "--input topics, each in its dialect), keep pending schedules in the "
        "checkpoint, deliver each when due. Creates the app's topics if missing. "
        "Stops gracefully on Ctrl-C or SIGTERM.",
    )
    add_arguments(run)
    run.add_argument(
        "--from-beginning",
        action="store_true",
        help="rebuild from the input topics: keep the current checkpoint aside (renamed "
        "<dir>.before-<UTC time>, never deleted), start a new one and read every input from its "
        "earliest offset; schedules already written back are not delivered again",
    )
    run.set_defaults(handler=cmd_run)

    submit = commands.add_parser(
        "submit",
        help="run the job on a Spark cluster through spark-submit",
        description="Run the scheduler on a Spark cluster: build the package zip the executors import the state "
        "processor from (--py-files; kept in .cache/py-files, or ~/.cache/kafka-scheduler/py-files "
        "when pip-installed; rebuilt when the source changes) and call "
        "spark-submit "
        "(pyspark's, or $SPARK_HOME/bin/spark-submit) with --master, Spark's Kafka connector jars, "
        "the zip and the executors' Python; its driver runs `kafka-scheduler run` with the run options "
        "below, here (client deploy mode), so it reads the same flags, KAFKA_SCHEDULER_* variables and "
        "--config file. The settings are checked before anything is submitted. Executors need a "
        "Python of the driver's version with pandas, pyarrow and protobuf (--python). Ctrl-C or "
        "SIGTERM stops the job gracefully; a second one ends spark-submit at once.",
        epilog="example: kafka-scheduler submit --master spark://spark-master:7077 --executor-memory 2g "
        "--total-executor-cores 8 --bootstrap-servers kafka:9092 --app-id reminders "
        "--checkpoint-dir hdfs:///checkpoints/reminders --partitions 16",
    )
    cluster = submit.add_argument_group("spark-submit options")
    cluster.add_argument(
        "--executor-memory", metavar="SIZE", help="heap of each executor, e.g. 2g (Spark's default 1g)"
    )
    cluster.add_argument("--executor-cores", type=int, metavar="N", help="cores of each executor")
    cluster.add_argument(
        "--total-executor-cores",
        type=int,
        metavar="N",
        help="cores of all executors together (standalone: default all the cluster offers)",
    )
    cluster.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for spark-submit; repeat for more",
    )
    cluster.add_argument(
        "--python",
        metavar="PATH",
        help="the executors' Python (with pandas, pyarrow, protobuf) [default $PYSPARK_PYTHON, "
        "else this command's Python]",
    )
    cluster.add_argument(
        "--dry-run",
        action="store_true",
        help="build the zip and print the spark-submit command (secrets masked), run nothing",
    )
    add_arguments(submit)
    submit.add_argument("--from-beginning", action="store_true", help="as for run: rebuild from the input topics")
    submit.set_defaults(handler=cmd_submit)

    inspect = commands.add_parser(
        "inspect",
        help="pending schedules read from a checkpoint",
        description="Read the pending schedules straight from a checkpoint with Spark's state data source, whether "
        "the job runs or not (it reads the last committed batch): how many match, how many fall due "
        "per hour (next 48 hours) and per day (next 30 days), and the first ones in full (key, value, "
        "headers, due time, delivery id). Starts a local Spark session (a few seconds).",
    )
    inspect.add_argument("--checkpoint-dir", metavar="DIR", help="the job's checkpoint (default checkpoints/<app-id>)")
    inspect.add_argument(
        "--app-id",
        default="kafka-scheduler",
        metavar="ID",
        help="the app whose default checkpoint to read (default kafka-scheduler)",
    )
    inspect.add_argument(
        "--id",
        action="append",
        default=[],
        metavar="ID",
        help="only the schedule with this request id (repeat for more); shown in full",
    )
    inspect.add_argument("--destination", metavar="TOPIC", help="only schedules delivered to this topic")
    inspect.add_argument("--input-topic", metavar="TOPIC", help="only schedules requested on this input topic")
    inspect.add_argument(
        "--from", dest="due_from", metavar="TIME", help="only schedules due at or after this ISO-8601 instant"
    )
    inspect.add_argument("--to", dest="due_until", metavar="TIME", help="only schedules due before this instant")
    inspect.add_argument(
        "--limit",
        type=int,
        default=20,
        metavar="N",
        help="show at most N schedules, those due first (default 20; 0: counts only)",
    )
    inspect.add_argument("--format", choices=("table", "json"), default="table", help="output (default table)")
    inspect.set_defaults(handler=cmd_inspect)

    listing = commands.add_parser(
        "list",
        help="pending schedules read from a checkpoint, a page at a time",
        description="List the pending schedules of a checkpoint by due time (then delivery id), one page at a time, "
        "read with Spark's state data source whether the job runs or not (the last committed batch; a "
        "local Spark session starts, a few seconds): one-shots and recurring schedules (their next "
        "firing, with the cron's definition). Each page ends with the token of the next one: give it "
        "to --page-token with the same filters. The state may move on between pages: no schedule is "
        "listed twice, one pending all along is listed once, one added or replaced meanwhile shows if it "
        "falls after the pages already read.",
        epilog="example: kafka-scheduler list --checkpoint-dir /data/reminders --destination orders "
        "--due-after 2026-12-24T00:00:00Z --limit 20",
    )
    listing.add_argument("--checkpoint-dir", metavar="DIR", help="the job's checkpoint (default checkpoints/<app-id>)")
    listing.add_argument(
        "--app-id",
        default="kafka-scheduler",
        metavar="ID",
        help="the app whose default checkpoint to read (default kafka-scheduler)",
    )
    listing.add_argument("--due-after", metavar="TIME", help="only schedules due at or after this ISO-8601 instant")
    listing.add_argument("--due-before", metavar="TIME", help="only schedules due before this ISO-8601 instant")
    listing.add_argument("--destination", metavar="TOPIC", help="only schedules delivered to this topic")
    listing.add_argument("--id-prefix", metavar="TEXT", help="only schedules whose request id starts with TEXT")
    listing.add_argument("--kind", metavar="KIND", help="only one-shot or only cron (recurring) schedules")
    listing.add_argument("--limit", default="50", metavar="N", help="schedules per page, 1 to 1000 (default 50)")
    listing.add_argument(
        "--page-token",
        metavar="TOKEN",
        help="the next page: the token the previous page printed (with the same filters)",
    )
    listing.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table, or json for scripts (next_page_token in it) (default table)",
    )
    listing.set_defaults(handler=cmd_list)

    config = commands.add_parser(
        "config", help="show the effective settings", description="Settings of `run`: config show prints them."
    )
    config_commands = config.add_subparsers(
        dest="config_command", metavar="COMMAND", required=True, parser_class=OneLineErrorParser
    )
    show = config_commands.add_parser(
        "show",
        help="print the effective settings and where each came from",
        description="Print the settings `run` would use with the same flags, "
        "variables and --config file, each with its source (flag, env, "
        "file or default); secrets in Kafka options are shown as ****. "
        "The TOML form can be used as a --config file.",
    )
    add_arguments(show)
    show.add_argument("--from-beginning", action="store_true", help=argparse.SUPPRESS)  # accepted as for run
    show.add_argument("--format", choices=("toml", "json"), default="toml", help="output format (default toml)")
    show.set_defaults(handler=cmd_config_show)

    broker = commands.add_parser(
        "broker",
        help="run a local Kafka broker",
        description="Run a single-node Apache Kafka broker (KRaft) on 127.0.0.1 in the "
        "foreground until Ctrl-C or SIGTERM. For development and tests.",
    )
    broker.add_argument("--port", type=int, default=9092, help="client port (default 9092)")
    broker.add_argument(
        "--data-dir",
        default=".local/broker",
        metavar="DIR",
        help="where the broker keeps its data (default .local/broker)",
    )
    broker.add_argument("--heap", default="512m", help="broker JVM heap (default 512m)")
    broker.add_argument(
        "--auto-create-topics", action="store_true", help="let producers create topics by writing to them"
    )
    broker.set_defaults(handler=cmd_broker)

    demo = commands.add_parser(
        "demo",
        help="show a scheduled message arriving",
        description="Start a local broker on --bootstrap-servers if none answers there, "
        "start the scheduler, schedule a message a few seconds ahead and show it "
        "arriving. Then keep running (Ctrl-C stops everything) unless --once.",
    )
    _client_arguments(demo)
    demo.add_argument("--checkpoint-dir", default=None, metavar="DIR", help="default ./checkpoints/<app-id>")
    demo.add_argument(
        "--data-dir",
        default=".local/broker",
        metavar="DIR",
        help="data folder of the broker it starts (default .local/broker)",
    )
    # 10 s: the batch that first reads a request starts the state processor's Python workers (about 3 s) and the
    # one that first writes opens the producer (1 s); due 5 s ahead the message came out 1-2 s late, 10 s ahead on time.
    demo.add_argument(
        "--delay",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how far ahead the demo message is due (default 10)",
    )
    demo.add_argument("--once", action="store_true", help="stop everything once the message has arrived")
    demo.set_defaults(handler=cmd_demo)

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

    bench = commands.add_parser(
        "bench",
        help="run a benchmark scenario",
        description="Benchmark the real job against a local broker: steady (lateness, "
        "and send-to-delivery of requests already due when sent), ingest "
        "(requests/s with ids, --no-ids, or a --mix of adds, replaces and "
        "cancels), herd (many due at once; the id index afterwards), pending "
        "(memory), restart (time to first overdue delivery and its start-up "
        "steps), idle (CPU of the whole job with nothing to do, then wake-up "
        "lateness), strikes (cancels and replaces per second as one time "
        "bucket's struck versions pile up; --deliver also checks the "
        "outcome). Prints the figures and writes "
        "bench/results/<time>-<scenario>.json.",
    )
    # bench/ and chaos/ are imported only when their command runs (they live in a checkout, beside src/).
    if "bench" in checkout_commands:
        _bench_module().add_arguments(bench)
    else:
        bench.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    bench.set_defaults(handler=cmd_bench)

    if "chaos" in checkout_commands:
        suite = _chaos_module()
        chaos = commands.add_parser(
            "chaos",
            help="run the crash suite",
            description=suite.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        suite.add_arguments(chaos)
    else:
        chaos = commands.add_parser("chaos", help="run the crash suite (from a repository checkout)", add_help=False)
        chaos.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    chaos.set_defaults(handler=cmd_chaos)

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
        _dialect_arguments(command, message=False)
        command.set_defaults(handler=cmd_cron_action)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser([name for name in CHECKOUT_COMMANDS if argv[:1] == [name]])
    except CommandError as exc:
        print(f"kafka-scheduler {argv[0]}: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    if args.command in SERVER_COMMANDS:
        missing = missing_server_packages()
        if missing:
            print(
                f"kafka-scheduler {args.command}: error: needs the server install ({', '.join(missing)} "
                f'missing): pip install "kafka-scheduler[server]"',
                file=sys.stderr,
            )
            return 2
    setup_logging()
    from ..client.scheduler_client import RequestError
    from ..kafka.jars import MissingJars
    from ..kafka.local_broker import BrokerError
    from ..kafka.topics import KafkaUnreachable

    try:
        return args.handler(args)
    except (ConfigError, CommandError, RequestError, KafkaUnreachable, BrokerError, MissingJars) as exc:
        print(f"kafka-scheduler {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
