"""Setup snapshots: run a spec's packages and setup steps once, keep the result.

A *setup snapshot* is an image made once per spec by committing a
sandbox after its setup ran, so an agent's start skips reinstalling. A fresh
sandbox from it has the packages and files of the setup and no conversation.

    ref = ensure_setup_image(backend, spec)          # an image ref for backend.create()

The snapshot is keyed by a hash of what setup depends on: the base image's
*id* (not its name: a rebuilt base makes a new key), the packages, the setup
steps, ``run_as`` and :data:`SETUP_RECIPE`. When the snapshot exists its ref is
returned at once (docker: one ``image inspect``, ~0.04 s). Otherwise, under a
file lock per key in ``DATA_DIR/locks`` (threads and processes alike) and after
re-checking, it is built:

1. a temporary sandbox from the base image, with the spec's network, limits,
   and the capabilities package installation needs (:data:`SETUP_CAPS`);
2. ``apt-get update`` + ``apt-get install -y --no-install-recommends`` of the
   packages (docker only; this needs ``"network": "host"``, which the spec
   check at POST /api/agents enforces: the Debian mirror is the only non-
   loopback traffic a sandbox may make);
3. a user for ``run_as`` when it is not root (docker);
4. each setup step as ``sh -c STEP`` (cwd = home); the first that exits
   non-zero fails the build with its output (:class:`SetupFailed`);
5. caches cleaned (``apt-get clean``, apt lists, ``~/.cache``, ``/tmp``);
6. commit under the backend's ``snapshot_ref("setup", key)`` (docker:
   ``alineo-setup:<key>``; local: ``local-snapshot/setup-<key>``, a copy of the
   home dir plus its meta.json), then the temporary
   sandbox is removed — on failure too.

A spec with no packages, no steps and ``run_as`` root needs no snapshot: its
image is returned as it is.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shlex
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

from sandboxes import config
from sandboxes.errors import SandboxError

log = logging.getLogger(__name__)

#: Bump when the build steps below change in a way the key's other inputs do not show.
SETUP_RECIPE = 1
#: Capabilities a setup sandbox gets back (everything else stays dropped):
#: dpkg chowns and overrides modes, apt drops to the `_apt` user.
SETUP_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID")
LABEL_SETUP = "alineo.setup-key"
#: Per step; a package install on a slow mirror can take minutes.
STEP_TIMEOUT_S = 1800
SETUP_AGENT = "setup"


class SetupFailed(SandboxError):
    """A setup step (or the package installation) exited non-zero."""

    permanent_default = True

    def __init__(self, message: str, *, step: str = "", exit_code: int | None = None,
                 output: str = "", permanent: bool | None = None):
        super().__init__(message, permanent)
        self.step, self.exit_code, self.output = step, exit_code, output


@dataclass(frozen=True)
class SetupImage:
    ref: str           # what backend.create() takes
    key: str           # the hash of the inputs ("" when no setup is needed)
    built: bool        # True when this call ran the setup
    seconds: float     # how long this call took


def needs_setup(spec: Mapping) -> bool:
    return bool(spec.get("packages") or spec.get("setup")
                or (spec.get("run_as") or "root") != "root")


def setup_inputs(backend, spec: Mapping) -> dict:
    """What a setup snapshot depends on. Raises ImageMissing when the base is absent."""
    image = spec.get("image") or "default"
    return {
        "recipe": SETUP_RECIPE,
        "backend": backend.name,
        "base": backend.image_id(image),
        "packages": list(spec.get("packages") or []),
        "setup": list(spec.get("setup") or []),
        "run_as": spec.get("run_as") or "root",
    }


def setup_key(backend, spec: Mapping) -> str:
    blob = json.dumps(setup_inputs(backend, spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def setup_ref(backend, key: str) -> str:
    return backend.snapshot_ref("setup", key)


def ensure_setup_image(backend, spec: Mapping, *, labels: Mapping[str, str] | None = None,
                       lock_dir: str | os.PathLike | None = None) -> str:
    """The image ref to create the spec's sandboxes from, building the setup
    snapshot the first time (see the module doc). Thread- and process-safe."""
    return ensure_setup(backend, spec, labels=labels, lock_dir=lock_dir).ref


def ensure_setup(backend, spec: Mapping, *, labels: Mapping[str, str] | None = None,
                 lock_dir: str | os.PathLike | None = None,
                 on_log: Callable[[str], None] | None = None) -> SetupImage:
    """Like :func:`ensure_setup_image`, and says whether this call built it.
    ``labels`` go on the temporary sandbox and the snapshot."""
    t0 = time.monotonic()
    image = spec.get("image") or "default"
    if not needs_setup(spec):
        return SetupImage(image, "", False, time.monotonic() - t0)
    _check_spec(backend, spec)
    key = setup_key(backend, spec)
    ref = setup_ref(backend, key)
    if backend.image_exists(ref):
        return SetupImage(ref, key, False, time.monotonic() - t0)
    with _file_lock(_lock_path(lock_dir, key)):
        if backend.image_exists(ref):  # built by another thread or process while we waited
            return SetupImage(ref, key, False, time.monotonic() - t0)
        _build(backend, spec, image, key, ref, labels or {}, on_log or (lambda m: None))
    return SetupImage(ref, key, True, time.monotonic() - t0)


def ensure_harness_layer(backend, image: str, install, inside: str,
                         *, labels: Mapping[str, str] | None = None) -> str:
    """``image`` with an installed harness copied to ``inside`` (docker: one
    more image layer, ``alineo-harness:<key>``, made once per image and
    harness; so a remote engine needs no host path). Backends without a root
    file system of their own bind the host tree instead: ``image`` as it is."""
    if not backend.installs_packages:
        return image
    blob = json.dumps([backend.image_id(image), install.key, inside])
    key = hashlib.sha256(blob.encode()).hexdigest()[:20]
    ref = backend.snapshot_ref("harness", key)
    if backend.image_exists(ref):
        return ref
    with _file_lock(_lock_path(None, f"harness-{key}")):
        if backend.image_exists(ref):
            return ref
        t0 = time.monotonic()
        sid = backend.create(f"{SETUP_AGENT}-{key[:12]}", image, labels={**(labels or {}),
                                                                          LABEL_SETUP: key})
        try:
            backend.add_tree(sid, str(install.host_dir), inside)
            backend.commit(sid, ref, labels={LABEL_SETUP: key})
        finally:
            backend.remove(sid)
        log.info("harness layer %s made in %.1f s", ref, time.monotonic() - t0)
    return ref


def _check_spec(backend, spec: Mapping) -> None:
    if spec.get("packages"):
        if not backend.installs_packages:
            raise SandboxError(f"packages need the docker backend (the {backend.name} backend "
                               "installs nothing)", permanent=True)
        if (spec.get("network") or "none") != "host":
            raise SandboxError('packages need network: host (to reach the Debian mirror)',
                               permanent=True)


def _lock_path(lock_dir, key: str) -> Path:
    path = config.data_dir().locks if lock_dir is None else Path(lock_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path / f"setup-{key}.lock"


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock: one open file description per holder, so it also
    excludes other threads of this process."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(backend, spec: Mapping, image: str, key: str, ref: str, labels: Mapping[str, str],
           on_log: Callable[[str], None]) -> None:
    t0 = time.monotonic()
    docker = backend.installs_packages  # a root file system of its own: apt, users
    all_labels = {**labels, LABEL_SETUP: key}
    sid = backend.create(
        f"{SETUP_AGENT}-{key[:12]}", image, network=spec.get("network") or "none",
        limits=spec.get("limits"), labels=all_labels,
        cap_add=SETUP_CAPS if docker else (),
    )
    try:
        backend.start(sid)
        home = backend.home(sid)
        steps: list[tuple[str, str]] = []
        packages = list(spec.get("packages") or [])
        if packages:
            steps.append(("apt-get update", "apt-get update -q"))
            steps.append((
                "apt-get install " + " ".join(packages),
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
                + " ".join(shlex.quote(p) for p in packages),
            ))
        run_as = spec.get("run_as") or "root"
        if docker and run_as != "root":
            user = shlex.quote(run_as)
            steps.append((f"user {run_as}",
                          f"id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/sh {user}"))
        steps += [(step, step) for step in spec.get("setup") or []]
        for label, command in steps:
            on_log(f"setup {key[:12]}: {label}")
            res = backend.exec(sid, ["sh", "-c", command], timeout=STEP_TIMEOUT_S)
            if not res.ok:
                output = (res.stdout + res.stderr).decode(errors="replace")[-4000:]
                raise SetupFailed(
                    f"setup step {label!r} exited with {res.exit_code}: {output[-1000:]}",
                    step=label, exit_code=res.exit_code, output=output,
                    permanent=not label.startswith("apt-get"),  # a mirror can come back
                )
        # Clean caches: the commit's time grows with the size of its diff.
        clean = f"rm -rf {shlex.quote(home)}/.cache"
        if docker:
            clean = ("apt-get clean >/dev/null 2>&1; rm -rf /var/lib/apt/lists/* /tmp/* "
                     "/var/tmp/* /root/.cache; " + clean)
        backend.exec(sid, ["sh", "-c", clean], timeout=300)
        backend.commit(sid, ref, labels=all_labels)
        on_log(f"setup {key[:12]}: committed {ref} in {time.monotonic() - t0:.1f} s")
        log.info("setup snapshot %s built in %.1f s", ref, time.monotonic() - t0)
    finally:
        try:
            backend.remove(sid)
        except SandboxError as exc:  # noqa: PERF203 - best effort, the snapshot is what counts
            log.warning("could not remove the setup sandbox %s: %s", sid, exc)
