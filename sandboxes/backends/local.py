"""Local backend: a directory and a detached process group per sandbox.

For machines without Docker. Layout under ``<root>`` (default
the data dir's ``sandboxes/``, sandboxes/config.py)::

    <id>/home/        the agent's home ($HOME for its processes)
    <id>/run/         the run dir ($ALINEO_RUN_DIR) unless create() was given one
    <id>/meta.json    what create() was asked for
    <id>/pid          {"pid", "starttime"} of the running command (its own session)
    <id>/exit_code    written when a command this process started exits
    <id>/sandbox.log  the command's stdout and stderr
    _snapshots/<tag>/home   copies made by commit()

The command runs as a process-group leader in its own session
(``start_new_session=True``), so it outlives the control plane; status comes
from the recorded pid, checked against the kernel's start time so that a
reused pid is never mistaken for the sandbox.

This is *not* isolation: processes run as the control plane's user with the
host's network and files. ``network`` and ``limits`` are recorded, not enforced.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence
from urllib.parse import quote

from sandboxes import config
from sandboxes.backends.base import (
    LABEL_AGENT,
    LABEL_MANAGED,
    PLACEHOLDER_COMMAND,
    ExecResult,
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

SNAPSHOT_PREFIX = "local-snapshot/"
_SNAPSHOTS = "_snapshots"


class LocalBackend(SandboxBackend):
    name = "local"
    image_hint = ("as a snapshot of the local backend: it runs on the host and knows only "
                  '"default" and its own snapshots (local-snapshot/<name>, made by a commit)')

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(config.data_dir().sandboxes if root is None else root).resolve()

    def bridge_command(self, run_dir: Path) -> list[str]:
        # -S: no site-packages of the host's python in the bridge (it is stdlib only).
        return [sys.executable, "-S", "-m", "bridge"]

    def snapshot_ref(self, kind: str, name: str) -> str:
        return f"{SNAPSHOT_PREFIX}{kind}-{name}"

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

    def _snapshot_dir(self, ref: str) -> Path:
        return self.root / _SNAPSHOTS / quote(ref[len(SNAPSHOT_PREFIX):], safe="")

    def home(self, sandbox_id: str) -> str:
        return str(self._dir(sandbox_id) / "home")

    def _env(self, sandbox_id: str, meta: dict, extra: Mapping[str, str] | None = None) -> dict:
        # A clean environment: nothing of the control plane's (its secrets) leaks in.
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            **meta.get("env", {}),
            **(extra or {}),
        }
        env.update(
            HOME=self.home(sandbox_id),
            ALINEO_AGENT_ID=meta["agent_id"],
            ALINEO_RUN_DIR=meta["run_dir"],
            ALINEO_SANDBOX_ID=sandbox_id,
        )
        return {str(k): str(v) for k, v in env.items()}

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
    ) -> str:
        validate_create_args(agent_id, image, network)
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
                "created": time.time(),
            }
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
        meta = self._meta(sandbox_id)
        (path / "exit_code").unlink(missing_ok=True)
        # A socket left by a dead bridge would refuse connections: clear it.
        (Path(meta["run_dir"]) / "bridge.sock").unlink(missing_ok=True)
        with open(path / "sandbox.log", "ab") as logf:
            try:
                proc = subprocess.Popen(
                    meta["command"],
                    cwd=self.home(sandbox_id),
                    env=self._env(sandbox_id, meta),
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise SandboxError(f"cannot start {meta['command'][0]!r}: {exc}", permanent=True) from exc
        _write_json(path / "pid", {"pid": proc.pid, "starttime": _starttime(proc.pid)})
        # Reap it when it exits while we live (no zombie), and keep its exit code.
        threading.Thread(target=_reap, args=(proc, path), daemon=True,
                         name=f"reap-{sandbox_id}").start()

    def _pid(self, sandbox_id: str) -> int | None:
        """The pid of the running command, or None."""
        path = self._dir(sandbox_id)
        try:
            info = json.loads((path / "pid").read_text())
        except (FileNotFoundError, ValueError):
            return None
        pid = int(info["pid"])
        state, starttime = _proc_stat(pid)
        if state is None or state in ("Z", "X"):
            return None
        if info.get("starttime") is not None and starttime is not None \
                and starttime != info["starttime"]:
            return None  # the pid was reused by another process
        return pid

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
    ) -> ExecResult:
        argv = [str(a) for a in argv]
        if not argv:
            raise ExecFailed("exec needs a command", permanent=True)
        meta = self._running(sandbox_id)
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv, cwd=self.home(sandbox_id), env=self._env(sandbox_id, meta, env),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            return ExecResult(127, b"", f"{argv[0]}: command not found ({exc})".encode(),
                              time.monotonic() - t0)
        except OSError as exc:
            return ExecResult(126, b"", f"{argv[0]}: {exc}".encode(), time.monotonic() - t0)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            result = ExecResult(124, out, err, time.monotonic() - t0)
            raise ExecTimeout(f"{argv[0]!r} timed out after {timeout:g} s", result=result)
        return ExecResult(_exit_code(proc.returncode), out, err, time.monotonic() - t0)

    def read_home(self, sandbox_id: str) -> Iterator[bytes]:
        home = self.home(sandbox_id)
        self._existing(sandbox_id)
        return self._tar_out(sandbox_id, home)

    def _tar_out(self, sandbox_id: str, home: str) -> Iterator[bytes]:
        with tempfile.TemporaryFile() as errf:
            proc = subprocess.Popen(home_tar_argv(home), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=errf)
            try:
                while True:
                    chunk = proc.stdout.read(1 << 20)
                    if not chunk:
                        break
                    yield chunk
            finally:
                proc.stdout.close()  # a consumer that stops early: tar gets SIGPIPE
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                code = proc.wait()
            errf.seek(0)
            stderr = errf.read()
        if code not in (0, 1):  # 1: "file changed as we read it", a warning
            raise ExecFailed(
                f"tar of the home dir of {sandbox_id} failed with exit code {code}: "
                + stderr.decode(errors="replace")[-2000:],
                exit_code=code, stderr=stderr,
            )

    def write_home(self, sandbox_id: str, tar_chunks: Iterable[bytes]) -> None:
        self._existing(sandbox_id)
        safe_extract(as_fileobj(tar_chunks), self.home(sandbox_id), config.restore_caps())

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
            shutil.copytree(self.home(sandbox_id), staging / "home", symlinks=True)
            _write_json(staging / "meta.json", {
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

    def stop(self, sandbox_id: str, timeout: float = 10) -> None:
        self._existing(sandbox_id)
        pid = self._pid(sandbox_id)
        if pid is None:
            return
        _killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._pid(sandbox_id) is not None:
            time.sleep(0.02)
        # The leader is gone or overdue: take the whole group down, as docker does.
        _killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self._pid(sandbox_id) is not None:
            time.sleep(0.02)

    def remove(self, sandbox_id: str) -> None:
        path = self._dir(sandbox_id)
        if not path.exists():
            return
        pid = self._pid(sandbox_id)
        trash = self.root / f".rm-{sandbox_id}-{uuid.uuid4().hex[:6]}"
        try:
            # Gone for status() BEFORE its process dies: a driver that sees its
            # bridge drop must find the sandbox missing, never merely exited.
            os.rename(path, trash)
        except FileNotFoundError:
            trash = None
        if pid is not None:
            _killpg(pid, signal.SIGKILL)
        if trash is not None:
            _rmtree(trash)

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
            _rmtree(self._snapshot_dir(image))


# --- process helpers ----------------------------------------------------------------
def _proc_stat(pid: int) -> tuple[str | None, int | None]:
    """(state letter, start time in clock ticks) of a pid; (None, None) if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None, None
    except OSError:
        try:  # not Linux: existence only
            os.kill(pid, 0)
            return "R", None
        except ProcessLookupError:
            return None, None
        except PermissionError:
            return "R", None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def _starttime(pid: int) -> int | None:
    return _proc_stat(pid)[1]


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _reap(proc: subprocess.Popen, path: Path) -> None:
    code = proc.wait()
    try:
        if path.is_dir():
            (path / "exit_code").write_text(str(_exit_code(code)))
    except OSError:
        pass


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _rmtree(path: Path) -> None:
    def onerror(func, p, exc_info):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)
