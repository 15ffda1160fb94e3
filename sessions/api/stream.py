"""GET /api/agents/{id}/stream: an agent's transcript as server-sent events.

A channels AsyncHttpConsumer that overrides http_request instead of looping in
handle(): dispatch is serial, so a loop in handle() would keep http.disconnect
and wake-ups from ever being delivered (measured: 11 s to notice a disconnect).
Every DB read goes through database_sync_to_async, which closes the connection
afterwards, so an idle stream holds no thread and no DB connection.

Rows come only from the journal: a wake-up or a heartbeat just means "re-read
after the cursor", so a resume has no gaps and no duplicates.

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
import random
import re
from dataclasses import dataclass
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from django.conf import settings
from django.db import DatabaseError

from sessions import journal, sbjournal, wakeups
from sessions.access import user_from_bearer, visible_agent
from sessions.models import SandboxSession, Workspace

from .errors import ApiError, not_found

log = logging.getLogger(__name__)

PAGE = 500  # backlog rows per DB read
RETRY_MS = 1000
_LINE_BREAK = re.compile(r"[\r\n]")
_CURSOR = re.compile(r"[0-9]{1,18}")  # ASCII digits only; 18 digits stay inside int64

SSE_HEADERS = [
    (b"Content-Type", b"text/event-stream; charset=utf-8"),
    (b"Cache-Control", b"no-cache"),
    (b"X-Accel-Buffering", b"no"),
]


def format_event(record: dict) -> bytes:
    # json.dumps escapes CR/LF, so `data` is one line; the type is made safe
    # too, since a line break in it would split the frame.
    data = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    etype = _LINE_BREAK.sub(" ", record["type"])
    return f"id: {record['seq']}\nevent: {etype}\ndata: {data}\n\n".encode()


def format_reset(head: int) -> bytes:
    # The id moves the client's Last-Event-ID to the head, so its next
    # reconnect resumes from there instead of being reset again.
    data = json.dumps({"head": head, "reason": "cursor_beyond_head"})
    return f"id: {head}\nevent: reset\ndata: {data}\n\n".encode()


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


def _stream_user(authorization: str | None, session_user):
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
    user = _stream_user(authorization, session_user)
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


@database_sync_to_async
def _read_page(agent_id: str, after: int) -> journal.Page:
    return journal.page_after(agent_id, after, PAGE)


class TranscriptStream(AsyncHttpConsumer):
    """One open SSE response. State lives on the instance; nothing per stream
    runs between wake-ups except one sleeping heartbeat task."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_id: str | None = None
        self.cursor = 0
        self.lock = asyncio.Lock()
        self.dirty = False
        self.closed = False
        self.subscribed = False
        self.heartbeat: asyncio.Task | None = None
        self.quota_key: tuple[int, int] | None = None  # counted in OPEN while set

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:  # also when daphne cancels us at shutdown
            await self._cleanup()

    # --- what is streamed (SandboxSessionStream streams another journal) ------------

    async def authorize(self, authorization: str | None, session_user, target_id: str) -> Allowed:
        return await _authorize(authorization, session_user, target_id)

    async def read_page(self, after: int):
        return await _read_page(self.agent_id, after)

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
        await self._open(cursor)

    async def _check_request(self) -> int:
        if self.scope.get("method") != "GET":
            raise ApiError(405, "method.not_allowed", "The stream answers GET only.")
        agent_id = self.scope["url_route"]["kwargs"]["agent_id"]
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
        self.cursor = cursor
        # Subscribe before reading the backlog: a commit between the two then
        # still wakes us, so nothing falls into the gap.
        await self.channel_layer.group_add(wakeups.group_name(self.agent_id), self.channel_name)
        self.subscribed = True
        wakeups.watch(self.agent_id)
        wakeups.ensure_started()
        await self.send_headers(status=200, headers=SSE_HEADERS)
        await self.send_body(f"retry: {RETRY_MS}\n\n".encode(), more_body=True)
        self.heartbeat = asyncio.create_task(self._heartbeat())
        await self.flush()

    # --- delivering -----------------------------------------------------------------

    async def transcript_append(self, message):
        """A wake-up from the group: re-read after the cursor."""
        self.dirty = True
        if self.lock.locked():
            return  # the running flush sees `dirty` and reads once more
        await self.flush()

    async def flush(self) -> None:
        """Send every event after the cursor. The lock keeps a wake-up and a
        heartbeat from reading the same rows twice."""
        self.dirty = True
        async with self.lock:
            while self.dirty and not self.closed:
                self.dirty = False
                try:
                    await self._drain()
                except DatabaseError:
                    # A locked or missing DB must not end the stream: the next
                    # wake-up or heartbeat reads again.
                    log.warning("stream %s: transcript read failed", self.agent_id, exc_info=True)
                    return

    async def _drain(self) -> None:
        while not self.closed:
            page = await self.read_page(self.cursor)
            if self.cursor > page.head:
                await self.send_body(format_reset(page.head), more_body=True)
                self.cursor = page.head
                continue
            if page.events:
                chunk = b"".join(format_event(rec.as_dict()) for rec in page.events)
                await self.send_body(chunk, more_body=True)
                self.cursor = page.events[-1].seq
            if not page.has_more:
                return

    async def _heartbeat(self) -> None:
        """A comment line every interval ±20 %, then a safety re-read: layer
        messages are at-most-once, the database is not."""
        base = float(settings.ALINEO_SSE_HEARTBEAT_S)
        while not self.closed:
            await asyncio.sleep(base * random.uniform(0.8, 1.2))
            try:
                await self.send_body(b": ka\n\n", more_body=True)
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep beating: one failed tick must not silence the stream
                log.warning("stream %s: heartbeat failed", self.agent_id, exc_info=True)

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
        if self.heartbeat is not None and self.heartbeat is not asyncio.current_task():
            self.heartbeat.cancel()
        if self.subscribed:
            self.subscribed = False
            wakeups.unwatch(self.agent_id)
            try:
                await self.channel_layer.group_discard(wakeups.group_name(self.agent_id), self.channel_name)
            except Exception:  # pragma: no cover - the layer expires it anyway
                log.warning("stream %s: group_discard failed", self.agent_id, exc_info=True)


@database_sync_to_async
def _authorize_session(authorization: str | None, session_user, session_id: str) -> Allowed:
    user = _stream_user(authorization, session_user)
    row = (SandboxSession.objects.filter(pk=session_id[:32], workspace__members=user)
           .values_list("workspace_id", "workspace__name", "workspace__max_streams_per_user")
           .first())
    if row is None:
        raise not_found("sandbox")
    return Allowed(session_id, user.pk, row[1], row[0], row[2])


@database_sync_to_async
def _read_session_page(session_id: str, after: int):
    return sbjournal.page_after(session_id, after, PAGE)


class SandboxSessionStream(TranscriptStream):
    """GET /api/sandboxes/{id}/stream: a sandbox session's journal, the same way
    (cursor, reset, heartbeats, the same open-streams quota). Woken by
    sessions/sbjournal.py after each commit."""

    async def authorize(self, authorization: str | None, session_user, target_id: str) -> Allowed:
        return await _authorize_session(authorization, session_user, target_id)

    async def read_page(self, after: int):
        return await _read_session_page(self.agent_id, after)
