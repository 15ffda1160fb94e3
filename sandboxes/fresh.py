"""Building a fresh sandbox for the restore ladder (rungs restore and
rebuild, and a fork's first sandbox), in a worker thread: create it from the
setup snapshot, extract the chosen turn checkpoint into its home (or seed the
bridge with the transcript's conversation), write the wait-for inputs again,
start it. sandboxes.ladder decides the plan and journals the outcome."""

from __future__ import annotations

import io
import json
import logging
import shutil
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from sandboxes.backends.base import CONTAINER_RUN_DIR
from sandboxes.errors import BackendUnavailable, SandboxError, SandboxNotFound

log = logging.getLogger("sandboxes.ladder")

SESSION_MEMBER = ".alineo/session.json"


class CheckpointUnusable(Exception):
    """The chosen checkpoint cannot be extracted: fall back to rebuild."""


@dataclass
class Plan:
    rung: str                      # restore | rebuild
    reason: str
    checkpoint: dict | None = None  # {id, path, turn}
    seed: dict | None = None        # {"messages", "turns"} for rebuild
    max_turn: int = 0
    # From the checkpoint's session file:
    cp_session: str = ""
    cp_head: int = 0
    cp_current_turn: int | None = None
    extra: dict = field(default_factory=dict)


def _build(backend, info, run: Path, plan: Plan) -> str:
    from sandboxes.provisioning import _create_sandbox

    sid = _create_sandbox(backend, info, run, seed=plan.seed, start=False)
    try:
        if plan.checkpoint:
            try:
                _restore_into(backend, sid, plan)
            except (BackendUnavailable, SandboxNotFound):
                raise
            except Exception as exc:  # unsafe, truncated, not zstd ...
                raise CheckpointUnusable(f"{type(exc).__name__}: {exc}") from exc
        backend.start(sid)
    except BaseException:
        backend.remove(sid)
        raise
    return sid


def _restore_into(backend, sid: str, plan: Plan) -> None:
    path = plan.checkpoint["path"]
    try:
        from sandboxes.checkpoints import restore_checkpoint
    except ImportError:  # pragma: no cover - the older checkpoints module
        from sandboxes.checkpoints import unpack_home

        unpack_home(backend, sid, Path(path))
    else:
        restore_checkpoint(backend, sid, path)
    session = _session_of(path)
    if session is not None and int(session.get("turns") or 0) < plan.max_turn:
        # Turns after the checkpoint were journaled (and settled): number the
        # next one after them, as the lost sandbox would have.
        session["turns"] = plan.max_turn
        backend.write_home(sid, [_one_file_tar(SESSION_MEMBER, json.dumps(session).encode())])


def _session_of(path) -> dict | None:
    """The bridge's session file inside a checkpoint (zstd tar), or None."""
    import zstandard

    try:
        with open(path, "rb") as fh:
            reader = zstandard.ZstdDecompressor().stream_reader(fh)
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for member in tar:
                    name = member.name.removeprefix("./")
                    if name == SESSION_MEMBER and member.isfile():
                        return json.loads(tar.extractfile(member).read())
    except (OSError, ValueError, tarfile.TarError, zstandard.ZstdError) as exc:
        log.warning("cannot read the session file in %s: %s", path, exc)
    return None


def _one_file_tar(name: str, payload: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        d = tarfile.TarInfo("./.alineo")
        d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o700, int(time.time())
        tar.addfile(d)
        ti = tarfile.TarInfo(f"./{name}")
        ti.size, ti.mode, ti.mtime = len(payload), 0o600, int(time.time())
        tar.addfile(ti, io.BytesIO(payload))
    return buf.getvalue()


def inputs_dir(agent_id: str) -> Path:
    """Where an agent's wait-for inputs are kept on the host (``*.txt`` and
    ``inputs.json``), so every fresh sandbox gets them again."""
    return Path(settings.DATA_DIR) / "inputs" / agent_id


def _write_inputs(backend, agent_id: str, sid: str) -> None:
    """Write the agent's wait-for inputs into a fresh sandbox: docker
    ``/inputs/*.txt`` and ``/inputs.json``; local (no root file system of its
    own) ``$ALINEO_RUN_DIR/inputs/``. Agents with none are skipped."""
    src = inputs_dir(agent_id)
    if not src.is_dir():
        return
    files = sorted(p for p in src.iterdir() if p.is_file()
                   and (p.suffix == ".txt" or p.name == "inputs.json"))
    if not files:
        return
    from sandboxes.provisioning import run_dir_for

    staged = run_dir_for(agent_id) / "inputs"
    staged.mkdir(parents=True, exist_ok=True)
    for p in files:
        shutil.copy2(p, staged / p.name)
    if backend.name == "docker":
        script = (f"mkdir -p /inputs && for f in {CONTAINER_RUN_DIR}/inputs/*.txt; do "
                  "[ -e \"$f\" ] && cp \"$f\" /inputs/; done; "
                  f"[ -e {CONTAINER_RUN_DIR}/inputs/inputs.json ] && "
                  f"cp {CONTAINER_RUN_DIR}/inputs/inputs.json /inputs.json; true")
        try:
            backend.exec(sid, ["sh", "-c", script], timeout=30)
        except SandboxError as exc:
            log.warning("agent %s: writing the inputs again failed: %s", agent_id, exc)
