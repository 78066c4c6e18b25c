"""Listing and paging against a running job's checkpoint: ``kafka-scheduler list`` and ``GET /api/schedules`` (the same
pages: a token of one is good for the other), the order by (due time, delivery id), the filters, a state that moves on
between pages (a cancel, an add, a replace), and the refusal of a bad token."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime

from kafka_scheduler.client.scheduler_client import format_instant
from kafka_scheduler.kafka.local_broker import free_port

from .support import native

PORT = free_port()
BASE = f"http://127.0.0.1:{PORT}"


def cli(checkpoint_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kafka_scheduler", "list", "--checkpoint-dir", str(checkpoint_dir), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={name: value for name, value in os.environ.items() if name != "KAFKA_SCHEDULER_LOG_LEVEL"},
    )


def api(**params) -> tuple[int, dict]:
    url = BASE + "/api/schedules?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    try:
        with urllib.request.urlopen(url, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def instant(ms: int) -> str:
    return format_instant(datetime.fromtimestamp(ms / 1000, UTC))


def keys(page: dict) -> list[tuple[int, str]]:
    return [(s["due_ms"], s["delivery_id"]) for s in page["schedules"]]


def test_list_pages_through_filters_and_follows_a_state_that_moves_on(kafka, scheduler_factory):
    scheduler = scheduler_factory(extra_args=("--metrics-port", str(PORT))).start()
    requests = f"{scheduler.app_id}-schedule-requests"
    orders, mails = kafka.topic("orders"), kafka.topic("mails")
    base = (int(datetime.now(UTC).timestamp()) + 7200) * 1000
    # 24 schedules with ids, due over 12 seconds (two per second, the pairs at the same millisecond: ordered by
    # delivery id), every third to mails; one without id.
    records = [
        dict(
            key=f"k{i}".encode(),
            value=f"v{i}".encode(),
            headers=native(mails if i % 3 == 0 else orders, instant(base + (i // 2) * 1000), f"L-{i:02d}"),
            partition=0,
        )
        for i in range(24)
    ]
    records.append(dict(key=b"anon", value=b"no id", headers=native(orders, instant(base + 500)), partition=0))
    kafka.produce_many(requests, records)
    scheduler.mark(timeout=180)
    scheduler.mark(timeout=180)

    # The whole listing through the route, 7 a page.
    everything, token = [], None
    while True:
        status, page = api(limit=7, page_token=token)
        assert status == 200, page
        everything += page["schedules"]
        token = page["next_page_token"]
        if token is None:
            break
    assert len(everything) == 25 and keys({"schedules": everything}) == sorted(keys({"schedules": everything}))
    assert sum(1 for s in everything if s["id"] is None) == 1
    first = everything[0]
    assert (first["id"], first["kind"], first["destination"], first["key"], first["value"]) == (
        "L-00",
        "one-shot",
        mails,
        "k0",
        "v0",
    )
    assert first["actions"] == ["CANCEL"] and first["input_topic"] == requests and not first["due_already"]
    assert [s["actions"] for s in everything if s["id"] is None] == [[]], "no id: nothing to send"

    # The CLI lists the same first pages, and its token continues on the route (same filters, same order).
    one = cli(scheduler.checkpoint_dir, "--format", "json", "--limit", "5", "--destination", orders)
    assert one.returncode == 0, one.stderr[-2000:]
    # Its own lines only: none of what Spark prints while it reads the state (its JVM's warnings, StateStoreProvider's).
    assert [line for line in one.stderr.splitlines() if not re.match(r"\d\d:\d\d:\d\d INFO  list: ", line)] == []
    page1 = json.loads(one.stdout)
    wanted = [s for s in everything if s["destination"] == orders]
    assert keys(page1) == keys({"schedules": wanted[:5]}) and page1["next_page_token"]
    status, page2 = api(limit=5, destination=orders, page_token=page1["next_page_token"])
    assert status == 200 and keys(page2) == keys({"schedules": wanted[5:10]})
    table = cli(
        scheduler.checkpoint_dir, "--limit", "3", "--id-prefix", "L-1", "--page-token", "", "--kind", "one-shot"
    )
    assert table.returncode == 0, table.stderr[-2000:]
    lines = table.stdout.strip().splitlines()
    assert "L-10" in lines[2] and "L-11" in lines[3] and lines[-1].startswith("next page: --page-token "), lines

    # Filters on the route.
    assert [s["id"] for s in api(id_prefix="L-2", limit=50)[1]["schedules"]] == ["L-20", "L-21", "L-22", "L-23"]
    assert api(kind="cron")[1]["schedules"] == []
    status, window = api(due_after=instant(base + 2000), due_before=instant(base + 4000), limit=50)
    assert [s["id"] for s in window["schedules"]] == ["L-04", "L-05", "L-06", "L-07"]

    # Bad input: one line, exit 2 / a 400 that says what.
    bad = cli(scheduler.checkpoint_dir, "--page-token", page1["next_page_token"])
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "other filters" in bad.stderr, bad.stderr
    status, error = api(page_token="bm90IGEgdG9rZW4")
    assert status == 400 and "page_token" in error["error"]

    # The state moves on between pages: L-09 (not listed yet) is cancelled, L-01 (listed) is replaced to later,
    # L-99 is added after the cursor, L-98 before it.
    status, head = api(limit=4)
    assert [s["id"] for s in head["schedules"]] == ["L-00", "L-01", None, "L-02"], head["schedules"]
    kafka.produce_many(
        requests,
        [
            dict(headers=native(request_id="L-09", action="CANCEL"), partition=0),
            dict(
                key=b"k1",
                value=b"later",
                headers=native(orders, instant(base + 20_000), "L-01", action="REPLACE"),
                partition=0,
            ),
            dict(key=b"k99", value=b"new", headers=native(orders, instant(base + 6000), "L-99"), partition=0),
            dict(key=b"k98", value=b"new", headers=native(orders, instant(base), "L-98"), partition=0),
        ],
    )
    scheduler.mark(timeout=180)
    scheduler.mark(timeout=180)
    rest, token = [], head["next_page_token"]
    while token:
        status, page = api(limit=8, page_token=token)
        assert status == 200, page
        if not rest:
            assert page["state_moved_on"] and page["continued_from_batch"] == head["batch"] < page["batch"], page
        rest += page["schedules"]
        token = page["next_page_token"]
    ids = [s["id"] for s in head["schedules"] + rest]
    assert "L-09" not in ids and "L-98" not in ids, "cancelled before it was reached; added before the cursor"
    assert "L-99" in ids and ids.count("L-01") == 2, "added after the cursor; replaced to a later time: new version"
    listed = keys({"schedules": head["schedules"] + rest})
    assert len(set(listed)) == len(listed), "no version listed twice"
    assert {f"L-{i:02d}" for i in range(24)} - {"L-09"} <= set(ids), "what stayed pending is listed"
    assert scheduler.stop() == 0
