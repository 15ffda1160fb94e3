"""The local backend's launcher, run as a program (stdlib only, one thread, so
that setns(2) of a user namespace is allowed): ``python3 -I -S nsexec.py JSON``.
The environment it is given is the command's.

``{"mode": "launch", ...}`` — join the sandbox's cgroup, take its CPUs, bind
its directories where its host uid can reach them (``stage``, when root),
drop to that uid/gid, then exec ``argv`` (bubblewrap).

``{"mode": "enter", "target": PID, ...}`` — join the same cgroup and CPUs,
enter every namespace of the sandbox whose init is PID, then fork (a new PID
namespace takes effect for children) and in the child become ``uid``/``gid``
inside, set no_new_privs and the rlimits, chdir to ``cwd`` and exec ``argv``.
The parent waits and exits with the child's code.

User namespaces are entered from the outermost one that is not ours inward,
entering each other namespace as soon as the user namespace that owns it is
entered: bubblewrap nests a second user namespace (the one that maps the
sandbox uid) inside the one that owns its mount, PID and network namespaces,
and an unprivileged caller has capabilities only in namespaces it entered.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import resource
import sys
import warnings  # noqa: F401 - os.execvp imports it lazily, maybe after we lost the right to read it

NS_GET_PARENT = 0xB702
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWUSER = 0x10000000
NAMESPACES = {"mnt": 0x00020000, "ipc": 0x08000000, "uts": 0x04000000,
              "net": 0x40000000, "pid": 0x20000000, "cgroup": 0x02000000}
RLIMITS = {"nproc": resource.RLIMIT_NPROC, "as": resource.RLIMIT_AS}

_libc = ctypes.CDLL(None, use_errno=True)


def _fail(message: str, code: int = 126) -> None:
    sys.stderr.write(f"nsexec: {message}\n")
    sys.stderr.flush()
    os._exit(code)


def _setns(fd: int, kind: int) -> bool:
    if _libc.setns(fd, kind) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EPERM, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


def _join(spec: dict) -> None:
    if spec.get("cgroup"):
        with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])


def _user_chain(target: int) -> list[int]:
    """Fds of the target's user namespace and its ancestors that are not ours, outermost first."""
    own = os.stat("/proc/self/ns/user").st_ino
    fd = os.open(f"/proc/{target}/ns/user", os.O_RDONLY)
    chain = []
    while os.fstat(fd).st_ino != own:
        chain.append(fd)
        try:
            fd = fcntl.ioctl(fd, NS_GET_PARENT)
        except OSError:  # an ancestor of ours: stop there
            break
    return chain[::-1]


def _enter(target: int) -> None:
    others = {}
    for name, kind in NAMESPACES.items():
        path = f"/proc/{target}/ns/{name}"
        if os.path.exists(path) and os.stat(path).st_ino != os.stat(f"/proc/self/ns/{name}").st_ino:
            others[name] = (os.open(path, os.O_RDONLY), kind)
    # First the ones our own user namespace already may enter (we are root), then after each level.
    for user_fd in [None, *_user_chain(target)]:
        if user_fd is not None and not _setns(user_fd, CLONE_NEWUSER):
            _fail("cannot enter the sandbox's user namespace (not its owner, and not root)")
        for name, (fd, kind) in list(others.items()):
            # The mount namespace last: entering it moves our root and cwd.
            if name != "mnt" and _setns(fd, kind):
                del others[name]
        if "mnt" in others and _setns(*others["mnt"]):
            del others["mnt"]
    if others:
        _fail(f"cannot enter the sandbox's {', '.join(sorted(others))} namespace(s)")


def _become(uid: int, gid: int) -> None:
    try:
        os.setgroups([])
    except OSError:  # a user namespace made without privilege denies setgroups
        pass
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _exec(argv: list[str]) -> None:
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError as exc:
        _fail(f"{argv[0]}: command not found ({exc})", 127)
    except OSError as exc:
        _fail(f"{argv[0]}: {exc}", 126)


MS_BIND, MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV = 0x1000, 0x4000, 0x40000, 0x2, 0x4
CLONE_NEWNS = NAMESPACES["mnt"]


def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    enc = (lambda v: v.encode() if isinstance(v, str) else v)
    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _stage(at: str, binds: dict) -> None:
    """Bind the sandbox's host paths under ``at`` in a mount namespace of our
    own. bubblewrap resolves every source path as the unprivileged user it runs
    as, who may not pass through the data dir; a tmpfs at ``at`` it may."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the host
    # Opened before the tmpfs, which may hide them (a data dir under /tmp), and
    # in this namespace (a bind's source must be): then bound by fd.
    sources = {name: os.open(path, os.O_PATH | os.O_NOFOLLOW) for name, path in binds.items()}
    _mount("tmpfs", at, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
    for name, fd in sources.items():
        target = os.path.join(at, name)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(target)
        else:
            open(target, "w").close()
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        os.close(fd)


def launch(spec: dict) -> None:
    _join(spec)
    if spec.get("stage"):
        try:
            _stage(spec["stage"]["at"], spec["stage"]["binds"])
        except OSError as exc:
            _fail(f"cannot stage the sandbox's directories: {exc}")
    if spec.get("uid") is not None and os.geteuid() == 0:
        _become(spec["uid"], spec["gid"])
    _exec(spec["argv"])


def enter(spec: dict) -> None:
    _join(spec)
    try:
        _enter(int(spec["target"]))
    except OSError as exc:
        _fail(f"cannot enter sandbox (init pid {spec['target']}): {exc}")
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(128 - code if code < 0 else code)
    try:
        _become(spec["uid"], spec["gid"])
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            _fail("cannot set no_new_privs")
        for name, value in (spec.get("rlimits") or {}).items():
            resource.setrlimit(RLIMITS[name], (value, value))
        try:
            os.chdir(spec.get("cwd") or "/")
        except OSError:
            os.chdir("/")
    except OSError as exc:
        _fail(f"cannot take the sandbox's uid and limits: {exc}")
    _exec(spec["argv"])


def main() -> None:
    spec = json.loads(sys.argv[1])
    {"launch": launch, "enter": enter}[spec["mode"]](spec)


if __name__ == "__main__":
    main()
