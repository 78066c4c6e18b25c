"""Faults at the edges, against a real broker and the real job: a broker that is not there yet at start, a broker
restart mid-run, destinations that refuse a delivery, a checkpoint that cannot be written, a damaged or foreign
checkpoint. The logic without Kafka and Spark: tests/unit/test_edge_faults.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from kafka_scheduler.kafka.local_broker import LocalBroker, free_port
from kafka_scheduler.kafka.topics import admin_client, ensure_topics
from kafka_scheduler.protocol import DELIVERY_ID, REJECTION_REASON, SOURCE_OFFSET, SOURCE_TOPIC

from .support import Kafka, SchedulerProcess, at, ms_of, native, wait_until


@pytest.fixture(scope="module")
def edge_broker(tmp_path_factory):
    """A broker of this module's own, with ACLs enforced (everyone may do anything where a resource has no ACL):
    the tests restart it and deny writes to topics, which other modules' tests must not see."""
    instance = LocalBroker(free_port(), tmp_path_factory.mktemp("edge-broker"), authorizer=True)
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
def edge_kafka(edge_broker):
    helper = Kafka(edge_broker.bootstrap_servers)
    yield helper
    for reader in helper.readers:
        reader.close()


@pytest.fixture
def edge_scheduler(edge_broker, tmp_path):
    started: list[SchedulerProcess] = []

    def make(
        *extra_args: str, app_id: str | None = None, checkpoint_dir: Path | None = None, launcher=None
    ) -> SchedulerProcess:
        app_id = app_id or f"edge-{uuid.uuid4().hex[:8]}"
        kwargs = {} if launcher is None else {"launcher": launcher}
        process = SchedulerProcess(
            edge_broker.bootstrap_servers,
            app_id,
            checkpoint_dir or tmp_path / app_id,
            tmp_path / f"{app_id}.log",
            extra_args,
            **kwargs,
        )
        started.append(process)
        return process

    yield make
    for process in started:
        process.stop()


def deny_writes(bootstrap: str, topic: str) -> None:
    """An ACL denying the scheduler (every PLAINTEXT client is User:ANONYMOUS) writes to ``topic``."""
    binding = AclBinding(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        "User:ANONYMOUS",
        "*",
        AclOperation.WRITE,
        AclPermissionType.DENY,
    )
    admin = admin_client(bootstrap)  # kept until the result is in: a client collected early cancels its requests
    for future in admin.create_acls([binding]).values():
        future.result(30)


def request(to: str, deliver_at: str, request_id: str, value: bytes = b"v") -> dict:
    return {"key": request_id.encode(), "value": value, "headers": native(to, deliver_at, request_id)}


# ---------------------------------------------------------------- 1. no broker yet at start


def test_a_scheduler_started_before_its_broker_waits_says_so_and_runs_once_it_appears(tmp_path):
    port = free_port()
    address = f"127.0.0.1:{port}"
    scheduler = SchedulerProcess(address, "early", tmp_path / "checkpoint", tmp_path / "scheduler.log")
    broker = LocalBroker(port, tmp_path / "broker")
    try:
        scheduler.start(wait=False)
        wait_until(
            lambda: f"broker: waiting for {address} (connection refused)" in scheduler.log(),
            180,
            "the scheduler to say it waits for the broker",
            guard=scheduler.assert_running,
        )
        assert "spark: starting" not in scheduler.log()
        broker.start()
        wait_until(
            lambda: "running: reading" in scheduler.log(),
            180,
            "the scheduler to run once the broker is up",
            guard=scheduler.assert_running,
        )
        assert f"broker: {address} answered after" in scheduler.log()
        kafka = Kafka(address)
        destination = kafka.topic("late-broker-out")
        reader = kafka.reader(destination)
        due = at(1)
        kafka.produce("early-schedule-requests", key=b"k", value=b"arrived", headers=native(destination, due, "r-1"))
        [record] = reader.wait_for(lambda r: True, timeout=180, what="the delivery", guard=scheduler.assert_running)
        assert record.value == b"arrived" and record.timestamp_ms >= ms_of(due)
        reader.close()
    finally:
        assert scheduler.stop() == 0
        broker.stop()


# ---------------------------------------------------------------- 2. broker restart mid-run


def test_a_broker_restart_mid_run_loses_nothing_and_delivers_nothing_early(edge_broker, edge_kafka, edge_scheduler):
    scheduler = edge_scheduler().start()
    destination = edge_kafka.topic("restart-out", partitions=2)
    reader = edge_kafka.reader(destination)
    requests_topic = f"{scheduler.app_id}-schedule-requests"
    mark = scheduler.mark(timeout=180)
    # Pending across the restart (some fall due while the broker is away, some are held by the timed writer), some
    # due at once; the job has read them all before the broker goes.
    before = [request(destination, at(-1 if i < 5 else 4 + 0.5 * i), f"before-{i}") for i in range(40)]
    edge_kafka.produce_many(requests_topic, before)
    scheduler.outcomes_since(mark, len(before), timeout=180)
    edge_broker.restart()
    after = [request(destination, at(-1 if i < 5 else 0.5 * i), f"after-{i}") for i in range(20)]
    edge_kafka.produce_many(requests_topic, after)

    wanted = {r["key"]: ms_of(r["headers"][1][1].decode()) for r in before + after}
    records = reader.wait_for(
        lambda r: True, count=len(wanted), timeout=180, what="every delivery", guard=scheduler.assert_running
    )
    # Waits for the count of records, so a duplicate could stand in for a lost one: check the set too.
    wait_until(
        lambda: {r.key for r in reader.poll()} >= set(wanted),
        180,
        f"every id delivered: missing {sorted(set(wanted) - {r.key for r in reader.records})[:5]}",
        guard=scheduler.assert_running,
    )
    records = reader.read_to_end()
    early = [(r.key, r.timestamp_ms - wanted[r.key]) for r in records if r.timestamp_ms < wanted[r.key]]
    assert not early, f"delivered before their due time (key, ms early): {early}"
    by_key: dict = {}
    for r in records:
        by_key.setdefault(r.key, set()).add(r.header(DELIVERY_ID))
    assert all(len(ids) == 1 for ids in by_key.values()), "a duplicate carries its first delivery's id"
    scheduler.assert_running()


# ---------------------------------------------------------------- 3. destinations that refuse a delivery


@pytest.mark.parametrize("extra_args", [(), ("--lookahead", "0s")], ids=["timed-writer", "spark-sink"])
def test_deliveries_a_destination_refuses_become_rejections_and_the_rest_flows(
    edge_broker, edge_kafka, edge_scheduler, extra_args
):
    bootstrap = edge_broker.bootstrap_servers
    scheduler = edge_scheduler(*extra_args).start()
    ok = edge_kafka.topic("ok")
    small = f"small-{uuid.uuid4().hex[:10]}"
    ensure_topics(admin_client(bootstrap), [small], 1, config={"max.message.bytes": "2000"})
    denied = edge_kafka.topic("denied")
    deny_writes(bootstrap, denied)
    missing = f"missing-{uuid.uuid4().hex[:10]}"
    rejections = f"{scheduler.app_id}-schedule-rejections"
    reader = edge_kafka.reader(ok, small, rejections)
    big = b"x" * 5000
    later = at(6)  # prepared ahead and held by the timed writer (with a lookahead), or written by a later batch
    requests = [
        request(ok, at(-1), "ok-now"),
        request(ok, later, "ok-later"),
        request(small, at(-1), "fits-now", b"y" * 100),
        request(small, later, "fits-later", b"y" * 100),
        request(small, at(-1), "big-now", big),
        request(small, later, "big-later", big),
        request(denied, at(-1), "denied-now"),
        request(denied, later, "denied-later"),
        request(missing, at(-1), "missing-now"),
    ]
    offsets = dict(
        zip((r["key"] for r in requests), edge_kafka.produce_many(f"{scheduler.app_id}-schedule-requests", requests))
    )
    delivered = reader.wait_for(
        lambda r: r.topic != rejections, count=4, timeout=180, what="the deliveries", guard=scheduler.assert_running
    )
    rejected = reader.wait_for(
        lambda r: r.topic == rejections, count=5, timeout=180, what="the rejections", guard=scheduler.assert_running
    )
    assert {(r.topic, r.key) for r in delivered} == {
        (ok, b"ok-now"),
        (ok, b"ok-later"),
        (small, b"fits-now"),
        (small, b"fits-later"),
    }
    reasons = {r.key: r.header(REJECTION_REASON).decode() for r in rejected}
    too_large = re.compile(
        r"record of (\d+) bytes \(key, value and headers\) is too large for destination topic "
        + re.escape(f"'{small}' (max.message.bytes 2000)")
    )
    for key in (b"big-now", b"big-later"):
        match = too_large.fullmatch(reasons.pop(key, ""))
        assert match and 5000 < int(match[1]) < 5200, (key, reasons)
    assert reasons == {
        b"denied-now": f"not authorized to write to destination topic '{denied}'",
        b"denied-later": f"not authorized to write to destination topic '{denied}'",
        b"missing-now": f"destination topic '{missing}' does not exist",
    }
    for record in rejected:
        assert record.header(SOURCE_TOPIC) == f"{scheduler.app_id}-schedule-requests".encode()
        assert int(record.header(SOURCE_OFFSET)) == offsets[record.key][1]
        assert record.value == (big if record.key.startswith(b"big") else b"v")

    # Refused although the sink's look at the metadata (cached) said writable: an ACL added since the topic was last
    # written. The timed writer, or Spark's failed write tried again on fresh metadata, makes it a rejection.
    raced = edge_kafka.topic("raced")
    reader = edge_kafka.reader(ok, raced, rejections)
    requests_topic = f"{scheduler.app_id}-schedule-requests"
    edge_kafka.produce(requests_topic, key=b"first", value=b"v", headers=native(raced, at(-1), "first"))
    reader.wait_for(
        lambda r: r.key == b"first", timeout=180, what="a delivery to the raced topic", guard=scheduler.assert_running
    )
    deny_writes(bootstrap, raced)
    edge_kafka.produce_many(requests_topic, [request(raced, at(-1), "second"), request(ok, at(-1), "after")])
    [second] = reader.wait_for(
        lambda r: r.key == b"second", timeout=180, what="the raced rejection", guard=scheduler.assert_running
    )
    assert second.topic == rejections
    assert second.header(REJECTION_REASON) == f"not authorized to write to destination topic '{raced}'".encode()
    # The job goes on: the other delivery of that batch arrived.
    reader.wait_for(
        lambda r: r.key == b"after" and r.topic == ok,
        timeout=180,
        what="a delivery after the refusals",
        guard=scheduler.assert_running,
    )


# ---------------------------------------------------------------- 4. a checkpoint that cannot be written


def private_tmpfs_launcher(mount_point: Path, options: str, fill: bool = False) -> tuple:
    """Runs the scheduler in a mount namespace of its own where ``mount_point`` is a tmpfs (user namespaces let a
    process mount one without privileges), filled up first if ``fill``."""
    script = (
        'mkdir -p "$1" && mount -t tmpfs -o "$2" tmpfs "$1" || exit 97; '
        'if [ "$3" = fill ]; then cat /dev/zero > "$1/filler" 2>/dev/null; fi; shift 3; exec "$@"'
    )
    return (
        "unshare",
        "--user",
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        script,
        "sh",
        str(mount_point),
        options,
        "fill" if fill else "-",
        sys.executable,
        "-m",
        "kafka_scheduler",
    )


def private_mounts_work() -> bool:
    try:
        probe = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=16k tmpfs /mnt"]
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


needs_private_mounts = pytest.mark.skipif(
    not shutil.which("unshare") or not private_mounts_work(),
    reason="no user namespaces here: cannot mount a read-only or full tmpfs",
)


@needs_private_mounts
@pytest.mark.parametrize(
    "options,fill,cause",
    [("ro,size=64k", False, "Read-only file system"), ("size=64k", True, "No space left on device")],
    ids=["read-only", "full"],
)
def test_an_unwritable_or_full_checkpoint_is_one_error_and_exit_2_at_start(
    edge_scheduler, tmp_path, options, fill, cause
):
    mount_point = tmp_path / "mnt"
    scheduler = edge_scheduler(
        checkpoint_dir=mount_point / "ckpt", launcher=private_tmpfs_launcher(mount_point, options, fill)
    ).start(wait=False)
    code = scheduler.process.wait(120)
    log = scheduler.log()
    assert code == 2, log
    errors = [line for line in log.splitlines() if "error" in line.lower()]
    assert errors == [
        f"kafka-scheduler run: error: cannot write to checkpoint {mount_point}/ckpt: {cause}; the "
        f"scheduler keeps its offsets and state there: make it writable and give it room, or use "
        f"another --checkpoint-dir"
    ], log
    assert "spark: starting" not in log and "Traceback" not in log


@needs_private_mounts
def test_a_checkpoint_that_fills_up_mid_run_stops_the_job_with_one_error_and_exit_1(
    edge_kafka, edge_scheduler, tmp_path
):
    mount_point = tmp_path / "mnt"
    scheduler = edge_scheduler(
        checkpoint_dir=mount_point / "ckpt", launcher=private_tmpfs_launcher(mount_point, "size=32m")
    ).start()
    destination = edge_kafka.topic("full-out")
    # The tmpfs is in the scheduler's mount namespace: reached through its /proc root.
    inside = Path(f"/proc/{scheduler.process.pid}/root{mount_point}")
    scheduler.checkpoint_dir = inside / "ckpt"
    committed = scheduler.mark(timeout=180)
    filler = inside / "filler"
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
        except OSError:
            pass
    edge_kafka.produce(
        f"{scheduler.app_id}-schedule-requests", key=b"k", value=b"v", headers=native(destination, at(0), "r-1")
    )
    code = scheduler.process.wait(300)  # a hang fails here
    log = scheduler.log_since(committed)
    assert code == 1, log[-3000:]
    ours = [line for line in log.splitlines() if " ERROR " in line and "checkpoint:" in line]
    assert len(ours) == 1, log[-3000:]
    assert f"checkpoint: cannot write to {mount_point}/ckpt (No space left on device): the job stopped." in ours[0]


# ---------------------------------------------------------------- 5. a damaged or foreign checkpoint


def run_once(bootstrap: str, app_id: str, checkpoint: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kafka_scheduler",
            "run",
            "--bootstrap-servers",
            bootstrap,
            "--app-id",
            app_id,
            "--checkpoint-dir",
            str(checkpoint),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_a_damaged_or_foreign_checkpoint_is_refused_with_one_line(edge_broker, edge_kafka, edge_scheduler, tmp_path):
    scheduler = edge_scheduler().start()
    scheduler.mark(timeout=180)
    assert scheduler.stop() == 0
    real = scheduler.checkpoint_dir

    other_app = run_once(edge_broker.bootstrap_servers, "someone-else", real)
    assert other_app.returncode == 2
    assert other_app.stderr.strip().splitlines()[-1] == (
        f"kafka-scheduler run: error: checkpoint {real} belongs to app id {scheduler.app_id} (recorded at its first "
        f"run), not someone-else: its offsets and state are that app's. Run with --app-id {scheduler.app_id}, or use "
        f"another --checkpoint-dir"
    )

    damaged = tmp_path / "damaged"
    shutil.copytree(real, damaged)
    latest = max((damaged / "offsets").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    latest.write_bytes(latest.read_bytes()[:20])  # cut short, as a disk failure might leave it
    result = run_once(edge_broker.bootstrap_servers, scheduler.app_id, damaged)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"kafka-scheduler run: error: checkpoint {damaged} is damaged: offsets/{latest.name} ")
    )
    assert "Traceback" not in result.stderr and "spark: starting" not in result.stderr
