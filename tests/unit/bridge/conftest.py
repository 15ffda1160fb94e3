"""Fixtures for the bridge tests. Nothing here needs Django or the database:
the bridge is a standard-library program that runs inside sandboxes."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from .harness import Bridge, kill_tool_processes


@pytest.fixture
def dirs():
    """Short run/home paths (AF_UNIX paths must stay under 108 bytes)."""
    root = tempfile.mkdtemp(prefix="brt-", dir="/tmp")
    run, home = os.path.join(root, "run"), os.path.join(root, "home")
    os.makedirs(run)
    os.makedirs(home)
    yield run, home
    kill_tool_processes(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_bridge(dirs):
    """Factory: make_bridge(config=..., env=...) → a started Bridge, stopped at teardown."""
    started: list[Bridge] = []

    def make(config: dict | None = None, env: dict | None = None, start: bool = True,
             extra: tuple = ()) -> Bridge:
        bridge = Bridge(*dirs, env=env)
        bridge.write_config(**(config or {"model": "demo"}))
        started.append(bridge)
        return bridge.start(*extra) if start else bridge

    yield make
    for bridge in started:
        bridge.stop()




@pytest.fixture
def model_server():
    from .fake_models import FakeModelServer

    with FakeModelServer() as server:
        yield server
