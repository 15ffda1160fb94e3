"""Events, chunks and turns: what a prompt streams back, never a chunk twice or missing."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol

from .errors import AgentEnded, command_error

SETTLED = ("turn.finished", "turn.interrupted")
#: Statuses an agent never leaves (the server's sessions/models.py ENDED).
ENDED = ("stopped", "lost", "unrecoverable")


class Streams(Protocol):
    """What a turn reads from: an agent's id and its event stream (agents.py)."""

    id: str

    def stream(self, *, after: int, deadline: float | None): ...

# --- events, chunks, turns ------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One transcript fact: ``seq`` (1, 2, 3 … per agent), ``type``, ``ts``, ``data``."""

    seq: int
    type: str
    ts: str
    data: dict

    @classmethod
    def from_json(cls, d: dict) -> Event:
        return cls(int(d["seq"]), str(d["type"]), str(d.get("ts") or ""), d.get("data") or {})


@dataclass(frozen=True)
class Chunk:
    """A piece of a turn. ``kind`` is ``text`` (``text`` is the next piece of the
    reply), ``tool_call``, ``tool_result`` or ``steer`` (``text`` empty, details
    in ``event.data``). ``seq`` is the cursor after this chunk: keep it to
    continue elsewhere with ``agent.follow(after=seq)``."""

    kind: str
    text: str
    seq: int
    event: Event


def text_only(chunks: Iterable[Chunk]) -> Iterator[str]:
    """The text of a turn's chunks: ``"".join(text_only(agent.prompt(...)))``."""
    for chunk in chunks:
        if chunk.kind == "text" and chunk.text:
            yield chunk.text


class _Reply:
    """A turn's reply as the transcript has it: its ``message.assistant`` texts
    joined by a blank line, plus the ``message.delta`` text of the step in
    flight. ``advance`` returns what is new since the last call."""

    def __init__(self):
        self.steps: list[str] = []
        self.partial = ""
        self.sent = ""
        self.final: str | None = None

    def text(self) -> str:
        if self.final is not None:
            return self.final
        return "\n\n".join(self.steps + [self.partial] if self.partial else self.steps)

    def feed(self, ev: Event) -> None:
        d = ev.data
        if ev.type == "message.delta":
            self.partial += str(d.get("text") or "")
        elif ev.type == "message.assistant":
            self.steps.append(str(d.get("text") or ""))
            self.partial = ""
        elif ev.type == "turn.interrupted":
            self.final = str(d.get("text") or "")
        elif ev.type == "turn.finished":
            self.partial = ""

    def advance(self) -> str:
        now = self.text()
        if not now.startswith(self.sent):
            return ""  # never repeat: what was sent stays sent
        new, self.sent = now[len(self.sent):], now
        return new


def reply_text(events: Iterable[Event | dict], turn: int) -> str:
    """The full reply of turn ``turn`` in a list of events (dicts or Events):
    what ``text_only`` of that turn's chunks adds up to."""
    reply = _Reply()
    for ev in events:
        ev = ev if isinstance(ev, Event) else Event.from_json(ev)
        if ev.data.get("turn") == turn and ev.type != "turn.started":
            reply.feed(ev)
    return reply.text()


class Turn:
    """One turn, as an iterator of :class:`Chunk` that ends when the turn
    settles. Afterwards ``outcome`` is ``finished`` or ``interrupted``,
    ``text`` the whole reply, ``number`` the turn number, ``cursor`` the seq
    of the last event read. A dropped connection is resumed from ``cursor``.

    ``command``: the prompt command whose turn this is (its ``turn.started``
    names it); ``number``: a turn already known; neither: the first turn that
    starts after ``after``."""

    def __init__(self, agent: Streams, *, after: int, command: int | None = None,
                 number: int | None = None, primed: list[Event] | None = None,
                 timeout: float | None = None, empty: bool = False):
        self.agent, self.cursor, self.command, self.number = agent, after, command, number
        self.outcome: str | None = None
        self.settled: Event | None = None
        self.timeout = timeout
        self._reply = _Reply()
        self._empty = empty
        for ev in primed or ():
            self._reply.feed(ev)
        self._reply.sent = self._reply.text()  # already delivered to whoever read up to `after`

    @property
    def text(self) -> str:
        return self._reply.text()

    def __iter__(self) -> Iterator[Chunk]:
        if self._empty or self.outcome is not None:
            return
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        stream = self.agent.stream(after=self.cursor, deadline=deadline)
        try:
            for ev in stream:
                self.cursor = ev.seq
                chunk = self._take(ev)
                if chunk is not None:
                    yield chunk
                if self.outcome is not None:
                    return
        finally:
            stream.close()

    def _take(self, ev: Event) -> Chunk | None:
        d = ev.data
        if self.number is None:
            self._check_ended(ev)
            if ev.type == "turn.started" and (
                    self.command is None or str(d.get("command_id")) == str(self.command)):
                self.number = d.get("turn")
            return None
        if ev.type in ("agent.lost",):
            raise AgentEnded(f"agent {self.agent.id} is lost: {d.get('reason')}",
                             code="agent.lost", body=d)
        if d.get("turn") != self.number:
            return None
        if ev.type == "turn.started":
            return None
        self._reply.feed(ev)
        if ev.type in SETTLED:
            self.outcome = ev.type.split(".", 1)[1]
            self.settled = ev
        new = self._reply.advance()
        if new:
            return Chunk("text", new, ev.seq, ev)
        kind = {"tool.dispatched": "tool_call", "tool.result": "tool_result",
                "steer.delivered": "steer"}.get(ev.type)
        return Chunk(kind, "", ev.seq, ev) if kind else None

    def _check_ended(self, ev: Event) -> None:
        d = ev.data
        if self.command is not None and ev.type == "command.failed" and \
                str(d.get("command")) == str(self.command):
            raise command_error({"code": d.get("code"), "message": d.get("reason")}, "prompt")
        if ev.type == "agent.lost" or (ev.type == "agent.status" and
                                       d.get("status") in ENDED):
            raise AgentEnded(f"agent {self.agent.id} ended before the turn started "
                             f"({d.get('status') or 'lost'}: {d.get('reason')})",
                             code=f"agent.{d.get('status') or 'lost'}", body=d)
