"""journal.replay: snapshots every N events, old formats, unrecoverable agents."""

import importlib

import pytest
from django.db import connection

from sessions import journal, state
from sessions.models import Snapshot

pytestmark = pytest.mark.django_db(transaction=True)


def _fill(agent, n):
    facts = []
    for i in range(n):
        facts.append(("turn.started", {}) if i % 3 == 0 else ("message.user", {"text": f"m{i}"}))
    journal.append_many(agent.id, facts)


def test_replay_writes_snapshots_and_resumes_from_them(agent, settings):
    settings.ALINEO_SNAPSHOT_EVERY = 10
    _fill(agent, 35)
    first = journal.replay(agent.id)
    snap = Snapshot.objects.get(agent=agent)
    assert snap.through_seq == 35 and snap.version == state.SNAPSHOT_VERSION
    _fill(agent, 4)
    resumed = journal.replay(agent.id)
    scratch = state.replay(
        [e.as_dict() for e in journal.page_after(agent.id, 0, 1000).events]
    )
    assert resumed == scratch and resumed["last_seq"] == 39 and first["last_seq"] == 35


def test_replay_reads_a_snapshot_written_in_the_old_format(agent, settings):
    settings.ALINEO_SNAPSHOT_EVERY = 1000
    journal.append_many(agent.id, [("turn.started", {}), ("tool.dispatched", {"tool_call_id": "c9", "name": "bash"})])
    # Release 1 wrote this row; this release must still read it.
    Snapshot.objects.create(
        agent=agent, through_seq=2, version=1,
        state={"last_seq": 2, "status": "active", "turns": 1, "current_turn": None, "messages": 0,
               "recent_messages": [], "open_tools": {"c9": {"name": "bash", "seq": 2}},
               "parent": None, "children": []},
    )
    journal.append(agent.id, "tool.result", {"tool_call_id": "c9"})
    s = journal.replay(agent.id)
    assert s["last_seq"] == 3 and s["open_tool_calls"] == {} and s["status"] == "running"


def test_replay_skips_a_snapshot_from_a_newer_release(agent, settings):
    settings.ALINEO_SNAPSHOT_EVERY = 1000
    _fill(agent, 6)
    Snapshot.objects.create(agent=agent, through_seq=6, version=99, state={"garbage": True})
    assert journal.replay(agent.id) == state.replay([e.as_dict() for e in journal.page_after(agent.id, 0, 100).events])


def test_an_unreplayable_transcript_marks_the_agent_unrecoverable(agent):
    journal.append(agent.id, "message.user", {"text": "fine"})
    # Simulate corruption the reducer cannot fold (a seq gap), below the triggers.
    migration = importlib.import_module("sessions.migrations.0002_event_append_only")
    if connection.vendor == "postgresql":
        drop = "DROP TRIGGER agent_sessions_event_append_only ON agent_sessions_event"
        restore = migration.PG_UP[1]
    else:
        drop, restore = "DROP TRIGGER agent_sessions_event_no_update", migration.SQLITE_UP[0]
    with connection.cursor() as cur:
        cur.execute(drop)
        cur.execute("UPDATE agent_sessions_event SET seq = 5 WHERE agent_id = %s", [agent.id])
    try:
        with pytest.raises(journal.Unrecoverable, match="gap"):
            journal.replay(agent.id)
        agent.refresh_from_db()
        assert agent.status == "unrecoverable" and "gap" in agent.status_reason
    finally:
        with connection.cursor() as cur:
            cur.execute(restore)
