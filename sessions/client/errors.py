"""The client's exceptions: one root, AlineoError, with `permanent` for callers that retry."""

from __future__ import annotations

from typing import Any

RETRY_STATUSES = (502, 503, 504)  # answered by a proxy or a busy server: try again

# --- errors ------------------------------------------------------------------------------


class AlineoError(Exception):
    """The root of every error this client raises.

    ``status`` is the HTTP status (None when no answer came), ``code`` the
    API's error code (e.g. ``agent.not_found``), ``message`` a sentence for a
    human, ``permanent`` True when repeating the same call cannot succeed,
    ``body`` the whole error answer."""

    permanent = True

    def __init__(self, message: str, *, status: int | None = None, code: str = "error",
                 body: dict | None = None, permanent: bool | None = None):
        super().__init__(f"{code}: {message}" if code else message)
        self.message, self.status, self.code = message, status, code
        self.body = body or {}
        if permanent is not None:
            self.permanent = permanent


class TransportError(AlineoError):
    """No usable answer after every retry: the server is unreachable, the
    connection broke, or it answered 502/503/504. Try again later."""

    permanent = False


class AuthError(AlineoError):
    """401/403: no token, a bad token, or a refused session request."""


class NotFound(AlineoError):
    """404: no such agent (or command, checkpoint) — or another workspace's."""


class InvalidRequest(AlineoError):
    """400/405/413/422: the request itself is wrong (bad body, reused key …)."""


class Conflict(AlineoError):
    """409: the agent's state refuses the request."""


class AgentEnded(Conflict):
    """The agent is stopped, lost or unrecoverable; its transcript stays readable."""


class CheckpointExpired(Conflict):
    """409 runtime.checkpoint_expired / runtime.session_history_unavailable."""


class QuotaExceeded(AlineoError):
    """A workspace quota (``quota.agents``, ``quota.depth``, ``quota.limits``,
    ``quota.streams``): ``body`` names it (``quota``, ``limit``). A 429 (agents,
    streams) clears when an agent ends or a stream closes; an admin raises any
    of them (docs/SECURITY.md#children-approvals-and-quotas)."""


class ServerError(AlineoError):
    """A 5xx other than 502/503/504 (a bug on the server)."""

    permanent = False


class CommandFailed(AlineoError):
    """The worker could not act on an accepted command (``code`` says why)."""


class BridgeUnavailable(CommandFailed):
    """reattach: the agent's bridge did not answer within 5 s. Use
    :meth:`Alineo.resume` to restart it on its session."""

    permanent = False


class CheckpointFailed(CommandFailed):
    """take_checkpoint: the checkpoint was not taken (``agent.checkpoint_failed``
    in the transcript). Not a failed turn: the agent carries on."""

    permanent = False


class SandboxLost(CommandFailed):
    """A sandbox session's sandbox is gone (``sandbox.lost``): ``Sandbox.resume`` it."""


class ReplayDiverged(CommandFailed):
    """A resume's replayed exec exited otherwise than recorded (``replay.diverged``);
    ``body["diverged"]`` names it. The session is usable with what ran."""


class Timeout(AlineoError):
    """The outcome did not arrive before the deadline (the command may still be
    acted on later)."""

    permanent = False


def error_for(status: int, body: Any) -> AlineoError:
    body = body if isinstance(body, dict) else {}
    code = str(body.get("code") or f"http.{status}")
    message = str(body.get("message") or f"HTTP {status}")
    if code.startswith("quota.") and 400 <= status < 500:
        return QuotaExceeded(message, status=status, code=code, body=body,
                             permanent=status != 429)
    if status in (401, 403):
        cls = AuthError
    elif status == 404:
        cls = NotFound
    elif status == 409:
        if code in ("agent.stopped", "agent.lost", "agent.unrecoverable"):
            cls = AgentEnded
        elif code in ("runtime.checkpoint_expired", "runtime.session_history_unavailable"):
            cls = CheckpointExpired
        else:
            cls = Conflict
    elif status in RETRY_STATUSES:
        cls = TransportError
    elif status >= 500:
        cls = ServerError
    else:
        cls = InvalidRequest
    return cls(message, status=status, code=code, body=body)


def command_error(result: dict, verb: str) -> AlineoError:
    code = str(result.get("code") or "command.failed")
    message = str(result.get("message") or f"{verb} could not be acted on")
    if code == "runtime.bridge_unavailable":
        cls = BridgeUnavailable
    elif code == "runtime.checkpoint_failed":
        cls = CheckpointFailed
    elif code == "agent_ended":
        cls = AgentEnded
    elif code == "sandbox.lost":
        cls = SandboxLost
    elif code == "replay.diverged":
        cls = ReplayDiverged
    else:
        cls = CommandFailed
    return cls(message, code=code, body=result)
