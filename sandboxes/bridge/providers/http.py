"""Streaming HTTP for the real providers: http.client, SSE, cancel, redaction."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.parse
from typing import Iterator

from ..cancel import CancelToken
from .base import BudgetExceeded, ConnectionLost, ModelError

#: Seconds a connect or a single read may take before the step fails.
DEFAULT_TIMEOUT = 120.0


def redact(text: str, secret: str | None) -> str:
    """Remove the API key from anything that may reach an event or a log
    (a proxy can echo request headers into an error body)."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "[redacted]")
    return text


class SSEStream:
    """POST a JSON body and iterate the server-sent events of the answer."""

    def __init__(self, url: str, body: dict, headers: dict, *, cancel: CancelToken,
                 timeout: float = DEFAULT_TIMEOUT, secret: str | None = None):
        self.url = url
        self.body = json.dumps(body).encode("utf-8")
        self.headers = {"content-type": "application/json", "accept": "text/event-stream",
                        **headers}
        self.cancel = cancel
        self.timeout = timeout
        self.secret = secret
        self.conn: http.client.HTTPConnection | None = None

    def events(self) -> Iterator[tuple[str, str]]:
        """Yield (event name, data) pairs; raise ModelError on any failure."""
        unregister = self.cancel.on_cancel(self._close)
        try:
            resp = self._open()
            yield from self._parse(resp)
            self.cancel.check()  # EOF because an abort shut the socket down
        except ModelError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.cancel.check()  # an abort closed the socket: not a model error
            lost = isinstance(exc, (ConnectionError, http.client.RemoteDisconnected,
                                    http.client.IncompleteRead))
            raise (ConnectionLost if lost else ModelError)(self._describe(exc)) from None
        finally:
            unregister()
            self._close()

    def _open(self) -> http.client.HTTPResponse:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ModelError(f"bad model base URL: {parts.scheme}://{parts.hostname}")
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        kwargs = {"context": ssl.create_default_context()} if parts.scheme == "https" else {}
        self.conn = cls(parts.hostname, parts.port, timeout=self.timeout, **kwargs)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.conn.request("POST", path, body=self.body, headers=self.headers)
        resp = self.conn.getresponse()
        if resp.status >= 400:
            detail = resp.read(2000).decode("utf-8", "replace")
            message = f"model server answered HTTP {resp.status}: {_short(detail)}"
            # The gateway's refusal (sessions/gateway/budget.py): the same in either API's shape.
            refused = resp.status == 429 and "budget_exceeded" in detail
            raise (BudgetExceeded if refused else ModelError)(redact(message, self.secret))
        ctype = resp.getheader("content-type") or ""
        if "event-stream" not in ctype:
            # Usually a proxy's login page or a server that ignored stream=true.
            detail = resp.read(2000).decode("utf-8", "replace")
            message = (f"model server answered {ctype or 'no content type'} instead of "
                       f"an event stream: {_short(detail)}")
            raise ModelError(redact(message, self.secret))
        return resp

    def _parse(self, resp) -> Iterator[tuple[str, str]]:
        event, data = "", []
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.decode("utf-8").rstrip("\r\n")
            if not line:
                if data:
                    yield event or "message", "\n".join(data)
                event, data = "", []
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" ") if line[5:6] == " " else line[5:])
            elif line.startswith("event:"):
                event = line[6:].strip()
            # ids, retries and ":" comments carry nothing for us.
        if data:
            yield event or "message", "\n".join(data)

    def _close(self) -> None:
        conn = self.conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _describe(self, exc: Exception) -> str:
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return f"model server timed out after {self.timeout:g} s"
        if isinstance(exc, http.client.IncompleteRead):
            return "model server closed the connection mid-stream"
        if isinstance(exc, UnicodeDecodeError):
            return "model server sent bytes that are not UTF-8"
        return redact(f"model server connection failed: {type(exc).__name__}: {exc}", self.secret)


def parse_json(data: str, what: str) -> dict:
    try:
        value = json.loads(data)
    except ValueError:
        raise ModelError(f"model server sent garbage instead of a {what}: {_short(data)}") from None
    if not isinstance(value, dict):
        raise ModelError(f"model server sent a {type(value).__name__} instead of a {what}")
    return value


def _short(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "…"
