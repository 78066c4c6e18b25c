"""`pip install kafka-scheduler` without extras: the client, the encoders and the request commands, with
confluent-kafka and croniter (a cron is checked before it is sent). The wheel and the sdist are built from this
checkout (`python -m build`), the wheel is installed into a new virtualenv (no system site packages, no extras), and
from there the CLI and ``SchedulerClient`` send requests to the real broker; the records are read back here. Spark,
pandas, pyarrow and numpy must not be installed there, and the commands that need them must say so in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import uuid
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kafka_scheduler import __version__
from kafka_scheduler.client.encoders import format_instant
from kafka_scheduler.kafka.topics import admin_client, ensure_topics
from kafka_scheduler.protocol import ACTION, DELIVER_AT, DELIVER_TO, REQUEST_ID

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DATA = (
    "kafka_scheduler/engine/spark/log4j2.properties",
    "kafka_scheduler/ops/status_page.html",
    "kafka_scheduler/kafka/spark-kafka.pom.xml",
)
SERVER_ONLY = ("pyspark", "pandas", "pyarrow", "google.protobuf", "prometheus_client", "fastavro", "py4j", "numpy")
INSTALL = 'pip install "kafka-scheduler[server]"'
FIRST, SECOND = datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 2, 12, 30, tzinfo=UTC)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel (built from the sdist, as `python -m build` does), once per module."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return out


def only(folder: Path, pattern: str) -> Path:
    found = list(folder.glob(pattern))
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A new virtualenv with the wheel installed, no extras. Without pip of its own (this pip installs into it),
    so its site-packages holds what the install brought and nothing else."""
    folder = tmp_path_factory.mktemp("client-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(folder / "bin" / "python"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            str(only(dist, "*.whl")),
        ],
        # Not this checkout's PYTHONPATH: its src/ holds the egg-info the build left, which pip would take for the
        # package installed already.
        env={name: value for name, value in os.environ.items() if name != "PYTHONPATH"},
        check=True,
        timeout=600,
    )
    return folder


def in_venv(venv: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """A program of the virtualenv, away from the checkout (no PYTHONPATH, another working directory)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name != "PYTHONPATH" and not name.startswith("KAFKA_SCHEDULER_")
    }
    program = str(venv / "bin" / argv[0])
    return subprocess.run(
        [program, *argv[1:]], input=stdin, capture_output=True, text=True, env=env, cwd=venv, timeout=120
    )


def site_packages(venv: Path) -> Path:
    return only(venv / "lib", "python3*/site-packages")


def test_the_client_install_brings_confluent_kafka_and_croniter_only(venv):
    probe = in_venv(
        venv,
        "python",
        "-c",
        textwrap.dedent(f"""\
        import importlib, importlib.metadata, json

        def importable(module):
            try:
                importlib.import_module(module)
            except ModuleNotFoundError:
                return False
            return True

        installed = sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions())
        print(json.dumps({{"missing": [m for m in {SERVER_ONLY!r} if not importable(m)], "installed": installed}}))
        """),
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert found["missing"] == list(SERVER_ONLY)  # none of them is importable there
    # croniter brings python-dateutil, which brings tzdata (time zones where the system has none): all pure Python.
    assert found["installed"] == ["confluent-kafka", "croniter", "kafka-scheduler", "python-dateutil", "tzdata"]
    size = sum(p.stat().st_size for p in site_packages(venv).rglob("*") if p.is_file())
    print(f"client-only site-packages: {size / 1e6:.1f} MB")
    assert size < 60e6, f"{size / 1e6:.0f} MB"  # PySpark alone is over 400 MB


def test_sdist_and_wheel_carry_the_package_data(dist):
    with tarfile.open(only(dist, "*.tar.gz")) as sdist:
        names = sdist.getnames()
    for data in PACKAGE_DATA:
        assert f"kafka_scheduler-{__version__}/src/{data}" in names, data
    with zipfile.ZipFile(only(dist, "*.whl")) as wheel:
        names = wheel.namelist()
        entry_points = wheel.read(f"kafka_scheduler-{__version__}.dist-info/entry_points.txt").decode()
        metadata = wheel.read(f"kafka_scheduler-{__version__}.dist-info/METADATA").decode()
    for data in PACKAGE_DATA:
        assert data in names, data
    assert "kafka-scheduler = kafka_scheduler.cli.main:main" in entry_points
    assert f"Version: {__version__}" in metadata
    assert any(
        line.startswith("Requires-Dist: pyspark") and 'extra == "server"' in line for line in metadata.splitlines()
    ), metadata


def test_version_help_and_config_show(venv):
    version = in_venv(venv, "kafka-scheduler", "--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"kafka-scheduler {__version__}"), version.stderr
    for argv in (["--help"], ["schedule", "--help"], ["cancel", "--help"], ["run", "--help"]):
        shown = in_venv(venv, "kafka-scheduler", *argv)
        assert shown.returncode == 0 and shown.stdout.startswith("usage: kafka-scheduler"), (argv, shown.stderr)
    config = in_venv(venv, "kafka-scheduler", "config", "show", "--app-id", "billing")
    assert config.returncode == 0, config.stderr
    assert 'app_id = "billing"' in config.stdout


@pytest.mark.parametrize("command", ["run", "submit", "inspect", "demo"])
def test_server_commands_name_the_missing_extra(venv, command):
    result = in_venv(venv, "kafka-scheduler", command)
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"kafka-scheduler {command}: error: needs the server install (pyspark, "), lines[0]
    assert lines[0].endswith(INSTALL), lines[0]


def test_a_cron_the_job_would_reject_is_refused_with_the_jobs_reason(venv):
    result = in_venv(
        venv,
        "kafka-scheduler",
        "schedule",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--to",
        "out",
        "--cron",
        "0 9 * * *",
        "--timezone",
        "Europe/Pariss",
        "--id",
        "c",
    )
    assert (result.returncode, result.stdout) == (2, ""), result
    assert result.stderr == (
        "kafka-scheduler schedule: error: unknown time zone 'Europe/Pariss' (expected an IANA name like Europe/Paris)\n"
    )
    result = in_venv(
        venv,
        "kafka-scheduler",
        "schedule",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--to",
        "out",
        "--id",
        "c",
        "--cron",
        "* * * * * */2",
    )
    assert (result.returncode, result.stdout) == (2, ""), result
    assert "fires every 2s at times, more often than the minimum interval 5s (--cron-min-interval)" in result.stderr


def test_sky_avro_without_fastavro_names_the_avro_extra(venv):
    result = in_venv(
        venv,
        "kafka-scheduler",
        "schedule",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--dialect",
        "sky-avro",
        "--requests-topic",
        "schedules",
        "--id",
        "r-1",
        "--to",
        "out",
        "--at",
        "+1m",
    )
    assert result.returncode == 2, result
    assert result.stderr == (
        "kafka-scheduler schedule: error: the sky-avro dialect needs fastavro, which is not "
        'installed: pip install "kafka-scheduler[avro]"\n'
    )


def test_requests_from_the_cli_and_the_client_arrive(venv, kafka):
    app_id = f"client-install-{uuid.uuid4().hex[:8]}"
    requests_topic = f"{app_id}-schedule-requests"
    ensure_topics(admin_client(kafka.bootstrap), [requests_topic], 2)
    reader = kafka.reader(requests_topic)
    to = ["--bootstrap-servers", kafka.bootstrap, "--app-id", app_id]

    for argv in (
        [
            "schedule",
            "--to",
            "out",
            "--at",
            "2030-01-01T00:00:00Z",
            "--key",
            "k",
            "--value",
            "first",
            "--header",
            "trace=1",
            "--id",
            "cli-1",
        ],
        ["replace", "--to", "out", "--at", "2030-01-02T12:30:00Z", "--value", "second", "--id", "cli-1"],
        ["cancel", "--id", "cli-1"],
    ):
        sent = in_venv(venv, "kafka-scheduler", *argv, *to)
        assert sent.returncode == 0, (argv, sent.stderr)
        assert sent.stdout.startswith("sent "), sent.stdout
    script = in_venv(
        venv,
        "python",
        stdin=textwrap.dedent(f"""\
        from datetime import datetime, timezone
        from kafka_scheduler.client import SchedulerClient

        with SchedulerClient({kafka.bootstrap!r}, app_id={app_id!r}) as client:
            client.schedule("out", datetime(2030, 1, 1, tzinfo=timezone.utc), value=b"first", key=b"k",
                            headers=[("trace", b"1")], request_id="py-1")
            client.replace("out", "2030-01-02T12:30:00Z", value=b"second", request_id="py-1")
            client.cancel("py-1")
        """),
    )
    assert script.returncode == 0, script.stderr

    records = reader.wait_for(lambda r: True, count=6, what="requests", timeout=30)
    assert len(records) == 6, records
    for request_id in ("cli-1", "py-1"):
        sent = [r for r in records if r.header_values(REQUEST_ID) == [request_id.encode()]]
        assert len({r.partition for r in sent}) == 1, sent  # one id, one partition: applied in order
        sent.sort(key=lambda r: r.offset)
        assert [r.header(ACTION) for r in sent] == [b"ADD", b"REPLACE", b"CANCEL"], sent
        add, replace, cancel = sent
        assert (add.key, add.value, add.header("trace")) == (b"k", b"first", b"1")
        assert add.header(DELIVER_TO) == replace.header(DELIVER_TO) == b"out"
        assert add.header(DELIVER_AT) == format_instant(FIRST).encode()
        assert replace.header(DELIVER_AT) == format_instant(SECOND).encode()
        assert replace.value == b"second"
        assert cancel.header_values(DELIVER_TO) == [] and cancel.value is None
