"""The host-directory backends' snapshots (sandboxes/backends/hostdir.py):
``commit`` copies a sandbox's home to ``<root>/_snapshots/<tag>/home``, and a
sandbox created from ``local-snapshot/<tag>`` starts with a copy of it. A
mixin of :class:`sandboxes.backends.hostdir.HostDirBackend` (which holds
``root`` and the sandbox paths)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Mapping
from urllib.parse import quote

from sandboxes.backends import procs
from sandboxes.errors import ImageMissing, SandboxError

SNAPSHOT_PREFIX = "local-snapshot/"
SNAPSHOTS = "_snapshots"


class HostSnapshots:
    """``commit`` and the images it makes (``local-snapshot/<tag>``)."""

    def snapshot_ref(self, kind: str, name: str) -> str:
        return f"{SNAPSHOT_PREFIX}{kind}-{name}"

    def _snapshot_dir(self, ref: str) -> Path:
        return self.root / SNAPSHOTS / quote(ref[len(SNAPSHOT_PREFIX):], safe="")

    def commit(self, sandbox_id: str, tag: str, *,
               labels: Mapping[str, str] | None = None) -> str:
        if not tag:
            raise SandboxError("commit needs a tag", permanent=True)
        self._existing(sandbox_id)
        ref = tag if tag.startswith(SNAPSHOT_PREFIX) else SNAPSHOT_PREFIX + tag
        target = self._snapshot_dir(ref)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".new-", dir=target.parent))
        try:
            shutil.copytree(self.host_home(sandbox_id), staging / "home", symlinks=True)
            procs.write_json(staging / "meta.json", {
                "ref": ref, "from": sandbox_id, "created": time.time(),
                "id": uuid.uuid4().hex, "labels": {str(k): str(v) for k, v in (labels or {}).items()},
            })
            if target.exists():  # a tag is moved, as `docker commit` moves it
                old = target.with_name(f".old-{uuid.uuid4().hex[:8]}")
                os.rename(target, old)
                shutil.rmtree(old, ignore_errors=True)
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return ref

    def image_exists(self, image: str) -> bool:
        """A local snapshot exists when its copy does; "default" is the host."""
        if image.startswith(SNAPSHOT_PREFIX):
            return (self._snapshot_dir(image) / "home").is_dir()
        return image == "default"

    def image_id(self, image: str) -> str:
        """A snapshot's id (new at each commit); the host "image" is its name."""
        if image.startswith(SNAPSHOT_PREFIX):
            try:
                meta = json.loads((self._snapshot_dir(image) / "meta.json").read_text())
            except (FileNotFoundError, ValueError) as exc:
                raise ImageMissing(f"local snapshot {image} not found") from exc
            return meta.get("id") or f"{image}@{meta.get('created')}"
        return image

    def remove_image(self, image: str) -> None:
        if image.startswith(SNAPSHOT_PREFIX):
            procs.rmtree(self._snapshot_dir(image))
