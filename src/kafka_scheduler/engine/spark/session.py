"""The Spark session of the job (and of the tools that read its checkpoint): the settings the engine depends on."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from ...config import Config
from ...dialects.sky_avro import JVM_LIMITS as AVRO_LIMITS
from ...dialects.sky_avro import java_options as avro_java_options
from ...kafka.jars import jar_paths
from .class_archive import ClassArchive, folder_of
from .cpu_priority import lower_engine_priority
from .stop_signals import engine_deaf_to_sigterm

LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")
EXIT_ON_OUT_OF_MEMORY = "-XX:+ExitOnOutOfMemoryError"
# HotSpot's optimising compiler (C2, tier 4) takes only code about four times as hot as by default. On two cores a
# job's start spent more CPU in the JIT than in its own work, much of it C2 compiling the SQL parser and Janino, code
# hot only while the job starts (docs/measurements.md, "A restart's JVM"). The code a running job keeps hot reaches
# the thresholds within seconds all the same: bench restart with 1,000,000 pending a second faster (mean 15.25 ->
# 14.3 s, a spread as large), ingest unchanged (docs/measurements.md, "C2 later").
LATE_C2 = (
    "-XX:Tier4InvocationThreshold=20000 -XX:Tier4MinInvocationThreshold=8000"
    " -XX:Tier4CompileThreshold=60000 -XX:Tier4BackEdgeThreshold=160000"
)
STATE_STORE_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
ROCKSDB_MEMORY_MB = 256
MALLOC_ARENAS = "2"
HUGE_METHOD_LIMIT = 8000  # HotSpot's HugeMethodLimit
CODEGEN_CACHE_ENTRIES = 1000
ARROW_BYTES_UNBOUNDED = 2**31 - 1  # the value at which Spark skips the per-row size check

log = logging.getLogger(__name__)


def under_spark_submit() -> bool:
    """spark-submit starts Python with a gateway already running and sets master and jars itself."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_settings(config: Config, jvm_options: str = "", class_archive: ClassArchive | None = None) -> dict[str, str]:
    """``jvm_options``: more options for the JVM (engine/spark/state_reader.py gives a tool's short-lived one its
    own); ``class_archive``: the driver JVM's (class_archive.py)."""
    java_options = f"-Dlog4j2.configurationFile={LOG4J2_CONFIG} {avro_java_options()} {EXIT_ON_OUT_OF_MEMORY} {LATE_C2}"
    java_options += f" {jvm_options}" if jvm_options else ""
    settings = {
        "spark.app.name": f"kafka-scheduler:{config.app_id}",
        "spark.sql.shuffle.partitions": str(config.partitions),
        STATE_STORE_PROVIDER: ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # One memory budget for every RocksDB instance of the state (block cache and write buffers): unbounded, the
        # JVM's resident memory keeps rising over a long soak while its heap stays level (docs/measurements.md,
        # soaks).
        "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
        "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": str(ROCKSDB_MEMORY_MB),
        # glibc gives each thread that allocates natively an arena of its own (up to 8 per core), and RocksDB's
        # and Netty's many threads leave them fragmented: two arenas keep the native heap from creeping.
        "spark.executorEnv.MALLOC_ARENA_MAX": MALLOC_ARENAS,
        # Spark keeps Python workers per environment, and the state step's runner adds this variable where the
        # workers' warm-up (warm_workers.py) does not: without it here too, the first batch starts a daemon and
        # workers of its own and the warm ones are never used.
        "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK": "1",
        # Spark deletes a version only once a newer snapshot (one every state_snapshot_every versions) leaves it
        # more than state_batches_kept behind: the state's disk is bounded in batches, not in time, and a job with
        # few, heavy batches (crons) reaches its steady size late.
        "spark.sql.streaming.minBatchesToRetain": str(config.state_batches_kept),
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": str(config.state_snapshot_every),
        # No micro-batch without new input: an idle job then costs next to nothing. Timers fire in the batches
        # the driver's wake-up ticks cause (driver.wakeups).
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        # How often an idle query asks Kafka for new offsets: each ask costs JVM CPU, and the default 10 ms keeps a
        # good part of a core busy doing nothing (bench idle). A request or tick waits at most this long to be seen;
        # prepared deliveries are unaffected (ticked --lookahead ahead).
        "spark.sql.streaming.pollingDelay": "200ms",
        "spark.sql.session.timeZone": "UTC",
        # HotSpot never compiles a method of more than 8,000 bytes of bytecode (-XX:+DontCompileHugeMethods), and
        # the decode's whole-stage method is larger: it would run interpreted, most of a batch's JVM time during
        # ingest. At this limit Spark splits such a stage instead (docs/measurements.md, ingest).
        "spark.sql.codegen.hugeMethodLimit": str(HUGE_METHOD_LIMIT),
        # Spark keeps the classes it generates in a cache of 100 by default; a job's query and sink need about as
        # many, so the cache would churn and every batch compile some of them again with Janino, each a new class
        # for the JVM to load.
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
        # Spark checks an Arrow batch's size in bytes after every row it sends to the state step unless the limit
        # is Int.MaxValue, and the size of a list column (headers) is recomputed over the whole batch each time: a
        # quarter of the JVM's time during ingest. Batches stay bounded by rows (maxRecordsPerBatch, 10,000).
        "spark.sql.execution.arrow.maxBytesPerBatch": str(ARROW_BYTES_UNBOUNDED),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": config.driver_memory,
        # Avro's limits keep a hostile Sky Avro value from making the JVM allocate gigabytes (dialects/sky_avro.py).
        # A JVM out of heap exits: Spark's threads die one by one on an OutOfMemoryError and the query hangs with
        # the process alive (seen: a herd of 1,000,000 with --exactly-once at --driver-memory 1g), where an exit
        # lets the driver stop with an error and a supervisor start it again.
        "spark.driver.extraJavaOptions": java_options
        + (f" {class_archive.jvm_options()}" if class_archive is not None else ""),
        "spark.executor.extraJavaOptions": java_options,
    }
    if not under_spark_submit():
        settings["spark.master"] = config.master
        settings["spark.jars"] = ",".join(str(p) for p in jar_paths("spark-kafka"))
    return settings


def plan_class_archive(config: Config) -> ClassArchive | None:
    """The class archive the job's driver JVM starts on or writes (--class-archive); None when off, or under
    spark-submit, whose driver JVM is running before the job's code (docs/deployment.md), or when this process has
    started one already (a shared driver: bench/shared_driver.py)."""
    folder = folder_of(config.class_archive)
    if folder is None or under_spark_submit():
        return None
    from pyspark import SparkContext

    if SparkContext._gateway is not None:
        return None
    # Everything the JVM is started with, as far as it can tell an archive apart.
    options = " ".join(
        [
            spark_settings(config)["spark.driver.extraJavaOptions"],
            f"-Xmx{config.driver_memory}",
            os.environ.get("SPARK_SUBMIT_OPTS", ""),
        ]
    )
    return ClassArchive.plan(folder, options)


def build_session(config: Config, jvm_options: str = "", class_archive: ClassArchive | None = None):
    # The Python workers must run the interpreter that has this package and its dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Before the JVM starts (it inherits it; under spark-submit it has started: see docs/deployment.md).
    os.environ.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENAS)
    if config.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in spark_settings(config, jvm_options, class_archive).items():
        builder = builder.config(key, value)
    with engine_deaf_to_sigterm():  # only the driver acts on a stop (stop_signals.py)
        spark = builder.getOrCreate()
    # Before its first job, so its task threads and Python workers take the same priority.
    lower_engine_priority(driver_jvm_process(spark), config.engine_niceness, config.master.startswith("local"))
    # Under spark-submit the driver's JVM was started before these settings: give it Avro's limits directly
    # (Avro reads them when it first decodes, which is later).
    for name, value in AVRO_LIMITS.items():
        spark.sparkContext._jvm.java.lang.System.setProperty(name, str(value))
    spark.sparkContext.setLogLevel("WARN")
    quiet_when_the_jvm_ends(spark)
    return spark


def driver_jvm_process(spark):
    """The Popen of the JVM this driver launched (None under spark-submit, or when it did not launch one)."""
    gateway = getattr(type(spark.sparkContext), "_gateway", None)
    return getattr(gateway, "proc", None)


def quiet_when_the_jvm_ends(spark) -> None:
    """When the JVM ends under the driver (out of heap, killed), py4j and PySpark's accumulator server each print a
    traceback of the broken connection; the job says it in one line instead (pipeline.Scheduler._wait)."""
    # py4j logs its connection errors through the root logger ("Exception while sending command.", a traceback).
    logging.getLogger().addFilter(lambda record: f"{os.sep}py4j{os.sep}" not in record.pathname)
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda _request, _address: log.debug("accumulator server: %s", sys.exc_info()[1])
