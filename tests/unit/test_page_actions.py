"""The status page's buttons without Kafka (ops/actions.py, StatusPage.act): the request each writes is the native
one a producer writes, on the partition SchedulerClient picks for the id; the wait for the batch that reads it; the
outcome the page is told. Against a real broker and job, in Chromium: tests/integration/test_status_page_actions.py."""

from __future__ import annotations

import json

import pytest

from kafka_scheduler.client.encoders import encode
from kafka_scheduler.client.scheduler_client import SchedulerClient
from kafka_scheduler.ops.actions import ActionError, RequestWriter, Written, partition_for, request_record
from kafka_scheduler.ops.http_server import Routes
from kafka_scheduler.ops.metrics import SchedulerMetrics
from kafka_scheduler.ops.status_page import StatusPage
from kafka_scheduler.protocol import ACTION, REQUEST_ID

INPUTS = {"app-schedule-requests": "native", "legacy": "karafka"}


class FakeMessage:
    def __init__(self, partition, offset):
        self._p, self._o = partition, offset

    def partition(self):
        return self._p

    def offset(self):
        return self._o


class FakeProducer:
    def __init__(self, partitions=6, error=None):
        self.sent, self.partitions, self.error, self._pending = [], partitions, error, []

    def list_topics(self, topic, timeout):
        class Topic:
            error = None
            partitions = dict.fromkeys(range(self.partitions))

        class Metadata:
            topics = {topic: Topic()}

        return Metadata()

    def produce(self, topic, key, value, headers, partition, on_delivery):
        self.sent.append((topic, key, value, headers, partition))
        self._pending.append((on_delivery, FakeMessage(partition, 100 + len(self.sent))))

    def flush(self, timeout):
        for callback, message in self._pending:
            callback(self.error, message)
        self._pending = []
        return 0


def writer(committed=lambda: {}, producer=None, clock=None):
    producer = producer or FakeProducer()
    now = [0.0]
    made = RequestWriter(
        {"bootstrap.servers": "x"},
        INPUTS,
        committed,
        producer_factory=lambda settings: producer,
        clock=clock or (lambda: now[0]),
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    return made, producer


def test_a_cancel_is_the_record_a_producer_writes_on_the_partition_the_client_picks():
    assert request_record("CANCEL", "order-7") == tuple(encode("native", "CANCEL", request_id="order-7"))
    client = SchedulerClient("127.0.0.1:1", app_id="app")
    client._partitions = 6
    for request_id in ("order-7", "é-unicode", "x" * 300):
        assert partition_for(request_id, 6) == client._partition_for(request_id)
    made, producer = writer()
    written = made.write("CRON_PAUSE", "daily", "app-schedule-requests")
    [(topic, key, value, headers, partition)] = producer.sent
    assert (topic, key, value, partition) == ("app-schedule-requests", None, None, partition_for("daily", 6))
    assert headers == [(ACTION, b"CRON_PAUSE"), (REQUEST_ID, b"daily")]
    assert written == Written("CRON_PAUSE", "daily", "app-schedule-requests", partition, 101)


def test_only_the_page_actions_on_native_inputs():
    made, _ = writer()
    assert made.check("CANCEL", "a", None) == ("CANCEL", "a", "app-schedule-requests"), "the one native input"
    for action, request_id, topic, message in (
        ("ADD", "a", None, "action"),
        ("CRON_ADD", "a", None, "action"),
        ("CANCEL", "", None, "id"),
        ("CANCEL", 7, None, "id"),
        ("CANCEL", "a", "legacy", "karafka input"),
        ("CANCEL", "a", "elsewhere", "not an input"),
    ):
        with pytest.raises(ActionError, match=message):
            made.check(action, request_id, topic)


def test_a_refused_write_is_an_error():
    made, _ = writer(producer=FakeProducer(error="TOPIC_AUTHORIZATION_FAILED"))
    with pytest.raises(RuntimeError, match="AUTHORIZATION"):
        made.write("CANCEL", "a", "app-schedule-requests")


def test_the_wait_ends_when_a_committed_batch_has_read_past_the_request():
    offsets = {"app-schedule-requests": {2: 50}}
    made, _ = writer(committed=lambda: offsets)
    written = Written("CANCEL", "a", "app-schedule-requests", 2, 50)
    assert not made.wait_ruled(written, timeout=3), "offset 50 not read yet: the next offset to read is 50"
    offsets["app-schedule-requests"][2] = 51
    assert made.wait_ruled(written, timeout=3)
    assert not made.wait_ruled(Written("CANCEL", "a", "app-schedule-requests", 3, 0), timeout=1), "other partition"


class FakeWriter(RequestWriter):
    def __init__(self, ruled=True):
        super().__init__({}, INPUTS, lambda: {}, producer_factory=lambda s: FakeProducer())
        self.ruled = ruled

    def wait_ruled(self, written, timeout=30):
        return self.ruled


def page_with(versions, ruled=True, paused=()):
    page = StatusPage(SchedulerMetrics({}), "app")
    page.attach_actions(FakeWriter(ruled))
    page._versions = lambda kind, topic, request_id: (12, versions, list(paused))
    return page


@pytest.mark.parametrize(
    "versions,shown,outcome",
    [
        ([], "app-schedule-requests-0-4", "not_pending"),
        ([{"delivery_id": "app-schedule-requests-0-9"}], "app-schedule-requests-0-4", "replaced"),
        ([{"delivery_id": "app-schedule-requests-0-4"}], "app-schedule-requests-0-4", "still_pending"),
    ],
)
def test_the_outcome_is_read_from_the_state_after_the_batch_that_read_the_request(versions, shown, outcome):
    status, answer = page_with(versions).act({"action": "CANCEL", "id": "o-1", "delivery_id": shown}, "127.0.0.1")
    assert status == 200 and answer["outcome"] == outcome and answer["batch"] == 12, answer
    assert answer["request"]["action"] == "CANCEL" and answer["request"]["topic"] == "app-schedule-requests"


@pytest.mark.parametrize(
    "action,versions,paused,outcome",
    [
        ("CRON_PAUSE", [], [{"delivery_id": "app-schedule-requests-0-4"}], "paused"),
        ("CRON_PAUSE", [{"delivery_id": "app-schedule-requests-0-4"}], [], "ruled"),
        (
            "CRON_RESUME",
            [{"delivery_id": "app-schedule-requests-0-9", "due": "2027-01-01T00:00:00.000Z"}],
            [],
            "resumed",
        ),
        ("CRON_RESUME", [], [{"delivery_id": "app-schedule-requests-0-4"}], "still_paused"),
        ("CRON_CANCEL", [], [], "not_pending"),
        ("CRON_CANCEL", [], [{"delivery_id": "app-schedule-requests-0-4"}], "still_pending"),
    ],
)
def test_a_cron_action_says_whether_the_cron_is_paused_running_or_gone(action, versions, paused, outcome):
    status, answer = page_with(versions, paused=paused).act({"action": action, "id": "daily"}, "127.0.0.1")
    assert status == 200 and answer["outcome"] == outcome, answer
    if outcome == "resumed":
        assert "next firing 2027-01-01T00:00:00.000Z" in answer["message"]


def test_an_action_the_job_has_not_read_in_time_is_said_to_be_written():
    status, answer = page_with([], ruled=False).act({"action": "CRON_CANCEL", "id": "daily"}, "127.0.0.1")
    assert status == 202 and answer["outcome"] == "written" and "acts when the job reads it" in answer["message"]


def test_the_action_route_answers_400_for_a_bad_request_and_503_before_kafka():
    page = page_with([])
    routes = Routes(SchedulerMetrics({}), page)

    def post(body):
        from kafka_scheduler.ops.access import Request

        return routes.respond(
            "/api/actions",
            Request(
                "POST",
                "127.0.0.1",
                {"content-type": "application/json", "x-requested-with": "kafka-scheduler"},
                json.dumps(body).encode(),
            ),
        )

    assert post({"action": "ADD", "id": "x"})[0] == 400
    assert post({"action": "CANCEL", "id": "x", "input_topic": "legacy"})[0] == 400
    assert post({"action": "CANCEL", "id": "x"})[0] == 200
    page.actions = None
    assert post({"action": "CANCEL", "id": "x"})[0] == 503
