"""Pause lets the step in flight finish and holds the agent at the next step
boundary; no queued prompt starts while paused; unpause goes on. A paused
bridge stays paused across a restart."""

from __future__ import annotations

from .harness import types


def test_pause_holds_at_the_next_step_boundary_and_unpause_goes_on(make_bridge):
    bridge = make_bridge()
    client = bridge.client
    client.ok("prompt", text="sleep: 1")
    client.wait_type("tool.dispatched")
    assert client.ok("pause")["paused"] is True
    client.ok("prompt", text="say: queued while paused")
    held = client.wait_type("turn.held")
    kinds = types(held)
    assert kinds.index("tool.result") < kinds.index("turn.held")  # the step in flight finished
    assert "turn.finished" not in kinds
    assert client.ok("status")["paused"] is True and client.ok("status")["queued"] == [2]

    assert client.ok("unpause")["paused"] is False
    events = client.wait_type("turn.finished", turn=2)
    kinds = types(events)
    assert kinds.index("bridge.unpaused") < kinds.index("turn.finished")
    assert events[-1]["data"]["text"] == "[demo] queued while paused"


def test_a_paused_bridge_stays_paused_after_a_restart(make_bridge):
    bridge = make_bridge()
    bridge.client.ok("pause")
    bridge.kill9()
    bridge.start()
    client = bridge.client
    assert client.ok("status")["paused"] is True
    client.ok("prompt", text="say: later")
    assert client.ok("status")["queued"] == [1]  # held, not started
    client.ok("unpause")
    events = client.wait_type("turn.finished")
    assert events[-1]["data"]["text"] == "[demo] later"
