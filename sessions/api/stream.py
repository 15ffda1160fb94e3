"""GET /api/agents/{id}/stream: an agent's transcript as server-sent events.

A channels AsyncHttpConsumer that overrides http_request instead of looping in
handle(): dispatch is serial, so a loop in handle() would keep http.disconnect
and wake-ups from ever being delivered (measured: 11 s to notice a disconnect).
Every DB read goes through database_sync_to_async, which closes the connection
afterwards, so an idle stream holds no thread and no DB connection.

Rows come only from the journal: a stream reads its own backlog (from its
cursor), then joins its agent's shared tail (sessions/api/tails.py), which
reads once per commit for every stream on the agent in this process and hands
each the same encoded rows; the hand-over has no gap and no duplicate. What
the tail offers is queued, never awaited, and a task (the pump) writes it only
while something is queued, so an idle stream holds no task. A client whose
queue passes ``ALINEO_SSE_STREAM_BUFFER_KB`` leaves the tail and reads on its
own from what it was really sent, then joins again: it never delays the others.

Each member may hold ``Workspace.max_streams_per_user`` open streams on the
workspace's agents; one more is a 429 ``quota.streams`` (JSON). They are
counted in this serving process (:data:`OPEN`): every stream lives on its
process's one event loop, so the count is exact there and needs no database
or lock, and it frees itself when the process goes. With several web
processes (docs/DEPLOYMENT.md) a member may hold the quota on each.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from dataclasses import dataclass
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from django.conf import settings
from django.db import DatabaseError

from sessions.access import user_from_bearer, visible_agent
from sessions.models import SandboxSession, Workspace

from . import direct
from .errors import ApiError, not_found
from .frames import SSE_HEADERS, format_reset
from .stepping import Stepped, step_at_once
from .tails import KEEPALIVE, SB_TAILS, TAILS, Rows, Tail, encode

log = logging.getLogger(__name__)

RETRY_MS = 1000
DRAIN_POLL_S = 0.05  # how often a stream reading its backlog looks whether its client took it
_CURSOR = re.compile(r"[0-9]{1,18}")  # ASCII digits only; 18 digits stay inside int64


def buffer_bytes() -> int:
    """A stream's queue beyond which it stops waiting for the tail."""
    return max(1, int(settings.ALINEO_SSE_STREAM_BUFFER_KB)) * 1024


def parse_cursor(last_event_id: str | None, after: str | None) -> int:
    """Last-Event-ID, else ?after=, else 0. Anything but a plain non-negative integer is a 400."""
    # An empty Last-Event-ID is what a browser sends after an `id:` with no value: no cursor.
    raw = last_event_id.strip() if last_event_id and last_event_id.strip() else after
    if raw is None:
        return 0
    if not _CURSOR.fullmatch(raw):
        raise ApiError(400, "cursor.invalid", "The cursor must be a non-negative integer (an event seq).")
    return int(raw)


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _query_after(scope) -> str | None:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    values = query.get("after")
    return values[0] if values else None


class OpenStreams:
    """Open streams per (user, workspace) in this process. Used from the event
    loop only (take and give_back never await), so it needs no lock."""

    def __init__(self):
        self.counts: dict[tuple[int, int], int] = {}

    def take(self, key: tuple[int, int], cap: int) -> bool:
        if self.counts.get(key, 0) >= cap:
            return False
        self.counts[key] = self.counts.get(key, 0) + 1
        return True

    def give_back(self, key: tuple[int, int]) -> None:
        left = self.counts.get(key, 0) - 1
        if left > 0:
            self.counts[key] = left
        else:
            self.counts.pop(key, None)

    def held(self, key: tuple[int, int]) -> int:
        return self.counts.get(key, 0)


OPEN = OpenStreams()


@dataclass(frozen=True)
class Allowed:
    """Who may stream which agent, and their workspace's stream quota."""

    agent_id: str
    user_id: int
    workspace: str
    workspace_id: int
    cap: int

    @property
    def key(self) -> tuple[int, int]:
        return (self.user_id, self.workspace_id)


def stream_user(authorization: str | None, session_user):
    """The bearer token's user, else the session's; an ApiError 401 for neither."""
    user = user_from_bearer(authorization)
    if user is None and session_user is not None and session_user.is_authenticated:
        user = session_user
    if user is None:
        raise ApiError(401, "auth.required", "Send a bearer token or log in.")
    return user


@database_sync_to_async
def _authorize(authorization: str | None, session_user, agent_id: str) -> Allowed:
    """Who asks for which agent's stream, or an ApiError (401 / 404)."""
    user = stream_user(authorization, session_user)
    agent = visible_agent(user, agent_id)
    if agent is None:
        raise not_found("agent")
    name, cap = Workspace.objects.filter(pk=agent.workspace_id).values_list(
        "name", "max_streams_per_user").get()
    return Allowed(agent_id, user.pk, name, agent.workspace_id, cap)


def over_quota(allowed: Allowed) -> ApiError:
    return ApiError(
        429, "quota.streams",
        f"You have {OPEN.held(allowed.key)} streams open on agents of workspace "
        f"{allowed.workspace!r} (on this server process), its quota per user "
        f"(max_streams_per_user = {allowed.cap}). Close one (a browser tab, a client) and "
        f"retry; an admin raises it in the admin: Workspaces → {allowed.workspace} → Quotas.",
        quota="max_streams_per_user", limit=allowed.cap)


class TranscriptStream(AsyncHttpConsumer):
    """One open SSE response. State lives on the instance; nothing per stream
    runs between wake-ups except one sleeping heartbeat task."""

    #: Whose journal is streamed (SandboxSessionStream streams another).
    tails = TAILS
    #: No channel of its own: the stream never receives on one (its tail is
    #: subscribed for it), and on channels_redis the cancelled receive of an
    #: unused per-stream channel kept every closed stream's task alive for up
    #: to 5 s (what made tests/unit/api/test_stream_fanout.py take 170 s on
    #: PostgreSQL + Redis). An alias that names no layer: channels skips it.
    channel_layer_alias = "alineo.streams-need-no-channel"

    async def authorize(self, authorization: str | None, session_user, target_id: str) -> Allowed:
        return await _authorize(authorization, session_user, target_id)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_id: str | None = None
        self.cursor = 0  # every row through it is sent or queued
        self.sent = 0  # every row through it was handed to the server
        self.pending: deque[tuple[bytes, int | None]] = deque()
        self.pending_bytes = 0
        self.behind = True  # reading its own backlog, not (yet) a member of the tail
        self.fallbacks = 0  # times it was too slow for the tail
        self.closed = False
        self.tail: Tail | None = None
        self.pump: asyncio.Task | None = None
        self.quota_key: tuple[int, int] | None = None  # counted in OPEN while set
        self.direct: direct.DirectWriter | None = None  # daphne's socket, past ASGI

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:  # also when daphne cancels us at shutdown
            await self._cleanup()

    # --- opening -----------------------------------------------------------------

    async def http_request(self, message):
        if message.get("more_body"):
            return  # a GET has no body worth waiting for; answer once it is all in
        try:
            cursor = await self._check_request()
        except DatabaseError:
            log.warning("stream: cannot authorize, database unavailable", exc_info=True)
            await self._refuse(ApiError(503, "service.unavailable", "The database is unavailable; retry."))
            raise StopConsumer()
        except ApiError as exc:
            await self._refuse(exc)
            raise StopConsumer()
        try:
            await self._open(cursor)
        except DatabaseError:  # a tree tail's first read (sessions/api/tree_tail.py)
            log.warning("stream: cannot open, database unavailable", exc_info=True)
            await self._refuse(ApiError(503, "service.unavailable", "The database is unavailable; retry."))
            raise StopConsumer()

    async def _check_request(self) -> int:
        if self.scope.get("method") != "GET":
            raise ApiError(405, "method.not_allowed", "The stream answers GET only.")
        agent_id = self.scope["url_route"]["kwargs"].get("agent_id", "")
        user = self.scope.get("user")
        allowed = await self.authorize(_header(self.scope, b"authorization"), user, agent_id)
        self.agent_id = allowed.agent_id
        cursor = parse_cursor(_header(self.scope, b"last-event-id"), _query_after(self.scope))
        if not OPEN.take(allowed.key, allowed.cap):
            raise over_quota(allowed)
        self.quota_key = allowed.key  # given back in _cleanup, however the stream ends
        return cursor

    async def _refuse(self, exc: ApiError) -> None:
        body = json.dumps({"code": exc.code, "message": exc.message, **exc.extra}).encode()
        headers = [(b"Content-Type", b"application/json")]
        if exc.status == 405:
            headers.append((b"Allow", b"GET"))
        if exc.status == 429:
            headers.append((b"Retry-After", b"10"))
        await self.send_headers(status=exc.status, headers=headers)
        await self.send_body(body)

    async def _open(self, cursor: int) -> None:
        self.cursor = self.sent = cursor
        # The tail subscribes to the agent's wake-ups before our backlog read:
        # a commit between the two then still wakes it, so nothing falls into the gap.
        self.tail = await self.tails.acquire(self.agent_id)
        await self.send_headers(status=200, headers=SSE_HEADERS)
        await self.send_body(f"retry: {RETRY_MS}\n\n".encode(), more_body=True)
        # once the headers are out; a client that stops reading is cut off past
        # a few buffers' worth (it reconnects and reads its backlog on its own)
        self.direct = direct.writer(self.scope, max_unsent=4 * buffer_bytes())
        self._kick()

    # --- delivering: what the tail offers (never awaits) ----------------------------------

    def offer(self, rows: Rows) -> None:
        if self.behind or self.closed:
            return
        rows = rows.after(self.cursor)
        if rows is None:
            return
        if (self.direct is not None and self.pump is None and not self.pending
                and self.direct.write(rows.blob, rows.chunk)):
            self.cursor = self.sent = rows.last  # the common case, 1,000 times a commit: no queue
            return
        self._queue(rows.blob, rows.last)

    def offer_reset(self, head: int) -> None:
        self._queue(format_reset(head), head)

    def offer_keepalive(self) -> None:
        self._queue(KEEPALIVE, None)

    def _queue(self, blob: bytes, last: int | None) -> None:
        if self.behind or self.closed:
            return
        self.pending.append((blob, last))
        self.pending_bytes += len(blob)
        if last is not None:
            self.cursor = last
        # Behind by more than the buffer (and not by one big page alone): stop
        # holding rows for this client; it reads on its own from what it sent.
        if len(self.pending) > 1 and self.pending_bytes > buffer_bytes():
            self._fall_behind()
        self._kick()

    def _fall_behind(self) -> None:
        self.tail.leave(self)
        self.pending.clear()
        self.pending_bytes = 0
        self.cursor = self.sent
        self.behind = True
        self.fallbacks += 1
        log.info("stream %s: slow client, reading on its own from %d", self.agent_id, self.sent)

    # --- delivering: the pump, a task only while there is something to do ----------------

    def _kick(self) -> None:
        """Write what is queued: at once when the server takes it without
        waiting (daphne always does; a task per stream per commit would cost
        more than the write), onto daphne's socket itself when it can
        (sessions/api/direct.py), else in the pump task."""
        if self.pump is not None or self.closed:
            return
        if self.behind or len(self.pending) != 1:
            self.pump = asyncio.create_task(self._run_pump())
            return
        if self.direct is not None and self.direct.write(self.pending[0][0]):
            self._next_blob()
            return
        try:
            waiting = step_at_once(self.send_body(self._next_blob(), more_body=True))
        except Exception:  # the connection is gone; http.disconnect ends the stream
            log.info("stream %s: write failed", self.agent_id, exc_info=True)
            return
        if waiting is not None:  # the client is not taking it now: go on in a task
            self.pump = asyncio.create_task(self._run_pump(waiting))

    def _next_blob(self) -> bytes:
        blob, last = self.pending.popleft()
        self.pending_bytes -= len(blob)
        if last is not None:
            self.sent = last
        return blob

    async def _run_pump(self, waiting: Stepped | None = None) -> None:
        try:
            if waiting is not None:
                await waiting.finish()
            while not self.closed:
                if self.pending:
                    await self.send_body(self._next_blob(), more_body=True)
                elif self.behind:
                    await self._catch_up()
                else:
                    return
        finally:
            if self.pump is asyncio.current_task():
                self.pump = None

    async def _catch_up(self) -> None:
        """Join the tail if its ring reaches back to our cursor; else one page
        of this stream's own backlog, and at its end join the tail."""
        await self._wait_for_the_client()  # and joins the tail only once it took it
        if self.tail.can_take(self.cursor) and self._join():
            return
        try:
            page = await self.tails.reader(self.agent_id, self.cursor)
        except DatabaseError:
            # A locked or missing DB must not end the stream: try again shortly.
            log.warning("stream %s: transcript read failed", self.agent_id, exc_info=True)
            await asyncio.sleep(RETRY_MS / 1000)
            return
        if self.cursor > page.head:
            self.cursor = self.sent = page.head
            await self.send_body(format_reset(page.head), more_body=True)
            return
        if page.events:
            rows = encode(page)
            self.cursor = self.sent = rows.last
            await self.send_body(rows.blob, more_body=True)
        if not page.has_more:
            await self._wait_for_the_client()
            self._join()

    async def _wait_for_the_client(self) -> None:
        """A backlog is read a page at a time only as fast as the client takes
        it: daphne's send never waits, and Twisted would otherwise hold the
        whole transcript in memory for a client that does not read."""
        while (not self.closed and self.direct is not None
               and self.direct.unsent() > buffer_bytes()):
            await asyncio.sleep(DRAIN_POLL_S)

    def _join(self) -> bool:
        if self.closed:
            return False
        self.behind = False  # the tail's join may offer the rows it is ahead by
        if not self.tail.join(self):
            self.behind = True  # the tail is further ahead than its ring: read on
        return not self.behind

    # --- closing -------------------------------------------------------------------

    async def disconnect(self):
        await self._cleanup()

    async def _cleanup(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.quota_key is not None:
            OPEN.give_back(self.quota_key)
            self.quota_key = None
        if self.pump is not None and self.pump is not asyncio.current_task():
            self.pump.cancel()
        tail, self.tail = self.tail, None
        if tail is not None:
            tail.leave(self)
            await self.tails.release(tail)


@database_sync_to_async
def _authorize_session(authorization: str | None, session_user, session_id: str) -> Allowed:
    user = stream_user(authorization, session_user)
    row = (SandboxSession.objects.filter(pk=session_id[:32], workspace__members=user)
           .values_list("workspace_id", "workspace__name", "workspace__max_streams_per_user")
           .first())
    if row is None:
        raise not_found("sandbox")
    return Allowed(session_id, user.pk, row[1], row[0], row[2])


class SandboxSessionStream(TranscriptStream):
    """GET /api/sandboxes/{id}/stream: a sandbox session's journal, the same way
    (cursor, reset, heartbeats, a shared tail, the same open-streams quota).
    Woken by sessions/sbjournal.py after each commit."""

    tails = SB_TAILS

    async def authorize(self, authorization: str | None, session_user, target_id: str) -> Allowed:
        return await _authorize_session(authorization, session_user, target_id)
