"""Bug 2 of the operator's console (issue 15) and the transcript by turns: a
streamed reply is one message (its deltas folded into the first one, the final
text shown once), also in live fragments and pages that begin mid-step; tool
results name their call; control-plane facts are system rows."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db

REPLY = " ".join(f"word{i:04d}" for i in range(280))  # ~2,500 characters
CHUNKS = [REPLY[i:i + 200] for i in range(0, len(REPLY), 200)]


def streamed_turn():
    return [("agent.spawned", {"spec": {"model": "demo"}}),
            ("turn.started", {"turn": 1}),
            ("message.user", {"turn": 1, "text": "say: a long reply"}),
            *[("message.delta", {"turn": 1, "text": c}) for c in CHUNKS],
            ("message.assistant", {"turn": 1, "text": REPLY}),
            ("turn.finished", {"turn": 1, "text": REPLY})]


def visible_texts(html: str) -> list[str]:
    """The text of every non-folded row (what CSS shows: rows not .merged, no hidden chunks)."""
    out = []
    for row in re.findall(r'<li id="row-\d+".*?</li>', html, re.S):
        if " merged" in row.split(">", 1)[0]:
            continue
        row = re.sub(r'<span class="chunk" hidden>.*?</span>', "", row, flags=re.S)
        out.append(row)
    return out


def test_a_streamed_reply_is_shown_once_as_one_message(logged_in, make_agent):
    agent = make_agent(facts=streamed_turn())
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    shown = visible_texts(html)
    assert sum(REPLY in row for row in shown) == 1, "the reply must show exactly once"
    assert not any(">…<" in row for row in shown), "no delta rows in pieces"
    head = next(row for row in shown if REPLY in row)
    assert 'data-type="message.delta"' in head and "run-head" in head
    # Every fact keeps its row, keyed by seq (paging and reconnects rely on it).
    assert len(re.findall(r'<li id="row-\d+"', html)) == 3 + len(CHUNKS) + 2


def test_a_live_fragment_continues_the_run_on_screen(logged_in, make_agent):
    facts = streamed_turn()
    agent = make_agent(facts=facts[:5])  # spawned, turn, user, two deltas
    first_delta = 4
    html = logged_in.get(f"/agents/{agent.id}/rows?after=4").content.decode()
    assert f'data-run="{first_delta}"' in html and " merged" in html
    from sessions import journal

    journal.append_many(agent.id, facts[5:])
    more = logged_in.get(f"/agents/{agent.id}/rows?after=5").content.decode()
    runs = set(re.findall(r'data-run="(\d+)"', more))
    assert runs == {str(first_delta)}, "later deltas and the final text name the same run"
    assert 'data-final="1"' in more


def test_a_page_that_begins_mid_step_names_the_run_by_its_first_delta(logged_in, make_agent):
    facts = streamed_turn()
    agent = make_agent(facts=facts)
    before = 4 + 8  # an older-page fragment that ends in the middle of the step
    html = logged_in.get(f"/agents/{agent.id}/rows?before={before}").content.decode()
    assert set(re.findall(r'data-run="(\d+)"', html)) == {"4"}


def test_tool_results_name_their_call_and_system_facts_are_marked(logged_in, make_agent):
    agent = make_agent(facts=[
        ("agent.spawned", {"spec": {"model": "demo"}}),
        ("command.prompt", {"text": "run: ls"}),
        ("turn.started", {"turn": 1}),
        ("tool.dispatched", {"turn": 1, "tool_call_id": "c1", "name": "bash",
                             "input": {"command": "ls -la"}}),
        ("bridge.paused", {}),
        ("tool.result", {"turn": 1, "tool_call_id": "c1", "output": "a\nb", "exit_code": 0}),
        ("agent.checkpointed", {"turn": 1, "bytes": 10}),
        ("turn.finished", {"turn": 1, "text": ""}),
    ])
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    assert "$ ls -la" in html and 'data-call="c1"' in html and 'data-result-of="c1"' in html
    for seq in (2, 5, 7):
        row = re.search(rf'<li id="row-{seq}"[^>]*>', html).group(0)
        assert " sys" in row, row
    for seq in (1, 3, 4, 6, 8):
        assert " sys" not in re.search(rf'<li id="row-{seq}"[^>]*>', html).group(0)
    assert 'id="show-system"' in html
