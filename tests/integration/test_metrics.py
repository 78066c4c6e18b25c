"""The Prometheus metrics of a running job, scraped over HTTP at /metrics (--metrics-port)."""

from __future__ import annotations

import urllib.request

import pytest

from kafka_scheduler.kafka.local_broker import free_port

from .support import at, metric_samples, ms_of, native, wait_until

PORT = free_port()


@pytest.fixture(scope="module")
def scheduler(scheduler_factory):
    process = scheduler_factory(app_id="metrics", extra_args=("--metrics-port", str(PORT)))
    process.start().warm_up()
    # The warm-up delivery is written before its batch's counts reach the registry: wait for them, so that they
    # are not counted as the test's.
    wait_until(
        lambda: (
            value(
                scrape(),
                "kafka_scheduler_requests_total",
                outcome="scheduled",
                input_topic=f"{process.app_id}-schedule-requests",
                dialect="native",
            )
            >= 1
        ),
        60,
        "the warm-up request in /metrics",
        interval=0.2,
        guard=process.assert_running,
    )
    yield process
    assert process.stop() == 0, process.log()[-3000:]


def scrape() -> dict:
    """{(sample name, sorted label pairs): value} of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10) as response:
        return metric_samples(response.read().decode())


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_scrape_shows_outcomes_deliveries_pending_and_lateness(kafka, scheduler):
    requests = f"{scheduler.app_id}-schedule-requests"
    by_input = dict(input_topic=requests, dialect="native")
    before = scrape()  # the warm-up request is counted already
    topic = kafka.topic()
    reader = kafka.reader(topic)
    # Far enough ahead that "later" is still pending when its wake-up is read below: at 15 s it had gone out by then
    # on a loaded machine (the next wake-up was none).
    later_due = at(30)
    kafka.produce_many(
        requests,
        [
            dict(key=b"later", value=b"later", headers=native(topic, later_due, "later"), partition=0),
            dict(key=b"never", value=b"never", headers=native(topic, at(600), "never"), partition=0),
            dict(headers=native(request_id="never", action="CANCEL"), partition=0),
            dict(key=b"now", value=b"now", headers=native(topic, at(0), "now"), partition=0),
            dict(key=b"bad", value=b"bad", headers=native(deliver_at=at(5), request_id="bad"), partition=0),  # no topic
        ],
    )

    def counted():
        samples = scrape()
        return (
            samples
            if value(samples, "kafka_scheduler_requests_total", outcome="cancelled", **by_input)
            - value(before, "kafka_scheduler_requests_total", outcome="cancelled", **by_input)
            >= 1
            and value(samples, "kafka_scheduler_rejected_total", reason_class="missing_field", **by_input) >= 1
            else None
        )

    samples = wait_until(counted, 60, "the requests in /metrics", interval=0.5, guard=scheduler.assert_running)

    def delta(name: str, **labels) -> float:
        return value(samples, name, **labels) - value(before, name, **labels)

    assert delta("kafka_scheduler_requests_total", outcome="scheduled", **by_input) == 3
    assert delta("kafka_scheduler_requests_total", outcome="cancelled", **by_input) == 1
    assert delta("kafka_scheduler_rejected_total", reason_class="missing_field", **by_input) == 1
    assert delta("kafka_scheduler_delivered_at_once_total", **by_input) == 1
    reader.wait_for(
        lambda r: r.key == b"now", timeout=30, what="the delivery due at once", guard=scheduler.assert_running
    )
    samples = scrape()
    assert value(samples, "kafka_scheduler_pending_schedules") == 1  # "later"; "never" was cancelled
    # The job next wakes up for "later" at the latest at its due time (a timer may be between ticks: retried).
    wait_until(
        lambda: 0 < value(scrape(), "kafka_scheduler_next_wakeup_timestamp_seconds") <= ms_of(later_due) / 1000,
        10,
        "a next wake-up at or before the due time of 'later'",
        interval=0.2,
    )

    reader.wait_for(
        lambda r: r.key == b"later", timeout=60, what="the delivery of 'later'", guard=scheduler.assert_running
    )

    def settled():  # "later" written and retired from state
        samples = scrape()
        return (
            samples
            if value(samples, "kafka_scheduler_pending_schedules") == 0
            and value(samples, "kafka_scheduler_delivered_total") - value(before, "kafka_scheduler_delivered_total")
            >= 2
            else None
        )

    samples = wait_until(settled, 60, "the pending gauge back to 0", interval=0.5, guard=scheduler.assert_running)
    delivered = delta("kafka_scheduler_delivered_total")
    assert delivered == 2, f"'now' and 'later' were delivered, /metrics says {delivered}"
    assert delta("kafka_scheduler_delivery_lateness_seconds_count") == delivered
    assert value(samples, "kafka_scheduler_batches_total") > value(before, "kafka_scheduler_batches_total")
    assert value(samples, "kafka_scheduler_batch_duration_seconds_count") == value(
        samples, "kafka_scheduler_batches_total"
    )
    wait_until(
        lambda: (
            (requests, "0")
            in {
                (dict(labels).get("topic"), dict(labels).get("partition"))
                for name, labels in scrape()
                if name == "kafka_scheduler_input_lag_records"
            }
        ),
        30,
        "the input lag of the requests topic",
        interval=0.5,
    )


def test_the_pending_gauge_counts_every_shard_after_a_restart(kafka, scheduler_factory):
    """After a restart no request or timer has reached most shards yet: the start's report tick, which reaches every
    shard, has each report its index, so the gauge counts all pending schedules from the first batch on."""
    port = free_port()
    process = scheduler_factory(app_id="metrics-restart", extra_args=("--metrics-port", str(port)))
    requests = f"{process.app_id}-schedule-requests"
    topic = kafka.topic()

    def pending() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return value(metric_samples(response.read().decode()), "kafka_scheduler_pending_schedules")

    def schedule(*ids: str) -> None:
        kafka.produce_many(
            requests, [dict(key=i.encode(), value=b"v", headers=native(topic, at(3600), i), partition=0) for i in ids]
        )

    process.start()
    schedule("p-1", "p-2", "p-3", "p-4")
    wait_until(lambda: pending() == 4, 90, "4 pending before the restart", interval=0.5, guard=process.assert_running)
    assert process.stop() == 0, process.log()[-3000:]
    process.start()
    # Nothing is due for an hour: no timer fires and no request comes, only the start's report tick reaches the shards.
    wait_until(lambda: pending() == 4, 90, "4 pending after the restart", interval=0.5, guard=process.assert_running)
    schedule("p-5")
    wait_until(lambda: pending() == 5, 90, "5 pending", interval=0.5, guard=process.assert_running)
    assert process.stop() == 0, process.log()[-3000:]
