"""Scheduler settings: one table of options, each a CLI flag, a ``KAFKA_SCHEDULER_<NAME>`` variable and a key of
the optional TOML file (``--config FILE``), plus Kafka client options passed through to every client.

Precedence: command-line flag, then environment variable, then the file, then default.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from .config_values import (
    bool_value,
    duration_ms,
    format_duration_ms,
    input_list,
    interval_ms,
    niceness,
    one_of,
    port_number,
    positive_int,
    regex,
    trigger_interval,
)

ENV_PREFIX = "KAFKA_SCHEDULER_"

REQUESTS_SUFFIX = "-schedule-requests"
REJECTIONS_SUFFIX = "-schedule-rejections"
HISTORY_SUFFIX = "-schedule-history"
TICKS_SUFFIX = "-scheduler-ticks"
LEDGER_SUFFIX = "-schedule-ledger"

_APP_ID = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


class ConfigError(ValueError):
    pass


# Kafka client options: "KEY=VALUE" reaches every client; "librdkafka.KEY" only the Python (confluent-kafka) clients,
# "java.KEY" only Spark's Kafka source and sink (the Java client), as the two name some settings differently.
SCOPES = ("librdkafka", "java")
_KAFKA_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Settings the scheduler's guarantees rest on, or that it sets from its own options: not to be overridden.
RESERVED_KAFKA_OPTIONS = {
    "bootstrap.servers": "use --bootstrap-servers",
    "acks": "deliveries are written with acks=all",
    "enable.idempotence": "the scheduler's producers are idempotent",
    "transactional.id": "set by --exactly-once",
    "isolation.level": "requests are read read_committed (an aborted transaction's requests do not act)",
    "group.id": "the scheduler tracks its offsets in the checkpoint",
    "enable.auto.commit": "the scheduler tracks its offsets in the checkpoint",
    "auto.offset.reset": "the scheduler tracks its offsets in the checkpoint",
    "partitioner": "keys are partitioned as Java clients do (murmur2)",
    "key.serializer": "records are bytes",
    "value.serializer": "records are bytes",
    "key.deserializer": "records are bytes",
    "value.deserializer": "records are bytes",
}
# Words in an option's name that make its value a secret: shown as **** (config show, logs).
SECRET_WORDS = ("password", "secret", "sasl.jaas.config", "ssl.key.", "ssl.keystore.key", "token")
MASK = "****"


def is_secret(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in SECRET_WORDS)


def kafka_option(text: str) -> tuple[str, str]:
    """One ``KEY=VALUE``; the value may hold '=' and ','."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    check_kafka_key(key)
    return key, value.strip()


def check_kafka_key(key: str) -> None:
    if not _KAFKA_KEY.match(key):
        raise ValueError(f"{key!r} is not a Kafka client option name")
    scope, _, bare = key.partition(".")
    if scope in SCOPES and not bare:
        raise ValueError(f"{key!r}: give the option after the scope, e.g. {scope}.client.id")
    name = bare if scope in SCOPES else key
    if name in RESERVED_KAFKA_OPTIONS:
        raise ValueError(f"{key!r} cannot be set: {RESERVED_KAFKA_OPTIONS[name]}")


def _kafka_options(text: str) -> tuple[tuple[str, str], ...]:
    """The variable's form: ``KEY=VALUE`` entries separated by newlines if there is one, else by commas."""
    entries = text.splitlines() if "\n" in text else text.split(",")
    return tuple(kafka_option(entry) for entry in entries if entry.strip())


@dataclass(frozen=True)
class Option:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    metavar: str = ""
    repeatable: bool = False  # the flag may be given several times; the values are joined with commas
    flag_name: str = ""  # the flag, when not derived from the name
    show: Callable[[Any], Any] = lambda value: value  # the value as the file and `config show` write it

    @property
    def flag(self) -> str:
        """``--bootstrap-servers``; a repeatable option's flag is singular: ``--input`` for ``inputs``."""
        if self.flag_name:
            return self.flag_name
        return "--" + (self.name[:-1] if self.repeatable else self.name).replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("bootstrap_servers", str, "127.0.0.1:9092", "Kafka bootstrap servers", "HOST:PORT"),
    Option(
        "inputs",
        input_list,
        None,
        "an input topic and the dialect its requests are written in (native, karafka, etf1, sky-avro, "
        "sky-json); repeat for several topics, or give a comma list in the variable; default: "
        "<app-id>-schedule-requests:native. With --input only the listed topics are read",
        "TOPIC:DIALECT",
        repeatable=True,
        show=lambda inputs: [f"{t}:{d}" for t, d in inputs],
    ),
    Option(
        "app_id",
        str,
        "kafka-scheduler",
        "application id: names the app's topics (<app-id>-schedule-requests, ...)",
        "ID",
    ),
    Option(
        "checkpoint_dir",
        str,
        None,
        "checkpoint folder (offsets and RocksDB state); default ./checkpoints/<app-id>",
        "DIR",
    ),
    Option("master", str, "local[2]", "Spark master URL (ignored under spark-submit, which sets it)", "URL"),
    Option(
        "trigger_interval",
        trigger_interval,
        "0 milliseconds",
        "micro-batch interval; 0 runs batches back to back while there is input (an idle job runs none)",
        "DURATION",
        show=lambda text: format_duration_ms(int(text.split()[0])),
    ),
    Option(
        "partitions",
        positive_int,
        2,
        "partitions of the topics the scheduler creates, and Spark shuffle partitions",
        "N",
    ),
    Option(
        "allowed_destinations",
        regex,
        None,
        "regex a destination topic must fully match; default: any topic except Kafka-internal "
        "'__*' topics and the app's own topics",
        "REGEX",
    ),
    Option("max_value_bytes", positive_int, 1_000_000, "largest accepted request value, in bytes", "BYTES"),
    Option("max_ahead_days", positive_int, 36_525, "how far ahead a due time may be (default 100 years)", "DAYS"),
    Option("history", bool_value, False, "write one record per delivery to <app-id>-schedule-history", "BOOL"),
    Option(
        "max_requests_per_batch",
        positive_int,
        500_000,
        "cap on request records read per micro-batch: bounds memory and batch time when catching up",
        "N",
    ),
    Option(
        "engine_niceness",
        niceness,
        10,
        "Unix nice value of the Spark JVM a job with a local master starts and of the Python workers it forks: "
        "the bulk work of a batch (a backlog, a herd's preparation) yields the CPU to the driver's read of urgent "
        "requests and its timed writer; 0 runs them at the driver's priority",
        "0-19",
    ),
    Option("driver_memory", str, "1g", "Spark driver JVM heap (local mode: also the executor's)", "SIZE"),
    Option(
        "class_archive",
        str,
        "auto",
        "folder of the Spark driver JVM's class-data-sharing archive: the first graceful stop writes one (once, "
        "seconds), later starts map its classes instead of loading them (a faster start and restart); 'auto': "
        "<cache>/jvm-archive (.cache of a checkout, else ~/.cache/kafka-scheduler); 'off': none. Not under "
        "spark-submit",
        "DIR|auto|off",
    ),
    Option(
        "state_batches_kept",
        positive_int,
        20,
        "how many batches' state versions the checkpoint keeps at least (Spark's minBatchesToRetain); on disk: "
        "between this many and this many plus twice --state-snapshot-every batches' changes, and two or three "
        "snapshots",
        "N",
    ),
    Option(
        "state_snapshot_every",
        positive_int,
        10,
        "how many batches' changelogs apart the state store writes a full snapshot (Spark's "
        "stateStore.minDeltasForSnapshot): a restart replays at most this many; old versions are deleted only "
        "once a newer snapshot lets them go",
        "N",
    ),
    Option(
        "lookahead",
        duration_ms,
        30_000,
        "prepare deliveries this long before they are due; the driver's timed writer writes each at its due "
        "instant (a replace or cancel read before then still withdraws it), and a request read as it arrives, due "
        "sooner, goes out on time while a batch runs for up to about this long (a herd's). 0 writes each from the "
        "first micro-batch after its due time",
        "DURATION",
        show=format_duration_ms,
    ),
    Option(
        "cron_min_interval",
        interval_ms,
        5000,
        "a cron (CRON_ADD) whose firings may come closer together than this is rejected (as Kaspr's minimum, "
        "5s); at least 1s",
        "DURATION",
        show=format_duration_ms,
    ),
    Option(
        "max_held",
        positive_int,
        100_000,
        "most prepared deliveries the timed writer holds in memory (a lookahead's worth of traffic: 30,000 at "
        "1,000/s); beyond it a batch writes its deliveries itself, each slice at its due time",
        "N",
    ),
    Option(
        "exactly_once",
        bool_value,
        False,
        "write deliveries, write-backs and rejections in Kafka transactions, each once even across crashes, "
        "for consumers reading with isolation.level=read_committed (the app's ledger topic records what was "
        "written)",
        "BOOL",
    ),
    Option(
        "metrics_port",
        port_number,
        9464,
        "serve Prometheus metrics at http://<metrics-host>:<port>/metrics; 0 turns them off",
        "PORT",
    ),
    Option("metrics_host", str, "0.0.0.0", "address the metrics server listens on", "HOST"),
    Option(
        "admin_token_file",
        str,
        None,
        "file holding the admin token (at least 16 characters): with it, the status page's schedules (keys, "
        "values, headers) and actions are served beyond loopback to whoever sends it (Authorization: Bearer, or "
        "the page's login form); without it, to loopback only. /metrics and the page's counts stay open",
        "FILE",
    ),
    Option(
        "state_layout",
        one_of("wheel"),
        "wheel",
        "how pending schedules are kept: 'wheel' (time buckets per shard, bulk; the only layout since the "
        "per-id one was retired); recorded in the checkpoint",
        "LAYOUT",
    ),
    Option(
        "shards",
        positive_int,
        None,
        "state shards of the wheel layout (default: twice --partitions); fixed in the checkpoint at its first run",
        "N",
    ),
    Option(
        "kafka_options",
        _kafka_options,
        (),
        "a Kafka client option for every client of the job and the CLI (security.protocol=SASL_SSL, ...); "
        "prefix librdkafka. or java. to reach only the Python clients or only Spark's; repeat for more. The "
        "variable takes KEY=VALUE entries separated by commas, or by newlines when a value holds a comma",
        "KEY=VALUE",
        repeatable=True,
        flag_name="--kafka-option",
        show=dict,
    ),
)
OPTION_NAMES = {option.name: option for option in OPTIONS}
# A key of the --config file: an option's name or its flag's ("input" for inputs), "-" or "_" alike; [kafka] apart.
FILE_KEYS = {
    **{option.flag[2:].replace("-", "_"): option for option in OPTIONS if option.name != "kafka_options"},
    **{option.name: option for option in OPTIONS if option.name != "kafka_options"},
    "kafka": OPTION_NAMES["kafka_options"],
}


def _default(name: str) -> Any:
    """An option's default, defined once in OPTIONS: Config's field defaults are read from there."""
    return OPTION_NAMES[name].default


@dataclass(frozen=True)
class Config:
    bootstrap_servers: str = _default("bootstrap_servers")
    inputs: tuple[tuple[str, str], ...] | None = _default("inputs")  # (topic, dialect); None: the native requests topic
    app_id: str = _default("app_id")
    checkpoint_dir: str | None = _default("checkpoint_dir")
    master: str = _default("master")
    trigger_interval: str = _default("trigger_interval")  # as Spark's trigger takes it: "N milliseconds"
    partitions: int = _default("partitions")
    allowed_destinations: str | None = _default("allowed_destinations")
    max_value_bytes: int = _default("max_value_bytes")
    max_ahead_days: int = _default("max_ahead_days")
    history: bool = _default("history")
    max_requests_per_batch: int | None = _default("max_requests_per_batch")
    engine_niceness: int = _default("engine_niceness")
    driver_memory: str = _default("driver_memory")
    class_archive: str = _default("class_archive")  # a folder, "auto" or "off" (engine/spark/class_archive.py)
    state_batches_kept: int = _default("state_batches_kept")
    state_snapshot_every: int = _default("state_snapshot_every")
    lookahead: int = _default("lookahead")  # milliseconds
    cron_min_interval: int = _default("cron_min_interval")  # milliseconds
    max_held: int = _default("max_held")
    exactly_once: bool = _default("exactly_once")
    metrics_port: int = _default("metrics_port")  # 0: no metrics server
    metrics_host: str = _default("metrics_host")
    admin_token_file: str | None = _default("admin_token_file")  # None: the status page's payloads for loopback only
    state_layout: str = _default("state_layout")
    shards: int | None = _default("shards")  # None: twice the partitions
    kafka_options: tuple[tuple[str, str], ...] = _default("kafka_options")  # (key, value), scoped keys included
    # (option name, "--flag", "KAFKA_SCHEDULER_<NAME>" or "<name> in FILE") of each option set explicitly; a Kafka
    # option's entry is named "kafka.<key>". Settings recorded in the checkpoint may replace a default, never an
    # explicit choice (checkpoint.settle_state_settings).
    given: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    # Set when the checkpoint is new or an input was added to it: the first batch must then read every input to
    # its end before delivering, so write-backs and cancels already in the topics act first (no per-batch cap).
    catch_up_first: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if not _APP_ID.match(self.app_id):
            raise ConfigError(f"app id {self.app_id!r} must be 1-200 characters of letters, digits, '.', '_', '-'")
        if self.checkpoint_dir is None:
            object.__setattr__(self, "checkpoint_dir", os.path.join("checkpoints", self.app_id))
        if self.shards is None:
            # Few shards keep per-batch overhead low; two per shuffle partition keep both busy.
            object.__setattr__(self, "shards", 2 * self.partitions)

    @property
    def requests_topic(self) -> str:
        return self.app_id + REQUESTS_SUFFIX

    @property
    def rejections_topic(self) -> str:
        return self.app_id + REJECTIONS_SUFFIX

    @property
    def history_topic(self) -> str:
        return self.app_id + HISTORY_SUFFIX

    @property
    def ticks_topic(self) -> str:
        """Wake-up ticks the driver writes for itself (driver.wakeups)."""
        return self.app_id + TICKS_SUFFIX

    @property
    def ledger_topic(self) -> str:
        """With --exactly-once: what each transaction wrote (exactly_once.py)."""
        return self.app_id + LEDGER_SUFFIX

    @property
    def input_topics(self) -> dict[str, str]:
        """Each topic read, with its dialect."""
        return dict(self.inputs) if self.inputs else {self.requests_topic: "native"}

    @property
    def own_topics(self) -> tuple[str, ...]:
        """Topics a delivery may never go to: the app's own and every input (a delivery there would loop)."""
        own = (self.requests_topic, self.rejections_topic, self.history_topic, self.ticks_topic, self.ledger_topic)
        return own + tuple(t for t in self.input_topics if t not in own)

    def given_by(self, name: str) -> str | None:
        """The flag or variable that set option ``name``, or None if it has its default."""
        return dict(self.given).get(name)

    def describe(self) -> str:
        shown = {**{f.name: getattr(self, f.name) for f in fields(self)}, "kafka_options": masked(self.kafka_options)}
        return ", ".join(f"{name}={value}" for name, value in shown.items() if name not in ("given", "catch_up_first"))


def env_name(option: Option) -> str:
    return ENV_PREFIX + option.name.upper()


def masked(options: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return {key: MASK if is_secret(key) else value for key, value in options}


def _scoped(options: tuple[tuple[str, str], ...], scope: str) -> dict[str, str]:
    """Unscoped options, then ``scope.``-prefixed ones (without the prefix), which win."""
    common = {k: v for k, v in options if k.partition(".")[0] not in SCOPES}
    return {**common, **{k[len(scope) + 1 :]: v for k, v in options if k.startswith(scope + ".")}}


def kafka_settings(config: Config) -> dict[str, str]:
    """Settings for every confluent-kafka (librdkafka) client: the servers and the passed-through options. Clients
    add their own settings to these (a producer's acks, a consumer's group)."""
    return {"bootstrap.servers": config.bootstrap_servers, **_scoped(config.kafka_options, "librdkafka")}


def spark_kafka_options(config: Config) -> dict[str, str]:
    """Options for Spark's Kafka source and sink: the servers and the passed-through options, prefixed ``kafka.``."""
    return {
        "kafka.bootstrap.servers": config.bootstrap_servers,
        **{"kafka." + k: v for k, v in _scoped(config.kafka_options, "java").items()},
    }


def check_kafka_settings(config: Config) -> None:
    """Have librdkafka judge the options now (a client refuses bad ones when created), so a bad one fails at start
    with one line naming it. The Java client judges its own when Spark's source first reads."""
    from confluent_kafka import KafkaException, Producer

    try:
        Producer({"log_level": 0, **kafka_settings(config)})
    except KafkaException as exc:
        error = exc.args[0]
        text = error.str() if hasattr(error, "str") else str(error)
        java_only = "No such configuration" in text or "JAAS" in text
        hint = " (an option of the Java client only? prefix it java.)" if java_only else ""
        raise ConfigError(f"Kafka option: {text}{hint}") from None


CONFIG_ENV = ENV_PREFIX + "CONFIG"


def add_arguments(parser: argparse.ArgumentParser, names: set[str] | None = None) -> None:
    """Add ``--config`` and a ``--flag`` per option (all of them, or those in ``names``, "config" naming ``--config``);
    defaults stay None to see what was set."""
    if names is None or "config" in names:
        parser.add_argument(
            "--config",
            dest="config_file",
            default=None,
            metavar="FILE",
            help=f"TOML file of settings (keys: the option names, a [kafka] table of Kafka "
            f"options); flags and variables override it [env {CONFIG_ENV}]",
        )
    for option in OPTIONS:
        if names is not None and option.name not in names:
            continue
        default = shown_default(option)
        # A yes/no option given alone means yes: --exactly-once is --exactly-once=true.
        switch = {"nargs": "?", "const": "true"} if option.parse is bool_value else {}
        parser.add_argument(
            option.flag,
            dest=option.name,
            default=None,
            metavar=option.metavar or None,
            action="append" if option.repeatable else "store",
            **switch,
            help=f"{option.help} [env {env_name(option)}; default {default}]",
        )


def shown_default(option: Option) -> str:
    """An option's default as a user would write it: '3s', 'false', 'none'."""
    if option.default in (None, ()):
        return "none"
    shown = option.show(option.default)
    if isinstance(shown, bool):
        return "true" if shown else "false"
    return str(shown)


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``[kafka]`` keys: ``sasl.mechanism = ...`` is a nested table in TOML; give it back its dotted name."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _scalar_text(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ConfigError(f"{where}: expected a string, number or true/false, got {type(value).__name__} {value!r}")


def read_file(path: str) -> dict[str, tuple[Any, str]]:
    """The file's settings as {option name: (raw value for its parser, source)}: plain values as text, a repeatable
    option's array as a list of texts, the ``[kafka]`` table as a tuple of (key, value) pairs."""
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: not valid TOML: {exc}") from None
    settings: dict[str, tuple[Any, str]] = {}
    for key, value in document.items():
        where = f"{key} in {path}"
        option = FILE_KEYS.get(key.replace("-", "_"))
        if option is None:
            close = difflib.get_close_matches(key.replace("-", "_"), FILE_KEYS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{path}: unknown setting {key!r}{hint}")
        name = option.name
        if name in settings:
            raise ConfigError(f"{path}: {key!r} is given twice (as {settings[name][1].split()[0]} too)")
        if name == "kafka_options":
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: expected a table of Kafka options ([kafka] with KEY = VALUE lines)")
            pairs = []
            for kafka_key, kafka_value in _flatten(value).items():
                try:
                    check_kafka_key(kafka_key)
                except ValueError as exc:
                    raise ConfigError(f"[kafka] in {path}: {exc}") from None
                pairs.append((kafka_key, _scalar_text(kafka_value, f"kafka.{kafka_key} in {path}")))
            settings[name] = (tuple(pairs), where)
        elif option.repeatable and isinstance(value, list):
            settings[name] = ([_scalar_text(item, where) for item in value], where)
        elif isinstance(value, dict):
            raise ConfigError(f"{where}: expected a single value, got a table")
        else:
            settings[name] = (_scalar_text(value, where), where)
    return settings


def _parse(option: Option, raw: Any, source: str) -> Any:
    try:
        if option.name == "kafka_options" and isinstance(raw, list):  # flags: one KEY=VALUE each, commas allowed
            return tuple(kafka_option(item) for item in raw)
        return option.parse(",".join(raw) if isinstance(raw, list) else raw)
    except (ValueError, re.error) as exc:
        raise ConfigError(f"{source}: {exc}") from None


def resolve(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> Config:
    """Build a Config from parsed flags, then the environment, then the ``--config`` file, then defaults. Kafka
    options merge key by key in the same order: a flag's value for a key wins over the variable's and the file's."""
    environ = os.environ if environ is None else environ
    path = getattr(args, "config_file", None) or environ.get(CONFIG_ENV) or None
    in_file = read_file(path) if path else {}
    values: dict[str, Any] = {}
    given: list[tuple[str, str]] = []
    for option in OPTIONS:
        layers = []  # (raw value, source), lowest precedence first
        if option.name in in_file:
            layers.append(in_file[option.name])
        if env_name(option) in environ:
            layers.append((environ[env_name(option)], env_name(option)))
        flag = getattr(args, option.name, None) if args is not None else None
        if flag is not None:
            layers.append((flag, option.flag))
        if option.name == "kafka_options":
            merged: dict[str, tuple[str, str]] = {}
            for raw, source in layers:
                pairs = raw if isinstance(raw, tuple) else _parse(option, raw, source)  # the file's come parsed
                merged.update({key: (value, source) for key, value in pairs})
            values[option.name] = tuple((key, value) for key, (value, _) in merged.items())
            given += [(f"kafka.{key}", source) for key, (_, source) in merged.items()]
        elif layers:  # only the winning value is parsed: a flag overrides a bad variable
            raw, source = layers[-1]
            values[option.name] = _parse(option, raw, source)
            given.append((option.name, source))
        else:
            values[option.name] = option.default
    return Config(**values, given=tuple(given))


def source_kind(source: str | None) -> str:
    """flag, env, file or default: where a setting's ``given`` source says it came from."""
    if source is None:
        return "default"
    if source.startswith("--"):
        return "flag"
    return "env" if source.startswith(ENV_PREFIX) else "file"


def shown_setting(name: str, source: str | None, value: Any) -> str:
    """A setting as it was set: '--shards 6', 'KAFKA_SCHEDULER_SHARDS=6', 'shards = 6 in FILE', 'the default
    --shards 4'."""
    kind = source_kind(source)
    if kind == "default":
        return f"the default --{name.replace('_', '-')} {value}"
    if kind == "env":
        return f"{source}={value}"
    if kind == "file":
        key, _, path = source.partition(" in ")
        return f"{key} = {value} in {path}"
    return f"{source} {value}"
