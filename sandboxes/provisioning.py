"""Making a sandbox for an agent: its run dir (the bridge's source, its
config, the socket's directory), the bridge command for the backend, the
setup snapshot it starts from, and the revisions a checkpoint records (which
harness, which sandbox profile)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from sandboxes.backends.base import CONTAINER_RUN_DIR, LABEL_AGENT

if TYPE_CHECKING:  # pragma: no cover
    from sandboxes.driver import AgentInfo

BRIDGE_SRC = Path(__file__).resolve().parent / "bridge"


class DriverError(Exception):
    pass


def harness_revision() -> str:
    """A hash of the bridge's source: which harness wrote a checkpoint."""
    global _REVISION
    if _REVISION is None:
        h = hashlib.sha256()
        for path in sorted(BRIDGE_SRC.rglob("*.py")):
            h.update(str(path.relative_to(BRIDGE_SRC)).encode() + b"\0" + path.read_bytes())
        _REVISION = h.hexdigest()[:16]
    return _REVISION


_REVISION: str | None = None


def profile_revision(spec: dict) -> str:
    """A hash of what shapes the sandbox a checkpoint was taken in (image, setup,
    packages, user, network, limits): which sandbox profile it belongs to."""
    keys = ("image", "packages", "setup", "run_as", "network", "limits")
    profile = json.dumps({k: spec.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(profile.encode()).hexdigest()[:16]


def run_dir_for(agent_id: str) -> Path:
    return Path(settings.DATA_DIR) / "run" / agent_id


def extra_labels() -> dict[str, str]:
    """ALINEO_SANDBOX_LABELS="k=v,k2=v2": labels added to every sandbox (tests use it to clean up)."""
    out = {}
    for item in os.environ.get("ALINEO_SANDBOX_LABELS", "").split(","):
        k, sep, v = item.partition("=")
        if sep and k.strip():
            out[k.strip()] = v.strip()
    return out


def _create_sandbox(backend, info: AgentInfo, run: Path, *, seed: dict | None = None,
                    start: bool = True) -> str:
    """Create (and start, unless ``start=False``) a sandbox whose command is the
    bridge, from the spec's setup snapshot (or its image when it needs no
    setup). Orphans of an earlier attempt that crashed before journaling the
    sandbox are removed first. ``seed`` ({"messages", "turns"}: the rebuild
    rung) is written to the run dir and passed as ``--seed``; a bridge that
    finds a session file ignores it, so restarts never seed twice."""
    for old in backend.list({LABEL_AGENT: info.id}):
        backend.remove(old.id)
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True, exist_ok=True)
    shutil.copytree(BRIDGE_SRC, run / "bridge", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    spec = info.spec
    config = {"agent_id": info.id, "model": spec.get("model", "demo"),
              "tools": spec.get("tools"), "hooks": spec.get("hooks") or {}}
    (run / "config.json").write_text(json.dumps(config, indent=1))
    sock = run / "bridge.sock"
    if len(str(sock).encode()) > 107:
        raise DriverError(f"the socket path {sock} is too long for AF_UNIX; use a shorter ALINEO_DATA_DIR")
    if backend.name == "docker":
        run.chmod(0o777)  # the bridge may run as another uid than the control plane
        command = ["python3", "-m", "bridge", "--run-dir", CONTAINER_RUN_DIR, "--home", "/root"]
        env = {"PYTHONPATH": CONTAINER_RUN_DIR, "PYTHONDONTWRITEBYTECODE": "1"}
        seed_at = f"{CONTAINER_RUN_DIR}/seed.json"
    else:
        command = [sys.executable, "-S", "-m", "bridge"]  # HOME and ALINEO_RUN_DIR set by the backend
        env = {"PYTHONPATH": str(run), "PYTHONDONTWRITEBYTECODE": "1"}
        seed_at = str(run / "seed.json")
    if seed is not None:
        (run / "seed.json").write_text(json.dumps(seed))
        command += ["--seed", seed_at]
    # Bound secrets reach the sandbox only through its environment (never
    # config.json, which lives on the host's disk in the run dir).
    env.update({secret.env: secret.value for secret in info.secrets or []})
    sid = backend.create(info.id, _image_for(backend, spec), run_dir=str(run),
                         limits=spec.get("limits"), network=spec.get("network") or "none",
                         env=env, labels=extra_labels(), command=command)
    if start:
        try:
            backend.start(sid)
        except BaseException:
            backend.remove(sid)
            raise
    return sid


def _image_for(backend, spec: dict) -> str:
    """The spec's setup snapshot (built once), or its image when it needs no setup."""
    try:
        from sandboxes.setup import ensure_setup_image
    except ImportError:  # pragma: no cover - before setup snapshots existed
        return spec.get("image") or "default"
    return ensure_setup_image(backend, spec, labels=extra_labels())
