"""The Python client on its own (sessions/client.py), against a scripted HTTP
server in a thread: retries reuse one Idempotency-Key, errors map to typed
exceptions, a cut stream resumes from its cursor, the reply is assembled
without repeats, and the module needs nothing but the standard library."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sessions import client as c

CLIENT = Path(c.__file__).parent  # the package directory a user copies


class Scripted:
    """A server answering each request with the next scripted reply for its
    (method, path): (status, body) or "drop" (close without answering) or a
    callable(handler) that writes the answer itself. Records every request."""

    def __init__(self):
        self.script: dict[tuple[str, str], list] = {}
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                outer.requests.append({"method": self.command, "path": self.path,
                                       "headers": dict(self.headers), "body": body})
                replies = outer.script.get((self.command, path)) or [(404, {"code": "api.not_found",
                                                                            "message": "no"})]
                reply = replies.pop(0) if len(replies) > 1 else replies[0]
                if reply == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if callable(reply):
                    return reply(self)
                status, payload = reply
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                if status == 503:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                         daemon=True).start()

    def on(self, method: str, path: str, *replies):
        self.script[(method, path)] = list(replies)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def srv():
    s = Scripted()
    yield s
    s.close()


def alineo(srv, **kw) -> c.Alineo:
    return c.Alineo(srv.url, "aln_test", retry_for=kw.pop("retry_for", 10), **kw)


AGENT = {"id": "ag_1", "status": "idle", "sandbox_id": "sb_1", "parent": None, "children": [],
         "last_seq": 3, "spec": {"model": "demo"}, "current_turn": None}


# --- retries and idempotency ------------------------------------------------------------------


def test_a_retried_post_reuses_its_idempotency_key(srv):
    srv.on("POST", "/api/agents", (503, {"code": "server.unavailable", "message": "busy"}), "drop",
           (502, {}), (201, {"id": "ag_1"}))
    srv.on("GET", "/api/agents/ag_1", (200, AGENT))
    agent = alineo(srv).start_agent({"model": "demo"})
    assert agent.id == "ag_1" and isinstance(agent, c.Agent)
    posts = [r for r in srv.requests if r["method"] == "POST"]
    assert len(posts) == 4
    keys = {r["headers"]["Idempotency-Key"] for r in posts}
    assert len(keys) == 1 and keys.pop().startswith("py-")
    assert all(r["headers"]["Authorization"] == "Bearer aln_test" for r in posts)
    assert {r["body"] for r in posts} == {json.dumps({"spec": {"model": "demo"}}).encode()}


def test_two_calls_get_two_keys_and_a_given_key_is_used(srv):
    srv.on("POST", "/api/agents/ag_1/steer", (202, {"command": 5}))
    srv.on("GET", "/api/agents/ag_1", (200, AGENT))
    agent = c.Agent(alineo(srv).transport, dict(AGENT))
    agent.steer("a")
    agent.steer("b")
    agent.steer("c", key="mine-1")
    keys = [r["headers"]["Idempotency-Key"] for r in srv.requests if r["method"] == "POST"]
    assert keys[0] != keys[1] and keys[2] == "mine-1"


def test_retries_are_bounded(srv):
    srv.on("GET", "/api/agents/ag_1", (503, {"code": "server.unavailable", "message": "busy"}))
    with pytest.raises(c.TransportError) as err:
        alineo(srv, retry_for=0.6).agent("ag_1")
    assert err.value.status == 503 and err.value.code == "server.unavailable"
    assert not err.value.permanent
    assert 2 <= len(srv.requests) <= 6
    assert all(c.transport.backoff(n) <= c.transport._BACKOFF_MAX * 1.25 for n in range(1, 30))


def test_a_refused_connection_is_a_transport_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(c.TransportError) as err:
        c.Alineo(f"http://127.0.0.1:{port}", "t", retry_for=0.5).agent("ag_1")
    assert err.value.code == "client.network" and err.value.status is None
    assert isinstance(err.value, c.AlineoError)


# --- error mapping --------------------------------------------------------------------------------


@pytest.mark.parametrize("status, code, cls, permanent", [
    (400, "request.invalid", c.InvalidRequest, True),
    (401, "auth.required", c.AuthError, True),
    (403, "auth.csrf_failed", c.AuthError, True),
    (404, "agent.not_found", c.NotFound, True),
    (409, "agent.stopped", c.AgentEnded, True),
    (409, "agent.lost", c.AgentEnded, True),
    (409, "runtime.checkpoint_expired", c.CheckpointExpired, True),
    (409, "checkpoint.disabled", c.Conflict, True),
    (422, "idempotency.key_reused", c.InvalidRequest, True),
    (429, "quota.agents", c.QuotaExceeded, False),
    (409, "quota.depth", c.QuotaExceeded, True),
    (400, "quota.limits", c.QuotaExceeded, True),
    (403, "spawn.escalation", c.AuthError, True),
    (500, "server.error", c.ServerError, False),
])
def test_errors_map_to_typed_exceptions(srv, status, code, cls, permanent):
    srv.on("POST", "/api/agents/ag_1/pause", (status, {"code": code, "message": "why"}))
    agent = c.Agent(alineo(srv).transport, dict(AGENT))
    with pytest.raises(cls) as err:
        agent.pause()
    e = err.value
    assert (e.status, e.code, e.message, e.permanent) == (status, code, "why", permanent)
    assert isinstance(e, c.AlineoError)
    assert len(srv.requests) == 1  # not retried


@pytest.mark.parametrize("code, cls", [
    ("runtime.bridge_unavailable", c.BridgeUnavailable),
    ("runtime.checkpoint_failed", c.CheckpointFailed),
    ("agent_ended", c.AgentEnded),
    ("no_turn", c.CommandFailed),
])
def test_a_failed_command_raises_by_its_code(srv, code, cls):
    srv.on("POST", "/api/agents/ag_1/reattach", (202, {"command": 9, "verb": "reattach"}))
    srv.on("GET", "/api/commands/9", (200, {"id": 9, "state": "pending", "result": {}}),
           (200, {"id": 9, "state": "failed", "result": {"code": code, "message": "m"}}))
    with pytest.raises(cls) as err:
        c.Alineo.reattach("ag_1", url=srv.url, token="t")
    assert err.value.code == code and isinstance(err.value, c.CommandFailed | c.AgentEnded)


def test_reattach_returns_the_agent_with_its_rung(srv):
    srv.on("POST", "/api/agents/ag_1/rebridge", (202, {"command": 9, "verb": "rebridge"}))
    srv.on("GET", "/api/commands/9", (200, {"id": 9, "state": "done", "result": {
        "rung": "restore", "sandbox_id": "sb_2", "old_sandbox_id": "sb_1"}}))
    srv.on("GET", "/api/agents/ag_1", (200, {**AGENT, "sandbox_id": "sb_2"}))
    agent = c.Alineo.resume("ag_1", url=srv.url, token="t")
    assert agent.rung == "restore" and agent.sandbox_id == "sb_2"
    assert agent.recovery.old_sandbox_id == "sb_1"


def test_a_command_that_is_never_acted_on_times_out(srv):
    srv.on("POST", "/api/agents/ag_1/checkpoints", (202, {"command": 4, "verb": "checkpoint"}))
    srv.on("GET", "/api/commands/4", (200, {"id": 4, "state": "pending", "result": {}}))
    agent = c.Agent(alineo(srv).transport, dict(AGENT))
    with pytest.raises(c.Timeout) as err:
        agent.take_checkpoint(timeout=0.3)
    assert not err.value.permanent


def test_attach_cannot_prompt(srv):
    srv.on("GET", "/api/agents/ag_1", (200, AGENT))
    looked = c.Alineo.attach("ag_1", url=srv.url, token="t")
    assert type(looked) is c.AttachedAgent
    for name in ("prompt", "steer", "follow", "take_checkpoint", "stop"):
        assert not hasattr(looked, name)
    assert looked.sandbox == c.AgentSandbox("sb_1", "ag_1")
    assert [r["method"] for r in srv.requests] == ["GET"]  # looking touches nothing


def test_configuration_comes_from_arguments_or_the_environment(monkeypatch):
    monkeypatch.delenv("ALINEO_URL", raising=False)
    monkeypatch.delenv("ALINEO_TOKEN", raising=False)
    with pytest.raises(c.InvalidRequest):
        c.Alineo()
    monkeypatch.setenv("ALINEO_URL", "http://127.0.0.1:1/base/")
    monkeypatch.setenv("ALINEO_TOKEN", "t")
    assert c.Alineo().transport.prefix == "/base"


# --- the stream ---------------------------------------------------------------------------------


def _event(seq, type_, **data):
    return {"seq": seq, "type": type_, "ts": "2026-11-29T00:00:00.000000Z", "data": data}


def _frame(ev) -> bytes:
    return f"id: {ev['seq']}\nevent: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()


TURN = [
    _event(5, "command.prompt", text="go", command=7),
    _event(6, "turn.started", turn=2, command_id="7"),
    _event(7, "message.delta", turn=2, text="Hello, "),
    _event(8, "message.assistant", turn=2, text="Hello, world."),
    _event(9, "tool.dispatched", turn=2, tool_call_id="t1", name="bash", input={}),
    _event(10, "tool.result", turn=2, tool_call_id="t1", output="ok", exit_code=0),
    _event(11, "message.delta", turn=2, text="Done"),
    _event(12, "message.assistant", turn=2, text="Done."),
    _event(13, "turn.finished", turn=2, text="Done."),
]


def _streamer(seen_cursors, cut_at):
    """Stream TURN after the request's cursor; the first connection is cut
    mid-frame after the event with seq `cut_at`."""
    def reply(h):
        cursor = int(h.headers.get("Last-Event-ID") or 0)
        seen_cursors.append((cursor, h.path))
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        h.wfile.write(b"retry: 1000\n\n: ka\n\n")
        for ev in TURN:
            if ev["seq"] <= cursor:
                continue
            frame = _frame(ev)
            if len(seen_cursors) == 1 and ev["seq"] == cut_at + 1:
                h.wfile.write(frame[: len(frame) // 2])  # cut mid-event
                h.wfile.flush()
                h.close_connection = True
                return
            h.wfile.write(frame)
            h.wfile.flush()
        h.close_connection = True  # a later connection stays open until the client leaves
    return reply


def test_a_cut_stream_resumes_from_its_cursor_without_repeats(srv):
    cursors: list = []
    srv.on("POST", "/api/agents/ag_1/prompt", (202, {"command": 7, "seq": 5, "verb": "prompt"}))
    srv.on("GET", "/api/agents/ag_1/stream", _streamer(cursors, cut_at=8))
    agent = c.Agent(alineo(srv).transport, dict(AGENT))
    turn = agent.prompt("go", timeout=10)
    chunks = list(turn)
    assert "".join(c.text_only(chunks)) == "Hello, world.\n\nDone." == turn.text
    assert [ch.kind for ch in chunks] == ["text", "text", "tool_call", "tool_result", "text",
                                          "text"]
    assert [ch.seq for ch in chunks] == [7, 8, 9, 10, 11, 12]
    assert turn.outcome == "finished" and turn.number == 2 and turn.cursor == 13
    assert [cur for cur, _ in cursors] == [5, 8]  # resumed after the last whole event
    assert all(path.endswith(f"after={cur}") for cur, path in cursors)


def test_an_interrupted_turn_ends_with_the_text_that_survived():
    reply = c.turns._Reply()
    out = []
    for ev in [_event(3, "message.delta", turn=1, text="par"),
               _event(4, "message.assistant", turn=1, text="partial one"),
               _event(5, "message.delta", turn=1, text="sec"),
               _event(6, "turn.interrupted", turn=1, text="partial one\n\nsecond bit", reason="x")]:
        reply.feed(c.Event.from_json(ev))
        out.append(reply.advance())
    assert out == ["par", "tial one", "\n\nsec", "ond bit"]
    assert "".join(out) == reply.text() == "partial one\n\nsecond bit"


def test_reply_text_of_a_transcript():
    assert c.reply_text(TURN, 2) == "Hello, world.\n\nDone."
    assert c.reply_text(TURN, 1) == ""


def test_follow_after_a_cursor_continues_the_open_turn(srv):
    """What a second process does after reattach: the turn open at its cursor,
    primed from the transcript, and only what comes after the cursor."""
    cursors: list = []
    srv.on("GET", "/api/agents/ag_1/events",
           (200, {"events": TURN[:7], "has_more": False, "next_before": 5}))
    srv.on("GET", "/api/agents/ag_1/stream", _streamer(cursors, cut_at=99))
    agent = c.Agent(alineo(srv).transport, dict(AGENT))
    turn = agent.follow(after=11)
    rest = "".join(c.text_only(turn))
    assert rest == "." and turn.text == "Hello, world.\n\nDone."
    assert cursors[0][0] == 11


# --- standalone ------------------------------------------------------------------------------------


def test_the_client_package_needs_only_the_standard_library(tmp_path):
    shutil.copytree(CLIENT, tmp_path / "client", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import client; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'sessions', 'httpx')]; "
            "assert not bad, bad; print(len(client.__all__))")
    out = subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
