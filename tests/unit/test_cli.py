"""The ``kafka-scheduler`` command, in-process: help, and one-line errors for bad input (no Kafka needed)."""

from __future__ import annotations

import pytest

from kafka_scheduler import __version__
from kafka_scheduler.cli.main import main

# Nothing listens here: a command that got as far as talking to Kafka could not succeed.
NO_KAFKA = ("--bootstrap-servers", "127.0.0.1:1")


def run(capsys, argv):
    """Exit code, stdout and stderr of ``kafka-scheduler argv`` (argparse exits become codes)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, command: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert err.endswith("\n")
    assert "Traceback" not in err
    assert "usage:" not in err
    line = lines[0]
    assert line.startswith(f"kafka-scheduler {command}: error: "), line
    return line


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out, err = capsys.readouterr()
    assert err == ""
    for command in ("run", "submit", "broker", "demo", "schedule", "replace", "cancel"):
        assert f"  {command} " in out, command
    assert "KAFKA_SCHEDULER_" in out


@pytest.mark.parametrize("command", ["run", "submit", "schedule", "replace", "cancel", "broker", "demo"])
def test_subcommand_help(capsys, command):
    code, out, err = run(capsys, [command, "--help"])
    assert code == 0
    assert out.startswith(f"usage: kafka-scheduler {command}")
    assert err == ""


def test_run_help_shows_env_names(capsys):
    code, out, _ = run(capsys, ["run", "--help"])
    assert code == 0
    assert "--trigger-interval" in out
    assert "KAFKA_SCHEDULER_TRIGGER_INTERVAL" in out


def test_version(capsys):
    code, out, _ = run(capsys, ["--version"])
    assert code == 0
    assert out.strip() == f"kafka-scheduler {__version__}"


def test_no_command_prints_help_and_fails(capsys):
    code, out, _ = run(capsys, [])
    assert code == 2
    assert "schedule" in out and "usage:" in out


def test_unknown_command_is_one_line(capsys):
    code, out, err = run(capsys, ["launch"])
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "launch" in lines[0], err


def test_schedule_without_at(capsys):
    code, out, err = run(capsys, ["schedule", "--to", "x"])
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "error" in lines[0] and "--at" in lines[0]
    assert "Traceback" not in err


def test_schedule_zoneless_at_fails_with_one_line(capsys):
    code, out, err = run(capsys, ["schedule", "--at", "2026-01-01T00:00:00", "--to", "x", *NO_KAFKA])
    assert code == 2
    assert out == ""
    line = one_line_error(err, "schedule")
    assert "time zone" in line
    assert "2026-01-01T00:00:00" in line
    # the error is about the time, not about an unreachable broker
    assert "127.0.0.1:1" not in line and "unreachable" not in line.lower()


@pytest.mark.parametrize("at", ["tomorrow", "2026-02-30T10:00:00Z", "+5x"])
def test_schedule_unreadable_at_fails_with_one_line(capsys, at):
    code, out, err = run(capsys, ["schedule", "--at", at, "--to", "x", *NO_KAFKA])
    assert code == 2
    assert out == ""
    line = one_line_error(err, "schedule")
    assert "cannot read due time" in line and at in line


def test_run_with_zero_partitions(capsys):
    code, out, err = run(capsys, ["run", "--partitions", "0"])
    assert code == 2
    assert out == ""
    line = one_line_error(err, "run")
    assert "--partitions" in line


def test_run_with_bad_environment_value_names_the_variable(capsys, monkeypatch):
    monkeypatch.setenv("KAFKA_SCHEDULER_TRIGGER_INTERVAL", "soon")
    code, _, err = run(capsys, ["run"])
    assert code == 2
    line = one_line_error(err, "run")
    assert "KAFKA_SCHEDULER_TRIGGER_INTERVAL" in line


def test_run_with_bad_app_id(capsys):
    code, _, err = run(capsys, ["run", "--app-id", "no spaces allowed"])
    assert code == 2
    assert "app id" in one_line_error(err, "run")


def test_replace_without_id(capsys):
    code, out, err = run(capsys, ["replace", "--to", "x", "--at", "+1m", *NO_KAFKA])
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "error" in lines[0] and "--id" in lines[0]


def test_cancel_without_id(capsys):
    code, _, err = run(capsys, ["cancel", *NO_KAFKA])
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and "--id" in lines[0], err


@pytest.mark.parametrize("header", ["novalue", "=value"])
def test_schedule_with_malformed_header(capsys, header):
    code, out, err = run(capsys, ["schedule", "--to", "x", "--at", "+1m", "--header", header, *NO_KAFKA])
    assert code == 2
    assert out == ""
    line = one_line_error(err, "schedule")
    assert "--header" in line and "NAME=VALUE" in line


def test_schedule_with_reserved_header(capsys):
    code, _, err = run(
        capsys, ["schedule", "--to", "x", "--at", "+1m", "--header", "X-Scheduler-Action=CANCEL", *NO_KAFKA]
    )
    assert code == 2
    assert "reserved" in one_line_error(err, "schedule")


def test_value_and_value_file_are_exclusive(capsys, tmp_path):
    path = tmp_path / "v.bin"
    path.write_bytes(b"\x00")
    code, _, err = run(
        capsys, ["schedule", "--to", "x", "--at", "+1m", "--value", "a", "--value-file", str(path), *NO_KAFKA]
    )
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and "not allowed with" in lines[0], err


def test_missing_value_file_is_one_line(capsys, tmp_path):
    missing = tmp_path / "nope.bin"
    code, _, err = run(capsys, ["schedule", "--to", "x", "--at", "+1m", "--value-file", str(missing), *NO_KAFKA])
    assert code == 2
    line = one_line_error(err, "schedule")
    assert "--value-file" in line and str(missing) in line


# ---------------------------------------------------------------- dialects


@pytest.mark.parametrize("command", ["schedule", "replace", "cancel"])
def test_client_commands_explain_the_dialects(capsys, command):
    code, out, _ = run(capsys, [command, "--help"])
    assert code == 0
    for text in (
        "--dialect",
        "--requests-topic",
        "KAFKA_SCHEDULER_DIALECT",
        "karafka",
        "etf1",
        "sky-avro",
        "sky-json",
        "rounded up",
    ):
        assert text in out, text
    assert ("--partition-key" in out) == (command != "cancel")


@pytest.mark.parametrize(
    "argv",
    [
        ["schedule", "--to", "x", "--at", "+1m", "--id", "r-1", "--dialect", "karafka"],
        ["replace", "--to", "x", "--at", "+1m", "--id", "r-1", "--value", "v", "--dialect", "etf1"],
        ["cancel", "--id", "r-1", "--dialect", "sky-json"],
    ],
)
def test_other_dialects_need_a_requests_topic(capsys, argv):
    code, out, err = run(capsys, [*argv, *NO_KAFKA])
    assert code == 2
    assert out == ""
    line = one_line_error(err, argv[0])
    assert "--requests-topic is required with --dialect" in line


def test_other_dialects_need_an_id(capsys):
    code, _, err = run(
        capsys,
        ["schedule", "--to", "x", "--at", "+1m", "--dialect", "sky-avro", "--requests-topic", "schedules", *NO_KAFKA],
    )
    assert code == 2
    assert "--id is required with --dialect sky-avro" in one_line_error(err, "schedule")


@pytest.mark.parametrize("dialect", ["native", "etf1", "sky-avro", "sky-json"])
@pytest.mark.parametrize("flag,value", [("--partition", "1"), ("--partition-key", "k")])
def test_partition_flags_are_karafka_only(capsys, dialect, flag, value):
    code, _, err = run(
        capsys,
        [
            "schedule",
            "--to",
            "x",
            "--at",
            "+1m",
            "--id",
            "r",
            "--value",
            "v",
            "--dialect",
            dialect,
            "--requests-topic",
            "s",
            flag,
            value,
            *NO_KAFKA,
        ],
    )
    assert code == 2
    line = one_line_error(err, "schedule")
    assert f"{flag} is only supported with --dialect karafka" in line


def test_negative_partition(capsys):
    code, _, err = run(
        capsys,
        [
            "schedule",
            "--to",
            "x",
            "--at",
            "+1m",
            "--id",
            "r",
            "--dialect",
            "karafka",
            "--requests-topic",
            "s",
            "--partition",
            "-1",
            *NO_KAFKA,
        ],
    )
    assert code == 2
    assert "--partition -1" in one_line_error(err, "schedule")


def test_unknown_dialect_flag(capsys):
    code, out, err = run(capsys, ["cancel", "--id", "r", "--dialect", "kaspr", *NO_KAFKA])
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and "--dialect" in lines[0] and "kaspr" in lines[0], err


def test_unknown_dialect_in_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("KAFKA_SCHEDULER_DIALECT", "kaspr")
    code, _, err = run(capsys, ["cancel", "--id", "r", *NO_KAFKA])
    assert code == 2
    assert "KAFKA_SCHEDULER_DIALECT='kaspr'" in one_line_error(err, "cancel")


def test_dialect_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("KAFKA_SCHEDULER_DIALECT", "etf1")
    code, _, err = run(capsys, ["cancel", "--id", "r", *NO_KAFKA])
    assert code == 2
    assert "--requests-topic is required with --dialect etf1" in one_line_error(err, "cancel")


@pytest.mark.parametrize(
    "dialect,header",
    [("karafka", "schedule_target_topic=y"), ("etf1", "Scheduler-Epoch=1"), ("sky-json", "x-scheduler-delivery-id=1")],
)
def test_dialect_reserved_header(capsys, dialect, header):
    code, _, err = run(
        capsys,
        [
            "schedule",
            "--to",
            "x",
            "--at",
            "+1m",
            "--id",
            "r",
            "--value",
            "v",
            "--dialect",
            dialect,
            "--requests-topic",
            "s",
            "--header",
            header,
            *NO_KAFKA,
        ],
    )
    assert code == 2
    line = one_line_error(err, "schedule")
    assert "reserved" in line and header.split("=")[0] in line


def test_etf1_needs_a_value(capsys):
    code, _, err = run(
        capsys,
        ["schedule", "--to", "x", "--at", "+1m", "--id", "r", "--dialect", "etf1", "--requests-topic", "s", *NO_KAFKA],
    )
    assert code == 2
    assert "null value" in one_line_error(err, "schedule")


@pytest.fixture
def produced(monkeypatch):
    """The records the commands produce, through a stand-in producer."""
    import kafka_scheduler.client.scheduler_client as client_module

    records = []

    class Producer:
        def __init__(self, config):
            self.config = config

        def list_topics(self, topic, timeout):
            from types import SimpleNamespace

            return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: None, 1: None})})

        def produce(self, topic, **kwargs):
            records.append({"topic": topic, "config": self.config, **kwargs})

        def poll(self, _timeout):
            return 0

        def flush(self, _timeout):
            return 0

    monkeypatch.setattr(client_module, "Producer", Producer)
    return records


def test_karafka_schedule_end_to_end(capsys, produced):
    code, out, err = run(
        capsys,
        [
            "schedule",
            "--to",
            "orders",
            "--at",
            "2026-05-24T12:30:00.250Z",
            "--id",
            "r-1",
            "--key",
            "k",
            "--value",
            "v",
            "--header",
            "trace=abc",
            "--dialect",
            "karafka",
            "--requests-topic",
            "schedules",
            "--partition",
            "4",
            "--partition-key",
            "pk",
        ],
    )
    assert (code, err) == (0, "")
    assert out == ("sent schedule id=r-1 (karafka on schedules): deliver to orders at 2026-05-24T12:30:01.000Z\n")
    (record,) = produced
    assert record["topic"] == "schedules"
    assert (record["key"], record["value"]) == (b"r-1", b"v")
    assert "partition" not in record and record["config"]["partitioner"] == "murmur2_random"
    assert record["headers"] == [
        ("schedule_schema_version", b"1.0.0"),
        ("schedule_source_type", b"schedule"),
        ("schedule_target_epoch", b"1779625801"),
        ("schedule_target_topic", b"orders"),
        ("schedule_target_key", b"k"),
        ("schedule_target_partition", b"4"),
        ("schedule_target_partition_key", b"pk"),
        ("trace", b"abc"),
    ]


def test_sky_json_cancel_end_to_end(capsys, produced):
    code, out, _ = run(capsys, ["cancel", "--id", "r-1", "--dialect", "sky-json", "--requests-topic", "schedules"])
    assert code == 0
    assert out == "sent cancel id=r-1 (sky-json on schedules)\n"
    assert [(r["topic"], r["key"], r["value"], r["headers"]) for r in produced] == [("schedules", b"r-1", None, [])]


def test_native_schedule_end_to_end_is_unchanged(capsys, produced):
    code, out, _ = run(
        capsys, ["schedule", "--to", "orders", "--at", "2026-05-24T12:30:00.250Z", "--id", "r-1", "--app-id", "app"]
    )
    assert code == 0
    assert out == "sent schedule id=r-1: deliver to orders at 2026-05-24T12:30:00.250Z\n"
    (record,) = produced
    assert record["topic"] == "app-schedule-requests"
    assert "partitioner" not in record["config"]
    assert record["partition"] in (0, 1)


def test_recurring_schedules_are_commands_too(capsys):
    _, out, _ = run(capsys, ["--help"])
    for command in ("pause", "resume"):
        assert f"  {command} " in out, command
    _, out, _ = run(capsys, ["schedule", "--help"])
    for flag in ("--cron", "--timezone", "--missed", "--start-at", "--end-at", "--max-lateness"):
        assert flag in out
    _code, out, _ = run(capsys, ["cancel", "--help"])
    assert "--cron" in out


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["schedule", "--to", "x", "--cron", "@hourly"], "--cron needs --id"),
        (["schedule", "--to", "x", "--cron", "* * *", "--id", "c"], "invalid x-scheduler-cron-expr '* * *'"),
        (["schedule", "--to", "x", "--cron", "0 0 30 2 *", "--id", "c"], "'0 0 30 2 *': it never fires"),
        (
            ["schedule", "--to", "x", "--cron", "@daily", "--timezone", "Europe/Pari", "--id", "c"],
            "unknown time zone 'Europe/Pari'",
        ),
        (
            ["schedule", "--to", "x", "--cron", "* * * * * *", "--id", "c"],
            "fires every 1s at times, more often than the minimum interval 5s (--cron-min-interval); 5s is the "
            "job's default: if the job runs with another --cron-min-interval, give it here too",
        ),
        (
            ["schedule", "--to", "x", "--cron", "* * * * * */2", "--id", "c", "--cron-min-interval", "3s"],
            "fires every 2s at times, more often than the minimum interval 3s (--cron-min-interval)",
        ),
        (["schedule", "--to", "x", "--cron", "@hourly", "--at", "+1m", "--id", "c"], "--at and --cron"),
        (["schedule", "--to", "x", "--at", "+1m", "--timezone", "Europe/Paris"], "--timezone is for a recurring"),
        (["schedule", "--to", "x", "--at", "+1m", "--max-lateness", "soon"], "max lateness 'soon'"),
        (
            [
                "schedule",
                "--to",
                "x",
                "--cron",
                "@hourly",
                "--id",
                "c",
                "--dialect",
                "karafka",
                "--requests-topic",
                "s",
            ],
            "no recurring schedules",
        ),
        (["cancel", "--cron", "--id", "c", "--dialect", "etf1", "--requests-topic", "s"], "no recurring schedules"),
    ],
)
def test_bad_recurring_requests_fail_with_one_line_before_any_connection(capsys, argv, fragment):
    code, out, err = run(capsys, [*argv, *NO_KAFKA])
    assert code == 2 and out == ""
    assert fragment in one_line_error(err, argv[0])


def test_a_cron_within_the_jobs_minimum_is_sent(capsys, monkeypatch, produced):
    """With the job's minimum given (here through its variable, as the job reads it), a cron within it is sent."""
    monkeypatch.setenv("KAFKA_SCHEDULER_CRON_MIN_INTERVAL", "2s")
    code, out, err = run(capsys, ["schedule", "--to", "x", "--cron", "* * * * * */2", "--id", "c"])
    assert (code, err) == (0, "") and out.startswith("sent cron id=c")
    assert dict(produced[0]["headers"])["x-scheduler-cron-expr"] == b"* * * * * */2"


def option_help(help_text: str, flag: str) -> str:
    """The help of one option of a --help page, on one line."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(flag + " "))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("  -")), len(lines))
    return " ".join(" ".join(lines[start:end]).split())


def test_run_help_shows_defaults_as_they_are_written(capsys):
    code, out, _ = run(capsys, ["run", "--help"])
    assert code == 0
    for flag, default in (
        ("--trigger-interval", "0s"),
        ("--lookahead", "30s"),
        ("--cron-min-interval", "5s"),
        ("--history", "false"),
        ("--max-held", "100000"),
    ):
        assert option_help(out, flag).endswith(f"; default {default}]"), option_help(out, flag)
    assert "milliseconds" not in out


@pytest.mark.parametrize("command", ["pause", "resume"])
def test_cron_actions_offer_no_dialect(capsys, command, monkeypatch, produced):
    code, out, _ = run(capsys, [command, "--help"])
    assert code == 0 and "--dialect" not in out and "--requests-topic" in out
    code, _, err = run(capsys, [command, "--id", "c", "--dialect", "etf1"])
    assert code == 2 and "unrecognized arguments: --dialect etf1" in err
    monkeypatch.setenv("KAFKA_SCHEDULER_DIALECT", "karafka")  # native whatever the variable says
    code, out, err = run(capsys, [command, "--id", "c"])
    assert (code, err, out) == (0, "", f"sent cron {command} id=c\n")
    assert produced[0]["topic"] == "kafka-scheduler-schedule-requests"
