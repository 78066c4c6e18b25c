"""Faults at the edges, the parts free of Kafka and Spark: waiting for a broker, checkpoints that cannot be written,
damaged or foreign checkpoints, and the sizes a destination refuses. The same faults against a real broker and
the real job: tests/integration/test_edge_faults.py."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest

from kafka_scheduler.config import ConfigError
from kafka_scheduler.engine.driver.sink_plan import framed_bytes
from kafka_scheduler.engine.spark.checkpoint import STATE_FILE, LocalFiles
from kafka_scheduler.kafka.local_broker import free_port
from kafka_scheduler.kafka.topics import KafkaUnreachable, broker_addresses, wait_for_broker
from kafka_scheduler.pipeline import _storage_failure

from .test_checkpoint_settings import commit, first_run, recorded, settle

# ---------------------------------------------------------------- a broker that is not there yet


def test_bootstrap_addresses_are_read_from_every_form():
    assert broker_addresses("127.0.0.1:9092, kafka-1:9093,PLAINTEXT://k2:19092,[::1]:9094,nonsense") == [
        ("127.0.0.1", 9092),
        ("kafka-1", 9093),
        ("k2", 19092),
        ("::1", 9094),
    ]


def test_waiting_for_a_broker_says_so_at_once_then_at_the_note_interval_and_gives_up_only_with_a_timeout(caplog):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    caplog.set_level(logging.INFO, logger="kafka_scheduler.kafka.topics")
    started = time.monotonic()
    with pytest.raises(KafkaUnreachable, match=f"no Kafka broker answered at {address} within 3s"):
        wait_for_broker(address, timeout=3, note_every=1.5)
    assert time.monotonic() - started < 10
    notes = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert 2 <= len(notes) <= 3, notes
    assert notes[0] == f"broker: waiting for {address} (connection refused)", notes
    assert notes[1].startswith(f"broker: waiting for {address} (connection refused); ") and notes[1].endswith(
        "s so far"
    ), notes


def test_a_stop_ends_the_wait_for_a_broker():
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    assert wait_for_broker(f"127.0.0.1:{free_port()}", timeout=None, stop=stop) is None
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------- a checkpoint that cannot be written


def test_a_checkpoint_under_a_file_cannot_be_written_and_says_so(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    files = LocalFiles(tmp_path / "file" / "ckpt")
    with pytest.raises(ConfigError) as error:
        files.check_writable()
    assert str(error.value) == (
        f"cannot write to checkpoint {tmp_path}/file/ckpt: Not a directory; the scheduler "
        f"keeps its offsets and state there: make it writable and give it room, or use "
        f"another --checkpoint-dir"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders (the integration test mounts one)")
def test_a_read_only_checkpoint_cannot_be_written(tmp_path):
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="Permission denied"):
            LocalFiles(tmp_path / "ckpt").check_writable()
    finally:
        tmp_path.chmod(0o755)


def test_a_writable_checkpoint_passes_the_probe_and_keeps_nothing_of_it(tmp_path):
    LocalFiles(tmp_path / "ckpt").check_writable()
    assert list((tmp_path / "ckpt").iterdir()) == []


@pytest.mark.parametrize(
    "text,cause",
    [
        ("java.io.IOException: No space left on device at ...offsets/.3.tmp", "No space left on device"),
        ("org.apache.hadoop.fs.FSError: java.io.IOException: Read-only file system", "Read-only file system"),
        ("[STREAM_FAILED] Query terminated with exception: Task failed: division by zero", None),
    ],
)
def test_a_query_that_failed_writing_files_is_told_apart(text, cause):
    assert _storage_failure(text) == cause


def test_run_on_an_unwritable_checkpoint_exits_2_with_one_line_before_anything_starts(
    tmp_path, capsys, keep_signal_handlers
):
    from kafka_scheduler.cli.main import main

    (tmp_path / "file").write_text("")
    started = time.monotonic()
    # Nothing listens on the bootstrap port: reaching for Kafka would wait, not fail.
    code = main(
        ["run", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--checkpoint-dir", str(tmp_path / "file" / "ckpt")]
    )
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - started < 10
    assert err == (
        f"kafka-scheduler run: error: cannot write to checkpoint {tmp_path}/file/ckpt: Not a directory; "
        f"the scheduler keeps its offsets and state there: make it writable and give it room, or use "
        f"another --checkpoint-dir\n"
    )


# ---------------------------------------------------------------- damaged or foreign checkpoints


def test_a_checkpoint_of_another_app_id_is_refused_naming_both(tmp_path):
    first_run(tmp_path, "--app-id", "billing", "--input", "shared-requests:native")
    with pytest.raises(ConfigError) as error:
        settle(tmp_path, "--app-id", "reminders", "--input", "shared-requests:native")
    assert str(error.value) == (
        f"checkpoint {tmp_path} belongs to app id billing (recorded at its first run), not "
        f"reminders: its offsets and state are that app's. Run with --app-id billing, or use "
        f"another --checkpoint-dir"
    )
    settle(tmp_path, "--app-id", "billing", "--input", "shared-requests:native")


def test_a_settings_file_from_before_app_ids_gets_the_app_id_of_its_next_start(tmp_path):
    first_run(tmp_path, "--app-id", "billing")
    state = recorded(tmp_path)
    del state["app_id"]
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    settle(tmp_path, "--app-id", "billing")
    assert recorded(tmp_path)["app_id"] == "billing"
    with pytest.raises(ConfigError, match="belongs to app id billing"):
        settle(tmp_path, "--app-id", "other", "--input", "billing-schedule-requests:native")


def test_another_spark_querys_checkpoint_is_refused_naming_what_it_read(tmp_path):
    commit(tmp_path, 7)
    (tmp_path / "offsets" / "7").write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"clicks":{"0":42,"1":40}}\n{"orders":{"0":3}}\n'
    )
    with pytest.raises(ConfigError) as error:
        settle(tmp_path)
    assert str(error.value) == (
        f"checkpoint {tmp_path} is not a kafka-scheduler checkpoint: it has no {STATE_FILE}, "
        f"and its query read clicks, orders, none of the inputs of app kafka-scheduler "
        f"(kafka-scheduler-schedule-requests). Use another --checkpoint-dir"
    )


DAMAGE = [
    ("metadata", None, "metadata is missing"),
    ("metadata", b"\x00\x17garbage", "metadata is not Spark's query metadata"),
    ("metadata", b'{"name": "x"}', "metadata is not Spark's query metadata"),
    ("offsets/0", b"", "offsets/0 does not start with Spark's version line"),
    ("offsets/0", b'v1\n{"batchWatermarkMs":0,"batchTi', "offsets/0 holds a line that is not JSON"),
    ("offsets/0", b"\xff\xfe", "offsets/0 is not text"),
    ("commits/0", b"v1\n", "commits/0 has no content after its version line"),
    ("commits/0", b"PK\x03\x04 a zip?", "commits/0 does not start with Spark's version line"),
    ("offsets/1", b'v1\n{"batchWat', "offsets/1 holds a line that is not JSON"),  # the batch in flight at a crash
]


@pytest.mark.parametrize("name,content,problem", DAMAGE)
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path, name, content, problem):
    first_run(tmp_path)
    if content is None:
        (tmp_path / name).unlink()
    else:
        (tmp_path / name).write_bytes(content)
    with pytest.raises(ConfigError) as error:
        settle(tmp_path)
    message = str(error.value)
    assert message.startswith(f"checkpoint {tmp_path} is damaged: {problem}"), message
    assert message.endswith("or use a new --checkpoint-dir)"), message


def test_a_checkpoint_with_commits_but_an_empty_offset_log_is_damaged(tmp_path):
    first_run(tmp_path)
    for entry in (tmp_path / "offsets").iterdir():
        entry.unlink()
    with pytest.raises(ConfigError, match="is damaged: offsets has no entry although a batch was committed"):
        settle(tmp_path)


# ---------------------------------------------------------------- records a destination cannot take


def test_framing_leaves_room_for_the_batch_header_and_lz4_blocks():
    assert framed_bytes(0) == 128
    assert framed_bytes(1000) == 1128
    assert framed_bytes(8 * 1024 * 1024) == 8 * 1024 * 1024 + 128 + 1024


def test_a_checkpoint_of_a_query_without_kafka_sources_is_refused_as_foreign(tmp_path):
    commit(tmp_path, 2)
    (tmp_path / "offsets" / "2").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"0":20}\n')
    with pytest.raises(
        ConfigError,
        match="is not a kafka-scheduler checkpoint: it has no kafka-scheduler-state.json, "
        "and its query read no Kafka topic, none of the inputs",
    ):
        settle(tmp_path)
