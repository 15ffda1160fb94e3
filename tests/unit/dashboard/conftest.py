"""Dashboard view tests: the shared actors (owner, teammate, outsider) come from
tests/conftest.py; these add agents with transcripts."""

from __future__ import annotations

import pytest

from sessions import journal
from sessions.models import Agent


@pytest.fixture
def make_agent(workspace, owner):
    def make(facts=(), parent=None, status=None, ws=None):
        agent = Agent.objects.create(workspace=ws or workspace, created_by=owner, parent=parent,
                                     spec={"model": "demo"})
        facts = list(facts) or [("agent.spawned", {"spec": {"model": "demo"}, "parent": None})]
        journal.append_many(agent.id, facts)
        if status:
            Agent.objects.filter(pk=agent.pk).update(status=status)
        agent.refresh_from_db()
        return agent

    return make


@pytest.fixture
def logged_in(client, owner):
    client.force_login(owner)
    return client
