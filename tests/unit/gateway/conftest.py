"""A gateway listener on a real unix socket, served by an event loop in a
thread, and the real openai / anthropic SDKs pointed at it through httpx's
unix-socket transport (what an in-sandbox forwarder hands them)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from pathlib import Path

import anthropic
import httpx
import httpx2  # what anthropic's SDK is built on (it refuses httpx objects)
import openai
import pytest

from sessions import journal
from sessions.gateway import budget
from sessions.gateway.demo import DemoUpstream
from sessions.gateway.journaled import CallJournal
from sessions.gateway.server import GatewayServer, Route
from tests.unit.bridge.fake_models import FakeModelServer


class Loop:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(autouse=True)
def _fresh_budgets():
    """A workspace's spending read by an earlier test (ids repeat) is not reused."""
    budget.forget()
    yield
    budget.forget()


@pytest.fixture
def loop():
    one = Loop()
    yield one
    one.stop()


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))  # AF_UNIX paths < 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def serve(loop, short_dir):
    """serve(upstream=DemoUpstream(), agent_id="a-1") -> the socket path."""
    servers = []

    def start(upstream=None, agent_id="a-1", max_body=1 << 20):
        path = short_dir / f"{agent_id}.sock"
        server = GatewayServer(Route(agent_id, upstream or DemoUpstream()), path, max_body=max_body)
        loop.run(server.start())
        servers.append(server)
        return path

    yield start
    for server in servers:
        loop.run(server.close())


def openai_client(sock: Path) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://gateway/v1", api_key="placeholder", max_retries=0,
                         http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))))


def anthropic_client(sock: Path) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url="http://gateway", api_key="placeholder", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.HTTPTransport(
                                   uds=str(sock))))


@pytest.fixture
def fake():
    """A fake OpenAI-compatible / Anthropic upstream on 127.0.0.1 that records requests."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def listen(request, loop, short_dir, agent):
    """listen(upstream) -> the socket of a listener whose calls are journaled in
    the `agent` fixture's transcript, at the test module's PRICES."""
    servers = []

    def start(upstream):
        route = Route(agent.id, upstream, CallJournal(agent.id), getattr(request.module, "PRICES", {}))
        server = GatewayServer(route, short_dir / "gw.sock", max_body=1 << 20)
        loop.run(server.start())
        servers.append(server)
        return server.socket_path

    yield start
    for server in servers:
        loop.run(server.close())


def facts(agent, etype):
    return [e for e in journal.page_after(agent.id, 0, 1000).events if e.type == etype]


def turn(agent, n):
    journal.append(agent.id, "turn.started", {"turn": n, "command_id": str(n)})
