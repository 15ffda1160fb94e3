"""GET /api/workspaces/{name}/stream (and GET /api/agents/stream, the caller's
first workspace): the agent tree as server-sent events.

The same consumer as an agent's stream (sessions/api/stream.py: cursor from
Last-Event-ID else ?after=, retry, heartbeats, a bounded buffer per client,
the same open-streams quota), on the workspace's shared tree tail
(sessions/api/tree_tail.py). Events: ``node`` (one agent's node: agent,
parent, status, html — draw it in place of the old one, or add it under its
parent) and ``tree`` (every node, oldest first: draw the tree again); each
``id`` is the tree seq (sessions/dashboard/tree_nodes.py).

Any member of the workspace may follow it; another workspace is a 404 (its
name cannot be probed), /api/agents/stream for a user in no workspace a 403.
"""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async

from sessions.access import default_workspace, workspaces_of

from .errors import ApiError, not_found
from .stream import RETRY_MS, Allowed, TranscriptStream, stream_user
from .tails import Rows
from .tree_tail import TREE_TAILS


@database_sync_to_async
def _authorize_workspace(authorization: str | None, session_user, name: str) -> Allowed:
    user = stream_user(authorization, session_user)
    if name:
        # A NUL is refused by PostgreSQL in a query (a 500).
        bad = "\x00" in name or len(name) > 100  # no workspace has such a name
        workspace = None if bad else workspaces_of(user).filter(name=name).first()
        if workspace is None:
            raise not_found("workspace")
    else:
        workspace = default_workspace(user)
        if workspace is None:
            raise ApiError(403, "workspace.none", "You are a member of no workspace; ask an admin.")
    return Allowed(workspace.pk, user.pk, workspace.name, workspace.pk, workspace.max_streams_per_user)


class TreeStream(TranscriptStream):
    """One open tree stream; ``agent_id`` holds the workspace's pk."""

    tails = TREE_TAILS

    async def authorize(self, authorization: str | None, session_user, target_id: str) -> Allowed:
        return await _authorize_workspace(authorization, session_user, target_id)

    def offer(self, rows: Rows) -> None:
        # A node is state: every one the tail reads goes out, even at the same
        # seq (a status written without a fact); twice is harmless, none is not.
        if not self.behind and not self.closed:
            self._queue(rows.blob, rows.last)

    async def _catch_up(self) -> None:
        """Join the tree tail: it sends what this cursor misses, from what it holds."""
        if not self._join():
            await asyncio.sleep(RETRY_MS / 1000)  # the tail is closing: the next one takes us
