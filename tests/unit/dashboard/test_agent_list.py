"""The agent list that scales (issue 15, Build 5): GET /agents/ searches by
name or id, filters by status (ended agents archived out of the way), sorts
by last activity, shows the last message's first line, and pages — with 1,000
agents in the database, a page costs a bounded number of queries and paging
reaches every agent exactly once. Workspace-scoped; bad input is a readable page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sessions import journal
from sessions.dashboard.agent_list import PAGE_SIZE
from sessions.models import Agent

pytestmark = pytest.mark.django_db

MANY = 1000


@pytest.fixture
def many(workspace, owner):
    """1,000 agents: every tenth stopped, each with its own last activity."""
    now = timezone.now()
    rows = [Agent(id=f"ag_{i:016x}", workspace=workspace, created_by=owner,
                  spec={"model": "demo", "name": f"worker-{i}"},
                  status="stopped" if i % 10 == 0 else "idle") for i in range(MANY)]
    Agent.objects.bulk_create(rows)
    for i in range(MANY):  # updated_at: the journal's last activity (auto_now bypassed)
        Agent.objects.filter(pk=f"ag_{i:016x}").update(updated_at=now - timedelta(seconds=i))
    return [r.id for r in rows]


def ids_on(html: str) -> list[str]:
    import re
    return re.findall(r'<tr id="list-(ag_[0-9a-f]+)"', html)


def test_a_page_of_1000_agents_costs_bounded_queries_and_paging_reaches_each_once(
        client, owner, many):
    client.force_login(owner)
    seen = []
    pages = -(-900 // PAGE_SIZE)  # the 900 active ones; the stopped are archived
    for n in range(1, pages + 1):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(f"/agents/?page={n}")
        assert response.status_code == 200
        assert len(queries) <= 8, [q["sql"][:120] for q in queries]
        seen += ids_on(response.content.decode())
    assert len(seen) == len(set(seen)) == 900
    active = [a for i, a in enumerate(many) if i % 10]
    assert seen == active  # sorted by last activity, newest first
    html = client.get("/agents/?page=1").content.decode()
    assert "900 active · 100 archived" in html and f"page 1 of {pages}" in html


def test_search_by_name_or_id_and_the_archived(client, owner, many):
    client.force_login(owner)
    assert ids_on(client.get("/agents/?q=worker-123").content.decode()) == [many[123]]
    assert ids_on(client.get(f"/agents/?q={many[7].upper()}").content.decode()) == [many[7]]
    # worker-120 is stopped: archived, out of the default list, there when asked for.
    assert ids_on(client.get("/agents/?q=worker-120").content.decode()) == []
    assert ids_on(client.get("/agents/?q=worker-120&status=archived").content.decode()) == [many[120]]
    archived = ids_on(client.get("/agents/?status=stopped&sort=oldest").content.decode())
    assert archived == many[0:PAGE_SIZE * 10:10]


def test_the_last_messages_first_line(client, owner, workspace):
    agent = Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"})
    journal.append_many(agent.id, [("agent.spawned", {"spec": {"model": "demo"}}),
                                   ("message.user", {"turn": 1, "text": "say: hi"}),
                                   ("message.assistant", {"turn": 1, "text": "\n  Hello there\nsecond"}),
                                   ("turn.finished", {"turn": 1})])
    client.force_login(owner)
    html = client.get("/agents/").content.decode()
    assert ids_on(html) == [agent.id] and "Hello there" in html and "second" not in html


def test_another_workspace_is_never_listed(client, outsider, many):
    client.force_login(outsider)
    html = client.get("/agents/?status=all").content.decode()
    assert ids_on(html) == [] and "0 active · 0 archived" in html


def test_strangers_go_to_the_login(client):
    response = client.get("/agents/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.parametrize("query", ["status=nope", "sort=%00", "page=-3", "page=abc", "page=99999",
                                   "q=" + "x" * 500, "q=%00%00", "status=all&sort=oldest"])
def test_bad_input_is_a_readable_page(client, owner, many, query):
    client.force_login(owner)
    response = client.get(f"/agents/?{query}")
    assert response.status_code == 200
    assert "All agents" in response.content.decode()
