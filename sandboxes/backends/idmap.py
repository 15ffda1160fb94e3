"""The local backend's homes laid over prepared trees (issue 17,
sandboxes/backends/trees.py): an overlay mount on the host,

    lowerdir = the checkpoint's tree, seen through an id-mapped mount
               (its files, all owned by root on disk, appear owned by the
               sandbox's host uid)
    upperdir = <sandbox>/upper   (this home's changes, the sandbox's uid)

at ``<sandbox>/home``, which bubblewrap binds at /root as before. Nothing is
extracted, and no file of the tree is chowned (a chown through an overlay
copies the whole file up: the cost this avoids). Each sandbox keeps its own
uid: the id mapping is per mount.

Needs root and a kernel with id-mapped mounts under overlayfs (Linux 5.19+):
:func:`problem` probes it once. The syscalls (``open_tree``, ``mount_setattr``,
``move_mount``) have no wrapper in Python's standard library; their numbers
are the same on x86-64 and arm64 (the generic table), others are refused.

The mount lives in the host's mount namespace until :func:`unmount` (the
sandbox's removal) or a reboot; :func:`mount_home` is called again before
every start (sandboxes/backends/local.py), so a rebooted machine's sandbox
finds its home.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, 0o2000000
AT_FDCWD, AT_EMPTY_PATH = -100, 0x1000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
MOUNT_ATTR_IDMAP = 0x00100000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MS_NOSUID, MS_NODEV = 0x2, 0x4
MNT_DETACH = 0x2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _userns_fd(uid: int, gid: int) -> int:
    """A user namespace mapping its 0 to ``uid``/``gid`` (what an id-mapped
    mount is made with): a short-lived ``unshare --user`` process's."""
    proc = subprocess.Popen(["unshare", "--user", "--", "sleep", "30"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ours = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{proc.pid}/ns/user") == ours:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise OSError("unshare --user did not make a user namespace")
            time.sleep(0.002)
        with open(f"/proc/{proc.pid}/uid_map", "w") as fh:
            fh.write(f"0 {uid} 1\n")
        with open(f"/proc/{proc.pid}/setgroups", "w") as fh:
            fh.write("deny")
        with open(f"/proc/{proc.pid}/gid_map", "w") as fh:
            fh.write(f"0 {gid} 1\n")
        return os.open(f"/proc/{proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        proc.kill()
        proc.wait()


def _idmapped_at(source: Path, target: Path, uid: int, gid: int) -> None:
    """Mount ``source`` at ``target`` (an empty directory) read-only, with
    root's files shown as ``uid``/``gid``'s. Read-only: should it ever be
    left attached (a process killed in between), nothing deleting through it
    can touch the shared tree."""
    userns = _userns_fd(uid, gid)
    cint, cstr = ctypes.c_int, ctypes.c_char_p
    try:
        tree = _check(_libc.syscall(ctypes.c_long(SYS_OPEN_TREE), cint(AT_FDCWD),
                                    cstr(os.fsencode(source)),
                                    ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)), "open_tree")
        try:
            attr = _MountAttr(MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID
                              | MOUNT_ATTR_NODEV, 0, 0, userns)
            _check(_libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), cint(tree), cstr(b""),
                                 ctypes.c_uint(AT_EMPTY_PATH), ctypes.byref(attr),
                                 ctypes.c_size_t(ctypes.sizeof(attr))), "mount_setattr")
            _check(_libc.syscall(ctypes.c_long(SYS_MOVE_MOUNT), cint(tree), cstr(b""),
                                 cint(AT_FDCWD), cstr(os.fsencode(target)),
                                 ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)), "move_mount")
        finally:
            os.close(tree)
    finally:
        os.close(userns)


def mount_home(tree_root: Path, upper: Path, work: Path, home: Path, uid: int, gid: int) -> None:
    """The overlay of ``tree_root`` (id-mapped to ``uid``) and ``upper`` at
    ``home``; nothing when it is mounted already. The id-mapped mount of the
    tree is detached once the overlay holds it."""
    with _locked(home):
        if os.path.ismount(home):
            return
        lower = Path(tempfile.mkdtemp(prefix=".lower-", dir=home.parent))
        try:
            _idmapped_at(tree_root, lower, uid, gid)
        except BaseException:
            os.rmdir(lower)
            raise
        try:
            options = f"lowerdir={lower},upperdir={upper},workdir={work}"
            if _libc.mount(b"overlay", os.fsencode(home), b"overlay", MS_NOSUID | MS_NODEV,
                           options.encode()) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mount overlay at {home}: {os.strerror(err)}")
        finally:
            _umount(lower)
        os.rmdir(lower)


@contextlib.contextmanager
def _locked(home: Path):
    """One mount or unmount of ``home`` at a time (a start racing a
    checkpoint's read must not stack two overlays)."""
    fd = os.open(home.parent / ".mount.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _umount(path: Path) -> None:
    if _libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {path}: {os.strerror(err)}")


def unmount(home: Path) -> None:
    """Detach the overlay at ``home`` (a sandbox's processes that still hold
    it keep their view until they end)."""
    if not os.path.ismount(home):
        return
    with _locked(home):
        for _ in range(8):  # every overlay stacked there, should there be more than one
            if not os.path.ismount(home):
                break
            _umount(home)


@functools.lru_cache(maxsize=8)
def problem(where: str) -> str | None:
    """Why homes cannot be laid over trees on the file system of ``where``
    (the trees' directory), or None (probed once: a real id-mapped overlay
    in a temp dir there)."""
    if os.geteuid() != 0:
        return "not root"
    if platform.machine() not in ("x86_64", "aarch64"):
        return f"no syscall numbers for {platform.machine()}"
    if not shutil.which("unshare"):
        return "util-linux's unshare is missing"
    top = Path(tempfile.mkdtemp(prefix=".idmap-probe-", dir=where))
    try:
        for name in ("tree", "upper", "work", "home"):
            (top / name).mkdir()
        (top / "tree" / "f").write_text("x")
        mount_home(top / "tree", top / "upper", top / "work", top / "home", 65534, 65534)
        try:
            if (top / "home" / "f").stat().st_uid != 65534:
                return "the id mapping did not apply"
        finally:
            unmount(top / "home")
    except OSError as exc:
        return f"id-mapped overlay mounts do not work here: {exc}"
    finally:
        shutil.rmtree(top, ignore_errors=True)
    return None
