"""The scheduler job, wired: the engine's streaming query (engine/) with the operations surfaces around it (ops/).

    Kafka source (every input topic) -> dialect decode per topic (Spark SQL, dialects/) -> transformWithState
    (WheelProcessor, RocksDB, processing-time timers) -> foreachBatch RecordSink -> Kafka

Offsets and state live in the checkpoint, so a restart resumes where the last
committed batch ended.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
from functools import partial

from confluent_kafka import TopicPartition

from .config import Config, ConfigError, kafka_settings, masked
from .dialects.common import DecodeSettings
from .engine.driver.batch_summary import BatchSummary, Totals
from .engine.driver.early_cancels import CancelWatcher
from .engine.driver.early_requests import early_decoder
from .engine.driver.exactly_once import TransactionalSender, herd_member, transactional_id
from .engine.driver.prepared_horizon import PreparedHorizon
from .engine.driver.producing import PRODUCER_MAX_BYTES, producer_config
from .engine.driver.record_sink import RecordSink
from .engine.driver.timed_writer import TimedWriter
from .engine.driver.wakeups import Wakeups
from .engine.rules.buckets import BUCKET_MS
from .engine.spark.checkpoint import (
    LocalFiles,
    batch_offsets,
    checkpoint_files,
    committed_offsets,
    is_local,
    last_committed_batch,
    local_path,
    settle_state_settings,
    start_new_generation,
)
from .engine.spark.query import build_stream, reads_all_first
from .engine.spark.session import build_session, driver_jvm_process, plan_class_archive, under_spark_submit
from .engine.spark.warm_workers import warm_python_workers
from .kafka.topics import LOG_APPEND_TIME, TopicDirectory, ensure_topics, wait_for_broker
from .ops.access import AdminAccess
from .ops.actions import RequestWriter
from .ops.http_server import serve
from .ops.input_lag import LagWatcher
from .ops.metrics import SchedulerMetrics
from .ops.status_page import StatusPage

log = logging.getLogger("kafka_scheduler")

GRACEFUL_STOP_TIMEOUT_S = 120.0
TICK_TRIM_EVERY = 100  # batches


def topics_line(checked: list[str], created: list[str]) -> str:
    """The start-up line naming every topic the job checked or created, and which it created."""
    existing = [topic for topic in checked if topic not in created]
    if not created:
        return f"topics: {', '.join(checked)} (exist)"
    return f"topics: {', '.join(checked)} (created {', '.join(created)}" + (
        f"; already there: {', '.join(existing)})" if existing else ")"
    )


class Scheduler:
    """Runs the query until stopped; ``stop()`` lets the batch in flight finish first."""

    def __init__(self, config: Config, from_beginning: bool = False, keep_session: bool = False):
        self.config = config
        self.from_beginning = from_beginning
        # Spark left running at the end, for a driver that runs jobs one after another (bench/shared_driver.py):
        # the next job's start reuses the JVM and its Spark context.
        self.keep_session = keep_session
        self.stop_requested = threading.Event()
        self.totals = Totals()
        self.query = None
        self.jvm_gone = False  # Spark's JVM ended under the job: nothing to stop on it
        self.metrics = SchedulerMetrics(config.input_topics)
        self.page = StatusPage(self.metrics, config.app_id)
        self._started_at = time.monotonic()
        # When this job started: a firing of a skip cron due before it was missed (the job was down).
        self.started_ms = int(time.time() * 1000)
        self._first_batch_logged = False

    def stop(self) -> None:
        self.stop_requested.set()

    def _on_batch(self, summary: BatchSummary) -> None:
        index_before = self.totals.index_total
        self.totals.add(summary)
        self.metrics.record_batch(summary)
        if self.totals.index_total != index_before:
            log.info("index: %d entries", self.totals.index_total)
        if not self._first_batch_logged:
            self._first_batch_logged = True
            log.info("first batch done %.1fs after start", time.monotonic() - self._started_at)
        if summary.busy:
            log.info(summary.log_line())
        if summary.batch_id % TICK_TRIM_EVERY == 0:
            self._trim_ticks()
        if log.isEnabledFor(logging.DEBUG) and self.query is not None and self.query.lastProgress:
            progress = self.query.lastProgress
            log.debug("batch %s timings (ms): %s", progress["batchId"], progress["durationMs"])

    def _batch_offsets(self, batch_id: int) -> dict[str, dict[int, int]] | None:
        """Next offset to read per input partition after batch ``batch_id``, from a local checkpoint's offsets file
        (written before the batch runs); None elsewhere (the watcher learns it once the batch has committed)."""
        if not is_local(self.config.checkpoint_dir):
            return None
        try:
            return batch_offsets(self.config.checkpoint_dir, batch_id)
        except (OSError, ValueError) as exc:
            log.debug("offsets of batch %s not read: %s", batch_id, exc)
            return None

    def _committed_offsets(self) -> dict[str, dict[int, int]]:
        """Next offset to read per input partition as of the last committed batch: from a local checkpoint's files,
        else from the query's last progress (reported once its batch has committed)."""
        if is_local(self.config.checkpoint_dir):
            return committed_offsets(self.config.checkpoint_dir)
        progress = self.query.lastProgress if self.query is not None else None
        if not progress:
            return {}
        offsets = progress["sources"][0]["endOffset"]
        offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
        return {topic: {int(p): int(o) for p, o in partitions.items()} for topic, partitions in (offsets or {}).items()}

    def _trim_ticks(self) -> None:
        """Delete the ticks the last committed batch read. The ticks topic keeps records forever otherwise: a
        time-based retention could delete ticks a stopped job has not read, which Spark reports as data loss."""
        progress = self.query.lastProgress if self.query is not None else None
        if not progress:
            return
        try:
            offsets = progress["sources"][0]["endOffset"]
            offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
            end = (offsets or {}).get(self.config.ticks_topic, {}).get("0")
            if end:
                for future in self.admin.delete_records(
                    [TopicPartition(self.config.ticks_topic, 0, int(end))]
                ).values():
                    future.result(10)
        except Exception as exc:  # next time, then: a few stale ticks cost nothing
            log.debug("ticks not trimmed: %s", exc)

    def run(self) -> int:
        # Served from the start (a port in use fails at once, before anything else starts).
        server = (
            serve(
                self.metrics,
                self.config.metrics_host,
                self.config.metrics_port,
                self.page,
                AdminAccess.from_file(self.config.admin_token_file),
            )
            if self.config.metrics_port
            else None
        )
        try:
            return self._run()
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()

    def _run(self) -> int:
        # A local checkpoint is checked before anything starts, so a refused start costs no Spark start-up. Under
        # spark-submit a plain path is on the cluster's default filesystem, which only Spark's Hadoop reaches.
        settle_first = is_local(self.config.checkpoint_dir) and not under_spark_submit()
        if settle_first:
            self._start_new_generation()
            LocalFiles(self.config.checkpoint_dir).check_writable()
            self._settle_state_settings()
        config = self.config
        options = masked(config.kafka_options)
        log.info(
            "broker: connecting to %s%s",
            config.bootstrap_servers,
            f" (Kafka options: {', '.join(f'{k}={v}' for k, v in options.items())})" if options else "",
        )
        # A broker that is not up yet (started in parallel, restarting) is waited for, for good: said every few
        # seconds in the log, and a stop request ends the wait.
        admin = self.admin = wait_for_broker(
            config.bootstrap_servers, timeout=None, stop=self.stop_requested, settings=kafka_settings(config)
        )
        if admin is None:
            log.info("stopped before the broker answered")
            return 0
        inputs = config.input_topics
        # Other dialects' topics belong to the teams that write them: a missing one is a typo, not ours to create.
        foreign = sorted(t for t, d in inputs.items() if d != "native" and t != config.requests_topic)
        absent = [t for t in foreign if t not in admin.list_topics(timeout=30).topics]
        if absent:
            raise ConfigError(
                f"input topic{'s' if len(absent) > 1 else ''} {', '.join(absent)} "
                f"do{'' if len(absent) > 1 else 'es'} not exist on {config.bootstrap_servers}: "
                f"check --input; the scheduler creates only its own topics"
            )
        own_inputs = [t for t in inputs if t not in foreign]
        wanted = [*own_inputs, config.rejections_topic, config.history_topic]
        # Records as large as the scheduler writes (a request, its rejection or history copy with their headers):
        # a stock broker's 1 MiB default would refuse some the job accepts.
        sized = {"max.message.bytes": str(PRODUCER_MAX_BYTES)}
        # The broker stamps each request as it appends it: requests of one id in different partitions are ordered
        # by those stamps (docs/protocols.md, "Order"), which a producer's clock would not keep in step.
        created = ensure_topics(admin, own_inputs, config.partitions, config={**sized, **LOG_APPEND_TIME})
        created += ensure_topics(
            admin, [config.rejections_topic, config.history_topic], config.partitions, config=sized
        )
        # One partition: a tick only has to be read. Read ticks are deleted by the job (_trim_ticks).
        created += ensure_topics(
            admin, [config.ticks_topic], 1, config={"retention.ms": "-1", "segment.ms": str(600_000)}
        )
        log.info("%s", topics_line([*foreign, *wanted, config.ticks_topic], created))
        resumed = last_committed_batch(config.checkpoint_dir)
        log.info(
            "checkpoint: %s (%s)",
            os.path.abspath(config.checkpoint_dir),
            "new" if resumed is None else f"resuming after batch {resumed}; state restores in the first batch",
        )
        log.info(
            "spark: starting (%s, %d shuffle partitions, %s)",
            "spark-submit" if under_spark_submit() else config.master,
            config.partitions,
            _state_text(config) if settle_first else "state settings checked once Spark is up",
        )
        archive = plan_class_archive(config)
        if archive is not None:
            log.info(archive.start_line())
        spark = build_session(config, class_archive=archive)
        warm_python_workers(spark)
        if not settle_first:
            try:
                self._start_new_generation(spark)
                self._settle_state_settings(spark)
            except BaseException:
                spark.stop()
                raise
            config = self.config
            log.info("checkpoint: %s", _state_text(config))
        # The status page reads the state store with this session, on request only (ops/upcoming.py).
        self.page.attach_state(spark, config.checkpoint_dir, config.shards)
        # The page's buttons write requests with a producer of their own, and wait for the batch that reads them.
        self.page.attach_actions(RequestWriter(kafka_settings(config), inputs, self._committed_offsets))
        run = uuid.uuid4().hex
        sender = self._start_exactly_once(admin) if config.exactly_once else None
        self.writer = (
            TimedWriter(
                config.bootstrap_servers,
                config.max_held,
                rejections_topic=config.rejections_topic,
                sender=sender,
                client_options=kafka_settings(config),
            )
            if config.lookahead or sender
            else None
        )
        if self.writer is not None:
            self.writer.on_written = self.metrics.record_written
        destinations = TopicDirectory(admin)
        # CANCELs of native inputs withdraw what the timed writer holds as they arrive, not a batch later.
        native = [t for t, d in inputs.items() if d == "native"]
        cancels = (
            CancelWatcher(
                self.writer,
                native,
                kafka_settings(config),
                self._committed_offsets,
                on_keyed_apart=self.metrics.record_keyed_apart,
                on_behind=self.metrics.record_early_read_behind,
                # ADDs and REPLACEs due before a batch could reach them go out as read (a copy to the history topic
                # is the batches' to write: with --history every request waits for them)
                early=None
                if config.history
                else early_decoder(
                    DecodeSettings.from_config(config), config.lookahead, partial(destinations.known, wait=True)
                ),
            ).start()
            if self.writer is not None and native
            else None
        )
        self.wakeups = Wakeups(config.bootstrap_servers, config.ticks_topic, client_options=kafka_settings(config))
        self.metrics.follow_next_wakeup(lambda: self.wakeups.next_instant)
        self.sink = RecordSink(
            config,
            destinations,
            self.stop_requested,
            on_batch=self._on_batch,
            writer=self.writer,
            wakeups=self.wakeups,
            sender=sender,
            offsets_read=self._batch_offsets,
            horizon=self._prepared_horizon(spark, settle_first),
        )
        if self.sink.herds is not None:
            self.sink.herds.on_written = self.metrics.record_herd_written
        catching_up = reads_all_first(config)
        lag = None
        try:
            # The same run id, timed writer and wake-ups serve both queries of a catch-up: to them the second
            # query's batches are just the next batches of this driver.
            if catching_up:
                # Read before the query starts: it may plan and commit its batch at once.
                files = checkpoint_files(config, spark)
                planned, committed = files.latest("offsets"), files.last_commit()
            self._start_query(spark, config, run, catching_up)
            if catching_up:
                log.info("catching up: the first batch reads every input to its end before delivering anything")
            self.wakeups.start()
            # Follows self.query, whichever query of a catch-up runs.
            lag = (
                LagWatcher(self.metrics, admin, lambda: self.query.lastProgress, inputs).start()
                if config.metrics_port
                else None
            )
            log.info(
                "running: reading %s; stop with Ctrl-C or SIGTERM", ", ".join(f"{t} ({d})" for t, d in inputs.items())
            )
            if catching_up:
                failed = self._catch_up(spark, config, run, files, planned, committed)
                if failed is not None:
                    return failed
                if not self.stop_requested.is_set():
                    self._start_query(spark, config, run, catching_up=False)
            failed = self._wait()  # after a stop during the catch-up: the ended query's outcome again
            if failed is not None:
                return failed
            log.info("stopped after %d batches: %d delivered", self.totals.batches, self.totals.delivered)
            return 0
        finally:
            if lag is not None:
                lag.close()
            self.wakeups.close()
            if cancels is not None:
                cancels.close()
            self.sink.close()  # its herd writer runs Spark jobs: before the session stops
            if self.writer is not None:
                self.writer.close()
            self.page.detach_state()
            if not self.jvm_gone and not self.keep_session:
                spark.stop()
                if archive is not None and self.stop_requested.is_set():
                    archive.finish(driver_jvm_process(spark))

    def _start_exactly_once(self, admin) -> TransactionalSender:
        """The transactional writer: fences a previous driver of this app and reads back what it wrote."""
        config = self.config
        # One partition keeps the ledger in write order; records are deleted by the job (TransactionalSender.trim).
        ensure_topics(admin, [config.ledger_topic], 1, config={"retention.ms": "-1"})
        sender = TransactionalSender(
            producer_config(config.bootstrap_servers, **kafka_settings(config)),
            config.app_id,
            config.ledger_topic,
            consumer_settings=kafka_settings(config),
        )
        started = time.monotonic()
        # A previous driver's herd tasks may have left transactions open (they would hold back the ledger's read).
        sender.fence_members(herd_member(p) for p in range(config.partitions))
        keys = sender.start()
        log.info(
            "exactly-once: transactional id %s; the ledger %s holds %d record(s) written and not yet retired "
            "(read in %.1fs)",
            transactional_id(config.app_id),
            config.ledger_topic,
            keys,
            time.monotonic() - started,
        )
        return sender

    def _start_new_generation(self, spark=None) -> None:
        if not self.from_beginning:
            return
        moved = start_new_generation(checkpoint_files(self.config, spark))
        if moved is None:
            log.info("checkpoint: --from-beginning: no checkpoint yet, starting a new one")
        else:
            log.info(
                "checkpoint: --from-beginning: kept the old checkpoint aside as %s; every input is read again "
                "from its earliest offset",
                moved,
            )
        self.from_beginning = False

    def _settle_state_settings(self, spark=None) -> None:
        """Take the state settings recorded in the checkpoint, or raise ConfigError (the CLI exits 2 with it)."""
        self.config, notices = settle_state_settings(self.config, BUCKET_MS, checkpoint_files(self.config, spark))
        for notice in notices:
            log.info("checkpoint: %s", notice)

    def _prepared_horizon(self, spark, local: bool) -> PreparedHorizon:
        """How far ahead earlier runs of the checkpoint prepared deliveries (prepared_horizon.py)."""
        files = checkpoint_files(self.config, None if local else spark)
        return PreparedHorizon.read(files, files.has_commit(), self.started_ms)

    def _start_query(self, spark, config: Config, run: str, catching_up: bool) -> None:
        """Start the query on the checkpoint. Catching up, it runs one batch, uncapped, and ends: Spark reads
        every source to its end in a Trigger.Once batch (and ignores read limits there)."""
        writer = (
            build_stream(spark, config, run, capped=not catching_up, started_ms=self.started_ms)
            .writeStream.queryName(config.app_id)
            .foreachBatch(self.sink)
            .option("checkpointLocation", config.checkpoint_dir)
        )
        writer = writer.trigger(once=True) if catching_up else writer.trigger(processingTime=config.trigger_interval)
        self.query = writer.start()

    def _catch_up(
        self, spark, config: Config, run: str, files, planned: int | None, committed: int | None
    ) -> int | None:
        """Wait for the uncapped catch-up batch of the query _start_query started to commit; the exit code if the
        query failed, else None (also when a stop ended it: the caller then starts nothing more). ``planned`` and
        ``committed``: the checkpoint's last planned and last committed batch before that query started."""
        caught_up_in = None
        while True:
            failed = self._wait()
            if failed is not None or self.stop_requested.is_set():
                return failed
            last = files.last_commit()
            if last == committed:  # nothing new to read
                break
            caught_up_in = last
            if planned is None or last > planned:
                break
            # The batch was one planned before this start and not committed: Spark re-runs it as planned (a
            # Trigger.Once query then runs that batch alone), so the rest is read in one more uncapped batch.
            committed = last
            self._start_query(spark, config, run, catching_up=True)
        log.info(
            "caught up: %s; %s",
            "nothing to read" if caught_up_in is None else f"batch {caught_up_in} read every input to its end",
            f"from now on a batch reads at most {config.max_requests_per_batch} requests"
            if config.max_requests_per_batch
            else "batches are not capped (--max-requests-per-batch is off)",
        )
        return None

    def _wait(self) -> int | None:
        """Wait until the query ends or a stop is asked for (then stop it gracefully); the exit code if the query
        failed, else None."""
        from py4j.protocol import Py4JNetworkError
        from pyspark.errors import StreamingQueryException

        query = self.query
        try:
            while not query.awaitTermination(0.2):
                if self.stop_requested.is_set():
                    self._stop_gracefully()
                    break
        except StreamingQueryException:
            pass  # examined below: a batch refused because of the stop is a clean end
        except (Py4JNetworkError, ConnectionError):
            # Out of heap it exits (session.py: ExitOnOutOfMemoryError, its own line above this one), or was killed.
            self.jvm_gone = True
            where = self.config.checkpoint_dir
            committed = last_committed_batch(where) if is_local(where) else None
            log.error(
                "spark: the JVM ended under the job (out of memory, or killed): the job stopped. Nothing is lost: %s",
                f"the next start resumes after batch {committed}"
                if committed is not None
                else "the next start resumes from the checkpoint",
            )
            return 1
        error = query.exception()
        if error is not None and self.sink.refused_batch is None:
            cause = _storage_failure(str(error))
            if cause is not None:
                where = self.config.checkpoint_dir
                local = is_local(where)
                committed = last_committed_batch(where) if local else None
                # Spark also writes to its local folders (shuffle, the state store's working copy).
                named = str(local_path(where)).rstrip("/") in str(error) if local else where in str(error)
                log.error(
                    "%s (%s): the job stopped. Nothing is lost: %s; make room or make it writable and start again",
                    f"checkpoint: cannot write to {where}"
                    if named
                    else f"cannot write to the checkpoint {where} or Spark's local folders (spark.local.dir)",
                    cause,
                    "no batch had committed"
                    if committed is None
                    else f"the next start resumes after batch {committed}",
                )
                log.debug("query failed: %s", _summary(error))
            else:
                log.error("query failed: %s", _summary(error))
            return 1
        return None

    def _stop_gracefully(self) -> None:
        """Wait for the batch in flight to commit, and with a timed writer for one more batch that retires what the
        writer wrote (RecordSink.begin_stop); a batch starting after that writes nothing."""
        log.info("stopping: waiting for the batch in flight")
        # A batch refused by the sink surfaces as a py4j callback error: expected here, not worth a traceback.
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        deadline = time.monotonic() + GRACEFUL_STOP_TIMEOUT_S
        if self.sink.begin_stop():
            while self.query.isActive and not self._committed(self.sink.final_batch) and time.monotonic() < deadline:
                time.sleep(0.02)
            if self._committed(self.sink.final_batch):
                log.info(
                    "stopping: batch %d retired everything the timed writer wrote; what it still held is "
                    "emitted again by the next run",
                    self.sink.final_batch,
                )
        while self.query.isActive and self.query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.02)
        self.query.stop()

    def _committed(self, batch_id: int | None) -> bool:
        progress = self.query.lastProgress
        return batch_id is not None and progress is not None and progress["batchId"] >= batch_id


def _state_text(config: Config) -> str:
    return (
        f"wheel state layout, {config.shards} shards"
        if config.state_layout == "wheel"
        else f"{config.state_layout} state layout"
    )


# What an operating system says when a write fails for lack of room or permission (Java and Python wordings).
STORAGE_FAILURES = (
    "No space left on device",
    "Disk quota exceeded",
    "Read-only file system",
    "Permission denied",
    "File too large",
)


def _storage_failure(text: str) -> str | None:
    """The storage failure a query failure comes from, if any: the checkpoint is the only place the job writes
    files to while it runs."""
    return next((cause for cause in STORAGE_FAILURES if cause in text), None)


def _summary(error: BaseException, limit: int = 600) -> str:
    """The head of a query failure: Spark appends the whole logical plan, which helps nobody here."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def run(config: Config, from_beginning: bool = False) -> int:
    scheduler = Scheduler(config, from_beginning)

    def request_stop(signum, _frame):
        if scheduler.stop_requested.is_set():
            return
        log.info("received %s", signal.Signals(signum).name)
        scheduler.stop()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    return scheduler.run()
