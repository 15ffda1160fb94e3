"""`kill -9` of the control plane in the middle of ONE turn of an agent on a
(fake) real model, `network: none`, on both backends; the server is started
again and the turn completes. The fake OpenAI-compatible upstream on
127.0.0.1 counts what it receives and checks the key the gateway injects:

- between two model calls: the bridge's first call asked for a tool, a
  harness inside the sandbox (that tool) made call A, and its call B is in
  flight at the upstream when the control plane dies. The harness retries
  its step from A: A is answered from the journal (`model.replayed`) and never
  reaches the upstream twice; only B, in flight at the crash, is sent again;
- during the bridge's own call: it is cut, the bridge asks again of the
  restarted gateway, and the turn finishes (the in-flight call may be re-sent,
  docs/DURABILITY.md).
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
import time
import uuid

from tests.integration.test_credentials import store_secret
from tests.integration.worlds import assert_sound, events_of
from tests.unit.bridge.fake_models import FakeModelServer, Gate, openai_completion

HARNESS = """\
import json, os, time, urllib.request

URL = os.environ["OPENAI_BASE_URL"] + "/chat/completions"


def ask(text):
    body = json.dumps({"model": "any", "messages": [{"role": "user", "content": text}]})
    request = urllib.request.Request(URL, body.encode(), {
        "content-type": "application/json",
        "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(request, timeout=170) as answer:
        return json.load(answer)["choices"][0]["message"]["content"]


# A harness that, when its step fails, does the whole step again (A, then B).
for attempt in range(1, 400):
    try:
        a = ask("harness step A")
        b = ask("harness step B")
        print("harness:", a, b, "attempts:", attempt)
        break
    except Exception as exc:
        print("again after", type(exc).__name__, flush=True)
        time.sleep(0.5)
"""


def _last(request: dict) -> dict:
    return request["body"]["messages"][-1]


def _kind(request: dict) -> str:
    last = _last(request)
    if last["role"] == "tool":
        return "final"
    return {"harness step A": "A", "harness step B": "B"}.get(last.get("content"), "first")


def _kinds(fake: FakeModelServer) -> list[str]:
    return [_kind(r) for r in fake.requests]


def _wait(what: str, predicate, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _spawn(world, fake: FakeModelServer, key: str) -> str:
    suffix = uuid.uuid4().hex[:6]
    store_secret(world, f"crash-key-{suffix}", key)
    store_secret(world, f"crash-url-{suffix}", fake.url + "/v1")
    spec = {"model": "openai:fake-model", "network": "none",
            "credentials": [{"name": f"crash-key-{suffix}", "env": "OPENAI_API_KEY"},
                            {"name": f"crash-url-{suffix}", "env": "OPENAI_BASE_URL"}]}
    return world.spawn(spec, "run the harness")


def _kill_and_restart(world, gate: Gate) -> None:
    world.server.kill()
    gate.open()  # the upstream answers now, into a connection that died with the gateway
    world.server.start()


def test_kill_between_two_calls_of_a_turn_replays_the_completed_one(world):
    key = "sk-crash-" + uuid.uuid4().hex
    gate = Gate(openai_completion(["beta"]))
    seen_b = []

    def respond(request):
        kind = _kind(request)
        if kind == "first":
            return openai_completion(["Running the harness."], [
                ("call_w", "write", [json.dumps({"path": "harness.py", "content": HARNESS})]),
                ("call_h", "bash", [json.dumps({"command": "python3 harness.py"})])])
        if kind == "A":
            return openai_completion(["alpha"])
        if kind == "B":
            seen_b.append(1)
            return gate if len(seen_b) == 1 else openai_completion(["beta"])
        return openai_completion(["All done."])

    with FakeModelServer() as fake:
        fake.respond = respond
        agent = _spawn(world, fake, key)
        _wait("call B at the upstream", lambda: "B" in _kinds(fake))
        [a_call] = [e for e in events_of(world.events(agent), "model.call")
                    if e["data"]["response"]["text"] == "alpha"]  # A is journaled
        _kill_and_restart(world, gate)
        events = world.wait_turns(agent, 1, timeout=240)
    assert _kinds(fake) == ["first", "A", "B", "B", "final"]  # A once; B was in flight
    assert {r["headers"]["authorization"] for r in fake.requests} == {f"Bearer {key}"}
    assert_sound(events)
    assert not events_of(events, "turn.interrupted")
    [replayed] = events_of(events, "model.replayed")
    assert replayed["data"]["of_seq"] == a_call["seq"]
    assert replayed["data"]["request_hash"] == a_call["data"]["request_hash"]
    output = next(r["data"]["output"] for r in events_of(events, "tool.result")
                  if r["data"]["name"] == "bash")
    assert "harness: alpha beta attempts: 2" in output
    assert events_of(events, "turn.finished")[0]["data"]["text"].endswith("All done.")
    calls = [e["data"]["response"]["text"] for e in events_of(events, "model.call")]
    assert calls == ["Running the harness.", "alpha", "beta", "All done."]
    assert key not in json.dumps(events)
    assert any(e["data"].get("rung") == "reattach" for e in events_of(events, "agent.restored"))
    assert_not_in_the_sandbox(world, agent, key)


def assert_not_in_the_sandbox(world, agent: str, key: str) -> None:
    """The injected key is in no file of the sandbox's home or run dir and in
    no environment of its processes (the bridge's, the tools'), read from the
    host: the sandbox's own view (`run: env`) is tests/integration/test_gateway.py."""
    sid = world.get(f"/api/agents/{agent}")["sandbox_id"]
    needle = key.encode()
    blobs = {str(p): p.read_bytes() for p in (world.server.data_dir / "run" / agent).rglob("*")
             if p.is_file()}
    if world.kind == "local":
        from sandboxes.backends.procs import pids_with_env

        root = world.server.data_dir / "sandboxes" / sid
        blobs.update({str(p): p.read_bytes() for p in root.rglob("*")
                      if p.is_file() and not p.is_symlink()})
        pids = list(pids_with_env("ALINEO_SANDBOX_ID", sid))
    else:
        import docker

        client = docker.from_env()
        try:
            stream, _ = client.api.get_archive(sid, "/root")
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                blobs.update({m.name: tar.extractfile(m).read() for m in tar if m.isfile()})
            blobs["config.env"] = json.dumps(client.api.inspect_container(sid)["Config"]).encode()
            top = client.api.top(sid)
            column = top["Titles"].index("PID")
            pids = [int(row[column]) for row in top["Processes"]]
        finally:
            client.close()
    assert pids, "the sandbox's processes were not found"
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            blobs[f"/proc/{pid}/environ"] = open(f"/proc/{pid}/environ", "rb").read()
    assert any(name.endswith("harness.py") for name in blobs)  # the home was read
    assert [name for name, blob in blobs.items() if needle in blob] == []


def test_kill_during_the_bridges_call_asks_again_and_the_turn_finishes(world):
    key = "sk-crash-" + uuid.uuid4().hex
    gate = Gate(openai_completion(["Too late."]))
    finals = []

    def respond(request):
        if _kind(request) != "final":
            return openai_completion(["Looking."], [
                ("call_e", "bash", [json.dumps({"command": "echo tool-ran"})])])
        finals.append(1)
        return gate if len(finals) == 1 else openai_completion(["Done after the restart."])

    with FakeModelServer() as fake:
        fake.respond = respond
        agent = _spawn(world, fake, key)
        _wait("the bridge's second call at the upstream", lambda: finals)
        _kill_and_restart(world, gate)
        events = world.wait_turns(agent, 1, timeout=240)
    assert _kinds(fake) == ["first", "final", "final"]  # the in-flight call, sent again
    assert_sound(events)
    assert not events_of(events, "turn.interrupted") and not events_of(events, "model.error")
    assert events_of(events, "turn.finished")[0]["data"]["text"].endswith(
        "Done after the restart.")
    assert [e["data"]["response"]["text"] for e in events_of(events, "model.call")] == [
        "Looking.", "Done after the restart."]
    assert len(events_of(events, "tool.result")) == 1  # the tool ran once
