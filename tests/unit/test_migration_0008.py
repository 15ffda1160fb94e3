"""Migration 0008 (quotas, sandbox slots, the approve permission) on a
database that already has agents and transcripts — on SQLite (the columns
added in place: a table remake would trip the transcript's triggers, see
migration 0007) and on PostgreSQL (make test's second pass)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("agent_sessions", "0007_scale_out_and_client")]
AFTER = [("agent_sessions", "0008_quotas_and_approvals")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def _latest():
    """Back to the newest schema (whatever migrations came after 0008)."""
    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_0008_keeps_every_transcript_row_and_gives_running_sandboxes_a_slot():
    apps = _migrate(BEFORE)
    try:
        Workspace, Agent = apps.get_model("agent_sessions", "Workspace"), apps.get_model(
            "agent_sessions", "Agent")
        Event = apps.get_model("agent_sessions", "Event")
        ws = Workspace.objects.create(name="before-0008")
        rows = {
            "running": ("idle", "", "sb-1"),
            "unloaded": ("idle", "unloaded", "sb-2"),
            "stopped": ("stopped", "sandbox removed", "sb-3"),
            "new": ("starting", "", ""),
        }
        ids = {}
        for name, (status, reason, sandbox) in rows.items():
            agent = Agent.objects.create(workspace=ws, spec={"model": "demo"}, status=status,
                                         status_reason=reason, sandbox_id=sandbox, last_seq=2)
            for seq in (1, 2):
                Event.objects.create(agent=agent, seq=seq, type="operator.note",
                                     data={"text": f"{name} {seq}"}, ts=timezone.now())
            ids[name] = agent.pk
        events = sorted(Event.objects.values_list("agent_id", "seq", "type", "data"))

        apps = _migrate(AFTER)
        Agent, Event = apps.get_model("agent_sessions", "Agent"), apps.get_model(
            "agent_sessions", "Event")
        Workspace = apps.get_model("agent_sessions", "Workspace")
        slotted = set(Agent.objects.filter(sandbox_slot=True).values_list("pk", flat=True))
        assert slotted == {ids["running"]}
        ws = Workspace.objects.get(name="before-0008")
        assert (ws.max_agents, ws.max_depth, ws.max_sandboxes, ws.max_memory_mb, ws.max_pids,
                ws.max_cpus, ws.max_streams_per_user) == (32, 4, 8, 4096, 1024, 2.0, 16)
        assert sorted(Event.objects.values_list("agent_id", "seq", "type", "data")) == events
    finally:
        _latest()  # the rest of the suite runs on the latest schema


@pytest.mark.django_db(transaction=True)
def test_0008_unapplies_and_applies_again():
    _migrate(BEFORE)
    try:
        with connection.cursor() as cur:
            columns = [c.name for c in connection.introspection.get_table_description(
                cur, "agent_sessions_workspace")]
        assert "max_agents" not in columns
    finally:
        _latest()
    with connection.cursor() as cur:
        columns = [c.name for c in connection.introspection.get_table_description(
            cur, "agent_sessions_workspace")]
        agent_columns = [c.name for c in connection.introspection.get_table_description(
            cur, "agent_sessions_agent")]
    assert {"max_agents", "max_sandboxes", "max_streams_per_user"} <= set(columns)
    assert "sandbox_slot" in agent_columns
