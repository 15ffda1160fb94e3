import threading

import pytest
from django.db import DatabaseError, connection, transaction

from sessions import journal
from sessions.models import Agent, Event


pytestmark = pytest.mark.django_db(transaction=True)


def test_append_numbers_from_one_without_gaps(agent):
    recs = [journal.append(agent.id, "message.user", {"text": str(i)}) for i in range(5)]
    assert [r.seq for r in recs] == [1, 2, 3, 4, 5]
    assert list(Event.objects.filter(agent=agent).values_list("seq", flat=True)) == [1, 2, 3, 4, 5]
    assert Agent.objects.get(pk=agent.pk).last_seq == 5


def test_append_many_is_contiguous(agent):
    journal.append(agent.id, "a.b")
    recs = journal.append_many(agent.id, [("x.y", {"i": i}) for i in range(10)])
    assert [r.seq for r in recs] == list(range(2, 12))


def test_concurrent_writers_keep_seq_gapless_and_in_commit_order(agent):
    errors = []

    def writer(n):
        try:
            for i in range(25):
                journal.append(agent.id, "t.w", {"w": n, "i": i})
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rows = list(Event.objects.filter(agent=agent).order_by("id").values_list("seq", "data"))
    # Insertion (commit) order equals seq order, and seq is 1..N.
    assert [s for s, _ in rows] == list(range(1, 151))
    for n in range(6):  # each writer's own facts keep their order
        mine = [d["i"] for _, d in rows if d["w"] == n]
        assert mine == list(range(25))


def test_unknown_agent_is_refused_and_writes_nothing(agent):
    with pytest.raises(journal.UnknownAgent):
        journal.append("ag_missing", "x.y")
    assert Event.objects.count() == 0


def test_bad_fact_is_refused(agent):
    with pytest.raises(journal.InvalidFact):
        journal.append(agent.id, "x.y", {"v": object()})
    with pytest.raises(journal.InvalidFact):
        journal.append(agent.id, "", {})
    assert Agent.objects.get(pk=agent.pk).last_seq == 0


def test_database_refuses_update_and_delete_of_events(agent):
    journal.append(agent.id, "message.user", {"text": "hi"})
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic():
            Event.objects.filter(agent=agent).update(type="forged")
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic():
            Event.objects.filter(agent=agent).delete()
    with pytest.raises(DatabaseError, match="append-only"):
        with connection.cursor() as cur:
            cur.execute("UPDATE agent_sessions_event SET data = '{}'")
    assert Event.objects.get(agent=agent).type == "message.user"


def test_pages_forward_and_backward(agent):
    journal.append_many(agent.id, [("x.y", {"i": i}) for i in range(1, 26)])
    page = journal.page_after(agent.id, 0, 10)
    assert [e.seq for e in page.events] == list(range(1, 11)) and page.has_more
    page = journal.page_after(agent.id, 20, 10)
    assert [e.seq for e in page.events] == list(range(21, 26)) and not page.has_more
    seen, before = [], 26
    while True:
        page = journal.page_before(agent.id, before, 7)
        seen = [e.seq for e in page.events] + seen
        if not page.has_more:
            break
        before = page.first_seq
    assert seen == list(range(1, 26))


def test_status_projection_follows_facts(agent):
    journal.append(agent.id, "agent.spawned", {"parent": None})
    journal.append(agent.id, "turn.started", {})
    assert Agent.objects.get(pk=agent.pk).status == "running"
    journal.append(agent.id, "turn.finished", {})
    assert Agent.objects.get(pk=agent.pk).status == "idle"
