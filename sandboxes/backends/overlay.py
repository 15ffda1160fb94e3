"""The docker backend's host-side paths into a container's overlay2 disk, for
a control plane that is root on the engine's own host (ALINEO_DOCKER_HOST_TAR):

* :func:`merged_home_fd` + :func:`tar_out` — a running container's home read
  by GNU tar on the host over its merged dir (a turn checkpoint without
  streaming 50 MB through dockerd's exec stream);
* :func:`upper_home_fd` + :func:`tar_in` — a checkpoint written into a
  container that was created and has never run, straight into its writable
  layer (the upper dir), before ``start`` mounts it. dockerd's archive API
  (``put_archive``) costs about 2–3× the disk's own ``zstd -dc | tar -x`` for
  5,000 files; this is the disk's speed (docs/PERFORMANCE.md, "Restore").

Why writing the upper dir is safe: the container has never run, so nothing in
its upper dir was made by the sandbox — the only files there are the ones this
control plane wrote; the home is opened with ``O_NOFOLLOW`` and tar works in
that fd (``/proc/self/fd/N``), never in a path it resolves again. Every entry
passes the extraction rules (sandboxes/tar_rules.py) before any of its bytes
reach tar (``validated_tar``), exactly as they do before ``put_archive``: no
absolute or ``..`` name, no link that leads outside, nothing written through
a link, no device. Owners and modes come from the tar headers by number, as
dockerd restores them. Any doubt (another driver, a user-namespace remap, a
volume over the home, a home already written) returns None, and the caller
takes the engine's path.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from typing import Iterable, Iterator

from sandboxes.backends import procs
from sandboxes.backends.base import home_tar_argv
from sandboxes.errors import ExecFailed
from sandboxes.safe_tar import validated_tar

#: GNU tar flags for the upper-dir write: owners by number (never through the
#: host's /etc/passwd), the recorded modes, no extended attributes or ACLs
#: (dockerd's put_archive restores none of them from a checkpoint either).
UNTAR_FLAGS = ("--numeric-owner", "--same-owner", "--same-permissions",
               "--no-xattrs", "--no-acls", "--no-selinux", "--warning=no-timestamp")
#: Not root (the local backends): files are this user's; the backend gives
#: them to the sandbox's owner afterwards (``_after_write``).
NON_ROOT_UNTAR_FLAGS = tuple(f for f in UNTAR_FLAGS if f != "--same-owner") + ("--no-same-owner",)


def _overlay_data(info: dict, status: str) -> dict | None:
    if info["State"].get("Status") != status or info["GraphDriver"]["Name"] != "overlay2":
        return None
    return info["GraphDriver"]["Data"]


def _home_mounted(info: dict, home: str) -> bool:
    return any(m.get("Destination", "").rstrip("/") in ("", home) for m in info.get("Mounts") or ())


def merged_home_fd(info: dict, home: str) -> int | None:
    """An O_NOFOLLOW directory fd on a running container's merged home, or None.
    The fd (not the path) is what tar works in: a container that turned its
    home into a symlink (to "/etc", which the host would resolve to ITS /etc)
    is refused."""
    data = _overlay_data(info, "running")
    if _home_mounted(info, home):
        return None  # the merged dir shows what is under the mount, not the home
    merged = data and data.get("MergedDir")
    if not merged or not os.path.isdir(merged):
        return None
    top = os.open(merged, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return os.open(home.lstrip("/"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
    finally:
        os.close(top)


def upper_home_fd(info: dict, home: str) -> int | None:
    """An O_NOFOLLOW fd on a new, empty home directory in the writable layer of
    a container that was created and never started, or None when that cannot
    be done with certainty (see the module doc). ``home`` is one component
    below ``/`` (``/root``)."""
    data = _overlay_data(info, "created")
    upper = data and data.get("UpperDir")
    name = home.strip("/")
    if not upper or "/" in name or not name:
        return None
    if not info["State"].get("StartedAt", "0001-").startswith("0001-"):
        return None  # a created container that ran once (restarted, then...) is not fresh
    if _home_mounted(info, home):
        return None  # a volume or bind over the home would hide what is written here
    top = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(top)
        if st.st_uid != 0 or os.listdir(top):
            return None  # remapped root (userns), or a layer that already holds files
        os.mkdir(name, 0o700, dir_fd=top)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
        if not stat.S_ISDIR(os.fstat(fd).st_mode):  # pragma: no cover - O_DIRECTORY said so
            os.close(fd)
            return None
        return fd
    finally:
        os.close(top)


def tar_out(sandbox_id: str, fd: int) -> Iterator[bytes]:
    """The home under ``fd`` as tar (package caches excluded); closes ``fd``."""
    try:
        argv = home_tar_argv(f"/proc/self/fd/{fd}", by_name=True)
        with tempfile.TemporaryFile() as errf:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=errf, pass_fds=(fd,))
            widen_pipe(proc.stdout)
            code = yield from procs.drain(proc)
            errf.seek(0)
            stderr = errf.read()
    finally:
        os.close(fd)
    if code not in (0, 1):  # 1: "file changed as we read it", a warning
        raise ExecFailed(
            f"tar of the home dir of {sandbox_id[:12]} failed with exit code {code}: "
            + stderr.decode(errors="replace")[-2000:], exit_code=code, stderr=stderr)


def tar_in(sandbox_id: str, fd: int, tar_chunks: Iterable[bytes], caps: tuple,
           same_owner: bool | None = None) -> None:
    """Extract a tar stream into the directory ``fd`` (closed at the end) with
    GNU tar, each entry handed to it only after its header passed the rules
    (UnsafeArchive at the first that fails: tar is stopped, the entries
    before it stay, all inside the home). ``same_owner``: the owners in the
    tar (the default as root) or this user's."""
    try:
        if same_owner is None:
            same_owner = os.geteuid() == 0
        flags = UNTAR_FLAGS if same_owner else NON_ROOT_UNTAR_FLAGS
        argv = ["tar", "-x", "-f", "-", "-C", f"/proc/self/fd/{fd}", *flags]
        with tempfile.TemporaryFile() as errf:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=errf, pass_fds=(fd,))
            widen_pipe(proc.stdin)
            try:
                _feed(proc, validated_tar(tar_chunks, caps))
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            code = _wait(proc)
            errf.seek(0)
            stderr = errf.read()
    finally:
        os.close(fd)
    if code != 0:
        raise ExecFailed(
            f"writing the home of {sandbox_id[:12]} failed: tar exited with {code}: "
            + stderr.decode(errors="replace")[-2000:], exit_code=code, stderr=stderr)


def widen_pipe(pipe) -> None:
    """Give a pipe to tar 1 MiB of room (Linux's default is 64 KiB): on a busy
    machine each side then runs ahead while the other waits for a CPU,
    instead of the two taking turns every 64 KiB. Best effort."""
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
    except (OSError, AttributeError, ImportError):
        pass


def _feed(proc: subprocess.Popen, chunks: Iterator[bytes]) -> None:
    try:
        for chunk in chunks:
            proc.stdin.write(chunk)
    except BrokenPipeError:
        pass  # tar stopped early: its exit code and stderr say why
    finally:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass


def _wait(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
