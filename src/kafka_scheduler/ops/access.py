"""Who may look and act on the metrics port.

``/metrics``, the page's shell and the JSON of counts (``/api/status``, ``/api/upcoming``: numbers, topic names and
reason classes, never a message's bytes) are open to anyone who reaches the port. What shows payloads (the
schedules: keys, values, headers) or acts (the page's buttons) is *protected*: served to

* a request from loopback (127.0.0.0/8, ::1, and IPv4 loopback mapped into IPv6), judged by the TCP peer address
  alone (never a forwarded header) and only when its Host header names this machine as loopback or an address
  (``localhost``, an IP literal), so a web page that rebinds its own name to 127.0.0.1 is not served;
* a request with ``Authorization: Bearer <token>`` of ``--admin-token-file``, compared in constant time;
* a browser holding the session cookie that ``POST /login`` sets after the same token was typed into the page
  (signed with a key derived from the token; HttpOnly, SameSite=Strict, 12 hours).

Without a token configured, protected routes are served to loopback only. A POST (login, logout, actions) must also
be JSON (``Content-Type: application/json``) and, unless it carries the Bearer token, have the header
``X-Requested-With: kafka-scheduler``: a page of another site can send neither without a CORS preflight, which
this server never grants; a cross-site ``Origin`` or ``Sec-Fetch-Site`` is refused outright. Nothing secret is
logged: not the token, not the cookie, not a failed attempt's value.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..config import ConfigError

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16
SESSION_COOKIE = "kafka_scheduler_session"
SESSION_S = 12 * 3600
CSRF_HEADER = "x-requested-with"
CSRF_VALUE = "kafka-scheduler"
FAILED_LOG_EVERY_S = 60.0


@dataclass(frozen=True)
class Request:
    """What a route needs of an HTTP request: the method, the TCP peer's address, the headers (names in lower
    case) and the body."""

    method: str = "GET"
    client: str = "127.0.0.1"
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, and ::ffff:127.x.y.z (an IPv4 loopback peer of a dual-stack socket)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def host_name(host_header: str) -> str:
    """The host of a Host header, without port or IPv6 brackets, lower case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _local_host(host_header: str | None) -> bool:
    """A Host a loopback client may use without a token: localhost or an address (DNS rebinding needs a name)."""
    if host_header is None:
        return True
    host = host_name(host_header)
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return True
    except ValueError:
        return False


def read_token_file(path: str) -> str:
    """The admin token: the file's text without surrounding white space; at least MIN_TOKEN_CHARS characters."""
    try:
        with open(path, "rb") as file:
            raw = file.read(65_536)
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError(f"--admin-token-file {path}: {exc.strerror}") from None
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"--admin-token-file {path}: the token is not UTF-8 text") from None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ConfigError(
            f"--admin-token-file {path}: the token must be at least {MIN_TOKEN_CHARS} characters "
            f"without spaces (e.g. openssl rand -hex 32 > {path})"
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("admin token: %s can be read by other users than its owner (chmod 600 it)", path)
    return token


@dataclass
class Denied:
    status: int
    error: str
    headers: tuple = ()


class AdminAccess:
    """The rules above. ``token`` None: protected routes for loopback only."""

    def __init__(self, token: str | None = None, clock: Callable[[], float] = time.time):
        self.token = token
        self.clock = clock
        self._key = (
            hmac.new(token.encode(), b"kafka-scheduler session cookie", hashlib.sha256).digest() if token else None
        )
        self._last_failure_log = 0.0
        self._failures_unlogged = 0

    @classmethod
    def from_file(cls, path: str | None) -> AdminAccess:
        return cls(read_token_file(path) if path else None)

    @property
    def configured(self) -> bool:
        return self.token is not None

    # ------------------------------------------------------------ credentials

    def _bearer(self, request: Request) -> bool | None:
        """True: the right token; False: another one; None: no Bearer at all, or no token configured (then an
        Authorization header means nothing here)."""
        value = request.header("authorization")
        if value is None or self.token is None:
            return None
        scheme, _, given = value.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self.token.encode())

    def session_cookie(self) -> str:
        expires = int(self.clock()) + SESSION_S
        return f"{expires}.{self._signature(expires)}"

    def _signature(self, expires: int) -> str:
        digest = hmac.new(self._key, str(expires).encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def _cookie_ok(self, request: Request) -> bool:
        if self._key is None:
            return False
        value = _cookie(request.header("cookie"), SESSION_COOKIE)
        if not value:
            return False
        expires, _, signature = value.partition(".")
        if not expires.isdigit() or int(expires) < self.clock():
            return False
        return hmac.compare_digest(signature.encode(), self._signature(int(expires)).encode())

    def who(self, request: Request) -> str | None:
        """How ``request`` may see payloads and act: "token", "session" or "loopback"; None if it may not."""
        bearer = self._bearer(request)
        if bearer:
            return "token"
        if bearer is None and self._cookie_ok(request):
            return "session"
        if bearer is None and is_loopback(request.client) and _local_host(request.header("host")):
            return "loopback"
        return None

    # ------------------------------------------------------------ the checks

    def check_protected(self, request: Request) -> Denied | None:
        """None if ``request`` may see payloads and act; else the answer."""
        if self.who(request) is not None:
            return None
        if self._bearer(request) is False:
            self._failed(request, "a wrong token")
        if self.token is None:
            why = (
                "its Host header is not a loopback name or address"
                if is_loopback(request.client)
                else "it does not come from loopback"
            )
            return Denied(
                403,
                f"schedules and actions are served to loopback only (this request: {why}); start "
                f"the job with --admin-token-file to allow them from elsewhere with the token",
            )
        return Denied(
            401,
            "this needs the admin token: Authorization: Bearer <token>, or log in on the page",
            (("WWW-Authenticate", 'Bearer realm="kafka-scheduler"'),),
        )

    def check_post(self, request: Request) -> Denied | None:
        """A state-changing POST: JSON, not cross-site, and either the Bearer token or the custom header."""
        if not (request.header("content-type") or "").lower().startswith("application/json"):
            return Denied(415, "send JSON: Content-Type: application/json")
        site = (request.header("sec-fetch-site") or "").lower()
        if site in ("cross-site", "same-site"):
            return Denied(403, "refused: a request from another site")
        origin = request.header("origin")
        if origin is not None and origin != "null":
            parts = urlsplit(origin)
            if request.header("host") is None or parts.netloc.lower() != request.header("host").lower():
                return Denied(403, "refused: a request from another origin")
        elif origin == "null":
            return Denied(403, "refused: a request from an opaque origin")
        if not self._bearer(request) and (request.header(CSRF_HEADER) or "").lower() != CSRF_VALUE:
            return Denied(403, f"send the header X-Requested-With: {CSRF_VALUE} (or Authorization: Bearer)")
        return None

    def login(self, request: Request, token: object) -> tuple[int, dict, tuple]:
        """``POST /login`` with {"token": ...}: the session cookie, or 401."""
        if self.token is None:
            return (
                404,
                {
                    "error": "no admin token is configured (--admin-token-file): schedules and actions are "
                    "served to loopback only"
                },
                (),
            )
        if not isinstance(token, str) or not hmac.compare_digest(token.strip().encode(), self.token.encode()):
            self._failed(request, "a wrong token at login")
            return 401, {"error": "wrong token"}, ()
        cookie = f"{SESSION_COOKIE}={self.session_cookie()}; Max-Age={SESSION_S}; Path=/; HttpOnly; SameSite=Strict"
        return 200, {"ok": True, "expires_in_s": SESSION_S}, (("Set-Cookie", cookie),)

    @staticmethod
    def logout() -> tuple[int, dict, tuple]:
        return 200, {"ok": True}, (("Set-Cookie", f"{SESSION_COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict"),)

    def _failed(self, request: Request, what: str) -> None:
        """Logged at most once a minute, with the peer address and how many since: never the value tried."""
        now = self.clock()
        self._failures_unlogged += 1
        if now - self._last_failure_log >= FAILED_LOG_EVERY_S:
            log.warning(
                "status page: %s from %s (%d refused since the last such line)",
                what,
                request.client,
                self._failures_unlogged,
            )
            self._last_failure_log, self._failures_unlogged = now, 0


def _cookie(header: str | None, name: str) -> str | None:
    for part in (header or "").split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value
    return None
