"""The ``kafka-scheduler`` command: its parser, the job's commands (run, submit, config, broker, demo, bench, chaos),
and how a command's output and errors reach the user. The request commands are in request_commands.py, inspect and
list in checkpoint_commands.py."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from ..config import OPTION_NAMES, ConfigError, add_arguments, check_kafka_settings, env_name, resolve, shown_default
from . import checkpoint_commands, request_commands
from .command_line import CommandError, OneLineErrorParser

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


# The commands that run Spark (bench and chaos drive the job too), and what they import beyond the client's
# confluent-kafka: the modules of the [server] extra of pyproject.toml (module: distribution).
SERVER_COMMANDS = ("run", "submit", "inspect", "list", "demo", "bench", "chaos")
SERVER_MODULES = {
    "pyspark": "pyspark",
    "pandas": "pandas",
    "pyarrow": "pyarrow",
    "google.protobuf": "protobuf",
    "prometheus_client": "prometheus-client",
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


def _client_arguments(parser: argparse.ArgumentParser) -> None:
    servers, app_id = OPTION_NAMES["bootstrap_servers"], OPTION_NAMES["app_id"]
    parser.add_argument(
        servers.flag,
        default=os.environ.get(env_name(servers), servers.default),
        metavar=servers.metavar,
        help=f"Kafka bootstrap servers [env {env_name(servers)}; default {shown_default(servers)}]",
    )
    parser.add_argument(
        app_id.flag,
        default=os.environ.get(env_name(app_id), app_id.default),
        metavar=app_id.metavar,
        help="the scheduler's app id: requests go to <app-id>-schedule-requests "
        f"[env {env_name(app_id)}; default {shown_default(app_id)}]",
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

    request_commands.add_parsers(commands)
    checkpoint_commands.add_parsers(commands)

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
    from .engine_noise import debug_enabled
    from .engine_output import EngineOutput

    try:
        if args.command not in SERVER_COMMANDS:
            return args.handler(args)
        # The engines these commands start print onto our standard descriptors: only what matters gets through.
        with EngineOutput(everything=debug_enabled()):
            return args.handler(args)
    except (ConfigError, CommandError, RequestError, KafkaUnreachable, BrokerError, MissingJars) as exc:
        print(f"kafka-scheduler {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
