"""The HTTP server of the metrics port (``--metrics-port``): the Prometheus scrape and the status page.

    /                  the page: one self-contained HTML file (status_page.html: inline CSS and JS, no CDN)
    /metrics           Prometheus' text format, from the job's registry (metrics.py)
    /api/status        pending, deliveries, lateness over the last hour, recent rejections, health
    /api/upcoming      schedules due per hour (next 48 h) and per day (next 30 d), read from the state store
    /api/schedules?id= pending schedules with these request ids, in full (as ``kafka-scheduler inspect --id``)
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..config import ConfigError
from .metrics import SchedulerMetrics
from .status_page import StatusPage, page_html

log = logging.getLogger(__name__)


class Routes:
    """What each path answers: (status, content type, body) for a GET of a target (path and query)."""

    def __init__(self, metrics: SchedulerMetrics, page: Optional[StatusPage] = None):
        self.metrics = metrics
        self.page = page or StatusPage(metrics)

    def answer(self, target: str) -> tuple[int, str, bytes]:
        parts = urlsplit(target)
        path = parts.path.rstrip("/") or "/"
        if path == "/metrics":
            self.page.scraped()
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
        if path in ("/", "/index.html"):
            return 200, "text/html; charset=utf-8", page_html()
        if path == "/api/status":
            return _json(200, self.page.status())
        if path == "/api/upcoming":
            return _json(200, self.page.upcoming.get())
        if path == "/api/schedules":
            return _json(*self.page.schedules(parse_qs(parts.query).get("id", [])))
        return _json(404, {"error": f"no such page: {parts.path}", "pages": ["/", "/metrics", "/api/status",
                                                                             "/api/upcoming", "/api/schedules?id="]})


def _json(status: int, body: dict) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body, indent=1).encode()


class _Handler(BaseHTTPRequestHandler):
    routes: Routes  # set on the subclass start_server makes

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        try:
            status, content_type, body = self.routes.answer(self.path)
        except Exception as exc:  # one bad request must not look like a dead job
            log.warning("status page: %s failed: %s", self.path, exc)
            status, content_type, body = _json(500, {"error": str(exc)})
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
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


def serve(metrics: SchedulerMetrics, host: str, port: int, page=None):
    """Start the HTTP server of /metrics and the status page (``page``: a status_page.StatusPage; without one, a page
    of the metrics alone); returns the server (``shutdown()`` stops it). A port in use is a ConfigError."""
    try:
        server = start_server(Routes(metrics, page), host, port)
    except OSError as exc:
        what = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise ConfigError(f"--metrics-port {port}: cannot serve metrics on {host}:{port} ({what}); choose another "
                          f"port, or 0 to turn the metrics off") from None
    log.info("metrics: http://%s:%d/metrics; status page: http://%s:%d/", host, server.server_port,
             _browsable(host), server.server_port)
    return server


def _browsable(host: str) -> str:
    """The address to open in a browser on this machine: a server listening on every interface answers there too."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
