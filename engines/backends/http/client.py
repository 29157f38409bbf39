"""A small JSON-over-HTTP client with a hard deadline per request and retries only where a
retry is safe.

Every failure is a :class:`ServerError` that says which request failed, how (``reason``:
``unreachable``, ``loading``, ``http``, ``timeout``, ``malformed``, ``lost``) and what the
server said, so a cell that fails on a server reads as the server's own words, never as a
traceback. Two failures are retried with backoff, because the request cannot have been
served: a refused connection (a server still starting) and HTTP 503 (llama-server answers
503 while it loads its model). Anything else is not retried: a 500, a timeout or a dropped
connection may have happened half-way through a decode, and a second try would hide it.

The deadline is a wall-clock budget for the whole request (connect, send, every read), not
a per-read socket timeout: a server that trickles bytes cannot hold a cell past it.
"""
from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

from engines.errors import ExecutionError, InputError

# what a request is told when a server's words are too long to quote whole
WORDS = 300
RETRIED = ("unreachable", "loading")


class ServerError(ExecutionError):
    """A request to a server failed. ``reason``: unreachable | loading | http | timeout |
    malformed | lost | ids; ``status``: the HTTP status where one came back; ``words``:
    what the server said (its body, trimmed)."""

    def __init__(self, message: str, *, reason: str, endpoint: str, status: int | None = None,
                 words: str = "", remedy: str | None = None):
        self.reason, self.endpoint, self.status, self.words = reason, endpoint, status, words
        self.what = message
        said = f"; the server said: {words}" if words else ""
        super().__init__(f"{endpoint}: {message}{said}", field="server", value=endpoint,
                         remedy=remedy)

    @property
    def retry_safe(self) -> bool:
        return self.reason in RETRIED


def trimmed(text: str | bytes, limit: int = WORDS) -> str:
    """A server's words for a message: decoded, on one line, at most ``limit`` characters."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def check_url(url: str, field: str) -> str:
    """``http://host:port`` (a trailing slash dropped); anything else is an ``InputError``."""
    parts = urlsplit(url.strip())
    if parts.scheme != "http" or not parts.hostname or parts.query or parts.fragment:
        raise InputError("a server URL is http://HOST:PORT", field=field, value=url,
                         remedy="give the server's base URL, such as http://127.0.0.1:8080 "
                                "(https is not supported; lockstep talks to servers on this "
                                "machine or a trusted network)")
    try:
        parts.port
    except ValueError:
        raise InputError("the URL's port is not a number from 0 to 65535", field=field,
                         value=url, remedy="write it as http://HOST:PORT") from None
    return f"http://{parts.netloc}{parts.path.rstrip('/')}"


class _Connection(http.client.HTTPConnection):
    """http.client hands a closing connection's socket to the reply and closes it; this one
    keeps it until lockstep has read the whole reply, so every read runs under the request's
    deadline (``settimeout`` on a closed socket fails)."""

    def close(self) -> None:
        pass

    def release(self) -> None:
        super().close()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self, endpoint: str) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise ServerError("the reply is not JSON", reason="malformed", endpoint=endpoint,
                              status=self.status, words=trimmed(self.body)) from None


class HttpClient:
    """Requests to one server. ``timeout``: each request's wall-clock deadline in seconds;
    ``attempts`` and ``backoff``: how often and how patiently a retry-safe failure is tried
    again (``backoff`` doubles after each try, and no try starts past ``retry_for``)."""

    def __init__(self, base_url: str, timeout: float, *, attempts: int = 4,
                 backoff: float = 0.25, retry_for: float | None = None):
        parts = urlsplit(base_url)
        self.base_url, self.host = base_url, parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.timeout, self.attempts, self.backoff = timeout, attempts, backoff
        self.retry_for = timeout if retry_for is None else retry_for
        #: called before every try: raises where the server is known to be gone (a process
        #: lockstep started has exited), so nothing waits on a dead server
        self.alive_check: Callable[[], None] | None = None

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        return self.request("GET", path, None, timeout).json(f"GET {path}")

    def post_json(self, path: str, body: dict, timeout: float | None = None) -> Any:
        return self.request("POST", path, body, timeout).json(f"POST {path}")

    def request(self, method: str, path: str, body: dict | None,
                timeout: float | None = None, retry: bool = True) -> Reply:
        """One request, retried with backoff while it fails in a retry-safe way; a reply
        with status >= 400 is a :class:`ServerError` carrying the server's words."""
        endpoint = f"{method} {path}"
        start = time.monotonic()
        wait = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                if self.alive_check is not None:
                    self.alive_check()
                return self._once(method, path, body, timeout or self.timeout, endpoint)
            except ServerError as err:
                left = self.retry_for - (time.monotonic() - start)
                if not (retry and err.retry_safe and attempt < self.attempts and left > wait):
                    if err.retry_safe and attempt > 1:
                        err.args = (f"{err.args[0]} (tried {attempt} times over "
                                    f"{time.monotonic() - start:.1f} s)",)
                    raise
                time.sleep(wait)
                wait *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, method: str, path: str, body: dict | None, timeout: float,
              endpoint: str) -> Reply:
        deadline = time.monotonic() + timeout
        data = None if body is None else json.dumps(body).encode()
        conn = _Connection(self.host, self.port, timeout=timeout)
        try:
            try:
                conn.request(method, self.prefix + path, body=data,
                             headers={"Content-Type": "application/json"} if data else {})
                sock = conn.sock  # the reply is read from it after the connection lets go
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                resp = conn.getresponse()
                chunks = []
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise socket.timeout()
                    sock.settimeout(left)
                    chunk = resp.read(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
            except ConnectionRefusedError:
                raise ServerError("connection refused: no server is listening there",
                                  reason="unreachable", endpoint=endpoint,
                                  remedy=f"start the server at {self.base_url}, or check the "
                                         f"URL") from None
            except (socket.timeout, TimeoutError):
                raise ServerError(f"no complete reply within {timeout:g} s", reason="timeout",
                                  endpoint=endpoint,
                                  remedy="check that the server is not stuck or overloaded, "
                                         "or allow more time (LOCKSTEP_HTTP_TIMEOUT)") from None
            except (http.client.RemoteDisconnected, http.client.IncompleteRead,
                    ConnectionResetError, BrokenPipeError) as exc:
                raise ServerError(f"the connection was dropped before a complete reply "
                                  f"({type(exc).__name__}): the server may have died",
                                  reason="lost", endpoint=endpoint,
                                  remedy="see the server's log") from None
            except OSError as exc:  # no route, name not resolved
                raise ServerError(f"cannot reach the server ({exc})", reason="unreachable",
                                  endpoint=endpoint, remedy="check the URL") from None
        finally:
            conn.release()
        reply = Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()},
                      b"".join(chunks))
        if resp.status == 503:
            raise ServerError("HTTP 503: the server is not ready (loading its model)",
                              reason="loading", endpoint=endpoint, status=503,
                              words=trimmed(reply.body))
        if resp.status >= 400:
            raise ServerError(f"HTTP {resp.status}", reason="http", endpoint=endpoint,
                              status=resp.status, words=trimmed(reply.body),
                              remedy="see the server's words and its log")
        return reply


__all__ = ["HttpClient", "Reply", "ServerError", "check_url", "trimmed"]
