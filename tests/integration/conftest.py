"""Live-server fixtures: a real server process over its own fresh data dir.
Named `alineo_server` because pytest-django owns `live_server`.

A module can set `LIVE_SERVER_ENV = {...}` to give its server settings (e.g. a
short ALINEO_SSE_HEARTBEAT_S); `alineo_server_factory` makes more servers with
their own env when one module needs several.
"""

from __future__ import annotations

import pytest

from tests.live import LiveServer


@pytest.fixture(scope="module")
def alineo_server(request):
    env = getattr(request.module, "LIVE_SERVER_ENV", {})
    with LiveServer(env=env) as server:
        yield server


@pytest.fixture
def alineo_server_factory():
    servers: list[LiveServer] = []

    def make(env: dict[str, str] | None = None) -> LiveServer:
        server = LiveServer(env=env)
        servers.append(server)
        server.start()
        return server

    yield make
    for server in servers:
        server.__exit__(None, None, None)
