"""Fixtures for tests against a real Kafka broker and the real scheduler job (Spark).

The broker is started by the project's own launcher on free loopback ports, once per
test session. Schedulers run as `python -m kafka_scheduler run` subprocesses, exactly
as a user runs them, and are stopped with SIGTERM.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Optional

import pytest

from kafka_scheduler.kafka.local_broker import LocalBroker, free_port

from .support import Kafka, SchedulerProcess


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

    def make(app_id: Optional[str] = None, checkpoint_dir: Optional[Path] = None, extra_args=(),
             **kwargs) -> SchedulerProcess:
        app_id = app_id or f"app-{uuid.uuid4().hex[:8]}"
        base = tmp_path_factory.mktemp(app_id)
        process = SchedulerProcess(broker.bootstrap_servers, app_id, checkpoint_dir or base / "checkpoint",
                                   base / "scheduler.log", extra_args, **kwargs)
        started.append(process)
        return process

    yield make
    for process in started:
        process.stop()
