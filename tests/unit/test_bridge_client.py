"""sandboxes/bridge_client.py: the typed methods against a real bridge process,
and against a fake socket server that answers garbage — which must end as
BridgeProtocolError (the client closed), never as junk handed to the caller."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile

import pytest

from sandboxes import bridge_client
from sandboxes.bridge import protocol as p
from sandboxes.bridge_client import (
    BridgeClient,
    BridgeError,
    BridgeProtocolError,
    BridgeRequestError,
    BridgeUnavailable,
)
from sandboxes.errors import SandboxError
from tests.unit.bridge.harness import Bridge, kill_tool_processes


@pytest.fixture
def short_dir():
    """A short directory (AF_UNIX paths must stay under 108 bytes)."""
    root = tempfile.mkdtemp(prefix="bct-", dir="/tmp")
    yield root
    kill_tool_processes(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def bridge(short_dir):
    run, home = os.path.join(short_dir, "run"), os.path.join(short_dir, "home")
    os.makedirs(run)
    os.makedirs(home)
    started = Bridge(run, home)
    started.write_config(model="demo")
    yield started.start()
    started.stop()


def sock(bridge: Bridge) -> str:
    return os.path.join(bridge.run_dir, "bridge.sock")


async def until(client: BridgeClient, after: int, done) -> list[p.BridgeEvent]:
    """Events after ``after`` up to the first for which ``done(event)``."""
    seen: list[p.BridgeEvent] = []
    for _ in range(40):
        page = await client.events(after, wait=1)
        for ev in page.events:
            seen.append(ev)
            if done(ev):
                return seen
        after = page.events[-1].bseq if page.events else after
    raise AssertionError(f"never came; saw {[e.type for e in seen]}")


# --- against a real bridge ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_turn_through_the_typed_methods(bridge):
    control = await BridgeClient.connect(sock(bridge), retry_for=5)
    events = await BridgeClient.connect(sock(bridge), retry_for=5)
    try:
        status = await control.status()
        assert isinstance(status, p.Status) and status.state is p.BridgeState.IDLE
        assert status.protocol == p.PROTOCOL_VERSION and status.model == "demo"
        assert await control.prompt("say: typed", command_id="c1") == p.PromptAnswer(1, False, 0)
        assert await control.prompt("say: typed", command_id="c1") == \
            p.PromptAnswer(1, duplicate=True)
        seen = await until(events, 0, lambda e: e.type == "turn.finished")
        assert seen[-1].data == {"turn": 1, "text": "[demo] typed"}
        assert [e.bseq for e in seen] == list(range(1, len(seen) + 1))
        assert await control.ack(seen[-1].bseq) == p.AckAnswer(seen[-1].bseq)
        after = await control.status()
        assert (after.acked, after.turns, after.turn) == (seen[-1].bseq, 1, None)
        untyped = await control.request("status")  # the untyped way still works
        assert untyped["protocol"] == p.PROTOCOL_VERSION and untyped["state"] == "idle"
    finally:
        await control.close()
        await events.close()


@pytest.mark.asyncio
async def test_steer_abort_pause_and_their_refusals(bridge):
    client = await BridgeClient.connect(sock(bridge), retry_for=5)
    try:
        with pytest.raises(BridgeRequestError) as err:
            await client.steer("faster", command_id="s1")
        assert err.value.code == "no_turn" and err.value.permanent
        assert isinstance(err.value, SandboxError) and not client.closed
        assert await client.abort() == p.AbortAnswer(False)
        assert await client.pause() == p.PauseAnswer(True)
        assert (await client.status()).paused is True
        assert await client.unpause() == p.PauseAnswer(False)

        await client.prompt("sleep: 30", command_id="p1")
        await until(client, 0, lambda e: e.type == "tool.dispatched")
        assert await client.steer("stop soon", command_id="s2") == p.SteerAnswer(1)
        assert await client.steer("stop soon", command_id="s2") == p.SteerAnswer(1, True)
        running = await client.status()
        assert running.state is p.BridgeState.RUNNING and running.turn.turn == 1
        assert await client.abort() == p.AbortAnswer(True, 1)
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_cursor_errors_carry_their_typed_extras(bridge):
    client = await BridgeClient.connect(sock(bridge), retry_for=5)
    try:
        status = await client.status()
        with pytest.raises(BridgeRequestError) as err:
            await client.events(status.head + 5)
        assert err.value.code == "cursor_ahead" and err.value.extra["head"] == status.head
        assert err.value.info.head == status.head
        assert err.value.info.session_id == status.session_id
        with pytest.raises(BridgeRequestError) as err:
            await client.ack(status.head + 1)
        assert err.value.code == "bad_ack"
        await client.ack(status.head)
        if status.head:
            with pytest.raises(BridgeRequestError) as err:
                await client.events(status.head - 1)
            assert err.value.code == "cursor_pruned" and err.value.info.acked == status.head
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_reply_answers_a_request_and_seed_and_shutdown(bridge):
    client = await BridgeClient.connect(sock(bridge), retry_for=5)
    try:
        with pytest.raises(BridgeRequestError) as err:
            await client.reply("req-nobody", result=None)
        assert err.value.code == "unknown_request"
        assert await client.seed([{"role": "user", "text": "hi"}]) == p.SeedAnswer(1, 1)
        with pytest.raises(BridgeRequestError) as err:
            await client.seed([])
        assert err.value.code == "not_fresh"

        await client.prompt("spawn: a child")
        asked = (await until(client, 0, lambda e: e.type == "request.spawn"))[-1]
        assert (await client.status()).pending_requests == (asked.data["request_id"],)
        answer = await client.reply(asked.data["request_id"], error={"code": "no", "message": "x"})
        assert answer == p.ReplyAnswer(asked.data["request_id"])
        await until(client, asked.bseq, lambda e: e.type == "turn.finished")
        assert await client.shutdown() == p.ShutdownAnswer(True)
        assert await asyncio.to_thread(bridge.proc.wait, 20) == 0
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_no_answer_in_time_is_unavailable_and_closes_the_client(bridge):
    client = await BridgeClient.connect(sock(bridge), retry_for=5)
    head = (await client.status()).head
    with pytest.raises(BridgeUnavailable) as err:
        await client.events(head, wait=5, timeout=0.3)
    assert not isinstance(err.value, BridgeProtocolError) and not err.value.permanent
    assert client.closed
    with pytest.raises(BridgeUnavailable):
        await client.status()


@pytest.mark.asyncio
async def test_unreachable_sockets():
    with pytest.raises(BridgeUnavailable) as err:
        await BridgeClient.connect("/tmp/" + "x" * 200)
    assert err.value.code == "path_too_long" and err.value.permanent
    with pytest.raises(BridgeUnavailable) as err:
        await BridgeClient.connect("/tmp/bct-no-such.sock", retry_for=0.2, interval=0.05)
    assert not err.value.permanent


def test_the_error_classes():
    assert issubclass(BridgeError, SandboxError)
    assert issubclass(BridgeProtocolError, BridgeUnavailable)
    for code, permanent in [("no_turn", True), ("cursor_ahead", True), ("internal", False),
                            ("a_code_from_a_newer_bridge", False)]:
        exc = BridgeRequestError(p.ErrorInfo(code, "m", {"head": 3}))
        assert (exc.code, exc.message, exc.extra, exc.permanent) == (code, "m", {"head": 3},
                                                                     permanent)
    assert str(BridgeUnavailable("gone")) == "gone" and BridgeUnavailable("gone").code == "unavailable"


# --- against a bridge that answers garbage -------------------------------------------------


class FakeBridge:
    """A unix socket server that answers every request line with ``answer(request)``
    (None: hang up)."""

    def __init__(self, path: str, answer):
        self.path, self.answer = path, answer

    async def __aenter__(self):
        self.server = await asyncio.start_unix_server(self._serve, self.path, limit=p.MAX_LINE)
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader, writer):
        try:
            while line := await reader.readline():
                answer = self.answer(json.loads(line))
                if answer is None:
                    return
                writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def ok(**fields):
    return lambda req: p.encode_line({"id": req["id"], "ok": True, **fields})


def raw(line: bytes):
    return lambda req: line


GOOD_STATUS = {"state": "idle", "paused": False, "turn": None, "queued": [], "head": 3,
               "acked": 0, "session_id": "s1", "model": "demo", "turns": 0,
               "pending_requests": []}
EV = {"bseq": 1, "type": "turn.started", "ts": "2026-01-02T03:04:05.000001+00:00", "data": {}}

GARBAGE = {
    "not json": ("status", raw(b"<html>hello</html>\n"), "line"),
    "NaN": ("status", raw(b'{"id": 1, "ok": true, "head": NaN}\n'), "line"),
    "too deep": ("status", raw(b"[" * 50_000 + b"]" * 50_000 + b"\n"), "line"),
    "a list": ("status", raw(b"[1, 2]\n"), "answer"),
    "another id": ("status", lambda req: p.encode_line({"id": req["id"] + 1, "ok": True}), "id"),
    "ok is a word": ("status", lambda req: p.encode_line({"id": req["id"], "ok": "yes"}), "ok"),
    "error is a word": ("status", lambda req: p.encode_line(
        {"id": req["id"], "ok": False, "error": "boom"}), "error"),
    "error head is text": ("events", lambda req: p.encode_line(
        {"id": req["id"], "ok": False,
         "error": {"code": "cursor_ahead", "message": "m", "head": "3"}}), "error.head"),
    "state unknown": ("status", ok(**{**GOOD_STATUS, "state": "dancing"}), "state"),
    "head as text": ("status", ok(**{**GOOD_STATUS, "head": "3"}), "head"),
    "huge queue": ("status", ok(**{**GOOD_STATUS, "queued": [1] * (p.MAX_ITEMS + 1)}), "queued"),
    "page from the past": ("events", ok(events=[{**EV, "bseq": 2}], head=7, session_id="s"),
                           "events[0].bseq"),
    "prompt without turn": ("prompt", ok(queued=False, position=0), "turn"),
    "ack as text": ("ack", ok(acked="all"), "acked"),
}


async def call(client: BridgeClient, op: str):
    if op == "status":
        return await client.status()
    if op == "events":
        return await client.events(3, wait=0)
    if op == "prompt":
        return await client.prompt("hi")
    return await client.ack(1)


@pytest.mark.asyncio
@pytest.mark.parametrize("name", list(GARBAGE))
async def test_garbage_answers_are_protocol_errors(short_dir, name):
    op, answer, field = GARBAGE[name]
    path = os.path.join(short_dir, "fake.sock")
    async with FakeBridge(path, answer):
        client = await BridgeClient.connect(path)
        with pytest.raises(BridgeProtocolError) as err:
            await call(client, op)
        assert err.value.field == field and not err.value.permanent
        assert isinstance(err.value, BridgeUnavailable) and isinstance(err.value, SandboxError)
        assert client.closed
        await client.close()


@pytest.mark.asyncio
async def test_an_event_that_breaks_a_rule_arrives_refused_not_as_sent(short_dir):
    path = os.path.join(short_dir, "fake.sock")
    answer = ok(events=[{**EV, "type": "<script>", "data": {"x": "y"}}], head=1, session_id="s")
    async with FakeBridge(path, answer):
        client = await BridgeClient.connect(path)
        page = await client.events(0, wait=0)
        assert [(e.bseq, e.type, e.data["field"]) for e in page.events] == [
            (1, p.REFUSED_EVENT, "events[0].type")]
        assert not client.closed
        await client.close()


@pytest.mark.asyncio
async def test_an_answer_longer_than_a_line_is_a_protocol_error(short_dir, monkeypatch):
    monkeypatch.setattr(bridge_client, "MAX_LINE", 1024)
    path = os.path.join(short_dir, "fake.sock")
    async with FakeBridge(path, ok(**{**GOOD_STATUS, "model": "m" * 4096})):
        client = await BridgeClient.connect(path)
        with pytest.raises(BridgeProtocolError) as err:
            await client.status()
        assert err.value.field == "line" and client.closed


@pytest.mark.asyncio
async def test_a_bridge_that_hangs_up_is_unavailable(short_dir):
    path = os.path.join(short_dir, "fake.sock")
    async with FakeBridge(path, lambda req: None):
        client = await BridgeClient.connect(path)
        with pytest.raises(BridgeUnavailable) as err:
            await client.status()
        assert "closed the connection" in err.value.message and client.closed


@pytest.mark.asyncio
async def test_an_old_bridges_status_reads_as_version_1(short_dir):
    path = os.path.join(short_dir, "fake.sock")
    async with FakeBridge(path, ok(**GOOD_STATUS, unknown_new_field=[1])):
        client = await BridgeClient.connect(path)
        status = await client.status()
        assert status.protocol == 1 and status.head == 3 and not client.closed
        await client.close()
