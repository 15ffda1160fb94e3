"""The sandbox session API: POST/GET /api/sandboxes, …/exec|resume|remove,
…/snapshots, …/events (docs/API.md "Sandbox sessions")."""

import pytest

from sessions.models import Agent, Command, SandboxSession, SandboxSessionEvent

from .conftest import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def sandbox(api):
    response = api.post("/api/sandboxes", {"name": "build"}, key="sb-1")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def facts(session_id):
    return [(e.type, e.data) for e in SandboxSessionEvent.objects.filter(session_id=session_id)
            .order_by("seq")]


def test_create_is_a_fact_a_command_and_a_slot(api, owner, sandbox):
    row = SandboxSession.objects.get(pk=sandbox)
    assert (row.status, row.name, row.sandbox_slot, row.created_by) == ("starting", "build", True,
                                                                       owner)
    [(etype, data)] = facts(sandbox)
    assert etype == "session.created" and data["by"] == owner.username
    cmd = Command.objects.get(pk=data["command"])
    assert (cmd.verb, cmd.state, cmd.sandbox_session_id, cmd.agent_id) == (
        "sb_create", "pending", sandbox, None)
    assert row.spec["image"] == "alineo-base" or row.spec["image"]
    assert set(row.spec) == {"image", "packages", "setup", "network", "limits"}


def test_create_again_with_the_key_is_the_first_answer(api, sandbox):
    again = api.post("/api/sandboxes", {"name": "build"}, key="sb-1")
    assert again.status_code == 201 and again.json()["id"] == sandbox
    assert again["Idempotent-Replayed"] == "true"
    assert SandboxSession.objects.count() == 1
    assert_error(api.post("/api/sandboxes", {"name": "other"}, key="sb-1"), 422,
                 "idempotency.key_reused")


@pytest.mark.parametrize("body, code", [
    ({"spec": {"model": "demo"}}, "spec.invalid"),
    ({"spec": {"image": "a b"}}, "spec.invalid"),
    ({"spec": {}, "image": "x"}, "request.invalid"),
    ({"name": "../etc"}, "request.invalid"),
    ({"name": "A"}, "request.invalid"),
    ({"bogus": 1}, "request.unknown_keys"),
    ({"spec": {"limits": {"pids": -1}}}, "spec.invalid"),
])
def test_bad_create_bodies_are_4xx_and_write_nothing(api, body, code):
    assert_error(api.post("/api/sandboxes", body), 400, code)
    assert not SandboxSession.objects.exists() and not Command.objects.exists()


def test_create_beyond_the_sandbox_quota_is_429(api, workspace, owner):
    workspace.max_sandboxes = 2
    workspace.save()
    Agent.objects.create(workspace=workspace, created_by=owner, sandbox_slot=True)
    assert api.post("/api/sandboxes", {}).status_code == 201
    body = assert_error(api.post("/api/sandboxes", {}), 429, "quota.sandboxes")
    assert (body["quota"], body["limit"], body["in_use"]) == ("max_sandboxes", 2, 2)
    assert SandboxSession.objects.count() == 1


def test_a_removed_session_frees_its_slot(api, workspace, sandbox):
    workspace.max_sandboxes = 1
    workspace.save()
    assert_error(api.post("/api/sandboxes", {}), 429, "quota.sandboxes")
    SandboxSession.objects.filter(pk=sandbox).update(status="removed", sandbox_slot=False)
    assert api.post("/api/sandboxes", {}).status_code == 201


def test_exec_is_journaled_and_pending(api, owner, sandbox):
    response = api.post(f"/api/sandboxes/{sandbox}/exec",
                        {"argv": ["sh", "-c", "echo hi"], "cwd": "work", "timeout": 5}, key="e1")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body == {"command": body["command"], "sandbox": sandbox, "verb": "exec", "seq": 2,
                    "state": "pending"}
    etype, data = facts(sandbox)[-1]
    assert etype == "command.exec"
    assert (data["argv"], data["cwd"], data["timeout"]) == (["sh", "-c", "echo hi"], "work", 5)
    seen = api.get(f"/api/commands/{body['command']}").json()
    assert (seen["sandbox"], seen["agent"], seen["verb"], seen["state"]) == (
        sandbox, None, "sb_exec", "pending")


@pytest.mark.parametrize("body, code", [
    ({}, "exec.invalid_argv"),
    ({"argv": []}, "exec.invalid_argv"),
    ({"argv": "ls"}, "exec.invalid_argv"),
    ({"argv": [""]}, "exec.invalid_argv"),
    ({"argv": ["ls", 3]}, "exec.invalid_argv"),
    ({"argv": ["a"] * 257}, "exec.invalid_argv"),
    ({"argv": ["x" * 8193]}, "exec.invalid_argv"),
    ({"argv": ["x" * 8000] * 9}, "exec.invalid_argv"),
    ({"argv": ["ls"], "cwd": ""}, "exec.invalid_cwd"),
    ({"argv": ["ls"], "cwd": "x" * 1025}, "exec.invalid_cwd"),
    ({"argv": ["ls"], "timeout": 0}, "exec.invalid_timeout"),
    ({"argv": ["ls"], "timeout": 3601}, "exec.invalid_timeout"),
    ({"argv": ["ls"], "timeout": 1.5}, "exec.invalid_timeout"),
    ({"argv": ["ls"], "timeout": True}, "exec.invalid_timeout"),
    ({"argv": ["ls"], "env": {}}, "request.unknown_keys"),
])
def test_bad_exec_bodies_are_400_and_write_nothing(api, sandbox, body, code):
    assert_error(api.post(f"/api/sandboxes/{sandbox}/exec", body), 400, code)
    assert len(facts(sandbox)) == 1


def test_nul_in_argv_is_refused(api, sandbox):
    response = api("POST", f"/api/sandboxes/{sandbox}/exec",
                   raw=b'{"argv": ["ls", "a\\u0000b"]}')
    assert response.status_code == 400
    assert len(facts(sandbox)) == 1


def test_checkpoint_names_are_checked_and_unique(api, sandbox):
    for bad in ("../x", "a/b", "", "X", "a" * 64, None, 3):
        assert_error(api.post(f"/api/sandboxes/{sandbox}/snapshots", {"name": bad}), 400,
                     "request.invalid")
    ok = api.post(f"/api/sandboxes/{sandbox}/snapshots", {"name": "deps"})
    assert ok.status_code == 202 and ok.json()["verb"] == "checkpoint"
    SandboxSessionEvent.objects.create(session_id=sandbox, seq=99, type="snapshot.taken",
                                       data={"name": "deps", "ref": "r"}, ts="2026-01-01T00:00Z")
    assert_error(api.post(f"/api/sandboxes/{sandbox}/snapshots", {"name": "deps"}), 409,
                 "snapshot.exists")
    listed = api.get(f"/api/sandboxes/{sandbox}/snapshots").json()["snapshots"]
    assert [s["name"] for s in listed] == ["deps"] and "ref" not in listed[0]


def test_zero_data_retention_takes_no_snapshots(api, workspace, sandbox):
    workspace.zero_data_retention = True
    workspace.save()
    assert_error(api.post(f"/api/sandboxes/{sandbox}/snapshots", {"name": "deps"}), 409,
                 "checkpoint.zero_data_retention")


def test_a_removed_session_takes_no_commands(api, sandbox):
    SandboxSession.objects.filter(pk=sandbox).update(status="removed")
    for verb, body in (("exec", {"argv": ["ls"]}), ("resume", {}), ("remove", {})):
        assert_error(api.post(f"/api/sandboxes/{sandbox}/{verb}", body), 409, "sandbox.removed")


def test_resume_and_remove_take_no_body_keys(api, sandbox):
    for verb in ("resume", "remove"):
        assert_error(api.post(f"/api/sandboxes/{sandbox}/{verb}", {"x": 1}), 400,
                     "request.unknown_keys")
        assert api.post(f"/api/sandboxes/{sandbox}/{verb}", {}).status_code == 202


def test_list_detail_and_events(api, sandbox):
    other = api.post("/api/sandboxes", {}).json()["id"]
    listed = api.get("/api/sandboxes?limit=1").json()
    assert [s["id"] for s in listed["sandboxes"]] == [sandbox] and listed["has_more"]
    rest = api.get(f"/api/sandboxes?after={sandbox}").json()
    assert [s["id"] for s in rest["sandboxes"]] == [other] and not rest["has_more"]
    detail = api.get(f"/api/sandboxes/{sandbox}").json()
    assert detail["status"] == "starting" and detail["snapshots"] == []
    assert detail["replay"] == {"snapshot": None, "execs": 0, "not_replayed": []}
    api.post(f"/api/sandboxes/{sandbox}/exec", {"argv": ["true"]})
    page = api.get(f"/api/sandboxes/{sandbox}/events?after=0&limit=1").json()
    assert [e["type"] for e in page["events"]] == ["session.created"]
    assert (page["head"], page["has_more"], page["next_after"]) == (2, True, 1)
    back = api.get(f"/api/sandboxes/{sandbox}/events?before=3&limit=1").json()
    assert [e["seq"] for e in back["events"]] == [2] and back["next_before"] == 2
    assert_error(api.get(f"/api/sandboxes/{sandbox}/events?after=1&before=2"), 400,
                 "cursor.conflict")
    assert_error(api.get(f"/api/sandboxes/{sandbox}/events?after=x"), 400, "after.invalid")
    assert_error(api.get("/api/sandboxes?after=sb_nope"), 400, "after.invalid")


PATHS = ["/api/sandboxes/{id}", "/api/sandboxes/{id}/events", "/api/sandboxes/{id}/snapshots"]
POSTS = [("exec", {"argv": ["ls"]}), ("resume", {}), ("remove", {})]


@pytest.mark.parametrize("path", PATHS)
def test_reads_need_auth_and_the_workspace(anon, teammate_api, outsider_api, sandbox, path):
    path = path.format(id=sandbox)
    assert_error(anon.get(path), 401, "auth.required")
    assert_error(outsider_api.get(path), 404, "sandbox.not_found")
    assert teammate_api.get(path).status_code == 200


@pytest.mark.parametrize("verb, body", POSTS)
def test_writes_need_auth_and_the_workspace(anon, teammate_api, outsider_api, sandbox, verb,
                                            body):
    path = f"/api/sandboxes/{sandbox}/{verb}"
    assert_error(anon.post(path, body), 401, "auth.required")
    assert_error(outsider_api.post(path, body), 404, "sandbox.not_found")
    assert len(facts(sandbox)) == 1
    assert teammate_api.post(path, body).status_code == 202


def test_outsiders_see_no_sessions_and_commands(outsider_api, api, sandbox):
    assert outsider_api.get("/api/sandboxes").json()["sandboxes"] == []
    cmd = api.post(f"/api/sandboxes/{sandbox}/exec", {"argv": ["ls"]}).json()["command"]
    assert_error(outsider_api.get(f"/api/commands/{cmd}"), 404, "command.not_found")


def test_unknown_ids_and_methods(api, sandbox):
    assert_error(api.get("/api/sandboxes/sb_0000000000000000"), 404, "sandbox.not_found")
    assert_error(api.get("/api/sandboxes/../x"), 404)
    assert_error(api.post(f"/api/sandboxes/{sandbox}/stop", {}), 404, "api.not_found")
    assert_error(api.get(f"/api/sandboxes/{sandbox}/exec"), 405, "method.not_allowed")


def test_a_user_without_workspace_cannot_create(db, django_user_model):
    from sessions.models import ApiToken

    from .conftest import Caller
    lone = django_user_model.objects.create_user("lone", password="x")
    assert_error(Caller(ApiToken.issue(lone)[1]).post("/api/sandboxes", {}), 403,
                 "workspace.none")
