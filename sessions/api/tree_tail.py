"""One shared reader of a workspace's tree per serving process.

The tree stream (GET /api/workspaces/{name}/stream, sessions/api/tree_stream.py)
follows the same rules as an agent's stream, with the tree seq as its cursor
(sessions/dashboard/tree_nodes.py): the process keeps one :class:`TreeTail`
per workspace with open tree streams. It is subscribed to the workspace's
wake-up group (new root agents) and to each of its agents' groups; on a
wake-up it reads the agents' heads once and draws once the nodes that moved,
and every stream on the workspace gets the same bytes: one read per commit,
whatever the number of viewers.

A tree is state, not a log: an update is a node to draw in place of the old
one, so sending one twice is harmless and what matters is that none is
missed. A stream joins at its cursor: the tail keeps the recent changes as
(tree seq, agent); a cursor they reach back to gets the nodes changed since
(and those at its seq that did not move it: a status written without a
fact), an older one, or one ahead of the tail, gets the whole tree (a ``tree``
event). Both come from what the tail holds: joining reads nothing.
"""

from __future__ import annotations

import logging
from collections import deque

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from sessions import wakeups
from sessions.dashboard.tree_nodes import Node, TreeRead, read_tree

from .frames import format_frame
from .tails import RING, Member, Rows, Tail, Tails

log = logging.getLogger(__name__)


class TreeTail(Tail):
    """The shared reader of one workspace's tree (``agent_id`` is the workspace's pk)."""

    def __init__(self, workspace_id, reader):
        super().__init__(workspace_id, reader)
        self.heads: dict = {}
        self.order: list[str] = []
        self.nodes: dict[str, Node] = {}
        # (tree seq, agent, the seq did not move), oldest first
        self.changes: deque[tuple[int, str, bool]] = deque()
        self.floor = 0  # self.changes holds every change seen at a seq >= floor
        self.subscribed: set[str] = set()

    async def subscribe(self, layer) -> None:
        # The workspace's group before the first read: a new root agent after it wakes us.
        await layer.group_add(wakeups.workspace_group(self.agent_id), self.channel)
        self.reads += 1
        read = await self.reader(self.agent_id, {})
        self._take(read)
        self.changes.clear()  # every node is drawn; a stream at this seq needs none of them
        self.cursor = self.floor = read.seq
        await self._subscribe(layer, read.order)
        self.dirty = True  # a commit before the agents' subscriptions woke nobody

    def unwatch(self) -> list[str]:
        for agent_id in self.subscribed:
            wakeups.unwatch(agent_id)
        return [wakeups.workspace_group(self.agent_id)] + [
            wakeups.group_name(agent_id) for agent_id in self.subscribed]

    async def _subscribe(self, layer, agent_ids) -> None:
        for agent_id in agent_ids:
            if agent_id in self.subscribed:
                continue
            self.subscribed.add(agent_id)
            wakeups.watch(agent_id)  # the data_version watcher (embedded SQLite) looks at it
            await layer.group_add(wakeups.group_name(agent_id), self.channel)

    # --- joining ----------------------------------------------------------------------

    def can_take(self, cursor: int) -> bool:
        return not self.closed and self.cursor is not None

    def join(self, member: Member) -> bool:
        if self.closed or self.cursor is None:
            return False
        missed = self._since(member.cursor)
        if missed is not None:
            member.offer(missed)
        self.members.add(member)
        if self.dirty:
            self.wake()
        return True

    def _since(self, cursor: int) -> Rows | None:
        if not self.floor <= cursor <= self.cursor:
            return self._whole()
        # A change that raised the seq to `cursor` is drawn at it already; one
        # that left the seq where it was (a status without a fact) may not be.
        moved = {agent for seq, agent, level in self.changes
                 if seq > cursor or (seq == cursor and level)}
        nodes = [self.nodes[a] for a in self.order if a in moved and a in self.nodes]
        return self._rows(nodes) if nodes else None

    # --- reading ------------------------------------------------------------------------

    async def _drain(self) -> None:
        layer = get_channel_layer()
        while not self.closed:
            self.reads += 1
            read: TreeRead = await self.reader(self.agent_id, self.heads)
            rows = self._take(read)
            if rows is not None:
                for member in list(self.members):
                    member.offer(rows)
            fresh = [a for a in read.order if a not in self.subscribed]
            if not fresh:
                return
            await self._subscribe(layer, fresh)  # then once more: a commit before it woke nobody

    def _take(self, read: TreeRead) -> Rows | None:
        """Keep what `read` saw; the rows every member must get (None: nothing moved)."""
        gone = self.heads.keys() - read.heads.keys()
        self.heads, self.order = read.heads, read.order
        for node in read.nodes:
            self.nodes[node.agent] = node
        if gone or (self.cursor is not None and read.seq < self.cursor):
            # Agents were purged: the seq went down, so every viewer draws the tree again.
            for agent_id in gone:
                self.nodes.pop(agent_id, None)
            self.changes.clear()
            self.cursor = self.floor = read.seq
            return self._whole()
        level = read.seq == self.cursor
        self.cursor = read.seq
        if not read.nodes:
            return None
        self.changes.extend((read.seq, node.agent, level) for node in read.nodes)
        while len(self.changes) > RING:
            self.floor = self.changes.popleft()[0] + 1
        return self._rows(read.nodes)

    def _rows(self, nodes: list[Node]) -> Rows:
        pieces = [(self.cursor, format_frame(self.cursor, "node", n.as_dict())) for n in nodes]
        return Rows(pieces, b"".join(f for _, f in pieces))

    def _whole(self) -> Rows:
        nodes = [self.nodes[a].as_dict() for a in self.order if a in self.nodes]
        frame = format_frame(self.cursor, "tree", {"seq": self.cursor, "nodes": nodes})
        return Rows([(self.cursor, frame)], frame)


read_tree_async = database_sync_to_async(read_tree)

#: The tree tails of this process, by workspace pk.
TREE_TAILS = Tails(read_tree_async, TreeTail)
