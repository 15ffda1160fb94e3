"""Writing an open stream's bytes straight to daphne's socket.

Measured (py-spy on the server, 1,000 streams on one agent): about two thirds
of the serving loop's time per commit went into the ASGI send path, per
stream: channels' session wrapper, daphne's ``handle_reply``, Twisted's
``Request.write``, Twisted registering the socket for writing (``add_writer``,
an ``epoll_ctl``) and, on the loop's next turn, ``doWrite`` and
``removeWriter`` (another ``epoll_ctl``). The ``send()`` itself was the rest.

:class:`DirectWriter` frames the chunk as Twisted would (HTTP/1.1 chunked) and
``send()``s it itself while Twisted holds nothing unsent for that connection
(a client that reads keeps it so); only what the socket did not take goes to
Twisted's buffer, so bytes never overtake each other. :func:`writer` gives
None for anything but daphne's plain-TCP chunked response (another server, a
test's communicator, TLS): those streams keep the ASGI path.

:class:`DirectWrites`, the outermost HTTP middleware (alineo_site/asgi.py),
puts daphne's request object in the scope; nothing else reads it.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

SCOPE_KEY = "alineo.daphne_request"


class DirectWrites:
    """ASGI middleware: remember daphne's request for the stream consumers."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        request = _daphne_request(send)
        if request is not None:
            scope = dict(scope, **{SCOPE_KEY: request})
        return await self.app(scope, receive, send)


def _daphne_request(send):
    # daphne's send is functools.partial(Server.handle_reply, <its WebRequest>).
    if not isinstance(send, functools.partial) or len(send.args) != 1:
        return None
    if getattr(send.func, "__name__", "") != "handle_reply":
        return None
    request = send.args[0]
    if type(request).__module__ != "daphne.http_protocol":
        return None
    return request


class DirectWriter:
    """Body chunks of one response, onto its socket."""

    __slots__ = ("request", "transport", "max_unsent")

    def __init__(self, request, transport, max_unsent: int | None = None):
        self.request, self.transport = request, transport
        # Twisted buffers without a bound: a client that stops reading would
        # make this process hold every later commit for it. Past this many
        # unsent bytes it is cut off; its EventSource reconnects from the last
        # id it got and reads its backlog on its own (sessions/api/stream.py).
        self.max_unsent = max_unsent

    def unsent(self) -> int:
        """Bytes Twisted holds for this connection that the client has not taken."""
        tr = self.transport
        return len(tr.dataBuffer) - tr.offset + tr._tempDataLen

    def write(self, data: bytes, framed: bytes | None = None) -> bool:
        """True: the chunk is sent, or queued in Twisted after what it holds,
        or the client, too far behind, was cut off (the stream then ends on
        daphne's ``http.disconnect``). False: write it through ASGI (the
        response is no longer a plain chunked one in flight: finished,
        disconnected, not chunked)."""
        req, tr = self.request, self.transport
        if req.finished or req._disconnected or not req.startedWriting or not req.chunked:
            return False
        if not tr.connected or tr.disconnecting:
            return False
        frame = framed if framed is not None else chunk(data)
        held = self.unsent()
        if held and self.max_unsent is not None and held + len(frame) > self.max_unsent:
            log.info("stream: client %d bytes behind, cut off (it reconnects from its last id)", held)
            tr.abortConnection()  # drops what Twisted held for it
            return True
        req.sentLength += len(data)
        if held:
            tr.write(frame)  # Twisted holds unsent bytes: after them
            return True
        try:
            n = tr.socket.send(frame)
        except BlockingIOError:
            n = 0
        except OSError:  # broken: let Twisted see it the way it always does
            n = 0
        if n < len(frame):
            tr.write(frame[n:])
        return True


def chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk, as Twisted frames it (``toChunk``)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def writer(scope, max_unsent: int | None = None) -> DirectWriter | None:
    """A DirectWriter for this stream's response, or None (the ASGI path)."""
    request = scope.get(SCOPE_KEY)
    if request is None:
        return None
    try:
        transport = request.channel.transport
        if type(transport).__module__ != "twisted.internet.tcp" or getattr(transport, "TLS", False):
            return None
        transport.dataBuffer, transport.offset, transport._tempDataLen, transport.socket  # noqa: B018
    except AttributeError:
        log.info("stream: daphne's transport is not the expected one; writing through ASGI")
        return None
    return DirectWriter(request, transport, max_unsent)
