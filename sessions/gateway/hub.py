"""The worker's side: one listener per driven agent, on ``gateway.sock`` in
its run dir (beside ``bridge.sock``), opened while its driver serves it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from django.conf import settings

from sandboxes.launch import GATEWAY_SOCKET, Secret, through_gateway

from sessions import leases

from .demo import DemoUpstream
from .journaled import CallJournal
from .server import GatewayServer, Route, Upstream
from .upstreams import ANTHROPIC_BASE, OPENAI_BASE, AnthropicUpstream, OpenAIUpstream, Target


def upstream_for(model: str, values: dict[str, str]) -> Upstream:
    """The spec's model, with the bound values (env name → value) the gateway
    injects: the key, and the base URL of an OpenAI-compatible server."""
    kind, _, name = (model or "demo").partition(":")
    if kind == "openai" and name:
        return OpenAIUpstream(Target(name, values.get("OPENAI_BASE_URL") or OPENAI_BASE,
                                     values.get("OPENAI_API_KEY", "")))
    if kind == "anthropic" and name:
        return AnthropicUpstream(Target(name, values.get("ANTHROPIC_BASE_URL") or ANTHROPIC_BASE,
                                        values.get("ANTHROPIC_API_KEY", "")))
    return DemoUpstream()


async def open_listener(agent_id: str, model: str, run_dir: Path,
                        secrets: tuple[Secret, ...] = (),
                        lease: leases.Held | None = None) -> GatewayServer | None:
    """The agent's listener, started, its calls journaled under the driver's
    lease (its bound values redacted); None when its model is not served here."""
    if not through_gateway(model) or not run_dir.is_dir():
        return None
    values = {s.env: s.value for s in secrets}
    route = Route(agent_id, upstream_for(model, values), CallJournal(agent_id, lease, secrets),
                  settings.ALINEO_MODEL_PRICES)
    server = GatewayServer(route, run_dir / GATEWAY_SOCKET,
                           max_body=settings.ALINEO_GATEWAY_MAX_BODY_MB << 20,
                           mode=socket_mode(run_dir))
    await server.start()
    _own(server.socket_path, run_dir)
    return server


def socket_mode(run_dir: Path) -> int:
    """Who must connect is the sandbox. A run dir others may write (1733: a
    non-root control plane with a container whose root has no capabilities,
    sandboxes/backends/docker.py) needs a 0666 socket; the 0700 data dir
    around it keeps other users out. Otherwise 0600, owned like the run dir."""
    return 0o666 if os.stat(run_dir).st_mode & stat.S_IWOTH else 0o600


def _own(sock: Path, run_dir: Path) -> None:
    """A run dir made over to the sandbox's uid (the local backend under a
    root control plane) gets a socket of that uid too."""
    st = os.stat(run_dir)
    if os.geteuid() == 0 and st.st_uid != 0:
        os.chown(sock, st.st_uid, st.st_gid)
