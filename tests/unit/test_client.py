"""The client's pure helpers (due-time parsing, instant formatting, request headers) and the client itself
with a stand-in producer (no Kafka)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from kafka_scheduler.client.scheduler_client import RequestError, format_instant, parse_due, request_headers

UTC = UTC
NOW = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


@pytest.mark.parametrize(
    "text,delta",
    [
        ("+30s", timedelta(seconds=30)),
        ("+5m", timedelta(minutes=5)),
        ("+2h", timedelta(hours=2)),
        ("+1d", timedelta(days=1)),
        ("+250ms", timedelta(milliseconds=250)),
        ("+0s", timedelta(0)),
        ("  +90s ", timedelta(seconds=90)),
    ],
)
def test_relative_due_times(text, delta):
    assert parse_due(text, now=NOW) == NOW + delta


def test_relative_due_time_defaults_to_the_current_time():
    before = datetime.now(UTC)
    due = parse_due("+1h")
    after = datetime.now(UTC)
    assert before + timedelta(hours=1) <= due <= after + timedelta(hours=1)
    assert due.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2026-05-24T12:30:00Z", datetime(2026, 5, 24, 12, 30, tzinfo=UTC)),
        ("2026-05-24T12:30:00z", datetime(2026, 5, 24, 12, 30, tzinfo=UTC)),
        ("2026-05-24T12:30:00.250Z", datetime(2026, 5, 24, 12, 30, 0, 250000, tzinfo=UTC)),
        ("2026-05-24T12:30:00+02:00", datetime(2026, 5, 24, 10, 30, tzinfo=UTC)),
        ("2026-05-24T01:30:00+02:00", datetime(2026, 5, 23, 23, 30, tzinfo=UTC)),
        ("2026-05-24T12:30:00-05:30", datetime(2026, 5, 24, 18, 0, tzinfo=UTC)),
    ],
)
def test_iso_due_times_are_converted_to_utc(text, expected):
    due = parse_due(text, now=NOW)
    assert due == expected
    assert due.utcoffset() == timedelta(0)
    assert (due.year, due.month, due.day, due.hour, due.minute) == (
        expected.year,
        expected.month,
        expected.day,
        expected.hour,
        expected.minute,
    )


def test_zoneless_iso_is_rejected():
    with pytest.raises(RequestError, match="time zone"):
        parse_due("2026-05-24T12:30:00", now=NOW)


@pytest.mark.parametrize("text", ["tomorrow", "", "+5x", "+s", "30s", "2026-02-30T10:00:00Z", "-5m"])
def test_garbage_is_rejected(text):
    with pytest.raises(RequestError):
        parse_due(text, now=NOW)


def test_request_error_is_a_value_error():
    assert issubclass(RequestError, ValueError)


def test_timedelta_is_relative_to_now():
    assert parse_due(timedelta(minutes=3), now=NOW) == NOW + timedelta(minutes=3)


def test_aware_datetime_is_converted_to_utc():
    plus_two = timezone(timedelta(hours=2))
    due = parse_due(datetime(2026, 5, 24, 12, 30, tzinfo=plus_two), now=NOW)
    assert due == datetime(2026, 5, 24, 10, 30, tzinfo=UTC)
    assert due.utcoffset() == timedelta(0)
    assert due.hour == 10


def test_naive_datetime_is_rejected():
    with pytest.raises(RequestError, match="time zone"):
        parse_due(datetime(2026, 5, 24, 12, 30), now=NOW)


# ---------------------------------------------------------------- format_instant


@pytest.mark.parametrize(
    "instant,text",
    [
        (datetime(2026, 5, 24, 12, 30, tzinfo=UTC), "2026-05-24T12:30:00.000Z"),
        (datetime(2026, 5, 24, 12, 30, 1, 999999, tzinfo=UTC), "2026-05-24T12:30:01.999Z"),
        (datetime(2026, 5, 24, 12, 30, 1, 5000, tzinfo=UTC), "2026-05-24T12:30:01.005Z"),
        (datetime(2026, 5, 24, 12, 30, tzinfo=timezone(timedelta(hours=2))), "2026-05-24T10:30:00.000Z"),
        (datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=3))), "2025-12-31T22:00:00.000Z"),
        (datetime(2026, 5, 24, 12, 30, 0, 123456, tzinfo=timezone(timedelta(hours=-4))), "2026-05-24T16:30:00.123Z"),
    ],
)
def test_format_instant(instant, text):
    assert format_instant(instant) == text


def test_format_then_parse_round_trips_to_the_millisecond():
    formatted = format_instant(NOW)
    assert formatted == "2026-03-04T05:06:07.890Z"
    assert parse_due(formatted) == NOW.replace(microsecond=890000)


# ---------------------------------------------------------------- request_headers


def test_request_headers_order_and_encoding():
    due = datetime(2026, 5, 24, 12, 30, 0, 250000, tzinfo=UTC)
    headers = request_headers(
        "ADD", "orders", due, "r-1", headers=[("trace", "abc"), ("raw", b"\xff\x00"), ("trace", "é"), ("none", None)]
    )
    assert headers == [
        ("trace", b"abc"),
        ("raw", b"\xff\x00"),
        ("trace", "é".encode()),
        ("none", None),
        ("x-scheduler-action", b"ADD"),
        ("x-scheduler-deliver-to", b"orders"),
        ("x-scheduler-deliver-at", b"2026-05-24T12:30:00.250Z"),
        ("x-scheduler-request-id", b"r-1"),
    ]


def test_request_headers_deliver_at_is_utc():
    due = datetime(2026, 5, 24, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    headers = dict(request_headers("REPLACE", "orders", due, "r-2"))
    assert headers["x-scheduler-deliver-at"] == b"2026-05-24T10:30:00.000Z"
    assert headers["x-scheduler-action"] == b"REPLACE"


def test_request_headers_without_optional_parts():
    assert request_headers("ADD", "orders", datetime(2026, 5, 24, tzinfo=UTC)) == [
        ("x-scheduler-action", b"ADD"),
        ("x-scheduler-deliver-to", b"orders"),
        ("x-scheduler-deliver-at", b"2026-05-24T00:00:00.000Z"),
    ]


def test_cancel_headers():
    assert request_headers("CANCEL", request_id="r-9") == [
        ("x-scheduler-action", b"CANCEL"),
        ("x-scheduler-request-id", b"r-9"),
    ]


@pytest.mark.parametrize(
    "name", ["x-scheduler-action", "X-Scheduler-Deliver-At", "X-SCHEDULER-foo", "x-scheduler-delivery-id"]
)
def test_reserved_user_header_names_are_rejected(name):
    with pytest.raises(RequestError, match="reserved"):
        request_headers("ADD", "orders", datetime(2026, 5, 24, tzinfo=UTC), headers=[("ok", "1"), (name, "x")])


def test_header_names_only_resembling_the_prefix_are_fine():
    headers = request_headers(
        "ADD",
        "orders",
        datetime(2026, 5, 24, tzinfo=UTC),
        headers=[("x-schedulerish", "1"), ("my-x-scheduler-note", "2")],
    )
    assert headers[:2] == [("x-schedulerish", b"1"), ("my-x-scheduler-note", b"2")]


def test_empty_request_id_is_rejected():
    with pytest.raises(RequestError, match="empty"):
        request_headers("ADD", "orders", datetime(2026, 5, 24, tzinfo=UTC), request_id="")
    with pytest.raises(RequestError, match="empty"):
        request_headers("CANCEL", request_id="")


# ---------------------------------------------------------------- SchedulerClient with a stand-in producer


class FakeProducer:
    """Records the producer config and every produce call; the topic has ``partitions`` partitions."""

    instances: list[FakeProducer] = []
    partitions = 3

    def __init__(self, config):
        self.config = config
        self.produced = []
        FakeProducer.instances.append(self)

    def list_topics(self, topic, timeout):
        from types import SimpleNamespace

        topics = (
            {}
            if self.partitions == 0
            else {topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.partitions)))}
        )
        return SimpleNamespace(topics=topics)

    def produce(self, topic, key=None, value=None, headers=None, on_delivery=None, **extra):
        self.produced.append({"topic": topic, "key": key, "value": value, "headers": headers, **extra})

    def poll(self, _timeout):
        return 0

    def flush(self, _timeout):
        return 0

    def __len__(self):
        return 0


@pytest.fixture
def fake_producer(monkeypatch):
    import kafka_scheduler.client.scheduler_client as client_module

    FakeProducer.instances = []
    FakeProducer.partitions = 3
    monkeypatch.setattr(client_module, "Producer", FakeProducer)
    return FakeProducer


def test_client_native_is_unchanged(fake_producer):
    import zlib

    from kafka_scheduler.client.scheduler_client import SchedulerClient

    with SchedulerClient("b:9092", app_id="app") as client:
        client.schedule("orders", "2026-05-24T12:30:00.250Z", value="v", key="k", request_id="r-1")
        client.schedule("orders", "2026-05-24T12:30:00Z", value=b"anonymous")
        client.cancel("r-1")
    producer = fake_producer.instances[0]
    assert client.requests_topic == "app-schedule-requests"
    assert "partitioner" not in producer.config
    first, anonymous, cancel = producer.produced
    assert first["topic"] == "app-schedule-requests"
    assert (first["key"], first["value"]) == (b"k", b"v")
    assert first["partition"] == zlib.crc32(b"r-1") % 3 == cancel["partition"]
    assert "partition" not in anonymous
    assert dict(first["headers"])["x-scheduler-deliver-at"] == b"2026-05-24T12:30:00.250Z"
    assert dict(cancel["headers"]) == {"x-scheduler-action": b"CANCEL", "x-scheduler-request-id": b"r-1"}


def test_client_karafka_keys_by_id_and_lets_murmur2_partition(fake_producer):
    from kafka_scheduler.client.scheduler_client import SchedulerClient

    with SchedulerClient("b:9092", dialect="karafka", requests_topic="schedules") as client:
        due = client.schedule(
            "orders", "2026-05-24T12:30:00.250Z", value=b"v", key=b"k", request_id="r-1", target_partition=2
        )
        client.replace("orders", "2026-05-24T12:31:00Z", value=b"w", request_id="r-1")
        client.cancel("r-1")
    producer = fake_producer.instances[0]
    assert producer.config["partitioner"] == "murmur2_random"
    assert due == datetime(2026, 5, 24, 12, 30, 1, tzinfo=UTC)  # rounded up, as sent
    assert [p["topic"] for p in producer.produced] == ["schedules"] * 3
    assert [p["key"] for p in producer.produced] == [b"r-1"] * 3
    assert all("partition" not in p for p in producer.produced)
    assert dict(producer.produced[0]["headers"])["schedule_target_partition"] == b"2"
    assert [dict(p["headers"])["schedule_source_type"] for p in producer.produced] == [
        b"schedule",
        b"schedule",
        b"cancel",
    ]
    assert producer.produced[2]["value"] is None


def test_client_producer_config_wins(fake_producer):
    from kafka_scheduler.client.scheduler_client import SchedulerClient

    SchedulerClient("b:9092", dialect="sky-json", requests_topic="s", producer_config={"partitioner": "murmur2"})
    assert fake_producer.instances[0].config["partitioner"] == "murmur2"


@pytest.mark.parametrize("dialect", ["karafka", "etf1", "sky-avro", "sky-json"])
def test_client_needs_a_requests_topic_for_other_dialects(fake_producer, dialect):
    from kafka_scheduler.client.scheduler_client import SchedulerClient

    with pytest.raises(RequestError, match="requests_topic"):
        SchedulerClient("b:9092", dialect=dialect)
    assert fake_producer.instances == []


def test_client_unknown_dialect(fake_producer):
    from kafka_scheduler.client.scheduler_client import SchedulerClient

    with pytest.raises(RequestError, match="unknown dialect"):
        SchedulerClient("b:9092", dialect="kaspr", requests_topic="s")


def test_client_native_may_use_another_topic(fake_producer):
    from kafka_scheduler.client.scheduler_client import SchedulerClient

    client = SchedulerClient("b:9092", requests_topic="more-requests")
    client.cancel("r-1")
    assert fake_producer.instances[0].produced[0]["topic"] == "more-requests"


def test_client_missing_topic_of_another_dialect(fake_producer):
    from kafka_scheduler.client.scheduler_client import SchedulerClient

    fake_producer.partitions = 0
    client = SchedulerClient("b:9092", dialect="etf1", requests_topic="schedules")
    with pytest.raises(RequestError, match="topic schedules does not exist: create it"):
        client.cancel("r-1")


def test_client_rejects_before_producing(fake_producer):
    from kafka_scheduler.client.scheduler_client import SchedulerClient

    client = SchedulerClient("b:9092", dialect="etf1", requests_topic="schedules")
    with pytest.raises(RequestError, match="request id is required"):
        client.schedule("orders", "+1m", value=b"v")
    with pytest.raises(RequestError, match="reserved"):
        client.schedule("orders", "+1m", value=b"v", request_id="r", headers=[("scheduler-epoch", "1")])
    assert fake_producer.instances[0].produced == []


# ---------------------------------------------------------------- recurring schedules and expiry


def test_client_sends_kaspr_cron_requests_all_on_the_partition_of_the_cron_id(fake_producer):
    import zlib

    from kafka_scheduler.client.scheduler_client import SchedulerClient

    with SchedulerClient("b:9092", app_id="app") as client:
        client.cron(
            "reminders",
            "0 9 * * 1-5",
            value=b"standup",
            key="team",
            headers=[("trace", "1")],
            request_id="standup",
            timezone="Europe/Paris",
            missed="skip",
            start_at="2026-01-05T00:00:00Z",
            end_at=datetime(2026, 12, 31, tzinfo=UTC),
            max_lateness="10m",
        )
        client.pause("standup")
        client.resume("standup")
        client.cancel("standup", cron=True)
        client.schedule(
            "orders", "2026-05-24T12:30:00Z", value="v", request_id="r-1", max_lateness=timedelta(minutes=5)
        )
    add, pause, resume, cancel, one_shot = fake_producer.instances[0].produced
    assert {r["partition"] for r in (add, pause, resume, cancel)} == {zlib.crc32(b"standup") % 3}
    assert (add["key"], add["value"]) == (b"team", b"standup")
    assert add["headers"] == [
        ("trace", b"1"),
        ("x-scheduler-action", b"CRON_ADD"),
        ("x-scheduler-deliver-to", b"reminders"),
        ("x-scheduler-request-id", b"standup"),
        ("x-scheduler-cron-expr", b"0 9 * * 1-5"),
        ("x-scheduler-cron-missed-fire-policy", b"skip"),
        ("x-scheduler-cron-timezone", b"Europe/Paris"),
        ("x-scheduler-cron-start-at", b"2026-01-05T00:00:00.000Z"),
        ("x-scheduler-cron-end-at", b"2026-12-31T00:00:00.000Z"),
        ("x-scheduler-max-lateness", b"600000"),
    ]
    assert [dict(r["headers"])["x-scheduler-action"] for r in (pause, resume, cancel)] == [
        b"CRON_PAUSE",
        b"CRON_RESUME",
        b"CRON_CANCEL",
    ]
    assert dict(one_shot["headers"])["x-scheduler-max-lateness"] == b"300000"


@pytest.mark.parametrize("dialect", ["karafka", "etf1", "sky-json"])
def test_other_dialects_say_they_have_no_crons_nor_max_lateness(fake_producer, dialect):
    from kafka_scheduler.client.scheduler_client import SchedulerClient

    with SchedulerClient("b:9092", dialect=dialect, requests_topic="schedules") as client:
        with pytest.raises(RequestError, match=f"the {dialect} dialect has no recurring schedules"):
            client.cron("out", "@hourly", request_id="c")
        with pytest.raises(RequestError, match=f"the {dialect} dialect has no recurring schedules"):
            client.pause("c")
        with pytest.raises(RequestError, match=f"the {dialect} dialect has no max lateness"):
            client.schedule("out", "+1m", value="v", request_id="r", max_lateness="10m")
    assert fake_producer.instances[0].produced == []


@pytest.mark.parametrize(
    "lateness,expected",
    [
        ("10m", 600_000),
        ("1h30m", 5_400_000),
        ("PT10M", 600_000),
        ("pt0.5s", 500),
        ("250ms", 250),
        (1500, 1500),
        ("2d", 172_800_000),
        (timedelta(seconds=3), 3000),
    ],
)
def test_max_lateness_is_read_as_the_scheduler_reads_it(lateness, expected):
    from kafka_scheduler.client.encoders import lateness_ms

    assert lateness_ms(lateness) == expected


@pytest.mark.parametrize("lateness", ["0", "-5m", "10x", "PT", "", 0, "1.5h"])
def test_a_bad_max_lateness_is_refused_before_sending(lateness):
    from kafka_scheduler.client.encoders import lateness_ms

    with pytest.raises(RequestError, match="max lateness"):
        lateness_ms(lateness)


def test_a_bad_cron_is_refused_before_sending(fake_producer):
    from kafka_scheduler.client.scheduler_client import SchedulerClient

    with SchedulerClient("b:9092") as client:
        for kwargs, message in [
            (dict(expr="* * *"), "invalid x-scheduler-cron-expr '\\* \\* \\*' \\(expected a cron expression"),
            (dict(expr=""), "needs an expression"),
            (dict(expr="0 0 30 2 *"), "it never fires"),
            (dict(expr="@hourly", timezone="Mars/Olympus"), "unknown time zone 'Mars/Olympus'"),
            (dict(expr="@hourly", missed="later"), "use replay or skip"),
            (
                dict(expr="@hourly", start_at="2026-02-01T00:00:00Z", end_at="2026-01-01T00:00:00Z"),
                "end is before its start",
            ),
        ]:
            with pytest.raises(RequestError, match=message):
                client.cron("out", request_id="c", **kwargs)
    assert fake_producer.instances[0].produced == []


def test_a_cron_is_checked_against_the_jobs_minimum_interval_with_the_jobs_words(fake_producer):
    """The job rejects a cron that fires more often than its --cron-min-interval (engine/rules/cron.py problem); the
    client refuses it first, in the same words, naming the job's default when it was not told the job's setting."""
    from kafka_scheduler.client.scheduler_client import SchedulerClient
    from kafka_scheduler.engine.rules.cron import problem

    every_two_seconds = "* * * * * */2"
    with SchedulerClient("b:9092") as client, pytest.raises(RequestError) as refused:
        client.cron("out", every_two_seconds, request_id="c")
    assert str(refused.value).startswith(problem(every_two_seconds, None, 5000) + "; 5s is the job's default")
    assert fake_producer.instances[0].produced == []

    with SchedulerClient("b:9092", cron_min_interval="3s") as client, pytest.raises(RequestError) as refused:
        client.cron("out", every_two_seconds, request_id="c")
    assert str(refused.value) == problem(every_two_seconds, None, 3000)

    for setting in ("2s", 2000, timedelta(seconds=1)):
        with SchedulerClient("b:9092", cron_min_interval=setting) as client:
            client.cron("out", every_two_seconds, request_id="c")
    assert len(fake_producer.instances[-1].produced) == 1
    too_small = "minimum interval '0.5s': expected a duration of at least 1s"
    with SchedulerClient("b:9092", cron_min_interval="0.5s") as client, pytest.raises(RequestError, match=too_small):
        client.cron("out", "@hourly", request_id="c")
