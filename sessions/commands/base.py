"""What every command shares: the one transaction it runs in, idempotency,
the checks of a request body, and the one refusal type.

A command is journaled first and acted on later (by the worker). Each one runs
in ONE transaction (:func:`execute`) that (1) looks up the caller's
Idempotency-Key, (2) writes the transcript fact(s) through sessions.journal and
(3) stores the Command row with the response. A crash therefore never leaves a
fact without its command or a command without its fact, and a retried request
— also after a restart — gets the stored response with no second effect.

Callers (the JSON API, the dashboard) pass the request body as parsed JSON;
everything a client can get wrong is refused as a :class:`CommandRefused` (4xx).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from django.conf import settings
from django.db import IntegrityError, transaction

from sessions import wakeups
from sessions.access import visible_agent
from sessions.models import Agent, AgentStatus, Command, CommandState

log = logging.getLogger(__name__)

MAX_KEY = 255
MAX_REASON = 1000


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


# --- idempotency and the transaction ---------------------------------------------------


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


def execute(user, key: str | None, digest: str, act: Callable[[], Outcome]) -> Outcome:
    """Run ``act`` in one transaction, unless ``key`` was used before: then
    answer as the first request was answered (422 when it asked for something else)."""
    try:
        with transaction.atomic():
            stored = stored_outcome(user, key, digest)
            return stored if stored is not None else act()
    except IntegrityError:
        # A concurrent request with the same key committed first (the unique
        # constraint on (user, key) refused our row and rolled everything
        # back): answer as that request was answered.
        stored = stored_outcome(user, key, digest)
        if stored is None:
            raise
        return stored


def stored_outcome(user, key: str | None, digest: str) -> Outcome | None:
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


def record(user, agent: Agent, verb: str, key: str | None, digest: str, status: int) -> Command:
    """The Command row of a request (its response is stored by :func:`finish`)."""
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


def finish(cmd: Command, body: dict, seq: int) -> None:
    """Store the response with the command, and wake the worker once it is committed."""
    Command.objects.filter(pk=cmd.pk).update(response_body=body, seq=seq)
    transaction.on_commit(partial(wake_worker, [cmd.pk]))


def accepted(cmd: Command, agent: Agent, verb: str, seq: int) -> dict:
    """The 202 body of a command the worker will act on."""
    return {
        "command": cmd.pk,
        "agent": agent.id,
        "verb": verb,
        "seq": seq,
        "state": CommandState.PENDING.value,
    }


# --- the agent a command acts on -----------------------------------------------------------


def locked(user, agent_id: Any, what: str) -> Agent:
    """The visible agent, row-locked for this transaction (PostgreSQL; SQLite's
    IMMEDIATE transaction already holds the write lock), else a 404."""
    visible = visible_agent(user, agent_id) if isinstance(agent_id, str) else None
    if visible is None:
        raise CommandRefused(404, f"{what}.not_found", f"No such {what}: {str(agent_id)[:64]!r}.")
    return (
        Agent.objects.select_for_update(of=("self",)).select_related("workspace").get(pk=visible.pk)
    )


def refuse_if_ended(agent: Agent) -> None:
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


# --- body checks ---------------------------------------------------------------------


def body_object(body: Any) -> dict:
    """The request body as a JSON object ({} when absent) holding only storable text."""
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


def only(body: dict, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise CommandRefused(
            400,
            "request.unknown_keys",
            f"Unknown key(s): {', '.join(unknown)}; this request takes {', '.join(allowed)}.",
        )


def text(field: str, value: Any) -> str:
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


def optional_text(field: str, value: Any) -> str | None:
    return None if value is None else text(field, value)


def reason(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_REASON:
        raise CommandRefused(
            400, "request.invalid", f"reason must be a string of at most {MAX_REASON} characters."
        )
    return value


def parent_id(body: dict) -> str | None:
    value = body.get("parent")
    if value is not None and not isinstance(value, str):
        raise CommandRefused(400, "request.invalid", "parent must be an agent id (a string) or null")
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
