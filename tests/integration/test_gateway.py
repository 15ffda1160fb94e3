"""The model gateway for real, on both backends: a demo agent with network
`none` reaches the gateway through its bridge's forwarder on the sandbox's own
loopback and the run dir's unix socket, finishes a turn with tool calls, and
its tools see the base URLs and a placeholder key, never a credential."""

from __future__ import annotations

from tests.integration.worlds import DEMO, assert_sound, events_of


def test_a_demo_turn_goes_through_the_gateway_with_network_none(world):
    spec = {**DEMO, "network": "none"}
    agent = world.spawn(spec, "run: env\nwrite g.txt: through the gateway")
    events = world.wait_turns(agent, 1)
    assert_sound(events)
    dispatched = events_of(events, "tool.dispatched")
    assert [d["data"]["name"] for d in dispatched] == ["bash", "write"]
    assert all(d["data"]["tool_call_id"].startswith("call_demo_") for d in dispatched)
    env = next(r["data"]["output"] for r in events_of(events, "tool.result")
               if r["data"]["name"] == "bash")
    values = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    assert values["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")
    assert values["OPENAI_API_KEY"] == "alineo-gateway"
    finished = events_of(events, "turn.finished")[0]["data"]["text"]
    assert finished.startswith("[demo] Done.\n- bash done") and "- write done" in finished
    assert (world.server.data_dir / "run" / agent / "gateway.sock").exists()
