"""Every native-protocol rule, tried from outside: requests produced by an independent Kafka
client (confluent-kafka, raw headers) to a running `kafka-scheduler run`, deliveries read
back from the broker.

"Nothing arrives" is never shown by sleeping: a marker schedule due after the event in
question is sent last, and once it has arrived and a batch that applied it has committed,
nothing earlier can still come (``marker_arrives``).
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from kafka_scheduler.harness import process_tree
from kafka_scheduler.harness.job_process import FIRST_BATCH_LINE

from .support import at, ms_of, native

ADD_WAIT = 90  # seconds a test waits for a delivery before failing


@pytest.fixture(scope="module", params=["wheel"])
def scheduler(request, scheduler_factory):
    """Every rule is checked against both state layouts."""
    process = scheduler_factory(app_id=f"proto-{request.param}", extra_args=("--state-layout", request.param))
    yield process.start()
    assert process.stop() == 0, process.log()[-3000:]


def requests_topic_of(scheduler) -> str:
    return f"{scheduler.app_id}-schedule-requests"


@pytest.fixture
def requests_topic(scheduler):
    return requests_topic_of(scheduler)


def send(kafka, requests_topic, key=None, value=None, headers=None, partition=0):
    """Requests go to one partition here so their order is the order sent."""
    return kafka.produce(requests_topic, key=key, value=value, headers=headers, partition=partition)


def send_together(kafka, requests_topic, *requests):
    """Requests (key, value, headers) appended at once, so the job reads them in one batch: a request that must act
    before an earlier one's due time is not left to a later batch, which on a busy machine may start after it."""
    return kafka.produce_many(
        requests_topic, [dict(key=key, value=value, headers=headers, partition=0) for key, value, headers in requests]
    )


def marker_arrives(kafka, scheduler, reader, topic, due_in=2.0):
    """Send a marker due after everything before it, wait for it, then for a committed batch that applied it, then
    read ``topic`` to its end. The marker alone proves nothing about what came before it: it may be written as it
    was read (timed_writer.TimedWriter.read_early) while an earlier request goes by a batch (its destination not yet
    looked up, say). A committed batch has written everything due by its time that it or a batch before it made."""
    marker = f"marker-{uuid.uuid4().hex[:8]}".encode()
    requests_topic = requests_topic_of(scheduler)
    partition, offset = send(kafka, requests_topic, key=marker, value=b"m", headers=native(topic, at(due_in)))
    reader.wait_for(lambda r: r.key == marker, timeout=ADD_WAIT, what="marker")
    scheduler.wait_applied(requests_topic, partition, offset)
    reader.read_to_end()


def test_add_with_id_is_delivered_at_its_due_time_never_before(kafka, requests_topic):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    due = at(4)
    partition, offset = send(kafka, requests_topic, b"k1", b"v1", native(topic, due, "add-1"))
    [record] = reader.wait_for(lambda r: r.key == b"k1", timeout=ADD_WAIT, what="delivery")
    assert record.value == b"v1"
    assert record.timestamp_ms >= ms_of(due), "delivered before its due time"
    assert record.header("x-scheduler-delivery-id") == f"{requests_topic}-{partition}-{offset}".encode()


def test_the_first_batch_uses_the_warm_python_workers(kafka, scheduler, requests_topic):
    """The workers warmed while the query started (engine/spark/warm_workers.py) are the ones the batches use: one
    Python daemon in the job (its workers are its forks). A second daemon means the batches' workers are keyed apart
    from the warm-up's and were started cold (seen: an environment variable only the state step's runner set)."""
    topic = kafka.topic("warm")
    reader = kafka.reader(topic)
    send(kafka, requests_topic, key=b"warm", headers=native(topic, at(0), "warm"))
    reader.wait_for(lambda r: r.key == b"warm", timeout=120, what="a delivery", guard=scheduler.assert_running)
    scheduler.wait_for_line(FIRST_BATCH_LINE, 60, "the first batch's line")
    pythons = [
        pid
        for pid, command in process_tree.command_lines(scheduler.process.pid).items()
        if " -m pyspark.daemon" in command
    ]
    forks = {child for pid in pythons for child in process_tree.descendants(pid) if child != pid}
    daemons = [pid for pid in pythons if pid not in forks]
    assert len(daemons) == 1, f"{len(daemons)} Python daemons, {len(forks)} workers"


def test_add_without_id_and_without_action_header(kafka, requests_topic):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    due = at(3)
    send(kafka, requests_topic, b"anon", b"x", native(topic, due))
    [record] = reader.wait_for(lambda r: r.key == b"anon", timeout=ADD_WAIT, what="delivery")
    assert record.timestamp_ms >= ms_of(due)


def test_key_value_and_headers_pass_through_byte_exact_and_request_headers_are_stripped(kafka, requests_topic):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    key, value = b"\x00\xffkey\x80", bytes(range(256)) * 4
    user_headers = [("trace", b"\x01\x02"), ("dup", b"a"), ("dup", b"b"), ("empty", b""), ("nullh", None)]
    # Request headers in mixed case are request headers too, and are stripped.
    request = native(topic, at(2), "exact-1", "add") + [("X-Scheduler-Extra", b"ignored")]
    send(kafka, requests_topic, key, value, user_headers[:2] + request + user_headers[2:])
    [record] = reader.wait_for(lambda r: r.key == key, timeout=ADD_WAIT, what="delivery")
    assert record.value == value
    assert record.headers[:-1] == user_headers
    assert record.headers[-1][0] == "x-scheduler-delivery-id"


def test_null_value_is_delivered_as_null_and_null_key_stays_null(kafka, requests_topic):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    send(kafka, requests_topic, None, None, native(topic, at(1), "tomb-1", extra=[("who", b"tombstone")]))
    [record] = reader.wait_for(lambda r: ("who", b"tombstone") in r.headers, timeout=ADD_WAIT, what="delivery")
    assert record.value is None and record.key is None


def test_due_time_in_the_past_is_delivered_immediately(kafka, requests_topic):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    send(kafka, requests_topic, b"past", b"p", native(topic, "2001-01-01T00:00:00Z", "past-1"))
    send(kafka, requests_topic, b"offset", b"o", native(topic, "2001-01-01T02:00:00+02:00"))
    records = reader.wait_for(lambda r: r.key in (b"past", b"offset"), count=2, timeout=ADD_WAIT, what="deliveries")
    assert {r.value for r in records} == {b"p", b"o"}


def test_replace_moves_the_schedule_and_the_old_version_never_fires(kafka, requests_topic, scheduler):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    new_due = at(6)
    send_together(
        kafka,
        requests_topic,
        (b"r", b"old", native(topic, at(3), "rep-1")),
        (b"r", b"new", native(topic, new_due, "rep-1", "REPLACE")),
    )
    [record] = reader.wait_for(lambda r: r.key == b"r", timeout=ADD_WAIT, what="replaced delivery")
    assert record.value == b"new"
    assert record.timestamp_ms >= ms_of(new_due)
    marker_arrives(kafka, scheduler, reader, topic)
    assert [r.value for r in reader.poll() if r.key == b"r"] == [b"new"]


def test_replace_with_a_past_time_delivers_now_and_the_old_one_never_fires(kafka, requests_topic, scheduler):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    send_together(
        kafka,
        requests_topic,
        (b"rp", b"old", native(topic, at(8), "rep-past")),
        (b"rp", b"new", native(topic, "2020-01-01T00:00:00Z", "rep-past", "REPLACE")),
    )
    reader.wait_for(lambda r: r.key == b"rp", timeout=ADD_WAIT, what="delivery")
    marker_arrives(kafka, scheduler, reader, topic, due_in=10)
    assert [r.value for r in reader.poll() if r.key == b"rp"] == [b"new"]


def test_replace_of_an_unknown_id_acts_as_add(kafka, requests_topic):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    send(kafka, requests_topic, b"ru", b"v", native(topic, at(2), "never-seen", "REPLACE"))
    [record] = reader.wait_for(lambda r: r.key == b"ru", timeout=ADD_WAIT, what="delivery")
    assert record.value == b"v"


def test_identical_replace_is_a_noop_and_keeps_the_first_version(kafka, requests_topic, scheduler):
    mark = scheduler.mark()
    topic = kafka.topic()
    reader = kafka.reader(topic)
    due = at(5)
    partition, offset = send(kafka, requests_topic, b"same", b"s", native(topic, due, "noop-1", extra=[("h", b"1")]))
    send(kafka, requests_topic, b"same", b"s", native(topic, due, "noop-1", "REPLACE", extra=[("h", b"1")]))
    [record] = reader.wait_for(lambda r: r.key == b"same", timeout=ADD_WAIT, what="delivery")
    assert record.header("x-scheduler-delivery-id") == f"{requests_topic}-{partition}-{offset}".encode()
    marker_arrives(kafka, scheduler, reader, topic)
    assert len([r for r in reader.poll() if r.key == b"same"]) == 1
    # The ADD, its identical REPLACE, and the marker's ADD: nothing else was logged since the test began.
    assert scheduler.outcomes_since(mark, 3) == Counter({"scheduled": 2, "replace_noop": 1})


def test_add_with_a_pending_id_behaves_as_replace(kafka, requests_topic, scheduler):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    send_together(
        kafka,
        requests_topic,
        (b"aa", b"first", native(topic, at(3), "add-twice")),
        (b"aa", b"second", native(topic, at(5), "add-twice")),
    )
    reader.wait_for(lambda r: r.key == b"aa", timeout=ADD_WAIT, what="delivery")
    marker_arrives(kafka, scheduler, reader, topic)
    assert [r.value for r in reader.poll() if r.key == b"aa"] == [b"second"]


def test_cancel_removes_the_pending_schedule(kafka, requests_topic, scheduler):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    send_together(
        kafka,
        requests_topic,
        (b"c", b"gone", native(topic, at(3), "cancel-1")),
        (None, None, native(request_id="cancel-1", action="cancel")),
    )
    marker_arrives(kafka, scheduler, reader, topic, due_in=6)
    assert [r for r in reader.poll() if r.key == b"c"] == []


def test_cancel_of_an_unknown_id_is_a_noop_and_not_a_rejection(kafka, requests_topic, scheduler):
    mark = scheduler.mark()
    topic = kafka.topic()
    reader = kafka.reader(topic)
    rejections = kafka.reader(f"{scheduler.app_id}-schedule-rejections")
    _, offset = send(kafka, requests_topic, None, None, native(request_id="no-such-id", action="CANCEL"))
    marker_arrives(kafka, scheduler, reader, topic)
    assert not [
        r
        for r in rejections.poll()
        if r.header_values("x-scheduler-source-offset") == [str(offset).encode()]
        and r.header("x-scheduler-source-partition") == b"0"
    ]
    # The CANCEL, and the marker's ADD.
    assert scheduler.outcomes_since(mark, 2) == Counter({"cancel_noop": 1, "scheduled": 1})


def test_latest_request_wins_within_one_batch(kafka, requests_topic, scheduler):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    send_together(
        kafka,
        requests_topic,
        (b"seq", b"1", native(topic, at(2), "seq-1")),
        (b"seq", b"2", native(topic, at(3), "seq-1", "REPLACE")),
        (None, None, native(request_id="seq-1", action="CANCEL")),
        (b"seq", b"3", native(topic, at(4), "seq-1")),
    )
    reader.wait_for(lambda r: r.key == b"seq", timeout=ADD_WAIT, what="delivery")
    marker_arrives(kafka, scheduler, reader, topic, due_in=5)
    assert [r.value for r in reader.poll() if r.key == b"seq"] == [b"3"]


def test_two_ids_in_flight_to_two_topics_do_not_mix(kafka, requests_topic):
    topic_a, topic_b = kafka.topic(), kafka.topic()
    reader = kafka.reader(topic_a, topic_b)
    send(kafka, requests_topic, b"x", b"a", native(topic_a, at(2), "shared-a"))
    send(kafka, requests_topic, b"x", b"b", native(topic_b, at(2), "shared-b"))
    records = reader.wait_for(lambda r: r.key == b"x", count=2, timeout=ADD_WAIT, what="deliveries")
    assert {(r.topic, r.value) for r in records} == {(topic_a, b"a"), (topic_b, b"b")}


BAD_REQUESTS = [
    ("missing deliver-at", lambda t, own: native(t, None, "bad-1"), "missing x-scheduler-deliver-at"),
    ("missing deliver-to", lambda t, own: native(None, at(5), "bad-2"), "missing x-scheduler-deliver-to"),
    ("replace without id", lambda t, own: native(t, at(5), None, "REPLACE"), "missing x-scheduler-request-id"),
    ("cancel without id", lambda t, own: native(action="CANCEL"), "missing x-scheduler-request-id"),
    ("unparseable time", lambda t, own: native(t, "next tuesday", "bad-5"), "unparseable x-scheduler-deliver-at"),
    ("zone-less time", lambda t, own: native(t, "2030-01-01T00:00:00", "bad-6"), "no time zone"),
    ("unknown action", lambda t, own: native(t, at(5), "bad-7", "POSTPONE"), "unknown x-scheduler-action"),
    ("internal topic", lambda t, own: native("__consumer_offsets", at(5), "bad-8"), "is not allowed"),
    ("own topic", lambda t, own: native(own, at(5), "bad-9"), "is not allowed"),
    ("too far ahead", lambda t, own: native(t, "2400-01-01T00:00:00Z", "bad-10"), "days ahead"),
]


def test_invalid_requests_go_to_rejections_byte_exact_and_the_pipeline_keeps_running(kafka, requests_topic, scheduler):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    rejections = kafka.reader(f"{scheduler.app_id}-schedule-rejections")
    sent = {}
    for name, headers, reason in BAD_REQUESTS:
        key = f"bad:{name}:{uuid.uuid4().hex[:6]}".encode()
        request_headers = [("user", b"\x00keep")] + headers(topic, requests_topic)
        sent[key] = (send(kafka, requests_topic, key, b"\xfe" + key, request_headers), request_headers, reason)
    too_large = b"big-" + uuid.uuid4().hex[:6].encode()
    sent[too_large] = (
        send(kafka, requests_topic, too_large, b"x" * 1_000_001, native(topic, at(5), "bad-11")),
        native(topic, at(5), "bad-11"),
        "value too large",
    )

    found = rejections.wait_for(lambda r: r.key in sent, count=len(sent), timeout=ADD_WAIT, what="rejections")
    by_key = {r.key: r for r in found}
    assert len(by_key) == len(sent), "each bad request is rejected exactly once"
    for key, ((partition, offset), request_headers, reason) in sent.items():
        record = by_key[key]
        original = record.headers[: len(request_headers)]
        assert [h[0] for h in original] == [h[0] for h in request_headers], key
        if key != too_large:
            assert record.value == b"\xfe" + key
            assert original == request_headers
        reasons = [v.decode() for v in record.header_values("x-scheduler-rejection-reason")]
        assert any(reason in text for text in reasons), (key, reasons)
        assert record.header("x-scheduler-source-topic") == requests_topic.encode()
        assert record.header("x-scheduler-source-partition") == str(partition).encode()
        assert record.header("x-scheduler-source-offset") == str(offset).encode()
    marker_arrives(kafka, scheduler, reader, topic)
    assert [r for r in reader.poll() if r.key in sent] == [], "a rejected request was delivered"


def test_delivery_to_a_topic_that_does_not_exist_goes_to_rejections(kafka, requests_topic, scheduler):
    rejections = kafka.reader(f"{scheduler.app_id}-schedule-rejections")
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    key = missing.encode()
    _partition, offset = send(kafka, requests_topic, key, b"lost?", native(missing, at(1), "dl-1"))
    [record] = rejections.wait_for(lambda r: r.key == key, timeout=ADD_WAIT, what="dead letter")
    assert record.value == b"lost?"
    assert b"does not exist" in record.header("x-scheduler-rejection-reason")
    assert record.header("x-scheduler-source-offset") == str(offset).encode()
    topic = kafka.topic()
    marker_arrives(kafka, scheduler, kafka.reader(topic), topic)  # still running


def cli(scheduler, kafka, *args):
    import subprocess
    import sys

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kafka_scheduler",
            *args,
            "--bootstrap-servers",
            kafka.bootstrap,
            "--app-id",
            scheduler.app_id,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_schedule_replace_and_cancel(kafka, scheduler):
    topic = kafka.topic()
    reader = kafka.reader(topic)
    # Each CLI call is a process of its own (about a second here): the replace and the cancel must be read before
    # the versions they change fall due.
    scheduled = cli(
        scheduler,
        kafka,
        "schedule",
        "--to",
        topic,
        "--at",
        "+10s",
        "--key",
        "cli-k",
        "--value",
        "one",
        "--header",
        "h=1",
        "--id",
        "cli-1",
    )
    assert scheduled.returncode == 0, scheduled.stderr
    assert "id=cli-1" in scheduled.stdout
    replaced = cli(
        scheduler, kafka, "replace", "--to", topic, "--at", "+12s", "--key", "cli-k", "--value", "two", "--id", "cli-1"
    )
    assert replaced.returncode == 0, replaced.stderr
    assert (
        cli(scheduler, kafka, "schedule", "--to", topic, "--at", "+11s", "--key", "cli-c", "--id", "cli-2").returncode
        == 0
    )
    assert cli(scheduler, kafka, "cancel", "--id", "cli-2").returncode == 0
    [record] = reader.wait_for(lambda r: r.key == b"cli-k", timeout=ADD_WAIT, what="delivery")
    assert record.value == b"two" and record.headers[0][0] == "x-scheduler-delivery-id"
    marker_arrives(kafka, scheduler, reader, topic)
    assert sorted(r.value for r in reader.poll() if r.key in (b"cli-k", b"cli-c")) == [b"two"]


def test_python_client_round_trip(kafka, scheduler):
    from kafka_scheduler.client.scheduler_client import SchedulerClient

    topic = kafka.topic()
    reader = kafka.reader(topic)
    with SchedulerClient(kafka.bootstrap, app_id=scheduler.app_id) as client:
        due = client.schedule(topic, "+2s", value=b"py", key=b"py-k", headers=[("a", "b")], request_id="py-1")
        client.schedule(topic, "+2s", value=b"gone", key=b"py-c", request_id="py-2")
        client.cancel("py-2")
    [record] = reader.wait_for(lambda r: r.key == b"py-k", timeout=ADD_WAIT, what="delivery")
    assert record.value == b"py" and record.headers[0] == ("a", b"b")
    assert record.timestamp_ms >= int(due.timestamp() * 1000)
    marker_arrives(kafka, scheduler, reader, topic)
    assert [r for r in reader.poll() if r.key == b"py-c"] == []


def test_the_scheduler_creates_its_topics_for_records_as_large_as_it_writes(kafka, scheduler):
    """A stock broker's default (1 MiB) would refuse a rejection or history copy of a request the job accepts."""
    from confluent_kafka.admin import ConfigResource, ConfigSource

    from kafka_scheduler.engine.driver.producing import PRODUCER_MAX_BYTES
    from kafka_scheduler.kafka.topics import admin_client

    names = [f"{scheduler.app_id}-schedule-{suffix}" for suffix in ("requests", "rejections", "history")]
    admin = admin_client(kafka.bootstrap)
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, name) for name in names])
    entries = {resource.name: future.result(timeout=30)["max.message.bytes"] for resource, future in futures.items()}
    # Set on the topic (the local broker's own default is 8 MiB too; a stock broker's is 1 MiB).
    assert {name: (int(e.value), e.source) for name, e in entries.items()} == dict.fromkeys(
        names, (PRODUCER_MAX_BYTES, ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    )


def test_requests_of_an_aborted_transaction_do_not_act(kafka, requests_topic, scheduler):
    """Requests are read read_committed, in either delivery mode: a producer's aborted transaction is not read."""
    from confluent_kafka import Producer

    topic = kafka.topic()
    reader = kafka.reader(topic)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"requester-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    for commit, name in ((False, b"aborted"), (True, b"committed")):
        producer.begin_transaction()
        producer.produce(requests_topic, key=name, value=name, headers=native(topic, at(0.5)), partition=0)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    marker_arrives(kafka, scheduler, reader, topic)
    # The marker may come first: read as it arrived, it can be written before a request that went by a batch.
    assert [r.key for r in reader.poll() if not r.key.startswith(b"marker-")] == [b"committed"]
