"""`POST /api/agents/{id}/approve` and `…/deny`: an operator approves, or
refuses, the held credential bindings an agent waits for (sessions/approvals.py
reads what it waits for from the transcript). A denial closes the request:
the agent cannot start, and the worker ends it as lost with the denial as the
reason. An operator is staff or holds the permission
``agent_sessions.approve_credentials`` (sessions/access.py may_approve); any
other member gets 403 ``approval.forbidden``, and nothing is written."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from sessions import journal
from sessions.access import APPROVE_PERMISSION, may_approve
from sessions.approvals import APPROVED, DENIED, state_of
from sessions.models import Command, CommandState, CommandVerb

from .base import (
    CommandRefused,
    Outcome,
    body_object,
    check_key,
    execute,
    locked,
    only,
    record,
    refuse_if_ended,
    request_hash,
    wake_worker,
)


REASON_MAX = 500


def approve(user, agent_id: str, body: Any, key: str | None = None) -> Outcome:
    """{"bindings": [names]?, "reason": text?} → 202: approve the held bindings the agent waits
    for (default: all of them) for its next sandbox start. Idempotent by
    Idempotency-Key; 409 approval.not_requested when nothing waits."""
    key = check_key(key)
    body = body_object(body)
    only(body, ("bindings", "reason"))
    reason = _reason(body, required=False)
    names = body.get("bindings")
    if names is not None:
        if (not isinstance(names, list) or not names
                or not all(isinstance(n, str) and n for n in names)):
            raise CommandRefused(400, "request.invalid",
                                 "bindings must be a non-empty list of binding names.")
        names = list(dict.fromkeys(names))
    digest = request_hash("approve", agent_id, body)
    return execute(user, key, digest,
                   partial(_approve, user, agent_id, names, reason, key, digest))


def deny(user, agent_id: str, body: Any, key: str | None = None) -> Outcome:
    """{"reason": text} → 202: refuse every held binding the agent waits for. It
    cannot start without them: the worker ends it as lost (agent.lost, with who
    and why); its transcript and checkpoints stay. The reason is required."""
    key = check_key(key)
    body = body_object(body)
    only(body, ("reason",))
    reason = _reason(body, required=True)
    digest = request_hash("deny", agent_id, body)
    return execute(user, key, digest, partial(_deny, user, agent_id, reason, key, digest))


def _reason(body: dict, required: bool) -> str:
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > REASON_MAX:
        raise CommandRefused(400, "request.invalid", f"reason must be a text of at most {REASON_MAX} characters.")
    if required and not reason.strip():
        raise CommandRefused(400, "request.invalid",
                             "Say why (reason): a denial ends the agent, and the why is journaled.")
    return reason.strip()


def _waiting(user, agent_id: str):
    """The agent (locked) and its open approval request; 404, 403, 409 otherwise."""
    agent = locked(user, agent_id, "agent")  # another workspace's agent: 404 first
    if not may_approve(user):
        raise CommandRefused(
            403, "approval.forbidden",
            f"Approving or denying held credentials needs a workspace operator: staff, or the "
            f"permission {APPROVE_PERMISSION} (an admin grants it to a user or a group in the "
            f"admin). {user.get_username()} has neither.", permission=APPROVE_PERMISSION)
    refuse_if_ended(agent)
    state = state_of(agent)
    if not state.waiting:
        raise CommandRefused(
            409, "approval.not_requested",
            f"Agent {agent.id} is not waiting for a credential approval"
            + (" (it holds no credential for approval)." if not state.held else "."),
        )
    return agent, state


def _done(cmd, fact, body: dict) -> Outcome:
    """The decision is acted on here (its fact is the act): nothing is left for
    the worker but to be woken, to start the sandbox or end the agent now."""
    Command.objects.filter(pk=cmd.pk).update(response_body=body, seq=fact.seq,
                                            state=CommandState.DONE, acted_at=timezone.now())
    transaction.on_commit(partial(wake_worker, [cmd.pk]))
    return Outcome(202, body)


def _deny(user, agent_id: str, reason: str, key, digest) -> Outcome:
    agent, state = _waiting(user, agent_id)
    names = list(state.missing)
    cmd = record(user, agent, CommandVerb.DENY, key, digest, 202)
    fact = journal.append(agent.id, DENIED, {"bindings": names, "by": user.get_username(),
                                             "reason": reason, "command": cmd.pk})
    return _done(cmd, fact, {"command": cmd.pk, "agent": agent.id, "verb": "deny",
                             "seq": fact.seq, "bindings": names, "state": "done"})


def _approve(user, agent_id: str, names: list[str] | None, reason: str, key, digest) -> Outcome:
    agent, state = _waiting(user, agent_id)
    if names is None:
        names = list(state.missing)
    unknown = [n for n in names if n not in state.held]
    if unknown:
        raise CommandRefused(
            400, "approval.unknown_binding",
            f"Agent {agent.id} holds no binding named {unknown[0]!r} for approval; "
            f"it waits for {', '.join(state.missing)}.", bindings=list(state.missing))
    cmd = record(user, agent, CommandVerb.APPROVE, key, digest, 202)
    by = user.get_username()
    data = {"bindings": names, "by": by, "command": cmd.pk, **({"reason": reason} if reason else {})}
    fact = journal.append(agent.id, APPROVED, data)  # who, and why: the journal keeps both
    waiting = [n for n in state.missing if n not in names]
    return _done(cmd, fact, {"command": cmd.pk, "agent": agent.id, "verb": "approve",
                             "seq": fact.seq, "bindings": names, "waiting_for": waiting,
                             "state": "done"})
