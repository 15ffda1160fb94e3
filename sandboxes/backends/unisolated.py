"""The unisolated backend (``ALINEO_SANDBOX=unisolated``): a directory and a
detached process group per sandbox, run as the control plane's own user with
the host's files and network. For development only: ``network`` and
``limits`` are recorded, not enforced, and an agent can read everything the
control plane can (its database, its secret key). Every start says so in the
log, and ``manage.py check`` warns (sessions/checks.py, alineo.W006).

The process group leads its own session (``start_new_session=True``), so it
outlives the control plane. The layout is sandboxes/backends/hostdir.py's.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from sandboxes.backends import procs
from sandboxes.backends.hostdir import HostDirBackend
from sandboxes.errors import SandboxError

log = logging.getLogger(__name__)

WARNING = ("UNISOLATED SANDBOX (ALINEO_SANDBOX=unisolated): sandbox %s runs as this "
           "server's user with its files and network; an agent can read the database and "
           "the secret key. Use the local (bubblewrap) or docker backend outside development.")


class UnisolatedBackend(HostDirBackend):
    name = "unisolated"
    isolated = False
    python = sys.executable

    def bind_inside(self, host_dir: str, inside: str) -> str:
        return host_dir  # no mount namespace: the host's path as it is

    def bridge_command(self, run_dir: Path) -> list[str]:
        # -S: no site-packages of the host's python in the bridge (it is stdlib only).
        return [sys.executable, "-S", "-m", "bridge"]

    def _env(self, sandbox_id: str, meta: dict, extra: Mapping[str, str] | None = None) -> dict:
        # A clean environment: nothing of the control plane's (its secrets) leaks in.
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            **meta.get("env", {}),
            **(extra or {}),
        }
        env.update(
            HOME=self.host_home(sandbox_id),
            ALINEO_AGENT_ID=meta["agent_id"],
            ALINEO_RUN_DIR=meta["run_dir"],
            ALINEO_SANDBOX_ID=sandbox_id,
        )
        return {str(k): str(v) for k, v in env.items()}

    def _launch(self, sandbox_id: str, path: Path, meta: dict, logf):
        log.warning(WARNING, sandbox_id)
        try:
            proc = subprocess.Popen(
                meta["command"], cwd=self.host_home(sandbox_id), env=self._env(sandbox_id, meta),
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start {meta['command'][0]!r}: {exc}", permanent=True) from exc
        return proc, {"pid": proc.pid, "starttime": procs.starttime(proc.pid)}

    def _exec_popen(self, sandbox_id: str, meta: dict, argv: list[str],
                    env: Mapping[str, str] | None) -> subprocess.Popen:
        return subprocess.Popen(
            argv, cwd=self.host_home(sandbox_id), env=self._env(sandbox_id, meta, env),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
