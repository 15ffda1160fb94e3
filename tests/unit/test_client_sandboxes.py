"""The client's sandbox sessions (sessions/client/sandboxes.py) against a scripted
server: create waits for the sandbox, exec returns its outcome, retries reuse
the key, resume reports replay, failures map to typed errors."""

from __future__ import annotations

import json

import pytest

from sessions import client as c

from .test_client import Scripted

SB = {"id": "sb_1", "status": "ready", "sandbox_id": "x1", "name": ""}


@pytest.fixture
def srv():
    s = Scripted()
    yield s
    s.close()


def opts(srv):
    return {"url": srv.url, "token": "aln_test", "retry_for": 10}


def done(result):
    return (200, {"id": 7, "state": "done", "result": result})


def test_create_waits_for_the_sandbox(srv):
    srv.on("POST", "/api/sandboxes", (503, {"code": "server.unavailable", "message": "busy"}),
           (201, {"id": "sb_1", "command": 7}))
    srv.on("GET", "/api/commands/7", (200, {"id": 7, "state": "pending", "result": {}}),
           done({"sandbox_id": "x1"}))
    srv.on("GET", "/api/sandboxes/sb_1", (200, SB))
    sb = c.Sandbox.create("default", name="build", **opts(srv))
    assert (sb.id, sb.status, sb.sandbox_id) == ("sb_1", "ready", "x1")
    posts = [r for r in srv.requests if r["method"] == "POST"]
    assert len(posts) == 2 and len({r["headers"]["Idempotency-Key"] for r in posts}) == 1
    assert json.loads(posts[0]["body"]) == {"image": "default", "name": "build"}


def test_exec_returns_the_outcome(srv):
    srv.on("GET", "/api/sandboxes/sb_1", (200, SB))
    srv.on("POST", "/api/sandboxes/sb_1/exec", (202, {"command": 7, "verb": "exec"}))
    srv.on("GET", "/api/commands/7", done({"exit_code": 2, "stdout": "o", "stderr": "e",
                                           "duration_ms": 5, "truncated": {"stdout": 0}}))
    sb = c.Sandbox.attach("sb_1", **opts(srv))
    r = sb.exec(["ls", "-l"], cwd="sub", timeout=5)
    assert (r.exit_code, r.stdout, r.stderr, r.duration_ms, r.ok) == (2, "o", "e", 5, False)
    body = json.loads([x for x in srv.requests if x["method"] == "POST"][0]["body"])
    assert body == {"argv": ["ls", "-l"], "timeout": 5, "cwd": "sub"}


def test_resume_reports_the_replay(srv):
    srv.on("GET", "/api/sandboxes/sb_1", (200, SB))
    srv.on("POST", "/api/sandboxes/sb_1/resume", (202, {"command": 7, "verb": "resume"}))
    srv.on("GET", "/api/commands/7", done({"sandbox_id": "x2", "replayed": [{"of_seq": 4}],
                                           "not_replayed": [{"seq": 9}]}))
    sb = c.Sandbox.resume("sb_1", **opts(srv))
    assert sb.replayed == [{"of_seq": 4}] and sb.not_replayed == [{"seq": 9}]


@pytest.mark.parametrize("code, cls", [("replay.diverged", c.ReplayDiverged),
                                       ("sandbox.lost", c.SandboxLost),
                                       ("exec.interrupted", c.CommandFailed)])
def test_failed_commands_are_typed(srv, code, cls):
    srv.on("GET", "/api/sandboxes/sb_1", (200, SB))
    srv.on("POST", "/api/sandboxes/sb_1/resume", (202, {"command": 7, "verb": "resume"}))
    srv.on("GET", "/api/commands/7", (200, {"id": 7, "state": "failed",
                                            "result": {"code": code, "message": "m",
                                                       "diverged": {"index": 1}}}))
    with pytest.raises(cls) as err:
        c.Sandbox.resume("sb_1", **opts(srv))
    assert err.value.code == code and isinstance(err.value, c.AlineoError)
    if cls is c.ReplayDiverged:
        assert err.value.body["diverged"] == {"index": 1}


def test_quota_and_not_found_map_like_the_agent_client(srv):
    srv.on("POST", "/api/sandboxes", (429, {"code": "quota.sandboxes", "message": "full",
                                            "quota": "max_sandboxes", "limit": 1}))
    with pytest.raises(c.QuotaExceeded) as err:
        c.Sandbox.create(**opts(srv))
    assert not err.value.permanent and err.value.body["limit"] == 1
    srv.on("GET", "/api/sandboxes/sb_x", (404, {"code": "sandbox.not_found", "message": "no"}))
    with pytest.raises(c.NotFound):
        c.Sandbox.attach("sb_x", **opts(srv))


def test_snapshots_events_and_remove(srv):
    srv.on("GET", "/api/sandboxes/sb_1", (200, SB))
    srv.on("POST", "/api/sandboxes/sb_1/snapshots", (202, {"command": 7, "verb": "checkpoint"}))
    srv.on("POST", "/api/sandboxes/sb_1/remove", (202, {"command": 7, "verb": "remove"}))
    srv.on("GET", "/api/commands/7", done({"name": "deps", "ms": 3}))
    srv.on("GET", "/api/sandboxes/sb_1/snapshots", (200, {"snapshots": [{"name": "deps"}]}))
    srv.on("GET", "/api/sandboxes/sb_1/events", (200, {"events": [
        {"seq": 1, "type": "session.created", "ts": "t", "data": {}}], "has_more": False}))
    sb = c.Sandbox.attach("sb_1", **opts(srv))
    assert sb.checkpoint("deps") == {"name": "deps", "ms": 3}
    assert sb.snapshots() == [{"name": "deps"}]
    assert [e.type for e in sb.events()] == ["session.created"]
    sb.remove()


def test_exec_hands_over_output_while_it_runs(srv):
    srv.on("GET", "/api/sandboxes/sb_1", (200, SB))
    srv.on("POST", "/api/sandboxes/sb_1/exec", (202, {"command": 7, "verb": "exec", "seq": 4}))
    srv.on("GET", "/api/commands/7", (200, {"id": 7, "state": "pending", "result": {}}),
           done({"exit_code": 0, "stdout": "a\nb\n", "stderr": "", "duration_ms": 1}))
    out = {"events": [{"seq": 5, "type": "exec.output", "ts": "t",
                       "data": {"command": 7, "stream": "stdout", "text": "a\n"}},
                      {"seq": 6, "type": "exec.output", "ts": "t",
                       "data": {"command": 6, "stream": "stdout", "text": "other"}}],
           "has_more": False}
    more = {"events": [{"seq": 7, "type": "exec.output", "ts": "t",
                        "data": {"command": 7, "stream": "stdout", "text": "b\n"}}],
            "has_more": False}
    srv.on("GET", "/api/sandboxes/sb_1/events", (200, out), (200, more))
    seen = []
    r = c.Sandbox.attach("sb_1", **opts(srv)).exec(["x"], on_output=lambda s, t: seen.append(t))
    assert seen == ["a\n", "b\n"] and r.stdout == "a\nb\n"
    afters = [q["path"] for q in srv.requests if q["path"].startswith("/api/sandboxes/sb_1/events")]
    assert "after=4" in afters[0] and "after=6" in afters[1]
