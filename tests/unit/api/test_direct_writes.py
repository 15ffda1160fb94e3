"""sessions/api/direct.py: a stream's chunks go straight onto daphne's socket
while Twisted holds nothing unsent for it, and after Twisted's bytes otherwise.
Units over a real socket pair; the live path under daphne is what
tests/integration/test_stream.py streams through."""

from __future__ import annotations

import asyncio
import functools
import socket

import pytest
from daphne.http_protocol import WebRequest
from daphne.server import Server

from sessions.api import direct


class Transport:
    """Twisted's FileDescriptor buffers, as DirectWriter reads them."""

    def __init__(self, sock):
        self.socket = sock
        self.dataBuffer, self.offset, self._tempDataLen = b"", 0, 0
        self.connected, self.disconnecting = 1, 0
        self.written: list[bytes] = []
        self.aborted = False

    def abortConnection(self) -> None:  # noqa: N802 (Twisted's name)
        self.aborted = True
        self.connected, self.dataBuffer, self._tempDataLen = 0, b"", 0

    def write(self, data: bytes) -> None:
        self.written.append(data)
        self._tempDataLen += len(data)


class Request:
    finished = _disconnected = 0
    startedWriting = chunked = 1
    sentLength = 0


class ShortSocket:
    """Takes only the first 3 bytes of a send."""

    def __init__(self):
        self.got = b""

    def send(self, data: bytes) -> int:
        self.got += data[:3]
        return 3


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_a_chunk_goes_straight_onto_the_socket_when_twisted_holds_nothing(pair):
    a, b = pair
    tr = Transport(a)
    assert direct.DirectWriter(Request(), tr).write(b"id: 1\n\n")
    assert b.recv(100) == b"7\r\nid: 1\n\n\r\n"  # HTTP/1.1 chunked, as Twisted frames it
    assert tr.written == []


def test_a_chunk_waits_behind_what_twisted_holds(pair):
    a, b = pair
    tr = Transport(a)
    tr._tempDataLen = 5  # unsent bytes of an earlier write
    assert direct.DirectWriter(Request(), tr).write(b"later")
    assert tr.written == [b"5\r\nlater\r\n"]
    b.setblocking(False)
    with pytest.raises(BlockingIOError):
        b.recv(100)  # nothing overtook Twisted's bytes


def test_what_the_socket_does_not_take_goes_to_twisted():
    sock = ShortSocket()
    tr = Transport(sock)
    writer = direct.DirectWriter(Request(), tr)
    assert writer.write(b"abcdef")
    assert sock.got + b"".join(tr.written) == b"6\r\nabcdef\r\n"
    assert writer.write(b"xy")  # Twisted holds bytes now: after them, not on the socket
    assert sock.got == b"6\r\n" and tr.written[-1] == b"2\r\nxy\r\n"


def test_a_client_that_stops_reading_is_cut_off_past_the_bound():
    sock = ShortSocket()
    tr = Transport(sock)
    writer = direct.DirectWriter(Request(), tr, max_unsent=64)
    assert writer.write(b"a" * 40)  # the socket takes 3 bytes, Twisted holds the rest
    held = writer.unsent()
    assert 0 < held <= 64 and not tr.aborted
    assert writer.write(b"b" * 40)  # would hold more than 64 bytes: cut off instead
    assert tr.aborted and writer.unsent() == 0
    assert not writer.write(b"c")  # gone: left to ASGI, which sees the disconnect


def test_a_client_that_reads_is_never_cut_off(pair):
    a, b = pair
    writer = direct.DirectWriter(Request(), Transport(a), max_unsent=64)
    for i in range(200):
        assert writer.write(b"x" * 50)
        assert b.recv(100) == b"32\r\n" + b"x" * 50 + b"\r\n"
    assert not writer.transport.aborted


@pytest.mark.parametrize("attr", ["finished", "_disconnected"])
def test_a_finished_or_gone_response_is_left_to_asgi(pair, attr):
    req = Request()
    setattr(req, attr, 1)
    assert not direct.DirectWriter(req, Transport(pair[0])).write(b"x")


def test_only_daphnes_send_puts_its_request_in_the_scope():
    seen = {}

    async def app(scope, receive, send):
        seen["request"] = scope.get(direct.SCOPE_KEY)

    request = WebRequest.__new__(WebRequest)
    # What daphne passes: partial(server.handle_reply, <its WebRequest>).
    daphne_send = functools.partial(object.__new__(Server).handle_reply, request)
    middleware = direct.DirectWrites(app)

    async def other_send(message):
        pass

    asyncio.run(middleware({"type": "http"}, None, daphne_send))
    assert seen["request"] is request
    for send in (other_send, functools.partial(object.__new__(Server).handle_reply, object()),
                 functools.partial(lambda request, message: None, request)):
        asyncio.run(middleware({"type": "http"}, None, send))
        assert seen["request"] is None
    assert direct.writer({}) is None  # no request: the ASGI path
