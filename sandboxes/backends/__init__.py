"""Sandbox backends — docker (containers), local (bubblewrap sandboxes),
unisolated (plain process groups, for development) — and the registry that
picks one: :func:`get_backend` for this process's own, :func:`backend_for`
for the engine that holds a recorded sandbox. The contract every backend
implements is sandboxes/backends/base.py.

``auto`` is docker when an engine answers, else local when bubblewrap works,
else none (sandboxes/backends/unavailable.py: nothing can be spawned, and the
server says why). ``unisolated`` is only ever chosen by name."""

from __future__ import annotations

import functools
import socket

from sandboxes import config
from sandboxes.backends.base import (
    ExecResult,
    Limits,
    SandboxBackend,
    SandboxHandle,
    SandboxStatus,
)
from sandboxes.backends.docker import DockerBackend
from sandboxes.backends.local import LocalBackend, bwrap_problem
from sandboxes.backends.unavailable import UnavailableBackend
from sandboxes.backends.unisolated import UnisolatedBackend
from sandboxes.errors import BackendUnavailable, SandboxError

__all__ = [
    "ExecResult", "Limits", "SandboxBackend", "SandboxHandle", "SandboxStatus",
    "backend_for", "bridge_reachable", "docker_engine_answers", "get_backend", "reset",
    "no_backend_reason", "resolve_backend_name",
]

BACKENDS = ("docker", "local", "unisolated")
#: What ``auto`` becomes when neither docker nor bubblewrap can run sandboxes.
NONE = "none"


def docker_engine_answers(timeout: float = 3.0) -> bool:
    """True when a Docker engine (DOCKER_HOST or the default socket) answers a ping."""
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure means "no engine"
        return False


@functools.lru_cache(maxsize=None)
def _backend(name: str) -> SandboxBackend:
    if name == "docker":
        return DockerBackend()
    if name == "local":
        return LocalBackend()
    if name == "unisolated":
        return UnisolatedBackend()
    if name == NONE:
        return UnavailableBackend(no_backend_reason())
    raise SandboxError(f"unknown sandbox backend {name!r} (auto, docker, local or unisolated)",
                       permanent=True)


def no_backend_reason() -> str:
    return ("no sandbox backend: no Docker engine answers and " + (bwrap_problem() or "?")
            + ". Start Docker (.ci/docker-up as root), install bubblewrap (.ci/bwrap-up as "
            "root), or set ALINEO_SANDBOX=unisolated for development (no isolation)")


@functools.lru_cache(maxsize=1)
def _auto_backend_name() -> str:
    """Decided once per process: an engine that appears later needs a restart."""
    if docker_engine_answers():
        return "docker"
    return "local" if bwrap_problem() is None else NONE


def resolve_backend_name(setting: str | None = None) -> str:
    """``auto`` becomes ``docker`` when an engine answers, else ``local`` when
    bubblewrap works, else ``none``."""
    setting = (config.backend_setting() if setting is None else setting) or "auto"
    setting = setting.strip().lower()
    if setting == "auto":
        return _auto_backend_name()
    if setting == NONE:  # what auto resolved to, passed back in
        return NONE
    if setting not in BACKENDS:
        raise SandboxError(
            f"ALINEO_SANDBOX must be auto, docker, local or unisolated, not {setting!r}",
            permanent=True)
    return setting


def get_backend(name: str | None = None) -> SandboxBackend:
    """The backend named by ``name`` or settings.ALINEO_SANDBOX (one instance
    per process and name). Forcing ``docker`` without an engine gives a backend
    whose calls raise BackendUnavailable."""
    return _backend(resolve_backend_name(name))


def backend_for(host: str | None) -> SandboxBackend:
    """The backend that reaches the engine ``host`` (an Agent.sandbox_host):
    this worker's own backend when it is that engine (or nothing was recorded),
    else a Docker client for the recorded DOCKER_HOST. Raises
    BackendUnavailable for a local sandbox of another machine."""
    own = get_backend()
    if not host or host == own.host:
        return own
    if host.startswith("local:"):
        if host == f"local:{socket.gethostname()}":
            # This machine's directory of sandboxes (local and unisolated share
            # it); this worker runs Docker: bubblewrap takes it.
            return get_backend("local")
        raise BackendUnavailable(f"sandbox host {host} is another machine's local backend")
    return _docker_at(host)


def bridge_reachable(host: str | None) -> bool:
    """Whether this worker can talk to a bridge on engine ``host``: the bridge
    listens on a unix socket in a run dir bind-mounted from the engine's
    machine, so only engines on this machine (unix sockets, this host's
    local backend) qualify. On a tcp:// or ssh:// engine the sandbox can be
    inspected and removed, not driven."""
    if not host:
        return True
    if host.startswith("local:"):
        return host == f"local:{socket.gethostname()}"
    return host.startswith(("unix://", "npipe://"))


@functools.lru_cache(maxsize=None)
def _docker_at(base_url: str) -> SandboxBackend:
    return DockerBackend(base_url=base_url)


def reset() -> None:
    """Forget the backends made so far (tests that change ALINEO_SANDBOX or the engine)."""
    _docker_at.cache_clear()
    _backend.cache_clear()
    _auto_backend_name.cache_clear()
    bwrap_problem.cache_clear()
