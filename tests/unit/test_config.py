"""Settings: flag > KAFKA_SCHEDULER_<NAME> variable > default, and the value parsers."""

from __future__ import annotations

import argparse
import os
from dataclasses import fields

import pytest

from kafka_scheduler.config import OPTIONS, Config, ConfigError, add_arguments, env_name, resolve


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_with_no_flags_and_no_environment():
    config = resolve(parse(), environ={})
    assert config == Config()
    assert config.bootstrap_servers == "127.0.0.1:9092"
    assert config.app_id == "kafka-scheduler"
    assert config.partitions == 2
    assert config.trigger_interval == "0 milliseconds"
    assert config.history is False
    assert config.allowed_destinations is None
    assert config.max_value_bytes == 1_000_000
    assert config.max_ahead_days == 36_525
    assert config.max_requests_per_batch == 500_000
    assert config.lookahead == 30_000 and config.max_held == 100_000
    assert config.state_layout == "wheel" and config.shards == 4


def test_the_defaults_are_the_options_and_config_cannot_disagree():
    """Each default is defined once, in OPTIONS; Config's field defaults are read from there."""
    own = ("given", "catch_up_first")  # not options: what resolve() found, and the job's start-up state
    assert {f.name: f.default for f in fields(Config) if f.name not in own} == {o.name: o.default for o in OPTIONS}


def test_resolve_without_namespace_uses_environment():
    config = resolve(None, environ={"KAFKA_SCHEDULER_PARTITIONS": "7"})
    assert config.partitions == 7


def test_flags_default_to_none_so_unset_flags_are_visible():
    args = parse()
    for option in OPTIONS:
        assert getattr(args, option.name) is None


def test_env_names():
    names = {option.name: env_name(option) for option in OPTIONS}
    assert names["bootstrap_servers"] == "KAFKA_SCHEDULER_BOOTSTRAP_SERVERS"
    assert names["max_ahead_days"] == "KAFKA_SCHEDULER_MAX_AHEAD_DAYS"


def test_environment_overrides_default():
    config = resolve(
        parse(),
        environ={
            "KAFKA_SCHEDULER_BOOTSTRAP_SERVERS": "kafka:9093",
            "KAFKA_SCHEDULER_PARTITIONS": "4",
            "KAFKA_SCHEDULER_HISTORY": "yes",
            "KAFKA_SCHEDULER_TRIGGER_INTERVAL": "1 second",
        },
    )
    assert config.bootstrap_servers == "kafka:9093"
    assert config.partitions == 4
    assert config.history is True
    assert config.trigger_interval == "1000 milliseconds"


def test_flag_overrides_environment():
    args = parse("--bootstrap-servers", "flag:1", "--partitions", "3", "--history", "false")
    config = resolve(
        args,
        environ={
            "KAFKA_SCHEDULER_BOOTSTRAP_SERVERS": "env:2",
            "KAFKA_SCHEDULER_PARTITIONS": "9",
            "KAFKA_SCHEDULER_HISTORY": "true",
            "KAFKA_SCHEDULER_MAX_VALUE_BYTES": "500",
        },
    )
    assert config.bootstrap_servers == "flag:1"
    assert config.partitions == 3
    assert config.history is False
    assert config.max_value_bytes == 500  # no flag: the environment still applies


def test_flag_wins_even_when_environment_value_is_bad():
    config = resolve(parse("--partitions", "5"), environ={"KAFKA_SCHEDULER_PARTITIONS": "zero"})
    assert config.partitions == 5


def test_resolve_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("KAFKA_SCHEDULER_APP_ID", "from-os-env")
    assert resolve(parse()).app_id == "from-os-env"
    assert resolve(parse("--app-id", "from-flag")).app_id == "from-flag"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0s", "0 milliseconds"),
        ("250ms", "250 milliseconds"),
        ("1 second", "1000 milliseconds"),
        ("2 seconds", "2000 milliseconds"),
        ("2m", "120000 milliseconds"),
        ("1 minute", "60000 milliseconds"),
        ("0.5s", "500 milliseconds"),
        ("100 milliseconds", "100 milliseconds"),
        (" 3S ", "3000 milliseconds"),
    ],
)
def test_trigger_interval(text, expected):
    assert resolve(parse("--trigger-interval", text), environ={}).trigger_interval == expected
    assert resolve(parse(), environ={"KAFKA_SCHEDULER_TRIGGER_INTERVAL": text}).trigger_interval == expected


@pytest.mark.parametrize(
    "argv",
    [
        ("--trigger-interval", "soon"),
        ("--trigger-interval", "5h"),
        ("--trigger-interval=-1s",),
        ("--partitions", "0"),
        ("--partitions", "-2"),
        ("--partitions", "two"),
        ("--max-value-bytes", "0"),
        ("--max-ahead-days", "1.5"),
        ("--max-requests-per-batch", "0"),
        ("--history", "maybe"),
        ("--allowed-destinations", "orders-("),
    ],
)
def test_bad_flag_values_name_the_flag(argv):
    with pytest.raises(ConfigError) as error:
        resolve(parse(*argv), environ={})
    flag = argv[0].split("=")[0]
    assert str(error.value).startswith(flag + ":"), str(error.value)


@pytest.mark.parametrize(
    "name,value",
    [
        ("KAFKA_SCHEDULER_TRIGGER_INTERVAL", "soon"),
        ("KAFKA_SCHEDULER_PARTITIONS", "0"),
        ("KAFKA_SCHEDULER_HISTORY", "maybe"),
        ("KAFKA_SCHEDULER_ALLOWED_DESTINATIONS", "[unclosed"),
        ("KAFKA_SCHEDULER_MAX_VALUE_BYTES", "1e3"),
    ],
)
def test_bad_environment_values_name_the_variable(name, value):
    with pytest.raises(ConfigError) as error:
        resolve(parse(), environ={name: value})
    assert str(error.value).startswith(name + ":"), str(error.value)
    assert "--" not in str(error.value).split(":")[0]


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("app_id", ["", "has space", "slash/ed", "x" * 201, "ünï"])
def test_bad_app_id(app_id):
    with pytest.raises(ConfigError, match="app id"):
        resolve(parse("--app-id", app_id), environ={})


@pytest.mark.parametrize("app_id", ["a", "my_app.v2-prod", "x" * 200])
def test_good_app_id(app_id):
    assert resolve(parse("--app-id", app_id), environ={}).app_id == app_id


def test_default_checkpoint_dir_follows_app_id():
    assert resolve(parse("--app-id", "billing"), environ={}).checkpoint_dir == os.path.join("checkpoints", "billing")
    assert Config().checkpoint_dir == os.path.join("checkpoints", "kafka-scheduler")


def test_explicit_checkpoint_dir_is_kept():
    config = resolve(parse("--app-id", "billing"), environ={"KAFKA_SCHEDULER_CHECKPOINT_DIR": "/data/ckpt"})
    assert config.checkpoint_dir == "/data/ckpt"


def test_topic_names():
    config = resolve(parse("--app-id", "billing"), environ={})
    assert config.requests_topic == "billing-schedule-requests"
    assert config.rejections_topic == "billing-schedule-rejections"
    assert config.history_topic == "billing-schedule-history"
    assert config.ticks_topic == "billing-scheduler-ticks"
    assert config.ledger_topic == "billing-schedule-ledger"
    assert config.own_topics == (
        "billing-schedule-requests",
        "billing-schedule-rejections",
        "billing-schedule-history",
        "billing-scheduler-ticks",
        "billing-schedule-ledger",
    )


def test_a_yes_no_flag_alone_means_yes():
    assert resolve(parse("--exactly-once"), environ={}).exactly_once
    assert not resolve(parse("--exactly-once", "false"), environ={}).exactly_once
    assert resolve(parse(), environ={"KAFKA_SCHEDULER_EXACTLY_ONCE": "true"}).exactly_once
    assert not resolve(parse(), environ={}).exactly_once


def test_allowed_destinations_is_kept_verbatim():
    assert (
        resolve(parse("--allowed-destinations", "orders-.*|payments"), environ={}).allowed_destinations
        == "orders-.*|payments"
    )


def test_add_arguments_subset():
    parser = argparse.ArgumentParser()
    add_arguments(parser, names={"app_id", "partitions"})
    args = parser.parse_args(["--app-id", "a1", "--partitions", "6"])
    assert vars(args) == {"app_id": "a1", "partitions": "6"}
    with pytest.raises(SystemExit):
        parser.parse_args(["--history", "true"])


def test_describe_lists_every_setting():
    text = Config(app_id="billing").describe()
    for option in OPTIONS:
        assert option.name + "=" in text
    assert "app_id=billing" in text


def test_resolve_records_which_options_were_given_and_where():
    config = resolve(
        parse("--partitions", "3", "--shards", "5"),
        environ={"KAFKA_SCHEDULER_STATE_LAYOUT": "wheel", "KAFKA_SCHEDULER_SHARDS": "9"},
    )
    assert config.given_by("partitions") == "--partitions"
    assert config.given_by("shards") == "--shards"  # the flag wins, and is what gets named
    assert config.given_by("state_layout") == "KAFKA_SCHEDULER_STATE_LAYOUT"
    assert config.given_by("app_id") is None
    assert resolve(parse(), environ={}).given == ()


def test_shards_default_to_twice_the_partitions_unless_given():
    assert resolve(parse("--partitions", "3"), environ={}).shards == 6
    assert resolve(parse("--partitions", "3", "--shards", "5"), environ={}).shards == 5


def test_how_an_option_was_given_changes_neither_equality_nor_describe():
    given = resolve(parse("--app-id", "billing"), environ={})
    assert given == Config(app_id="billing")
    assert "given" not in given.describe()


def test_a_jvm_of_the_job_out_of_heap_exits_instead_of_hanging():
    from kafka_scheduler.engine.spark.session import spark_settings

    settings = spark_settings(resolve(parse(), environ={}))
    for side in ("driver", "executor"):
        assert "-XX:+ExitOnOutOfMemoryError" in settings[f"spark.{side}.extraJavaOptions"].split()


def test_the_jvms_of_the_job_compile_with_c2_only_code_hotter_than_by_default():
    """The thresholds of tier 4 raised (session.LATE_C2): a start's short-lived hot code is left to C1."""
    from kafka_scheduler.engine.spark.session import spark_settings

    settings = spark_settings(resolve(parse(), environ={}))
    for side in ("driver", "executor"):
        options = dict(o.split("=", 1) for o in settings[f"spark.{side}.extraJavaOptions"].split() if "=" in o)
        assert int(options["-XX:Tier4InvocationThreshold"]) > 5000  # HotSpot's default
        assert int(options["-XX:Tier4CompileThreshold"]) > 15000
        assert int(options["-XX:Tier4BackEdgeThreshold"]) > 40000


def test_the_state_stores_share_one_bounded_memory_budget():
    from kafka_scheduler.engine.spark.session import ROCKSDB_MEMORY_MB, spark_settings

    settings = spark_settings(resolve(parse(), environ={}))
    assert settings["spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage"] == "true"
    assert settings["spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB"] == str(ROCKSDB_MEMORY_MB)
    assert settings["spark.executorEnv.MALLOC_ARENA_MAX"] == "2"


def test_the_decode_runs_compiled_and_the_state_step_skips_the_arrow_size_check():
    """Two settings that made ingest 1.5x faster (docs/measurements.md): without them the decode's generated method
    is too big for the JIT, and Spark sizes each Arrow batch again after every row it sends to the state step."""
    from kafka_scheduler.engine.spark.session import spark_settings

    settings = spark_settings(resolve(parse(), environ={}))
    assert int(settings["spark.sql.codegen.hugeMethodLimit"]) <= 8000  # HotSpot's HugeMethodLimit
    assert settings["spark.sql.execution.arrow.maxBytesPerBatch"] == str(2**31 - 1)  # Spark's "unbounded"


def test_spark_keeps_every_class_a_job_generates():
    """A job's query and sink generate more classes than Spark's default cache of 100 holds: with it, every batch
    compiled ~23 of them again (docs/measurements.md, "The batch cycle on a slow day")."""
    from kafka_scheduler.engine.spark.session import spark_settings

    assert int(spark_settings(resolve(parse(), environ={}))["spark.sql.codegen.cache.maxEntries"]) >= 500


def test_the_state_retention_settings_reach_spark():
    from kafka_scheduler.engine.spark.session import spark_settings

    assert spark_settings(resolve(parse(), environ={}))["spark.sql.streaming.minBatchesToRetain"] == "20"
    assert spark_settings(resolve(parse(), environ={}))["spark.sql.streaming.stateStore.minDeltasForSnapshot"] == "10"
    kept = spark_settings(resolve(parse("--state-batches-kept", "3", "--state-snapshot-every", "4"), environ={}))
    assert kept["spark.sql.streaming.minBatchesToRetain"] == "3"
    assert kept["spark.sql.streaming.stateStore.minDeltasForSnapshot"] == "4"
    with pytest.raises(ConfigError, match="--state-batches-kept"):
        resolve(parse("--state-batches-kept", "0"), environ={})
