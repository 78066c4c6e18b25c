"""A single-node Apache Kafka broker (KRaft, broker+controller in one JVM) on loopback.

Used by `kafka-scheduler broker`, `make run` and the integration tests, so every one
of them runs the same real broker.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .jars import jar_paths, java_binary

log = logging.getLogger(__name__)

CLUSTER_ID_FILE = "cluster.id"

# The collector and JIT settings of the broker's JVM, under the name and with the meaning Kafka's own scripts give
# them (kafka-run-class.sh): set, it replaces these defaults. The tests set it to C1 and the serial collector, as
# for their Spark JVMs (tests/conftest.py): their brokers live minutes and carry little.
JVM_PERFORMANCE_OPTS_VARIABLE = "KAFKA_JVM_PERFORMANCE_OPTS"
DEFAULT_JVM_PERFORMANCE_OPTS = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true")

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = FILE
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class BrokerError(RuntimeError):
    pass


@dataclass(frozen=True)
class SaslSslListener:
    """A second listener taking SASL/PLAIN over TLS, next to the PLAINTEXT one (which tools and the broker's own
    traffic keep using)."""

    port: int
    keystore: Path  # PKCS12: the broker's private key and certificate (valid for 127.0.0.1)
    keystore_password: str
    users: dict[str, str] = field(default_factory=dict)  # SASL/PLAIN user -> password

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def properties(self) -> dict[str, str]:
        def quoted(text: str) -> str:
            return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

        users = " ".join(f"user_{name}={quoted(password)}" for name, password in self.users.items())
        return {
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            ),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.keystore),
            "ssl.keystore.password": self.keystore_password,
            "ssl.key.password": self.keystore_password,
        }


class LocalBroker:
    """Formats (once) and runs a KRaft broker whose data lives in ``data_dir``."""

    def __init__(
        self,
        port: int,
        data_dir: str | os.PathLike,
        controller_port: int | None = None,
        heap: str = "512m",
        auto_create_topics: bool = False,
        log_level: str = "WARN",
        authorizer: bool = False,
        own_session: bool = False,
        sasl_ssl: SaslSslListener | None = None,
    ):
        self.port = port
        self.controller_port = controller_port or free_port()
        self.data_dir = Path(data_dir).resolve()
        self.heap = heap
        self.auto_create_topics = auto_create_topics
        self.log_level = log_level
        # ACLs enforced, everyone allowed where a resource has none: on a PLAINTEXT listener every client is
        # User:ANONYMOUS, so an ACL denying that principal makes a topic refuse writes (fault tests).
        self.authorizer = authorizer
        # Out of the caller's process group, so a Ctrl-C in the terminal leaves it to the caller to stop it after
        # the clients that use it (the demo); otherwise it shares the caller's fate.
        self.own_session = own_session
        self.sasl_ssl = sasl_ssl
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    def _properties(self) -> str:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir / "kraft-logs"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": str(self.auto_create_topics).lower(),
            # A local broker for development and tests: small segments keep the data dir small.
            "log.segment.bytes": str(256 * 1024 * 1024),
            "message.max.bytes": str(8 * 1024 * 1024),
        }
        if self.sasl_ssl is not None:
            sasl = f"SASL_SSL://127.0.0.1:{self.sasl_ssl.port}"
            props["listeners"] += "," + sasl
            props["advertised.listeners"] += "," + sasl
            props["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL"
            props.update(self.sasl_ssl.properties())
        if self.authorizer:
            props["authorizer.class.name"] = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
            props["allow.everyone.if.no.acl.found"] = "true"
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _java(self, main_class: str, *args: str) -> list[str]:
        java = str(java_binary())
        classpath = os.pathsep.join(str(p) for p in jar_paths("kafka-broker"))
        performance = os.environ.get(JVM_PERFORMANCE_OPTS_VARIABLE)
        return [
            java,
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            *(performance.split() if performance is not None else DEFAULT_JVM_PERFORMANCE_OPTS),
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp",
            classpath,
            main_class,
            *args,
        ]

    def _prepare(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2.format(log_file=self.log_file, level=self.log_level))
        config = self.data_dir / "server.properties"
        config.write_text(self._properties())
        id_file = self.data_dir / CLUSTER_ID_FILE
        if not id_file.exists():
            cluster_id = _kafka_cluster_id()
            result = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", f"--config={config}"),
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                raise BrokerError(f"formatting {self.data_dir} failed:\n{result.stdout}{result.stderr}")
            id_file.write_text(cluster_id)
        return config

    def start(self, timeout: float = 60.0) -> LocalBroker:
        if port_open("127.0.0.1", self.port):
            raise BrokerError(f"port {self.port} on 127.0.0.1 is already in use")
        config = self._prepare()
        out = open(self.data_dir / "broker.out", "ab")  # noqa: SIM115 - the broker writes to it while it runs
        self.process = subprocess.Popen(
            self._java("kafka.Kafka", str(config)),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=self.own_session,
        )
        out.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerError(
                    f"broker exited with code {self.process.returncode}; see {self.log_file}"
                    f" and {self.data_dir / 'broker.out'}"
                )
            if port_open("127.0.0.1", self.port):
                # Created only once the port answers, so librdkafka logs no refused connects.
                admin = admin or AdminClient({"bootstrap.servers": self.bootstrap_servers})
                try:
                    metadata = admin.list_topics(timeout=2)
                    if metadata.brokers:
                        return
                except Exception:
                    pass
            time.sleep(0.2)
        self.stop()
        raise BrokerError(f"broker not ready after {timeout:.0f}s; see {self.log_file}")

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("broker did not stop within %.0fs; killing it", timeout)
            self.process.kill()
            self.process.wait()

    def restart(self, timeout: float = 60.0) -> LocalBroker:
        """Stop and start again on the same ports and data: what it had acknowledged is still there."""
        self.stop()
        return self.start(timeout)

    def kill(self) -> None:
        """Hard stop (SIGKILL), for fault tests."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _kafka_cluster_id() -> str:
    """Kafka cluster ids are 16 random bytes in URL-safe base64 without padding."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
