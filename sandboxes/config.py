"""What the sandbox runtime takes from the deployment's settings: the one
module of `sandboxes` that reads ``django.conf.settings`` (every value is
read from the environment once, in alineo_site/settings.py).

The data dir's layout is spelled out here and nowhere else::

    <DATA_DIR>/run/<agent>/          the run dir: bridge.sock, config.json, the bridge's copy
    <DATA_DIR>/inputs/<agent>/       wait-for inputs, written again into every fresh sandbox
    <DATA_DIR>/checkpoints/<agent>/  turn checkpoints (<sandbox>-turn-<n>.tar.zst)
    <DATA_DIR>/live-homes/<agent>/   looks at a running sandbox's home (never checkpoints)
    <DATA_DIR>/sandboxes/            the local backend's sandboxes and snapshots
    <DATA_DIR>/homes/<agent>/        docker: a restored or forked agent's home, bind-mounted
                                     at /root (sandboxes/backends/hosthome.py)
    <DATA_DIR>/trees/<key>/          prepared trees: checkpoints kept extracted, read-only,
                                     that restored homes are laid over (sandboxes/backends/trees.py)
    <DATA_DIR>/layers/<volume>/      docker: the upper layer of a home laid over a tree
                                     (sandboxes/backends/docker_trees.py)
    <DATA_DIR>/sandbox-sessions/     journals of sandbox sessions (sandboxes/snapshots.py)
    <DATA_DIR>/locks/                file locks of setup snapshot builds
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

#: Only the control plane's user reaches the data dir: it holds the database
#: (credential values), the secret key, checkpoints and the bridges' sockets.
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
#: What the control plane tightens at start (the sandboxes' own homes are theirs).
_PRIVATE_TREES = ("checkpoints", "live-homes", "inputs", "locks", "sandbox-sessions")


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
    def live_homes(self) -> Path:
        return self.root / "live-homes"

    @property
    def sandboxes(self) -> Path:
        return self.root / "sandboxes"

    @property
    def homes(self) -> Path:
        return self.root / "homes"

    @property
    def trees(self) -> Path:
        return self.root / "trees"

    @property
    def layers(self) -> Path:
        return self.root / "layers"

    @property
    def sandbox_sessions(self) -> Path:
        return self.root / "sandbox-sessions"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    def tighten(self) -> list[str]:
        """Make the data dir private (0700, its files 0600), also when an older
        release made it world-readable; returns what was changed. Files made
        afterwards by this process are private too (umask 077)."""
        os.umask(0o077)
        changed = []
        for path in self._private_paths():
            try:
                mode = stat.S_IMODE(path.lstat().st_mode)
            except FileNotFoundError:
                continue
            want = (PRIVATE_DIR if path.is_dir() and not path.is_symlink() else PRIVATE_FILE)
            if path.is_symlink() or path.stat().st_uid != os.geteuid() or mode & 0o077 == 0:
                continue
            path.chmod(mode & ~0o077 if mode & 0o700 else want)
            changed.append(str(path))
        return changed

    def _private_paths(self):
        yield self.root
        for entry in self.root.iterdir() if self.root.is_dir() else ():
            yield entry
            if entry.name in _PRIVATE_TREES and entry.is_dir() and not entry.is_symlink():
                yield from entry.rglob("*")

    def exposed(self) -> bool:
        """True when another user could read the data dir."""
        try:
            return bool(stat.S_IMODE(self.root.stat().st_mode) & 0o077)
        except FileNotFoundError:
            return False


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
    """ALINEO_DOCKER_HOST_TAR: may a root control plane tar a container's home,
    and write a checkpoint into a never-started container, from the host side
    (sandboxes/backends/overlay.py explains both fast paths)."""
    return _settings().ALINEO_DOCKER_HOST_TAR


def prepared_trees() -> bool:
    """ALINEO_PREPARED_TREES: keep each agent's newest checkpoint extracted, so
    a restore or a fork lays its home over it instead of extracting
    (sandboxes/backends/trees.py)."""
    return _settings().ALINEO_PREPARED_TREES


def restore_caps() -> tuple[int, int]:
    """ALINEO_RESTORE_MAX_BYTES and ALINEO_RESTORE_MAX_ENTRIES: the most a home
    written into a sandbox (a restore, a fork) may hold."""
    s = _settings()
    return s.ALINEO_RESTORE_MAX_BYTES, s.ALINEO_RESTORE_MAX_ENTRIES


def harness_cache() -> Path:
    """ALINEO_HARNESS_CACHE: where node and Pi are installed once (sandboxes/harnesses.py)."""
    return Path(_settings().ALINEO_HARNESS_CACHE)
