"""Sandbox sessions (docs/API.md "Sandbox sessions"): create, exec, checkpoint,
resume, remove. Like every command: checked, then ONE transaction that
stores the Command row and journals ``command.<verb>`` in the session's
journal (sessions/sbjournal.py); the worker acts on it later
(sessions/worker/sbrunner.py) and the caller reads the outcome at
``GET /api/commands/{id}``. A refusal writes nothing.

A session takes one of its workspace's ``max_sandboxes`` slots at create
(the same quota agents' sandboxes count against, sessions/worker/slots.py)
and holds it until it is removed; beyond the quota a create is refused
(429 ``quota.sandboxes``): a script is better told than kept waiting.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from sessions import sbjournal, specs
from sessions.access import default_workspace
from sessions.models import (
    Agent,
    CommandState,
    CommandVerb,
    ENDED,
    SandboxSession,
    SandboxSessionStatus,
    session_slots_in_use,
)

from . import quotas
from .base import (
    CommandRefused,
    Outcome,
    body_object,
    check_key,
    execute,
    finish,
    only,
    request_hash,
)
from .spawn import named_limits, no_sandbox

#: The spec fields a sandbox session takes (the rest of an agent's spec is the bridge's).
SPEC_KEYS = ("image", "packages", "setup", "network", "limits")
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_ARGS = 256
MAX_ARG_CHARS = 8192
MAX_ARGV_CHARS = 65536
MAX_CWD = 1024
TIMEOUT_DEFAULT = 60
TIMEOUT_MAX = 3600
VERBS = {"exec": CommandVerb.SB_EXEC, "checkpoint": CommandVerb.SB_CHECKPOINT,
         "resume": CommandVerb.SB_RESUME, "remove": CommandVerb.SB_REMOVE}


def refuse(code: str, message: str, status: int = 400, **extra) -> CommandRefused:
    return CommandRefused(status, code, message, **extra)


# --- checks ------------------------------------------------------------------------------


def check_name(field: str, value: Any) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise refuse("request.invalid", f"{field} must be 1-63 of a-z 0-9 _ . - starting with a "
                     "letter or digit (no path characters).", field=field)
    return value


def check_argv(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise refuse("exec.invalid_argv", "argv must be a non-empty list of strings.", field="argv")
    if len(value) > MAX_ARGS:
        raise refuse("exec.invalid_argv", f"argv has {len(value)} items; at most {MAX_ARGS}.",
                     field="argv")
    total = 0
    for i, arg in enumerate(value):
        if not isinstance(arg, str) or (i == 0 and not arg):
            raise refuse("exec.invalid_argv", f"argv[{i}] must be a string (argv[0] not empty).",
                         field=f"argv[{i}]")
        if "\x00" in arg or len(arg) > MAX_ARG_CHARS:
            raise refuse("exec.invalid_argv", f"argv[{i}] holds a NUL or is over {MAX_ARG_CHARS} "
                         "characters.", field=f"argv[{i}]")
        total += len(arg)
    if total > MAX_ARGV_CHARS:
        raise refuse("exec.invalid_argv", f"argv is {total} characters; at most {MAX_ARGV_CHARS}.",
                     field="argv")
    return list(value)


def check_cwd(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > MAX_CWD:
        raise refuse("exec.invalid_cwd", f"cwd must be a path of 1-{MAX_CWD} characters "
                     "(relative paths are under the sandbox's home).", field="cwd")
    return value


def check_timeout(value: Any) -> int:
    if value is None:
        return TIMEOUT_DEFAULT
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= TIMEOUT_MAX:
        raise refuse("exec.invalid_timeout", f"timeout must be a whole number of seconds, "
                     f"1-{TIMEOUT_MAX}.", field="timeout")
    return value


def session_spec(body: dict) -> dict:
    """The validated spec: ``spec`` (its sandbox fields) or ``image`` alone."""
    raw = body.get("spec")
    if "image" in body:
        if raw is not None:
            raise refuse("request.invalid", "Give spec or image, not both.")
        raw = {"image": body["image"]}
    if raw is not None and not isinstance(raw, dict):
        raise refuse("spec.invalid", "spec must be an object.", field="spec")
    unknown = sorted(set(raw or {}) - set(SPEC_KEYS))
    if unknown:
        raise refuse("spec.invalid", f"A sandbox session's spec takes {', '.join(SPEC_KEYS)}; "
                     f"not {', '.join(unknown)}.", field=unknown[0])
    try:
        full = specs.validate_for_spawn(raw)
    except specs.SpecError as exc:
        raise refuse("spec.invalid", str(exc), field=exc.field) from exc
    except specs.SandboxUnavailable as exc:
        raise no_sandbox(exc) from exc
    return {k: full[k] for k in SPEC_KEYS}


# --- create ---------------------------------------------------------------------------------


def create(user, body: Any, key: str | None = None) -> Outcome:
    """body {"spec": {...}? | "image": str?, "name": str?} → 201 {"id", "status", "command"}."""
    key = check_key(key)
    body = body_object(body)
    only(body, ("spec", "image", "name"))
    name = check_name("name", body["name"]) if body.get("name") is not None else ""
    spec = session_spec(body)
    digest = request_hash("sb_create", None, body)
    named = named_limits(body.get("spec"))
    return execute(user, key, digest, partial(_create, user, spec, name, named, key, digest))


def _create(user, spec: dict, name: str, named: set[str], key, digest) -> Outcome:
    workspace = default_workspace(user)
    if workspace is None:
        raise refuse("workspace.none", "You are not a member of any workspace, so you cannot "
                     "create sandbox sessions.", 403)
    workspace = quotas.locked_workspace(workspace.pk)
    spec = quotas.capped_limits(workspace, spec, named)
    used = slots_in_use(workspace.pk)
    if used >= workspace.max_sandboxes:
        raise refuse("quota.sandboxes", f"Workspace {workspace.name!r} has {used} sandboxes in "
                     f"use (agents and sandbox sessions), its quota of {workspace.max_sandboxes}. "
                     f"Remove a sandbox session or stop an agent first. "
                     f"{quotas.how_to_raise(workspace, 'max_sandboxes')}", 429,
                     quota="max_sandboxes", limit=workspace.max_sandboxes, in_use=used)
    session = SandboxSession.objects.create(workspace=workspace, created_by=user, name=name,
                                            spec=spec)
    cmd = _record(user, session, CommandVerb.SB_CREATE, key, digest, 201)
    seq = sbjournal.append(session.pk, "session.created", {
        "spec": spec, "name": name, "by": user.get_username(), "command": cmd.pk})
    out = {"id": session.pk, "name": name, "status": SandboxSessionStatus.STARTING.value,
           "sandbox_id": None, "command": cmd.pk}
    finish(cmd, out, seq)
    return Outcome(201, out)


def slots_in_use(workspace_id: int) -> int:
    """Sandbox slots held in the workspace: agents' (sessions/worker/slots.py) and sessions'."""
    agents = (Agent.objects.filter(workspace_id=workspace_id, sandbox_slot=True)
              .exclude(status__in=ENDED).count())
    return agents + session_slots_in_use(workspace_id)


def _record(user, session: SandboxSession, verb: str, key, digest, status: int):
    return session.commands.create(workspace_id=session.workspace_id, user=user, verb=verb,
                                   idempotency_key=key, request_hash=digest,
                                   response_status=status, response_body={})


# --- exec, checkpoint, resume, remove --------------------------------------------------------


def send(user, session_id: str, verb: str, body: Any, key: str | None = None) -> Outcome:
    """A command to a visible session → 202 {"command", "sandbox", "verb", "seq", "state"}."""
    if verb not in VERBS:
        raise refuse("command.unknown", f"No such sandbox session command: {verb[:40]!r}.", 404)
    key = check_key(key)
    body = body_object(body)
    args = _args(verb, body)
    digest = request_hash(f"sb_{verb}", session_id, body)
    return execute(user, key, digest, partial(_send, user, session_id, verb, args, key, digest))


def _args(verb: str, body: dict) -> dict:
    if verb == "exec":
        only(body, ("argv", "cwd", "timeout"))
        return {"argv": check_argv(body.get("argv")), "cwd": check_cwd(body.get("cwd")),
                "timeout": check_timeout(body.get("timeout"))}
    if verb == "checkpoint":
        only(body, ("name",))
        return {"name": check_name("name", body.get("name"))}
    only(body, ())
    return {}


def _send(user, session_id: str, verb: str, args: dict, key, digest) -> Outcome:
    session = locked(user, session_id)
    if session.status == SandboxSessionStatus.REMOVED:
        raise refuse("sandbox.removed", f"Sandbox session {session.pk} was removed; its journal "
                     "is kept. Create a new one.", 409)
    if verb == "checkpoint":
        _check_snapshot(session, args["name"])
    cmd = _record(user, session, VERBS[verb], key, digest, 202)
    seq = sbjournal.append(session.pk, f"command.{verb}",
                           {**args, "command": cmd.pk, "by": user.get_username()})
    out = {"command": cmd.pk, "sandbox": session.pk, "verb": verb, "seq": seq,
           "state": CommandState.PENDING.value}
    finish(cmd, out, seq)
    return Outcome(202, out)


def _check_snapshot(session: SandboxSession, name: str) -> None:
    if session.workspace.zero_data_retention:
        raise refuse("checkpoint.zero_data_retention", f"Workspace {session.workspace.name!r} "
                     "keeps no data: sandbox sessions take no snapshots there.", 409)
    if any(s["name"] == name for s in sbjournal.snapshots(session.pk)):
        raise refuse("snapshot.exists", f"Sandbox session {session.pk} already has a snapshot "
                     f"named {name!r}; pick another name.", 409, field="name")


def locked(user, session_id: Any) -> SandboxSession:
    """The visible session, row-locked for this transaction, else a 404."""
    row = None
    if isinstance(session_id, str) and len(session_id) <= 32:
        row = (SandboxSession.objects.select_for_update(of=("self",)).select_related("workspace")
               .filter(pk=session_id, workspace__members=user).first())
    if row is None:
        raise refuse("sandbox.not_found", f"No such sandbox session: {str(session_id)[:64]!r}.",
                     404)
    return row
