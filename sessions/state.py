"""The pure reducer: an agent's state is a fold of its transcript.

`reduce(state, event)` never touches the database or the clock, so replay from
a snapshot equals replay from scratch. The state is kept bounded (the recent
messages only; the whole conversation is the transcript itself) so snapshots
do not grow with the square of the turns.

Snapshot formats are versioned. Every older format stays readable through
`upgrade()`: a deployment must always be able to read its own history.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

SNAPSHOT_VERSION = 2
RECENT_MESSAGES = 20

# Statuses an event type moves the agent to. Other types leave it unchanged.
STATUS_BY_TYPE = {
    "agent.spawned": "starting",
    "turn.started": "running",
    "turn.finished": "idle",
    "turn.interrupted": "interrupted",
    "agent.lost": "lost",
    "agent.unrecoverable": "unrecoverable",
}


# Facts of a turn that leave a paused agent paused: pause holds the agent,
# whatever its turn does meanwhile; only `agent.status` (resume) releases it.
HELD_BY_PAUSE = frozenset({"turn.started", "turn.finished", "turn.interrupted"})


class StatusChange(NamedTuple):
    """What one fact does to the agent's status: ``status`` None keeps it (an
    ``agent.status`` without one still sets the reason); ``held_by_pause``: a
    paused agent stays paused."""

    status: str | None
    reason: str
    held_by_pause: bool


def status_change(etype: str, data: dict) -> StatusChange | None:
    """The status projection, one definition for the reducer and the journal's
    agent row (sessions/journal.py): None when the fact leaves the status alone."""
    if etype == "agent.status":
        status = data.get("status")
        return StatusChange(None if status is None else str(status), str(data.get("reason", "")),
                            False)
    if etype in STATUS_BY_TYPE:
        return StatusChange(STATUS_BY_TYPE[etype], str(data.get("reason", "")),
                            etype in HELD_BY_PAUSE)
    return None


def sandbox_change(etype: str, data: dict) -> str | None:
    """The sandbox id a fact moves the agent to, or None."""
    if etype == "agent.sandbox":
        return str(data.get("sandbox_id", ""))
    if etype == "agent.restored" and data.get("new_sandbox_id"):
        return str(data["new_sandbox_id"])
    return None


UNLESS_PAUSED = "_unless_paused"


def row_projection(facts, statuses) -> dict[str, Any]:
    """The agent row's columns (status, reason, sandbox id) as the facts (type,
    data) leave them, by the projection above; ``statuses`` are the ones the row
    takes. With UNLESS_PAUSED set, the row's stored status decides what a
    paused agent's turn facts do (sessions/journal.py writes the CASE)."""
    changes: dict[str, Any] = {}
    known = None  # the status this batch set explicitly, if any
    for etype, data in facts:
        change = status_change(etype, data)
        if change is not None and change.status in statuses \
                and not (change.held_by_pause and known == "paused"):
            if change.held_by_pause and known is None:
                changes[UNLESS_PAUSED] = True  # the stored status decides
            else:
                changes.pop(UNLESS_PAUSED, None)
                known = change.status
            changes["status"], changes["status_reason"] = change.status, change.reason
        sandbox = sandbox_change(etype, data)
        if sandbox is not None:
            changes["sandbox_id"] = sandbox
            if etype == "agent.sandbox":  # which engine holds it ("" when not recorded)
                changes["sandbox_host"] = str(data.get("host") or "")[:255]
    return changes


class ReplayError(Exception):
    """The transcript cannot be folded into a state (a gap, a malformed fact)."""


def initial_state() -> dict[str, Any]:
    return {
        "last_seq": 0,
        "status": "starting",
        "status_reason": "",
        "turns": 0,
        "current_turn": None,
        "messages": 0,
        "recent_messages": [],
        "open_tool_calls": {},
        "parent": None,
        "children": [],
        "sandbox_id": "",
        "last_restore": None,
    }


def reduce(state: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """Return the state after `event` ({"seq", "type", "data", "ts"}). Pure."""
    seq, etype, data = event["seq"], event["type"], event.get("data") or {}
    if not isinstance(data, dict):
        raise ReplayError(f"event {seq} ({etype}) has data that is not an object")
    if seq != state["last_seq"] + 1:
        raise ReplayError(f"transcript gap: expected seq {state['last_seq'] + 1}, found {seq}")
    new = dict(state)
    new["last_seq"] = seq
    change = status_change(etype, data)
    if change is not None and not (change.held_by_pause and state["status"] == "paused"):
        if change.status is not None:
            new["status"] = change.status
        new["status_reason"] = change.reason
    sandbox = sandbox_change(etype, data)
    if sandbox is not None:
        new["sandbox_id"] = sandbox
    handler = _HANDLERS.get(etype)
    if handler is not None:
        handler(new, seq, data, event.get("ts"))
    return new


def replay(events, state: dict[str, Any] | None = None) -> dict[str, Any]:
    state = initial_state() if state is None else state
    for event in events:
        state = reduce(state, event)
    return state


# --- handlers: each copies what it mutates, so the input state is never changed.

def _spawned(s, seq, d, ts):
    s["parent"] = d.get("parent")


def _turn_started(s, seq, d, ts):
    s["turns"] = s["turns"] + 1
    s["current_turn"] = {"turn": s["turns"], "started_seq": seq, "started_at": ts, "steps": 0}


def _turn_settled(s, seq, d, ts):
    s["current_turn"] = None
    if s["open_tool_calls"]:
        # A settled turn closes its dangling tool calls: the conversation stays well-formed.
        s["open_tool_calls"] = {}


def _message(role):
    def handler(s, seq, d, ts):
        text = str(d.get("text", ""))
        s["messages"] = s["messages"] + 1
        recent = s["recent_messages"][-(RECENT_MESSAGES - 1):] + [{"seq": seq, "role": role, "text": text[:2000]}]
        s["recent_messages"] = recent
        if role == "assistant" and s["current_turn"] is not None:
            turn = dict(s["current_turn"])
            turn["steps"] = turn["steps"] + 1
            s["current_turn"] = turn

    return handler


def _tool_dispatched(s, seq, d, ts):
    calls = dict(s["open_tool_calls"])
    calls[str(d.get("tool_call_id", seq))] = {"name": d.get("name", ""), "seq": seq}
    s["open_tool_calls"] = calls
    if s["current_turn"] is not None:  # a step of 12 calls is still "1 step": count the calls
        turn = dict(s["current_turn"])
        turn["tools"] = turn.get("tools", 0) + 1
        s["current_turn"] = turn


def _tool_result(s, seq, d, ts):
    calls = dict(s["open_tool_calls"])
    calls.pop(str(d.get("tool_call_id", "")), None)
    s["open_tool_calls"] = calls


def _child_spawned(s, seq, d, ts):
    child = d.get("child")
    if child and child not in s["children"]:
        s["children"] = s["children"] + [child]


def _restored(s, seq, d, ts):
    s["last_restore"] = {"rung": d.get("rung"), "reason": d.get("reason"), "seq": seq, "ts": ts}


_HANDLERS = {
    "agent.spawned": _spawned,
    "turn.started": _turn_started,
    "turn.finished": _turn_settled,
    "turn.interrupted": _turn_settled,
    "message.user": _message("user"),
    "message.assistant": _message("assistant"),
    "steer.delivered": _message("steer"),
    "tool.dispatched": _tool_dispatched,
    "tool.result": _tool_result,
    "agent.child_spawned": _child_spawned,
    "agent.restored": _restored,
}


# --- snapshot formats -------------------------------------------------------

def upgrade(state: dict[str, Any], version: int) -> dict[str, Any]:
    """Bring a snapshot written in an older format to SNAPSHOT_VERSION.

    Version 1 (the first release) called open tool calls `open_tools`, stored
    the status "active" for what is now "running", and kept no restore facts.
    """
    if version > SNAPSHOT_VERSION:
        raise ReplayError(f"snapshot format {version} is newer than this release reads ({SNAPSHOT_VERSION})")
    state = copy.deepcopy(state)
    if version < 2:
        state["open_tool_calls"] = state.pop("open_tools", {})
        if state.get("status") == "active":
            state["status"] = "running"
        state.setdefault("last_restore", None)
        state.setdefault("sandbox_id", "")
        state.setdefault("status_reason", "")
    base = initial_state()
    base.update(state)
    return base
