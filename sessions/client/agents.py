"""Agents and the entry points: Alineo.start / reattach / resume / attach."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Any, Iterator

from .errors import InvalidRequest
from .transport import (
    DEFAULT_RETRY_FOR,
    DEFAULT_TIMEOUT,
    STREAM_READ_TIMEOUT,
    quote_part,
    stream_events,
    Transport,
    wait_command,
)
from .turns import SETTLED, Event, Turn

# --- agents -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentSandbox:
    """Where the agent runs now. ``id`` changes when the agent is restored."""

    id: str | None
    agent_id: str


@dataclass
class Recovery:
    """How reattach/resume got back in: ``rung`` (reattach, resume, restart,
    restore, rebuild), the sandbox before and after, the command's result."""

    rung: str
    sandbox_id: str | None
    old_sandbox_id: str | None
    result: dict = field(default_factory=dict)


class AttachedAgent:
    """An agent you look at: metadata, transcript, streams, checkpoints,
    ``spawn()`` and ``fork()``. Attaching touches nothing in its sandbox, and
    this class cannot prompt or steer (see :class:`Agent`)."""

    def __init__(self, transport: Transport, data: dict):
        self._t = transport
        self.data = data
        self.recovery: Recovery | None = None
        #: For an agent made here with ``prompt=``: the Turn of that first prompt.
        self.first_turn: Turn | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.status} sandbox={self.sandbox_id}>"

    # metadata
    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def status(self) -> str:
        return self.data.get("status", "")

    @property
    def status_reason(self) -> str:
        return self.data.get("status_reason", "")

    @property
    def sandbox_id(self) -> str | None:
        return self.data.get("sandbox_id")

    @property
    def sandbox(self) -> AgentSandbox:
        return AgentSandbox(self.sandbox_id, self.id)

    @property
    def parent(self) -> str | None:
        return self.data.get("parent")

    @property
    def children(self) -> list[str]:
        return list(self.data.get("children") or [])

    @property
    def spec(self) -> dict:
        return dict(self.data.get("spec") or {})

    @property
    def last_seq(self) -> int:
        return int(self.data.get("last_seq") or 0)

    @property
    def current_turn(self) -> dict | None:
        return self.data.get("current_turn")

    @property
    def rung(self) -> str | None:
        """The rung reattach/resume took (None for start/attach)."""
        return self.recovery.rung if self.recovery else None

    def refresh(self) -> AttachedAgent:
        self.data = self._t.get(f"/api/agents/{quote_part(self.id)}")
        return self

    # the transcript
    def events(self, after: int = 0, *, limit: int = 500) -> Iterator[Event]:
        """Every event after ``after``, page by page (a snapshot: it ends at the head)."""
        while True:
            page = self._t.get(f"/api/agents/{quote_part(self.id)}/events",
                               {"after": after, "limit": limit})
            for d in page.get("events") or []:
                ev = Event.from_json(d)
                after = ev.seq
                yield ev
            if not page.get("has_more"):
                return

    def stream(self, after: int = 0, *, deadline: float | None = None,
               read_timeout: float = STREAM_READ_TIMEOUT,
               reconnect_for: float = DEFAULT_RETRY_FOR) -> Iterator[Event]:
        """Every event after ``after``, live, without end (close the iterator to
        stop). A dropped connection is resumed from the last event delivered
        (``Last-Event-ID``): no event is repeated or skipped. Gives up with
        :class:`TransportError` after ``reconnect_for`` s without reaching the
        server, :class:`Timeout` at ``deadline`` (a ``time.monotonic()`` value)."""
        return stream_events(self._t, self.id, after, deadline, read_timeout, reconnect_for)

    def checkpoints(self) -> list[dict]:
        """Checkpoint metadata, newest first (never their contents)."""
        return list(self._t.get(f"/api/agents/{quote_part(self.id)}/checkpoints").get("checkpoints") or [])

    # new agents
    def spawn(self, spec: dict | None = None, prompt: str | None = None, *,
              key: str | None = None) -> Agent:
        """A child agent (a new sandbox), as an :class:`Agent` you drive."""
        body = {"spec": spec if spec is not None else self.spec, "parent": self.id}
        if prompt is not None:
            body["prompt"] = prompt
        return _new_agent(self._t, self._t.post("/api/agents", body, key=key), prompt)

    def fork(self, *, checkpoint: int | None = None, at_event: int | None = None,
             prompt: str | None = None, parent: str | None = None,
             key: str | None = None) -> Agent:
        """A new agent from one of this agent's checkpoints (its disk and
        conversation) or from its transcript through ``at_event`` (conversation
        only). This agent is not touched."""
        if (checkpoint is None) == (at_event is None):
            raise InvalidRequest("give exactly one of checkpoint= or at_event=",
                                 code="client.bad_arguments")
        body: dict[str, Any] = ({"checkpoint": checkpoint} if checkpoint is not None
                                else {"at_event": at_event})
        if prompt is not None:
            body["prompt"] = prompt
        if parent is not None:
            body["parent"] = parent
        created = self._t.post(f"/api/agents/{quote_part(self.id)}/fork", body, key=key)
        return _new_agent(self._t, created, prompt)

    # helpers for subclasses
    def _command(self, verb: str, body: dict | None = None, key: str | None = None) -> dict:
        return self._t.post(f"/api/agents/{quote_part(self.id)}/{verb}", body or {}, key=key)

    def _outcome(self, accepted: dict, timeout: float) -> dict:
        return wait_command(self._t, accepted, timeout)


class Agent(AttachedAgent):
    """An agent you drive: everything :class:`AttachedAgent` has, plus
    ``prompt``, ``follow``, ``steer``, ``interrupt``, ``pause``, ``resume``
    (unpause), ``stop`` and ``take_checkpoint``."""

    def prompt(self, text: str, *, timeout: float | None = None, key: str | None = None) -> Turn:
        """Send a prompt; returns its :class:`Turn`, an iterator of chunks that
        ends when the turn settles. The prompt is sent now (idempotently), the
        turn streamed while you iterate."""
        accepted = self._command("prompt", {"text": text}, key)
        return Turn(self, after=int(accepted.get("seq") or 0), command=accepted.get("command"),
                    timeout=timeout)

    def follow(self, after: int | None = None, *, timeout: float | None = None) -> Turn:
        """The rest of a turn that is already running — e.g. after reattach.

        ``after=None``: the agent's current turn from its start (an empty Turn
        when none runs). ``after=S`` (a cursor you kept, e.g. ``chunk.seq``):
        the turn that was running at S, from just after S — together with what
        you read up to S, its whole reply, nothing twice; when no turn was
        running at S, the next one that starts."""
        if after is None:
            self.refresh()
            cur = self.current_turn
            if not cur:
                return Turn(self, after=self.last_seq, empty=True)
            return Turn(self, after=int(cur["started_seq"]) - 1, number=None, timeout=timeout)
        number, primed = self._turn_open_at(after)
        return Turn(self, after=after, number=number, primed=primed, timeout=timeout)

    def _turn_open_at(self, seq: int) -> tuple[int | None, list[Event]]:
        """The turn running at ``seq`` and its events through ``seq``."""
        before, collected = seq + 1, []
        while before > 1:
            page = self._t.get(f"/api/agents/{quote_part(self.id)}/events",
                               {"before": before, "limit": 200})
            events = [Event.from_json(d) for d in page.get("events") or []]
            if not events:
                break
            for ev in reversed(events):
                if ev.type in SETTLED:
                    return None, []
                collected.append(ev)
                if ev.type == "turn.started":
                    n = ev.data.get("turn")
                    return n, [e for e in reversed(collected) if e.data.get("turn") == n
                               and e.type != "turn.started"]
            before = events[0].seq
        return None, []

    def steer(self, text: str, *, key: str | None = None) -> dict:
        """Add guidance to the running turn (delivered at its next step)."""
        return self._command("steer", {"text": text}, key)

    def interrupt(self, *, key: str | None = None) -> dict:
        """End the running turn now (``turn.interrupted`` with the text so far)."""
        return self._command("interrupt", {}, key)

    def pause(self, *, key: str | None = None) -> dict:
        return self._command("pause", {}, key)

    def resume(self, *, key: str | None = None) -> dict:
        """Unpause. (To restart the bridge, see :meth:`Alineo.resume`.)"""
        return self._command("resume", {}, key)

    def stop(self, *, key: str | None = None) -> dict:
        """End the agent and its sandbox; transcript and checkpoints stay."""
        return self._command("stop", {}, key)

    def take_checkpoint(self, *, timeout: float = 300.0, key: str | None = None) -> dict:
        """Take a checkpoint of the agent's home now and wait for it; returns
        ``{"checkpoint": id, "turn", "bytes", "ms", "sandbox_id"}``. Raises
        :class:`CheckpointFailed` when it could not be taken (the agent and its
        turn carry on), :class:`Conflict` when the agent takes no checkpoints."""
        accepted = self._t.post(f"/api/agents/{quote_part(self.id)}/checkpoints", {}, key=key)
        return self._outcome(accepted, timeout)


# --- the entry points ---------------------------------------------------------------------------


class Alineo:
    """A connection to one Alineo server: ``Alineo(url, token)``, or the four
    class methods that return an agent directly. ``url``/``token`` default to
    the ``ALINEO_URL`` / ``ALINEO_TOKEN`` environment variables."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT, retry_for: float = DEFAULT_RETRY_FOR,
                 ssl_context: ssl.SSLContext | None = None):
        url = url or os.environ.get("ALINEO_URL")
        token = token or os.environ.get("ALINEO_TOKEN")
        if not url or not token:
            raise InvalidRequest("give url= and token= (or set ALINEO_URL and ALINEO_TOKEN)",
                                 code="client.not_configured")
        self.transport = Transport(url, token, timeout=timeout, retry_for=retry_for,
                                    ssl_context=ssl_context)

    # instance API
    def start_agent(self, spec: dict | None = None, *, prompt: str | None = None,
                    parent: str | None = None, key: str | None = None) -> Agent:
        body: dict[str, Any] = {"spec": spec if spec is not None else {"model": "demo"}}
        if prompt is not None:
            body["prompt"] = prompt
        if parent is not None:
            body["parent"] = parent
        return _new_agent(self.transport, self.transport.post("/api/agents", body, key=key), prompt)

    def agent(self, agent_id: str) -> AttachedAgent:
        return AttachedAgent(self.transport, self.transport.get(f"/api/agents/{quote_part(agent_id)}"))

    def agents(self) -> Iterator[AttachedAgent]:
        """Your agents, oldest first (summaries: no spec or turns)."""
        after = None
        while True:
            page = self.transport.get("/api/agents", {"limit": 200, **({"after": after} if after else {})})
            for d in page.get("agents") or []:
                yield AttachedAgent(self.transport, d)
            if not page.get("has_more"):
                return
            after = page.get("next_after")

    def operate(self, agent_id: str, verb: str, *, timeout: float) -> Agent:
        accepted = self.transport.post(f"/api/agents/{quote_part(agent_id)}/{verb}", {})
        result = wait_command(self.transport, accepted, timeout)
        agent = Agent(self.transport, self.transport.get(f"/api/agents/{quote_part(agent_id)}"))
        agent.recovery = Recovery(str(result.get("rung") or ""), result.get("sandbox_id"),
                                  result.get("old_sandbox_id"), result)
        return agent

    # the four ways in
    @classmethod
    def start(cls, spec: dict | None = None, *, url: str | None = None, token: str | None = None,
              prompt: str | None = None, parent: str | None = None, **options) -> Agent:
        """A new agent in a new sandbox (``spec`` defaults to ``{"model": "demo"}``).
        With ``prompt``, its first turn is queued: iterate ``agent.first_turn``."""
        return cls(url, token, **options).start_agent(spec, prompt=prompt, parent=parent)

    @classmethod
    def reattach(cls, agent_id: str, *, url: str | None = None, token: str | None = None,
                 timeout: float = 120.0, **options) -> Agent:
        """Get back in, keeping the bridge: it must answer within 5 s, and a
        running turn keeps running (read its rest with ``agent.follow()``).
        Raises :class:`BridgeUnavailable` (within ~5 s) when the sandbox runs but
        its bridge does not answer — then use :meth:`resume`. A sandbox that is
        gone or stopped is brought back by the restore ladder first
        (``agent.rung``, ``agent.sandbox_id`` say how); ``timeout`` bounds the
        whole wait."""
        return cls(url, token, **options).operate(agent_id, "reattach", timeout=timeout)

    @classmethod
    def resume(cls, agent_id: str, *, url: str | None = None, token: str | None = None,
               timeout: float = 120.0, **options) -> Agent:
        """Get back in by restarting the bridge on its session: a running turn
        is dropped (``turn.interrupted`` in the transcript); the conversation
        goes on. A sandbox that is gone is restored by the ladder first."""
        return cls(url, token, **options).operate(agent_id, "rebridge", timeout=timeout)

    @classmethod
    def attach(cls, agent_id: str, *, url: str | None = None, token: str | None = None,
               **options) -> AttachedAgent:
        """Look without touching: metadata, sandbox handle, transcript,
        ``spawn()`` — no prompt. Nothing is sent to the agent's sandbox."""
        return cls(url, token, **options).agent(agent_id)




def _new_agent(t: Transport, created: dict, prompt: str | None) -> Agent:
    agent = Agent(t, t.get(f"/api/agents/{quote_part(created['id'])}"))
    if prompt is not None:
        agent.first_turn = Turn(agent, after=0)  # the first turn that starts: the prompt's
    return agent
