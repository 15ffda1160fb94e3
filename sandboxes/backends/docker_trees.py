"""The docker backend's homes laid over prepared trees (issue 17,
sandboxes/backends/trees.py): a restored or forked agent whose checkpoint is
prepared gets a named volume of the engine's ``local`` driver, an overlay
mount of

    lowerdir = <the checkpoint's tree>:<the image's home>   (read-only, shared)
    upperdir = <data dir>/layers/<volume>/upper             (this home's changes)

mounted at ``/root`` with ``nocopy``. Nothing is extracted: the container is
created and started as if its home were already there, and it is. The engine
mounts the volume when the container starts and unmounts it when it stops, so
a reboot, a restart or a ``docker stop`` need nothing of us.

Why it stays safe:

* the trees were extracted by the checked stream (trees.py), and a sandbox
  never writes into them: overlayfs copies a file up into the upper layer
  before it changes, and a deletion is a whiteout there;
* the upper layer is a directory made here (``0700`` parents), empty; the one
  host-side write into it (the session file, :meth:`TreeHomes.write_upper`)
  happens before the container's first start, when nothing of the sandbox has
  run and the volume is not mounted;
* the volume's options are ours (paths under the data dir, refused when they
  hold a character the mount options would read as a separator); a sandbox
  cannot name another agent's tree, layer or volume;
* ``docker commit`` never includes a volume;
* a tree is removed only when no volume of ours names it (its label), under
  its exclusive lock (trees.py ``sweep``).

The volume and its layer go with the container (:meth:`DockerBackend.remove`)
or, left by a ``docker rm -f``, at the next sweep (:meth:`TreeHomes.sweep_tree_homes`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Iterable

from sandboxes import config
from sandboxes.backends import hosthome, overlay, trees
from sandboxes.backends.base import LABEL_AGENT, LABEL_MANAGED
from sandboxes.errors import SandboxError

log = logging.getLogger(__name__)

VOLUME_PREFIX = "alineo-home-"
LABEL_TREE = "alineo.tree"
LABEL_SEED = "alineo.seed"
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./+@-]+$")  # nothing the mount options split on (",", ":")
_SAFE_VOLUME = re.compile(rf"^{VOLUME_PREFIX}[A-Za-z0-9][A-Za-z0-9_.-]{{0,160}}$")


def layer_dir(volume: str) -> Path:
    if not _SAFE_VOLUME.match(volume):
        raise ValueError(f"{volume!r} is not a tree home's volume")
    return config.data_dir().layers / volume


def volume_of(mounts: Iterable[dict] | None, home: str) -> str | None:
    """The tree home's volume among a container's mounts, or None."""
    for m in mounts or ():
        if (m.get("Type") == "volume" and (m.get("Destination") or "").rstrip("/") == home
                and _SAFE_VOLUME.match(m.get("Name") or "")):
            return m["Name"]
    return None


class TreeHomes:
    """A mixin of :class:`sandboxes.backends.docker.DockerBackend` (which holds
    ``_unstarted``: the upper layers of tree homes whose container has not
    started yet, the only ones written from the host)."""

    def prepares_trees(self) -> bool:
        """Whether a restore or fork here can lay a home over a prepared tree
        (root on the engine's host, no userns remap, ALINEO_DOCKER_HOST_TAR and
        ALINEO_PREPARED_TREES)."""
        if not (config.docker_host_tar() and config.prepared_trees()):
            return False
        if self._homes_ok is None:
            self._homes_ok = self._host_homes_possible()
        return self._homes_ok

    def new_tree_home(self, agent_id: str, image: str, tree: trees.Tree,
                      labels: dict | None = None) -> str | None:
        """A new volume whose mount lays a home over ``tree`` (and the image's
        home), or None when that cannot be done here (the caller extracts)."""
        if not self.prepares_trees():
            return None
        seed_tar = self._image_home(image)
        if seed_tar is None:
            return None
        seed = trees.prepare_seed(seed_tar)
        volume = f"{VOLUME_PREFIX}{agent_id}-{uuid.uuid4().hex[:8]}"
        if not _SAFE_VOLUME.match(volume):
            return None  # an agent id no volume name can hold: extracted instead
        layers = layer_dir(volume)
        paths = [str(tree.root), str(seed.root), str(layers / "upper"), str(layers / "work")]
        if not all(_SAFE_PATH.match(p) for p in paths):
            return None
        layers.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        layers.mkdir(mode=0o700)
        try:
            with trees.using(tree) as ok, trees.using(seed) as seed_ok:
                if not (ok and seed_ok):
                    shutil.rmtree(layers, ignore_errors=True)
                    return None
                _upper_like(tree.root, layers / "upper")
                (layers / "work").mkdir(mode=0o700)
                with self._errors():
                    self.client.api.create_volume(
                        volume, driver="local",
                        driver_opts={"type": "overlay", "device": "overlay",
                                     "o": f"lowerdir={paths[0]}:{paths[1]},upperdir={paths[2]},"
                                          f"workdir={paths[3]},nosuid,nodev"},
                        labels={**(labels or config.extra_labels()), LABEL_MANAGED: "1",
                                LABEL_AGENT: str(agent_id), LABEL_TREE: tree.key,
                                LABEL_SEED: seed.key})
        except BaseException:
            shutil.rmtree(layers, ignore_errors=True)
            raise
        return volume

    def write_upper(self, sandbox_id: str, tar_chunks: Iterable[bytes]) -> bool:
        """Write into the upper layer of a tree home whose container has not
        started (its volume is not mounted); False when this is not one."""
        with self._lock:
            upper = self._unstarted.get(sandbox_id)
        if upper is None:
            return False
        fd = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        overlay.tar_in(sandbox_id, fd, tar_chunks, config.restore_caps())
        return True

    def discard_tree_home(self, volume: str | None) -> None:
        """Remove a tree home's volume (its container is gone, or was never
        created) and its layer."""
        if volume is None:
            return
        try:
            with self._errors():
                self.client.api.remove_volume(volume, force=True)
        except SandboxError as exc:
            if "no such volume" not in str(exc).lower():
                log.warning("removing the volume %s failed: %s", volume, exc)
                return  # still in use: the sweep tries again
        _remove_layer(layer_dir(volume))

    def sweep_tree_homes(self) -> list[str]:
        """Remove the tree homes no container uses (``docker rm -f`` behind our
        back) once they are :data:`hosthome.ORPHAN_AGE_S` old, the layers no
        volume has, and the trees no volume names; returns the volumes removed."""
        with self._errors():
            volumes = self.client.api.volumes(filters={"label": f"{LABEL_MANAGED}=1"})["Volumes"] or []
            dangling = {v["Name"] for v in self.client.api.volumes(
                filters={"dangling": True, "label": f"{LABEL_MANAGED}=1"})["Volumes"] or []}
        ours = [v for v in volumes if _SAFE_VOLUME.match(v.get("Name") or "")]
        gone = []
        for v in ours:
            if v["Name"] in dangling and _age_s(v) >= hosthome.ORPHAN_AGE_S:
                self.discard_tree_home(v["Name"])
                gone.append(v["Name"])
        names = {v["Name"] for v in ours}
        top = config.data_dir().layers
        for entry in (top.iterdir() if top.is_dir() else ()):
            if entry.name not in names and _SAFE_VOLUME.match(entry.name) and not entry.is_symlink():
                if time.time() - entry.lstat().st_ctime >= hosthome.ORPHAN_AGE_S:
                    _remove_layer(entry)  # its volume was never made, or removed by hand
        trees.sweep(self.tree_keys_in_use, self.tree_owners)
        return gone

    def tree_keys_in_use(self) -> set[str]:
        """The trees (and image homes) the volumes of this engine are laid over."""
        with self._errors():
            volumes = self.client.api.volumes(filters={"label": f"{LABEL_MANAGED}=1"})["Volumes"] or []
        labels = [v.get("Labels") or {} for v in volumes]
        return trees.referenced(labels, LABEL_TREE) | trees.referenced(labels, LABEL_SEED)


def _upper_like(tree_root: Path, upper: Path) -> None:
    """The upper layer's top directory, with the owner and mode of the tree's
    (overlayfs shows the upper's for the merged home's own directory)."""
    st = os.stat(tree_root, follow_symlinks=False)
    upper.mkdir(mode=0o700)
    os.chown(upper, st.st_uid, st.st_gid, follow_symlinks=False)
    os.chmod(upper, st.st_mode & 0o7777, follow_symlinks=False)


def _age_s(volume: dict) -> float:
    from datetime import datetime

    try:
        made = datetime.fromisoformat(str(volume.get("CreatedAt")).replace("Z", "+00:00"))
    except ValueError:
        return 0.0  # not a time we can read: never taken for an orphan's
    return time.time() - made.timestamp()


def _remove_layer(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        hosthome.rmtree(path)
