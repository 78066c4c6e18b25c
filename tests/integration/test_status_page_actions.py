"""The status page's listing and buttons in headless Chromium (driven over the DevTools pipe, cdp.py), against a real
broker and job started with --admin-token-file: from loopback the page lists and cancels without a token; from the
machine's other address it refuses until the token is typed into its login form (a wrong one is refused), then lists
and cancels; each cancel is the native request on the requests topic, the outcome shown is what the job did. And a job
without a token: from the other address the page says schedules are for this machine only."""

from __future__ import annotations

import json
import os
import urllib.request

from kafka_scheduler.client.scheduler_client import SchedulerClient
from kafka_scheduler.kafka.local_broker import free_port
from kafka_scheduler.ops.access import AdminAccess
from kafka_scheduler.ops.actions import partition_for
from kafka_scheduler.ops.http_server import Routes, start_server
from kafka_scheduler.ops.metrics import SchedulerMetrics
from kafka_scheduler.ops.status_page import StatusPage
from kafka_scheduler.protocol import ACTION, REQUEST_ID

from ..machine_address import non_loopback_address
from .cdp import Browser

TOKEN = "page-actions-0123456789abcdef"
ROWS = "document.querySelectorAll('#schedule-rows tr[data-id]')"


def listed_ids(tab) -> list[str]:
    return tab.evaluate(f"Array.from({ROWS}).map((r) => r.dataset.id)")


def cancel(tab, request_id: str, action: str = "CANCEL") -> dict:
    shown = act(tab, request_id, action)
    tab.wait_for(
        f"!Array.from({ROWS}).some((r) => r.dataset.id === {json.dumps(request_id)})",
        120,
        f"{request_id} gone from the listing",
    )
    return shown


def act(tab, request_id: str, action: str) -> dict:
    """Two clicks (the first arms the button), then the outcome the page shows once the job has ruled."""
    button = f"#schedule-rows button[data-action='{action}'][data-id='{request_id}']"
    tab.evaluate("(() => { const b = document.getElementById('outcome-box'); if (b) b.remove(); })()")
    tab.click(button)
    assert tab.text(button).startswith("Confirm"), "the first click only arms the button"
    tab.click(button)
    tab.wait_for(
        "(() => { const b = document.getElementById('outcome-box'); return b && b.dataset.outcome !== 'pending'; })()",
        120,
        f"the outcome of {action} {request_id}",
    )
    return {
        "outcome": tab.evaluate("document.getElementById('outcome-box').dataset.outcome"),
        "text": tab.text("#outcome-box"),
    }


def paused_ids(tab) -> list[str]:
    return tab.evaluate(f"Array.from({ROWS}).filter((r) => r.dataset.paused).map((r) => r.dataset.id)")


def test_the_page_lists_and_cancels_from_loopback_and_with_the_token_from_elsewhere(
    kafka, scheduler_factory, chromium, tmp_path
):
    other = non_loopback_address()
    port = free_port()
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    scheduler = scheduler_factory(
        extra_args=("--metrics-port", str(port), "--admin-token-file", str(token_file), "--partitions", "3")
    )
    scheduler.start()
    requests = f"{scheduler.app_id}-schedule-requests"
    orders = kafka.topic("orders")
    with SchedulerClient(scheduler.bootstrap, app_id=scheduler.app_id) as client:
        for i in range(6):
            client.schedule(
                orders, f"+{2 + i}h", value=f"order {i}".encode(), key=f"k{i}".encode(), request_id=f"P-{i}"
            )
        client.cron(orders, "0 0 1 1 *", value=b"new year", request_id="C-1")  # its firing: after every P-i
    scheduler.mark(timeout=180)
    scheduler.mark(timeout=180)
    assert TOKEN not in scheduler.log()

    with Browser(chromium, tmp_path / "profile") as browser:
        # From loopback: no login, the listing and a cancel.
        local = browser.open(f"http://127.0.0.1:{port}/")
        local.wait_for("document.body.dataset.access === 'loopback'", 30, "loopback access")
        assert local.evaluate("document.getElementById('login').hidden")
        local.click("#list-filters button[type=submit]")
        local.wait_for(f"{ROWS}.length === 7", 180, "six schedules and a cron listed")
        assert listed_ids(local) == [f"P-{i}" for i in range(6)] + ["C-1"]
        assert "order 0" in local.text("#schedule-rows")
        shown = cancel(local, "P-1")
        assert shown["outcome"] == "not_pending" and "no pending one-shot" in shown["text"], shown
        assert listed_ids(local) == ["P-0", "P-2", "P-3", "P-4", "P-5", "C-1"]
        # The cron: paused (listed apart, on top, with Resume), resumed (its next firing again), cancelled.
        shown = act(local, "C-1", "CRON_PAUSE")
        assert shown["outcome"] == "paused", shown
        local.wait_for(f"Array.from({ROWS}).some((r) => r.dataset.paused)", 120, "the paused cron listed")
        assert paused_ids(local) == ["C-1"] and listed_ids(local)[0] == "C-1"
        shown = act(local, "C-1", "CRON_RESUME")
        assert shown["outcome"] == "resumed" and "next firing 2027-01-01T00:00:00" in shown["text"], shown
        local.wait_for(f"!Array.from({ROWS}).some((r) => r.dataset.paused)", 120, "the cron running again")
        assert listed_ids(local)[-1] == "C-1"
        shown = cancel(local, "C-1", "CRON_CANCEL")
        assert shown["outcome"] == "not_pending" and "no pending cron" in shown["text"], shown
        assert listed_ids(local) == ["P-0", "P-2", "P-3", "P-4", "P-5"]

        # From the machine's other address: refused until logged in; a wrong token is refused.
        remote = browser.open(f"http://{other}:{port}/")
        remote.wait_for("document.body.dataset.access === 'none'", 30, "no access yet")
        assert not remote.evaluate("document.getElementById('login').hidden"), "the login form is shown"
        remote.click("#list-filters button[type=submit]")
        remote.wait_for("!!document.getElementById('list-error')", 30, "the refusal")
        assert "admin token" in remote.text("#list-error") and remote.evaluate(f"{ROWS}.length") == 0
        remote.type("#login-token", "not-the-token-0123456789")
        remote.click("#login button[type=submit]")
        remote.wait_for("document.getElementById('login-error').textContent", 30, "the wrong token refused")
        assert remote.text("#login-error") == "wrong token"
        assert remote.evaluate("document.body.dataset.access") == "none"
        remote.type("#login-token", TOKEN)
        remote.click("#login button[type=submit]")
        remote.wait_for("document.body.dataset.access === 'session'", 30, "logged in")
        remote.wait_for(f"{ROWS}.length === 5", 180, "the listing after login")
        shown = cancel(remote, "P-3")
        assert shown["outcome"] == "not_pending", shown
        assert listed_ids(remote) == ["P-0", "P-2", "P-4", "P-5"]
        assert not browser.exceptions, browser.exceptions

    # Each button wrote the native request, on the partition the client uses for the id, like a producer's.
    reader = kafka.reader(requests)
    cancels = reader.wait_for(
        lambda r: dict(r.headers or []).get(ACTION) == b"CANCEL", count=2, timeout=30, what="the two cancels"
    )
    assert sorted((dict(r.headers)[REQUEST_ID], r.partition) for r in cancels) == [
        (b"P-1", partition_for("P-1", 3)),
        (b"P-3", partition_for("P-3", 3)),
    ]
    assert "CANCEL id=P-3" in scheduler.log() and f"for {other}" in scheduler.log()
    assert TOKEN not in scheduler.log(), "the token is never logged"
    status, page = _get(f"http://127.0.0.1:{port}/api/schedules?limit=10")
    assert status == 200 and [s["id"] for s in page["schedules"]] == ["P-0", "P-2", "P-4", "P-5"]
    assert scheduler.stop() == 0


def _get(url: str) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=120) as answer:
        return answer.status, json.loads(answer.read())


def test_without_a_token_the_page_shows_schedules_to_this_machine_only(chromium, tmp_path):
    """The page itself (no job needed): from the other address it says so, and offers no login."""
    other = non_loopback_address()
    metrics = SchedulerMetrics({})
    server = start_server(Routes(metrics, StatusPage(metrics, "reminders"), AdminAccess(None)), "0.0.0.0", 0)
    try:
        with Browser(chromium, tmp_path / "profile") as browser:
            tab = browser.open(f"http://{other}:{server.server_port}/")
            tab.wait_for("document.body.dataset.access === 'none'", 30, "no access")
            assert tab.evaluate("document.getElementById('login').hidden"), "no token configured: no login form"
            assert "this machine only" in tab.text("#access-note")
            tab.click("#list-filters button[type=submit]")
            tab.wait_for("!!document.getElementById('list-error')", 30, "the refusal")
            assert "loopback only" in tab.text("#list-error")
            local = browser.open(f"http://127.0.0.1:{server.server_port}/")
            local.wait_for("document.body.dataset.access === 'loopback'", 30, "loopback access")
            assert not browser.exceptions, browser.exceptions
    finally:
        server.shutdown()
        server.server_close()
