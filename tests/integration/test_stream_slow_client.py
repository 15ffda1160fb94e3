"""A client that stops reading costs the server a bounded buffer: its backlog
is read only as fast as it takes it (sessions/api/stream.py), and a joined
stream whose client falls too far behind is cut off, to reconnect from its
last id with no gap (sessions/api/direct.py). Against a real daphne server,
with a raw socket that does not read. The kernel's send buffer on loopback
grows to 4 MB (net.ipv4.tcp_wmem) before anything waits in the server, hence
tens of MB of facts."""

from __future__ import annotations

import select
import socket
import time
from urllib.parse import urlsplit

import pytest

from tests.live import SSEStream

pytestmark = pytest.mark.live

BUFFER_KB = 16  # the stream's buffer; a joined client is cut off past 4 of them
LIVE_SERVER_ENV = {"ALINEO_SSE_STREAM_BUFFER_KB": str(BUFFER_KB)}
BIG = "x" * 4000  # one fact's text


@pytest.fixture(scope="module")
def olivia(alineo_server):
    return alineo_server.create_actor("olivia", "acme")


def open_unread(server, actor, agent_id: str) -> socket.socket:
    """A stream request on a socket with a tiny receive window, never read."""
    url = urlsplit(server.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((url.hostname, url.port))
    head = "".join(f"{k}: {v}\r\n" for k, v in actor.auth.items())
    sock.sendall(f"GET /api/agents/{agent_id}/stream HTTP/1.1\r\nHost: {url.netloc}\r\n"
                 f"Accept: text/event-stream\r\n{head}\r\n".encode())
    return sock


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, bool]:
    """Everything the server sent, and whether it closed the connection."""
    sock.settimeout(1.0)
    got, deadline = [], time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return b"".join(got), True
        if not chunk:
            return b"".join(got), True
        got.append(chunk)
    return b"".join(got), False


def wait_until_cut_off(sock: socket.socket, limit_s: float) -> bool:
    """Whether the server reset or closed the connection within ``limit_s``,
    while this client reads nothing (poll without POLLIN: data waiting does
    not wake it, a reset or the server's FIN does)."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP | select.POLLERR | select.POLLHUP)
    deadline = time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        if poller.poll(int(left * 1000) + 1):
            return True
    return False


def ids_in(raw: bytes) -> list[int]:
    return [int(line[4:]) for line in raw.split(b"\n") if line.startswith(b"id: ")]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_a_backlog_is_read_only_as_fast_as_the_client_takes_it(alineo_server, olivia):
    agent = alineo_server.create_agent(olivia)
    alineo_server.django(  # 30 MB: written here, too long for a command line
        "from sessions import journal\n"
        "for i in range(15):\n"
        f"    journal.append_many({agent!r}, [('message.user', {{'text': 'x' * {len(BIG)}}})] * 500)\n")
    before = rss_mb(alineo_server.pid)
    sock = open_unread(alineo_server, olivia, agent)
    try:
        grown, until = 0.0, time.monotonic() + 10
        while time.monotonic() < until and grown < 20:  # the most it grows while nobody reads
            grown = max(grown, rss_mb(alineo_server.pid) - before)
            time.sleep(0.1)
        # Read all at once, the server would hold the 26 MB the kernel does not (35 MB
        # grown when it did; 9 MB with the backlog read as the client takes it).
        assert grown < 20, f"the server grew {grown:.0f} MB for a client that does not read"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # a reader at last
        sock.settimeout(30.0)
        raw = b""
        while b"id: 7500\n" not in raw:  # now it reads: all of it, in order
            more = sock.recv(1 << 20)
            assert more, "the stream ended before its backlog did"
            raw += more
    finally:
        sock.close()
    assert ids_in(raw) == list(range(1, 7501))


def test_a_joined_client_too_far_behind_is_cut_off_and_resumes_with_no_gap(alineo_server, olivia):
    agent = alineo_server.create_agent(olivia, [("message.user", {"text": "first"})])
    sock = open_unread(alineo_server, olivia, agent)
    try:
        sock.settimeout(10.0)
        head = b""
        while b"id: 1\n" not in head:  # caught up: a member of the agent's tail now
            more = sock.recv(4096)
            assert more, f"the stream ended before its first fact: {head!r}"
            head += more
        # 300 commits of 10 facts of 4 KB from another process, while this client reads nothing.
        alineo_server.django(
            "from sessions import journal\n"
            "for i in range(300):\n"
            f"    journal.append_many({agent!r}, [('message.user', {{'text': 'x' * {len(BIG)}}})] * 10)\n")
        # Still reading nothing, however late the server gets to it (a loaded
        # machine: its join or its tail's reads after the burst), until it cuts
        # the client off; then what reached the socket before the cut.
        cut = wait_until_cut_off(sock, 60)
        raw, _ = read_until_closed(sock, 10)
    finally:
        sock.close()
    assert cut, "a client 12 MB behind must be cut off, not buffered for"
    got = [1, *ids_in(raw)]
    assert got == list(range(1, len(got) + 1)) and len(got) < 3001
    # Its EventSource reconnects from the last id it got: the rest, no gap, no repeat.
    headers = {**olivia.auth, "Last-Event-ID": str(got[-1])}
    with SSEStream(f"{alineo_server.url}/api/agents/{agent}/stream", headers, 30) as again:
        rest = [int(e.id) for e in again.events(3001 - got[-1])]
    assert got + rest == list(range(1, 3002))
