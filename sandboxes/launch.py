"""Launching a bridge in a sandbox: its run dir (the bridge's source, its
config, the socket's directory), the bridge command for the backend, the
setup snapshot it starts from, a fresh sandbox restored from a checkpoint or
seeded with a conversation, the wait-for inputs, and the revisions a
checkpoint records (which harness, which sandbox profile).

Nothing here knows about the database: the worker (sessions/worker/) decides
what to launch and journals what happened.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sandboxes import archive, config, harnesses
from sandboxes.backends import trees
from sandboxes.backends.base import LABEL_AGENT, SandboxBackend
from sandboxes.bridge.protocol import MAX_SOCKET_PATH
from sandboxes.errors import BackendUnavailable, SandboxError, SandboxNotFound
from sandboxes.setup import ensure_harness_layer, ensure_setup_image

log = logging.getLogger(__name__)

BRIDGE_SRC = Path(__file__).resolve().parent / "bridge"
#: The sandbox profile: what shapes the sandbox a checkpoint was taken in.
PROFILE_KEYS = ("image", "packages", "setup", "run_as", "network", "limits")


class LaunchError(SandboxError):
    """The sandbox cannot be launched as asked (a path too long, …)."""

    permanent_default = True


class CheckpointUnusable(SandboxError):
    """The chosen checkpoint cannot be extracted (unsafe, truncated, not zstd …):
    the caller falls back to rebuilding from the transcript."""

    permanent_default = True


@dataclass(frozen=True)
class Secret:
    """A bound credential: reaches the sandbox only through its environment
    (``inject`` "env"), or never (``inject`` "gateway": the model gateway
    adds it to the upstream request; docs/GATEWAY.md)."""

    name: str
    env: str
    value: str
    inject: str = "env"

    def __repr__(self) -> str:  # never print a value by accident
        return f"Secret(name={self.name!r}, env={self.env!r}, value=<hidden>)"


@dataclass(frozen=True)
class Launch:
    """What a sandbox for one agent is made from."""

    agent_id: str
    spec: dict
    secrets: tuple[Secret, ...] = ()


@dataclass(frozen=True)
class Fresh:
    """How a fresh sandbox starts: from a turn checkpoint (``checkpoint``, a
    path), or with its bridge seeded with a conversation (``seed``:
    ``{"messages", "turns"}``), or neither. ``max_turn`` is the transcript's
    newest turn: a restored session numbers its next turn after it.
    ``bseq_floor`` is the relay's journaled cursor in the checkpoint's session:
    a restored bridge numbers its next event after it, so an event the lost
    bridge emitted after the checkpoint (its ``bridge.started`` after a resume,
    say) never shares a number with one the restored bridge emits."""

    checkpoint: str | None = None
    seed: dict | None = None
    max_turn: int = 0
    labels: dict = field(default_factory=dict)
    bseq_floor: int = 0


# --- revisions -------------------------------------------------------------------------------


def harness_revision() -> str:
    """A hash of the bridge's source: which harness wrote a checkpoint."""
    global _REVISION
    if _REVISION is None:
        h = hashlib.sha256()
        for path in sorted(BRIDGE_SRC.rglob("*.py")):
            h.update(str(path.relative_to(BRIDGE_SRC)).encode() + b"\0" + path.read_bytes())
        _REVISION = h.hexdigest()[:16]
    return _REVISION


_REVISION: str | None = None


def profile_revision(spec: dict) -> str:
    """A hash of the sandbox profile (:data:`PROFILE_KEYS`) a checkpoint belongs to."""
    profile = json.dumps({k: spec.get(k) for k in PROFILE_KEYS}, sort_keys=True, default=str)
    return hashlib.sha256(profile.encode()).hexdigest()[:16]


# --- the run dir and the sandbox ------------------------------------------------------------


def run_dir_for(agent_id: str) -> Path:
    return config.data_dir().run(agent_id)


def socket_path(agent_id: str) -> Path:
    return run_dir_for(agent_id) / "bridge.sock"


#: Every model goes through the control plane's gateway (docs/GATEWAY.md): the
#: bridge calls it through its forwarder on 127.0.0.1 and the run dir's socket.
GATEWAY_SOCKET = "gateway.sock"


def through_gateway(model: str | None) -> bool:
    kind, _, name = (model or "demo").partition(":")
    return kind == "demo" or (kind in ("openai", "anthropic") and bool(name))


def prepare_run_dir(backend: SandboxBackend, launch: Launch, seed: dict | None,
                    harness: harnesses.HarnessInstall | None = None) -> list[str]:
    """A new run dir with a copy of the bridge and its config (never a secret
    value: it lives on the host's disk); returns the bridge's command.
    ``harness``: the installed tree of a harness other than the built-in one."""
    run = run_dir_for(launch.agent_id)
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True, exist_ok=True)
    shutil.copytree(BRIDGE_SRC, run / "bridge", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    spec = launch.spec
    bridge_config = {"agent_id": launch.agent_id, "model": spec.get("model", "demo"),
                     "tools": spec.get("tools"), "hooks": spec.get("hooks") or {},
                     # Names only: the bridge redacts these values from what it writes.
                     "redact": [{"name": s.name, "env": s.env} for s in launch.secrets]}
    if through_gateway(bridge_config["model"]):
        bridge_config["gateway"] = {"port": 0}  # its own loopback; the port is in tools' env
    if harness is not None:
        bridge_config["harness"] = harness.bridge_config(
            backend.bind_inside(str(harness.host_dir), harnesses.HARNESS_DIR))
    (run / "config.json").write_text(json.dumps(bridge_config, indent=1))
    sock = run / "bridge.sock"
    if len(str(sock).encode()) > MAX_SOCKET_PATH:
        raise LaunchError(f"the socket path {sock} is too long for AF_UNIX; "
                          "use a shorter ALINEO_DATA_DIR")
    backend.share_run_dir(run)
    command = backend.bridge_command(run)
    if seed is not None:
        (run / "seed.json").write_text(json.dumps(seed))
        command += ["--seed", f"{backend.run_dir_inside(run)}/seed.json"]
    return command


def create_sandbox(backend: SandboxBackend, launch: Launch, *, seed: dict | None = None,
                   labels: dict | None = None, start: bool = True) -> str:
    """Create (and start, unless ``start=False``) a sandbox whose command is the
    bridge: see :func:`_create`."""
    sid, _ = _create(backend, launch, seed=seed, labels=labels)
    if start:
        _start_or_remove(backend, sid)
    return sid


def _create(backend: SandboxBackend, launch: Launch, *, seed: dict | None = None,
            labels: dict | None = None, host_home: bool = False,
            tree: trees.Tree | None = None) -> tuple[str, str]:
    """Create a sandbox whose command is the bridge, from the spec's setup
    snapshot (or its image when it needs no setup). Orphans of an earlier attempt that crashed before its sandbox was
    recorded are removed first. ``seed`` is written to the run dir and passed
    as ``--seed``; a bridge that finds a session file ignores it, so restarts
    never seed twice. ``host_home``: ask the backend for a host-dir home
    (:meth:`SandboxBackend.new_host_home`); when it gives one, the bridge waits
    for :meth:`SandboxBackend.seal_home` before it reads it. ``tree``: ask
    for a home laid over that prepared tree first (:meth:`SandboxBackend.new_tree_home`).
    The second value returned says which home the sandbox got: ``"tree"``,
    ``"host"`` or ``""`` (its image's)."""
    for old in backend.list({LABEL_AGENT: launch.agent_id}):
        backend.remove(old.id)
    # Installed once per machine (cached by its inputs' hash), before the
    # sandbox exists: nothing downloads in a sandbox, which keeps network none.
    harness = harnesses.ensure_harness(launch.spec)
    command = prepare_run_dir(backend, launch, seed, harness)
    inside = backend.run_dir_inside(run_dir_for(launch.agent_id))
    env = {"PYTHONPATH": inside, "PYTHONDONTWRITEBYTECODE": "1"}
    env.update({s.env: s.value for s in launch.secrets if s.inject == "env"})
    all_labels = {**config.extra_labels(), **(labels or {})}
    spec = launch.spec
    image = ensure_setup_image(backend, spec, labels=config.extra_labels())
    binds = None
    if harness is not None:
        layered = ensure_harness_layer(backend, image, harness, harnesses.HARNESS_DIR,
                                       labels=config.extra_labels())
        # In the image (docker), or bound read-only from the host (local).
        binds = {str(harness.host_dir): harnesses.HARNESS_DIR} if layered == image else None
        image = layered
    home, how = {}, ""
    volume = None
    if tree is not None:
        volume = backend.new_tree_home(launch.agent_id, image, tree, labels=all_labels)
    if volume is not None:
        home, how = {"tree_home": volume}, "tree"
    elif host_home:
        home_dir = backend.new_host_home(launch.agent_id, image)
        if home_dir is not None:
            home, how, command = {"home_dir": home_dir}, "host", command + ["--wait-home"]
    try:
        sid = backend.create(launch.agent_id, image, run_dir=str(run_dir_for(launch.agent_id)),
                             limits=spec.get("limits"), network=spec.get("network") or "none",
                             env=env, labels=all_labels, command=command, binds=binds, **home)
    except BaseException:
        if volume is not None:
            backend.discard_tree_home(volume)
        raise
    return sid, how


def _start_or_remove(backend: SandboxBackend, sid: str) -> None:
    try:
        backend.start(sid)
    except BaseException:
        backend.remove(sid)
        raise


def build_fresh(backend: SandboxBackend, launch: Launch, fresh: Fresh) -> str:
    """A fresh sandbox for the restore ladder (restore, rebuild) or a fork:
    created, the checkpoint extracted safely into its home (CheckpointUnusable
    when it cannot be), started. Removed again on any failure.

    With a prepared tree of the checkpoint (sandboxes/backends/trees.py) the
    home is laid over it and nothing is extracted. With a host-dir home (the
    docker backend as root, issue 17) the sandbox is started while the
    checkpoint is extracted: its bridge waits for the seal, so nothing in the
    sandbox runs before its home is complete. A home that cannot be laid over
    its tree (a file system without overlays, a mount refused) is extracted
    instead: the tree is only ever a faster way to the same home."""
    tree = prepared_tree(backend, fresh.checkpoint)
    if tree is not None:
        try:
            return _build(backend, launch, fresh, tree)
        except (BackendUnavailable, SandboxNotFound, CheckpointUnusable):
            raise
        except (SandboxError, OSError) as exc:
            log.warning("agent %s: laying the home over the prepared tree failed, extracting "
                        "the checkpoint instead: %s", launch.agent_id, exc)
    return _build(backend, launch, fresh, None)


def _build(backend: SandboxBackend, launch: Launch, fresh: Fresh, tree: trees.Tree | None) -> str:
    sid, how = _create(backend, launch, seed=fresh.seed, labels=fresh.labels,
                       host_home=bool(fresh.checkpoint), tree=tree)
    waits = how == "host"
    try:
        if not fresh.checkpoint:
            backend.start(sid)
            return sid
        if how == "tree":
            _write_session(backend, sid, fresh, _read_session(fresh.checkpoint))
            backend.start(sid)
            return sid
        with ThreadPoolExecutor(1, thread_name_prefix="start") as pool:
            starting = pool.submit(backend.start, sid) if waits else None
            try:
                _restore_into(backend, sid, fresh)
            finally:
                if starting is not None:
                    starting.exception()  # never leave the start running on a failure
            if starting is None:
                backend.start(sid)
            else:
                starting.result()
                backend.seal_home(sid, str(run_dir_for(launch.agent_id)))
    except BaseException:
        backend.remove(sid)
        raise
    return sid


def prepared_tree(backend: SandboxBackend, checkpoint: str | None) -> trees.Tree | None:
    """The prepared tree of ``checkpoint`` when this backend lays homes over
    trees and it has one (the worker prepares them after each checkpoint)."""
    if not checkpoint or not backend.prepares_trees():
        return None
    return trees.find(checkpoint, backend.tree_owners)


def _read_session(checkpoint: str) -> dict | None:
    try:
        return archive.session_in(checkpoint)
    except Exception as exc:  # truncated, not zstd ...
        raise CheckpointUnusable(f"{type(exc).__name__}: {exc}") from exc


def _restore_into(backend: SandboxBackend, sid: str, fresh: Fresh) -> None:
    # The session file is read in a second pass over the checkpoint, on a
    # thread of its own while the extraction runs: that one mostly waits on
    # the disk (tar, the engine), and the pass would otherwise follow it.
    with ThreadPoolExecutor(1, thread_name_prefix="session-in") as pool:
        reading = pool.submit(archive.session_in, fresh.checkpoint)
        try:
            archive.restore_checkpoint(backend, sid, fresh.checkpoint)
            session = reading.result()
        except (BackendUnavailable, SandboxNotFound):
            raise
        except Exception as exc:  # unsafe, truncated, not zstd, past the restore caps ...
            raise CheckpointUnusable(f"{type(exc).__name__}: {exc}") from exc
    _write_session(backend, sid, fresh, session)


def _write_session(backend: SandboxBackend, sid: str, fresh: Fresh, session: dict | None) -> None:
    """Write the checkpoint's session file again when the transcript moved on
    after the checkpoint (its turn and event numbers)."""
    if session is None:
        return
    moved = False
    if int(session.get("turns") or 0) < fresh.max_turn:
        # Turns after the checkpoint were journaled (and settled): number the
        # next one after them, as the lost sandbox would have.
        session["turns"] = fresh.max_turn
        moved = True
    if int(session.get("bseq") or 0) < fresh.bseq_floor:
        session["bseq"] = fresh.bseq_floor  # events after the checkpoint were journaled too
        moved = True
    if moved:
        backend.write_home(sid, [archive.session_file_tar(session)])


# --- wait-for inputs -------------------------------------------------------------------------


def write_inputs(backend: SandboxBackend, agent_id: str, sid: str) -> None:
    """Write the agent's wait-for inputs (``*.txt`` and ``inputs.json``, kept
    on the host) into a fresh sandbox: staged in its run dir, then installed
    where the backend's agents read them. Agents with none are skipped."""
    src = config.data_dir().inputs(agent_id)
    if not src.is_dir():
        return
    files = sorted(p for p in src.iterdir() if p.is_file()
                   and (p.suffix == ".txt" or p.name == "inputs.json"))
    if not files:
        return
    run = run_dir_for(agent_id)
    try:
        stage_inputs(run, files)
        backend.install_inputs(sid, f"{backend.run_dir_inside(run)}/inputs")
    except (SandboxError, OSError) as exc:
        log.warning("agent %s: writing the inputs again failed: %s", agent_id, exc)


def stage_inputs(run: Path, files: list[Path]) -> None:
    """Put ``files`` in ``run/inputs``, readable by the sandbox. The run dir is
    the sandbox's to write, so nothing it planted there is followed: the files
    go into a directory made here (mkdtemp), opened O_EXCL|O_NOFOLLOW, and that
    directory is renamed over whatever ``inputs`` is now (a link is replaced,
    never written through)."""
    fresh = Path(tempfile.mkdtemp(prefix=".inputs-", dir=run))
    try:
        for p in files:
            fd = os.open(fresh / p.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(p.read_bytes())
                os.fchmod(out.fileno(), 0o644)  # whatever the umask (a private data dir's 077)
        fresh.chmod(0o755)
        _replace(fresh, run / "inputs")
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise


def _replace(fresh: Path, target: Path, attempts: int = 3) -> None:
    for _ in range(attempts):
        try:
            os.rename(fresh, target)  # over an empty dir or nothing
            return
        except OSError:
            if target.is_symlink() or not target.is_dir():
                target.unlink(missing_ok=True)
            else:
                shutil.rmtree(target)  # fd-based on Linux: never follows a link inside
    raise SandboxError(f"{target} keeps coming back; the inputs were not written")
