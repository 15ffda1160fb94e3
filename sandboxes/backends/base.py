"""The sandbox backend contract: a small base class, its capability hooks and
its return types. The registry (which backend a process uses) is
sandboxes/backends/__init__.py; docker.py and hostdir.py (which local.py and
unisolated.py extend) import this module.

A *sandbox* is where an agent runs: a container (docker backend) or a directory
plus a detached bubblewrap sandbox (local backend; unisolated: a plain process group). Both backends offer the same
verbs, so everything above them (checkpoints, the restore ladder, the worker)
is written once:

    create(agent_id, image, *, run_dir, limits, network, env, labels) -> sandbox id
    start(id) · status(id) -> SandboxStatus · exec(id, argv, *, env, timeout, on_output)
        -> ExecResult
    read_home(id) -> iterator of tar bytes · write_home(id, tar bytes iterator)
    commit(id, tag) -> snapshot ref · stop(id) · remove(id) · home(id) -> path

Where the backends differ, callers ask a capability (``installs_packages``,
``restarts_in_place``, ``run_dir_inside()`` …), never the backend's name.
Every failure is a :class:`sandboxes.errors.SandboxError`.
"""

from __future__ import annotations

import abc
import enum
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from sandboxes.errors import ImageMissing, SandboxError

#: The placeholder sandbox command until the bridge exists: a long-running,
#: stdlib-only python process. Backends take ``command=`` to run something else.
PLACEHOLDER_COMMAND: tuple[str, ...] = (
    "python3",
    "-c",
    "import time\nwhile True:\n    time.sleep(3600)",
)

#: Package caches left out of every home tar: they are big, and any package
#: manager fetches them again. `.rustup` is kept on purpose: it holds
#: toolchains, not caches.
HOME_EXCLUDES: tuple[str, ...] = (
    "--exclude=./.cache",
    "--exclude=./.npm",
    "--exclude=./.cargo/registry",
    "--exclude=./.cargo/git",
    "--exclude=./go/pkg/mod",
    "--exclude=*/__pycache__",
)

#: Label put on every sandbox Alineo creates; ``alineo.agent`` names its agent.
LABEL_MANAGED = "alineo.managed"
LABEL_AGENT = "alineo.agent"

#: Where the run dir (bridge socket, wait-for inputs) is seen inside a container.
CONTAINER_RUN_DIR = "/run/alineo"

NETWORKS = ("none", "host")

#: exec(…, on_output=): called with ("stdout" | "stderr", chunk) as output arrives.
#: Such an exec's ExecResult keeps only the last TAIL_KEEP bytes a stream, so a
#: command printing without end cannot fill the control plane's memory.
OnOutput = Callable[[str, bytes], None]
TAIL_KEEP = 1024 * 1024


class Tail:
    """The last TAIL_KEEP bytes of a stream of chunks."""

    def __init__(self):
        self.chunks: list[bytes] = []
        self.size = 0

    def add(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)
        while len(self.chunks) > 1 and self.size - len(self.chunks[0]) >= TAIL_KEEP:
            self.size -= len(self.chunks.pop(0))

    def value(self) -> bytes:
        return b"".join(self.chunks)[-TAIL_KEEP:]


def collect_output(frames: Iterable[tuple[bytes | None, bytes | None]],
                   on_output: OnOutput) -> tuple[bytes, bytes]:
    """Demultiplexed (stdout, stderr) frames, each handed to ``on_output``; the tails."""
    out, err = Tail(), Tail()
    for o, e in frames:
        if o:
            out.add(o)
            on_output("stdout", o)
        if e:
            err.add(e)
            on_output("stderr", e)
    return out.value(), err.value()


def home_tar_argv(home: str, *, by_name: bool = False) -> list[str]:
    """The `tar` that streams a home dir out, package caches excluded.
    GNU tar's exit code 1 ("file changed as we read it") is a warning.

    ``by_name`` (the host's GNU tar only: an image's tar may be busybox's)
    orders each directory's entries by name, so the bridge's ``.alineo``
    comes before the rest of the home and a restore finds the session file
    in the first entries of a checkpoint instead of after reading all of it
    (sandboxes/archive.py ``session_in``)."""
    order = ["--sort=name"] if by_name else []
    return ["tar", "-C", home, "-cf", "-", *order, *HOME_EXCLUDES, "."]


def home_untar_argv(home: str) -> list[str]:
    return ["tar", "-C", home, "-xf", "-"]


class SandboxStatus(str, enum.Enum):
    RUNNING = "running"   # its command runs: exec works
    EXITED = "exited"     # it exists (disk intact) but does not run: start() it
    MISSING = "missing"   # it does not exist (removed, reaped): restore or rebuild
    UNKNOWN = "unknown"   # cannot tell now (the engine does not answer)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox. The docker backend enforces them through
    the container's cgroup; the local backend through cgroup v2 or rlimits
    (sandboxes/backends/limits.py); the unisolated backend records them only."""

    pids: int = 256
    memory_mb: int = 1024
    cpus: float | None = None

    def __post_init__(self):
        for name in ("pids", "memory_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"limits.{name} must be a positive integer, not {value!r}")
        if self.cpus is not None and (
            isinstance(self.cpus, bool) or not isinstance(self.cpus, (int, float)) or self.cpus <= 0
        ):
            raise ValueError(f"limits.cpus must be a positive number, not {self.cpus!r}")

    @classmethod
    def from_spec(cls, value: Limits | Mapping | None) -> Limits:
        """Limits from a spec's ``"limits"`` object (missing keys take defaults).
        Unknown keys and bad values raise ValueError naming the field."""
        if value is None:
            return cls()
        if isinstance(value, Limits):
            return value
        unknown = sorted(set(value) - {"pids", "memory_mb", "cpus"})
        if unknown:
            raise ValueError(f"limits: unknown keys {', '.join(unknown)}")
        return cls(**dict(value))


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


@dataclass(frozen=True)
class SandboxHandle:
    """What a backend knows about one sandbox (for listings and logs)."""

    id: str
    backend: str
    agent_id: str
    image: str
    home: str
    status: SandboxStatus
    labels: dict = field(default_factory=dict)


class SandboxBackend(abc.ABC):
    """One way of running sandboxes. Subclasses: docker, local."""

    name: str = ""

    #: The sandbox has a root file system of its own: Debian packages can be
    #: installed, users added, files written outside the home (``/inputs``).
    installs_packages: bool = False
    #: ``start()`` of an exited sandbox brings back the whole sandbox with its
    #: disk (the ladder's *restart* rung); otherwise an exited sandbox only
    #: means its bridge process ended, and starting it is a *resume*.
    restarts_in_place: bool = False
    #: Where a spec's ``image`` must come from, for the error when it does not exist.
    image_hint: str = ""
    #: Its images live in an engine, outside the data dir: a backup saves them.
    has_engine_images: bool = False
    #: Its sandboxes are a boundary (their own files, uid, network, limits);
    #: False only for the unisolated backend, which the dashboard warns about.
    isolated: bool = True

    @property
    def host(self) -> str:
        """Which engine this backend drives, as recorded with each sandbox
        (Agent.sandbox_host) so that any worker can reach the sandbox again."""
        return f"{self.name}:{socket.gethostname()}"

    # --- capability hooks (defaults fit a sandbox that shares the host's paths) ----------
    def run_dir_inside(self, run_dir: Path) -> str:
        """The path under which the sandbox's processes see ``run_dir``."""
        return str(run_dir)

    def bridge_command(self, run_dir: Path) -> list[str]:
        """The command that runs the bridge copied into ``run_dir``; it finds
        its run dir and home in ``$ALINEO_RUN_DIR`` and ``$HOME``, which
        :meth:`create` sets."""
        return ["python3", "-m", "bridge"]

    def bind_inside(self, host_dir: str, inside: str) -> str:
        """Where a ``binds`` directory is seen by the sandbox's processes."""
        return inside

    def share_run_dir(self, run_dir: Path) -> None:
        """Make ``run_dir`` usable by the sandbox's processes (before create)."""

    def new_host_home(self, agent_id: str, image: str) -> str | None:
        """A fresh host directory, holding what ``image`` has in its home, to
        give :meth:`create` as ``home_dir`` for a sandbox whose home is written
        before its bridge starts (a restore, a fork: issue 17), or None when
        this backend has none to offer (then the home is written through
        :meth:`write_home` before :meth:`start`)."""
        return None

    #: Who owns a prepared tree's files (sandboxes/backends/trees.py ``KEEP``/``ROOT``).
    tree_owners = "keep"

    def prepares_trees(self) -> bool:
        """Whether a restore or a fork here can lay the new home over a
        prepared tree (sandboxes/backends/trees.py) instead of extracting the
        checkpoint: then the worker prepares the tree of every new checkpoint."""
        return False

    def new_tree_home(self, agent_id: str, image: str, tree,
                      labels: dict | None = None) -> str | None:
        """A home laid over ``tree`` (a :class:`sandboxes.backends.trees.Tree`),
        labelled with ``labels``, to give :meth:`create` as ``tree_home``; None when this backend has
        none to offer (then the checkpoint is extracted)."""
        return None

    def discard_tree_home(self, token: str) -> None:
        """Undo :meth:`new_tree_home` when :meth:`create` then failed."""

    def tree_keys_in_use(self) -> set[str]:
        """The prepared trees the homes of this backend are laid over."""
        return set()

    def seal_home(self, sandbox_id: str, run_dir: str) -> None:
        """The ``home_dir`` given to :meth:`create` is complete: the bridge,
        started with ``--wait-home``, may read it now."""

    def sweep_homes(self) -> list[str]:
        """Remove the host-dir homes no sandbox has any more; their names."""
        return []

    def install_inputs(self, sandbox_id: str, staged: str) -> None:
        """Copy wait-for inputs staged in the run dir (``staged``, as seen
        inside) to where the agent reads them; a no-op where the run dir
        itself is where they are read."""

    def snapshot_ref(self, kind: str, name: str) -> str:
        """The tag :meth:`commit` is given for a snapshot of ``kind``
        ("setup", "session") named ``name``."""
        return f"{kind}-{name}"

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot create sandboxes on this machine at all (a
        missing program, no backend chosen), or None. An engine that does not
        answer right now is not such a reason: calls raise BackendUnavailable."""
        return None

    def restart_reason(self, sandbox_id: str) -> str | None:
        """A reason to stop and start this existing sandbox in place before it
        is used again, its disk kept (it was made with another isolation than
        this backend gives now), or None. The ladder journals it as a restart."""
        return None

    # --- lifecycle -----------------------------------------------------------
    @abc.abstractmethod
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
    ) -> str:
        """Create (not start) a sandbox for ``agent_id`` from ``image`` (a base
        image or a snapshot ref from :meth:`commit`). ``run_dir`` is a host
        directory seen as ``$ALINEO_RUN_DIR`` inside. ``binds`` maps host
        directories to where they are seen inside, read-only (an installed
        harness, sandboxes/harnesses.py). Returns the sandbox id."""

    @abc.abstractmethod
    def start(self, sandbox_id: str) -> None:
        """Start the sandbox's command; a no-op when it already runs."""

    @abc.abstractmethod
    def status(self, sandbox_id: str) -> SandboxStatus: ...

    @abc.abstractmethod
    def exec(
        self,
        sandbox_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 60,
        on_output: OnOutput | None = None,
    ) -> ExecResult:
        """Run a one-shot command in the running sandbox, cwd = home.
        ``on_output`` (when given) gets the output as it arrives, as well.
        Raises SandboxNotRunning / SandboxNotFound; ExecTimeout on timeout."""

    @abc.abstractmethod
    def read_home(self, sandbox_id: str) -> Iterator[bytes]:
        """The home dir as an uncompressed tar stream (entries ``./…``), package
        caches excluded. Raises ExecFailed at the end if tar failed."""

    @abc.abstractmethod
    def write_home(self, sandbox_id: str, tar_chunks: Iterable[bytes]) -> None:
        """Extract an uncompressed tar stream into the home dir, refusing entries
        that would escape it (UnsafeArchive)."""

    @abc.abstractmethod
    def commit(self, sandbox_id: str, tag: str, *, labels: Mapping[str, str] | None = None) -> str:
        """Snapshot the sandbox; returns a ref that :meth:`create` takes as image.
        ``labels`` are put on the snapshot (docker: image labels)."""

    @abc.abstractmethod
    def stop(self, sandbox_id: str, timeout: float = 10) -> None: ...

    @abc.abstractmethod
    def remove(self, sandbox_id: str) -> None:
        """Remove the sandbox and its disk. Removing a missing sandbox is a no-op."""

    @abc.abstractmethod
    def home(self, sandbox_id: str) -> str:
        """The home dir's path as seen by the sandbox's processes."""

    # --- queries -------------------------------------------------------------
    @abc.abstractmethod
    def list(self, labels: Mapping[str, str] | None = None) -> list[SandboxHandle]:
        """Every sandbox Alineo made on this backend, optionally filtered by labels."""

    @abc.abstractmethod
    def image_exists(self, image: str) -> bool: ...

    @abc.abstractmethod
    def remove_image(self, image: str) -> None:
        """Remove a snapshot made by :meth:`commit`; a missing one is a no-op."""

    def image_id(self, image: str) -> str:
        """A stable identity of what ``image`` holds now (docker: the image id),
        so a setup snapshot built on it is rebuilt when the image changes.
        Raises ImageMissing when it does not exist."""
        if not self.image_exists(image):
            raise ImageMissing(f"image {image} not found")
        return image

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def validate_create_args(agent_id: str, image: str, network: str) -> None:
    if not agent_id or not isinstance(agent_id, str):
        raise SandboxError("agent_id must be a non-empty string", permanent=True)
    if not image or not isinstance(image, str):
        raise SandboxError("image must be a non-empty string", permanent=True)
    if network not in NETWORKS:
        raise SandboxError(
            f"network must be one of {', '.join(NETWORKS)}, not {network!r}", permanent=True
        )
