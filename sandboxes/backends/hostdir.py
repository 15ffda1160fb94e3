"""What the two backends without an engine share: a directory per sandbox on
this machine and a detached process tree that outlives the control plane.
sandboxes/backends/local.py runs that tree under bubblewrap,
sandboxes/backends/unisolated.py as the control plane's own user.

Layout under ``<root>`` (default the data dir's ``sandboxes/``, sandboxes/config.py)::

    <id>/home/        the agent's home, on the host
    <id>/run/         the run dir unless create() was given one
    <id>/meta.json    what create() was asked for (and how the sandbox is isolated)
    <id>/pid          the running process tree: {"pid", "starttime", ...}
    <id>/exit_code    written when a command this process started exits
    <id>/sandbox.log  the command's stdout and stderr
    _snapshots/<tag>/home   copies made by commit()

Status comes from the recorded pid, checked against the kernel's start time
so that a reused pid is never mistaken for the sandbox.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from sandboxes import config
from sandboxes.backends import idmap, overlay, procs, trees
from sandboxes.backends.hostdir_snapshots import SNAPSHOT_PREFIX, HostSnapshots
from sandboxes.backends.base import (
    CONTAINER_RUN_DIR,
    LABEL_AGENT,
    LABEL_MANAGED,
    PLACEHOLDER_COMMAND,
    ExecResult,
    OnOutput,
    Limits,
    SandboxBackend,
    SandboxHandle,
    SandboxStatus,
    home_tar_argv,
    validate_create_args,
)
from sandboxes.errors import (
    ExecFailed,
    ExecTimeout,
    ImageMissing,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
)
from sandboxes.safe_tar import as_fileobj, safe_extract

log = logging.getLogger(__name__)

#: (run dir, home) as an isolated sandbox's processes see them, by isolation
#: (sandboxes/backends/local.py mounts them there); unisolated ones see host paths.
INSIDE = {"bwrap": (CONTAINER_RUN_DIR, "/root")}


class HostDirBackend(HostSnapshots, SandboxBackend):
    """A directory and a detached process tree per sandbox. Subclasses say how
    the tree is started (:meth:`_launch`), entered (:meth:`_exec_argv`) and
    ended (:meth:`_terminate`)."""

    image_hint = ("as a snapshot of the local backend: it runs on the host and knows only "
                  '"default" and its own snapshots (local-snapshot/<name>, made by a commit)')

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(config.data_dir().sandboxes if root is None else root).resolve()

    @property
    def host(self) -> str:
        # Both host-directory backends drive the same directory on this machine,
        # so a sandbox made by either is reached through the one name.
        return f"local:{socket_name()}"

    # --- paths -------------------------------------------------------------------
    def _dir(self, sandbox_id: str) -> Path:
        if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith((".", "_")):
            raise SandboxNotFound(f"sandbox {sandbox_id!r} not found (not a local sandbox id)")
        return self.root / sandbox_id

    def _existing(self, sandbox_id: str) -> Path:
        path = self._dir(sandbox_id)
        if not (path / "meta.json").is_file():
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        return path

    def _meta(self, sandbox_id: str) -> dict:
        return json.loads((self._existing(sandbox_id) / "meta.json").read_text())

    def host_home(self, sandbox_id: str) -> str:
        """The home dir's path on the host (what read_home, write_home and commit use)."""
        return str(self._dir(sandbox_id) / "home")

    def home(self, sandbox_id: str) -> str:
        return self.host_home(sandbox_id)

    # --- what subclasses fill in -----------------------------------------------------
    def _prepare(self, staging: Path, meta: dict) -> None:
        """Add to a new sandbox's ``meta`` (and its staging dir) before it is created."""

    def _launch(self, sandbox_id: str, path: Path, meta: dict, logf) -> tuple[subprocess.Popen, dict]:
        """Start the sandbox's command; returns the process we wait for and the
        pid record (``pid`` + ``starttime`` of what status() follows)."""
        raise NotImplementedError

    def _exec_popen(self, sandbox_id: str, meta: dict, argv: list[str],
                    env: Mapping[str, str] | None) -> subprocess.Popen:
        """A one-shot command in the running sandbox, stdout/stderr piped, in
        its own session (so a timeout kills its whole group)."""
        raise NotImplementedError

    def _terminate(self, sandbox_id: str, info: dict, timeout: float) -> None:
        """End the running process tree: politely, then for sure. Here: a plain
        process group (what the unisolated backend starts)."""
        procs.killpg(int(info["pid"]), signal.SIGTERM)
        self._wait_gone(sandbox_id, timeout)
        # The leader is gone or overdue: take the whole group down, as docker does,
        # and the tools that left it for sessions of their own.
        self._kill_all(sandbox_id, info)
        self._wait_gone(sandbox_id, 5)

    def _kill_all(self, sandbox_id: str, info: dict | None) -> None:
        """Kill every process of the sandbox at once (remove)."""
        if info is not None:
            procs.killpg(int(info["pid"]), signal.SIGKILL)
        # Tools run in sessions of their own (sandboxes/bridge/tools.py) but
        # inherit the sandbox's environment: that is how they are found.
        for pid in procs.pids_with_env("ALINEO_SANDBOX_ID", sandbox_id):
            if pid != os.getpid():
                procs.kill(pid, signal.SIGKILL)

    def _after_write(self, sandbox_id: str, meta: dict) -> None:
        """Files were written into the home from the host (extraction)."""

    #: How this backend's sandboxes are isolated, as meta.json records it ("" for none).
    isolation = ""

    def _places(self, sandbox_id: str, meta: dict, isolation: str) -> tuple[str, str]:
        """(run dir, home) as the processes of a sandbox isolated so see them."""
        return INSIDE.get(isolation) or (meta["run_dir"], self.host_home(sandbox_id))

    def restart_reason(self, sandbox_id: str) -> str | None:
        try:
            meta = self._meta(sandbox_id)
        except SandboxNotFound:
            return None
        if meta.get("isolation", "") != self.isolation:
            return f"isolation_changed:{meta.get('isolation') or 'none'}->{self.isolation or 'none'}"
        return None

    def _adopt(self, sandbox_id: str, path: Path, meta: dict) -> dict:
        """A stopped sandbox made with another isolation (an upgrade from the
        unisolated backend, say) is rewritten to run under this backend's: the
        paths in its command and environment now point where its processes
        see the run dir and home. Its home stays as it is."""
        was = meta.get("isolation", "")
        if was == self.isolation:
            return meta
        old_run, old_home = self._places(sandbox_id, meta, was)
        new_run, new_home = self._places(sandbox_id, meta, self.isolation)

        def moved(value: str) -> str:
            for old, new in ((old_run, new_run), (old_home, new_home)):
                if value == old or value.startswith(old + "/"):
                    return new + value[len(old):]
            return value

        command = [moved(a) for a in meta["command"]]
        if command and self._foreign_python(command[0]):
            command[0] = self.python
        meta = {**meta, "command": command, "isolation": self.isolation,
                "env": {k: moved(v) for k, v in meta.get("env", {}).items()}}
        self._prepare(path, meta)
        procs.write_json(path / "meta.json", meta)
        return meta

    #: The python the bridge runs on in this backend's sandboxes.
    python = "python3"

    def _foreign_python(self, argv0: str) -> bool:
        return os.path.isabs(argv0) and os.path.basename(argv0).startswith("python")

    # --- lifecycle -----------------------------------------------------------------
    def create(
        self,
        agent_id: str,
        image: str,
        *,
        run_dir: str | None = None,
        limits: Limits | Mapping | None = None,
        network: str = "none",
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        command: Sequence[str] | None = None,
        cap_add: Sequence[str] = (),
        binds: Mapping[str, str] | None = None,
        tree_home: str | None = None,
    ) -> str:
        """As the base class says; ``tree_home`` (a tree's key, from
        :meth:`new_tree_home`): the home is laid over that prepared tree
        (sandboxes/backends/idmap.py), mounted at each start."""
        validate_create_args(agent_id, image, network)
        if tree_home is not None and not trees.is_key(tree_home):
            raise SandboxError(f"{tree_home!r} is not a prepared tree", permanent=True)
        tree = trees.Tree(tree_home, trees.top() / tree_home) if tree_home is not None else None
        with trees.using(tree) if tree is not None else contextlib.nullcontext(True) as ok:
            if not ok:
                raise SandboxError(f"the prepared tree {tree_home} is gone", permanent=False)
            return self._create(agent_id, image, run_dir=run_dir, limits=limits, network=network,
                                env=env, labels=labels, command=command, binds=binds,
                                tree_home=tree_home)

    def _create(self, agent_id: str, image: str, *, run_dir, limits, network, env, labels,
                command, binds, tree_home) -> str:
        try:
            limits = Limits.from_spec(limits)
        except (TypeError, ValueError) as exc:
            raise SandboxError(str(exc), permanent=True) from exc
        snapshot = None
        if image.startswith(SNAPSHOT_PREFIX):
            snapshot = self._snapshot_dir(image) / "home"
            if not snapshot.is_dir():
                raise ImageMissing(f"local snapshot {image} not found")
        sandbox_id = f"local-{uuid.uuid4().hex[:12]}"
        path = self._dir(sandbox_id)
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".new-", dir=self.root))
        try:
            if snapshot is not None:
                shutil.copytree(snapshot, staging / "home", symlinks=True)
            else:
                (staging / "home").mkdir(mode=0o700)
            own_run = run_dir is None
            run = staging / "run" if own_run else Path(run_dir).resolve()
            run.mkdir(mode=0o755, parents=True, exist_ok=True)
            meta = {
                "id": sandbox_id,
                "agent_id": str(agent_id),
                "image": image,
                "run_dir": str(path / "run") if own_run else str(run),
                "network": network,
                "limits": {"pids": limits.pids, "memory_mb": limits.memory_mb, "cpus": limits.cpus},
                "env": {str(k): str(v) for k, v in (env or {}).items()},
                "labels": {**(labels or {}), LABEL_MANAGED: "1", LABEL_AGENT: str(agent_id)},
                "command": list(command or PLACEHOLDER_COMMAND),
                "binds": {str(k): str(v) for k, v in (binds or {}).items()},
                "created": time.time(),
            }
            if tree_home is not None:
                meta["tree"] = tree_home
            self._prepare(staging, meta)
            (staging / "meta.json").write_text(json.dumps(meta, indent=1))
            os.rename(staging, path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return sandbox_id

    def start(self, sandbox_id: str) -> None:
        path = self._existing(sandbox_id)
        if self.status(sandbox_id) is SandboxStatus.RUNNING:
            return
        meta = self._adopt(sandbox_id, path, self._meta(sandbox_id))
        (path / "exit_code").unlink(missing_ok=True)
        # The socket of a dead bridge is NOT removed here: the next bridge
        # replaces it once it holds the session lock (sandboxes/bridge/server.py),
        # so a bridge that still lives somewhere keeps its socket.
        with open(path / "sandbox.log", "ab") as logf:
            proc, info = self._launch(sandbox_id, path, meta, logf)
        procs.write_json(path / "pid", info)
        # Reap it when it exits while we live (no zombie), and keep its exit code.
        threading.Thread(target=procs.reap, args=(proc, path / "exit_code"), daemon=True,
                         name=f"reap-{sandbox_id}").start()

    def _pid_info(self, sandbox_id: str) -> dict | None:
        """The pid record of the running process tree, or None."""
        try:
            info = json.loads((self._dir(sandbox_id) / "pid").read_text())
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None
        if not procs.alive(int(info["pid"]), info.get("starttime")):
            return None
        return info

    def _pid(self, sandbox_id: str) -> int | None:
        """The pid status() follows (the process tree's top), or None."""
        info = self._pid_info(sandbox_id)
        return int(info["pid"]) if info else None

    def status(self, sandbox_id: str) -> SandboxStatus:
        try:
            self._existing(sandbox_id)
        except SandboxNotFound:
            return SandboxStatus.MISSING
        return SandboxStatus.RUNNING if self._pid(sandbox_id) else SandboxStatus.EXITED

    def _running(self, sandbox_id: str) -> dict:
        meta = self._meta(sandbox_id)
        if self._pid(sandbox_id) is None:
            raise SandboxNotRunning(f"sandbox {sandbox_id} is not running; start it first")
        return meta

    def exec(
        self,
        sandbox_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 60,
        on_output: OnOutput | None = None,
    ) -> ExecResult:
        argv = [str(a) for a in argv]
        if not argv:
            raise ExecFailed("exec needs a command", permanent=True)
        meta = self._running(sandbox_id)
        t0 = time.monotonic()
        try:
            proc = self._exec_popen(sandbox_id, meta, argv, env)
        except FileNotFoundError as exc:
            return ExecResult(127, b"", f"{argv[0]}: command not found ({exc})".encode(),
                              time.monotonic() - t0)
        except OSError as exc:
            return ExecResult(126, b"", f"{argv[0]}: {exc}".encode(), time.monotonic() - t0)
        try:
            out, err = procs.communicate(proc, timeout, on_output)
        except subprocess.TimeoutExpired:
            procs.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            result = ExecResult(124, out, err, time.monotonic() - t0)
            raise ExecTimeout(f"{argv[0]!r} timed out after {timeout:g} s", result=result)
        return ExecResult(procs.exit_code(proc.returncode), out, err, time.monotonic() - t0)

    def _as_owner(self, sandbox_id: str) -> dict:
        """Popen arguments that run a host-side tool as the user owning the
        sandbox's files ({} for this process's own)."""
        return {}

    def read_home(self, sandbox_id: str) -> Iterator[bytes]:
        self._existing(sandbox_id)
        return self._tar_out(sandbox_id, self.host_home(sandbox_id))

    def _tar_out(self, sandbox_id: str, home: str) -> Iterator[bytes]:
        # cwd = the home, entered before the tool drops to the owner (who may
        # not pass through the data dir to reach it).
        with tempfile.TemporaryFile() as errf:
            proc = subprocess.Popen(home_tar_argv(".", by_name=True), cwd=home, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=errf,
                                    **self._as_owner(sandbox_id))
            code = yield from procs.drain(proc)  # an early stop: tar gets SIGPIPE
            errf.seek(0)
            stderr = errf.read()
        if code not in (0, 1):  # 1: "file changed as we read it", a warning
            raise ExecFailed(
                f"tar of the home dir of {sandbox_id} failed with exit code {code}: "
                + stderr.decode(errors="replace")[-2000:],
                exit_code=code, stderr=stderr,
            )

    def write_home(self, sandbox_id: str, tar_chunks: Iterable[bytes]) -> None:
        """Extract into the home, checked. Into the empty home of a sandbox
        that never ran (a restore, a fork: issue 17) GNU tar writes, fed by
        the checked stream, at the disk's speed: an empty directory holds no
        link to follow, and nothing of the sandbox runs yet. Any other
        write: :func:`safe_extract`, which checks every path on disk."""
        meta = self._meta(sandbox_id)
        home = self.host_home(sandbox_id)
        try:
            fd = self._fresh_home_fd(sandbox_id, home)
            if fd is not None:
                overlay.tar_in(sandbox_id, fd, tar_chunks, config.restore_caps())
            else:
                safe_extract(as_fileobj(tar_chunks), home, config.restore_caps())
        finally:
            self._after_write(sandbox_id, meta)

    def _fresh_home_fd(self, sandbox_id: str, home: str) -> int | None:
        path = self._dir(sandbox_id)
        if (path / "pid").exists() or (path / "exit_code").exists():
            return None  # it ran: its home is its own
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        if os.listdir(fd):
            os.close(fd)
            return None
        return fd

    def stop(self, sandbox_id: str, timeout: float = 10) -> None:
        self._existing(sandbox_id)
        info = self._pid_info(sandbox_id)
        if info is None:
            return
        self._terminate(sandbox_id, info, timeout)

    def _wait_gone(self, sandbox_id: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._pid(sandbox_id) is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def remove(self, sandbox_id: str) -> None:
        path = self._dir(sandbox_id)
        if not path.exists():
            return
        info = self._pid_info(sandbox_id)
        trash = self.root / f".rm-{sandbox_id}-{uuid.uuid4().hex[:6]}"
        try:
            # A home laid over a tree is unmounted first (the sandbox's own
            # mount namespace keeps its view until its processes die below):
            # removing the directory must never delete through the overlay.
            try:
                idmap.unmount(path / "home")
            except OSError as exc:  # removed all the same: deleting through it spares the tree
                log.warning("unmounting the home of %s failed: %s", sandbox_id, exc)
            # Gone for status() BEFORE its process dies: a driver that sees its
            # bridge drop must find the sandbox missing, never merely exited.
            os.rename(path, trash)
        except FileNotFoundError:
            trash = None
        self._kill_all(sandbox_id, info)
        if trash is not None:
            procs.rmtree(trash)

    # --- queries ---------------------------------------------------------------------
    def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxHandle]:
        out = []
        if not self.root.is_dir():
            return out
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith((".", "_")):
                continue
            try:
                meta = json.loads((entry / "meta.json").read_text())
            except (FileNotFoundError, ValueError, NotADirectoryError):
                continue
            if any(meta["labels"].get(k) != v for k, v in (labels or {}).items()):
                continue
            out.append(SandboxHandle(
                id=entry.name, backend=self.name, agent_id=meta["agent_id"], image=meta["image"],
                home=self.home(entry.name), status=self.status(entry.name),
                labels=dict(meta["labels"]),
            ))
        return out


def socket_name() -> str:
    import socket

    return socket.gethostname()
