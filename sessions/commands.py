"""Idempotent commands: spawn, prompt, steer, interrupt, pause, resume, stop,
and the client's reattach, rebridge (its "resume") and checkpoint.

A command is journaled first and acted on later (by the worker). Each one runs
in ONE transaction that (1) looks up the caller's Idempotency-Key, (2) writes
the transcript fact(s) through sessions.journal and (3) stores the Command row
with the response. A crash therefore never leaves a fact without its command
or a command without its fact, and a retried request — also after a restart —
gets the stored response with no second effect.

Callers (the JSON API, the dashboard) pass the request body as parsed JSON;
everything a client can get wrong is refused here as a CommandRefused (4xx).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction

from . import credentials, journal, specs, wakeups
from .api.auth import default_workspace, visible_agent
from .models import Agent, AgentStatus, Command, CommandState, CommandVerb

log = logging.getLogger(__name__)

AGENT_VERBS = ("prompt", "steer", "interrupt", "pause", "resume", "stop")
# Verbs whose caller waits for an outcome (Command.result, GET /api/commands/{id});
# the worker acts on them in sandboxes/operations.py.
OPERATION_VERBS = ("reattach", "rebridge", "checkpoint")
TEXT_VERBS = ("prompt", "steer")
MAX_KEY = 255
MAX_REASON = 1000
# Statuses a paused agent may go back to; anything else resumes as idle.


class CommandRefused(Exception):
    """The command cannot run; `status`, `code` and `message` are the API's error."""

    def __init__(self, status: int, code: str, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


@dataclass(frozen=True)
class Outcome:
    status: int
    body: dict
    replayed: bool = False  # True when this is the stored answer to an earlier request


# --- public entry points --------------------------------------------------------


def spawn(user, body: Any, key: str | None = None) -> Outcome:
    """Spawn an agent: body {"spec": {...}?, "parent": id?, "prompt": str?} → 201."""
    key = check_key(key)
    body = _object(body)
    _only(body, ("spec", "parent", "prompt"))
    try:
        spec = specs.validate_for_spawn(body.get("spec"))
    except specs.SpecError as exc:
        raise CommandRefused(400, "spec.invalid", str(exc), field=exc.field) from exc
    parent_id = body.get("parent")
    if parent_id is not None and not isinstance(parent_id, str):
        raise CommandRefused(
            400, "request.invalid", "parent must be an agent id (a string) or null"
        )
    prompt = body.get("prompt")
    prompt = None if prompt is None else _text("prompt", prompt)
    digest = request_hash("spawn", None, body)
    act = partial(_spawn, user, spec, parent_id, prompt, key, digest)
    return _execute(user, key, digest, act)


def send(user, agent_id: str, verb: str, body: Any, key: str | None = None) -> Outcome:
    """Send `verb` to an agent: prompt/steer take {"text"}; the others take {"reason"?}. → 202."""
    if verb not in AGENT_VERBS + OPERATION_VERBS:
        raise CommandRefused(404, "command.unknown", f"No such command {verb!r}.")
    key = check_key(key)
    body = _object(body)
    if verb in TEXT_VERBS:
        _only(body, ("text",))
        if "text" not in body:
            raise CommandRefused(400, "request.invalid", "text is required")
        payload = {"text": _text("text", body["text"])}
    else:
        _only(body, ("reason",))
        payload = {"reason": _reason(body["reason"])} if "reason" in body else {}
    digest = request_hash(verb, agent_id, body)
    act = partial(_send, user, agent_id, verb, payload, key, digest)
    try:
        return _execute(user, key, digest, act)
    except DatabaseError as exc:
        if not isinstance(exc, IntegrityError) and isinstance(agent_id, str):
            journal.note_unwritable(agent_id, exc)
        raise


def spawn_child(parent_id: str, prompt: str, spec: dict | None, key: str) -> str:
    """A child agent asked for by an agent (the bridge's `request.spawn`): the
    same spawn as the API's, on behalf of the parent's creator, with `key` (the
    worker derives it from the bridge session and request id) as the
    Idempotency-Key, so asking again after a worker crash spawns no second
    child. The child inherits the parent's spec unless `spec` is given.
    Returns the child's id; raises CommandRefused like `spawn`."""
    parent = Agent.objects.select_related("created_by").get(pk=parent_id)
    if parent.created_by is None:
        raise CommandRefused(409, "agent.no_owner", f"Agent {parent_id} has no owner to spawn as.")
    body = {"spec": parent.spec if spec is None else spec, "parent": parent_id, "prompt": prompt}
    return spawn(parent.created_by, body, key).body["id"]


def request_hash(verb: str, target: str | None, body: dict) -> str:
    """A digest of what was asked: the same key with a different digest is a 422."""
    canonical = json.dumps([verb, target, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_key(key: str | None) -> str | None:
    """Return the Idempotency-Key, or None when absent; refuse one that cannot be stored."""
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip():
        raise CommandRefused(400, "idempotency.key_invalid", "Idempotency-Key must not be empty.")
    if len(key) > MAX_KEY:
        raise CommandRefused(
            400, "idempotency.key_invalid", f"Idempotency-Key must be at most {MAX_KEY} characters."
        )
    if not all(" " <= ch <= "~" for ch in key):
        raise CommandRefused(
            400, "idempotency.key_invalid", "Idempotency-Key must be printable ASCII."
        )
    return key


# --- the transaction ---------------------------------------------------------------


def _execute(user, key: str | None, digest: str, act: Callable[[], Outcome]) -> Outcome:
    try:
        with transaction.atomic():
            stored = _stored(user, key, digest)
            return stored if stored is not None else act()
    except IntegrityError:
        # A concurrent request with the same key committed first (the unique
        # constraint on (user, key) refused our row and rolled everything
        # back): answer as that request was answered.
        stored = _stored(user, key, digest)
        if stored is None:
            raise
        return stored


def _stored(user, key: str | None, digest: str) -> Outcome | None:
    if key is None:
        return None
    cmd = Command.objects.filter(user=user, idempotency_key=key).first()
    if cmd is None:
        return None
    if cmd.request_hash != digest:
        raise CommandRefused(
            422,
            "idempotency.key_reused",
            "This Idempotency-Key was already used for a different request; use a new key.",
        )
    return Outcome(cmd.response_status, cmd.response_body, replayed=True)


def _record(user, agent: Agent, verb: str, key: str | None, digest: str, status: int) -> Command:
    return Command.objects.create(
        workspace_id=agent.workspace_id,
        user=user,
        agent=agent,
        verb=verb,
        idempotency_key=key,
        request_hash=digest,
        response_status=status,
        response_body={},
    )


def _finish(cmd: Command, body: dict, seq: int) -> None:
    """Store the response with the command, and wake the worker once it is committed."""
    Command.objects.filter(pk=cmd.pk).update(response_body=body, seq=seq)
    transaction.on_commit(partial(wake_worker, [cmd.pk]))


# --- spawn -----------------------------------------------------------------------------


def _spawn(user, spec: dict, parent_id: str | None, prompt: str | None, key, digest) -> Outcome:
    parent = _locked(user, parent_id, "parent") if parent_id is not None else None
    if parent is not None:
        _refuse_if_ended(parent)
    workspace = parent.workspace if parent is not None else default_workspace(user)
    if workspace is None:
        raise CommandRefused(
            403,
            "workspace.none",
            "You are not a member of any workspace, so you cannot spawn agents.",
        )
    try:
        credentials.check_bindings(workspace, spec.get("credentials") or [])
    except specs.SpecError as exc:
        raise CommandRefused(400, "spec.invalid", str(exc), field=exc.field) from exc
    child = Agent.objects.create(workspace=workspace, parent=parent, created_by=user, spec=spec)
    cmd = _record(user, child, CommandVerb.SPAWN, key, digest, 201)
    by = user.get_username()
    facts = [("agent.spawned", {"spec": spec, "parent": parent_id, "by": by, "command": cmd.pk})]
    first = _first_prompt(user, child, prompt) if prompt is not None else None
    if first is not None:
        facts.append(("command.prompt", {"text": prompt, "command": first.pk, "by": by}))
    records = journal.append_many(child.id, facts)
    if parent is not None:
        journal.append(parent.id, "agent.child_spawned", {"child": child.id, "command": cmd.pk})
    body = {
        "id": child.id,
        "status": AgentStatus.STARTING.value,
        "sandbox_id": None,
        "parent": parent_id,
        "command": cmd.pk,
    }
    _finish(cmd, body, records[0].seq)
    if first is not None:
        _finish(first, _accepted(first, child, "prompt", records[1].seq), records[1].seq)
    return Outcome(201, body)


def _first_prompt(user, child: Agent, prompt: str) -> Command:
    """The first prompt is a command of its own (without a key: the spawn's key
    covers it), so the worker handles every prompt alike."""
    digest = request_hash("prompt", child.id, {"text": prompt})
    return _record(user, child, CommandVerb.PROMPT, None, digest, 202)


# --- commands to an agent --------------------------------------------------------------


def _send(user, agent_id: str, verb: str, payload: dict, key, digest) -> Outcome:
    agent = _locked(user, agent_id, "agent")
    _refuse_if_ended(agent)
    if verb == "checkpoint":
        _refuse_if_no_checkpoints(agent)
    cmd = _record(user, agent, verb, key, digest, 202)
    facts = [(f"command.{verb}", {**payload, "command": cmd.pk, "by": user.get_username()})]
    status = _status_after(agent, verb)
    if status is not None:
        facts.append(
            (
                "agent.status",
                {
                    "status": status,
                    "previous": agent.status,
                    "reason": f"{verb} by {user.get_username()}",
                    "command": cmd.pk,
                },
            )
        )
    records = journal.append_many(agent.id, facts)
    body = _accepted(cmd, agent, verb, records[0].seq)
    _finish(cmd, body, records[0].seq)
    return Outcome(202, body)


def _accepted(cmd: Command, agent: Agent, verb: str, seq: int) -> dict:
    return {
        "command": cmd.pk,
        "agent": agent.id,
        "verb": verb,
        "seq": seq,
        "state": CommandState.PENDING.value,
    }


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


def _locked(user, agent_id: Any, what: str) -> Agent:
    """The visible agent, row-locked for this transaction (PostgreSQL; SQLite's
    IMMEDIATE transaction already holds the write lock), else a 404."""
    visible = visible_agent(user, agent_id) if isinstance(agent_id, str) else None
    if visible is None:
        raise CommandRefused(404, f"{what}.not_found", f"No such {what}: {str(agent_id)[:64]!r}.")
    return (
        Agent.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=visible.pk)
    )


def _refuse_if_ended(agent: Agent) -> None:
    # Only the stored status ends an agent: an in-memory "cannot write" mark
    # clears itself with the next append that succeeds, so the write is tried.
    status = agent.status
    why = f": {agent.status_reason}" if agent.status_reason else ""
    keep = "Its transcript and checkpoints are kept; spawn or fork a new agent to go on."
    if status == AgentStatus.STOPPED:
        raise CommandRefused(
            409,
            "agent.stopped",
            f"Agent {agent.id} is stopped{why}. It and its sandbox have ended. {keep}",
        )
    if status == AgentStatus.LOST:
        raise CommandRefused(
            409,
            "agent.lost",
            f"Agent {agent.id} is lost and could not be brought back{why}. {keep}",
        )
    if status == AgentStatus.UNRECOVERABLE:
        raise CommandRefused(
            409, "agent.unrecoverable", f"Agent {agent.id} is unrecoverable{why}. {keep}"
        )


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


# --- body checks ---------------------------------------------------------------------


def _object(body: Any) -> dict:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise CommandRefused(400, "request.invalid", "The request body must be a JSON object.")
    bad = _bad_string(body)
    if bad:
        raise CommandRefused(400, "request.invalid", f"The request body contains {bad}.")
    return body


def _bad_string(value: Any, depth: int = 0) -> str | None:
    """Describe a string the database cannot store (NUL, lone surrogates), or None.

    PostgreSQL refuses NUL in text and jsonb, and a lone surrogate cannot be
    encoded as UTF-8: both would fail at commit, i.e. be a 5xx. Refuse them here.
    """
    if depth > 64:
        return "nesting deeper than 64 levels"
    if isinstance(value, str):
        if "\x00" in value:
            return "a NUL character"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "text that is not valid Unicode (a lone surrogate)"
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        bad = _bad_string(k, depth + 1) or _bad_string(v, depth + 1)
        if bad:
            return bad
    return None


def _only(body: dict, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise CommandRefused(
            400,
            "request.unknown_keys",
            f"Unknown key(s): {', '.join(unknown)}; this request takes {', '.join(allowed)}.",
        )


def _text(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise CommandRefused(400, "request.invalid", f"{field} must be a string.")
    if not value.strip():
        raise CommandRefused(400, "request.invalid", f"{field} must not be empty.")
    if len(value) > settings.ALINEO_MAX_TEXT:
        raise CommandRefused(
            400,
            "request.text_too_long",
            f"{field} is {len(value)} characters; the limit is {settings.ALINEO_MAX_TEXT}.",
        )
    return value


def _reason(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_REASON:
        raise CommandRefused(
            400, "request.invalid", f"reason must be a string of at most {MAX_REASON} characters."
        )
    return value


# --- waking the worker -----------------------------------------------------------------


def wake_worker(command_ids: list[int]) -> None:
    """Tell the worker that commands are pending. Best effort, never raises:
    a lost wake-up only delays a command, since the worker also scans pending rows."""
    try:
        if not command_ids:
            return
        ids = list(command_ids)
        wakeups.run_on_layer(lambda layer: _send_wakeups(layer, ids))
    except Exception:
        log.warning("worker wake-up for commands %s failed", command_ids, exc_info=True)


async def _send_wakeups(layer, command_ids: list[int]) -> None:
    for command_id in command_ids:
        try:
            await layer.send(
                settings.ALINEO_WORKER_CHANNEL, {"type": "command.pending", "command": command_id}
            )
        except Exception:  # ChannelFull and friends: the worker's scan covers it
            log.warning("worker wake-up for command %s dropped", command_id, exc_info=True)
