"""GET /api/agents/{id}/events: transcript pages with cursors."""

import pytest

from sessions import journal

from .conftest import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def transcript(spawned):
    """An agent with 25 events (agent.spawned + 24 messages)."""
    journal.append_many(spawned, [("message.user", {"text": str(i)}) for i in range(24)])
    return spawned


def test_first_page(api, transcript):
    body = api.get(f"/api/agents/{transcript}/events?limit=10").json()
    assert [e["seq"] for e in body["events"]] == list(range(1, 11))
    assert body["head"] == 25 and body["has_more"] is True and body["next_after"] == 10
    first = body["events"][0]
    assert set(first) == {"seq", "type", "ts", "data"} and first["type"] == "agent.spawned"
    assert first["ts"].endswith("Z") and len(first["ts"].split(".")[1]) == 7  # microseconds + Z


def test_default_is_from_the_start(api, transcript):
    body = api.get(f"/api/agents/{transcript}/events").json()
    assert len(body["events"]) == 25 and body["has_more"] is False and body["next_after"] == 25


def test_forward_paging_sees_every_event_once(api, transcript):
    seen, cursor = [], 0
    while True:
        body = api.get(f"/api/agents/{transcript}/events?after={cursor}&limit=7").json()
        seen += [e["seq"] for e in body["events"]]
        cursor = body["next_after"]
        if not body["has_more"]:
            break
    assert seen == list(range(1, 26))


def test_backward_paging_from_the_head_to_1_sees_every_event_once(api, transcript):
    head = api.get(f"/api/agents/{transcript}/events?limit=1").json()["head"]
    seen, cursor = [], head + 1
    while True:
        body = api.get(f"/api/agents/{transcript}/events?before={cursor}&limit=6").json()
        seqs = [e["seq"] for e in body["events"]]
        assert seqs == sorted(seqs)  # each page is oldest first
        seen = seqs + seen
        cursor = body["next_before"]
        if not body["has_more"]:
            break
    assert seen == list(range(1, 26))


def test_after_the_head_is_an_empty_page(api, transcript):
    body = api.get(f"/api/agents/{transcript}/events?after=99").json()
    assert (
        body["events"] == []
        and body["head"] == 25
        and body["next_after"] == 99
        and not body["has_more"]
    )


def test_before_1_is_an_empty_page(api, transcript):
    body = api.get(f"/api/agents/{transcript}/events?before=1").json()
    assert body["events"] == [] and body["has_more"] is False and body["next_before"] == 1


def test_largest_limit_is_allowed(api, transcript, settings):
    assert (
        api.get(
            f"/api/agents/{transcript}/events?limit={settings.ALINEO_PAGE_LIMIT_MAX}"
        ).status_code
        == 200
    )


@pytest.mark.parametrize(
    "query, code",
    [
        ("after=1&before=5", "cursor.conflict"),
        ("after=-1", "after.invalid"),
        ("before=-3", "before.invalid"),
        ("after=abc", "after.invalid"),
        ("after=1.5", "after.invalid"),
        ("after=", "after.invalid"),
        ("after=%C2%B2", "after.invalid"),  # "²" is a digit to str.isdigit, not to us
        ("after=99999999999999999999999", "after.invalid"),
        ("limit=0", "limit.invalid"),
        ("limit=1001", "limit.invalid"),
        ("limit=ten", "limit.invalid"),
    ],
)
def test_bad_cursors_are_400(api, transcript, query, code):
    assert_error(api.get(f"/api/agents/{transcript}/events?{query}"), 400, code)


def test_teammate_reads_the_transcript(teammate_api, transcript):
    assert len(teammate_api.get(f"/api/agents/{transcript}/events").json()["events"]) == 25


def test_outsider_and_unknown_get_404(outsider_api, api, transcript):
    assert_error(outsider_api.get(f"/api/agents/{transcript}/events"), 404, "agent.not_found")
    assert_error(api.get("/api/agents/ag_missing/events"), 404, "agent.not_found")


def test_anonymous_gets_401(anon, transcript):
    assert_error(anon.get(f"/api/agents/{transcript}/events"), 401)


def test_post_is_405(api, transcript):
    assert_error(api.post(f"/api/agents/{transcript}/events", {}), 405)
