"""The broker's JVM command line: KAFKA_JVM_PERFORMANCE_OPTS replaces the collector and JIT settings, as in
Kafka's own scripts, and leaves the heap, the log set-up and the class path alone."""

from pathlib import Path

from kafka_scheduler.kafka import local_broker
from kafka_scheduler.kafka.local_broker import DEFAULT_JVM_PERFORMANCE_OPTS, JVM_PERFORMANCE_OPTS_VARIABLE, LocalBroker


def command(monkeypatch, tmp_path, value):
    monkeypatch.setattr(local_broker, "jar_paths", lambda bundle: [Path("/jars") / f"{bundle}.jar"])
    if value is None:
        monkeypatch.delenv(JVM_PERFORMANCE_OPTS_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(JVM_PERFORMANCE_OPTS_VARIABLE, value)
    return LocalBroker(9, tmp_path, controller_port=10, heap="300m")._java("kafka.Kafka", "server.properties")


def test_without_the_variable_the_broker_runs_kafkas_default_collector(monkeypatch, tmp_path):
    line = command(monkeypatch, tmp_path, None)
    assert line[1:3] == ["-Xmx300m", "-Xms300m"]
    assert line[3 : 3 + len(DEFAULT_JVM_PERFORMANCE_OPTS)] == list(DEFAULT_JVM_PERFORMANCE_OPTS)
    assert line[-2:] == ["kafka.Kafka", "server.properties"]


def test_the_variable_replaces_the_collector_and_jit_settings_and_nothing_else(monkeypatch, tmp_path):
    line = command(monkeypatch, tmp_path, " -XX:TieredStopAtLevel=1  -XX:+UseSerialGC ")
    assert line[1:5] == ["-Xmx300m", "-Xms300m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    assert not set(DEFAULT_JVM_PERFORMANCE_OPTS) & set(line)
    assert any(part.startswith("-Dlog4j2.configurationFile=") for part in line)
    assert line[line.index("-cp") + 2 :] == ["kafka.Kafka", "server.properties"]


def test_an_empty_variable_leaves_the_jvms_own_defaults(monkeypatch, tmp_path):
    line = command(monkeypatch, tmp_path, "")
    assert line[3].startswith("-Dlog4j2.configurationFile=")
