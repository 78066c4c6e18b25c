"""The HTTP server of the metrics port (``--metrics-port``): the Prometheus scrape and the status page.

    GET  /                  the page: one self-contained HTML file (status_page.html: inline CSS and JS, no CDN)
    GET  /metrics           Prometheus' text format, from the job's registry (metrics.py)
    GET  /api/status        pending, deliveries, lateness over the last hour, recent rejections, health
    GET  /api/upcoming      schedules due per hour (next 48 h) and per day (next 30 d), read from the state store
    GET  /api/access        whether this client may see schedules and act, and whether a token is configured
    GET  /api/schedules     with id=: those schedules in full (as ``inspect --id``); without: a page of the listing
                            (filters, limit, page_token: listing.py)            [protected]
    POST /api/actions       {"action": "CANCEL" | "CRON_PAUSE" | ..., "id": ..., "input_topic": ...}: writes the
                            native request, waits for the batch that reads it, answers the outcome  [protected]
    POST /login, /logout    the page's login form: the session cookie for the admin token

Protected routes show payloads or act: who may use them is access.py's to say.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import logging
import re
import socket
import threading
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..config import ConfigError
from .access import AdminAccess, Denied, Request
from .metrics import SchedulerMetrics
from .status_page import StatusPage, page_html

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 65_536
PAGES = [
    "/",
    "/metrics",
    "/api/status",
    "/api/upcoming",
    "/api/access",
    "/api/schedules",
    "POST /api/actions",
    "POST /login",
    "POST /logout",
]
LOCAL_GET = Request()
# Every answer: no sniffing, no framing (the page has buttons), no referrer, nothing cached.
COMMON_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)

Response = tuple[int, str, bytes, tuple]  # status, content type, body, extra headers


@lru_cache(maxsize=1)
def page_csp() -> str:
    """The page's Content-Security-Policy: its one inline script (by hash) and inline style, requests to itself."""
    html = page_html().decode()
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'" for s in scripts
    )
    return (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )


class Routes:
    """What each path answers to a request (access.Request): status, content type, body and extra headers."""

    def __init__(self, metrics: SchedulerMetrics, page: StatusPage | None = None, access: AdminAccess | None = None):
        self.metrics = metrics
        self.page = page or StatusPage(metrics)
        self.access = access or AdminAccess(None)

    def answer(self, target: str, request: Request = LOCAL_GET) -> tuple[int, str, bytes]:
        """Status, content type and body (tests and tools: a GET from loopback unless ``request`` says else)."""
        return self.respond(target, request)[:3]

    def respond(self, target: str, request: Request = LOCAL_GET) -> Response:
        parts = urlsplit(target)
        path = parts.path.rstrip("/") or "/"
        if request.method == "POST":
            return self._post(path, request)
        if request.method not in ("GET", "HEAD"):
            return _json(
                405,
                {"error": f"{request.method} is not served: GET, or POST for actions"},
                (("Allow", "GET, HEAD, POST"),),
            )
        if path == "/metrics":
            self.page.scraped()
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry), ()
        if path in ("/", "/index.html"):
            return 200, "text/html; charset=utf-8", page_html(), (("Content-Security-Policy", page_csp()),)
        if path == "/api/status":
            return _json(200, self.page.status())
        if path == "/api/upcoming":
            return _json(200, self.page.upcoming.get())
        if path == "/api/access":
            return _json(200, {"granted": self.access.who(request), "token_configured": self.access.configured})
        if path == "/api/schedules":
            denied = self.access.check_protected(request)
            if denied:
                return _denied(denied)
            query = parse_qs(parts.query, keep_blank_values=True)
            if "id" in query:
                return _json(*self.page.schedules(query["id"]))
            return _json(*self.page.listing(query))
        if path in ("/api/actions", "/login", "/logout"):
            return _json(405, {"error": f"{path} takes a POST"}, (("Allow", "POST"),))
        return _json(404, {"error": f"no such page: {parts.path}", "pages": PAGES})

    def _post(self, path: str, request: Request) -> Response:
        if path not in ("/api/actions", "/login", "/logout"):
            return _json(
                405
                if path in ("/", "/metrics", "/api/status", "/api/upcoming", "/api/access", "/api/schedules")
                else 404,
                {"error": f"no POST to {path}", "pages": PAGES},
            )
        denied = self.access.check_post(request)
        if denied:
            return _denied(denied)
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return _json(400, {"error": "the body is not JSON"})
        if not isinstance(body, dict):
            return _json(400, {"error": "the body must be a JSON object"})
        if path == "/login":
            status, answer, headers = self.access.login(request, body.get("token"))
            return _json(status, answer, headers)
        if path == "/logout":
            status, answer, headers = self.access.logout()
            return _json(status, answer, headers)
        denied = self.access.check_protected(request)
        if denied:
            return _denied(denied)
        return _json(*self.page.act(body, request.client))


def _json(status: int, body: dict, headers: tuple = ()) -> Response:
    return status, "application/json", json.dumps(body, indent=1).encode(), headers


def _denied(denied: Denied) -> Response:
    return _json(denied.status, {"error": denied.error}, denied.headers)


class _Handler(BaseHTTPRequestHandler):
    routes: Routes  # set on the subclass start_server makes

    def _serve(self, method: str) -> None:
        body = b""
        length = self.headers.get("Content-Length")
        try:
            size = int(length) if length else 0
        except ValueError:
            size = -1
        if size < 0 or size > MAX_BODY_BYTES:
            self._send(*_json(413, {"error": f"a body of at most {MAX_BODY_BYTES} bytes"}))
            return
        if size:
            body = self.rfile.read(size)
        request = Request(method, self.client_address[0], {k.lower(): v for k, v in self.headers.items()}, body)
        try:
            answer = self.routes.respond(self.path, request)
        except Exception as exc:  # one bad request must not look like a dead job
            log.warning("status page: %s %s failed: %s", method, urlsplit(self.path).path, exc)
            answer = _json(500, {"error": str(exc)})
        self._send(*answer, head=method == "HEAD")

    def _send(self, status: int, content_type: str, body: bytes, headers: tuple = (), head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in COMMON_HEADERS + tuple(headers):
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_OPTIONS(self) -> None:
        self._serve("OPTIONS")

    def log_message(self, format: str, *args) -> None:
        log.debug("status page: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def start_server(routes: Routes, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``routes`` on host:port (0: a free port) from a daemon thread; ``shutdown()`` and ``server_close()``
    stop it. Raises OSError when the port cannot be bound."""
    handler = type("RoutesHandler", (_Handler,), {"routes": routes})
    server = (_Server6 if ":" in host else _Server)((host, port), handler)
    threading.Thread(target=server.serve_forever, name="status-page", daemon=True).start()
    return server


def serve(metrics: SchedulerMetrics, host: str, port: int, page=None, access: AdminAccess | None = None):
    """Start the HTTP server of /metrics and the status page (``page``: a status_page.StatusPage; without one, a page
    of the metrics alone; ``access``: who may see schedules and act, loopback only without one); returns the server
    (``shutdown()`` stops it). A port in use is a ConfigError."""
    try:
        server = start_server(Routes(metrics, page, access), host, port)
    except OSError as exc:
        what = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise ConfigError(
            f"--metrics-port {port}: cannot serve metrics on {host}:{port} ({what}); choose another "
            f"port, or 0 to turn the metrics off"
        ) from None
    log.info(
        "metrics: http://%s:%d/metrics; status page: http://%s:%d/",
        host,
        server.server_port,
        _browsable(host),
        server.server_port,
    )
    log.info(
        "admin access: schedules and actions for %s",
        "loopback and the admin token (--admin-token-file)"
        if access is not None and access.configured
        else "loopback only (no --admin-token-file)",
    )
    return server


def _browsable(host: str) -> str:
    """The address to open in a browser on this machine: a server listening on every interface answers there too."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
