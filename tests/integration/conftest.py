"""Fixtures for tests against a real Kafka broker and the real scheduler job (Spark).

The broker is started by the project's own launcher on free loopback ports, once per
test session. Schedulers run as `python -m kafka_scheduler run` subprocesses, exactly
as a user runs them, and are stopped with SIGTERM.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from kafka_scheduler.kafka.local_broker import LocalBroker, free_port

from .support import Kafka, SchedulerProcess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    instance = LocalBroker(free_port(), tmp_path_factory.mktemp("broker"))
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
def kafka(broker):
    helper = Kafka(broker.bootstrap_servers)
    yield helper
    for reader in helper.readers:
        reader.close()


@pytest.fixture(scope="module")
def scheduler_factory(broker, tmp_path_factory):
    started: list[SchedulerProcess] = []

    def make(
        app_id: str | None = None, checkpoint_dir: Path | None = None, extra_args=(), **kwargs
    ) -> SchedulerProcess:
        app_id = app_id or f"app-{uuid.uuid4().hex[:8]}"
        base = tmp_path_factory.mktemp(app_id)
        process = SchedulerProcess(
            broker.bootstrap_servers,
            app_id,
            checkpoint_dir or base / "checkpoint",
            base / "scheduler.log",
            extra_args,
            **kwargs,
        )
        started.append(process)
        return process

    yield make
    for process in started:
        process.stop()


@pytest.fixture(scope="session")
def chromium():
    """Debian's chromium, installed by scripts/ensure-chromium.sh where missing (as root, as CI runs)."""
    found = subprocess.run([str(ROOT / "scripts" / "ensure-chromium.sh")], capture_output=True, text=True, timeout=600)
    assert found.returncode == 0, f"headless Chromium is needed for this test: {found.stderr.strip()}"
    return found.stdout.strip().splitlines()[-1]
