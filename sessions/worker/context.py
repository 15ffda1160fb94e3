"""What the worker's parts share: the agent as the worker sees it, a pending
command, and the worker's one exception root.

``permanent`` on a :class:`WorkerError` tells the supervisor whether driving
the agent again can help (it backs off and retries the others).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sandboxes.launch import Launch, Secret


class WorkerError(Exception):
    """Root of the worker's failures. ``permanent=True``: retrying cannot help."""

    permanent_default = False

    def __init__(self, message: str, permanent: bool | None = None):
        super().__init__(message)
        self.message = message
        self.permanent = self.permanent_default if permanent is None else permanent


class DriverError(WorkerError):
    """The driver cannot go on now (a new bridge does not answer, the relay ended)."""


class SandboxGone(WorkerError):
    """The sandbox of a driven agent is not running any more: climb the ladder."""


class LadderError(WorkerError):
    """Not now (the engine does not answer, a bridge is slow): try again later."""


class AgentLost(WorkerError):
    """The ladder's last rung: ``agent.lost`` was journaled."""

    permanent_default = True


class CursorMoved(WorkerError):
    """The durable bridge cursor is not where this relay left it: another
    driver journaled these events. This relay must stop."""

    permanent_default = True


class AwaitingApproval(WorkerError):
    """The sandbox cannot start yet: held credentials wait for an operator."""


class BridgeRestarted(WorkerError):
    """The bridge was restarted on request: reconnect (a silent reattach),
    then answer the command."""


class Refused(WorkerError):
    """A request from the bridge (spawn, memory) is refused; ``code`` and the
    message go back to the tool that asked."""

    permanent_default = True

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class AgentInfo:
    """An agent as its driver sees it (sessions/worker/store.py loads it)."""

    id: str
    spec: dict
    status: str
    sandbox_id: str
    cursor: int
    session: str
    zero_retention: bool
    max_age_days: int
    keep: int
    secrets: tuple[Secret, ...] = field(default=())  # bound values: the env, and redaction
    sandbox_host: str = ""  # the engine that holds sandbox_id (sandboxes.backends.backend_for)
    sandbox_slot: bool = False  # holds one of the workspace's sandbox slots (slots.py)
    workspace_id: int = 0
    status_reason: str = ""

    @property
    def launch(self) -> Launch:
        return Launch(self.id, self.spec, self.secrets)

    @property
    def takes_checkpoints(self) -> bool:
        return bool(self.spec.get("checkpoint")) and not self.zero_retention


@dataclass(frozen=True)
class PendingCommand:
    id: int
    verb: str
    text: str | None
