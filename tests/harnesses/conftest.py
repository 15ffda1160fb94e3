"""Fixtures for the Pi harness tests: the real Pi from the npm registry,
installed once by sandboxes/harnesses.py into ALINEO_HARNESS_CACHE (shared by
every run of this user: only the first run downloads), a gateway with the
demo upstream on a unix socket, and a real bridge whose config names Pi."""

from __future__ import annotations

import asyncio
import os
import signal
import shutil
import tempfile
from pathlib import Path

import pytest

from sandboxes.harnesses import ensure_pi
from sessions.gateway.demo import DemoUpstream
from sessions.gateway.server import GatewayServer, Route
from tests.unit.bridge.harness import Bridge
from tests.unit.gateway.conftest import loop  # noqa: F401 - a fixture


@pytest.fixture(scope="session")
def pi_install():
    return ensure_pi()


def pi_pids(home: str, node_only: bool = True) -> list[int]:
    """Processes of this home's Pi: Pi's config dir is in their environment
    (Pi renames its process title, so its command line does not say). With
    ``node_only=False`` also Pi's tool processes, which inherit it; without,
    only the Pi processes (not a child it forked that is still "node")."""
    marker = f"PI_CODING_AGENT_DIR={home}/.alineo/pi/agent".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env and (exe.endswith("/node") or not node_only):
            pids.append(int(entry.name))
    if node_only:  # a tool process Pi has forked but not yet exec'd is "node" too
        pids = [pid for pid in pids if _parent(pid) not in pids]
    return pids


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state


@pytest.fixture
def pi_dirs():
    root = Path(tempfile.mkdtemp(prefix="pit-", dir="/tmp"))  # AF_UNIX paths < 108 bytes
    (root / "run").mkdir()
    (root / "home").mkdir()
    yield root
    # Pi's tool processes outlive a killed Pi (their own process groups): end
    # this test's, found by the environment they inherited, by pid.
    for pid in pi_pids(str(root / "home"), node_only=False):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(root, ignore_errors=True)


class RecordingUpstream(DemoUpstream):
    """The demo model, remembering every request it got (the gateway's view).
    A prompt that says SLOW_MODEL makes its first call take a minute (a crash
    during the first model call of a session)."""

    def __init__(self):
        self.requests: list = []

    async def complete(self, request):
        self.requests.append(request)
        users = [m.text for m in request.messages if m.role == "user"]
        if users and SLOW_MODEL in users[-1] and not any(m.role == "tool" for m in request.messages):
            await asyncio.sleep(60)
        return await super().complete(request)

    def texts(self, index: int = -1) -> list[str]:
        """The texts of the messages the index-th request carried."""
        return [m.text for m in self.requests[index].messages]


SLOW_MODEL = "slow-model"


@pytest.fixture
def gateway(loop, pi_dirs):
    upstream = RecordingUpstream()
    server = GatewayServer(Route("a-pi", upstream), os.path.join(pi_dirs, "run", "gateway.sock"),
                           max_body=1 << 24)
    loop.run(server.start())
    server.upstream = upstream
    yield server
    loop.run(server.close())


@pytest.fixture
def pi_bridge(pi_install, pi_dirs, gateway):
    """make(**config) → a started bridge that runs Pi (stopped at teardown)."""
    made: list[Bridge] = []

    def make(start: bool = True, **config) -> Bridge:
        bridge = Bridge(str(pi_dirs / "run"), str(pi_dirs / "home"))
        bridge.write_config(model="demo", gateway={"port": 0},
                            harness=pi_install.bridge_config(str(pi_install.host_dir)), **config)
        made.append(bridge)
        return bridge.start() if start else bridge

    yield make
    for bridge in made:
        bridge.stop()
