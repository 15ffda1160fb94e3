"""Live-server fixtures: a real server process over its own fresh data dir.
Named `alineo_server` because pytest-django owns `live_server`.

A module can set `LIVE_SERVER_ENV = {...}` to give its server settings (e.g. a
short ALINEO_SSE_HEARTBEAT_S); `alineo_server_factory` makes more servers with
their own env when one module needs several.
"""

from __future__ import annotations

import pytest

from tests import live
from tests.integration.worlds import World, cleanup_sandboxes, remove_tree_volumes_under, start_server
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


@pytest.fixture(scope="session", autouse=True)
def remove_sandboxes_made_by_live_servers(tmp_path_factory):
    """Live servers drive agents for real (sessions.worker.supervisor): a test that
    spawns an agent with a prompt gets a sandbox — a container, or a local
    process group that outlives its server. At the end of the session remove
    every sandbox whose run dir lies under this run's data dirs."""
    yield
    import os

    roots = [str(tmp_path_factory.getbasetemp())]
    if os.environ.get("ALINEO_DATA_DIR"):
        roots.append(os.path.realpath(os.environ["ALINEO_DATA_DIR"]))
    roots += [os.path.realpath(d) for d in live.DATA_DIRS]
    _remove_containers_under(roots)
    _remove_local_sandboxes_under(roots)
    _kill_local_bridges_under(roots)


def _remove_local_sandboxes_under(roots: list[str]) -> None:
    """bubblewrap sandboxes see their run dir as /run/alineo, so their
    environment names no host path: remove them by their data dirs instead."""
    from pathlib import Path

    from sandboxes.backends.local import LocalBackend

    for root in roots:
        for pattern in ("*/sandboxes", "*/*/sandboxes", "*/*/*/sandboxes"):
            for found in Path(root).glob(pattern):
                backend = LocalBackend(root=found)
                for handle in backend.list():
                    backend.remove(handle.id)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _remove_containers_under(roots: list[str]) -> None:
    from sandboxes.backends import docker_engine_answers

    if not docker_engine_answers():
        return
    import docker

    client = docker.from_env()
    try:
        for c in client.api.containers(all=True, filters={"label": "alineo.managed=1"}):
            if any(_under(m.get("Source", ""), roots) for m in c.get("Mounts") or []):
                client.api.remove_container(c["Id"], force=True, v=True)
        remove_tree_volumes_under(client, roots)
    finally:
        client.close()


def _kill_local_bridges_under(roots: list[str]) -> None:
    import os
    import signal
    from pathlib import Path

    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(item.split(b"=", 1) for item in (proc / "environ").read_bytes().split(b"\0")
                       if b"=" in item)
            run_dir = env.get(b"ALINEO_RUN_DIR", b"").decode(errors="replace")
            if run_dir and env.get(b"ALINEO_SANDBOX_ID") and _under(run_dir, roots):
                os.killpg(os.getpgid(int(proc.name)), signal.SIGKILL)
        except (OSError, ValueError):
            continue


@pytest.fixture(scope="module", params=["local", "docker"])
def world(request):
    kind = request.param
    server = start_server(kind)
    server.start()
    try:
        actor = server.create_actor("olivia")
        yield World(server, actor, kind)
    finally:
        server.stop()
        cleanup_sandboxes(server, kind)
        server.__exit__(None, None, None)
