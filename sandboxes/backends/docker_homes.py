"""The docker backend's host-dir homes (sandboxes/backends/hosthome.py says
what they are and why they are safe): whether this control plane may make
them, what an image's home seeds them with, the seal, the sweep. A mixin of
:class:`sandboxes.backends.docker.DockerBackend`, which holds the state
(``_unsealed``, ``_homes_ok``, ``_image_homes``)."""

from __future__ import annotations

import os

from sandboxes import config
from sandboxes.backends import hosthome, overlay
from sandboxes.backends.base import LABEL_MANAGED
from sandboxes.backends.docker_config import HOME
from sandboxes.errors import SandboxError


class HostHomes:
    def new_host_home(self, agent_id: str, image: str) -> str | None:
        """A fresh host directory for ``agent_id``'s home, holding what
        ``image`` has in its home, when this control plane can write it at the
        disk's speed (root on the engine's own host, no user-namespace remap,
        ALINEO_DOCKER_HOST_TAR, an image home of plain files), else None."""
        if not config.docker_host_tar():
            return None
        if self._homes_ok is None:
            self._homes_ok = self._host_homes_possible()
        seed = self._image_home(image) if self._homes_ok else None
        if seed is None:
            return None
        home = hosthome.fresh(agent_id)
        overlay.tar_in(agent_id, hosthome.open_dir(home), [seed], config.restore_caps())
        return str(home)

    def _image_home(self, image: str) -> bytes | None:
        """The image's home as tar (cached per image id), or None when it is
        not only plain files and directories (then the engine's path is taken)."""
        image_id = self.image_id(image)
        if image_id not in self._image_homes:
            with self._errors(image=image):
                sid = self.client.api.create_container(image_id, command=["true"],
                                                       network_disabled=True)["Id"]
                try:
                    stream, _ = self.stream_client.api.get_archive(sid, HOME)
                    self._image_homes[image_id] = hosthome.image_home_tar(stream)
                finally:
                    self.client.api.remove_container(sid, force=True, v=True)
        return self._image_homes[image_id]

    def _host_homes_possible(self) -> bool:
        if os.geteuid() != 0 or not self.host.startswith("unix://"):
            return False
        try:
            with self._errors():
                options = self.client.info().get("SecurityOptions") or []
        except SandboxError:
            return False
        return not any("userns" in str(o) for o in options)  # remapped uids: not ours to set

    def seal_home(self, sandbox_id: str, run_dir: str) -> None:
        """The host-dir home is complete: from now on it is the sandbox's, and
        only the engine writes into it; its waiting bridge may start."""
        with self._lock:
            self._unsealed.pop(sandbox_id, None)
        hosthome.seal(run_dir)

    def sweep_homes(self) -> list[str]:
        """Remove the host-dir homes whose container is gone (``docker rm -f``
        behind our back); returns their names."""
        with self._errors():
            rows = self.client.api.containers(all=True, filters={"label": [f"{LABEL_MANAGED}=1"]})
        in_use = [h for h in (hosthome.of_mounts(r.get("Mounts"), HOME) for r in rows) if h]
        return hosthome.sweep(in_use) + self.sweep_tree_homes()
