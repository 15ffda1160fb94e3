"""Bug 7 of the operator's console (issue 15): the tree keeps the most severe
restore of the last day (a rebuild does not turn into "reattach" after the next
restart; routine reattaches are quiet), its time is the last activity, not the
creation time, and the running turn counts its tool calls, not only its steps."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from sessions import journal
from sessions.models import Agent

pytestmark = pytest.mark.django_db

SPAWNED = ("agent.spawned", {"spec": {"model": "demo"}})


def node(html: str, agent_id: str) -> str:
    start = html.index(f'id="node-{agent_id}"')
    return html[start:html.index('class="actions', start)]


def test_a_rebuild_stays_visible_after_a_later_reattach(logged_in, make_agent):
    agent = make_agent(facts=[
        SPAWNED,
        ("agent.restored", {"rung": "rebuild", "reason": "no_checkpoint"}),
        ("agent.restored", {"rung": "reattach", "reason": "control_plane_restart"}),
    ])
    shown = node(logged_in.get("/").content.decode(), agent.id)
    assert "rebuilt from the conversation only — files lost" in shown
    assert "reattach" not in shown


REATTACH = ("agent.restored", {"rung": "reattach", "reason": "control_plane_restart"})


def test_routine_reattaches_are_quiet(logged_in, make_agent):
    agent = make_agent(facts=[SPAWNED, REATTACH, REATTACH])
    shown = node(logged_in.get("/").content.decode(), agent.id)
    # What a shown reattach would read (restores.outcome): none of it is on the tree.
    assert "reattached" not in shown and "nothing lost" not in shown
    assert 'class="rung' not in shown


def test_a_restore_older_than_a_day_gives_way(logged_in, make_agent, monkeypatch):
    from sessions.dashboard import restores

    agent = make_agent(facts=[SPAWNED, ("agent.restored", {"rung": "rebuild", "reason": "x"}),
                              ("agent.restored", {"rung": "resume", "reason": "bridge_exited"})])
    later = timezone.now() + timedelta(days=2)  # both facts are two days old then
    monkeypatch.setattr(restores, "clock", lambda: later)
    shown = node(logged_in.get("/").content.decode(), agent.id)
    assert "rebuilt" not in shown and "resumed its session" in shown


def test_the_time_shown_is_the_last_activity(logged_in, make_agent):
    agent = make_agent()
    Agent.objects.filter(pk=agent.pk).update(created_at=timezone.now() - timedelta(days=3))
    journal.append_many(agent.id, [("operator.note", {"text": "now"})])
    shown = node(logged_in.get("/").content.decode(), agent.id)
    assert "last activity" in shown and "3 d ago" not in shown


def test_a_running_turn_counts_its_tool_calls(logged_in, make_agent):
    calls = [("tool.dispatched", {"turn": 1, "tool_call_id": f"c{i}", "name": "bash",
                                  "input": {"command": "true"}}) for i in range(12)]
    agent = make_agent(facts=[SPAWNED, ("turn.started", {"turn": 1}), *calls])
    assert "12 tool calls" in node(logged_in.get("/").content.decode(), agent.id)
    assert "12 tool calls" in logged_in.get(f"/agents/{agent.id}/").content.decode()


def test_the_agent_page_says_what_each_restore_lost(logged_in, make_agent):
    agent = make_agent(facts=[SPAWNED, ("agent.restored", {"rung": "restore", "checkpoint_turn": 3,
                                                           "reason": "sandbox_missing"}),
                              ("agent.restored", {"rung": "reattach", "reason": "x"})])
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    side = html[html.index('id="side"'):]
    assert "Restored from the checkpoint of turn 3 — later file changes lost" in side
    assert "Reattached — nothing lost" in side


def head(html: str) -> str:
    start = html.index('class="head-facts"')
    return html[start:html.index("</div>", start)]


def test_the_agent_header_follows_the_tree_rule(logged_in, make_agent):
    # Audit item 9: the header showed only the latest restore and hid it when
    # that was a reattach, so after rebuild-then-reattach it said nothing.
    rebuilt = make_agent(facts=[SPAWNED, ("agent.restored", {"rung": "rebuild", "reason": "x"}),
                                REATTACH])
    shown = head(logged_in.get(f"/agents/{rebuilt.id}/").content.decode())
    assert "rebuilt from the conversation only — files lost" in shown
    assert "reattached" not in shown
    quiet = make_agent(facts=[SPAWNED, REATTACH])
    shown = head(logged_in.get(f"/agents/{quiet.id}/").content.decode())
    assert 'id="head-restore"' not in shown and "reattached" not in shown
