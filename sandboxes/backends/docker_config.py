"""What the docker backend asks the engine for when it creates a container
(sandboxes/backends/docker.py): the isolation every sandbox gets, its
mounts, its limits."""

from __future__ import annotations

import os
from typing import Mapping

from sandboxes.backends import hosthome
from sandboxes.backends.docker_trees import volume_of
from sandboxes.backends.base import CONTAINER_RUN_DIR, Limits

HOME = "/root"


def host_home_fd(info: dict, home: str) -> int | None:
    """An O_NOFOLLOW fd on the container's host-dir home, or None."""
    path = hosthome.of_mounts(info.get("Mounts"), home)
    return hosthome.open_dir(path) if path is not None else None


def volume_home_fd(info: dict, home: str) -> int | None:
    """An O_NOFOLLOW fd on a running container's tree home (the engine's mount
    of its volume, sandboxes/backends/docker_trees.py), or None."""
    if info["State"].get("Status") != "running" or volume_of(info.get("Mounts"), home) is None:
        return None
    source = next(m["Source"] for m in info["Mounts"]
                  if (m.get("Destination") or "").rstrip("/") == home)
    if not source or not os.path.ismount(source):
        return None
    return os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def container_config(image: str, *, limits: Limits, network: str,
                     run_dir: str | None, env: dict, labels: dict, command: list,
                     cap_add: list, binds: Mapping[str, str] | None = None,
                     home_dir: str | None = None, home_volume: str | None = None) -> dict:
    """``containers.create`` arguments: under docker-init, every capability
    dropped but ``cap_add``, no new privileges, the limits, the run dir bound
    (and a host-dir home, writable)."""
    import docker.types

    mounts = []
    if home_dir is not None:
        mounts.append(docker.types.Mount(HOME, home_dir, type="bind"))
    if home_volume is not None:
        mounts.append(docker.types.Mount(HOME, home_volume, type="volume", no_copy=True))
    if run_dir is not None:
        run_dir = os.path.abspath(run_dir)
        os.makedirs(run_dir, mode=0o755, exist_ok=True)
        mounts.append(docker.types.Mount(CONTAINER_RUN_DIR, run_dir, type="bind"))
    for host, inside in sorted((binds or {}).items()):
        mounts.append(docker.types.Mount(inside, os.path.abspath(host), type="bind", read_only=True))
    config = dict(
        image=image, command=command, detach=True, init=True, network_mode=network,
        cap_drop=["ALL"], cap_add=cap_add or None, security_opt=["no-new-privileges"],
        pids_limit=limits.pids, mem_limit=f"{limits.memory_mb}m",
        memswap_limit=f"{limits.memory_mb}m", labels=labels, environment=env,
        working_dir=HOME, mounts=mounts,
    )
    if limits.cpus:
        config["nano_cpus"] = int(limits.cpus * 1e9)
    return config
