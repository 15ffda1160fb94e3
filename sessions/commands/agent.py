"""Commands to an existing agent: prompt, steer, interrupt, pause, resume,
stop, and the client's operations whose caller waits for an outcome —
reattach, rebridge (the client's "resume"), checkpoint and home_snapshot (a
look at the live home: sessions/live_home.py) — the worker acts on those in
sessions/worker/operations.py."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import DatabaseError, IntegrityError

from sessions import journal, live_home
from sessions.models import Agent, AgentStatus

from .base import (
    CommandRefused,
    Outcome,
    accepted,
    body_object,
    check_key,
    execute,
    finish,
    locked,
    only,
    reason,
    record,
    refuse_if_ended,
    request_hash,
    text,
)

AGENT_VERBS = ("prompt", "steer", "interrupt", "pause", "resume", "stop")
# Verbs whose caller waits for an outcome (Command.result, GET /api/commands/{id}).
OPERATION_VERBS = ("reattach", "rebridge", "checkpoint", "home_snapshot")
TEXT_VERBS = ("prompt", "steer")


def send(user, agent_id: str, verb: str, body: Any, key: str | None = None) -> Outcome:
    """Send `verb` to an agent: prompt/steer take {"text"}; the others take {"reason"?}. → 202."""
    if verb not in AGENT_VERBS + OPERATION_VERBS:
        raise CommandRefused(404, "command.unknown", f"No such command {verb!r}.")
    key = check_key(key)
    body = body_object(body)
    if verb in TEXT_VERBS:
        only(body, ("text",))
        if "text" not in body:
            raise CommandRefused(400, "request.invalid", "text is required")
        payload = {"text": text("text", body["text"])}
    else:
        only(body, ("reason",))
        payload = {"reason": reason(body["reason"])} if "reason" in body else {}
    digest = request_hash(verb, agent_id, body)
    act = partial(_send, user, agent_id, verb, payload, key, digest)
    try:
        return execute(user, key, digest, act)
    except DatabaseError as exc:
        if not isinstance(exc, IntegrityError) and isinstance(agent_id, str):
            journal.note_unwritable(agent_id, exc)
        raise


def _send(user, agent_id: str, verb: str, payload: dict, key, digest) -> Outcome:
    agent = locked(user, agent_id, "agent")
    refuse_if_ended(agent)
    if verb == "checkpoint":
        _refuse_if_no_checkpoints(agent)
    if verb == "home_snapshot":
        _refuse_unless_running(agent)
    cmd = record(user, agent, verb, key, digest, 202)
    facts = [(f"command.{verb}", {**payload, "command": cmd.pk, "by": user.get_username()})]
    status = _status_after(agent, verb)
    if status is not None:
        facts.append(("agent.status", {
            "status": status,
            "previous": agent.status,
            "reason": f"{verb} by {user.get_username()}",
            "command": cmd.pk,
        }))
    records = journal.append_many(agent.id, facts)
    body = accepted(cmd, agent, verb, records[0].seq)
    finish(cmd, body, records[0].seq)
    return Outcome(202, body)


def _status_after(agent: Agent, verb: str) -> str | None:
    """The status this command moves the agent to now; None when the worker moves it later."""
    if verb == "stop":
        return AgentStatus.STOPPED
    if verb == "pause" and agent.status != AgentStatus.PAUSED:
        return AgentStatus.PAUSED
    if verb == "resume" and agent.status == AgentStatus.PAUSED:
        return _before_pause(agent)
    return None


def _before_pause(agent: Agent) -> str:
    """Where resume puts the agent: running when a turn is open (it was held at a
    step boundary), starting when it never got a sandbox, else idle. The
    transcript says, not the status before the pause: the turn may have
    finished while the agent was paused."""
    try:
        state = journal.replay(agent.id, write_snapshot=False)
    except journal.JournalError:
        return AgentStatus.IDLE
    if state["current_turn"]:
        return AgentStatus.RUNNING
    if not agent.sandbox_id and not state["turns"]:
        return AgentStatus.STARTING
    return AgentStatus.IDLE


def _refuse_if_no_checkpoints(agent: Agent) -> None:
    """An on-demand checkpoint needs what a turn checkpoint needs."""
    if agent.workspace.zero_data_retention:
        raise CommandRefused(
            409, "checkpoint.zero_data_retention",
            f"Agent {agent.id} belongs to a zero-data-retention workspace: it takes no checkpoints.")
    if not (isinstance(agent.spec, dict) and agent.spec.get("checkpoint") is True):
        raise CommandRefused(
            409, "checkpoint.disabled",
            f'Agent {agent.id} was spawned without "checkpoint": true in its spec; '
            "it takes no checkpoints.")


def _refuse_unless_running(agent: Agent) -> None:
    """A look at the live home only while the sandbox runs: it never wakes one."""
    refused = live_home.refusal_for(agent)
    if refused is not None:
        raise CommandRefused(409, refused.code, f"Agent {agent.id}: {refused.message}")
