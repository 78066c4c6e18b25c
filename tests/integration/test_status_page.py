"""The status page of a running job (status_page.py): its JSON agrees with /metrics, /api/upcoming counts what was
scheduled, /api/schedules finds a schedule by id, and in headless Chromium the page draws its chart and shows the
numbers /metrics has.

STATUS_PAGE_SCREENSHOT=docs/status-page.png keeps the screenshot (how the README's was taken).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from kafka_scheduler.client.scheduler_client import format_instant
from kafka_scheduler.kafka.local_broker import free_port
from kafka_scheduler.ops.upcoming import UPCOMING_MAX_AGE_S

from .cdp import Browser
from .support import at, metric_samples, native, wait_until

ROOT = Path(__file__).resolve().parents[2]
PORT = free_port()
BASE = f"http://127.0.0.1:{PORT}"
HOUR_MS, DAY_MS = 3_600_000, 86_400_000
BAR_RGB = (0x33, 0x66, 0xEE)  # the chart's bar colour (status_page.html)


@pytest.fixture(scope="module")
def scheduler(scheduler_factory):
    process = scheduler_factory(app_id="status-page", extra_args=("--metrics-port", str(PORT)))
    process.start().warm_up()
    yield process
    assert process.stop() == 0, process.log()[-3000:]


def get(path: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(BASE + path, timeout=60) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("Content-Type", "")


def get_json(path: str) -> tuple[int, dict]:
    status, body, content_type = get(path)
    assert content_type == "application/json", (path, content_type)
    return status, json.loads(body)


def scrape() -> dict:
    status, body, _ = get("/metrics")
    assert status == 200
    return metric_samples(body.decode())


def summed(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, pairs), v in samples.items() if n == name and set(labels.items()) <= set(pairs))


def page_numbers(samples: dict) -> dict:
    """What the page must show, from a scrape."""
    m = "kafka_scheduler_"
    return {
        "pending": int(summed(samples, m + "pending_schedules")),
        "delivered": int(summed(samples, m + "delivered_total")),
        "rejected": int(summed(samples, m + "rejected_total")),
        "lateness_count": int(summed(samples, m + "delivery_lateness_seconds_count")),
    }


def status_numbers(status: dict) -> dict:
    return {
        "pending": status["pending"],
        "delivered": status["delivered"]["total"],
        "rejected": status["rejected"]["total"],
        "lateness_count": status["lateness"]["count"],
    }


def instant(ms: int) -> str:
    return format_instant(datetime.fromtimestamp(ms / 1000, UTC))


def test_status_page_agrees_with_metrics_counts_upcoming_finds_by_id_and_draws_in_chromium(
    kafka, scheduler, chromium, tmp_path
):
    requests = f"{scheduler.app_id}-schedule-requests"
    orders = kafka.topic("orders")
    reader = kafka.reader(orders)
    # Due times in the middle of hours, so each falls clearly in one hour's bucket: a few every hour of the next two
    # days, more every day of the month after, one beyond the 30 days shown.
    hour = int(datetime.now(UTC).timestamp() * 1000) // HOUR_MS * HOUR_MS
    plan = {
        **{f"h{h}": (hour + h * HOUR_MS + HOUR_MS // 2, (1, 2, 3, 5, 6, 5, 3, 2)[h % 8]) for h in range(1, 48)},
        **{f"d{d}": (hour + d * DAY_MS + HOUR_MS // 2, 2 + d % 5) for d in range(3, 30)},
        "d40": (hour + 40 * DAY_MS + HOUR_MS // 2, 1),
    }
    records = [
        dict(
            key=f"{name}-{i}".encode(),
            value=f"order {name} #{i}".encode(),
            headers=native(orders, instant(due), f"{name}-{i}", extra=[("trace", f"t-{name}-{i}".encode())]),
            partition=0,
        )
        for name, (due, n) in plan.items()
        for i in range(n)
    ]
    records += [
        dict(key=b"cancel-me", value=b"x", headers=native(orders, instant(plan["h5"][0]), "cancel-me"), partition=0),
        dict(headers=native(request_id="cancel-me", action="CANCEL"), partition=0),
        dict(key=b"now-1", value=b"now", headers=native(orders, at(0), "now-1"), partition=0),
        dict(key=b"now-2", value=b"now", headers=native(orders, at(0), "now-2"), partition=0),
        dict(key=b"no-topic", value=b"x", headers=native(deliver_at=at(60), request_id="no-topic"), partition=0),
        dict(key=b"bad-time", value=b"x", headers=native(orders, "tomorrow", "bad-time"), partition=0),
        # Due 37 minutes ago with a max lateness of 1 s: rejected as expired, neither a delivery nor a lateness.
        dict(
            key=b"too-late",
            value=b"x",
            headers=native(orders, at(-2241), "too-late", extra=[("x-scheduler-max-lateness", b"1s")]),
            partition=0,
        ),
    ]
    kafka.produce_many(requests, records)
    reader.wait_for(
        lambda r: r.key in (b"now-1", b"now-2"),
        count=2,
        timeout=60,
        what="the deliveries due at once",
        guard=scheduler.assert_running,
    )
    pending = sum(n for _, n in plan.values())
    wait_until(
        lambda: summed(scrape(), "kafka_scheduler_pending_schedules") == pending,
        60,
        f"{pending} pending in /metrics",
        interval=0.5,
        guard=scheduler.assert_running,
    )
    scheduler.mark()  # a batch after the deliveries retires them from state
    scheduler.mark()

    # /api/status and /metrics: the same numbers (a batch may complete between the two reads: read again then).
    def agreeing():
        before = scrape()
        status_code, status = get_json("/api/status")
        after = scrape()
        assert status_code == 200
        return (status, after) if page_numbers(before) == page_numbers(after) == status_numbers(status) else None

    status, samples = wait_until(agreeing, 20, "/api/status to agree with /metrics", interval=0.5)
    shown = page_numbers(samples)
    assert shown["pending"] == pending and shown["rejected"] == 2 and shown["delivered"] == 3, shown  # + warm-up
    # Delivered at once: now-1, now-2 and the warm-up; too-late was expired, neither delivered nor observed late.
    assert status["delivered"]["at_once"] == 3 and summed(samples, "kafka_scheduler_expired_total") == 1, status
    # The warm-up delivery waited for the first batch of a fresh job: late, perhaps; stalled, never.
    assert status["app_id"] == "status-page" and status["health"]["verdict"] in ("ok", "late"), status["health"]
    assert status["lateness"]["count"] == 3 and status["lateness"]["max_s"] < 60, status["lateness"]
    assert {(r["input_topic"], r["reason_class"], r["count"]) for r in status["rejections"]} == {
        (None, "expired", 1),
        (requests, "missing_field", 1),
        (requests, "bad_time", 1),
    }, status["rejections"]
    assert status["requests"]["cancelled"] == 1 and status["health"]["last_batch"] is not None

    # /api/upcoming: computing in the background at first, then the counts of what was scheduled. A count read before
    # the plan was applied (a scrape of /metrics starts one) is served until it is UPCOMING_MAX_AGE_S old.
    upcoming = wait_until(
        lambda: (u := get_json("/api/upcoming")[1])["state"] == "ready" and u["total"] == pending and u,
        90 + UPCOMING_MAX_AGE_S,
        "the upcoming counts",
        interval=0.5,
        guard=scheduler.assert_running,
    )
    first_hour = int(datetime.fromisoformat(upcoming["hours"][0]["start"].replace("Z", "+00:00")).timestamp() * 1000)
    expected_hours, expected_days = Counter(), Counter()
    for due, n in plan.values():
        if due < first_hour + 48 * HOUR_MS:
            expected_hours[instant(due // HOUR_MS * HOUR_MS)] += n
        if due < first_hour // DAY_MS * DAY_MS + 30 * DAY_MS:
            expected_days[instant(due // DAY_MS * DAY_MS)[:10]] += n
    assert len(upcoming["hours"]) == 48 and len(upcoming["days"]) == 30
    assert {ms_iso(h["start"]): h["count"] for h in upcoming["hours"] if h["count"]} == {
        ms_iso(k): v for k, v in expected_hours.items()
    }, upcoming["hours"]
    assert {d["date"]: d["count"] for d in upcoming["days"] if d["count"]} == dict(expected_days), upcoming["days"]
    assert upcoming["total"] == pending and upcoming["after_days"] == 1 and upcoming["due_not_retired"] == 0, upcoming
    # The counted gauges of /metrics come from the same read (a scrape serves the last count).
    samples = scrape()
    assert summed(samples, "kafka_scheduler_counted_pending_schedules") == pending
    assert (
        summed(samples, "kafka_scheduler_earliest_pending_due_timestamp_seconds")
        == min(due for due, _ in plan.values()) / 1000
        == upcoming["earliest_due_ms"] / 1000
    )
    assert summed(samples, "kafka_scheduler_counted_timestamp_seconds") == upcoming["as_of_ms"] / 1000

    # /api/schedules: one schedule in full; a missing id is a 400 that says what to send; unknown paths 404.
    code, found = get_json("/api/schedules?id=h26-1")
    assert code == 200, found
    [schedule] = found["schedules"]
    assert (schedule["id"], schedule["key"], schedule["value"], schedule["destination"]) == (
        "h26-1",
        "h26-1",
        "order h26 #1",
        orders,
    )
    assert {"key": "trace", "value": "t-h26-1"} in schedule["headers"]
    assert schedule["due_ms"] == plan["h26"][0] and schedule["input_topic"] == requests
    code, two = get_json("/api/schedules?id=h3-0&id=d40-0")
    assert code == 200 and sorted(s["id"] for s in two["schedules"]) == ["d40-0", "h3-0"], two
    assert get_json("/api/schedules?id=cancel-me")[1]["schedules"] == []
    # Without id: the listing's first page, by due time (test_listing.py pages through it); a bad parameter is a 400.
    code, listed = get_json("/api/schedules")
    assert code == 200 and len(listed["schedules"]) == min(pending, listed["limit"]), listed
    assert [s["due_ms"] for s in listed["schedules"]] == sorted(s["due_ms"] for s in listed["schedules"])
    code, error = get_json("/api/schedules?page_token=not-a-token")
    assert code == 400 and "page_token" in error["error"], error
    assert get_json("/api/nothing-here")[0] == 404
    code, page, content_type = get("/")
    assert code == 200 and content_type.startswith("text/html") and b"<canvas" in page
    assert not re.search(rb"""(src|href)=["']?(https?:)?//""", page), "the page loads nothing from elsewhere"

    # In Chromium: the numbers shown are those of /metrics, and the chart is drawn where the page says it is.
    samples = scrape()
    dom = Elements.of(browse(chromium, tmp_path, "--dump-dom"))
    assert dom.values("pending", "delivered", "rejected", "lateness-count") == [
        str(page_numbers(samples)[k]) for k in ("pending", "delivered", "rejected", "lateness_count")
    ], dom.ids
    assert dom.values("upcoming-total") == [str(pending)]
    assert dom.values("health-badge") == [get_json("/api/status")[1]["health"]["verdict"]]
    bars = int(dom.body["data-chart-bars"])
    assert bars == len(expected_hours), f"{bars} bars drawn for {len(expected_hours)} hours with deliveries"
    left, top, width, height = map(int, dom.body["data-chart-rect"].split(","))
    shot = tmp_path / "status-page.png"
    browse(chromium, tmp_path, f"--screenshot={shot}")
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 900), image.size
    chart = image.crop((left, top, left + width, top + height))
    bar_pixels = sum(n for n, rgb in chart.getcolors(width * height) if near(rgb, BAR_RGB))
    assert bar_pixels > 200, f"the chart area ({left},{top} {width}x{height}) has {bar_pixels} pixels of bar colour"
    # The 30-day view, and a look-up by id from the page's box (as a link fills it in).
    days = Elements.of(browse(chromium, tmp_path, "--dump-dom", page="/?id=h26-1#30d"))
    assert (
        int(days.body["data-chart-bars"]) == len(expected_days)
        and days.ids["upcoming-note"]["text"] == "per day, next 30 days (UTC)"
    )
    looked_up = days.ids["lookup-result"]["text"]
    assert "h26-1" in looked_up and orders in looked_up and "order h26 #1" in looked_up and "t-h26-1" in looked_up, (
        looked_up
    )
    # In a live tab (cdp.py), what a person sees.
    with Browser(chromium, tmp_path / "live-profile") as browser:
        tab = browser.open(BASE + "/?list")
        tab.wait_for("document.body.dataset.access === 'loopback'", what="the page to know its access")
        # From loopback the schedules are open: no login form, whatever a CSS rule says about its display.
        assert tab.evaluate("document.getElementById('login').getClientRects().length") == 0, "a login form shows"
        # The next due time is the earliest due time counted from the state, not the next timer's instant.
        next_due = tab.wait_for("document.getElementById('next-due').dataset.value", what="the next due time")
        assert ms_iso(next_due) == min(due for due, _ in plan.values()), next_due
        # The listing's short keys stay on one line each.
        tab.wait_for(f"{KEY_CELLS}.length > 0", what="the listing's rows")
        assert set(tab.evaluate(f"Array.from({KEY_CELLS}).map({LINES})")) == {1}, "a short key wraps"
        # A lateness of 37.4 minutes fits its tile on one line.
        late = {**get_json("/api/status")[1]}
        late["lateness"] = {**late["lateness"], "count": 3, "p50_s": 2241.0, "p99_s": 2241.0, "max_s": 2241.0}
        fit = tab.evaluate(
            f"(() => {{ renderStatus({json.dumps(late)});"
            " const v = document.getElementById('lateness-p99').closest('.value');"
            f" return [({LINES})(v), v.scrollWidth <= v.clientWidth, v.textContent]; }})()"
        )
        assert fit[:2] == [1, True], fit
    if os.environ.get("STATUS_PAGE_SCREENSHOT"):
        shutil.copy(shot, ROOT / os.environ["STATUS_PAGE_SCREENSHOT"])


KEY_CELLS = "document.querySelectorAll('#schedule-rows td.key code')"
# The lines an element's text takes: its height in lines of its own line height.
LINES = "(e) => Math.round(e.getBoundingClientRect().height / parseFloat(getComputedStyle(e).lineHeight))"


def ms_iso(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def near(rgb, target, tolerance: int = 24) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(rgb, target))


def browse(chromium: str, tmp_path: Path, *what: str, page: str = "/") -> str:
    """One headless Chromium run against the page (its own profile: runs never share state)."""
    result = subprocess.run(
        [
            chromium,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--window-size=1280,900",
            "--virtual-time-budget=8000",
            *what,
            BASE + page,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


class Elements(HTMLParser):
    """Text and data-value of the elements with an id, and the body's attributes, from a DOM dump."""

    def __init__(self):
        super().__init__()
        self.ids: dict[str, dict] = {}
        self.body: dict = {}
        self._open: list = []

    @classmethod
    def of(cls, html: str) -> Elements:
        parser = cls()
        parser.feed(html)
        return parser

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body = attrs
        if "id" in attrs:
            self.ids[attrs["id"]] = {"attrs": attrs, "text": ""}
        if tag not in self.VOID:
            self._open.append(attrs.get("id"))

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        for element_id in self._open:
            if element_id in self.ids:
                self.ids[element_id]["text"] += data

    def values(self, *element_ids: str) -> list:
        """The number (or word) each element shows, read from its text: commas dropped."""
        return [self.ids[i]["text"].strip().replace(",", "") if i in self.ids else None for i in element_ids]
