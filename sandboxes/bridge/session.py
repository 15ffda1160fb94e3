"""The session file: everything the bridge must not forget, in one JSON document.

``HOME/.alineo/session.json`` lives in the home dir on purpose: a turn
checkpoint (a tar of the home) then carries the conversation with it.

It is rewritten whole on every commit (tmp file + fsync + rename + fsync of the
directory), so a crash leaves either the old or the new version, never a torn
one. Its size is linear in the conversation plus the unacknowledged events.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import secrets
import threading
from pathlib import Path

from .redact import Redactor

FORMAT_VERSION = 1

#: How many prompt command ids are remembered for de-duplication.
SEEN_COMMANDS_KEPT = 500


class SessionLocked(RuntimeError):
    """Another live bridge holds this home's session: never run a session twice."""


def utcnow() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def new_state() -> dict:
    """Return the state of a session that has never run a turn."""
    return {
        "version": FORMAT_VERSION,
        "session_id": secrets.token_hex(8),
        "created_at": utcnow(),
        "bseq": 0,          # last event number handed out
        "acked": 0,         # the control plane journaled everything up to here
        "outbox": [],       # events with bseq > acked, oldest first
        "messages": [],     # the provider-neutral conversation (see conversation.py)
        "turns": 0,         # last turn number handed out (turns are numbered at enqueue)
        "queue": [],        # accepted prompts not started yet: {turn, command_id, text}
        "current": None,    # the running turn, see runner.TurnState
        "seen_commands": [],
    }


class SessionFile:
    """Atomic load/save of the session file, plus the single-bridge lock."""

    def __init__(self, home: str | os.PathLike, redactor: Redactor | None = None):
        self.dir = Path(home) / ".alineo"
        self.path = self.dir / "session.json"
        self.redactor = redactor or Redactor()
        self._lock_fh = None

    def acquire(self) -> None:
        """Take an exclusive flock, so two bridges never drive one session.
        The kernel drops it when the holder dies, even on kill -9."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.dir / "session.lock", "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise SessionLocked(f"another bridge holds {self.dir / 'session.lock'}") from None
        self._lock_fh = fh

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> dict | None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                state = json.load(fh)
        except FileNotFoundError:
            return None
        if state.get("version") != FORMAT_VERSION:
            raise ValueError(f"{self.path}: unsupported session format {state.get('version')!r}")
        return state

    def save(self, state: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".session.json.{os.getpid()}.tmp")
        # Bound values never reach the file: a checkpoint (a tar of the home)
        # carries it into forks and backups.
        data = self.redactor.dumps(state).encode("utf-8")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        # The rename is durable only once the directory entry is.
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class Session:
    """The in-memory session state, its lock, and its numbered events.

    Every mutation happens with ``lock`` held and ends with :meth:`commit`,
    which saves the file and only *then* makes new events visible to readers:
    the control plane never journals an event a crash could still take back
    (a restarted bridge would otherwise hand out the same bseq again).
    """

    def __init__(self, file: SessionFile, state: dict):
        self.file = file
        self.state = state
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.durable_bseq = state["bseq"]

    # --- events -----------------------------------------------------------------
    def emit(self, type_: str, data: dict) -> dict:
        """Number an event and queue it in the outbox (visible after commit)."""
        self.state["bseq"] += 1
        event = {"bseq": self.state["bseq"], "type": type_, "ts": utcnow(),
                 "data": self.file.redactor.value(data)}
        self.state["outbox"].append(event)
        return event

    def commit(self) -> None:
        self.file.save(self.state)
        self.durable_bseq = self.state["bseq"]
        self.changed.notify_all()

    def head(self) -> int:
        return self.durable_bseq

    def oldest_kept(self) -> int:
        """The lowest bseq still served (acked + 1)."""
        return self.state["acked"] + 1

    def events_after(self, after: int, limit: int) -> list[dict]:
        return [
            e for e in self.state["outbox"] if after < e["bseq"] <= self.durable_bseq
        ][:limit]

    def wait_for_events(self, after: int, timeout: float) -> None:
        """Block (lock held) until an event past ``after`` is durable, or timeout."""
        self.changed.wait_for(lambda: self.durable_bseq > after, timeout=timeout)

    def ack(self, through: int) -> None:
        self.state["acked"] = max(self.state["acked"], through)
        self.state["outbox"] = [e for e in self.state["outbox"] if e["bseq"] > through]

    # --- prompt de-duplication ----------------------------------------------------
    def turn_for(self, command_id: str | None) -> int | None:
        """The turn a prompt with this command id was given, if seen recently."""
        for cid, turn in reversed(self.state["seen_commands"]):
            if command_id and cid == command_id:
                return turn
        return None

    def remember(self, command_id: str | None, turn: int) -> None:
        if command_id:
            seen = self.state["seen_commands"]
            seen.append([command_id, turn])
            del seen[:-SEEN_COMMANDS_KEPT]
