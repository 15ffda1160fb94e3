"""The restore ladder's pure parts: which turn is left dangling, the facts that
settle it once, and the conversation a rebuilt bridge is seeded with
(validated by the bridge's own seed check)."""

from __future__ import annotations

import pytest

from sandboxes.bridge import conversation
from sessions.worker.settling import dangling, seed_conversation, settle_facts


def ev(etype: str, **data) -> dict:
    return {"type": etype, "data": data}


FINISHED_TURN = [
    ev("turn.started", turn=1, command_id="1"),
    ev("message.user", turn=1, text="run: ls"),
    ev("message.assistant", turn=1, text="[demo] Running 1 tool call."),
    ev("tool.dispatched", turn=1, tool_call_id="c1", name="bash", input={"command": "ls"}),
    ev("tool.result", turn=1, tool_call_id="c1", name="bash", output="a\n", exit_code=0,
       is_error=False),
    ev("message.assistant", turn=1, text="[demo] Done."),
    ev("turn.finished", turn=1, text="[demo] Done."),
]


def test_a_settled_transcript_has_nothing_to_settle():
    assert dangling(FINISHED_TURN) == (None, [], "")
    assert settle_facts(FINISHED_TURN) == []


def test_a_dangling_turn_gets_interrupted_results_and_one_turn_interrupted():
    events = FINISHED_TURN + [
        ev("turn.started", turn=2, command_id="2"),
        ev("message.user", turn=2, text="run: a\nsleep: 5"),
        ev("message.assistant", turn=2, text="step one"),
        ev("tool.dispatched", turn=2, tool_call_id="c2", name="bash", input={"command": "a"}),
        ev("tool.dispatched", turn=2, tool_call_id="c3", name="bash", input={"command": "sleep 5"}),
        ev("tool.result", turn=2, tool_call_id="c2", name="bash", output="", exit_code=0),
        ev("message.delta", turn=2, text="partial "),
        ev("message.delta", turn=2, text="text"),
    ]
    facts = settle_facts(events)
    assert [t for t, _ in facts] == ["tool.result", "turn.interrupted"]
    result, interrupted = facts[0][1], facts[1][1]
    assert result["tool_call_id"] == "c3" and result["exit_code"] == -1 and result["interrupted"]
    assert interrupted == {"turn": 2, "text": "step one\n\npartial text", "reason": "sandbox_lost"}
    # Once journaled, nothing is left to settle: exactly once.
    settled = events + [{"type": t, "data": d} for t, d in facts]
    assert settle_facts(settled) == []
    # The turn a restored bridge settles itself is left to it.
    assert settle_facts(events, skip_turn=2) == []


def test_the_seed_is_the_conversation_and_passes_the_bridges_check():
    events = FINISHED_TURN + [
        ev("turn.started", turn=2, command_id="2"),
        ev("message.user", turn=2, text="write x: y"),
        ev("tool.dispatched", turn=2, tool_call_id="c4", name="write", input={"path": "x"}),
        ev("steer.delivered", turn=2, text="also this"),
        ev("message.delta", turn=2, text="half an ans"),
    ]
    events += [{"type": t, "data": d} for t, d in settle_facts(events)]
    seed = seed_conversation(events)
    assert seed["turns"] == 2
    msgs = conversation.validate(seed["messages"])
    roles = [(m["role"], m.get("kind")) for m in msgs]
    assert roles == [("user", "prompt"), ("assistant", None), ("tool", None), ("assistant", None),
                     ("user", "prompt"), ("assistant", None), ("tool", None),
                     ("user", "steer"), ("assistant", None)]
    assert msgs[1]["tool_calls"][0]["id"] == "c1"
    assert msgs[5]["text"] == "" and msgs[5]["tool_calls"][0]["id"] == "c4"
    assert msgs[6]["interrupted"] and msgs[8]["interrupted"] and msgs[8]["text"] == "half an ans"
    assert conversation.dangling_calls(msgs) == []


@pytest.mark.parametrize("events", [[], [ev("agent.spawned")]])
def test_an_empty_transcript_seeds_nothing(events):
    assert seed_conversation(events) == {"messages": [], "turns": 0}
