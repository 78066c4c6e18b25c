"""Settings from a TOML file (--config) and Kafka client options: precedence, parsing, masking, errors."""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from pathlib import Path

import pytest

from kafka_scheduler.cli.config_show import as_json, as_toml
from kafka_scheduler.cli.main import main
from kafka_scheduler.config import (
    ConfigError,
    add_arguments,
    check_kafka_settings,
    is_secret,
    kafka_settings,
    resolve,
    spark_kafka_options,
)

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def toml_file(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "settings.toml"
        path.write_text(text)
        return str(path)

    return write


# ---------------------------------------------------------------- precedence


def test_flag_over_environment_over_file_over_default(toml_file):
    path = toml_file('app-id = "from-file"\npartitions = 3\nmax_held = 7\nhistory = true\n')
    config = resolve(
        parse("--config", path, "--app-id", "from-flag"),
        environ={"KAFKA_SCHEDULER_APP_ID": "from-env", "KAFKA_SCHEDULER_PARTITIONS": "5"},
    )
    assert config.app_id == "from-flag"  # flag > env > file
    assert config.partitions == 5  # env > file
    assert config.max_held == 7 and config.history is True  # file > default
    assert config.max_value_bytes == 1_000_000  # default
    assert config.given_by("app_id") == "--app-id"
    assert config.given_by("partitions") == "KAFKA_SCHEDULER_PARTITIONS"
    assert config.given_by("max_held") == f"max_held in {path}"
    assert config.given_by("max_value_bytes") is None


def test_the_file_can_come_from_the_environment(toml_file):
    path = toml_file("partitions = 3\n")
    assert resolve(parse(), environ={"KAFKA_SCHEDULER_CONFIG": path}).partitions == 3
    assert resolve(parse(), environ={}).partitions == 2


def test_kafka_options_merge_key_by_key_in_precedence_order(toml_file):
    path = toml_file('[kafka]\n"client.id" = "file"\n"linger.ms" = 10\nsecurity.protocol = "SASL_SSL"\n')
    config = resolve(
        parse("--config", path, "--kafka-option", "client.id=flag"),
        environ={"KAFKA_SCHEDULER_KAFKA_OPTIONS": "client.id=env,linger.ms=20,socket.timeout.ms=9000"},
    )
    assert dict(config.kafka_options) == {
        "client.id": "flag",
        "linger.ms": "20",
        "security.protocol": "SASL_SSL",
        "socket.timeout.ms": "9000",
    }
    assert config.given_by("kafka.client.id") == "--kafka-option"
    assert config.given_by("kafka.linger.ms") == "KAFKA_SCHEDULER_KAFKA_OPTIONS"
    assert config.given_by("kafka.security.protocol") == f"kafka in {path}"


def test_a_file_value_counts_as_an_explicit_choice_for_the_checkpoint(toml_file):
    from kafka_scheduler.engine.spark.checkpoint import _shown

    path = toml_file("shards = 6\n")
    config = resolve(parse("--config", path), environ={})
    assert _shown(config, "shards") == f"shards = 6 in {path}"


# ---------------------------------------------------------------- the variable and the flag


def test_environment_kafka_options_split_on_commas_or_on_newlines():
    env = {"KAFKA_SCHEDULER_KAFKA_OPTIONS": " client.id=a , linger.ms=5,"}
    assert dict(resolve(None, environ=env).kafka_options) == {"client.id": "a", "linger.ms": "5"}
    env = {"KAFKA_SCHEDULER_KAFKA_OPTIONS": "java.ssl.cipher.suites=A,B\nclient.id=a=b\n"}
    assert dict(resolve(None, environ=env).kafka_options) == {"java.ssl.cipher.suites": "A,B", "client.id": "a=b"}


def test_a_flag_value_may_hold_commas_and_equals_signs():
    config = resolve(
        parse("--kafka-option", "java.ssl.cipher.suites=A,B", "--kafka-option", "client.id=x=y"), environ={}
    )
    assert dict(config.kafka_options) == {"java.ssl.cipher.suites": "A,B", "client.id": "x=y"}


# ---------------------------------------------------------------- the file


def test_file_values_take_toml_types_and_either_spelling(toml_file):
    path = toml_file(
        'bootstrap-servers = "k1:9093,k2:9093"\ninput = ["orders:karafka", "raw:native"]\n'
        'lookahead = "2s"\ntrigger_interval = "250ms"\nexactly-once = true\nmax-ahead-days = 10\n'
        'allowed_destinations = "orders-.*"\n'
    )
    config = resolve(parse("--config", path), environ={})
    assert config.bootstrap_servers == "k1:9093,k2:9093"
    assert config.inputs == (("orders", "karafka"), ("raw", "native"))
    assert config.lookahead == 2000 and config.trigger_interval == "250 milliseconds"
    assert config.exactly_once is True and config.max_ahead_days == 10
    assert config.allowed_destinations == "orders-.*"


def test_kafka_table_takes_dotted_keys_quoted_or_not(toml_file):
    path = toml_file(
        '[kafka]\nsecurity.protocol = "SASL_SSL"\n"sasl.mechanism" = "PLAIN"\nlinger.ms = 5\n'
        'enable.ssl.certificate.verification = false\n[kafka.librdkafka]\nsasl.username = "u"\n'
    )
    assert dict(resolve(parse("--config", path), environ={}).kafka_options) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "linger.ms": "5",
        "enable.ssl.certificate.verification": "false",
        "librdkafka.sasl.username": "u",
    }


def test_the_readme_example_file_is_valid(tmp_path):
    example = README.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "reminders.toml"
    path.write_text(example)
    config = resolve(parse("--config", str(path)), environ={})
    assert config.app_id == "reminders" and config.exactly_once
    assert kafka_settings(config)["sasl.username"] == "scheduler"
    assert spark_kafka_options(config)["kafka.ssl.truststore.type"] == "PEM"


# ---------------------------------------------------------------- errors: one message naming the setting


@pytest.mark.parametrize(
    "text, message",
    [
        ("partitionz = 3\n", "unknown setting 'partitionz' (did you mean partitions?)"),
        ("partitions = -3\n", "partitions in {path}: must be a positive integer, got '-3'"),
        ("partitions = true\n", "partitions in {path}: must be a positive integer"),
        ("partitions = [1, 2]\n", "partitions in {path}: expected a string, number or true/false"),
        ('history = "maybe"\n', "history in {path}: expected true or false, got 'maybe'"),
        ("lookahead = 3000\n", "lookahead in {path}: expected a duration"),
        ('inputs = ["orders:kaspr"]\n', "inputs in {path}: unknown dialect 'kaspr'"),
        ("app_id = 1979-05-27\n", "app_id in {path}: expected a string, number or true/false, got date"),
        ("[master]\nx = 1\n", "master in {path}: expected a single value, got a table"),
        ('kafka = "acks=1"\n', "kafka in {path}: expected a table of Kafka options"),
        ("[kafka]\nacks = 1\n", "[kafka] in {path}: 'acks' cannot be set: deliveries are written with acks=all"),
        ('[kafka]\nbootstrap.servers = "x:1"\n', "'bootstrap.servers' cannot be set: use --bootstrap-servers"),
        ('input = ["a:native"]\ninputs = ["b:native"]\n', "'inputs' is given twice"),
        ("partitions = \n", "not valid TOML"),
    ],
)
def test_bad_file_settings_name_the_setting(toml_file, text, message):
    path = toml_file(text)
    with pytest.raises(ConfigError) as error:
        resolve(parse("--config", path), environ={})
    assert message.format(path=path) in str(error.value)


def test_missing_file():
    with pytest.raises(ConfigError, match="--config /no/such.toml: No such file or directory"):
        resolve(parse("--config", "/no/such.toml"), environ={})


@pytest.mark.parametrize(
    "argv, environ, message",
    [
        (["--kafka-option", "linger.ms"], {}, "--kafka-option: expected KEY=VALUE, got 'linger.ms'"),
        (["--kafka-option", "=5"], {}, "--kafka-option: expected KEY=VALUE"),
        (["--kafka-option", "bad key=5"], {}, "'bad key' is not a Kafka client option name"),
        (["--kafka-option", "java.=5"], {}, "give the option after the scope"),
        (["--kafka-option", "java.group.id=g"], {}, "'java.group.id' cannot be set"),
        (
            [],
            {"KAFKA_SCHEDULER_KAFKA_OPTIONS": "client.id=a,oops"},
            "KAFKA_SCHEDULER_KAFKA_OPTIONS: expected KEY=VALUE",
        ),
    ],
)
def test_bad_kafka_options_name_the_setting(argv, environ, message):
    with pytest.raises(ConfigError) as error:
        resolve(parse(*argv), environ=environ)
    assert message in str(error.value)


def test_librdkafka_judges_values_and_names_at_start():
    with pytest.raises(ConfigError, match='Invalid value "BOGUS" for configuration property "security.protocol"'):
        check_kafka_settings(resolve(parse("--kafka-option", "security.protocol=BOGUS"), environ={}))
    with pytest.raises(ConfigError, match=r'No such configuration property: "ssl.truststore.type" .*prefix it java\.'):
        check_kafka_settings(resolve(parse("--kafka-option", "ssl.truststore.type=PEM"), environ={}))
    with pytest.raises(ConfigError, match=r"JAAS configuration is not supported.*prefix it java\."):
        check_kafka_settings(resolve(parse("--kafka-option", "sasl.jaas.config=x"), environ={}))
    check_kafka_settings(
        resolve(
            parse(
                "--kafka-option",
                "java.sasl.jaas.config=x",
                "--kafka-option",
                "security.protocol=SASL_SSL",
                "--kafka-option",
                "sasl.mechanism=PLAIN",
                "--kafka-option",
                "librdkafka.sasl.username=u",
                "--kafka-option",
                "librdkafka.sasl.password=p",
            ),
            environ={},
        )
    )


@pytest.mark.parametrize("command", ["run", "config show", "schedule --to t --at +1s", "cancel --id x"])
def test_cli_exits_2_with_one_line(capsys, toml_file, command):
    path = toml_file("partitions = 0\n")
    assert main([*command.split(), "--config", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"partitions in {path}: must be a positive integer" in err


# ---------------------------------------------------------------- where the options go


def test_scoped_options_reach_only_their_clients():
    config = resolve(
        parse(
            "--bootstrap-servers",
            "k:9093",
            "--kafka-option",
            "security.protocol=SSL",
            "--kafka-option",
            "librdkafka.ssl.ca.location=/ca.pem",
            "--kafka-option",
            "java.ssl.truststore.location=/ca.pem",
            "--kafka-option",
            "java.security.protocol=SASL_SSL",
        ),
        environ={},
    )
    assert kafka_settings(config) == {
        "bootstrap.servers": "k:9093",
        "security.protocol": "SSL",
        "ssl.ca.location": "/ca.pem",
    }
    assert spark_kafka_options(config) == {
        "kafka.bootstrap.servers": "k:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.ssl.truststore.location": "/ca.pem",
    }


# ---------------------------------------------------------------- masking and config show


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "librdkafka.sasl.password",
        "java.sasl.jaas.config",
        "ssl.key.password",
        "ssl.key.pem",
        "java.ssl.keystore.key",
        "ssl.key.location",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.token.endpoint.url",
        "SSL.KEYSTORE.PASSWORD",
    ],
)
def test_secrets(key):
    assert is_secret(key)


@pytest.mark.parametrize(
    "key", ["sasl.username", "security.protocol", "ssl.ca.location", "client.id", "ssl.keystore.location"]
)
def test_not_secrets(key):
    assert not is_secret(key)


SECRET_ARGS = (
    "--kafka-option",
    "librdkafka.sasl.password=hunter2",
    "--kafka-option",
    'java.sasl.jaas.config=PlainLoginModule required password="hunter2";',
    "--kafka-option",
    "sasl.username=alice",
)


def test_show_masks_secrets_and_names_sources(toml_file):
    path = toml_file('partitions = 3\n[kafka]\n"client.id" = "c"\n')
    config = resolve(
        parse("--config", path, "--app-id", "billing", *SECRET_ARGS), environ={"KAFKA_SCHEDULER_MAX_HELD": "9"}
    )
    for text in (as_toml(config), as_json(config), config.describe()):
        assert "hunter2" not in text and "****" in text and "alice" in text
    shown = json.loads(as_json(config))
    assert shown["settings"]["kafka"]["librdkafka.sasl.password"] == "****"
    assert shown["settings"]["partitions"] == 3 and shown["settings"]["shards"] == 6
    assert shown["sources"]["app_id"] == "flag --app-id"
    assert shown["sources"]["max_held"] == "env KAFKA_SCHEDULER_MAX_HELD"
    assert shown["sources"]["partitions"] == f"file {path}"
    assert shown["sources"]["kafka.client.id"] == f"file {path}"
    assert shown["sources"]["shards"] == "default"
    toml = as_toml(config)
    assert 'app_id = "billing"  # flag --app-id' in toml
    assert re.search(r"^# shards = 6  # default$", toml, re.M)


def test_show_toml_is_a_config_file_that_gives_the_same_settings(tmp_path):
    config = resolve(
        parse(
            "--app-id",
            "billing",
            "--input",
            "orders:karafka",
            "--input",
            "raw:native",
            "--lookahead",
            "1.5s",
            "--trigger-interval",
            "1 second",
            "--history",
            "--allowed-destinations",
            'a"b\\.*',
            "--kafka-option",
            "client.id=é,x",
            "--kafka-option",
            "java.ssl.truststore.type=PEM",
        ),
        environ={},
    )
    path = tmp_path / "shown.toml"
    path.write_text(as_toml(config))
    tomllib.loads(path.read_text())
    again = resolve(parse("--config", str(path)), environ={})
    assert again == config
    assert {name for name, _ in again.given} == {name for name, _ in config.given}


def test_config_show_command(capsys, toml_file):
    path = toml_file("partitions = 3\n")
    assert main(["config", "show", "--config", path, "--format", "json", *SECRET_ARGS]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["settings"]["partitions"] == 3
    assert shown["settings"]["kafka"]["java.sasl.jaas.config"] == "****"
