"""POST /api/agents/{id}/fork: a new agent that starts where another one was.

- `{"checkpoint": id}`: the checkpoint's disk and its conversation through the
  checkpoint's boundary. An expired, deleted or unreadable checkpoint is a 409
  `runtime.checkpoint_expired` — never silently a log-only fork.
- `{"at_event": seq}`: a conversation-only fork rebuilt from the transcript
  prefix 1..seq on a fresh disk; 409 `runtime.session_history_unavailable`
  when that complete prefix cannot be read.

The source agent is not touched. The fork's `agent.spawned` fact records where
it came from (`fork`), and the worker builds its sandbox from that
(sandboxes.ladder.provision_fork).
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from django.utils import timezone

from . import journal
from .commands import (
    CommandRefused,
    Outcome,
    _execute,
    _finish,
    _first_prompt,
    _locked,
    _object,
    _only,
    _record,
    _refuse_if_ended,
    _text,
    check_key,
    request_hash,
)
from .models import Agent, AgentStatus, Checkpoint, CommandVerb, Event


def fork(user, agent_id: str, body: Any, key: str | None = None) -> Outcome:
    key = check_key(key)
    body = _object(body)
    _only(body, ("checkpoint", "at_event", "parent", "prompt"))
    if ("checkpoint" in body) == ("at_event" in body):
        raise CommandRefused(400, "request.invalid", "Give exactly one of checkpoint or at_event.")
    for field in ("checkpoint", "at_event"):
        value = body.get(field)
        if field in body and (not isinstance(value, int) or isinstance(value, bool) or value < 1
                              or value > 2**62):
            raise CommandRefused(400, "request.invalid", f"{field} must be a positive integer.")
    parent_id = body.get("parent")
    if parent_id is not None and not isinstance(parent_id, str):
        raise CommandRefused(400, "request.invalid", "parent must be an agent id (a string) or null")
    prompt = body.get("prompt")
    prompt = None if prompt is None else _text("prompt", prompt)
    digest = request_hash("fork", agent_id, body)
    act = partial(_fork, user, agent_id, body, parent_id, prompt, key, digest)
    return _execute(user, key, digest, act)


def _fork(user, agent_id, body, parent_id, prompt, key, digest) -> Outcome:
    source = _locked(user, agent_id, "agent")
    origin = (_from_checkpoint(source, body["checkpoint"]) if "checkpoint" in body
              else _from_event(source, body["at_event"]))
    parent = _locked(user, parent_id, "parent") if parent_id is not None else None
    if parent is not None:
        _refuse_if_ended(parent)
    child = Agent.objects.create(workspace=source.workspace, parent=parent, created_by=user,
                                 spec=source.spec)
    cmd = _record(user, child, CommandVerb.FORK, key, digest, 201)
    by = user.get_username()
    facts = [("agent.spawned", {"spec": source.spec, "parent": parent_id, "by": by,
                                "command": cmd.pk, "fork": origin})]
    first = _first_prompt(user, child, prompt) if prompt is not None else None
    if first is not None:
        facts.append(("command.prompt", {"text": prompt, "command": first.pk, "by": by}))
    records = journal.append_many(child.id, facts)
    if parent is not None:
        journal.append(parent.id, "agent.child_spawned", {"child": child.id, "command": cmd.pk})
    body = {"id": child.id, "status": AgentStatus.STARTING.value, "sandbox_id": None,
            "parent": parent_id, "forked_from": origin, "command": cmd.pk}
    _finish(cmd, body, records[0].seq)
    if first is not None:
        from .commands import _accepted

        _finish(first, _accepted(first, child, "prompt", records[1].seq), records[1].seq)
    return Outcome(201, body)


def _from_checkpoint(source: Agent, checkpoint_id: int) -> dict:
    cp = Checkpoint.objects.filter(pk=checkpoint_id, agent=source).first()
    if cp is None:
        raise CommandRefused(404, "checkpoint.not_found", f"Agent {source.id} has no checkpoint {checkpoint_id}.")
    ws = source.workspace
    expires = min(cp.expires_at, cp.created_at + timedelta(days=ws.checkpoint_max_age_days))
    usable = (not ws.zero_data_retention and cp.deleted_at is None and expires > timezone.now()
              and cp.path and Path(cp.path).is_file())
    if not usable:
        raise CommandRefused(
            409, "runtime.checkpoint_expired",
            f"Checkpoint {cp.pk} of agent {source.id} has expired or been deleted; fork from an "
            "event instead (at_event) for a conversation-only fork on a fresh disk.",
        )
    return {"agent": source.id, "checkpoint": cp.pk, "through_seq": cp.through_seq, "turn": cp.turn}


def _from_event(source: Agent, seq: int) -> dict:
    readable = (seq <= source.last_seq
                and Event.objects.filter(agent=source, seq__lte=seq).count() == seq)
    if readable:
        try:
            journal.replay(source.id, through=seq, write_snapshot=False)
        except journal.JournalError:
            readable = False
    if not readable:
        raise CommandRefused(
            409, "runtime.session_history_unavailable",
            f"The transcript of agent {source.id} through event {seq} is not completely readable "
            f"(its head is {source.last_seq}).",
        )
    return {"agent": source.id, "at_event": seq}
