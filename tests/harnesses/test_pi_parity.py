"""The Pi harness behaves as the built-in one where Pi allows it: a spent
budget, bound secrets kept out of Pi's session file (and so out of
checkpoints), the pre_tool_use hook, and the spawn and memory tools (through
the bridge's extension for Pi, pi_extension.py). The real Pi, the real
gateway, a real bridge; no sandbox."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sessions.gateway.server import GatewayServer, Route
from tests.unit.gateway.test_bridge_through_gateway import OverBudget

from .conftest import RecordingUpstream


def _settled(events: list[dict]) -> dict:
    return next(e for e in reversed(events) if e["type"] in ("turn.finished", "turn.interrupted"))


def test_a_spent_budget_settles_as_budget_exceeded_and_pi_does_not_retry(
        loop, pi_bridge, gateway, pi_dirs):
    journal = OverBudget()
    loop.run(gateway.close())
    spent = GatewayServer(Route("a-pi", RecordingUpstream(), journal),
                          os.path.join(pi_dirs, "run", "gateway.sock"), max_body=1 << 24)
    loop.run(spent.start())
    try:
        bridge = pi_bridge()
        events = bridge.client.run_turn("say: hi")
        settled = _settled(events)
        assert settled["type"] == "turn.interrupted"
        assert settled["data"]["reason"] == "budget_exceeded", settled
        error = next(e for e in events if e["type"] == "model.error")["data"]["message"]
        assert "budget_exceeded" in error
        time.sleep(3.0)  # Pi's first auto-retry would come after 2 s
        assert len(journal.exceeded_with) == 1, "Pi asked again after the budget refusal"
    finally:
        loop.run(spent.close())


TOKEN = "ghp_pi" + "Z7q2" * 8


def test_a_bound_value_a_pi_tool_printed_is_in_no_file_of_the_home(pi_bridge, gateway):
    bridge = pi_bridge(start=False, redact=[{"name": "github", "env": "GH_TOKEN"}])
    bridge.env = {"GH_TOKEN": TOKEN}
    bridge.start()
    events = bridge.client.run_turn("run: echo token=$GH_TOKEN")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert result["output"].startswith("token=[redacted:github]"), result
    session = Path(bridge.home, ".alineo", "pi", "session.jsonl").read_text()
    assert "[redacted:github]" in session
    # A prompt that holds the value is redacted from Pi's file at the turn's end.
    bridge.client.run_turn(f"say: the token is {TOKEN}", after=events[-1]["bseq"])
    for path in [p for p in Path(bridge.home).rglob("*") if p.is_file()]:
        assert TOKEN not in path.read_text(errors="replace"), path
    assert TOKEN not in json.dumps(bridge.client.events(0))
    # The model's context (at the gateway) had the placeholder, not the value.
    assert not any(TOKEN in t for r in range(len(gateway.upstream.requests))
                   for t in gateway.upstream.texts(r)[:-1])


def test_the_pre_tool_use_hook_denies_and_allows_pis_tool_calls(pi_bridge, gateway):
    hook = 'case "$ALINEO_TOOL_INPUT" in *forbidden*) echo "no forbidden"; exit 3;; esac'
    bridge = pi_bridge(hooks={"pre_tool_use": hook})
    events = bridge.client.run_turn("run: echo forbidden > f.txt")
    verdicts = [e["data"] for e in events if e["type"] == "hook.verdict"]
    call = next(e["data"] for e in events if e["type"] == "tool.dispatched")
    assert [(v["hook"], v["verdict"], v["tool_call_id"]) for v in verdicts] == [
        ("pre_tool_use", "deny", call["tool_call_id"])]
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert result["is_error"] and "denied by the pre_tool_use hook: no forbidden" in result["output"]
    assert not Path(bridge.home, "f.txt").exists()

    events = bridge.client.run_turn("run: echo allowed > g.txt", after=events[-1]["bseq"])
    assert [e["data"]["verdict"] for e in events if e["type"] == "hook.verdict"] == ["allow"]
    assert Path(bridge.home, "g.txt").read_text() == "allowed\n"


def test_spawn_from_pi_asks_the_control_plane_and_pi_gets_the_reply(pi_bridge, gateway):
    bridge = pi_bridge()
    client = bridge.client
    client.ok("prompt", text="spawn: write the tests")
    request = client.wait_type("request.spawn")[-1]["data"]
    dispatched = next(e["data"] for e in client.events(0) if e["type"] == "tool.dispatched")
    assert request["prompt"] == "write the tests" and dispatched["name"] == "spawn"
    assert request["tool_call_id"] == dispatched["tool_call_id"]  # Pi's id
    assert client.ok("status")["pending_requests"] == [request["request_id"]]
    client.ok("reply", request_id=request["request_id"], result={"agent_id": "child-7"})
    events = client.wait_type("turn.finished")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert json.loads(result["output"]) == {"agent_id": "child-7"} and not result["is_error"]
    assert any("child-7" in t for t in gateway.upstream.texts())  # Pi's model saw the answer


def test_memory_from_pi_asks_the_control_plane_and_pi_gets_the_note(pi_bridge, gateway):
    client = pi_bridge().client
    client.ok("prompt", text="memory: get plan")
    request = client.wait_type("request.memory")[-1]["data"]
    dispatched = next(e["data"] for e in client.events(0) if e["type"] == "tool.dispatched")
    assert (request["op"], request["key"]) == ("get", "plan") and dispatched["name"] == "memory"
    assert request["tool_call_id"] == dispatched["tool_call_id"]  # Pi's id
    client.ok("reply", request_id=request["request_id"], result={"value": "ship on friday"})
    events = client.wait_type("turn.finished")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert json.loads(result["output"]) == {"value": "ship on friday"} and not result["is_error"]
    assert any("ship on friday" in t for t in gateway.upstream.texts())  # Pi's model saw it


def test_an_abort_ends_a_pending_spawn(pi_bridge):
    client = pi_bridge().client
    turn = client.ok("prompt", text="spawn: never answered")["turn"]
    client.wait_type("request.spawn")
    assert client.ok("abort")["aborted"]
    events = client.wait_type("turn.interrupted", turn=turn)
    assert events[-1]["data"]["reason"] == "aborted"
    after = client.run_turn("say: next", after=events[-1]["bseq"])
    assert _settled(after)["type"] == "turn.finished"
    assert client.ok("status")["pending_requests"] == []
