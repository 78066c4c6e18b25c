"""A local SparkSession shared by the unit tests that need Spark SQL (decoding, the sink, Hadoop files)."""

from __future__ import annotations

import os
import signal
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from kafka_scheduler.dialects.sky_avro import java_options
    from kafka_scheduler.engine.spark.session import CODEGEN_CACHE_ENTRIES, HUGE_METHOD_LIMIT
    from kafka_scheduler.kafka.jars import jar_paths

    already_running = SparkSession.getActiveSession() is not None
    session = (
        SparkSession.builder.master("local[1]")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.codegen.hugeMethodLimit", str(HUGE_METHOD_LIMIT))  # as the job: decodes split
        .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))  # as the job
        # generated code, as the job in production (tests/conftest.py's INTERPRETED_SPARK is for the jobs)
        .config("spark.sql.codegen.wholeStage", "true")
        .config("spark.sql.codegen.factoryMode", "FALLBACK")
        .config("spark.driver.extraJavaOptions", java_options())  # as the job: Avro's length limits
        # the connector bundle: from_avro/to_avro (sky-avro) need spark-avro
        .config("spark.jars", ",".join(str(p) for p in jar_paths("spark-kafka")))
        .getOrCreate()
    )
    yield session
    if not already_running:
        session.stop()


@pytest.fixture
def keep_signal_handlers():
    """Tests that call ``run``, which installs its own SIGINT/SIGTERM handlers, leave pytest's in place."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
