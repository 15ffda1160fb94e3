"""What the sandbox runtime takes from the deployment's settings: the one
module of `sandboxes` that reads ``django.conf.settings`` (every value is
read from the environment once, in alineo_site/settings.py).

The data dir's layout is spelled out here and nowhere else::

    <DATA_DIR>/run/<agent>/          the run dir: bridge.sock, config.json, the bridge's copy
    <DATA_DIR>/inputs/<agent>/       wait-for inputs, written again into every fresh sandbox
    <DATA_DIR>/checkpoints/<agent>/  turn checkpoints (<sandbox>-turn-<n>.tar.zst)
    <DATA_DIR>/sandboxes/            the local backend's sandboxes and snapshots
    <DATA_DIR>/sandbox-sessions/     journals of sandbox sessions (sandboxes/snapshots.py)
    <DATA_DIR>/locks/                file locks of setup snapshot builds
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DataDir:
    """The data dir's layout (see the module doc)."""

    root: Path

    def run(self, agent_id: str) -> Path:
        return self.root / "run" / agent_id

    def inputs(self, agent_id: str) -> Path:
        return self.root / "inputs" / agent_id

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def sandboxes(self) -> Path:
        return self.root / "sandboxes"

    @property
    def sandbox_sessions(self) -> Path:
        return self.root / "sandbox-sessions"

    @property
    def locks(self) -> Path:
        return self.root / "locks"


def _settings():
    from django.conf import settings

    return settings


def data_dir() -> DataDir:
    return DataDir(Path(_settings().DATA_DIR))


def backend_setting() -> str:
    """ALINEO_SANDBOX: auto, docker or local (checked by the settings)."""
    return _settings().ALINEO_SANDBOX


def extra_labels() -> dict[str, str]:
    """ALINEO_SANDBOX_LABELS: labels added to every sandbox (tests use them to clean up)."""
    return dict(_settings().ALINEO_SANDBOX_LABELS)


def debian_mirror_overrides() -> tuple[str, str]:
    """ALINEO_DEBIAN_MIRROR and ALINEO_DEBIAN_SECURITY_MIRROR ("" when unset)."""
    s = _settings()
    return s.ALINEO_DEBIAN_MIRROR, s.ALINEO_DEBIAN_SECURITY_MIRROR


def docker_host() -> str:
    """DOCKER_HOST ("" for the engine's default socket)."""
    return _settings().DOCKER_HOST


def docker_host_tar() -> bool:
    """ALINEO_DOCKER_HOST_TAR: may a root control plane tar a container's home
    from the host side (sandboxes/backends/docker.py explains the fast path)."""
    return _settings().ALINEO_DOCKER_HOST_TAR
