"""GET /api/agents and GET /api/agents/{id}."""

import pytest

from sessions import journal
from sessions.models import Agent

from .conftest import assert_error

pytestmark = pytest.mark.django_db


def test_list_shows_the_tree_of_my_workspace_only(api, outsider_api, spawned):
    child = api.post("/api/agents", {"parent": spawned}).json()["id"]
    foreign = outsider_api.post("/api/agents", {}).json()["id"]
    body = api.get("/api/agents").json()
    by_id = {a["id"]: a for a in body["agents"]}
    assert set(by_id) == {spawned, child}
    assert by_id[spawned]["children"] == [child] and by_id[child]["parent"] == spawned
    assert by_id[child]["status"] == "starting" and by_id[child]["last_seq"] == 1
    assert body["has_more"] is False
    assert foreign not in by_id


def test_teammate_sees_the_same_list(api, teammate_api, spawned):
    assert [a["id"] for a in teammate_api.get("/api/agents").json()["agents"]] == [spawned]


def test_list_pages_with_a_cursor(api):
    ids = [api.post("/api/agents", {}).json()["id"] for _ in range(5)]
    first = api.get("/api/agents?limit=2").json()
    assert [a["id"] for a in first["agents"]] == ids[:2] and first["has_more"]
    seen = [a["id"] for a in first["agents"]]
    cursor = first["next_after"]
    while True:
        page = api.get(f"/api/agents?limit=2&after={cursor}").json()
        seen += [a["id"] for a in page["agents"]]
        cursor = page["next_after"]
        if not page["has_more"]:
            break
    assert seen == ids


@pytest.mark.parametrize(
    "query", ["limit=0", "limit=-1", "limit=x", "limit=1001", "after=ag_nope", "after="]
)
def test_bad_list_params_are_400(api, spawned, query):
    assert_error(api.get(f"/api/agents?{query}"), 400)


def test_an_outsiders_agent_is_no_cursor(outsider_api, spawned):
    assert_error(outsider_api.get(f"/api/agents?after={spawned}"), 400, "after.invalid")


def test_anonymous_list_is_401(anon):
    assert_error(anon.get("/api/agents"), 401, "auth.required")


def test_detail(api, owner, spawned):
    child = api.post("/api/agents", {"parent": spawned}).json()["id"]
    body = api.get(f"/api/agents/{spawned}").json()
    assert body["id"] == spawned and body["status"] == "starting" and body["status_reason"] == ""
    assert body["sandbox_id"] is None and body["parent"] is None and body["children"] == [child]
    assert body["spec"]["model"] == "demo" and body["last_seq"] == 2
    assert body["current_turn"] is None and body["turns"] == 0
    assert body["created_at"].endswith("Z") and "T" in body["created_at"]


def test_detail_shows_the_current_turn_and_sandbox(api, spawned):
    journal.append_many(spawned, [("agent.sandbox", {"sandbox_id": "sb-1"}), ("turn.started", {})])
    body = api.get(f"/api/agents/{spawned}").json()
    assert body["status"] == "running" and body["sandbox_id"] == "sb-1"
    assert body["current_turn"]["turn"] == 1 and body["current_turn"]["started_seq"] == 3


def test_detail_of_an_unrecoverable_agent_says_so(api, spawned):
    journal.mark_unrecoverable(spawned, "transcript gap")
    body = api.get(f"/api/agents/{spawned}").json()
    assert body["status"] == "unrecoverable" and "gap" in body["status_reason"]


def test_teammate_sees_the_detail(teammate_api, spawned):
    assert teammate_api.get(f"/api/agents/{spawned}").json()["id"] == spawned


def test_outsider_gets_404(outsider_api, spawned):
    assert_error(outsider_api.get(f"/api/agents/{spawned}"), 404, "agent.not_found")


@pytest.mark.parametrize("agent_id", ["ag_unknown", "x" * 40, "ag%00x", "%C3%A9", "..", "ag_'--"])
def test_unknown_agent_is_404(api, agent_id):
    assert_error(api.get(f"/api/agents/{agent_id}"), 404)


def test_anonymous_detail_is_401(anon, spawned):
    assert_error(anon.get(f"/api/agents/{spawned}"), 401)


def test_detail_refuses_post(api, spawned):
    assert_error(api.post(f"/api/agents/{spawned}", {}), 405)
    assert Agent.objects.get(pk=spawned).last_seq == 1


def test_trailing_slash_is_accepted(api, spawned):
    assert api.get(f"/api/agents/{spawned}/").status_code == 200
    assert api.get("/api/agents/").status_code == 200


def test_other_api_paths_are_json_404(api, anon):
    for path in [
        "/api/",
        "/api/%0A",
        "/api/x%0Ay/",
        "/api/nope",
        "/api/agents/x/y/z",
        "/api/agents/ag_1/unknownverb",
    ]:
        assert_error(api.get(path), 404, "api.not_found")
        assert_error(anon.post(path, {}), 404, "api.not_found")
