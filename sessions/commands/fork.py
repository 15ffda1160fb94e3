"""POST /api/agents/{id}/fork: a new agent that starts where another one was.

- `{"checkpoint": id}`: the checkpoint's disk and its conversation through the
  checkpoint's boundary. An expired, deleted or unreadable checkpoint is a 409
  `runtime.checkpoint_expired` — never silently a log-only fork.
- `{"at_event": seq}`: a conversation-only fork rebuilt from the transcript
  prefix 1..seq on a fresh disk; 409 `runtime.session_history_unavailable`
  when that complete prefix cannot be read.

The source agent is not touched. A fork is a new agent: it fits the
workspace's quotas, and under a ``parent`` it is no wider than that parent
(sessions/commands/lineage.py). The fork's `agent.spawned` fact records where
it came from (`fork`), and the worker builds its sandbox from that
(sessions/worker/ladder.py, provision_fork).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from django.utils import timezone

from sessions import journal, specs
from sessions.models import Agent, Checkpoint, CommandVerb, Event

from .base import (
    CommandRefused,
    Outcome,
    body_object,
    check_key,
    execute,
    locked,
    only,
    optional_text,
    parent_id,
    refuse_if_ended,
    request_hash,
)
from . import lineage, quotas
from .spawn import create_agent, no_sandbox, normalized

ORIGINS = ("checkpoint", "at_event")
NAME_MAX = 100  # as a spec's name (sessions/specs.py)


def fork(user, agent_id: str, body: Any, key: str | None = None) -> Outcome:
    key = check_key(key)
    body = body_object(body)
    only(body, (*ORIGINS, "parent", "prompt", "name"))
    if ("checkpoint" in body) == ("at_event" in body):
        raise CommandRefused(400, "request.invalid", "Give exactly one of checkpoint or at_event.")
    for field in ORIGINS:
        value = body.get(field)
        if field in body and (not isinstance(value, int) or isinstance(value, bool) or value < 1
                              or value > 2**62):
            raise CommandRefused(400, "request.invalid", f"{field} must be a positive integer.")
    try:
        specs.require_backend()
    except specs.SandboxUnavailable as exc:
        raise no_sandbox(exc) from exc
    parent = parent_id(body)
    prompt = optional_text("prompt", body.get("prompt"))
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > NAME_MAX):
        raise CommandRefused(400, "request.invalid", f"name must be a string of at most {NAME_MAX} characters.")
    digest = request_hash("fork", agent_id, body)
    return execute(user, key, digest,
                   partial(_fork, user, agent_id, body, parent, prompt, key, digest))


def fork_name(name: str | None, source: Agent) -> str:
    """The fork's own name: the one asked for, else its source's with "(fork)" —
    never the source's name as is (the tree would show two of one agent)."""
    if name and name.strip():
        return name.strip()
    base = str((source.spec or {}).get("name") or "").strip()
    return (f"{base[:NAME_MAX - 7]} (fork)" if base else f"fork of {source.id}")[:NAME_MAX]


def _fork(user, agent_id, body, parent_id, prompt, key, digest) -> Outcome:
    source = locked(user, agent_id, "agent")
    origin = (_from_checkpoint(source, body["checkpoint"]) if "checkpoint" in body
              else _from_event(source, body["at_event"]))
    parent = locked(user, parent_id, "parent") if parent_id is not None else None
    if parent is not None:
        refuse_if_ended(parent)
        lineage.refuse_if_wider(parent.id, normalized(parent.spec), normalized(source.spec))
    # A fork is a new agent: the workspace's quotas hold for it as for a spawn
    # (its limits are the source's, lowered to the caps if these shrank since).
    workspace = quotas.locked_workspace(source.workspace_id)
    spec = quotas.check_spawn(workspace, parent, source.spec, set())
    spec = {**spec, "name": fork_name(body.get("name"), source)}
    return create_agent(user, workspace=workspace, parent=parent, spec=spec,
                        prompt=prompt, verb=CommandVerb.FORK, key=key, digest=digest, fork=origin)


def _from_checkpoint(source: Agent, checkpoint_id: int) -> dict:
    cp = Checkpoint.objects.filter(pk=checkpoint_id, agent=source).first()
    if cp is None:
        raise CommandRefused(404, "checkpoint.not_found", f"Agent {source.id} has no checkpoint {checkpoint_id}.")
    ws = source.workspace
    usable = (not ws.zero_data_retention and cp.deleted_at is None
              and cp.expires_under(ws.checkpoint_max_age_days) > timezone.now()
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
