"""Kafka client options against a broker that takes only SASL/PLAIN over TLS: the job and the CLI reach it with
options from a --config file, each client with what its library needs; `config show` masks the secrets.

The broker also has a PLAINTEXT listener, which only the test's own reader and topic set-up use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from kafka_scheduler.kafka.local_broker import LocalBroker, SaslSslListener, free_port

from .support import Kafka, SchedulerProcess

STORE_PASSWORD = "store-secret"
USER, PASSWORD = "scheduler", "scheduler-secret"


def certificate(folder):
    """A self-signed key and certificate for 127.0.0.1 (PKCS12 for the broker), and the certificate alone (PEM) for
    the clients to trust, made with the JDK's keytool."""
    keystore, pem = folder / "broker.p12", folder / "ca.pem"
    common = ["-keystore", str(keystore), "-storetype", "PKCS12", "-storepass", STORE_PASSWORD]
    subprocess.run(
        [
            "keytool",
            "-genkeypair",
            "-alias",
            "broker",
            "-keyalg",
            "RSA",
            "-keysize",
            "2048",
            "-validity",
            "2",
            "-dname",
            "CN=localhost",
            "-ext",
            "SAN=ip:127.0.0.1,dns:localhost",
            "-keypass",
            STORE_PASSWORD,
            *common,
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["keytool", "-exportcert", "-rfc", "-alias", "broker", "-file", str(pem), *common],
        check=True,
        capture_output=True,
    )
    return keystore, pem


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """(broker, path of a --config file with the client options)."""
    folder = tmp_path_factory.mktemp("secured-broker")
    keystore, ca = certificate(folder)
    listener = SaslSslListener(free_port(), keystore, STORE_PASSWORD, {USER: PASSWORD})
    broker = LocalBroker(free_port(), folder / "data", heap="384m", sasl_ssl=listener)
    broker.start(timeout=120)
    settings = folder / "scheduler.toml"
    jaas = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{USER}" password="{PASSWORD}";'
    settings.write_text(f"""\
lookahead = "0s"  # deliveries through Spark's Kafka sink
[kafka]
security.protocol = "SASL_SSL"
sasl.mechanism = "PLAIN"
librdkafka.sasl.username = "{USER}"
librdkafka.sasl.password = "{PASSWORD}"
librdkafka.ssl.ca.location = "{ca}"
java.sasl.jaas.config = '{jaas}'
java.ssl.truststore.type = "PEM"
java.ssl.truststore.location = "{ca}"
""")
    yield broker, settings
    broker.stop()


def cli(*argv: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kafka_scheduler", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_job_and_cli_over_sasl_ssl(secured, tmp_path):
    broker, settings = secured
    secure = broker.sasl_ssl.bootstrap_servers
    plain = Kafka(broker.bootstrap_servers)
    topic = plain.topic("secured")
    reader = plain.reader(topic)
    app_id = f"secured-{uuid.uuid4().hex[:8]}"
    job = SchedulerProcess(
        secure, app_id, tmp_path / "checkpoint", tmp_path / "scheduler.log", extra_args=("--config", str(settings))
    )
    try:
        # Admin client (topics), wake-up producer and Spark's source and sink all go through SASL_SSL.
        job.start(timeout=300)
        assert "Kafka options: security.protocol=SASL_SSL" in job.log() and PASSWORD not in job.log()
        sent = cli(
            "schedule",
            "--bootstrap-servers",
            secure,
            "--app-id",
            app_id,
            "--to",
            topic,
            "--at",
            "+2s",
            "--value",
            "over TLS",
            "--id",
            "s-1",
            env={"KAFKA_SCHEDULER_CONFIG": str(settings)},
        )
        assert sent.returncode == 0, sent.stderr
        [record] = reader.wait_for(
            lambda r: r.value == b"over TLS", timeout=240, what="the delivery", guard=job.assert_running
        )
        assert record.key is None

        wrong = cli(
            "cancel",
            "--bootstrap-servers",
            secure,
            "--app-id",
            app_id,
            "--id",
            "s-1",
            "--config",
            str(settings),
            "--kafka-option",
            "librdkafka.sasl.password=wrong",
        )
        assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1, wrong.stderr
        assert "Authentication failed" in wrong.stderr, wrong.stderr
    finally:
        reader.close()
        job.stop()


def test_config_show_masks_what_the_job_uses(secured):
    _, settings = secured
    shown = cli("config", "show", "--format", "json", "--config", str(settings), "--kafka-option", "client.id=x")
    assert shown.returncode == 0, shown.stderr
    assert PASSWORD not in shown.stdout
    result = json.loads(shown.stdout)
    assert result["settings"]["kafka"]["librdkafka.sasl.password"] == "****"
    assert result["settings"]["kafka"]["java.sasl.jaas.config"] == "****"
    assert result["settings"]["kafka"]["librdkafka.sasl.username"] == USER
    assert result["sources"]["kafka.client.id"] == "flag --kafka-option"
    assert result["sources"]["kafka.security.protocol"] == f"file {settings}"


@pytest.mark.parametrize(
    "option, names",
    [
        ("librdkafka.sasl.password=wrong", "sasl.username/sasl.password"),
        ("librdkafka.ssl.ca.location=", "ssl.* settings"),  # the broker's certificate cannot be verified
    ],
)
def test_run_refused_by_the_broker_stops_at_once_naming_the_settings(secured, tmp_path, option, names):
    broker, settings = secured
    ran = cli(
        "run",
        "--bootstrap-servers",
        broker.sasl_ssl.bootstrap_servers,
        "--app-id",
        "refused",
        "--checkpoint-dir",
        str(tmp_path / "checkpoint"),
        "--metrics-port",
        "0",
        "--config",
        str(settings),
        "--kafka-option",
        option,
    )
    assert ran.returncode == 2, ran.stderr
    errors = [line for line in ran.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and names in errors[0], ran.stderr
