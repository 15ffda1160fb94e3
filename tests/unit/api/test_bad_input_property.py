"""Property: nothing a client sends produces a 5xx or a partial write.

Hypothesis throws generated requests at every API endpoint — random methods,
paths, JSON and garbage bodies, query strings, content types, credentials and
Idempotency-Keys — and checks that every answer is below 500, every 4xx is JSON {"code", "message"},
and a refused request changed nothing. Each example runs in a transaction that
is rolled back, so examples do not depend on one another.
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote, urlencode

import pytest
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sessions.models import Agent, ApiToken, Command, Event, SandboxSession, SandboxSessionEvent
from sessions.specs import DEFAULTS

pytestmark = pytest.mark.django_db

VERBS = ["prompt", "steer", "interrupt", "pause", "resume", "stop"]
TAILS = ["", "/", "/events", "/checkpoints", "/fork", "/stream", "/events/", "/home-snapshot"] + [
    f"/{v}" for v in VERBS
]
SB_TAILS = ["", "/", "/exec", "/resume", "/remove", "/snapshots", "/events", "/stop"]
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
CONTENT_TYPES = [
    "application/json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
    "multipart/form-data",
    "",
]
NASTY_BODIES = [
    b'{"text": NaN}',
    b'{"text": "\\ud800"}',
    b'{"text": "a\\u0000b"}',
    b"[" * 3000,
    b'{"spec": {"limits": {"cpus": 1e999}}}',
    b'{"prompt": "' + b"x" * 2000 + b'"}',
    b"\xef\xbb\xbf{}",
    b"null",
    b"0",
    b'"text"',
    b"a=1&b=2",
    b"--xyz\r\n\r\n--xyz--",
]

latin1 = st.text(st.characters(max_codepoint=255), max_size=40)
leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_value = st.recursive(
    leaf,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=10,
)
spec_like = st.dictionaries(st.sampled_from([*DEFAULTS, "gpu"]), json_value, max_size=4)
word = st.sampled_from(["say: hi", "run: ls", "", " ", "x" * 50])


@st.composite
def requests(draw, ids, aimed=False):
    junk = quote(draw(st.text(max_size=12)), safe="")
    agent_id = draw(st.sampled_from(ids[:2] if aimed else [*ids * 3, "ag_missing", junk or "x"]))
    sb_id = draw(st.sampled_from(ids[3:4] if aimed else [*ids[3:] * 3, "sb_0000000000000000",
                                                        junk or "x"]))
    path = draw(
        st.one_of(
            st.sampled_from(
                ["/api/agents"]
                if aimed
                else ["/api/agents", "/api/agents/", "/api/", f"/api/{junk}"]
            ),
            st.sampled_from(TAILS + [f"/{junk}"]).map(lambda tail: f"/api/agents/{agent_id}{tail}"),
            st.sampled_from(VERBS).map(lambda verb: f"/api/agents/{agent_id}/{verb}"),
            st.sampled_from(["/api/sandboxes", "/api/sandboxes/"]),
            st.sampled_from(SB_TAILS).map(lambda tail: f"/api/sandboxes/{sb_id}{tail}"),
        )
    )
    # Mostly the method the endpoint takes, so examples get past routing to the checks.
    usual = (
        "POST"
        if re.search(r"/(agents/?|sandboxes/?|prompt|steer|interrupt|pause|resume|stop|fork"
                     r"|exec|remove|snapshots)$", path)
        else "GET"
    )
    method = usual if aimed else draw(st.sampled_from([usual] * 10 + METHODS))
    params = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["after", "before", "limit", "x", junk or "y"]),
                st.one_of(st.integers(-5, 2000).map(str), latin1),
            ),
            max_size=3,
        )
    )
    if params:
        path += "?" + urlencode(params)
    plausible = st.fixed_dictionaries(
        {},
        optional={
            "text": st.one_of(word, json_value),
            "prompt": st.one_of(word, json_value),
            "spec": st.one_of(spec_like, json_value),
            "parent": st.sampled_from([*ids, "ag_missing", 3, None]),
            "reason": st.one_of(word, json_value),
            "at_event": json_value,
            "argv": st.one_of(st.lists(st.sampled_from(["ls", "", "a\x00b", "x" * 9000]),
                                       max_size=3), json_value),
            "cwd": st.one_of(st.sampled_from(["sub", "", "/tmp", "a\x00"]), json_value),
            "timeout": st.one_of(st.integers(-5, 5000), json_value),
            "name": st.one_of(st.sampled_from(["deps", "../x", "a/b", "X", ""]), json_value),
            "image": st.one_of(st.sampled_from(["default", "a b", ""]), json_value),
        },
    )
    as_json = plausible.map(lambda v: json.dumps(v).encode())
    body = draw(
        st.one_of(
            st.just(b""),
            json_value.map(lambda v: json.dumps(v).encode()),
            as_json,
            as_json,
            st.binary(max_size=64),
            st.sampled_from(NASTY_BODIES),
        )
    )
    key = draw(
        st.one_of(st.none(), st.sampled_from(["k1", "k2", "k" * 255, "k" * 256, ""]), latin1)
    )
    return method, path, body, draw(st.sampled_from(CONTENT_TYPES)), key


@pytest.fixture
def scene(owner, teammate, outsider, owner_token, workspace, other_workspace):
    """Actors and agents the generated requests aim at."""
    mine = Agent.objects.create(workspace=workspace, created_by=owner, spec=dict(DEFAULTS))
    child = Agent.objects.create(
        workspace=workspace, parent=mine, created_by=owner, spec=dict(DEFAULTS)
    )
    foreign = Agent.objects.create(
        workspace=other_workspace, created_by=outsider, spec=dict(DEFAULTS)
    )
    sandboxes = [SandboxSession.objects.create(workspace=ws, created_by=who).pk
                 for ws, who in ((workspace, owner), (other_workspace, outsider))]
    session = Client(enforce_csrf_checks=True)
    session.force_login(teammate)
    session.get("/accounts/login/")
    actors = {
        "owner": (Client(), {"Authorization": f"Bearer {owner_token}"}),
        "teammate": (Client(), {"Authorization": f"Bearer {ApiToken.issue(teammate)[1]}"}),
        "outsider": (Client(), {"Authorization": f"Bearer {ApiToken.issue(outsider)[1]}"}),
        "bad-token": (Client(), {"Authorization": "Bearer aln_forged"}),
        "basic": (Client(), {"Authorization": "Basic b2xpdmlhOnB3"}),
        "anonymous": (Client(), {}),
        "session": (session, {}),
        "session+csrf": (session, {"X-CSRFToken": session.cookies["csrftoken"].value}),
    }
    return actors, [mine.id, child.id, foreign.id, *sandboxes]


def state():
    return (Agent.objects.count(), Event.objects.count(), Command.objects.count(),
            SandboxSession.objects.count(), SandboxSessionEvent.objects.count())


def check_one(client, headers, request, seen):
    """Send one generated request and check the properties."""
    method, path, body, content_type, key = request
    headers = dict(headers, **({"Idempotency-Key": key} if key is not None else {}))
    with transaction.atomic():
        before = state()
        response = client.generic(method, path, body, content_type=content_type, headers=headers)
        status = response.status_code
        seen[status] = seen.get(status, 0) + 1
        assert status < 500, (
            status,
            method,
            path,
            body[:200],
            response.content[:300],
        )
        if method != "HEAD":
            payload = response.json()
            if status >= 400:
                assert isinstance(payload.get("code"), str) and isinstance(
                    payload.get("message"), str
                ), payload
        if status >= 400 or method in ("GET", "HEAD"):
            assert state() == before, (status, method, path, body[:200])
        for agent in Agent.objects.all():  # no partial write: the head is the transcript's length
            assert agent.last_seq == Event.objects.filter(agent=agent).count()
        for row in SandboxSession.objects.all():
            assert row.last_seq == SandboxSessionEvent.objects.filter(session=row).count()
        transaction.set_rollback(True)  # the next example starts from the same scene


SETTINGS = hsettings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_no_request_causes_a_5xx_or_a_partial_write(scene):
    """Anything at all, from anyone."""
    actors, ids = scene
    seen: dict[int, int] = {}

    @SETTINGS
    @given(request=requests(ids), actor=st.sampled_from(sorted(actors)))
    def check(request, actor):
        check_one(*actors[actor], request, seen)

    check()
    assert len(seen) >= 5, seen  # the examples reached past routing and auth


def test_well_aimed_bad_requests_are_refused_cleanly(scene):
    """Members, the right method and a real agent: only the body, query and key are wrong."""
    actors, ids = scene
    seen: dict[int, int] = {}

    @SETTINGS
    @given(
        request=requests(ids, aimed=True),
        actor=st.sampled_from(["owner", "teammate", "session+csrf"]),
    )
    def check(request, actor):
        check_one(*actors[actor], request, seen)

    check()
    assert seen.get(400, 0) > 0 and sum(n for s, n in seen.items() if s < 300) > 0, seen


# --- the dashboard's findings ("The sandbox is a boundary"), aimed at the API --------------
# The dashboard answered 500 to these (tests/unit/dashboard/test_bad_input_property.py);
# the API answers 400 {"code", "message"} and writes nothing.

DEEP_BODIES = [
    b'{"spec": {"model": "demo", "tools": ' + b"[" * n + b"]" * n + b"}}" for n in (65, 990, 5000)
] + [b'{"text": ' + b"[" * 990 + b"]" * 990 + b"}", b'{"spec": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3000 + b"}"]
LONG_INT_BODIES = [
    b'{"spec": {"model": "demo", "limits": {"pids": ' + b"9" * 5000 + b"}}}",
    b'{"spec": {"model": "demo", "tools": [' + b"1" * 5000 + b"]}}",
    b'{"text": ' + b"9" * 5000 + b"}",
    b'{"at_event": ' + b"9" * 5000 + b"}",
]
ODD_DIGITS = ["%C2%B2", "%D9%A3", "%EF%BC%91", "%F0%9D%9F%99", "%E0%A5%AB", "1%C2%B2", "9" * 19,
              "9" * 5000, "-1", "%2B1", "1.0", ""]


@pytest.mark.parametrize("raw", DEEP_BODIES + LONG_INT_BODIES)
@pytest.mark.parametrize("tail", ["", "/{id}/prompt", "/{id}/fork"])
def test_deep_nesting_and_long_numbers_are_a_400(api, spawned, raw, tail):
    before = state()
    response = api.post("/api/agents" + tail.format(id=spawned), raw=raw)
    assert response.status_code == 400, response.content[:300]
    body = response.json()
    assert body["code"] == "request.malformed_json" and body["message"], body
    assert state() == before


def test_a_400_says_why(api):
    deep = api.post("/api/agents", raw=DEEP_BODIES[0]).json()["message"]
    assert "nests deeper than 64 levels" in deep
    long = api.post("/api/agents", raw=LONG_INT_BODIES[0]).json()["message"]
    assert "more than 4300 digits" in long


@pytest.mark.parametrize("value", ODD_DIGITS)
@pytest.mark.parametrize("name", ["after", "before", "limit"])
def test_odd_digits_in_cursors_and_limits_are_a_400(api, spawned, name, value):
    other = "&after=0" if name == "limit" else ""
    response = api.get(f"/api/agents/{spawned}/events?{name}={value}{other}")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["code"] == f"{name}.invalid"
    if name != "before":
        listing = api.get(f"/api/agents?{name}={value}")
        assert listing.status_code == 400 and set(listing.json()) >= {"code", "message"}
