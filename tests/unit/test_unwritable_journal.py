"""When the transcript cannot be written the agent says so, nothing is half
written, and it comes back by itself once the database takes writes again."""

import json

import pytest

from sessions import journal
from sessions.models import Command, Event
from tests.engines import refuse_writes

pytestmark = pytest.mark.django_db(transaction=True)


def _prompt(client, token, agent_id, key):
    return client.post(
        f"/api/agents/{agent_id}/prompt",
        data=json.dumps({"text": "hello"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        HTTP_IDEMPOTENCY_KEY=key,
    )


def _get(client, token, agent_id):
    return client.get(f"/api/agents/{agent_id}", HTTP_AUTHORIZATION=f"Bearer {token}").json()


# On PostgreSQL a read-only database fails the command's first locking read
# (SELECT … FOR UPDATE) with InternalError (SQLSTATE 25006): a 503 too.
def test_unwritable_log_marks_the_agent_and_recovers(client, owner_token, agent):
    journal.append(agent.id, "agent.spawned", {"parent": None})
    # Every write now fails: SQLite "readonly database", PostgreSQL "read-only transaction".
    with refuse_writes():
        response = _prompt(client, owner_token, agent.id, "k1")
        assert response.status_code == 503
        assert response.json()["code"] == "server.unavailable"
        shown = _get(client, owner_token, agent.id)
        assert shown["status"] == "unrecoverable"
        assert "cannot be written" in shown["status_reason"]
    assert Event.objects.filter(agent=agent).count() == 1  # nothing half-written
    assert Command.objects.count() == 0

    response = _prompt(client, owner_token, agent.id, "k1")  # the same key, retried
    assert response.status_code == 202
    shown = _get(client, owner_token, agent.id)
    assert shown["status"] != "unrecoverable"
    assert [e.type for e in journal.page_after(agent.id, 0, 10).events] == ["agent.spawned", "command.prompt"]
    journal._unwritable_marks.clear()
