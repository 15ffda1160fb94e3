"""Local backend: each sandbox is a bubblewrap (``bwrap``) sandbox on this
machine, for machines without Docker. docs/LOCAL_SANDBOX.md says what it
isolates and which test proves each claim.

* New user, PID, mount, network, IPC and UTS namespaces; inside, the agent is
  uid/gid 1000 with no capabilities, no_new_privs, and cannot make further
  user namespaces (``--disable-userns``).
* The file system is an empty read-only root with the host's /usr (and the
  few /etc files programs need) read-only; writable are only the home (at
  /root, as in a container), the run dir (at /run/alineo, docker's
  CONTAINER_RUN_DIR) and a /tmp and /dev/shm of memory_mb each. The data
  dir, other sandboxes and the host's home are not there at all.
* Network ``none``: a namespace with only its own loopback; ``host`` keeps the
  host's (``--share-net``).
* Under a root control plane each sandbox runs as a host uid of its own
  (:data:`UID_BASE` + 24 bits of its id), owner of its home and run dir.
* Limits: sandboxes/backends/limits.py (cgroup v2 where delegated, rlimits here).
* Never ``--die-with-parent``: a sandbox outlives the control plane. Its PID
  namespace's init is the pid status() follows; killing it ends every process
  the sandbox started. ``exec`` enters the same namespaces, uid and limits
  (sandboxes/backends/nsexec.py).

Sandboxes made by the unisolated backend (the local backend before bubblewrap)
are moved in by their next start, their home as it is
(HostDirBackend._adopt; the ladder journals it as a restart).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

from sandboxes import config
from sandboxes.backends import idmap, overlay, procs, trees
from sandboxes.backends import limits as limits_mod
from sandboxes.backends.base import CONTAINER_RUN_DIR
from sandboxes.backends.hostdir import SNAPSHOT_PREFIX, HostDirBackend
from sandboxes.errors import BackendUnavailable, SandboxError, SandboxNotRunning

log = logging.getLogger(__name__)

HOME = "/root"
INSIDE_UID = INSIDE_GID = 1000
UID_BASE = 0x40000000
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NSEXEC = str(Path(__file__).resolve().with_name("nsexec.py"))
#: Host files a program expects under /etc, bound read-only when present.
ETC_FILES = ("alternatives", "ssl/certs", "ca-certificates", "localtime", "nsswitch.conf",
             "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "mime.types", "protocols", "services",
             "bash.bashrc", "profile", "inputrc", "python3", "python3.11", "magic")
ETC_HOST_NETWORK = ("resolv.conf", "hosts", "host.conf", "gai.conf")
START_TIMEOUT_S = 30.0
#: Where a root launcher binds a sandbox's host paths for bubblewrap (in its own mount namespace).
STAGE = "/tmp"


class LocalBackend(HostDirBackend):
    name = "local"
    isolation = "bwrap"
    tree_owners = trees.ROOT  # shown as each sandbox's own uid (sandboxes/backends/idmap.py)

    def run_dir_inside(self, run_dir: Path) -> str:
        return CONTAINER_RUN_DIR

    def bridge_command(self, run_dir: Path) -> list[str]:
        # The image's python (here the host's /usr/bin/python3, read-only);
        # -S: nothing of its site-packages in the bridge (it is stdlib only).
        return ["python3", "-S", "-m", "bridge", "--run-dir", CONTAINER_RUN_DIR, "--home", HOME]

    def home(self, sandbox_id: str) -> str:
        return HOME

    def unavailable_reason(self) -> str | None:
        return bwrap_problem()

    def _foreign_python(self, argv0: str) -> bool:
        return super()._foreign_python(argv0) and not argv0.startswith("/usr/")

    # --- homes laid over prepared trees (issue 17) --------------------------------------------
    def prepares_trees(self) -> bool:
        """Root, bubblewrap, ALINEO_PREPARED_TREES and id-mapped overlay mounts
        (probed once, sandboxes/backends/idmap.py)."""
        if not config.prepared_trees() or os.geteuid() != 0 or bwrap_problem():
            return False
        return idmap.problem(str(trees.top())) is None

    def new_tree_home(self, agent_id: str, image: str, tree, labels: dict | None = None) -> str | None:
        """The tree's key, for :meth:`create` (which lays the home over it),
        when this sandbox can have such a home: not from a snapshot (whose
        home would be under the checkpoint's: then it is extracted)."""
        if image.startswith(SNAPSHOT_PREFIX) or not self.prepares_trees():
            return None
        return tree.key

    def tree_keys_in_use(self) -> set[str]:
        keys = set()
        for entry in self.root.iterdir() if self.root.is_dir() else ():
            try:
                keys.add(json.loads((entry / "meta.json").read_text())["tree"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return keys

    def sweep_homes(self) -> list[str]:
        """Remove the prepared trees no sandbox's home is laid over."""
        if not self.prepares_trees():
            return []
        trees.sweep(self.tree_keys_in_use, self.tree_owners)
        return []

    def _mount_tree_home(self, sandbox_id: str, meta: dict) -> None:
        """Mount the home laid over its tree (again, after a reboot)."""
        path = self._dir(sandbox_id)
        tree = trees.top() / meta["tree"] / "root"
        if not tree.is_dir():
            raise SandboxError(f"the prepared tree under the home of {sandbox_id} is gone",
                               permanent=True)
        uid = meta["host_uid"]
        try:
            idmap.mount_home(tree, path / "upper", path / "work", path / "home", uid, uid)
        except OSError as exc:
            raise SandboxError(f"the home of {sandbox_id} cannot be mounted over its tree: {exc}",
                               permanent=True) from exc

    def write_home(self, sandbox_id: str, tar_chunks) -> None:
        """A home laid over a tree is written only before its first start,
        into its upper layer (nothing is mounted, nothing of the sandbox ran);
        any other home as the base class writes it."""
        meta = self._meta(sandbox_id)
        if not meta.get("tree"):
            return super().write_home(sandbox_id, tar_chunks)
        path = self._dir(sandbox_id)
        if (path / "pid").exists() or os.path.ismount(path / "home"):
            raise SandboxError(f"the home of {sandbox_id} is laid over a tree and in use: "
                               "written only before its first start", permanent=True)
        fd = os.open(path / "upper", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        overlay.tar_in(sandbox_id, fd, tar_chunks, config.restore_caps())
        procs.chown_tree(path / "upper", meta["host_uid"], meta["host_uid"])

    def read_home(self, sandbox_id: str):
        meta = self._meta(sandbox_id)
        if meta.get("tree"):
            self._mount_tree_home(sandbox_id, meta)
        return super().read_home(sandbox_id)

    # --- create: owner and files ---------------------------------------------------------
    def _prepare(self, staging: Path, meta: dict) -> None:
        uid = host_uid(meta["id"]) if os.geteuid() == 0 else None
        meta["host_uid"] = uid
        if meta.get("tree"):
            if uid is None:
                raise SandboxError("a home laid over a tree needs a root control plane",
                                   permanent=True)
            if not (staging / "upper").exists():  # (an adopted sandbox has them)
                tree_root = trees.top() / meta["tree"] / "root"
                (staging / "upper").mkdir(mode=0o700)
                os.chown(staging / "upper", uid, uid)
                os.chmod(staging / "upper", stat.S_IMODE(tree_root.stat().st_mode))
                (staging / "work").mkdir(mode=0o700)
        etc = staging / "etc"
        etc.mkdir(exist_ok=True)
        (etc / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\n"
            f"agent:x:{INSIDE_UID}:{INSIDE_GID}:agent:{HOME}:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        (etc / "group").write_text(f"root:x:0:\nagent:x:{INSIDE_GID}:\nnogroup:x:65534:\n")
        (etc / "hosts").write_text("127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost\n")
        (etc / "hostname").write_text("sandbox\n")
        if uid is not None:
            # The sandbox's own run dir is still in staging; a given one is where it is.
            run = staging / "run" if (staging / "run").is_dir() else Path(meta["run_dir"])
            procs.chown_tree(staging / "home", uid, uid)
            procs.chown_tree(run, uid, uid)

    def _as_owner(self, sandbox_id: str) -> dict:
        # The home tar of a running sandbox reads only what the sandbox's own
        # uid may read: a directory swapped for a link to a host path midway
        # cannot put a file of the host's into a checkpoint.
        uid = self._meta(sandbox_id).get("host_uid")
        return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}

    def commit(self, sandbox_id: str, tag: str, *, labels: Mapping[str, str] | None = None) -> str:
        meta = self._meta(sandbox_id)
        if meta.get("tree"):
            self._mount_tree_home(sandbox_id, meta)
        # Paused while the home is copied (as `docker commit` pauses): the copy
        # runs as root, and nothing in the sandbox may swap a directory for a
        # link to a host path under it.
        stopped = _freeze(self._pid_info(sandbox_id))
        try:
            return super().commit(sandbox_id, tag, labels=labels)
        finally:
            for pid in stopped:
                procs.kill(pid, signal.SIGCONT)

    def _after_write(self, sandbox_id: str, meta: dict) -> None:
        if meta.get("host_uid") is not None:
            procs.chown_tree(Path(self.host_home(sandbox_id)), meta["host_uid"], meta["host_uid"])

    def _env(self, sandbox_id: str, meta: dict, extra: Mapping[str, str] | None = None) -> dict:
        env = {"PATH": PATH, "LANG": "C.UTF-8", **meta.get("env", {}), **(extra or {})}
        env.update(HOME=HOME, USER="agent", LOGNAME="agent", ALINEO_AGENT_ID=meta["agent_id"],
                   ALINEO_RUN_DIR=CONTAINER_RUN_DIR, ALINEO_SANDBOX_ID=sandbox_id)
        return {str(k): str(v) for k, v in env.items()}

    # --- start -------------------------------------------------------------------------------
    def _launch(self, sandbox_id: str, path: Path, meta: dict, logf):
        problem = bwrap_problem()
        if problem:
            raise BackendUnavailable(problem)
        plan = limits_mod.enforcement()
        lim = meta["limits"]
        cgroup = None
        command = list(meta["command"])
        if plan.mode == "cgroup2":
            cgroup = limits_mod.make_cgroup(plan, sandbox_id, limits_mod.cgroup_values(
                lim["pids"], lim["memory_mb"], lim.get("cpus")))
        else:
            command = limits_mod.prlimit_argv(limits_mod.rlimits(lim["pids"], lim["memory_mb"])) + command
        if meta.get("tree"):
            self._mount_tree_home(sandbox_id, meta)
        uid = meta.get("host_uid")
        stage = _Stage(uid is not None)
        info_r, info_w = os.pipe()
        try:
            argv = ["bwrap", *self._bwrap_argv(sandbox_id, path, meta, stage),
                    "--info-fd", str(info_w), "--", *command]
            spec = {"mode": "launch", "cgroup": cgroup, "uid": uid, "gid": uid,
                    "cpus": self._cpus(sandbox_id, meta, plan), "stage": stage.spec(),
                    "argv": argv}
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", NSEXEC, json.dumps(spec)],
                    env=self._env(sandbox_id, meta), cwd="/", stdin=subprocess.DEVNULL,
                    stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                    pass_fds=(info_w,))
            except OSError as exc:
                os.close(info_r)
                raise SandboxError(f"cannot start bubblewrap: {exc}", permanent=True) from exc
        finally:
            os.close(info_w)
        child = _read_info(info_r, proc)
        if child is None:
            raise SandboxError(f"bubblewrap did not start sandbox {sandbox_id}: "
                               f"{_tail(path / 'sandbox.log')}", permanent=True)
        command_pid = (procs.children(child) or [None])[0]  # for tests and operators
        return proc, {"pid": child, "starttime": procs.starttime(child), "outer": proc.pid,
                      "command": command_pid, "cgroup": cgroup}

    def _bwrap_argv(self, sandbox_id: str, path: Path, meta: dict, stage: "_Stage") -> list[str]:
        mem = f"{meta['limits']['memory_mb'] * 1024 * 1024}"
        argv = ["--unshare-all", "--unshare-user", "--disable-userns"]
        if meta["network"] == "host":
            argv.append("--share-net")
        argv += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib64", "sbin"):
            argv += ["--symlink", f"usr/{name}", f"/{name}"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--size", mem, "--tmpfs", "/dev/shm",
                 "--size", mem, "--tmpfs", "/tmp"]
        etc = list(ETC_FILES) + (list(ETC_HOST_NETWORK) if meta["network"] == "host" else [])
        for name in etc:
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for name in ("passwd", "group", "hostname") + (("hosts",) if meta["network"] != "host" else ()):
            argv += ["--ro-bind", stage.add(f"etc-{name}", path / "etc" / name), f"/etc/{name}"]
        for i, (host, inside) in enumerate(sorted(meta.get("binds", {}).items())):
            argv += ["--ro-bind", stage.add(f"bind-{i}", host), inside]
        argv += ["--bind", stage.add("home", self.host_home(sandbox_id)), HOME,
                 "--bind", stage.add("run", meta["run_dir"]), CONTAINER_RUN_DIR,
                 "--remount-ro", "/",
                 "--uid", str(INSIDE_UID), "--gid", str(INSIDE_GID), "--chdir", HOME,
                 "--new-session"]
        return argv

    def _cpus(self, sandbox_id: str, meta: dict, plan) -> list[int] | None:
        if plan.mode == "cgroup2":
            return None
        return limits_mod.cpu_set(meta["limits"].get("cpus"), sandbox_id)

    # --- exec --------------------------------------------------------------------------------
    def _exec_popen(self, sandbox_id: str, meta: dict, argv: list[str],
                    env: Mapping[str, str] | None) -> subprocess.Popen:
        info = self._pid_info(sandbox_id) or {}
        if meta.get("isolation") != self.isolation or "outer" not in info:
            # Made without isolation (before an upgrade): entering its "namespaces"
            # would be entering the host's. The ladder restarts it first.
            raise SandboxNotRunning(f"sandbox {sandbox_id} runs without bubblewrap; "
                                    "it must be restarted before anything runs in it")
        plan = limits_mod.enforcement()
        lim = meta["limits"]
        spec = {"mode": "enter", "target": info.get("pid"), "uid": INSIDE_UID, "gid": INSIDE_GID,
                "cwd": HOME, "cgroup": info.get("cgroup"), "cpus": self._cpus(sandbox_id, meta, plan),
                "rlimits": (limits_mod.rlimits(lim["pids"], lim["memory_mb"])
                            if plan.mode == "rlimit" else None),
                "argv": argv}
        return subprocess.Popen(
            [sys.executable, "-I", "-S", NSEXEC, json.dumps(spec)],
            env=self._env(sandbox_id, meta, env), cwd="/", stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    # --- stop, remove ----------------------------------------------------------------------
    def _terminate(self, sandbox_id: str, info: dict, timeout: float) -> None:
        if "outer" not in info:  # a process group the unisolated backend started
            return super()._terminate(sandbox_id, info, timeout)
        init = int(info["pid"])
        # SIGTERM to the command (the init ignores it: a PID namespace's init
        # gets only the signals it handles); the init exits with the command,
        # and the kernel then kills everything else in the namespace.
        for child in procs.children(init):
            procs.kill(child, signal.SIGTERM)
        if not self._wait_gone(sandbox_id, timeout):
            procs.kill(init, signal.SIGKILL)
            self._wait_gone(sandbox_id, 5)
        _drop_cgroup(sandbox_id, info)

    def _kill_all(self, sandbox_id: str, info: dict | None) -> None:
        if info is None or "outer" not in info:
            return super()._kill_all(sandbox_id, info)
        procs.kill(int(info["pid"]), signal.SIGKILL)  # the PID namespace dies with its init
        deadline = time.monotonic() + 5
        while procs.alive(int(info["pid"]), info.get("starttime")) and time.monotonic() < deadline:
            time.sleep(0.02)
        _drop_cgroup(sandbox_id, info)


def host_uid(sandbox_id: str) -> int:
    """The host uid a sandbox runs as under a root control plane."""
    digits = "".join(c for c in sandbox_id if c in "0123456789abcdef")[-12:]
    return UID_BASE + int(digits[:6] or "0", 16)


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run sandboxes here, or None (probed once per process)."""
    if not shutil.which("bwrap"):
        return ("bubblewrap is not installed (`apt-get install bubblewrap`, or `bash "
                ".ci/bwrap-up` as root)")
    if limits_mod.enforcement().mode == "rlimit" and not shutil.which("prlimit"):
        return "prlimit (util-linux) is missing: the local backend cannot set limits"
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--ro-bind", "/usr",
            "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
            "--uid", str(INSIDE_UID), "--gid", str(INSIDE_GID), "--", "true"]
    spec = {"mode": "launch", "uid": UID_BASE, "gid": UID_BASE, "argv": argv}
    try:
        res = subprocess.run([sys.executable, "-I", "-S", NSEXEC, json.dumps(spec)], cwd="/",
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap cannot be run: {exc}"
    if res.returncode != 0:
        return ("bubblewrap cannot create a sandbox here (user namespaces disabled?): "
                + (res.stderr.strip() or f"exit code {res.returncode}")[-500:])
    return None


class _Stage:
    """The host paths bubblewrap binds. Under a root control plane they are
    bound first under :data:`STAGE` in a mount namespace of the launcher's own
    (sandboxes/backends/nsexec.py), because bubblewrap runs as the sandbox's
    uid, which may not pass through the data dir; otherwise they are used as they are."""

    def __init__(self, staged: bool):
        self.staged = staged
        self.binds: dict[str, str] = {}

    def add(self, name: str, source) -> str:
        if not self.staged:
            return str(source)
        self.binds[name] = str(source)
        return f"{STAGE}/{name}"

    def spec(self) -> dict | None:
        return {"at": STAGE, "binds": self.binds} if self.staged else None


def _read_info(fd: int, proc: subprocess.Popen) -> int | None:
    """The host pid of the sandbox's init, from bwrap's --info-fd (None if it failed)."""
    buf = b""
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(fd)
    try:
        child = int(json.loads(buf)["child-pid"])
    except (ValueError, KeyError, TypeError):
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
        return None
    # bwrap reports its child before the child has set up the inner user
    # namespace (the one mapping uid 1000); it forks the command only once all
    # is set up, and exec must not enter a sandbox that is half made.
    start = procs.starttime(child)
    while time.monotonic() < deadline and procs.alive(child, start) and not procs.children(child):
        time.sleep(0.005)
    return child


def _freeze(info: dict | None) -> list[int]:
    """SIGSTOP every process in the sandbox's PID namespace (again, until no
    new one appears: a process may fork while we go); the pids stopped."""
    if not info or "outer" not in info:
        return []
    try:
        ns = os.stat(f"/proc/{int(info['pid'])}/ns/pid").st_ino
    except OSError:
        return []
    stopped: list[int] = []
    for _ in range(50):
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in stopped:
                try:
                    if os.stat(entry / "ns" / "pid").st_ino == ns:
                        found.append(int(entry.name))
                except OSError:
                    continue
        if not found:
            break
        for pid in found:
            procs.kill(pid, signal.SIGSTOP)
        stopped += found
    return stopped


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-1500:].strip()
    except OSError:
        return "(no log)"


def _drop_cgroup(sandbox_id: str, info: dict) -> None:
    if info.get("cgroup"):
        try:
            os.rmdir(info["cgroup"])
        except OSError:
            pass
