"""Sandbox sessions through a real server (manage.py serve), on BOTH backends:
create → exec → checkpoint → exec → the sandbox lost (docker rm -f, or the
local sandbox removed) → resume → the snapshot's files and the replayed
execs' files are there; a replay divergence reported; a kill -9 of the
control plane mid-exec (the exec is reported, never run twice); the Python
client round trip. docs/API.md "Sandbox sessions"."""

from __future__ import annotations

import time

import pytest

from sessions import client as c
from tests.integration.worlds import WAIT, World, exec_behind, remove_sandbox

pytestmark = pytest.mark.live


def command(w: World, cid: int, timeout: float = WAIT) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        cmd = w.get(f"/api/commands/{cid}")
        if cmd["state"] != "pending":
            return cmd
        if time.monotonic() > deadline:
            raise AssertionError(f"command {cid} still pending; log:\n{w.server.log()[-4000:]}")
        time.sleep(0.2)


def create(w: World) -> str:
    r = w.post("/api/sandboxes", {})
    assert r.status_code == 201, r.text
    assert command(w, r.json()["command"])["state"] == "done"
    return r.json()["id"]


def run(w: World, sb: str, verb: str, body: dict) -> dict:
    path = f"/api/sandboxes/{sb}/" + ("snapshots" if verb == "checkpoint" else verb)
    r = w.post(path, body)
    assert r.status_code == 202, r.text
    return command(w, r.json()["command"])


def sh(w: World, sb: str, script: str, **kw) -> dict:
    return run(w, sb, "exec", {"argv": ["sh", "-c", script], **kw})


def types(w: World, sb: str) -> list[str]:
    return [e["type"] for e in w.get(f"/api/sandboxes/{sb}/events?limit=1000")["events"]]


@pytest.fixture
def session(world):
    sb = create(world)
    yield sb
    run(world, sb, "remove", {})  # the sandbox and its snapshot images go


def test_lost_sandbox_comes_back_from_its_snapshot_with_replay(world, session):
    w, sb = world, session
    assert sh(w, sb, "echo snap > s.txt")["result"]["exit_code"] == 0
    assert run(w, sb, "checkpoint", {"name": "deps"})["state"] == "done"
    out = sh(w, sb, "echo after >> s.txt; echo r > r.txt; cat s.txt")["result"]
    assert (out["exit_code"], out["stdout"]) == (0, "snap\nafter\n")
    old = w.get(f"/api/sandboxes/{sb}")["sandbox_id"]
    remove_sandbox(w, old)
    lost = sh(w, sb, "true")
    assert (lost["state"], lost["result"]["code"]) == ("failed", "sandbox.lost")
    resumed = run(w, sb, "resume", {})
    assert resumed["state"] == "done", resumed
    r = resumed["result"]
    assert r["snapshot"] == "deps" and r["old_sandbox_id"] == old and r["sandbox_id"] != old
    assert [x["exit_code"] for x in r["replayed"]] == [0]
    files = sh(w, sb, "cat s.txt r.txt")["result"]
    assert files["stdout"] == "snap\nafter\nr\n", files
    detail = w.get(f"/api/sandboxes/{sb}")
    assert detail["status"] == "ready" and detail["sandbox_id"] == r["sandbox_id"]
    assert [s["name"] for s in detail["snapshots"]] == ["deps"]
    assert {"session.lost", "session.resuming", "exec.replayed", "session.resumed"} <= set(
        types(w, sb))


def test_a_replay_that_diverges_is_reported(world, session):
    w, sb = world, session
    run(w, sb, "checkpoint", {"name": "base"})
    # A timed-out exec is never replayed, but what it did stays in this sandbox.
    timed_out = sh(w, sb, "touch marker; sleep 30", timeout=1)
    assert timed_out["result"]["code"] == "exec.timeout"
    assert sh(w, sb, "test -e marker")["result"]["exit_code"] == 0  # exits 1 when replayed
    sh(w, sb, "echo never > dropped")
    remove_sandbox(w, w.get(f"/api/sandboxes/{sb}")["sandbox_id"])
    cmd = run(w, sb, "resume", {})
    assert cmd["state"] == "failed" and cmd["result"]["code"] == "replay.diverged", cmd
    d = cmd["result"]["diverged"]
    assert (d["index"], d["recorded_exit_code"], d["exit_code"], d["dropped"]) == (0, 0, 1, 1)
    assert "exec 1" in cmd["result"]["message"] and "test -e marker" in cmd["result"]["message"]
    assert [n["reason"] for n in cmd["result"]["not_replayed"]] == ["exec.timed_out"]
    assert sh(w, sb, "test -e dropped")["result"]["exit_code"] == 1
    assert "session.replay_diverged" in types(w, sb)


def test_kill_9_of_the_control_plane_mid_exec(world, session):
    w, sb = world, session
    r = w.post(f"/api/sandboxes/{sb}/exec",
               {"argv": ["sh", "-c", "echo x >> runs; echo running; sleep 6; echo done > late"]})
    assert r.status_code == 202
    cid = r.json()["command"]
    deadline = time.monotonic() + WAIT
    while "exec.output" not in types(w, sb):  # its output is journaled: it runs now
        assert time.monotonic() < deadline, "the exec never started"
        time.sleep(0.1)
    w.server.kill()  # SIGKILL: no shutdown code runs
    w.server.start()
    cmd = command(w, cid)
    assert (cmd["state"], cmd["result"]["code"]) == ("failed", "exec.interrupted"), cmd
    _wait_until_it_ended_there(w, w.get(f"/api/sandboxes/{sb}")["sandbox_id"])
    # Never run a second time (`; true`: the check itself replays alike on a fresh disk).
    assert sh(w, sb, "cat runs 2>/dev/null; true")["result"]["stdout"] == "x\n"
    resumed = run(w, sb, "resume", {})
    assert resumed["state"] == "done", resumed
    assert [n["command"] for n in resumed["result"]["not_replayed"]] == [cid]
    assert len(resumed["result"]["replayed"]) == 1  # the check; not the interrupted exec
    assert sh(w, sb, "test -e runs")["result"]["exit_code"] == 1


def _wait_until_it_ended_there(w: World, sid: str) -> None:
    """What ran inside the sandbox before the crash may finish there: wait
    (bounded) until no process of it is left, looked at behind the control
    plane's back (a journaled exec would be replayed by the resume below).
    `sle[e]p` matches the exec's processes, never this check's own."""
    probe = ["sh", "-c", "grep -l 'sle[e]p 6' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"]
    deadline = time.monotonic() + WAIT
    while int(exec_behind(w, sid, probe).strip() or 0):
        assert time.monotonic() < deadline, "the interrupted exec still runs in the sandbox"
        time.sleep(0.2)


def test_the_client_round_trip(world):
    w = world
    opts = {"url": w.url, "token": w.actor.token}
    sb = c.Sandbox.create(name="client", **opts)
    try:
        assert sb.status == "ready" and sb.sandbox_id
        assert sb.exec(["sh", "-c", "echo 1 > one"]).ok
        seen: list[tuple[str, str, float]] = []
        got = sb.exec(["sh", "-c", "echo early; sleep 3; echo late"],
                      on_output=lambda s, t: seen.append((s, t, time.monotonic())))
        assert got.stdout == "early\nlate\n"
        assert "".join(t for _s, t, _at in seen) == "early\nlate\n"
        # "early" was handed over while the exec still ran: before "late", not with it.
        assert seen[0][1] == "early\n" and len(seen) == 2
        sb.checkpoint("one")
        assert sb.exec(["mkdir", "-p", "d"]).ok
        assert sb.exec(["sh", "-c", "pwd > here"], cwd="d").ok
        assert [s["name"] for s in sb.snapshots()] == ["one"]
        remove_sandbox(w, sb.sandbox_id)
        with pytest.raises(c.SandboxLost):
            sb.exec(["true"])
        sb = c.Sandbox.resume(sb.id, **opts)
        assert len(sb.replayed) == 2 and sb.not_replayed == []
        got = sb.exec(["sh", "-c", "cat one d/here"])
        assert got.stdout.splitlines()[0] == "1" and got.stdout.strip().endswith("/d")
        assert "session.resumed" in [e.type for e in sb.events()]
    finally:
        sb.remove()
    assert sb.status == "removed"


def test_a_session_from_a_specs_setup_snapshot(world):
    w = world
    spec = {"setup": ['echo from-setup > "$HOME/setup.txt"']}
    r = w.post("/api/sandboxes", {"spec": spec})
    assert r.status_code == 201, r.text
    sb = r.json()["id"]
    try:
        created = command(w, r.json()["command"], timeout=WAIT * 2)
        assert created["state"] == "done", created
        image = [e for e in w.get(f"/api/sandboxes/{sb}/events")["events"]
                 if e["type"] == "session.sandbox"][0]["data"]["image"]
        assert "setup" in image  # the spec's setup snapshot, not the base image
        assert sh(w, sb, "cat setup.txt")["result"]["stdout"] == "from-setup\n"
    finally:
        run(w, sb, "remove", {})


def test_the_journal_streams_as_server_sent_events(world, session):
    from tests.live import SSEStream

    w, sb = world, session
    head = w.get(f"/api/sandboxes/{sb}")["last_seq"]
    with SSEStream(f"{w.url}/api/sandboxes/{sb}/stream?after={head}", headers=w.actor.auth,
                   timeout=WAIT) as stream:
        assert stream.status == 200
        r = w.post(f"/api/sandboxes/{sb}/exec", {"argv": ["sh", "-c", "echo one; sleep 2; echo two"]})
        assert r.status_code == 202
        seen = []
        while not seen or seen[-1].event != "exec.finished":
            seen.append(stream.next_event(timeout=WAIT))
    assert [int(e.id) for e in seen] == list(range(head + 1, head + 1 + len(seen)))
    kinds = [e.event for e in seen]
    assert kinds[:2] == ["command.exec", "exec.started"] and kinds.count("exec.output") == 2
    assert [e.json()["data"]["text"] for e in seen if e.event == "exec.output"] == ["one\n", "two\n"]
    stranger = w.server.create_actor("stranger-" + w.kind)
    with SSEStream(f"{w.url}/api/sandboxes/{sb}/stream", headers=stranger.auth) as other:
        assert other.status == 404 and b"sandbox.not_found" in other.body()
    with SSEStream(f"{w.url}/api/sandboxes/{sb}/stream") as anonymous:
        assert anonymous.status == 401
