"""The raw asyncio HTTP client of bench/sse_latency.py: a JSON POST, and SSE
streams read straight off their sockets, each event stamped with the time it
was received."""

from __future__ import annotations

import asyncio
import json
import time


async def http_post(port: int, path: str, token: str, body: dict) -> tuple[int, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(body).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        rest = _dechunk(rest)
    return status, json.loads(rest or b"{}")


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2:]
    return out


class Stream:
    """One SSE response read off a raw socket. Events land in `events`;
    `waiters[seq]` futures resolve with the receive time of that seq."""

    def __init__(self, port: int, agent_id: str, token: str, after: int | None = None):
        self.port, self.agent_id, self.token, self.after = port, agent_id, token, after
        self.waiters: dict[int, asyncio.Future] = {}
        self.received: dict[int, tuple[float, dict]] = {}
        self.task: asyncio.Task | None = None
        self.writer = None
        self.bytes = 0

    async def open(self) -> None:
        reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        query = f"?after={self.after}" if self.after is not None else ""
        self.writer.write(
            f"GET /api/agents/{self.agent_id}/stream{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {self.token}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        await self.writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            raise RuntimeError(f"stream answered {status}: {head!r}")
        self.chunked = b"transfer-encoding: chunked" in head.lower()
        # the stream is open once its first bytes (`retry:`) arrive
        first = await asyncio.wait_for(reader.read(65536), 20)
        self.bytes += len(first)
        self._raw, self._text = b"", b""
        self._feed(first)
        self.task = asyncio.create_task(self._read(reader))

    async def _read(self, reader) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                self.bytes += len(data)
                self._feed(data)
        except (asyncio.CancelledError, ConnectionError):
            return

    def _feed(self, data: bytes) -> None:
        now = time.time()
        if self.chunked:  # HTTP/1.1 chunked framing: decode complete chunks only
            self._raw += data
            while True:
                line, sep, after = self._raw.partition(b"\r\n")
                if not sep:
                    break
                size = int(line.split(b";")[0], 16)
                if len(after) < size + 2:
                    break
                self._text += after[:size]
                self._raw = after[size + 2:]
        else:
            self._text += data
        while b"\n\n" in self._text:
            frame, _, self._text = self._text.partition(b"\n\n")
            self._frame(frame, now)

    def _frame(self, frame: bytes, now: float) -> None:
        fields = {}
        for line in frame.decode("utf-8", "replace").split("\n"):
            if line.startswith(":") or ":" not in line:
                continue
            k, _, v = line.partition(":")
            fields[k] = v[1:] if v.startswith(" ") else v
        if "data" in fields and fields.get("id", "").isdigit():
            seq = int(fields["id"])
            try:
                data = json.loads(fields["data"])
            except ValueError:
                data = {}
            self.received[seq] = (now, data)
            fut = self.waiters.pop(seq, None)
            if fut is not None and not fut.done():
                fut.set_result(now)

    def wait_for(self, seq: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if seq in self.received:
            fut.set_result(self.received[seq][0])
        else:
            self.waiters[seq] = fut
        return fut

    async def close(self) -> None:
        if self.task:
            self.task.cancel()
        if self.writer:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except Exception:
                pass
