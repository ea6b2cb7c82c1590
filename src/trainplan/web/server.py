"""A small standard-library HTTP server: one static page and the JSON API (docs/web.md).

Routes are the table :data:`ROUTES`; the OpenAPI document (``GET /api/openapi.json``) is tested
to list exactly these. Errors are JSON, ``{"error": {"field": ..., "message": ...}}``: 400 for
bad input (any :class:`~trainplan.errors.TrainplanError`), 404/405/413 for bad requests, and 500
with a one-line message — a traceback goes to the server's log, never into a response.

Bound to loopback (the default), the server answers only requests whose ``Host`` is a loopback
name with the bound port, so a web site open in the same browser cannot reach it through DNS
rebinding, and whose ``Origin`` (when the browser sends one) is the server's own: a cross-site
``fetch`` or form post — a "simple" ``text/plain`` POST needs no CORS preflight — is answered 403
before its body is read. ``Sec-Fetch-Site: cross-site`` is refused the same way. Malformed
requests, unknown methods and unsupported HTTP versions are 4xx JSON errors; a client that hangs
up or stalls (``TIMEOUT_S``) is dropped without a traceback in the log.
"""

from __future__ import annotations

import email.message
import ipaddress
import json
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Final

from trainplan.errors import TrainplanError
from trainplan.web import DEFAULT_HOST, DEFAULT_PORT, api
from trainplan.web.openapi import openapi_document

STATIC_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
SECURITY_HEADERS: Final = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
}


@dataclass(frozen=True, kw_only=True)
class Route:
    method: str
    path: str
    summary: str


ROUTES: Final = (
    Route(method="GET", path="/", summary="the page"),
    Route(method="GET", path="/api/models", summary="model presets (trainplan models --json)"),
    Route(method="GET", path="/api/hardware", summary="accelerator catalog (trainplan hardware list --json)"),
    Route(method="POST", path="/api/estimate", summary="one configuration (trainplan estimate --json)"),
    Route(
        method="POST",
        path="/api/compare",
        summary="each accelerator at its best layout (trainplan compare --json)",
    ),
    Route(
        method="POST",
        path="/api/plan",
        summary="search accelerators, device counts and layouts (trainplan plan --json)",
    ),
    Route(method="GET", path="/api/openapi.json", summary="this API as an OpenAPI 3.1 document"),
)


def static_files() -> dict[str, tuple[bytes, str]]:
    """The page's files by URL path (``/static/<name>``), read once from the package."""
    out: dict[str, tuple[bytes, str]] = {}
    root = resources.files("trainplan.web") / "static"
    for entry in root.iterdir():
        name = entry.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        if entry.is_file() and suffix in STATIC_TYPES:
            out["/static/" + name] = (entry.read_bytes(), STATIC_TYPES[suffix])
    return out


def _is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_port(header: str) -> tuple[str, int | None]:
    """``Host`` header as (name, port); the port is ``None`` when absent, -1 when not a number."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return header, None
        name, rest = header[1:end], header[end + 1 :]
    elif header.count(":") == 1:
        name, rest = header.split(":", 1)
        rest = ":" + rest
    else:
        name, rest = header, ""
    if not rest:
        return name, None
    digits = rest[1:] if rest.startswith(":") else ""
    return name, int(digits) if digits.isdigit() and len(digits) <= 5 else -1


TIMEOUT_S: Final = 30.0
"""Seconds a connection may stall (sending its request or body) before it is dropped."""
HTTP_DEFAULT_PORT: Final = 80


class _Handler(BaseHTTPRequestHandler):
    server: TrainplanServer
    protocol_version = "HTTP/1.1"
    server_version = "trainplan"
    sys_version = ""
    timeout = TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.timeout_s)

    # --- plumbing ---------------------------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:
        if self.server.log_requests:
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for key, value in SECURITY_HEADERS.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: object) -> None:
        try:
            text = json.dumps(payload, allow_nan=False)
        except ValueError:
            text = json.dumps(_finite(payload), allow_nan=False)
        self._send(status, text.encode("utf-8"), "application/json")

    def _error(self, status: int, field: str | None, message: str) -> None:
        self._json(status, {"error": {"field": field, "message": message}})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (malformed request line or headers, unknown method, HTTP
        version) as JSON; an unknown method is 405 and an unsupported version 400, not 5xx."""
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command!r} is not supported"
        elif code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:
            code = HTTPStatus.BAD_REQUEST
        self.close_connection = True
        if not hasattr(self, "headers"):  # the request line itself was bad: no headers parsed
            self.headers = email.message.Message()
        if not getattr(self, "command", None):
            self.command = ""
        if self.request_version == "HTTP/0.9":  # no status line is possible in HTTP/0.9
            self.request_version = "HTTP/1.0"
        self._error(code, None, message or HTTPStatus(code).phrase)

    def _host_ok(self) -> bool:
        if not self.server.loopback_only:
            return True
        name, port = _host_port(self.headers.get("Host", ""))
        bound = self.server.port
        if not _is_loopback_host(name):
            self._error(HTTPStatus.FORBIDDEN, "Host", "this server answers loopback host names only")
            return False
        if (port if port is not None else HTTP_DEFAULT_PORT) != bound:
            self._error(HTTPStatus.FORBIDDEN, "Host", f"this server answers on port {bound} only")
            return False
        return self._origin_ok()

    def _origin_ok(self) -> bool:
        """No ``Origin``, or this server's own (``http://`` + the ``Host`` header); no cross-site
        ``Sec-Fetch-Site``. Browsers send ``Origin`` with every cross-origin request and every POST."""
        origin = self.headers.get("Origin")
        site = (self.headers.get("Sec-Fetch-Site") or "").strip().lower()
        if site == "cross-site":
            self._error(HTTPStatus.FORBIDDEN, "Origin", "cross-site requests are refused")
            return False
        if origin is None:
            return True
        origin = origin.strip().lower()
        if origin.startswith("http://"):
            name, port = _host_port(origin[len("http://") :])
            if _is_loopback_host(name) and port == self.server.port:
                return True
        self._error(
            HTTPStatus.FORBIDDEN,
            "Origin",
            f"requests from origin {origin[:200]!r} are refused; use the page this server serves",
        )
        return False

    def _body(self) -> object:
        keep_alive = not self.close_connection
        self.close_connection = True  # until the whole body is read
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            raise api.ApiError(
                "body", "send a JSON body with a Content-Length", status=HTTPStatus.LENGTH_REQUIRED
            )
        try:
            length = int(length_text)
        except ValueError:
            raise api.ApiError("body", "bad Content-Length") from None
        if length < 0:
            raise api.ApiError("body", "bad Content-Length")
        if length > api.MAX_BODY_BYTES:
            raise api.ApiError(
                "body",
                f"request body is {length:,} bytes, over the {api.MAX_BODY_BYTES:,}-byte limit "
                "(a config.json may be at most 1,000,000 bytes)",
                status=HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            )
        raw = self.rfile.read(length)
        if len(raw) != length:
            raise api.ApiError("body", f"request body ended after {len(raw)} of {length} bytes")
        self.close_connection = not keep_alive
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise api.ApiError("body", "request body is not UTF-8 text") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise api.ApiError(
                "body", f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
        except RecursionError:
            raise api.ApiError("body", "request body is nested too deeply") from None

    def _guarded(self, work: Callable[[], None]) -> None:
        try:
            work()
        except api.ApiError as err:
            self._json(err.status, api.error_body(err))
        except TrainplanError as err:
            self._json(HTTPStatus.BAD_REQUEST, api.error_body(err))
        except (ConnectionError, TimeoutError):  # the client hung up or stalled: nobody to answer
            self.close_connection = True
        except Exception as exc:  # a bug: log it, answer one line
            sys.stderr.write(traceback.format_exc())
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, None, f"internal error ({type(exc).__name__})")

    # --- verbs ------------------------------------------------------------------------------
    def do_GET(self) -> None:
        if not self._host_ok():
            return
        path = self.path.split("?", 1)[0]
        self._guarded(lambda: self._get(path))

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        if not self._host_ok():
            return
        path = self.path.split("?", 1)[0]
        self._guarded(lambda: self._post(path))

    def do_PUT(self) -> None:
        self._not_allowed()

    def do_DELETE(self) -> None:
        self._not_allowed()

    def do_PATCH(self) -> None:
        self._not_allowed()

    def do_OPTIONS(self) -> None:
        self._not_allowed()  # no CORS: a preflight from another origin gets no permission

    def _not_allowed(self) -> None:
        self.close_connection = True
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, None, f"{self.command} is not supported")

    def _get(self, path: str) -> None:
        srv = self.server
        if path in ("/", "/index.html"):
            body, ctype = srv.static["/static/index.html"]
            self._send(HTTPStatus.OK, body, ctype)
        elif path in srv.static:
            body, ctype = srv.static[path]
            self._send(HTTPStatus.OK, body, ctype)
        elif path == "/api/models":
            self._json(HTTPStatus.OK, srv.cached("models", api.models))
        elif path == "/api/hardware":
            self._json(HTTPStatus.OK, srv.cached("hardware", api.hardware))
        elif path == "/api/openapi.json":
            self._json(HTTPStatus.OK, srv.cached("openapi", openapi_document))
        elif path in srv.post_routes:
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, None, f"use POST for {path}")
        else:
            self._error(
                HTTPStatus.NOT_FOUND, None, f"no such path {path!r}; GET /api/openapi.json lists them"
            )

    def _post(self, path: str) -> None:
        handler = self.server.post_routes.get(path)
        if handler is None:
            self.close_connection = True
            self._error(
                HTTPStatus.NOT_FOUND, None, f"no POST route {path!r}; GET /api/openapi.json lists them"
            )
            return
        self._json(HTTPStatus.OK, handler(self._body()))


def _finite(value: object) -> object:
    """JSON cannot hold NaN or infinity: those become null."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _plan(body: object) -> object:
    from trainplan.web import plan_api

    return plan_api.plan(body)


def _compare(body: object) -> object:
    from trainplan.web import plan_api

    return plan_api.compare(body)


class TrainplanServer(ThreadingHTTPServer):
    """The page and the API; ``server_address`` holds the bound (host, port)."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        log_requests: bool = False,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.log_requests = log_requests
        self.timeout_s = timeout_s
        self.static = static_files()
        self.loopback_only = _is_loopback_host(host)
        self.post_routes: dict[str, Callable[[object], object]] = {
            "/api/estimate": api.estimate,
            "/api/compare": _compare,
            "/api/plan": _plan,
        }
        self._cache: dict[str, object] = {}
        self._cache_lock = threading.Lock()
        if ":" in host:
            self.address_family = __import__("socket").AF_INET6
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        """The bound port (a request's ``Host`` and ``Origin`` must name it)."""
        return int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up, reset or stalled is no error of the server: one log line at
        most, never a traceback; anything else is logged as the bug it is."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            if self.log_requests:
                sys.stderr.write(f"trainplan serve: {client_address[0]}: {type(exc).__name__}\n")
            return
        super().handle_error(request, client_address)

    def cached(self, key: str, make: Callable[[], object]) -> object:
        with self._cache_lock:
            if key not in self._cache:
                self._cache[key] = make()
            return self._cache[key]

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        host_text = f"[{host}]" if ":" in host else host
        return f"http://{host_text}:{port}/"


def make_server(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    log_requests: bool = False,
    timeout_s: float = TIMEOUT_S,
) -> TrainplanServer:
    """Bind (``port=0`` picks a free port); call ``serve_forever()`` and ``shutdown()`` yourself.
    ``timeout_s``: how long a connection may stall before it is dropped."""
    return TrainplanServer(host, port, log_requests=log_requests, timeout_s=timeout_s)
