"""The settings that shape the state, recorded in the checkpoint at its first run and honoured or refused later.

Local checkpoints need no Spark; one test goes through Hadoop's FileSystem on a local SparkSession, as the
scheduler does for hdfs:// or s3a:// checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kafka_scheduler.config import ConfigError, add_arguments, resolve
from kafka_scheduler.engine.spark.checkpoint import (
    STATE_FILE,
    STATE_FORMAT,
    HadoopFiles,
    LocalFiles,
    batch_offsets,
    committed_offsets,
    is_local,
    settle_state_settings,
)

BUCKET_MS = 1000
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def config_of(checkpoint: Path | str, *argv: str, environ: dict | None = None):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve(parser.parse_args(["--checkpoint-dir", str(checkpoint), *argv]), environ=environ or {})


def settle(checkpoint, *argv, environ=None, bucket_ms=BUCKET_MS):
    return settle_state_settings(config_of(checkpoint, *argv, environ=environ), bucket_ms, now=NOW)


def commit(checkpoint: Path, batch: int = 0) -> None:
    """What Spark leaves once a batch has committed: the query id, and an entry in its offset and commit logs."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "metadata").write_text('{"id":"5f1c0d5e-0000-4000-8000-000000000000"}\n')
    for folder in ("offsets", "commits"):
        (checkpoint / folder).mkdir(parents=True, exist_ok=True)
        (checkpoint / folder / str(batch)).write_text("v1\n{}\n")


def recorded(checkpoint: Path) -> dict:
    return json.loads((checkpoint / STATE_FILE).read_text())


def first_run(checkpoint: Path, *argv: str) -> dict:
    """A checkpoint whose first run used ``argv`` and committed a batch."""
    settle(checkpoint, *argv)
    commit(checkpoint)
    return recorded(checkpoint)


def test_new_checkpoint_records_the_settings(tmp_path):
    checkpoint = tmp_path / "new" / "ckpt"
    config, notices = settle(checkpoint, "--partitions", "3")
    assert notices == []
    assert (config.state_layout, config.shards, config.partitions) == ("wheel", 6, 3)
    assert recorded(checkpoint) == {
        "state_format": STATE_FORMAT,
        "app_id": "kafka-scheduler",
        "state_layout": "wheel",
        "shards": 6,
        "bucket_ms": 1000,
        "partitions": 3,
        "inputs": {"kafka-scheduler-schedule-requests": "native"},
        "created_at": "2026-03-01T12:00:00Z",
    }
    assert STATE_FORMAT == 4
    assert config.catch_up_first, "a new checkpoint reads every input to its end before delivering"
    assert sorted(p.name for p in checkpoint.iterdir()) == [STATE_FILE], "temporary file left behind"


def test_checkpoint_without_a_committed_batch_is_rewritten(tmp_path):
    # A first run that stopped before committing anything: Spark redoes batch 0 from empty state.
    settle(tmp_path, "--shards", "8")
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n{}\n")
    (tmp_path / "commits").mkdir()
    config, notices = settle(tmp_path, "--shards", "5")
    assert notices == [] and (config.state_layout, config.shards) == ("wheel", 5)
    assert (recorded(tmp_path)["state_layout"], recorded(tmp_path)["shards"]) == ("wheel", 5)


def test_recorded_values_are_honoured_when_not_given(tmp_path):
    first_run(tmp_path, "--partitions", "2")
    before = (tmp_path / STATE_FILE).read_bytes()
    config, notices = settle(tmp_path, "--partitions", "3")
    assert (config.state_layout, config.shards, config.partitions) == ("wheel", 4, 3)
    assert (
        "state laid out in 4 shards, as recorded at the checkpoint's first run (the current settings alone "
        "would give 6)" in notices
    )
    assert (tmp_path / STATE_FILE).read_bytes() == before, "a resumed checkpoint's record is never rewritten"


def test_explicit_values_equal_to_the_recorded_ones_run_silently(tmp_path):
    first_run(tmp_path, "--shards", "7")
    config, notices = settle(tmp_path, "--shards", "7", "--state-layout", "wheel")
    assert (config.shards, notices) == (7, [])


def test_explicit_shards_that_differ_are_refused_naming_the_flag_and_both_values(tmp_path):
    first_run(tmp_path, "--partitions", "2")
    before = (tmp_path / STATE_FILE).read_bytes()
    with pytest.raises(ConfigError) as error:
        settle(tmp_path, "--shards", "6")
    message = str(error.value)
    assert message == (
        f"--shards 6 does not match checkpoint {tmp_path}, whose state was laid out in 4 shards at "
        f"its first run: omit --shards to keep 4, or use a new --checkpoint-dir"
    )
    assert (tmp_path / STATE_FILE).read_bytes() == before


def test_environment_value_that_differs_is_refused_naming_the_variable(tmp_path):
    first_run(tmp_path)
    with pytest.raises(ConfigError) as error:
        settle(tmp_path, environ={"KAFKA_SCHEDULER_SHARDS": "6"})
    message = str(error.value)
    assert message.startswith("KAFKA_SCHEDULER_SHARDS=6 does not match checkpoint"), message
    assert "4 shards" in message and "omit KAFKA_SCHEDULER_SHARDS" in message
    assert "--shards" not in message


def test_a_changed_partition_count_moves_no_shards_and_is_a_notice(tmp_path):
    first_run(tmp_path, "--partitions", "2")
    config, notices = settle(tmp_path, "--partitions", "5")
    assert config.shards == 4 and config.partitions == 5
    assert notices[-1] == (
        "Spark keeps the 2 shuffle partitions of the checkpoint's first run; --partitions 5 now "
        "only sets the partition count of topics the scheduler creates"
    )
    _, notices = settle(tmp_path, environ={"KAFKA_SCHEDULER_PARTITIONS": "2", "KAFKA_SCHEDULER_SHARDS": "4"})
    assert notices == []
    _, notices = settle(tmp_path, "--shards", "4", environ={"KAFKA_SCHEDULER_PARTITIONS": "7"})
    assert [n for n in notices if "KAFKA_SCHEDULER_PARTITIONS=7 now only sets" in n], notices


def test_checkpoint_with_commits_but_no_settings_file_is_refused_as_legacy(tmp_path):
    commit(tmp_path, 3)
    with pytest.raises(ConfigError) as error:
        settle(tmp_path)
    message = str(error.value)
    assert message == (
        f"checkpoint {tmp_path} has committed batches but no {STATE_FILE}: it was written by an "
        f"earlier kafka-scheduler whose state format this version cannot read; its pending schedules "
        f"can only be drained with the version that wrote it, or use a new --checkpoint-dir"
    )
    assert not (tmp_path / STATE_FILE).exists()


@pytest.mark.parametrize(
    "content,expected",
    [
        (b'{"state_format": 2, "state_lay', "is not valid JSON"),
        (b"\xff\xfe\x00", "is not valid JSON (not UTF-8)"),
        (b'["state_format", 2]', "is not a kafka-scheduler state file"),
        (b'{"shards": 4}', "is not a kafka-scheduler state file"),
        (b'{"state_format": "2"}', "is not a kafka-scheduler state file"),
        (
            b'{"state_format": 4, "state_layout": "ring", "shards": 0, "bucket_ms": 1000, "partitions": 2, '
            b'"inputs": {"a": "native"}}',
            "is damaged (missing or invalid state_layout, shards)",
        ),
    ],
)
def test_unreadable_or_foreign_settings_file_is_refused_naming_it(tmp_path, content, expected):
    commit(tmp_path)
    (tmp_path / STATE_FILE).write_bytes(content)
    with pytest.raises(ConfigError) as error:
        settle(tmp_path)
    message = str(error.value)
    assert message.startswith(f"{tmp_path}/{STATE_FILE} {expected}"), message
    assert message.endswith("or use a new --checkpoint-dir")


@pytest.mark.parametrize("state_format", [STATE_FORMAT + 1, 3, 2, 1])
def test_another_state_format_is_refused(tmp_path, state_format):
    first_run(tmp_path)
    (tmp_path / STATE_FILE).write_text(json.dumps({"state_format": state_format, "layout": "future"}))
    with pytest.raises(ConfigError) as error:
        settle(tmp_path)
    assert str(error.value).startswith(f"checkpoint {tmp_path} holds state format {state_format} "), str(error.value)
    assert f"reads format {STATE_FORMAT} only" in str(error.value)


def test_another_bucket_width_is_refused_for_the_wheel(tmp_path):
    first_run(tmp_path)
    with pytest.raises(ConfigError, match="holds wheel buckets of 1000 ms, but this version uses 500 ms"):
        settle(tmp_path, bucket_ms=500)


def test_file_uri_is_a_local_checkpoint(tmp_path):
    uri = "file://" + str(tmp_path / "with space").replace(" ", "%20")
    config, _ = settle(uri)
    assert recorded(tmp_path / "with space")["shards"] == config.shards


@pytest.mark.parametrize(
    "path,local",
    [
        ("checkpoints/app", True),
        ("/data/ckpt", True),
        ("file:///data/ckpt", True),
        ("file:/data/ckpt", True),
        ("file://localhost/data/ckpt", True),
        ("hdfs:///checkpoints/app", False),
        ("s3a://bucket/ckpt", False),
        ("file://otherhost/ckpt", False),
    ],
)
def test_which_checkpoints_python_reads(path, local):
    assert is_local(path) is local


def test_local_files_name_the_absolute_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert LocalFiles("relative/ckpt").where == os.path.join(str(tmp_path), "relative", "ckpt")


# ---------------------------------------------------------------- the run command, end to end without Kafka


def test_run_refuses_before_connecting_to_kafka_with_one_line(tmp_path, capsys, keep_signal_handlers):
    from kafka_scheduler.cli.main import main

    first_run(tmp_path)
    # Nothing listens on port 1: reaching Kafka would hang in the broker wait, not fail at once.
    code = main(["run", "--bootstrap-servers", "127.0.0.1:1", "--checkpoint-dir", str(tmp_path), "--shards", "6"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        f"kafka-scheduler run: error: --shards 6 does not match checkpoint {tmp_path}, whose state was "
        f"laid out in 4 shards at its first run: omit --shards to keep 4, or use a new "
        f"--checkpoint-dir\n"
    )


# ---------------------------------------------------------------- through Hadoop's FileSystem


def test_hadoop_filesystem_records_honours_and_refuses(spark, tmp_path):
    uri = tmp_path.as_uri()  # file:///...: Hadoop's local filesystem stands in for hdfs:// or s3a://
    files = HadoopFiles(spark, uri)
    assert files.where.startswith("file:") and files.where.rstrip("/").endswith(str(tmp_path))
    assert not files.has_commit() and files.read(STATE_FILE) is None

    config, notices = settle_state_settings(config_of(uri, "--partitions", "2"), BUCKET_MS, files, now=NOW)
    assert notices == [] and recorded(tmp_path)["shards"] == 4
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # Rewritten while nothing is committed (a rename onto an existing file).
    settle_state_settings(config_of(uri, "--shards", "5"), BUCKET_MS, files, now=NOW)
    assert json.loads(files.read(STATE_FILE))["shards"] == 5

    commit(tmp_path)
    assert files.has_commit()
    config, notices = settle_state_settings(config_of(uri, "--partitions", "4"), BUCKET_MS, files, now=NOW)
    assert config.shards == 5
    with pytest.raises(ConfigError, match="--shards 3 does not match checkpoint file:.*laid out in 5 shards"):
        settle_state_settings(config_of(uri, "--shards", "3"), BUCKET_MS, files, now=NOW)


# ---------------------------------------------------------------- inputs


def test_inputs_are_recorded_and_an_added_input_is_read_from_its_start(tmp_path):
    first_run(tmp_path, "--input", "orders:karafka", "--input", "videos:etf1")
    assert recorded(tmp_path)["inputs"] == {"orders": "karafka", "videos": "etf1"}
    config, notices = settle(tmp_path, "--input", "orders:karafka", "--input", "videos:etf1")
    assert notices == [] and not config.catch_up_first
    config, notices = settle(tmp_path, "--input", "orders:karafka", "--input", "videos:etf1", "--input", "sky:sky-avro")
    assert config.catch_up_first
    assert notices == [
        "new input sky (sky-avro): read from the earliest offset; the first batch reads every input "
        "to its end before delivering"
    ]
    assert recorded(tmp_path)["inputs"] == {"orders": "karafka", "videos": "etf1", "sky": "sky-avro"}


def test_inputs_from_the_environment_are_a_comma_list(tmp_path):
    config, _ = settle(tmp_path, environ={"KAFKA_SCHEDULER_INPUTS": "a:native, b:sky-json"})
    assert config.input_topics == {"a": "native", "b": "sky-json"}
    assert {"a", "b"} <= set(config.own_topics), "an input is never a valid destination"


def test_a_removed_input_is_refused_naming_the_way_out(tmp_path):
    first_run(tmp_path, "--input", "orders:karafka", "--input", "videos:etf1")
    before = (tmp_path / STATE_FILE).read_bytes()
    with pytest.raises(ConfigError) as error:
        settle(tmp_path, "--input", "orders:karafka")
    message = str(error.value)
    assert "videos:etf1, missing from the inputs now (orders:karafka)" in message
    assert "add --input videos:etf1" in message and "--from-beginning" in message
    assert (tmp_path / STATE_FILE).read_bytes() == before


def test_an_input_read_with_another_dialect_is_refused(tmp_path):
    first_run(tmp_path, "--input", "orders:karafka")
    with pytest.raises(ConfigError) as error:
        settle(tmp_path, "--input", "orders:etf1")
    assert str(error.value).startswith(
        f"input orders is read as etf1 now, but checkpoint {tmp_path} read it as karafka"
    )


def test_the_default_input_is_the_native_requests_topic(tmp_path):
    first_run(tmp_path)
    with pytest.raises(ConfigError) as error:
        settle(tmp_path, "--input", "orders:karafka")
    assert "kafka-scheduler-schedule-requests:native" in str(error.value)
    config, _ = settle(tmp_path, "--input", "orders:karafka", "--input", "kafka-scheduler-schedule-requests:native")
    assert config.catch_up_first


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--input", "orders"], "--input: expected TOPIC:DIALECT, got 'orders'"),
        (["--input", "orders:kaspr"], "--input: unknown dialect 'kaspr' for topic 'orders'"),
        (["--input", "bad topic:etf1"], "--input: 'bad topic' is not a valid Kafka topic name"),
        (["--input", "a:etf1", "--input", "a:karafka"], "--input: topic 'a' is given twice, as etf1 and as karafka"),
    ],
)
def test_invalid_inputs_are_refused_with_one_clear_message(tmp_path, argv, message):
    with pytest.raises(ConfigError) as error:
        config_of(tmp_path, *argv)
    assert str(error.value).startswith(message)


def test_from_beginning_keeps_the_old_checkpoint_aside(tmp_path):
    from kafka_scheduler.engine.spark.checkpoint import start_new_generation

    checkpoint = tmp_path / "ckpt"
    first_run(checkpoint)
    moved = start_new_generation(LocalFiles(checkpoint), now=NOW)
    assert moved == str(tmp_path / "ckpt.before-20260301T120000Z")
    assert not checkpoint.exists() and (Path(moved) / STATE_FILE).exists() and (Path(moved) / "commits").is_dir()
    assert start_new_generation(LocalFiles(checkpoint), now=NOW) is None, "nothing to keep aside"


def test_a_batchs_offsets_are_read_before_it_commits_and_the_committed_ones_after(tmp_path):
    """The sink tells the timed writer what a running batch read (its offsets file is written before it runs); the
    watcher reads what the last committed batch read."""
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    metadata = '{"batchWatermarkMs":0,"batchTimestampMs":1}'
    (tmp_path / "offsets" / "0").write_text(f'v1\n{metadata}\n{{"req":{{"0":5,"1":7}}}}\n{{"ticks":{{"0":2}}}}\n')
    (tmp_path / "offsets" / "1").write_text(f'v1\n{metadata}\n{{"req":{{"0":9,"1":7}}}}\n{{"ticks":{{"0":3}}}}\n')
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    assert batch_offsets(tmp_path, 1) == {"req": {0: 9, 1: 7}, "ticks": {0: 3}}
    assert committed_offsets(tmp_path) == {"req": {0: 5, 1: 7}, "ticks": {0: 2}}
