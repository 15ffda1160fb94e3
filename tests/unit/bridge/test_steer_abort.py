"""Steering lands at the next step boundary; abort ends a turn now."""

from __future__ import annotations

from .harness import types


def test_steer_mid_turn_is_delivered_at_the_next_step_boundary(make_bridge):
    bridge = make_bridge()
    client = bridge.client
    client.ok("prompt", text="sleep: 2")
    client.wait_type("tool.dispatched")
    assert client.ok("steer", text="say: steered")["turn"] == 1

    events = client.wait_type("turn.finished")
    kinds = types(events)
    assert (kinds.index("tool.result") < kinds.index("steer.delivered")
            < kinds.index("turn.finished"))
    assert events[kinds.index("steer.delivered")]["data"] == {"turn": 1, "text": "say: steered"}
    assert events[-1]["data"]["text"] == "[demo] steered"
    steers = [m["text"] for m in bridge.session()["messages"] if m.get("kind") == "steer"]
    assert steers == ["say: steered"]


def test_abort_during_a_tool_call_interrupts_it_and_the_next_prompt_works(make_bridge):
    bridge = make_bridge()
    client = bridge.client
    client.ok("prompt", text="say: going to sleep\nsleep: 60")
    dispatched = client.wait_type("tool.dispatched")[-1]
    assert client.ok("abort") == {"id": client._id, "ok": True, "aborted": True, "turn": 1}

    events = client.wait_type("turn.interrupted")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert result["tool_call_id"] == dispatched["data"]["tool_call_id"]
    assert result["interrupted"] is True and result["exit_code"] == -1
    settled = events[-1]["data"]
    assert (settled["reason"], settled["text"]) == ("aborted", "[demo] going to sleep")
    assert client.ok("abort")["aborted"] is False

    after = events[-1]["bseq"]
    nxt = client.run_turn("say: awake", after=after)
    assert nxt[-1]["type"] == "turn.finished" and nxt[-1]["data"]["text"] == "[demo] awake"
    # The aborted call was answered exactly once in the conversation.
    results = [m for m in bridge.session()["messages"] if m["role"] == "tool"]
    assert [r["tool_call_id"] for r in results] == [result["tool_call_id"]]
    everything = client.events(0)
    assert types(everything).count("turn.interrupted") == 1
    assert types(everything).count("tool.result") == 1


def test_a_steer_sent_again_with_its_command_id_is_delivered_once(make_bridge):
    client = make_bridge().client
    client.ok("prompt", text="sleep: 1")
    client.wait_type("tool.dispatched")
    first = client.ok("steer", text="say: once", command_id="41")
    again = client.ok("steer", text="say: once", command_id="41")
    assert again["duplicate"] is True and again["turn"] == first["turn"]
    events = client.wait_type("turn.finished")
    assert types(events).count("steer.delivered") == 1
