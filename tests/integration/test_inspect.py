"""``kafka-scheduler inspect`` reads the pending schedules straight from a running job's checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

from .support import at, native


def inspect(checkpoint_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kafka_scheduler", "inspect", "--checkpoint-dir", str(checkpoint_dir), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_inspect_counts_and_shows_the_pending_schedules_of_a_running_job(kafka, scheduler_factory):
    scheduler = scheduler_factory().start()
    requests = f"{scheduler.app_id}-schedule-requests"
    orders, mails = kafka.topic("orders"), kafka.topic("mails")
    in_three_days = at(3 * 86400)

    def in_two_hours(i: int) -> str:
        return at(2 * 3600 + 60 + i / 100)  # apart by 10 ms, so they are shown in this order

    kafka.produce_many(
        requests,
        [
            *[
                dict(
                    key=f"o{i}".encode(),
                    value=b"order",
                    headers=native(orders, in_two_hours(i), f"order-{i}"),
                    partition=0,
                )
                for i in range(5)
            ],
            *[
                dict(
                    key=f"m{i}".encode(), value=b"mail", headers=native(mails, in_three_days, f"mail-{i}"), partition=0
                )
                for i in range(3)
            ],
            dict(key=b"anon", value=b"no id", headers=native(mails, in_three_days), partition=0),
            dict(headers=native(request_id="order-0", action="CANCEL"), partition=0),
            dict(
                key=b"o1",
                value="replaced \u00e9".encode(),
                headers=native(orders, in_two_hours(5), "order-1", action="REPLACE", extra=[("trace", b"t-1")]),
                partition=0,
            ),
        ],
    )
    scheduler.mark(timeout=180)
    scheduler.mark(timeout=180)  # the requests' batch has committed

    summary = inspect(scheduler.checkpoint_dir, "--format", "json", "--limit", "3")
    assert summary.returncode == 0, summary.stderr[-2000:]
    found = json.loads(summary.stdout)
    assert found["matching"] == 4 + 3 + 1, found  # order-0 cancelled; order-1 replaced, counted once
    assert sorted(found["per_hour"].values()) == [4, 4] and len(found["per_day"]) in (1, 2), found
    # the first three due (the replaced order-1 is due last)
    assert [s["id"] for s in found["schedules"]] == ["order-2", "order-3", "order-4"], found["schedules"]

    one = inspect(scheduler.checkpoint_dir, "--id", "order-1", "--destination", orders, "--format", "json")
    [schedule] = json.loads(one.stdout)["schedules"]
    assert schedule["value"] == "replaced \u00e9" and schedule["key"] == "o1"
    assert {"key": "trace", "value": "t-1"} in schedule["headers"]
    assert schedule["destination"] == orders and schedule["input_topic"] == requests
    assert schedule["delivery_id"].startswith(requests + "-")

    table = inspect(scheduler.checkpoint_dir, "--input-topic", requests, "--destination", mails)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "4 matching" in table.stdout and "due per day" in table.stdout, table.stdout
    assert "id (none)" in table.stdout, "the schedule sent without an id is listed too"
    assert scheduler.stop() == 0
