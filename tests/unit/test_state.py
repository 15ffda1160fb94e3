"""The reducer: replay from a snapshot equals replay from scratch, and old
snapshot formats stay readable."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessions import state

TYPES = [
    "agent.spawned", "agent.status", "agent.sandbox", "turn.started", "turn.finished",
    "turn.interrupted", "message.user", "message.assistant", "steer.delivered",
    "tool.dispatched", "tool.result", "agent.child_spawned", "agent.restored",
    "agent.lost", "command.prompt", "operator.note", "some.future_type",
]

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.text(max_size=8))
event_data = st.fixed_dictionaries(
    {},
    optional={
        "text": st.text(max_size=30),
        "tool_call_id": st.sampled_from(["c1", "c2", "c3"]),
        "name": st.text(max_size=5),
        "child": st.sampled_from(["ag_a", "ag_b"]),
        "status": st.sampled_from(["idle", "paused", "stopped"]),
        "reason": st.text(max_size=10),
        "rung": st.sampled_from(["reattach", "restore"]),
        "new_sandbox_id": st.text(max_size=6),
        "sandbox_id": st.text(max_size=6),
        "extra": json_scalars,
    },
)


@st.composite
def transcripts(draw):
    kinds = draw(st.lists(st.tuples(st.sampled_from(TYPES), event_data), max_size=60))
    return [
        {"seq": i + 1, "type": t, "data": d, "ts": f"2026-11-29T08:00:{i % 60:02d}.000000Z"}
        for i, (t, d) in enumerate(kinds)
    ]


@settings(max_examples=300, deadline=None)
@given(transcripts(), st.data())
def test_replay_from_snapshot_equals_replay_from_scratch(events, data):
    cut = data.draw(st.integers(0, len(events)))
    scratch = state.replay(events)
    snap = json.loads(json.dumps(state.replay(events[:cut])))  # stored as JSON, read back
    resumed = state.replay(events[cut:], state.upgrade(snap, state.SNAPSHOT_VERSION))
    assert resumed == scratch


@given(transcripts())
@settings(max_examples=100, deadline=None)
def test_reduce_never_mutates_its_input(events):
    s = state.initial_state()
    for event in events:
        before = json.dumps(s, sort_keys=True)
        new = state.reduce(s, event)
        assert json.dumps(s, sort_keys=True) == before
        s = new


def test_gap_is_a_replay_error():
    events = [{"seq": 1, "type": "x.y", "data": {}}, {"seq": 3, "type": "x.y", "data": {}}]
    with pytest.raises(state.ReplayError, match="gap"):
        state.replay(events)


def test_tool_calls_open_and_close_and_a_settled_turn_closes_dangling_ones():
    events = [
        {"seq": 1, "type": "turn.started", "data": {}},
        {"seq": 2, "type": "tool.dispatched", "data": {"tool_call_id": "a", "name": "bash"}},
        {"seq": 3, "type": "tool.dispatched", "data": {"tool_call_id": "b", "name": "read"}},
        {"seq": 4, "type": "tool.result", "data": {"tool_call_id": "a"}},
    ]
    s = state.replay(events)
    assert set(s["open_tool_calls"]) == {"b"} and s["status"] == "running"
    s = state.reduce(s, {"seq": 5, "type": "turn.interrupted", "data": {"text": "partial"}})
    assert s["open_tool_calls"] == {} and s["status"] == "interrupted" and s["current_turn"] is None


# A snapshot exactly as release 1 wrote it (format version 1): `open_tools`
# instead of `open_tool_calls`, status "active", no restore facts.
V1_SNAPSHOT = {
    "last_seq": 7,
    "status": "active",
    "turns": 2,
    "current_turn": {"turn": 2, "started_seq": 6, "started_at": "2026-11-01T00:00:00.000000Z", "steps": 0},
    "messages": 3,
    "recent_messages": [{"seq": 2, "role": "user", "text": "hi"}],
    "open_tools": {"call_9": {"name": "bash", "seq": 7}},
    "parent": None,
    "children": ["ag_child"],
}


def test_old_format_snapshot_is_still_read():
    s = state.upgrade(V1_SNAPSHOT, 1)
    assert s["status"] == "running"
    assert s["open_tool_calls"] == {"call_9": {"name": "bash", "seq": 7}}
    assert "open_tools" not in s
    # and the transcript continues from it
    s = state.reduce(s, {"seq": 8, "type": "tool.result", "data": {"tool_call_id": "call_9"}})
    s = state.reduce(s, {"seq": 9, "type": "turn.finished", "data": {}})
    assert s["open_tool_calls"] == {} and s["status"] == "idle" and s["children"] == ["ag_child"]


def test_snapshot_from_a_newer_release_is_refused_not_misread():
    with pytest.raises(state.ReplayError, match="newer"):
        state.upgrade({"last_seq": 1}, state.SNAPSHOT_VERSION + 1)
