"""Scheduler settings: one table of options, each a CLI flag and a ``KAFKA_SCHEDULER_<NAME>`` variable.

Precedence: command-line flag, then environment variable, then default.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

from .protocol import DIALECT_NAMES

ENV_PREFIX = "KAFKA_SCHEDULER_"

REQUESTS_SUFFIX = "-schedule-requests"
REJECTIONS_SUFFIX = "-schedule-rejections"
HISTORY_SUFFIX = "-schedule-history"
TICKS_SUFFIX = "-scheduler-ticks"
LEDGER_SUFFIX = "-schedule-ledger"

_TRIGGER = re.compile(r"^\s*(\d+(\.\d+)?)\s*(ms|milliseconds?|s|seconds?|m|minutes?)\s*$", re.I)
_APP_ID = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


class ConfigError(ValueError):
    pass


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be a positive integer, got {text!r}")
    return value


_UNIT_MS = {"ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "second": 1000, "seconds": 1000,
            "m": 60_000, "minute": 60_000, "minutes": 60_000}


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"must be a port number from 0 to 65535, got {text!r}")
    return value


def _duration_ms(text: str) -> int:
    match = _TRIGGER.match(text)
    if not match:
        raise ValueError(f"expected a duration such as '0s', '250ms' or '1 second', got {text!r}")
    return int(float(match.group(1)) * _UNIT_MS[match.group(3).lower()])


def _trigger(text: str) -> str:
    return f"{_duration_ms(text)} milliseconds"


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return text

    return parse


def _regex(text: str) -> str:
    re.compile(text)
    return text


_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _inputs(text: str) -> tuple[tuple[str, str], ...]:
    """``TOPIC:DIALECT[,TOPIC:DIALECT...]`` (a repeated --input arrives joined by commas)."""
    inputs: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        topic, sep, dialect = item.rpartition(":")
        if not sep or not topic:
            raise ValueError(f"expected TOPIC:DIALECT, got {item!r} (dialects: {', '.join(DIALECT_NAMES)})")
        if not _TOPIC.match(topic) or topic in (".", ".."):
            raise ValueError(f"{topic!r} is not a valid Kafka topic name")
        if dialect not in DIALECT_NAMES:
            raise ValueError(f"unknown dialect {dialect!r} for topic {topic!r} "
                             f"(expected one of {', '.join(DIALECT_NAMES)})")
        if inputs.get(topic, dialect) != dialect:
            raise ValueError(f"topic {topic!r} is given twice, as {inputs[topic]} and as {dialect}")
        inputs[topic] = dialect
    if not inputs:
        raise ValueError("expected at least one TOPIC:DIALECT")
    return tuple(inputs.items())


@dataclass(frozen=True)
class Option:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    metavar: str = ""
    repeatable: bool = False  # the flag may be given several times; the values are joined with commas

    @property
    def flag(self) -> str:
        """``--bootstrap-servers``; a repeatable option's flag is singular: ``--input`` for ``inputs``."""
        return "--" + (self.name[:-1] if self.repeatable else self.name).replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("bootstrap_servers", str, "127.0.0.1:9092", "Kafka bootstrap servers", "HOST:PORT"),
    Option("inputs", _inputs, None,
           "an input topic and the dialect its requests are written in (native, karafka, etf1, sky-avro, "
           "sky-json); repeat for several topics, or give a comma list in the variable; default: "
           "<app-id>-schedule-requests:native. With --input only the listed topics are read", "TOPIC:DIALECT",
           repeatable=True),
    Option("app_id", str, "kafka-scheduler",
           "application id: names the app's topics (<app-id>-schedule-requests, ...)", "ID"),
    Option("checkpoint_dir", str, None,
           "checkpoint folder (offsets and RocksDB state); default ./checkpoints/<app-id>", "DIR"),
    Option("master", str, "local[2]", "Spark master URL (ignored under spark-submit, which sets it)", "URL"),
    Option("trigger_interval", _trigger, "0 milliseconds",
           "micro-batch interval; 0 runs batches back to back while there is input (an idle job runs none)", "DURATION"),
    Option("partitions", _positive_int, 2,
           "partitions of the topics the scheduler creates, and Spark shuffle partitions", "N"),
    Option("allowed_destinations", _regex, None,
           "regex a destination topic must fully match; default: any topic except Kafka-internal "
           "'__*' topics and the app's own topics", "REGEX"),
    Option("max_value_bytes", _positive_int, 1_000_000, "largest accepted request value, in bytes", "BYTES"),
    Option("max_ahead_days", _positive_int, 36_525, "how far ahead a due time may be (default 100 years)", "DAYS"),
    Option("history", _bool, False, "write one record per delivery to <app-id>-schedule-history", "BOOL"),
    Option("max_requests_per_batch", _positive_int, 500_000,
           "cap on request records read per micro-batch: bounds memory and batch time when catching up", "N"),
    Option("driver_memory", str, "1g", "Spark driver JVM heap (local mode: also the executor's)", "SIZE"),
    Option("lookahead", _duration_ms, 3000,
           "prepare deliveries this long before they are due; the driver's timed writer writes each at its due "
           "instant (a replace or cancel read before then still withdraws it). 0 writes each from the first "
           "micro-batch after its due time", "DURATION"),
    Option("max_held", _positive_int, 20_000,
           "most prepared deliveries the timed writer holds in memory; beyond it a batch writes its deliveries "
           "itself, each slice at its due time", "N"),
    Option("exactly_once", _bool, False,
           "write deliveries, write-backs and rejections in Kafka transactions, each once even across crashes, "
           "for consumers reading with isolation.level=read_committed (the app's ledger topic records what was "
           "written)", "BOOL"),
    Option("metrics_port", _port, 9464,
           "serve Prometheus metrics at http://<metrics-host>:<port>/metrics; 0 turns them off", "PORT"),
    Option("metrics_host", str, "0.0.0.0", "address the metrics server listens on", "HOST"),
    Option("state_layout", _choice("wheel"), "wheel",
           "how pending schedules are kept: 'wheel' (time buckets per shard, bulk; the only layout since the "
           "per-id one was retired); recorded in the checkpoint", "LAYOUT"),
    Option("shards", _positive_int, None,
           "state shards of the wheel layout (default: twice --partitions); fixed in the checkpoint at its first run",
           "N"),
)


@dataclass(frozen=True)
class Config:
    bootstrap_servers: str = "127.0.0.1:9092"
    inputs: Optional[tuple[tuple[str, str], ...]] = None  # (topic, dialect); None: the native requests topic
    app_id: str = "kafka-scheduler"
    checkpoint_dir: Optional[str] = None
    master: str = "local[2]"
    trigger_interval: str = "0 milliseconds"
    partitions: int = 2
    allowed_destinations: Optional[str] = None
    max_value_bytes: int = 1_000_000
    max_ahead_days: int = 36_525
    history: bool = False
    max_requests_per_batch: Optional[int] = 500_000
    driver_memory: str = "1g"
    lookahead: int = 3000  # milliseconds
    max_held: int = 20_000
    exactly_once: bool = False
    metrics_port: int = 9464  # 0: no metrics server
    metrics_host: str = "0.0.0.0"
    state_layout: str = "wheel"
    shards: Optional[int] = None  # None: twice the partitions
    # (option name, "--flag" or "KAFKA_SCHEDULER_<NAME>") of each option set explicitly: settings recorded in the
    # checkpoint may replace a default, never an explicit choice (checkpoint.settle_state_settings).
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
        """Wake-up ticks the driver writes for itself (timed_writer.Wakeups)."""
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

    def given_by(self, name: str) -> Optional[str]:
        """The flag or variable that set option ``name``, or None if it has its default."""
        return dict(self.given).get(name)

    def describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                         if f.name not in ("given", "catch_up_first"))


def env_name(option: Option) -> str:
    return ENV_PREFIX + option.name.upper()


def add_arguments(parser: argparse.ArgumentParser, names: Optional[set[str]] = None) -> None:
    """Add a ``--flag`` per option (all of them, or those in ``names``); defaults stay None to see what was set."""
    for option in OPTIONS:
        if names is not None and option.name not in names:
            continue
        default = "none" if option.default is None else option.default
        # A yes/no option given alone means yes: --exactly-once is --exactly-once=true.
        switch = {"nargs": "?", "const": "true"} if option.parse is _bool else {}
        parser.add_argument(
            option.flag, dest=option.name, default=None, metavar=option.metavar or None,
            action="append" if option.repeatable else "store", **switch,
            help=f"{option.help} [env {env_name(option)}; default {default}]")


def resolve(args: Optional[argparse.Namespace] = None, environ: Optional[dict[str, str]] = None) -> Config:
    """Build a Config from parsed flags, then the environment, then defaults."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    given: list[tuple[str, str]] = []
    for option in OPTIONS:
        raw = getattr(args, option.name, None) if args is not None else None
        if isinstance(raw, list):
            raw = ",".join(raw)
        source = option.flag
        if raw is None and env_name(option) in environ:
            raw, source = environ[env_name(option)], env_name(option)
        if raw is None:
            values[option.name] = option.default
            continue
        try:
            values[option.name] = option.parse(raw)
        except (ValueError, re.error) as exc:
            raise ConfigError(f"{source}: {exc}") from None
        given.append((option.name, source))
    return Config(**values, given=tuple(given))
