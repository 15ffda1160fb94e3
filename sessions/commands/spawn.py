"""Spawning agents: ``POST /api/agents`` (:func:`spawn`), a child an agent asks
for (:func:`spawn_child`), and the one body both — and a fork
(sessions/commands/fork.py) — run: :func:`create_agent`.

A child's spec starts from its parent's and may not be wider than it
(sessions/commands/lineage.py, 403 ``spawn.escalation``); every spawn fits its
workspace's quotas (sessions/commands/quotas.py, ``quota.*``). Both are
checked inside the spawn's one transaction, so a refusal writes nothing."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction

from sessions import credentials, journal, specs, wakeups
from sessions.access import default_workspace, visible_agent
from sessions.models import Agent, AgentStatus, CommandVerb

from . import lineage, quotas
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
    optional_text,
    parent_id,
    record,
    refuse_if_ended,
    request_hash,
)


def spawn(user, body: Any, key: str | None = None) -> Outcome:
    """Spawn an agent: body {"spec": {...}?, "parent": id?, "prompt": str?} → 201."""
    key = check_key(key)
    body = body_object(body)
    only(body, ("spec", "parent", "prompt"))
    parent = parent_id(body)
    raw = body.get("spec")
    # A child's spec is its parent's with the fields it names over it. The
    # parent's spec never changes, so it can be read before the transaction
    # (an invisible parent is the transaction's 404).
    seen = visible_agent(user, parent) if parent is not None else None
    if seen is not None:
        raw = lineage.child_spec(normalized(seen.spec), raw)
    try:
        spec = specs.validate_for_spawn(raw)
    except specs.SpecError as exc:
        raise CommandRefused(400, "spec.invalid", str(exc), field=exc.field) from exc
    except specs.SandboxUnavailable as exc:
        raise no_sandbox(exc) from exc
    named = named_limits(body.get("spec"))
    prompt = optional_text("prompt", body.get("prompt"))
    digest = request_hash("spawn", None, body)
    return execute(user, key, digest,
                   partial(_spawn, user, spec, parent, prompt, key, digest, named))


def no_sandbox(exc: Exception) -> CommandRefused:
    """The refusal when no sandbox backend works here (sessions/specs.py require_backend)."""
    return CommandRefused(409, "sandbox.unavailable", str(exc))


def spawn_child(parent_id: str, prompt: str, spec: dict | None, key: str) -> str:
    """A child agent asked for by an agent (the bridge's `request.spawn`): the
    same spawn as the API's, on behalf of the parent's creator, with `key` (the
    worker derives it from the bridge session and request id) as the
    Idempotency-Key, so asking again after a worker crash spawns no second
    child. The child's spec is the parent's with the fields `spec` names over
    it, never wider than the parent's (sessions/commands/lineage.py), within
    the workspace's quotas. Returns the child's id; raises CommandRefused like
    `spawn` (the relay sends it back to the tool as its error)."""
    parent = Agent.objects.select_related("created_by").get(pk=parent_id)
    if parent.created_by is None:
        raise CommandRefused(409, "agent.no_owner", f"Agent {parent_id} has no owner to spawn as.")
    body = {"spec": parent.spec if spec is None else spec, "parent": parent_id, "prompt": prompt}
    return spawn(parent.created_by, body, key).body["id"]


def _spawn(user, spec: dict, parent_id: str | None, prompt: str | None, key, digest,
           named: set[str]) -> Outcome:
    parent = locked(user, parent_id, "parent") if parent_id is not None else None
    if parent is not None:
        refuse_if_ended(parent)
        lineage.refuse_if_wider(parent.id, normalized(parent.spec), spec)
    workspace = parent.workspace if parent is not None else default_workspace(user)
    if workspace is None:
        raise CommandRefused(
            403,
            "workspace.none",
            "You are not a member of any workspace, so you cannot spawn agents.",
        )
    workspace = quotas.locked_workspace(workspace.pk)
    try:
        credentials.check_bindings(workspace, spec.get("credentials") or [])
    except specs.SpecError as exc:
        raise CommandRefused(400, "spec.invalid", str(exc), field=exc.field) from exc
    spec = quotas.check_spawn(workspace, parent, spec, named)
    return create_agent(user, workspace=workspace, parent=parent, spec=spec, prompt=prompt,
                        verb=CommandVerb.SPAWN, key=key, digest=digest)


def normalized(spec) -> dict:
    """A stored spec with every default filled in (rows written before a field
    existed lack it); one that no longer validates is compared as stored."""
    try:
        return specs.validate(spec)
    except specs.SpecError:
        return spec if isinstance(spec, dict) else {}


def named_limits(raw) -> set[str]:
    """The limits a request's spec names itself (the others may be lowered to
    the workspace's caps, sessions/commands/quotas.py)."""
    limits = raw.get("limits") if isinstance(raw, dict) else None
    return set(limits) if isinstance(limits, dict) else set()


def create_agent(user, *, workspace, parent: Agent | None, spec: dict, prompt: str | None,
                 verb: str, key: str | None, digest: str, fork: dict | None = None) -> Outcome:
    """The new agent's row, its Command, ``agent.spawned`` (with ``fork``, where
    a fork came from), its first prompt as a command of its own, and
    ``agent.child_spawned`` on the parent — inside the caller's transaction. → 201."""
    child = Agent.objects.create(workspace=workspace, parent=parent, created_by=user, spec=spec)
    # The workspace's tree streams learn of a new root this way (a child's parent wakes them too).
    transaction.on_commit(lambda: wakeups.notify_workspace(workspace.pk))
    cmd = record(user, child, verb, key, digest, 201)
    by = user.get_username()
    parent_id = parent.id if parent is not None else None
    spawned = {"spec": spec, "parent": parent_id, "by": by, "command": cmd.pk}
    if fork is not None:
        spawned["fork"] = fork
    facts = [("agent.spawned", spawned)]
    first = _first_prompt(user, child, prompt) if prompt is not None else None
    if first is not None:
        facts.append(("command.prompt", {"text": prompt, "command": first.pk, "by": by}))
    records = journal.append_many(child.id, facts)
    if parent is not None:
        journal.append(parent.id, "agent.child_spawned", {"child": child.id, "command": cmd.pk})
    body = {"id": child.id, "status": AgentStatus.STARTING.value, "sandbox_id": None,
            "parent": parent_id}
    if fork is not None:
        body["forked_from"] = fork
    body["command"] = cmd.pk
    finish(cmd, body, records[0].seq)
    if first is not None:
        finish(first, accepted(first, child, "prompt", records[1].seq), records[1].seq)
    return Outcome(201, body)


def _first_prompt(user, child: Agent, prompt: str):
    """The first prompt is a command of its own (without a key: the spawn's key
    covers it), so the worker handles every prompt alike."""
    digest = request_hash("prompt", child.id, {"text": prompt})
    return record(user, child, CommandVerb.PROMPT, None, digest, 202)
