"""The base image, built offline: a minimal Debian with python3 from Debian's packages.

``mmdebstrap --variant=minbase`` with the merged-usr hook (without it bookworm
pulls in usrmerge and a full perl) and docs/man/locales excluded, piped straight
into ``docker import`` (measured: ~31 s, ~120 MB). The tag is a hash of the
build inputs (suite, packages, mirrors, recipe), so a build is skipped when
``docker image inspect`` finds it (0.04 s) and redone when an input changes.

The Debian mirror comes from this machine's apt configuration
(/etc/apt/sources.list and sources.list.d), never from a hardcoded host;
``ALINEO_DEBIAN_MIRROR`` (and ``ALINEO_DEBIAN_SECURITY_MIRROR``) override it.

Setup snapshots (one image per spec) are built by sandboxes.setup.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sandboxes import config
from sandboxes.errors import BackendUnavailable, SandboxError

#: What a spec names when it wants the project's base image (sessions.specs).
DEFAULT_IMAGE = "default"
BASE_REPOSITORY = "alineo-base"
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "ca-certificates")
# Bump when the recipe below changes in a way the other inputs do not show.
RECIPE_VERSION = 1
IMPORT_CHANGES = ('CMD ["/bin/bash"]', "ENV LANG=C.UTF-8", "WORKDIR /root")
DPKG_OPTS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-exclude=/usr/share/info/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-include=/usr/share/locale/locale.alias",
)
HOOKS = ("eatmydata", "merged-usr")
HOOK_ROOT = "/usr/share/mmdebstrap/hooks"


# --- the Debian mirror, from apt's configuration ---------------------------------------
@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]


def read_apt_sources(root: str = "/etc/apt") -> list[AptSource]:
    """Every enabled ``deb`` source in one-line (.list) and deb822 (.sources) files."""
    sources: list[AptSource] = []
    files = [os.path.join(root, "sources.list")]
    files += sorted(glob.glob(os.path.join(root, "sources.list.d", "*.list")))
    files += sorted(glob.glob(os.path.join(root, "sources.list.d", "*.sources")))
    for path in files:
        try:
            text = Path(path).read_text()
        except (FileNotFoundError, PermissionError, IsADirectoryError):
            continue
        if path.endswith(".sources"):
            sources += _parse_deb822(text)
        else:
            sources += _parse_one_line(text)
    return sources


def _parse_one_line(text: str) -> list[AptSource]:
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        words = line.split()[1:]
        if words and words[0].startswith("["):  # options: [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words.pop(0)
            words = words[1:]
        if len(words) >= 2:
            out.append(AptSource(words[0].rstrip("/"), (words[1],), tuple(words[2:])))
    return out


def _parse_deb822(text: str) -> list[AptSource]:
    out = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0] in " \t" and key:
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() in ("no", "false", "0"):
            continue
        for uri in fields.get("uris", "").split():
            out.append(AptSource(uri.rstrip("/"), tuple(fields.get("suites", "").split()),
                                 tuple(fields.get("components", "").split())))
    return out


def _host_codename() -> str | None:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"') or None
    except FileNotFoundError:
        pass
    return None


def debian_mirrors(suite: str = BASE_SUITE, sources: list[AptSource] | None = None) -> list[str]:
    """The ``deb URI suites main`` lines for mmdebstrap, taken from the apt
    configuration: the archive (an entry for the host's codename, or ``suite``)
    and, when configured, its security archive."""
    archive, security = (m.strip().rstrip("/") for m in config.debian_mirror_overrides())
    if not archive or not security:
        sources = read_apt_sources() if sources is None else sources
        names = {suite, _host_codename() or suite}
        for src in sources:
            if not archive and any(s in names for s in src.suites) and "main" in src.components:
                archive = src.uri
            if not security and any(s.endswith("-security") and s.split("-")[0] in names
                                    for s in src.suites) and "main" in src.components:
                security = src.uri
    if not archive:
        raise SandboxError(
            "no Debian mirror found in /etc/apt/sources.list(.d) for "
            f"{suite}; set ALINEO_DEBIAN_MIRROR to the mirror's URI", permanent=True,
        )
    lines = [f"deb {archive} {suite} {suite}-updates main"]
    if security:
        lines.append(f"deb {security} {suite}-security main")
    return lines


# --- inputs, tag, recipe -----------------------------------------------------------------
def base_image_inputs() -> dict:
    return {
        "recipe": RECIPE_VERSION,
        "suite": BASE_SUITE,
        "variant": "minbase",
        "packages": list(BASE_PACKAGES),
        "mirrors": debian_mirrors(BASE_SUITE),
        "hooks": list(HOOKS),
        "dpkg_opts": list(DPKG_OPTS),
        "changes": list(IMPORT_CHANGES),
    }


def inputs_hash(inputs: dict) -> str:
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def base_image_tag(inputs: dict | None = None) -> str:
    return f"{BASE_REPOSITORY}:{inputs_hash(inputs or base_image_inputs())}"


def resolve_image(image: str) -> str:
    """A spec's image as the engine knows it: ``default`` is the base image's tag."""
    return base_image_tag() if image == DEFAULT_IMAGE else image


def mmdebstrap_argv(inputs: dict) -> list[str]:
    argv = [
        "mmdebstrap",
        f"--variant={inputs['variant']}",
        "--include=" + ",".join(inputs["packages"]),
        "--mode=root",
        "--format=tar",
        "--quiet",
    ]
    argv += [f"--hook-dir={HOOK_ROOT}/{hook}" for hook in inputs["hooks"]]
    argv += [f"--dpkgopt={opt}" for opt in inputs["dpkg_opts"]]
    argv += [inputs["suite"], "-", *inputs["mirrors"]]
    return argv


# --- build ----------------------------------------------------------------------------------
def docker_client():
    import docker

    try:
        client = docker.from_env(timeout=None)
        client.ping()
        return client
    except Exception as exc:  # noqa: BLE001
        raise BackendUnavailable(
            f"no Docker engine answers ({exc.__class__.__name__}: {exc}). The base image is "
            "only needed by the docker backend: start an engine (as root: .ci/docker-up) "
            "or use ALINEO_SANDBOX=local"
        ) from exc


def image_present(client, tag: str) -> bool:
    import docker.errors

    try:
        client.api.inspect_image(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_base_image(*, force: bool = False, client=None,
                      log: Callable[[str], None] = lambda msg: None) -> tuple[str, bool]:
    """Build the base image unless an image with the inputs' tag exists.
    Returns (tag, built). Concurrent callers on one machine build it once."""
    client = client or docker_client()
    inputs = base_image_inputs()
    tag = base_image_tag(inputs)
    if not force and image_present(client, tag):
        return tag, False
    lock_path = os.path.join(tempfile.gettempdir(), f"alineo-build-{tag.replace(':', '-')}.lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and image_present(client, tag):  # built while we waited
            return tag, False
        _build(client, inputs, tag, log)
    return tag, True


def _build(client, inputs: dict, tag: str, log: Callable[[str], None]) -> None:
    if shutil.which("mmdebstrap") is None:
        raise SandboxError(
            "mmdebstrap is not installed (as root: apt-get install mmdebstrap, or .ci/docker-up)",
            permanent=True,
        )
    if os.geteuid() != 0:
        raise SandboxError("building the base image needs root (mmdebstrap --mode=root)",
                           permanent=True)
    argv = mmdebstrap_argv(inputs)
    repository, _, version = tag.partition(":")
    log(f"building {tag}: {' '.join(argv)} | docker import")
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=errf)
        result: dict = {}

        def do_import():
            try:
                result["out"] = client.api.import_image(
                    src=proc.stdout, repository=repository, tag=version,
                    changes=[*inputs["changes"], f"LABEL alineo.base-inputs={tag.split(':')[1]}"],
                    stream_src=True,
                )
            except Exception as exc:  # noqa: BLE001
                result["error"] = exc

        importer = threading.Thread(target=do_import, name="docker-import")
        importer.start()
        code = proc.wait()
        importer.join()
        errf.seek(0)
        stderr = errf.read().decode(errors="replace")
    if code != 0:
        if image_present(client, tag):
            client.api.remove_image(tag, force=True)  # a truncated tar may still import
        raise SandboxError(f"mmdebstrap failed (exit {code}):\n{stderr[-3000:]}")
    if "error" in result:
        raise SandboxError(f"docker import of {tag} failed: {result['error']}")
    if not image_present(client, tag):
        raise SandboxError(f"docker import did not produce {tag}: {result.get('out')!r}")
    log(f"built {tag} in {time.monotonic() - t0:.1f} s")
