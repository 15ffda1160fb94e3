"""The Pi harness behind a real bridge: the real Pi from npm (pi --mode rpc),
the real gateway with the demo model on the run dir's socket, no sandbox.
What the transcript gets, steer and abort, and every way the bridge or Pi
can die and come back (kill -9), asserted from the bridge's events and from
the requests the gateway's upstream saw."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.unit.bridge.harness import WAIT, types

from .conftest import SLOW_MODEL, pi_pids


def _wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _settled(events: list[dict]) -> dict:
    return next(e for e in reversed(events) if e["type"] in ("turn.finished", "turn.interrupted"))


def test_pi_runs_the_tools_and_the_transcript_gets_its_facts(pi_bridge, gateway, pi_dirs):
    bridge = pi_bridge()
    home = Path(bridge.home)
    events = bridge.client.run_turn("write notes/a.txt: hello from pi")
    assert types(events)[1:3] == ["turn.started", "message.user"], types(events)
    calls = [e["data"] for e in events if e["type"] == "tool.dispatched"]
    assert [(c["name"], c["input"]) for c in calls] == [
        ("write", {"path": "notes/a.txt", "content": "hello from pi"})]
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert result["tool_call_id"] == calls[0]["tool_call_id"]  # Pi's id (the gateway's)
    assert result["tool_call_id"].startswith("call_demo_") and not result["is_error"]
    assert _settled(events)["type"] == "turn.finished"
    assert "message.assistant" in types(events)
    assert (home / "notes" / "a.txt").read_text() == "hello from pi"

    events = bridge.client.run_turn("run: cat notes/a.txt", after=events[-1]["bseq"])
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert result["name"] == "bash" and result["output"].startswith("hello from pi")
    assert result["exit_code"] == 0
    assert _settled(events)["data"]["text"].startswith("[demo] Done.")
    started = bridge.client.events(0)[0]
    assert started["type"] == "bridge.started" and started["data"]["harness"] == "pi"
    # Pi's session file is in the home (a turn checkpoint carries it), and
    # Pi's only model was the gateway's: its config names the forwarder.
    session = home / ".alineo" / "pi" / "session.jsonl"
    assert json.loads(session.read_text().splitlines()[0])["type"] == "session"
    models = json.loads((home / ".alineo" / "pi" / "agent" / "models.json").read_text())
    assert models["providers"]["alineo"]["baseUrl"].startswith("http://127.0.0.1:")
    assert len(gateway.upstream.requests) == 4  # two calls a turn, none re-sent


def test_a_failing_command_has_its_exit_code(pi_bridge):
    bridge = pi_bridge()
    events = bridge.client.run_turn("run: exit 3")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert result["is_error"] and result["exit_code"] == 3


def test_kill9_of_the_bridge_between_turns_resumes_pi_on_its_session(pi_bridge, gateway):
    bridge = pi_bridge()
    first = bridge.client.run_turn("write a.txt: one")
    assert _settled(first)["type"] == "turn.finished"
    pid = pi_pids(bridge.home)
    assert len(pid) == 1
    bridge.kill9()
    _wait_until(lambda: not pi_pids(bridge.home), "Pi to end with its bridge (stdin closed)")
    calls_before = len(gateway.upstream.requests)

    bridge.start()
    events = bridge.client.run_turn("run: cat a.txt", after=first[-1]["bseq"])
    assert _settled(events)["type"] == "turn.finished"
    assert next(e["data"] for e in events if e["type"] == "tool.result")["output"].startswith("one")
    # Pi continued its conversation: the next request carries the earlier turn.
    first_call = gateway.upstream.requests[calls_before]
    assert "write a.txt: one" in [m.text for m in first_call.messages]
    assert len(gateway.upstream.requests) == calls_before + 2  # nothing re-sent


def test_kill9_during_a_tool_settles_the_turn_and_pi_continues(pi_bridge, gateway):
    bridge = pi_bridge()
    turn = bridge.client.ok("prompt", text="run: sleep 30")["turn"]
    seen = bridge.client.wait_type("tool.dispatched")
    call_id = seen[-1]["data"]["tool_call_id"]
    time.sleep(0.5)  # Pi appends the assistant entry as it happens
    bridge.kill9()
    bridge.start()
    events = bridge.client.wait_type("turn.interrupted", after=seen[-1]["bseq"], turn=turn)
    closed = [e["data"] for e in events if e["type"] == "tool.result"]
    assert [(c["tool_call_id"], c.get("interrupted")) for c in closed] == [(call_id, True)]
    assert events[-1]["data"]["reason"] == "bridge_restarted"

    after = bridge.client.run_turn("say: still here", after=events[-1]["bseq"])
    assert _settled(after)["type"] == "turn.finished"
    texts = gateway.upstream.texts()
    assert "run: sleep 30" in texts and "say: still here" in texts


def test_kill9_during_the_first_model_call_keeps_the_prompt(pi_bridge, gateway):
    """Pi writes its session file only once the first assistant message exists:
    the bridge writes it from its own conversation, so the prompt is not lost."""
    bridge = pi_bridge()
    turn = bridge.client.ok("prompt", text=f"say: {SLOW_MODEL}")["turn"]
    _wait_until(lambda: gateway.upstream.requests, "the first model call")
    session = Path(bridge.home, ".alineo", "pi", "session.jsonl")
    assert not session.exists()
    bridge.kill9()
    bridge.start()
    events = bridge.client.wait_type("turn.interrupted", turn=turn)
    assert "harness.session_written" in types(bridge.client.events(0))
    after = bridge.client.run_turn("say: next", after=events[-1]["bseq"])
    assert _settled(after)["type"] == "turn.finished"
    assert f"say: {SLOW_MODEL}" in gateway.upstream.texts()


def test_pi_killed_inside_the_sandbox_is_restarted_on_its_session(pi_bridge, gateway):
    bridge = pi_bridge()
    first = bridge.client.run_turn("write b.txt: two")
    turn = bridge.client.ok("prompt", text="run: sleep 30")["turn"]
    bridge.client.wait_type("tool.dispatched", after=first[-1]["bseq"])
    (pid,) = pi_pids(bridge.home)
    os.kill(pid, signal.SIGKILL)
    events = bridge.client.wait_type("turn.interrupted", after=first[-1]["bseq"], turn=turn)
    assert events[-1]["data"]["reason"] == "harness_exited"
    assert "harness.exited" in types(events)
    after = bridge.client.run_turn("run: cat b.txt", after=events[-1]["bseq"])
    assert next(e["data"] for e in after if e["type"] == "tool.result")["output"].startswith("two")
    assert "write b.txt: two" in gateway.upstream.texts()  # the restarted Pi has the history
    assert pi_pids(bridge.home) != [pid]


def test_abort_settles_at_once_and_the_next_prompt_runs(pi_bridge):
    bridge = pi_bridge()
    turn = bridge.client.ok("prompt", text="run: sleep 30")["turn"]
    seen = bridge.client.wait_type("tool.dispatched")
    assert bridge.client.ok("abort")["aborted"]
    events = bridge.client.wait_type("turn.interrupted", after=seen[-1]["bseq"], turn=turn)
    assert events[-1]["data"]["reason"] == "aborted"
    after = bridge.client.run_turn("say: after the abort", after=events[-1]["bseq"])
    assert _settled(after)["type"] == "turn.finished"
    late = [e for e in bridge.client.events(after[-1]["bseq"]) if e["data"].get("turn") == turn]
    assert late == []  # nothing of the aborted prompt arrives after its settled end


def test_steer_reaches_pi_during_a_tool(pi_bridge, gateway):
    bridge = pi_bridge()
    turn = bridge.client.ok("prompt", text="run: sleep 2")["turn"]
    bridge.client.wait_type("tool.dispatched")
    bridge.client.ok("steer", text="say: steered")
    events = bridge.client.wait_for(lambda e: e["type"] in ("turn.finished", "turn.interrupted"))
    assert events[-1]["type"] == "turn.finished" and events[-1]["data"]["turn"] == turn
    delivered = [e["data"]["text"] for e in events if e["type"] == "steer.delivered"]
    assert delivered == ["say: steered"]
    assert "say: steered" in gateway.upstream.texts()


def test_a_seeded_conversation_becomes_pis_session(pi_bridge, gateway, pi_dirs):
    seed = pi_dirs / "seed.json"
    seed.write_text(json.dumps({"messages": [
        {"role": "user", "text": "remember the word tangerine"},
        {"role": "assistant", "text": "noted", "tool_calls": [
            {"id": "call_old_1", "name": "bash", "input": {"command": "true"}}]},
        {"role": "tool", "tool_call_id": "call_old_1", "name": "bash", "output": "",
         "exit_code": 0, "is_error": False}], "turns": 1}))
    bridge = pi_bridge(start=False)
    bridge.start("--seed", str(seed))
    events = bridge.client.run_turn("say: what was the word?")
    assert _settled(events)["data"]["turn"] == 2
    texts = gateway.upstream.texts()
    assert texts[:2] == ["remember the word tangerine", "noted"]
