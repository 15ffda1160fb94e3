"""Docker backend: one container per sandbox, through docker-py.

Containers run under docker-init (``init=True``: stop takes 0.05 s instead of
10 s), with network ``none`` unless a spec asks for ``host``, every capability
dropped (callers add back what a step needs with ``cap_add``),
``no-new-privileges``, pids and memory limits, and the ``alineo.*`` labels.
The run dir is a bind mount through ``mounts=[Mount(...)]`` — never ``volumes=``,
which a later ``commit`` would bake into the image as an anonymous VOLUME.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from sandboxes import config
from sandboxes.backends import hosthome, overlay
from sandboxes.backends.docker_config import HOME, container_config, host_home_fd, volume_home_fd
from sandboxes.backends.docker_homes import HostHomes
from sandboxes.backends.docker_trees import TreeHomes, layer_dir, volume_of
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
    collect_output,
    home_tar_argv,
    validate_create_args,
)
from sandboxes.errors import (
    BackendUnavailable,
    ExecFailed,
    ExecTimeout,
    ImageMissing,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
)
from sandboxes.images import DEFAULT_IMAGE, resolve_image
from sandboxes.safe_tar import tar_of, validated_tar

log = logging.getLogger(__name__)

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
# Seconds added to an exec's own timeout before the HTTP read gives up.
_EXEC_GRACE_S = 15


class DockerBackend(HostHomes, TreeHomes, SandboxBackend):
    name = "docker"
    installs_packages = True
    restarts_in_place = True
    has_engine_images = True
    image_hint = "on the Docker engine (build, import or pull it first)"
    #: Where snapshots of each kind are committed (the repository of the tag).
    SNAPSHOT_REPOSITORIES = {"setup": "alineo-setup", "session": "alineo-snapshot",
                             "harness": "alineo-harness"}

    def __init__(self, client=None, *, api_timeout: float = 120, base_url: str | None = None):
        self._client = client
        # None: DOCKER_HOST (docker-py's standard variables) or the default socket.
        self._base_url = base_url
        self._api_timeout = api_timeout
        self._lock = threading.Lock()
        self._stream_client = None
        #: Sandboxes whose host-dir home this process made and has not sealed
        #: yet: the only ones written from the host (sandboxes/backends/hosthome.py).
        self._unsealed: dict[str, Path] = {}
        #: Upper layers of tree homes whose container has not started yet
        #: (sandboxes/backends/docker_trees.py): the only ones written from the host.
        self._unstarted: dict[str, Path] = {}
        self._homes_ok: bool | None = None
        self._image_homes: dict[str, bytes | None] = {}

    # --- capability hooks ---------------------------------------------------------------
    def run_dir_inside(self, run_dir: Path) -> str:
        return CONTAINER_RUN_DIR

    def bridge_command(self, run_dir: Path) -> list[str]:
        return ["python3", "-m", "bridge", "--run-dir", CONTAINER_RUN_DIR, "--home", HOME]

    def share_run_dir(self, run_dir: Path) -> None:
        """The container's root has no capabilities (no DAC_OVERRIDE): it reaches
        the bind-mounted run dir by its mode bits alone. A root control plane
        shares its uid: 0700. Any other must let it create its socket and read
        the bridge (1733, files a+r); the data dir's 0700 keeps other users out."""
        if os.geteuid() == 0:
            run_dir.chmod(0o700)
            return
        run_dir.chmod(0o1733)
        for path in run_dir.rglob("*"):
            path.chmod(path.stat().st_mode | (0o755 if path.is_dir() else 0o644))

    def install_inputs(self, sandbox_id: str, staged: str) -> None:
        """``<staged>/*.txt`` to ``/inputs/`` and ``<staged>/inputs.json`` to ``/inputs.json``."""
        script = (f"mkdir -p /inputs && for f in {staged}/*.txt; do "
                  "[ -e \"$f\" ] && cp \"$f\" /inputs/; done; "
                  f"[ -e {staged}/inputs.json ] && cp {staged}/inputs.json /inputs.json; true")
        self.exec(sandbox_id, ["sh", "-c", script], timeout=30)

    def snapshot_ref(self, kind: str, name: str) -> str:
        return f"{self.SNAPSHOT_REPOSITORIES[kind]}:{name}"  # a tag holds <= 128 chars

    # --- clients ---------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._connect(self._api_timeout, self._base_url)
        return self._client

    @property
    def host(self) -> str:
        return self._base_url or config.docker_host() or DEFAULT_DOCKER_HOST

    @property
    def stream_client(self):
        """A client without read timeout, for long execs and home streams."""
        if self._stream_client is None:
            with self._lock:
                if self._stream_client is None:
                    self._stream_client = self._connect(None, self._base_url)
        return self._stream_client

    @staticmethod
    def _connect(timeout, base_url: str | None = None):
        import docker

        try:
            if base_url is None:
                client = docker.from_env(timeout=timeout)
            else:  # another engine: TLS settings still come from DOCKER_TLS_VERIFY/DOCKER_CERT_PATH
                kwargs = docker.utils.kwargs_from_env()
                kwargs["base_url"] = base_url
                client = docker.DockerClient(timeout=timeout, **kwargs)
            client.ping()
        except Exception as exc:  # noqa: BLE001
            raise BackendUnavailable(
                f"no Docker engine answers ({exc.__class__.__name__}: {exc}); start one "
                "(.ci/docker-up as root) or set ALINEO_SANDBOX=local"
            ) from exc
        return client

    @contextmanager
    def _errors(self, sandbox_id: str | None = None, *, image: str | None = None):
        """Translate docker-py errors into SandboxError subclasses."""
        import docker.errors as de
        import requests

        try:
            yield
        except SandboxError:
            raise
        except de.ImageNotFound as exc:
            raise ImageMissing(f"image {image or ''!s} not found: {_explain(exc)}") from exc
        except de.NotFound as exc:
            if image and "image" in _explain(exc).lower():
                raise ImageMissing(f"image {image} not found: {_explain(exc)}") from exc
            raise SandboxNotFound(f"sandbox {sandbox_id} not found: {_explain(exc)}") from exc
        except de.APIError as exc:
            text = _explain(exc)
            if exc.status_code == 409 and ("not running" in text or "is paused" in text):
                raise SandboxNotRunning(
                    f"sandbox {sandbox_id} is not running; start it first ({text})"
                ) from exc
            permanent = exc.status_code is not None and 400 <= exc.status_code < 500
            raise SandboxError(f"docker: {text}", permanent=permanent) from exc
        except (requests.exceptions.ConnectionError, de.DockerException) as exc:
            raise BackendUnavailable(f"Docker engine unreachable: {exc}") from exc
        except requests.exceptions.ReadTimeout as exc:
            raise BackendUnavailable(f"Docker engine did not answer in time: {exc}") from exc

    # --- lifecycle -------------------------------------------------------------
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
        home_dir: str | None = None,
        tree_home: str | None = None,
    ) -> str:
        """As the base class says; ``home_dir`` (from :meth:`new_host_home`) is
        bind-mounted as the home, writable, and written from the host until
        :meth:`seal_home`; ``tree_home`` (a volume, from :meth:`new_tree_home`) is
        mounted as the home, its upper layer written from the host until
        :meth:`start`."""
        validate_create_args(agent_id, image, network)
        try:
            upper = layer_dir(tree_home) / "upper" if tree_home is not None else None
        except ValueError as exc:
            raise SandboxError(str(exc), permanent=True) from exc
        home = hosthome.owned(home_dir) if home_dir is not None else None
        if home_dir is not None and home is None:
            raise SandboxError(f"{home_dir} is not a host home made by this control plane",
                               permanent=True)
        wanted, image = image, resolve_image(image)
        try:
            limits = Limits.from_spec(limits)
        except (TypeError, ValueError) as exc:
            raise SandboxError(str(exc), permanent=True) from exc
        kwargs = container_config(
            image, limits=limits, network=network, run_dir=run_dir,
            env={**(env or {}), "HOME": HOME, "ALINEO_AGENT_ID": str(agent_id),
                 "ALINEO_RUN_DIR": CONTAINER_RUN_DIR},
            labels={**(labels or {}), LABEL_MANAGED: "1", LABEL_AGENT: str(agent_id)},
            command=list(command or PLACEHOLDER_COMMAND), cap_add=list(cap_add), binds=binds,
            home_dir=str(home) if home else None, home_volume=tree_home)
        with self._errors(image=image):
            if not self.image_exists(image):
                if wanted == DEFAULT_IMAGE:
                    raise ImageMissing(f"the base image {image} is not built: run "
                                       "`manage.py build_base_image`", permanent=False)
                raise ImageMissing(f"image {image} not found (build it, or check the spec)")
            container = self.client.containers.create(**kwargs)
        with self._lock:
            if home is not None:
                self._unsealed[container.id] = home
            if upper is not None:
                self._unstarted[container.id] = upper
        return container.id

    def start(self, sandbox_id: str) -> None:
        with self._lock:
            self._unstarted.pop(sandbox_id, None)  # from now on the sandbox writes its layer
        with self._errors(sandbox_id):
            self.client.api.start(sandbox_id)

    def status(self, sandbox_id: str) -> SandboxStatus:
        try:
            with self._errors(sandbox_id):
                state = self.client.api.inspect_container(sandbox_id)["State"]
        except SandboxNotFound:
            return SandboxStatus.MISSING
        except SandboxError:
            return SandboxStatus.UNKNOWN
        return _map_state(state.get("Status", ""))

    def inspect(self, sandbox_id: str) -> dict:
        """The engine's full description of the container (for tests and admin)."""
        with self._errors(sandbox_id):
            return self.client.api.inspect_container(sandbox_id)

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
        wrapped = argv
        if timeout is not None:
            # coreutils `timeout` kills the command inside the sandbox, so it
            # does not keep running after we gave up on it.
            wrapped = ["timeout", "-k", "5", f"{float(timeout):g}", *argv]
        short = (timeout is not None and timeout + _EXEC_GRACE_S < self._api_timeout
                 and on_output is None)
        client = self.client if short else self.stream_client
        t0 = time.monotonic()
        with self._errors(sandbox_id):
            exec_id = client.api.exec_create(
                sandbox_id, wrapped, stdout=True, stderr=True, environment=dict(env or {}),
                workdir=HOME,
            )["Id"]
            if on_output is None:
                out, err = client.api.exec_start(exec_id, demux=True)
            else:
                frames = client.api.exec_start(exec_id, demux=True, stream=True)
                out, err = collect_output(frames, on_output)
            code = client.api.exec_inspect(exec_id)["ExitCode"]
        duration = time.monotonic() - t0
        result = ExecResult(int(code if code is not None else -1), out or b"", err or b"", duration)
        if timeout is not None and code in (124, 137) and duration >= timeout - 0.05:
            raise ExecTimeout(f"{argv[0]!r} timed out after {timeout:g} s", result=result)
        return result

    def read_home(self, sandbox_id: str) -> Iterator[bytes]:
        """The home as tar. Fast path (control plane is root on the engine's
        host, overlay2, container running): GNU tar on the host over the
        container's merged dir — the same files exec'd tar would see, without
        streaming them through dockerd (about 2x faster for 50 MB). Otherwise,
        and whenever that cannot be set up safely: exec'd tar in the container.
        A host-dir home (sandboxes/backends/hosthome.py) is read where it is."""
        fd = self._host_fd(sandbox_id, host_home_fd)
        if fd is None:
            fd = self._host_fd(sandbox_id, volume_home_fd)
        if fd is None:
            fd = self._host_fd(sandbox_id, overlay.merged_home_fd)
        if fd is not None:
            return overlay.tar_out(sandbox_id, fd)
        client = self.stream_client
        with self._errors(sandbox_id):
            exec_id = client.api.exec_create(
                sandbox_id, home_tar_argv(HOME), stdout=True, stderr=True, workdir=HOME
            )["Id"]
            stream = client.api.exec_start(exec_id, stream=True, demux=True)
        return self._drain_tar(sandbox_id, client, exec_id, stream)

    def _host_fd(self, sandbox_id: str, opener) -> int | None:
        """``opener(info, HOME)`` (sandboxes/backends/overlay.py) when the
        host-side fast paths apply here (root on the engine's own host), else
        None; any doubt is None too, and the caller takes the engine's path."""
        if not config.docker_host_tar() or os.geteuid() != 0:
            return None
        if not self.host.startswith("unix://"):  # another machine's engine: its disk is not here
            return None
        try:
            return opener(self.client.api.inspect_container(sandbox_id), HOME)
        except Exception:  # noqa: BLE001 - any doubt: the engine's path
            return None

    def _drain_tar(self, sandbox_id, client, exec_id, stream) -> Iterator[bytes]:
        errors = []
        with self._errors(sandbox_id):
            for out, err in stream:
                if err:
                    errors.append(err)
                if out:
                    yield out
            code = client.api.exec_inspect(exec_id)["ExitCode"]
        if code not in (0, 1):  # 1: "file changed as we read it", a warning
            raise ExecFailed(
                f"tar of the home dir of {sandbox_id[:12]} failed with exit code {code}: "
                + b"".join(errors).decode(errors="replace")[-2000:],
                exit_code=code, stderr=b"".join(errors),
            )
        if code == 1:
            log.warning("home tar of %s: %s", sandbox_id[:12],
                        b"".join(errors).decode(errors="replace")[-500:])

    def write_home(self, sandbox_id: str, tar_chunks: Iterable[bytes]) -> None:
        """Stream the tar to the engine (``put_archive``; works on created and
        stopped containers too) while checking it: each entry is forwarded only
        after its header passed the extraction rules, so the first unsafe entry
        aborts the upload before any of its bytes reach the engine (entries
        before it stay, all inside the home). Checking while streaming saves
        the spool-then-check pass (~0.3 s for 5,000 files).

        A container that was created and never ran (a restore, a fork), with
        the control plane root on the engine's host: the same checked stream
        goes to GNU tar on the host, straight into the container's writable
        layer (sandboxes/backends/overlay.py), at the disk's speed. A host-dir
        home this process made and has not sealed is written where it is; so
        is the upper layer of a tree home before its container's first start."""
        if self.write_upper(sandbox_id, tar_chunks):
            return
        with self._lock:
            unsealed = self._unsealed.get(sandbox_id)
        fd = hosthome.open_dir(unsealed) if unsealed is not None else None
        if fd is None:
            fd = self._host_fd(sandbox_id, overlay.upper_home_fd)
        if fd is not None:
            return overlay.tar_in(sandbox_id, fd, tar_chunks, config.restore_caps())
        with self._errors(sandbox_id):
            self.stream_client.api.put_archive(sandbox_id, HOME, validated_tar(
                tar_chunks, config.restore_caps()))

    def add_tree(self, sandbox_id: str, host_dir: str, inside: str) -> None:
        """Copy a host directory (ours: an installed harness) to ``inside``
        of a created container, streamed as a tar (``put_archive``)."""
        with self._errors(sandbox_id):
            self.stream_client.api.put_archive(sandbox_id, "/", tar_of(host_dir, inside))

    def commit(self, sandbox_id: str, tag: str, *,
               labels: Mapping[str, str] | None = None) -> str:
        """``docker commit`` (paused while it runs). The image keeps the
        container's labels (the engine merges them) plus ``labels``."""
        repository, _, version = tag.rpartition(":")
        if not repository or "/" in version:
            repository, version = tag, "latest"
        conf = {"Labels": {str(k): str(v) for k, v in labels.items()}} if labels else None
        with self._errors(sandbox_id):
            self.stream_client.api.commit(
                sandbox_id, repository=repository, tag=version, pause=True, conf=conf,
            )
        return f"{repository}:{version}"

    def stop(self, sandbox_id: str, timeout: float = 10) -> None:
        with self._errors(sandbox_id):
            self.client.api.stop(sandbox_id, timeout=int(timeout))

    def remove(self, sandbox_id: str) -> None:
        """Remove the container, and its host-dir or tree home when it has one."""
        home = volume = None
        try:
            with self._errors(sandbox_id):
                mounts = self.client.api.inspect_container(sandbox_id).get("Mounts")
                home, volume = hosthome.of_mounts(mounts, HOME), volume_of(mounts, HOME)
                # v=True: never leak an anonymous volume.
                self.client.api.remove_container(sandbox_id, force=True, v=True)
        except SandboxNotFound:
            pass
        except SandboxError as exc:
            if "already in progress" not in str(exc):
                raise
            home = volume = None
        with self._lock:
            self._unsealed.pop(sandbox_id, None)
            self._unstarted.pop(sandbox_id, None)
        hosthome.remove(home)
        self.discard_tree_home(volume)

    def home(self, sandbox_id: str) -> str:
        return HOME

    # --- queries ---------------------------------------------------------------
    def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxHandle]:
        wanted = {LABEL_MANAGED: "1", **(labels or {})}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        with self._errors():
            rows = self.client.api.containers(all=True, filters=filters)
        return [
            SandboxHandle(
                id=row["Id"], backend=self.name, agent_id=row["Labels"].get(LABEL_AGENT, ""),
                image=row.get("Image", ""), home=HOME, status=_map_state(row.get("State", "")),
                labels=dict(row["Labels"]),
            )
            for row in rows
        ]

    def image_exists(self, image: str) -> bool:
        import docker.errors as de

        image = resolve_image(image)
        with self._errors(image=image):
            try:
                self.client.api.inspect_image(image)
            except de.NotFound:
                return False
        return True

    def image_id(self, image: str) -> str:
        import docker.errors as de

        image = resolve_image(image)
        with self._errors(image=image):
            try:
                return self.client.api.inspect_image(image)["Id"]
            except de.NotFound as exc:
                raise ImageMissing(f"image {image} not found") from exc

    def remove_image(self, image: str) -> None:
        import docker.errors as de

        with self._errors(image=image):
            try:
                self.client.api.remove_image(image, force=True)
            except de.NotFound:
                pass


def _map_state(state: str) -> SandboxStatus:
    state = (state or "").lower()
    if state in ("running", "restarting", "paused"):
        return SandboxStatus.RUNNING
    if state in ("created", "exited", "dead"):
        return SandboxStatus.EXITED
    if state == "removing":
        return SandboxStatus.MISSING
    return SandboxStatus.UNKNOWN


def _explain(exc) -> str:
    return str(getattr(exc, "explanation", None) or exc)

