"""Who may look and act on the metrics port (ops/access.py, issue 19 section 3), over real HTTP: every route with no
token, a wrong token and the right one, from loopback and from another address of this machine (a connection from
this machine to its non-loopback address has that address as its source: the server sees a peer that is not
loopback), with and without a token configured; the session cookie of the login form; the defences of POSTs; the
headers every answer carries; and that no secret reaches the log. No Spark, no Kafka: the page's state reads are
stubbed (the routes are what is tested)."""

from __future__ import annotations

import http.client
import json
import logging
import os

import pytest

from kafka_scheduler.config import ConfigError
from kafka_scheduler.ops.access import AdminAccess, Request, host_name, is_loopback, read_token_file
from kafka_scheduler.ops.http_server import Routes, start_server
from kafka_scheduler.ops.metrics import SchedulerMetrics
from kafka_scheduler.ops.status_page import StatusPage

from ..machine_address import non_loopback_address

TOKEN = "s3cret-token-0123456789abcdef"
WRONG = "wrong-token-0123456789abcdefgh"
OPEN = ("/metrics", "/", "/api/status", "/api/upcoming", "/api/access")
PROTECTED_GET = ("/api/schedules", "/api/schedules?id=order-1", "/api/schedules?limit=5")


class StubPage(StatusPage):
    """The routes' view of the page, without Spark or Kafka: what a protected route would serve."""

    def listing(self, query):
        return 200, {"schedules": [{"id": "order-1", "value": "payload"}], "query": sorted(query)}

    def schedules(self, ids):
        return 200, {"schedules": [{"id": i, "value": "payload"} for i in ids]}

    def act(self, body, client):
        self.acted.append((body, client))
        return 200, {"outcome": "not_pending", "request": body}


@pytest.fixture(scope="module")
def other_address():
    return non_loopback_address()


def serve(token):
    metrics = SchedulerMetrics({})
    page = StubPage(metrics, "reminders")
    page.acted = []
    server = start_server(Routes(metrics, page, AdminAccess(token)), "0.0.0.0", 0)
    return server, page


@pytest.fixture
def with_token():
    server, page = serve(TOKEN)
    yield server, page
    server.shutdown()
    server.server_close()


@pytest.fixture
def without_token():
    server, page = serve(None)
    yield server, page
    server.shutdown()
    server.server_close()


def call(server, source: str, method: str, path: str, token=None, body=None, headers=None, host=None):
    """One request to the server at ``source``'s address, from ``source`` (so its peer address is ``source``)."""
    port = server.server_port
    connection = http.client.HTTPConnection(source, port, timeout=10, source_address=(source, 0))
    sent = {"Host": host or f"{source}:{port}", **(headers or {})}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        sent.setdefault("Content-Type", "application/json")
        sent.setdefault("X-Requested-With", "kafka-scheduler")
    connection.request(method, path, body=data, headers=sent)
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, dict(response.getheaders()), payload


def action(token=None):
    return {"action": "CANCEL", "id": "order-1", "input_topic": "reminders-schedule-requests"}


def test_loopback_is_127_slash_8_and_ipv6_loopback_also_mapped_into_ipv6():
    for address in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1", "::ffff:127.1.2.3"):
        assert is_loopback(address), address
    for address in (
        "10.0.0.1",
        "192.0.2.2",
        "::ffff:10.0.0.1",
        "::ffff:192.0.2.2",
        "fe80::1%eth0",
        "fd00::2",
        "0.0.0.0",
        "::",
        "localhost",
        "",
        "128.0.0.1",
        "::127.0.0.1",
    ):
        assert not is_loopback(address), address
    assert [host_name(h) for h in ("127.0.0.1:9464", "LocalHost:80", "[::1]:9464", "example.org", "::1")] == [
        "127.0.0.1",
        "localhost",
        "::1",
        "example.org",
        "::1",
    ]


def test_the_matrix_with_a_token_configured(with_token, other_address, caplog):
    server, page = with_token
    caplog.set_level(logging.DEBUG)
    for source in ("127.0.0.1", other_address):
        loopback = source == "127.0.0.1"
        for path in OPEN:
            for token in (None, WRONG, TOKEN):
                status, _, _ = call(server, source, "GET", path, token)
                assert status == 200, (source, path, token, status)
        for path in PROTECTED_GET:
            assert call(server, source, "GET", path)[0] == (200 if loopback else 401), (source, path)
            assert call(server, source, "GET", path, WRONG)[0] == 401, (source, path)
            status, _, body = call(server, source, "GET", path, TOKEN)
            assert status == 200 and b"payload" in body, (source, path, status)
        expected = 200 if loopback else 401
        assert call(server, source, "POST", "/api/actions", body=action())[0] == expected, source
        assert call(server, source, "POST", "/api/actions", WRONG, body=action())[0] == 401, source
        assert call(server, source, "POST", "/api/actions", TOKEN, body=action())[0] == 200, source
        # A script with the token needs no page header.
        assert (
            call(server, source, "POST", "/api/actions", TOKEN, body=action(), headers={"X-Requested-With": ""})[0]
            == 200
        ), source
    status, headers, body = call(server, other_address, "GET", "/api/schedules")
    assert headers["WWW-Authenticate"].startswith("Bearer") and "token" in json.loads(body)["error"]
    assert [client for _, client in page.acted].count(other_address) == 2
    assert "127.0.0.1" in {client for _, client in page.acted}
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert TOKEN not in logged and WRONG not in logged, "no token in the log"
    assert f"a wrong token from {other_address}" in logged or "a wrong token from 127.0.0.1" in logged


def test_the_matrix_without_a_token_loopback_only(without_token, other_address):
    server, page = without_token
    for source in ("127.0.0.1", other_address):
        loopback = source == "127.0.0.1"
        for path in OPEN:
            assert call(server, source, "GET", path)[0] == 200, (source, path)
        for token in (None, WRONG, TOKEN):  # no token configured: an Authorization header means nothing
            for path in PROTECTED_GET:
                status, _, body = call(server, source, "GET", path, token)
                assert status == (200 if loopback else 403), (source, path, token, status)
                if not loopback:
                    assert b"loopback only" in body and b"payload" not in body
            status = call(server, source, "POST", "/api/actions", token, body=action())[0]
            assert status == (200 if loopback else 403), (source, token, status)
        assert call(server, source, "POST", "/login", body={"token": TOKEN})[0] == 404
    assert all(client == "127.0.0.1" for _, client in page.acted) and len(page.acted) == 3


def test_the_login_form_sets_a_session_cookie_that_opens_the_protected_routes(with_token, other_address):
    server, _ = with_token
    assert call(server, other_address, "POST", "/login", body={"token": WRONG})[0] == 401
    assert call(server, other_address, "POST", "/login", body={"token": 42})[0] == 401
    status, headers, _ = call(server, other_address, "POST", "/login", body={"token": TOKEN})
    assert status == 200
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    session = cookie.split(";")[0]
    with_cookie = {"Cookie": session}
    assert call(server, other_address, "GET", "/api/schedules", headers=with_cookie)[0] == 200
    assert json.loads(call(server, other_address, "GET", "/api/access", headers=with_cookie)[2]) == {
        "granted": "session",
        "token_configured": True,
    }
    assert call(server, other_address, "POST", "/api/actions", body=action(), headers=with_cookie)[0] == 200
    forged = session[:-2] + ("AA" if not session.endswith("AA") else "BB")
    assert call(server, other_address, "GET", "/api/schedules", headers={"Cookie": forged})[0] == 401
    name, value = session.split("=", 1)
    later = f"{name}={int(value.split('.')[0]) + 10}.{value.split('.')[1]}"
    assert call(server, other_address, "GET", "/api/schedules", headers={"Cookie": later})[0] == 401, (
        "the expiry is signed too"
    )
    status, headers, _ = call(server, other_address, "POST", "/logout", body={}, headers=with_cookie)
    assert status == 200 and "Max-Age=0" in headers["Set-Cookie"]
    # Signed with a key derived from the token: another token's job does not take it.
    other, _ = serve("another-token-0123456789abcdef")
    try:
        assert call(other, other_address, "GET", "/api/schedules", headers=with_cookie)[0] == 401
    finally:
        other.shutdown()
        other.server_close()


def test_an_expired_session_is_refused():
    now = [1_000_000.0]
    access = AdminAccess(TOKEN, clock=lambda: now[0])
    cookie = f"kafka_scheduler_session={access.session_cookie()}"
    request = Request("GET", "192.0.2.2", {"cookie": cookie, "host": "192.0.2.2:9464"})
    assert access.who(request) == "session"
    now[0] += 12 * 3600 + 1
    assert access.who(request) is None


def test_posts_must_be_json_with_the_page_header_and_from_this_origin(without_token):
    server, page = without_token
    local = "127.0.0.1"
    host = f"{local}:{server.server_port}"
    assert call(server, local, "POST", "/api/actions", body=action())[0] == 200
    cases = {
        "no page header": ({"X-Requested-With": ""}, 403),
        "form content type": ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        "text/plain": ({"Content-Type": "text/plain"}, 415),
        "another origin": ({"Origin": "http://evil.example"}, 403),
        "same host, other port": ({"Origin": f"http://{local}:1"}, 403),
        "opaque origin": ({"Origin": "null"}, 403),
        "cross-site fetch": ({"Sec-Fetch-Site": "cross-site"}, 403),
    }
    for what, (headers, expected) in cases.items():
        assert call(server, local, "POST", "/api/actions", body=action(), headers=headers)[0] == expected, what
    assert call(server, local, "POST", "/api/actions", body=action(), headers={"Origin": f"http://{host}"})[0] == 200
    assert len(page.acted) == 2
    # GET cannot act, nor OPTIONS grant a preflight.
    assert call(server, local, "GET", "/api/actions")[0] == 405
    status, headers, _ = call(server, local, "OPTIONS", "/api/actions")
    assert status == 405 and not any(h.lower().startswith("access-control") for h in headers)
    assert call(server, local, "POST", "/api/actions", body=[1, 2])[0] == 400


def test_a_page_whose_name_rebinds_to_loopback_gets_nothing(without_token, with_token):
    for server, refused in ((without_token[0], 403), (with_token[0], 401)):
        assert call(server, "127.0.0.1", "GET", "/api/schedules", host="evil.example:9464")[0] == refused
        assert call(server, "127.0.0.1", "GET", "/api/schedules", host=f"localhost:{server.server_port}")[0] == 200
        assert call(server, "127.0.0.1", "GET", "/api/status", host="evil.example:9464")[0] == 200


def test_every_answer_forbids_framing_and_sniffing_and_the_page_runs_only_its_own_script(without_token):
    server, _ = without_token
    for path in ("/", "/api/status", "/metrics", "/nothing"):
        _, headers, _ = call(server, "127.0.0.1", "GET", path)
        assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff", path
    _, headers, _ = call(server, "127.0.0.1", "GET", "/")
    policy = headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in policy and "script-src 'sha256-" in policy and "unsafe-inline'; " in policy
    assert "script-src 'unsafe-inline'" not in policy


def test_the_token_file(tmp_path, caplog):
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    os.chmod(good, 0o600)
    assert read_token_file(str(good)) == TOKEN
    assert AdminAccess.from_file(str(good)).configured and not AdminAccess.from_file(None).configured
    for text, message in (("short", "at least 16"), ("", "at least 16"), ("two words here, long enough", "spaces")):
        bad = tmp_path / "bad"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message):
            read_token_file(str(bad))
    with pytest.raises(ConfigError, match="No such file"):
        read_token_file(str(tmp_path / "missing"))
    os.chmod(good, 0o644)
    with caplog.at_level(logging.WARNING):
        read_token_file(str(good))
    assert "chmod 600" in caplog.text and TOKEN not in caplog.text
