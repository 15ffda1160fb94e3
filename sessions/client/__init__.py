"""The Alineo Python client: drive agents from scripts and services.

One package, standard library only (no Django): copy the `client/` directory
next to your script.
The agent lives in its sandbox, not in your process — kill your process, come
back tomorrow, and pick the same agent up by its id::

    from client import Alineo, text_only

    agent = Alineo.start({"model": "demo"}, url=URL, token=TOKEN)
    print("".join(text_only(agent.prompt("say: hello"))))

    # later, from any process:
    try:
        agent = Alineo.reattach(agent_id, url=URL, token=TOKEN)   # the bridge is kept
    except BridgeUnavailable:
        agent = Alineo.resume(agent_id, url=URL, token=TOKEN)     # the bridge restarted
    for chunk in agent.follow():                                  # the rest of a running turn
        ...

Four ways back in: :meth:`Alineo.start` (a new agent), :meth:`Alineo.reattach`
(keep the bridge; a running turn keeps running), :meth:`Alineo.resume` (restart
the bridge on its session; a running turn is dropped) and :meth:`Alineo.attach`
(touch nothing: metadata, sandbox handle, spawn — no prompt).

Every POST carries an ``Idempotency-Key`` made once per call and reused on its
retries; network errors and 502/503/504 are retried with bounded backoff.
Streams resume from their cursor (``Last-Event-ID``) after a dropped
connection: never a repeated or a missing chunk. Errors are
:class:`AlineoError` (``status``, ``code``, ``message``, ``permanent``) and its
subclasses. :class:`Sandbox` drives sandbox sessions (create, exec, checkpoint,
resume, remove) with the same rules. The reference is docs/CLIENT.md.
"""

from .agents import Agent, AgentSandbox, Alineo, AttachedAgent
from .errors import (
    AgentEnded,
    AlineoError,
    AuthError,
    BridgeUnavailable,
    CheckpointExpired,
    CheckpointFailed,
    CommandFailed,
    Conflict,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    ReplayDiverged,
    SandboxLost,
    ServerError,
    Timeout,
    TransportError,
)
from .sandboxes import ExecResult, Sandbox
from .turns import Chunk, Event, Turn, reply_text, text_only

__all__ = [
    "Alineo", "Agent", "AttachedAgent", "AgentSandbox", "Sandbox", "ExecResult", "Turn", "Chunk",
    "Event", "text_only",
    "reply_text", "AlineoError", "TransportError", "AuthError", "NotFound", "Conflict",
    "AgentEnded", "CheckpointExpired", "InvalidRequest", "QuotaExceeded", "ServerError",
    "CommandFailed",
    "BridgeUnavailable", "CheckpointFailed", "Timeout", "SandboxLost", "ReplayDiverged",
]
