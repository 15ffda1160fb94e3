"""The fan-out bench's client: many SSE streams read by a few worker processes
on raw non-blocking sockets and epoll, doing as little as possible per receipt.

Why (issue 14): the old client (bench/_sse_client.py, one asyncio task per
stream, each event decoded and JSON-parsed as it arrived) shared the two cores
with the server, so at 1,000 streams it measured itself as much as the server.
Here a worker only ``recv()``s what is readable, stamps each chunk with the
time ``epoll`` returned, and checks for one marker; decoding (chunked framing,
SSE frames, each event's ``ts``) happens after the measurement, from the
stamped chunks. The same client reads Alineo's streams and the peer's
(django-eventstream), so both are measured the same way.

Workers are spawned processes driven over a pipe: ``open`` N streams, ``wait``
until every stream has a marker, ``collect`` (commit -> receipt latencies per
stream, and the worker's CPU time), ``close``.
"""

from __future__ import annotations

import multiprocessing as mp
import re
import select
import socket
import time
from datetime import datetime

TS_ALINEO = re.compile(rb'"ts":"([0-9T:.\-]+)Z"')  # the event's own ts comes before its data
TS_PEER = re.compile(rb'"t_ns": ([0-9]+)')
ID = re.compile(rb"^id: (?:[^\n:]*:)?([0-9]+)$", re.M)


def _ts_seconds(kind: str, frame: bytes) -> float | None:
    if kind == "alineo":
        m = TS_ALINEO.search(frame)
        if not m:
            return None
        return datetime.fromisoformat(m.group(1).decode() + "+00:00").timestamp()
    m = TS_PEER.search(frame)
    return int(m.group(1)) / 1e9 if m else None


class _Conn:
    __slots__ = ("sock", "chunks", "scan_from", "seen")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.chunks: list[tuple[float, bytes]] = []
        self.scan_from = 0  # chunks before this one do not hold the current marker
        self.seen = True


def _open(port: int, request: bytes, count: int, batch: int = 50) -> list[_Conn]:
    conns = []
    for k in range(0, count, batch):
        socks = []
        for _ in range(min(batch, count - k)):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(request)
            socks.append(s)
        for s in socks:
            head = b""
            while b"\r\n\r\n" not in head:
                data = s.recv(65536)
                if not data:
                    raise RuntimeError("stream closed before its headers")
                head += data
            status = head.split(b" ", 2)[1]
            if status != b"200":
                raise RuntimeError(f"stream answered {status!r}: {head[:300]!r}")
            if b"chunked" not in head.split(b"\r\n\r\n", 1)[0].lower():
                raise RuntimeError("expected a chunked response")
            c = _Conn(s)
            c.chunks.append((time.time(), head.split(b"\r\n\r\n", 1)[1]))
            s.setblocking(False)
            conns.append(c)
    return conns


def _has(conn: _Conn, marker: bytes) -> bool:
    chunks = conn.chunks
    start = max(0, conn.scan_from - 1)  # the previous chunk too: a marker may straddle two
    found = marker in b"".join(d for _, d in chunks[start:])
    conn.scan_from = len(chunks)
    return found


def _frames(conn: _Conn):
    """(receipt time, SSE frame) for every complete frame, decoding the chunked framing."""
    raw, text = b"", b""
    for t, data in conn.chunks:
        raw += data
        while True:
            line, sep, after = raw.partition(b"\r\n")
            if not sep:
                break
            size = int(line.split(b";")[0], 16)
            if len(after) < size + 2:
                break
            text += after[:size]
            raw = after[size + 2:]
        while b"\n\n" in text:
            frame, _, text = text.partition(b"\n\n")
            yield t, frame


def _collect(conns: list[_Conn], kind: str) -> list[list[tuple[int, float]]]:
    out = []
    for conn in conns:
        got = []
        for t, frame in _frames(conn):
            m = ID.search(frame)
            ts = _ts_seconds(kind, frame) if m else None
            if ts is not None:
                got.append((int(m.group(1)), (t - ts) * 1000))
        out.append(got)
    return out


def _worker(pipe) -> None:
    ep = select.epoll()
    ep.register(pipe.fileno(), select.EPOLLIN)
    conns: dict[int, _Conn] = {}
    marker: bytes | None = None
    waiting = 0.0  # the deadline of the current wait, 0 when none
    kind = "alineo"
    missing = 0  # streams still without the marker of the current wait
    while True:
        events = ep.poll(0.05)
        now = time.time()
        for fd, _ in events:
            conn = conns.get(fd)
            if conn is None:
                continue
            try:
                data = conn.sock.recv(1 << 18)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                ep.unregister(fd)
                continue
            conn.chunks.append((now, data))
            if waiting and not conn.seen:  # only what just arrived needs a look
                conn.seen = _has(conn, marker)
                missing -= conn.seen
        if waiting and (not missing or time.monotonic() > waiting):
            pipe.send(("seen", missing))
            waiting = 0.0
        if not pipe.poll():
            continue
        cmd, *args = pipe.recv()
        if cmd == "open":
            port, request, count, kind = args
            try:
                for c in _open(port, request, count):
                    conns[c.sock.fileno()] = c
                    ep.register(c.sock.fileno(), select.EPOLLIN)
                pipe.send(("opened", len(conns)))
            except Exception as exc:  # noqa: BLE001 - reported to the bench
                pipe.send(("error", repr(exc)))
        elif cmd == "wait":
            marker, timeout = args
            for c in conns.values():  # what arrived before the command
                c.seen = _has(c, marker)
            missing = sum(1 for c in conns.values() if not c.seen)
            waiting = time.monotonic() + timeout
        elif cmd == "collect":
            cpu = time.process_time()  # before the decoding, which is not receipt work
            pipe.send(("collected", _collect(list(conns.values()), kind), cpu))
        elif cmd == "close":
            for c in conns.values():
                c.sock.close()
            pipe.send(("closed",))
            return


class FanClient:
    """Streams spread over ``procs`` worker processes."""

    def __init__(self, procs: int = 2):
        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        for _ in range(procs):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(theirs,), daemon=True)
            p.start()
            self.pipes.append(mine)
            self.procs.append(p)
        self.count = 0

    def _all(self, msg, timeout: float) -> list:
        for pipe in self.pipes:
            pipe.send(msg)
        return [self._answer(pipe, timeout) for pipe in self.pipes]

    @staticmethod
    def _answer(pipe, timeout: float):
        if not pipe.poll(timeout):
            raise RuntimeError("a client worker did not answer")
        reply = pipe.recv()
        if reply[0] == "error":
            raise RuntimeError(f"client worker: {reply[1]}")
        return reply

    def open(self, port: int, request: bytes, count: int, kind: str) -> None:
        """Open ``count`` more streams (spread evenly), each sending ``request``."""
        share = [count // len(self.pipes) + (i < count % len(self.pipes)) for i in range(len(self.pipes))]
        for pipe, n in zip(self.pipes, share):
            pipe.send(("open", port, request, n, kind))
        for pipe in self.pipes:
            self._answer(pipe, 300)
        self.count += count

    def wait(self, marker: bytes, timeout: float = 20.0) -> int:
        """Block until every stream has received ``marker``: the streams still missing it."""
        return sum(r[1] for r in self._all(("wait", marker, timeout), timeout + 10))

    def collect(self) -> tuple[list[list[tuple[int, float]]], float]:
        """Per stream [(seq, commit -> receipt ms)]; the workers' CPU seconds in all."""
        replies = self._all(("collect",), 300)
        return [s for r in replies for s in r[1]], sum(r[2] for r in replies)

    def close(self) -> None:
        try:
            self._all(("close",), 30)
        finally:
            for p in self.procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
