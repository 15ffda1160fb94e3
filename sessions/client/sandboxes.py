"""Sandbox sessions: a sandbox a script drives — create, exec, checkpoint,
resume after loss, remove (docs/CLIENT.md "Sandbox sessions")::

    sb = Sandbox.create(image="default", url=URL, token=TOKEN)
    sb.exec(["sh", "-c", "make deps"])
    sb.checkpoint("deps")
    sb.exec(["sh", "-c", "make test"])
    ...                                   # the sandbox is lost; from any process:
    sb = Sandbox.resume(sb.id, url=URL, token=TOKEN)   # from "deps", `make test` replayed

Each call is a command the server's worker acts on; the client waits for its
outcome. Same error root, idempotency keys and retry rules as the agent client.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .agents import Alineo
from .transport import Transport, quote_part, wait_command
from .turns import Event

#: Extra wait for a command beyond the exec's own timeout (queueing, a slow engine).
SLACK_S = 120.0
POLL_S = 0.2


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_ms: int
    truncated: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Sandbox:
    """One sandbox session. ``replayed`` / ``not_replayed`` say what the last
    :meth:`resume` ran again and what it could not (docs/API.md "Replay")."""

    def __init__(self, transport: Transport, data: dict):
        self._t = transport
        self.data = data
        self.replayed: list[dict] = []
        self.not_replayed: list[dict] = []

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.status} sandbox={self.sandbox_id}>"

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def status(self) -> str:
        return self.data.get("status", "")

    @property
    def sandbox_id(self) -> str | None:
        return self.data.get("sandbox_id")

    @property
    def _path(self) -> str:
        return f"/api/sandboxes/{quote_part(self.id)}"

    def refresh(self) -> Sandbox:
        self.data = self._t.get(self._path)
        return self

    # --- the entry points -------------------------------------------------------------------
    @classmethod
    def create(cls, image: str | None = None, *, spec: dict | None = None, name: str | None = None,
               url: str | None = None, token: str | None = None, timeout: float = 600.0,
               key: str | None = None, **options) -> Sandbox:
        """A new sandbox session from ``image`` or ``spec`` (its sandbox fields:
        image, packages, setup, network, limits); returns once its sandbox runs."""
        t = Alineo(url, token, **options).transport
        body: dict[str, Any] = {"spec": spec} if spec is not None else {}
        if image is not None:
            body["image"] = image
        if name is not None:
            body["name"] = name
        created = t.post("/api/sandboxes", body, key=key)
        wait_command(t, {"command": created["command"], "verb": "create"}, timeout)
        return cls(t, t.get(f"/api/sandboxes/{quote_part(created['id'])}"))

    @classmethod
    def attach(cls, sandbox_id: str, *, url: str | None = None, token: str | None = None,
               **options) -> Sandbox:
        """The session as it is; touches nothing."""
        t = Alineo(url, token, **options).transport
        return cls(t, t.get(f"/api/sandboxes/{quote_part(sandbox_id)}"))

    @classmethod
    def resume(cls, sandbox_id: str, *, url: str | None = None, token: str | None = None,
               timeout: float = 1800.0, key: str | None = None, **options) -> Sandbox:
        """A new sandbox from the newest snapshot, the execs recorded after it
        replayed in order. Raises :class:`ReplayDiverged` when one exits otherwise
        than recorded (``body["diverged"]`` says which; the session stays usable)."""
        sb = cls.attach(sandbox_id, url=url, token=token, **options)
        result = sb._run("resume", {}, timeout, key)
        sb.replayed, sb.not_replayed = result.get("replayed", []), result.get("not_replayed", [])
        return sb.refresh()

    # --- verbs ---------------------------------------------------------------------------------
    def exec(self, argv: list[str], *, cwd: str | None = None, timeout: int = 60,
             key: str | None = None,
             on_output: Callable[[str, str], None] | None = None) -> ExecResult:
        """Run ``argv`` (no shell, no environment) in the sandbox, cwd relative to
        its home. ``on_output(stream, text)`` gets the output while it runs (the
        journal's ``exec.output`` facts, the first 64 KiB a stream)."""
        body: dict[str, Any] = {"argv": list(argv), "timeout": timeout}
        if cwd is not None:
            body["cwd"] = cwd
        if on_output is None:
            r = self._run("exec", body, timeout + SLACK_S, key)
        else:
            accepted = self._t.post(f"{self._path}/exec", body, key=key)
            r = self._follow(accepted, timeout + SLACK_S, on_output)
        return ExecResult(int(r["exit_code"]), r.get("stdout", ""), r.get("stderr", ""),
                          int(r.get("duration_ms") or 0), r.get("truncated") or {})

    def checkpoint(self, name: str, *, timeout: float = 600.0, key: str | None = None) -> dict:
        """A named snapshot of the whole sandbox; a later resume starts from the newest."""
        accepted = self._t.post(f"{self._path}/snapshots", {"name": name}, key=key)
        return wait_command(self._t, accepted, timeout)

    def snapshots(self) -> list[dict]:
        return list(self._t.get(f"{self._path}/snapshots").get("snapshots") or [])

    def remove(self, *, timeout: float = 300.0, key: str | None = None) -> None:
        """Remove the sandbox and its snapshots; the journal stays readable."""
        self._run("remove", {}, timeout, key)
        self.refresh()

    def events(self, after: int = 0, *, limit: int = 500) -> Iterator[Event]:
        """The session's journal after ``after``, page by page (it ends at the head)."""
        while True:
            page = self._t.get(f"{self._path}/events", {"after": after, "limit": limit})
            for d in page.get("events") or []:
                ev = Event.from_json(d)
                after = ev.seq
                yield ev
            if not page.get("has_more"):
                return

    def _follow(self, accepted: dict, timeout: float, on_output) -> dict:
        """Wait for an exec, handing its journaled output to ``on_output`` as it comes."""
        cid, cursor = accepted.get("command"), int(accepted.get("seq") or 0)
        deadline = time.monotonic() + timeout
        while True:
            cmd = self._t.get(f"/api/commands/{quote_part(cid)}")
            for ev in self.events(cursor):
                cursor = ev.seq
                if ev.type == "exec.output" and ev.data.get("command") == cid:
                    on_output(str(ev.data.get("stream")), str(ev.data.get("text")))
            if cmd.get("state") != "pending" or time.monotonic() >= deadline:
                return wait_command(self._t, accepted, 0)
            time.sleep(POLL_S)

    def _run(self, verb: str, body: dict, timeout: float, key: str | None) -> dict:
        accepted = self._t.post(f"{self._path}/{verb}", body, key=key)
        return wait_command(self._t, accepted, timeout)
