"""Just enough HTTP/1.1 for the gateway, over the asyncio streams of one
unix-socket connection. Everything read here comes from inside a sandbox:
the request line, the headers and the body are bounded, a body needs a
Content-Length (no chunked uploads), and anything else is a 4xx."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from .errors import BadRequest

MAX_LINE = 8 * 1024
MAX_HEADERS = 100
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           411: "Length Required", 413: "Payload Too Large", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"

    def json(self) -> dict:
        try:
            value = json.loads(self.body, parse_constant=_refuse_constant)
        except (ValueError, RecursionError):
            raise BadRequest("the body is not JSON") from None
        if not isinstance(value, dict):
            raise BadRequest("the body must be a JSON object")
        return value


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


async def read_request(reader: asyncio.StreamReader, max_body: int) -> Request | None:
    """The next request, or None when the client closed between requests."""
    line = await _line(reader)
    if not line:
        return None
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("a malformed request line")
    headers = await _headers(reader)
    if "transfer-encoding" in headers:
        raise BadRequest("send the body with a Content-Length", status=411,
                         code="length_required")
    length = _length(headers.get("content-length", "0"), max_body)
    body = await reader.readexactly(length) if length else b""
    return Request(parts[0], parts[1].split("?", 1)[0], headers, body)


async def _line(reader: asyncio.StreamReader) -> str:
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise BadRequest("the request ended early") from None
        return ""
    except asyncio.LimitOverrunError:
        raise BadRequest("a line of the request is too long", status=431,
                         code="headers_too_large") from None
    if len(raw) > MAX_LINE:
        raise BadRequest("a line of the request is too long", status=431, code="headers_too_large")
    return raw.decode("latin-1").rstrip("\r\n")


async def _headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        line = await _line(reader)
        if not line:
            return headers
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise BadRequest("a malformed header")
        headers[name.strip().lower()] = value.strip()
    raise BadRequest("too many headers", status=431, code="headers_too_large")


def _length(raw: str, max_body: int) -> int:
    if not raw.isascii() or not raw.isdigit():
        raise BadRequest("a malformed Content-Length")
    length = int(raw)
    if length > max_body:
        raise BadRequest(f"the body is over {max_body} bytes", status=413, code="too_large")
    return length


def _head(status: int, content_type: str, extra: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}",
             f"content-type: {content_type}"]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def send_json(writer: asyncio.StreamWriter, status: int, value: dict,
                    keep_alive: bool = True) -> None:
    body = json.dumps(value).encode("utf-8")
    extra = {"content-length": str(len(body)),
             "connection": "keep-alive" if keep_alive else "close"}
    writer.write(_head(status, "application/json", extra) + body)
    await writer.drain()


class EventStream:
    """A text/event-stream answer in chunked transfer encoding, so the
    connection can carry the next request after it."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer

    async def start(self) -> None:
        extra = {"transfer-encoding": "chunked", "cache-control": "no-cache",
                 "connection": "keep-alive"}
        self.writer.write(_head(200, "text/event-stream", extra))
        await self.writer.drain()

    async def send(self, data: str, event: str = "") -> None:
        text = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
        raw = text.encode("utf-8")
        self.writer.write(b"%x\r\n%s\r\n" % (len(raw), raw))
        await self.writer.drain()

    async def end(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()
