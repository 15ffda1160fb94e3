"""HTTP for the client: requests with Idempotency-Key retries, and the SSE stream that resumes from its cursor."""

from __future__ import annotations

import http.client
import json
import random
import ssl
import time
import urllib.parse
import uuid
from typing import Any, Iterator

from .errors import (
    RETRY_STATUSES,
    AlineoError,
    InvalidRequest,
    Timeout,
    TransportError,
    command_error,
    error_for,
)
from .turns import Event

DEFAULT_TIMEOUT = 30.0      # one HTTP request
DEFAULT_RETRY_FOR = 30.0    # total time spent retrying one call
STREAM_READ_TIMEOUT = 60.0  # the server sends a heartbeat every ~20 s
_BACKOFF_FIRST, _BACKOFF_MAX = 0.2, 4.0

# --- transport ----------------------------------------------------------------------------


class Transport:
    """HTTP with bearer auth, JSON bodies, idempotency keys and retries."""

    def __init__(self, url: str, token: str, *, timeout: float, retry_for: float,
                 ssl_context: ssl.SSLContext | None = None):
        try:  # "http://[bad" and "http://h:99999" raise ValueError
            parsed = urllib.parse.urlsplit(url)
            port = parsed.port
        except ValueError:
            parsed, port = None, None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise InvalidRequest(f"not an http(s) URL: {url!r}", code="client.bad_url")
        self.url = url.rstrip("/")
        self.scheme, self.host, self.port = parsed.scheme, parsed.hostname, port
        self.prefix = parsed.path.rstrip("/")
        self.token, self.timeout, self.retry_for = token, timeout, retry_for
        self.ssl_context = ssl_context

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=self.ssl_context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def headers(self, extra: dict | None = None) -> dict:
        h = {"Authorization": f"Bearer {self.token}", "Accept": "application/json",
             "User-Agent": "alineo-python-client/1"}
        h.update(extra or {})
        return h

    def get(self, path: str, query: dict | None = None) -> dict:
        return self.call("GET", path, query=query)

    def post(self, path: str, body: dict | None = None, *, key: str | None = None) -> dict:
        """POST with an Idempotency-Key: ``key``, else one made now — the same on every retry."""
        return self.call("POST", path, body or {}, key=key or new_key())

    def call(self, method: str, path: str, body: Any = None, *, key: str | None = None,
             query: dict | None = None) -> dict:
        target = self.prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        payload = None if body is None else json.dumps(body).encode("utf-8")
        extra = {"Content-Type": "application/json"} if payload is not None else {}
        if key is not None:
            extra["Idempotency-Key"] = key
        deadline = time.monotonic() + self.retry_for
        attempt = 0
        while True:
            attempt += 1
            try:
                status, headers, raw = self._once(method, target, payload, self.headers(extra))
            except (OSError, http.client.HTTPException) as exc:
                # Refused, reset, timed out, cut mid-answer: the request may or may
                # not have been acted on. Safe to repeat: GETs read, POSTs carry the key.
                failure = TransportError(f"{method} {path}: {type(exc).__name__}: {exc}",
                                         code="client.network")
                retry_after = None
            else:
                data = _json(raw)
                if status < 400:
                    return data if isinstance(data, dict) else {"value": data}
                failure = error_for(status, data)
                if status not in RETRY_STATUSES:
                    raise failure
                retry_after = _retry_after(headers)
            delay = backoff(attempt, retry_after)
            if time.monotonic() + delay > deadline:
                raise failure
            time.sleep(delay)

    def _once(self, method, target, payload, headers):
        conn = self.connection(self.timeout)
        try:
            conn.request(method, target, body=payload, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()
        finally:
            conn.close()


def new_key() -> str:
    """A fresh Idempotency-Key."""
    return f"py-{uuid.uuid4().hex}"


def backoff(attempt: int, retry_after: float | None = None) -> float:
    """The wait before retry ``attempt`` (1, 2 …): exponential from 0.2 s, at
    most 4 s, with jitter; a server's Retry-After (capped) wins when longer."""
    delay = min(_BACKOFF_MAX, _BACKOFF_FIRST * 2 ** (attempt - 1))
    delay *= 0.75 + random.random() * 0.5
    if retry_after is not None:
        delay = max(delay, min(retry_after, _BACKOFF_MAX * 2))
    return delay


def _retry_after(headers) -> float | None:
    try:
        return float(headers.get("Retry-After"))
    except (TypeError, ValueError):
        return None


def _json(raw: bytes) -> Any:
    if not raw:
        return {}
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"message": raw[:200].decode("utf-8", "replace")}




def quote_part(part: str) -> str:
    return urllib.parse.quote(str(part), safe="")


def wait_command(t: Transport, accepted: dict, timeout: float) -> dict:
    """Poll GET /api/commands/{id} until the command is done (its result) or
    failed (raised), or until ``timeout``."""
    cid, verb = accepted.get("command"), accepted.get("verb", "command")
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        cmd = t.get(f"/api/commands/{quote_part(cid)}")
        state, result = cmd.get("state"), cmd.get("result") or {}
        if state == "done":
            return result
        if state == "failed":
            raise command_error(result, verb)
        if time.monotonic() >= deadline:
            raise Timeout(f"{verb} (command {cid}) was not acted on within {timeout:g} s"
                          + (f" (last progress: {result})" if result else ""),
                          code="client.timeout", body=cmd)
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(0.25, delay * 1.5)


def stream_events(t: Transport, agent_id: str, after: int, deadline: float | None,
         read_timeout: float, reconnect_for: float) -> Iterator[Event]:
    cursor = int(after)
    path = f"{t.prefix}/api/agents/{quote_part(agent_id)}/stream"
    attempt, failing_since = 0, None
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            raise Timeout(f"stream of {agent_id}: deadline reached at seq {cursor}",
                          code="client.timeout")
        timeout = read_timeout
        if deadline is not None:
            timeout = max(0.1, min(read_timeout, deadline - time.monotonic()))
        conn = t.connection(timeout)
        try:
            conn.request("GET", f"{path}?after={cursor}", headers=t.headers({
                "Accept": "text/event-stream", "Last-Event-ID": str(cursor)}))
            resp = conn.getresponse()
            if resp.status != 200:
                failure = error_for(resp.status, _json(resp.read()))
                if resp.status not in RETRY_STATUSES:
                    raise failure
                raise _Retry(failure)
            attempt, failing_since = 0, None  # the server answers: only a lack of it counts
            for ev_id, ev_type, data in _frames(resp):
                if ev_type == "reset":
                    raise AlineoError(f"stream cursor {cursor} is beyond the head of {agent_id}",
                                      code="cursor.beyond_head", body=_json(data.encode()))
                if ev_id is None or not data:
                    continue
                seq = int(ev_id)
                if seq <= cursor:
                    continue  # never twice
                ev = Event.from_json(json.loads(data))
                cursor = seq
                attempt, failing_since = 0, None
                yield ev
                if deadline is not None and time.monotonic() >= deadline:
                    raise Timeout(f"stream of {agent_id}: deadline reached at seq {cursor}",
                                  code="client.timeout")
            failure = TransportError(f"stream of {agent_id} ended at seq {cursor}",
                                     code="client.stream_closed")
        except _Retry as r:
            failure = r.error
        except (OSError, http.client.HTTPException, ValueError) as exc:
            # Cut mid-event, reset, read timeout: reconnect from the cursor.
            failure = TransportError(f"stream of {agent_id}: {type(exc).__name__}: {exc}",
                                     code="client.network")
        finally:
            conn.close()
        attempt += 1
        now = time.monotonic()
        failing_since = failing_since or now
        if now - failing_since > reconnect_for:
            raise failure
        time.sleep(min(backoff(attempt), 1.0) if attempt > 1 else 0.05)


class _Retry(Exception):
    def __init__(self, error: AlineoError):
        self.error = error


def _frames(resp) -> Iterator[tuple[str | None, str, str]]:
    """Parse text/event-stream: (id, event, data) per complete frame. A frame
    cut before its blank line is never yielded."""
    ev_id, ev_type, data = None, "message", []
    while True:
        raw = resp.readline(1 << 20)
        if not raw:
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if not raw.endswith(b"\n"):
            return  # a line cut off by the connection: not a frame
        if line == "":
            if data:
                yield ev_id, ev_type, "\n".join(data)
            ev_id, ev_type, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            ev_id = value
        elif name == "event":
            ev_type = value
        elif name == "data":
            data.append(value)
