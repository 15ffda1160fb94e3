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


# --- the committer thread ------------------------------------------------------


def test_appends_outside_atomic_are_committed_by_one_daemon_thread(agent):
    seen = []
    original = journal._commit_groups

    def spy(groups, before_commit):
        seen.append(threading.current_thread())
        return original(groups, before_commit)

    journal._commit_groups = spy
    try:
        rec = journal.append(agent.id, "message.user", {"text": "hi"})
    finally:
        journal._commit_groups = original
    assert rec.seq == 1
    assert len(seen) == 1 and seen[0] is not threading.current_thread() and seen[0].daemon
    # durable and visible to the caller's own connection once append returned
    assert Event.objects.get(agent=agent).seq == 1


def test_appends_inside_atomic_join_the_callers_transaction(agent):
    with transaction.atomic():
        journal.append(agent.id, "message.user", {"text": "a"})
        assert Event.objects.filter(agent=agent).count() == 1  # visible in this transaction only
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                journal.append(agent.id, "message.user", {"text": "b"})
                raise RuntimeError
    assert list(Event.objects.filter(agent=agent).values_list("seq", flat=True)) == [1]
    assert Agent.objects.get(pk=agent.pk).last_seq == 1


def test_one_bad_request_does_not_fail_its_batch(agent, workspace):
    other = Agent.objects.create(workspace=workspace, spec={"model": "demo"})
    gate, entered = threading.Event(), threading.Event()
    original = journal._commit_groups
    batches = []

    def held(groups, before_commit):  # hold the first commit until the others queued
        batches.append([a for a, _ in groups])
        if len(batches) == 1:
            entered.set()
            gate.wait(10)
        return original(groups, before_commit)

    journal._commit_groups = held
    results, errors = {}, {}

    def call(name, agent_id, data):
        try:
            results[name] = journal.append(agent_id, "t.w", data)
        except Exception as exc:
            errors[name] = exc
        finally:
            connection.close()

    try:
        first = threading.Thread(target=call, args=("first", agent.id, {"i": 0}))
        first.start()
        assert entered.wait(10)
        threads = [
            threading.Thread(target=call, args=("good", agent.id, {"i": 1})),
            threading.Thread(target=call, args=("missing", "ag_missing", {})),
            threading.Thread(target=call, args=("other", other.id, {"i": 2})),
        ]
        for t in threads:
            t.start()
        while len(journal.committer._queue) < 3:
            threading.Event().wait(0.005)
        gate.set()
        for t in [first, *threads]:
            t.join(10)
    finally:
        journal._commit_groups = original
    assert set(results) == {"first", "good", "other"}
    assert isinstance(errors.pop("missing"), journal.UnknownAgent) and not errors
    assert batches[1] == [agent.id, "ag_missing", other.id]  # the three were one batch, then retried alone
    assert [results["first"].seq, results["good"].seq, results["other"].seq] == [1, 2, 1]
    assert list(Event.objects.filter(agent=agent).values_list("seq", flat=True)) == [1, 2]


def test_committer_survives_a_read_only_database(agent):
    journal.append(agent.id, "agent.spawned", {"parent": None})
    original = journal._commit_groups

    def read_only(groups, before_commit):  # on the committer's own connection
        with connection.cursor() as cur:
            cur.execute("PRAGMA query_only = ON")
        return original(groups, before_commit)

    journal._commit_groups = read_only
    try:
        with pytest.raises(journal.JournalUnavailable):
            journal.append(agent.id, "message.user", {"text": "lost"})
    finally:
        journal._commit_groups = original
    assert "cannot be written" in journal.unrecoverable_reason(agent.id)
    # The committer dropped that connection: the next append writes again and clears the mark.
    assert journal.append(agent.id, "message.user", {"text": "kept"}).seq == 2
    assert journal.unrecoverable_reason(agent.id) is None
    assert list(Event.objects.filter(agent=agent).values_list("seq", flat=True)) == [1, 2]


def test_committer_survives_an_unexpected_error(agent):
    original = journal._commit_groups

    def broken(groups, before_commit):
        raise RuntimeError("bug")

    journal._commit_groups = broken
    try:
        with pytest.raises(journal.JournalError):
            journal.append(agent.id, "message.user", {"text": "x"})
    finally:
        journal._commit_groups = original
    assert journal.append(agent.id, "message.user", {"text": "y"}).seq == 1
    journal._unwritable_marks.clear()


def test_a_watched_connection_sees_the_append(agent):
    statements = []

    def watch(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watch):
        rec = journal.append(agent.id, "message.user", {"text": "hi"})
    assert rec.seq == 1
    assert any("INSERT INTO agent_sessions_event" in sql for sql in statements)
    assert Event.objects.get(agent=agent).seq == 1


def test_a_paused_agent_stays_paused_while_its_turn_settles(agent):
    from sessions import state

    journal.append(agent.id, "turn.started", {"turn": 1})
    journal.append(agent.id, "agent.status", {"status": "paused", "reason": "operator"})
    journal.append(agent.id, "turn.finished", {"turn": 1})
    journal.append_many(agent.id, [("turn.started", {"turn": 2}), ("turn.interrupted", {"turn": 2})])
    assert Agent.objects.get(pk=agent.pk).status == "paused"
    assert journal.replay(agent.id)["status"] == "paused"  # the reducer agrees with the row
    journal.append_many(agent.id, [("agent.status", {"status": "idle"}), ("turn.started", {"turn": 3})])
    assert Agent.objects.get(pk=agent.pk).status == "running"
    replayed = state.replay([e.as_dict() for e in journal.page_after(agent.id, 0, 100).events])
    assert replayed["status"] == "running"
