"""Sandbox snapshots with exec replay: the layer below agents (a sandbox, its
named snapshots, and the commands run after the newest one).

A :class:`SandboxSession` wraps one sandbox and keeps a journal file of it:

    s = SandboxSession.create(backend, "build-42", image, agent_id="a1")
    s.exec(["sh", "-c", "make deps"])        # recorded: argv + exit code (no env)
    s.checkpoint("deps")                      # backend.commit of the whole sandbox
    s.exec(["sh", "-c", "make test"])         # recorded after the snapshot
    ...                                       # the sandbox is lost
    s = SandboxSession.resume(backend, "build-42")
    # a new sandbox from snapshot "deps", then `make test` replayed, in order

The journal (``<root>/<session>.jsonl``, root defaulting to the data dir's
``sandbox-sessions/``, sandboxes/config.py) is JSON lines: one ``session`` record (how to
create the sandbox), ``snapshot`` records (name → ref) and ``exec`` records
(argv, exit code), each appended and fsynced *after* the exec returned. A
checkpoint rewrites the file atomically without the execs before it, so the
file holds exactly what a resume must replay. Execs take no environment on
purpose: what is replayed is what was recorded, and nothing secret is kept.
An exec that ran but whose record was not written (a crash in between) is not
replayed: the honest gap is "redone or reported", and callers that need more
checkpoint before such an exec.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from sandboxes import config
from sandboxes.backends.base import ExecResult, Limits
from sandboxes.errors import SandboxError

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
LABEL_SESSION = "alineo.session"


@dataclass(frozen=True)
class Replayed:
    argv: list[str]
    recorded_exit_code: int
    exit_code: int

    @property
    def same(self) -> bool:
        return self.exit_code == self.recorded_exit_code


def _check_name(what: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise SandboxError(f"{what} {name!r} must be 1-63 of a-z 0-9 _ . - "
                           "(starting with a letter or digit)", permanent=True)
    return name


def sessions_root(root: str | os.PathLike | None = None) -> Path:
    path = config.data_dir().sandbox_sessions if root is None else Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


class SandboxSession:
    """One sandbox with a journal of its snapshots and the execs after the newest."""

    def __init__(self, backend, name: str, sandbox_id: str, *, root=None):
        self.backend = backend
        self.name = _check_name("session name", name)
        self.sandbox_id = sandbox_id
        self.root = sessions_root(root)
        self.replayed: list[Replayed] = []

    # --- journal --------------------------------------------------------------------
    @property
    def journal_path(self) -> Path:
        return self.root / f"{self.name}.jsonl"

    @staticmethod
    def _read(path: Path) -> list[dict]:
        try:
            text = path.read_text()
        except FileNotFoundError as exc:
            raise SandboxError(f"no sandbox session journal at {path}", permanent=True) from exc
        records = []
        for line in text.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                break  # a torn last line from a crash mid-append: what came before stands
        if not records or records[0].get("type") != "session":
            raise SandboxError(f"{path} is not a sandbox session journal", permanent=True)
        return records

    def records(self) -> list[dict]:
        return self._read(self.journal_path)

    def _append(self, record: dict) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with open(self.journal_path, "a") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def _rewrite(self, records: list[dict]) -> None:
        tmp = self.journal_path.with_name(f".{self.journal_path.name}.{uuid.uuid4().hex[:8]}")
        with open(tmp, "w") as fh:
            fh.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.journal_path)

    # --- the session's views ------------------------------------------------------------
    def snapshots(self) -> list[dict]:
        """[{"name", "ref", "ts"}], oldest first."""
        return [r for r in self.records() if r["type"] == "snapshot"]

    def pending_execs(self) -> list[dict]:
        """The execs recorded after the newest snapshot: what a resume replays."""
        return [r for r in self.records() if r["type"] == "exec"]

    # --- verbs ----------------------------------------------------------------------------
    @classmethod
    def create(cls, backend, name: str, image: str, *, agent_id: str,
               root: str | os.PathLike | None = None, network: str = "none",
               limits: Limits | Mapping | None = None, labels: Mapping[str, str] | None = None,
               command: Sequence[str] | None = None, start: bool = True) -> "SandboxSession":
        """A new sandbox and a new journal (an existing journal of that name is
        refused: resume it, or delete() it first)."""
        _check_name("session name", name)
        path = sessions_root(root) / f"{name}.jsonl"
        if path.exists():
            raise SandboxError(f"sandbox session {name!r} exists: resume() it or delete() it",
                               permanent=True)
        if isinstance(limits, Limits):
            limits = {"pids": limits.pids, "memory_mb": limits.memory_mb, "cpus": limits.cpus}
        spec = {"type": "session", "name": name, "image": image, "agent_id": agent_id,
                "network": network, "limits": dict(limits or {}),
                "labels": {**(labels or {}), LABEL_SESSION: name},
                "command": list(command) if command else None, "ts": time.time()}
        sid = cls._new_sandbox(backend, spec, image)
        session = cls(backend, name, sid, root=root)
        session._rewrite([spec, {"type": "sandbox", "id": sid, "ts": time.time()}])
        if start:
            backend.start(sid)
        return session

    @staticmethod
    def _new_sandbox(backend, spec: dict, image: str) -> str:
        return backend.create(spec["agent_id"], image, network=spec["network"],
                              limits=spec["limits"] or None, labels=spec["labels"],
                              command=spec["command"])

    def exec(self, argv: Sequence[str], *, timeout: float | None = 60) -> ExecResult:
        """Run a one-shot command and record it (argv, exit code) for replay.
        A command that could not run at all (SandboxError) is not recorded."""
        argv = [str(a) for a in argv]
        result = self.backend.exec(self.sandbox_id, argv, timeout=timeout)
        self._append({"type": "exec", "argv": argv, "exit_code": result.exit_code,
                      "ts": time.time()})
        return result

    def checkpoint(self, name: str) -> str:
        """Snapshot the whole sandbox under ``name`` (backend.commit) and drop
        the recorded execs before it. Returns the snapshot's ref."""
        _check_name("snapshot name", name)
        records = self.records()
        tag = self._tag(name)
        labels = {**records[0].get("labels", {}), LABEL_SESSION: self.name}
        ref = self.backend.commit(self.sandbox_id, tag, labels=labels)
        kept = [r for r in records if r["type"] in ("session", "sandbox", "snapshot")]
        self._rewrite([*kept, {"type": "snapshot", "name": name, "ref": ref, "ts": time.time()}])
        return ref

    def _tag(self, snapshot: str) -> str:
        return self.backend.snapshot_ref("session", f"{self.name}-{snapshot}")

    @classmethod
    def resume(cls, backend, name: str, *, root: str | os.PathLike | None = None,
               timeout: float | None = 600) -> "SandboxSession":
        """Recreate the session's sandbox from its newest snapshot (or its image
        when none was taken), start it and replay the execs recorded after the
        snapshot, in order. The old sandbox, if it still exists, is removed.
        ``session.replayed`` lists what ran; a replayed exec whose exit code
        differs from the recorded one is logged, not fatal."""
        session = cls(backend, name, "", root=root)
        records = session.records()
        spec = records[0]
        old = [r["id"] for r in records if r["type"] == "sandbox"]
        snapshots = [r for r in records if r["type"] == "snapshot"]
        execs = [r for r in records if r["type"] == "exec"]
        image = snapshots[-1]["ref"] if snapshots else spec["image"]
        for sid in old:
            backend.remove(sid)
        sid = cls._new_sandbox(backend, spec, image)
        session.sandbox_id = sid
        kept = [r for r in records if r["type"] in ("session", "snapshot")]
        # The new sandbox is journaled before replay: a crash mid-replay resumes again.
        session._rewrite([kept[0], {"type": "sandbox", "id": sid, "ts": time.time()},
                          *kept[1:], *execs])
        backend.start(sid)
        for rec in execs:
            res = backend.exec(sid, rec["argv"], timeout=timeout)
            done = Replayed(rec["argv"], rec["exit_code"], res.exit_code)
            session.replayed.append(done)
            if not done.same:
                log.warning("session %s: replayed %s exited %s (recorded %s)", name,
                            rec["argv"][:3], res.exit_code, rec["exit_code"])
        return session

    def remove(self) -> None:
        """Remove the sandbox; the journal and snapshots stay (resume() works)."""
        self.backend.remove(self.sandbox_id)

    def delete(self) -> None:
        """Remove the sandbox, every snapshot and the journal."""
        records = self.records()
        for r in records:
            if r["type"] == "sandbox":
                self.backend.remove(r["id"])
        for r in records:
            if r["type"] == "snapshot":
                try:
                    self.backend.remove_image(r["ref"])
                except SandboxError as exc:
                    log.warning("session %s: could not remove snapshot %s: %s",
                                self.name, r["ref"], exc)
        self.journal_path.unlink(missing_ok=True)
