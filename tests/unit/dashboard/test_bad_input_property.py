"""Property: nothing a browser sends to the dashboard produces a 5xx or a partial write.

The dashboard's twin of tests/unit/api/test_bad_input_property.py. Hypothesis
throws GETs with hostile query strings and headers, and POSTs with hostile form
fields and raw bodies, at every dashboard route, as the owner's teammate (with
and without a CSRF token), as an outsider and anonymously. Every answer is
below 500; a 4xx is an HTML page (templates/400.html, or the form with its
errors), never a traceback; a refused request changed nothing, and no agent's
head runs ahead of its transcript. Each example runs in a transaction that is
rolled back, so examples do not depend on one another.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sessions import sbjournal
from sessions.models import Agent, Command, Event, SandboxSession

pytestmark = pytest.mark.django_db

VERBS = ["prompt", "steer", "interrupt", "pause", "resume", "stop"]
MY_SB, FOREIGN_SB = "sb_" + "1" * 16, "sb_" + "2" * 16  # the scene's sandbox sessions
SANDBOX_PAGES = [f"/sandboxes/{MY_SB}/", f"/sandboxes/{FOREIGN_SB}/"]
GET_TAILS = ["/", "/live", "/rows", "/rows/", "/prompt", "/files"]
GET_PAGES = ["/", "/tree", "/agents/new", "/accounts/login/", "/agents/", "/nope", "/sandboxes/",
             "/sandboxes/sb_0000000000000000/", "/usage", *SANDBOX_PAGES]
POST_VERBS = VERBS + ["fork", "approve", "deny", "reattach", "files/live"]
# Digits no client means: superscript two, Arabic-Indic three, fullwidth one,
# mathematical bold one, Devanagari five; and numbers past every limit.
ODD_DIGITS = ["²", "٣", "１", "𝟙", "५", "1²", "-1", "+1", " 1", "1.0", "1e3", "0x10", "9" * 19,
              "9" * 5000, "", "\x00", "1\x00"]
DEEP = ['{"model": "demo", "tools": ' + "[" * n + "]" * n + "}" for n in (65, 990, 5000)]
NASTY_SPECS = [
    *DEEP,
    "[" * 3000,
    '{"model": "demo", "limits": {"pids": ' + "9" * 5000 + "}}",
    '{"model": "demo", "tools": [' + "1" * 5000 + "]}",
    '{"model": "demo", "limits": {"cpus": 1e999}}',
    '{"model": NaN}',
    '{"model": "demo", "name": "\\ud800"}',
    '{"model": "demo", "name": "a\\u0000b"}',
    '{"model": "demo", "name": ' + "{\"a\": " * 70 + "1" + "}" * 70 + "}",
    '{"model": "demo",}',
    '"demo"',
    "null",
    "\ufeff{}",
    '{"model": "demo", "gpu": 1}',
]
NASTY_BODIES = [
    b"--xyz\r\n\r\n--xyz--",
    b"--xyz\r\nContent-Disposition: form-data; name=\"text\"\r\n\r\nhi",
    b"text=%ff%fe&idempotency_key=%00",
    b"&".join(b"f%d=1" % i for i in range(1200)),  # past DATA_UPLOAD_MAX_NUMBER_FIELDS
    b"\x00\xff" * 40,
    b"text=" + b"x" * 2000,
]
CONTENT_TYPES = [
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
    "multipart/form-data",
    "application/json",
    "text/plain",
    "",
]
ODD_URLS = ["http://[", "http://[::1", "javascript:alert(1)", "//evil.example/", "\x00", "ht tp://x",
            "http://testserver/agents/../../etc", "x" * 3000]

hostile_text = st.one_of(
    st.sampled_from(ODD_DIGITS + ODD_URLS + NASTY_SPECS),
    st.text(max_size=30),
    st.text(st.characters(max_codepoint=255), max_size=30),
    st.integers(-(2**70), 2**70).map(str),
)


@st.composite
def get_requests(draw, ids):
    junk = quote(draw(st.text(max_size=8)), safe="") or "x"
    agent_id = draw(st.sampled_from([*ids[:2] * 4, ids[2], "ag_missing", junk]))
    path = draw(st.one_of(
        st.sampled_from(GET_PAGES),
        st.sampled_from(GET_TAILS).map(lambda tail: f"/agents/{agent_id}{tail}"),
        st.just(f"/agents/{agent_id}/rows"),
    ))
    keys = ["after", "before", "v", "parent", "next", "x", "q", "status", "sort", "page",
            "path", "checkpoint", "changes", "diff", "days", "live", "look"]
    pairs = draw(st.lists(st.tuples(st.sampled_from(keys),
                                    hostile_text), max_size=3))
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)
    # Percent sequences that are not UTF-8, and separators without names.
    query += draw(st.sampled_from(["", "&%ff%fe=%c2", "&after", "&&==&", "&after=%C2%B2&after=1"]))
    return "GET", path + (f"?{query}" if query else ""), draw(headers()), None, None


@st.composite
def post_requests(draw, ids):
    agent_id = draw(st.sampled_from([*ids[:2] * 4, ids[2], "ag_missing"]))
    path = draw(st.one_of(
        st.just("/agents/new"),
        st.just("/accounts/login/"),
        st.sampled_from(POST_VERBS).map(lambda v: f"/agents/{agent_id}/{v}"),
    ))
    fields = draw(st.dictionaries(
        st.sampled_from(["example", "spec", "prompt", "parent", "text", "idempotency_key",
                         "compact", "next", "username", "password", "junk", "checkpoint",
                         "at_event", "name", "reason"]),
        st.one_of(hostile_text, st.sampled_from(["demo", "demo-checkpoint", "say: hi", *ids])),
        max_size=5,
    ))
    raw = draw(st.one_of(st.none(), st.none(), st.sampled_from(NASTY_BODIES)))
    content_type = draw(st.sampled_from(CONTENT_TYPES)) if raw is not None else None
    return "POST", path, draw(headers()), raw if raw is not None else fields, content_type


def headers():
    return st.fixed_dictionaries({}, optional={
        "HX-Request": st.sampled_from(["true", "false", "1"]),
        "HX-Current-URL": st.sampled_from(ODD_URLS + ["http://testserver/"]),
        "X-Alineo-Fragment": st.just("1"),
        "Idempotency-Key": st.sampled_from(["k1", "k" * 256, "", "\x7f", "ключ"]),
    })


@pytest.fixture
def scene(owner, teammate, outsider, workspace, other_workspace, make_agent):
    """Agents with transcripts, and browsers for each actor."""
    mine = make_agent(facts=[("operator.note", {"text": f"n{i}"}) for i in range(1, 30)])
    child = make_agent(parent=mine)
    foreign = make_agent(ws=other_workspace)
    for pk, ws, who in ((MY_SB, workspace, owner), (FOREIGN_SB, other_workspace, outsider)):
        SandboxSession.objects.create(pk=pk, workspace=ws, created_by=who)
        sbjournal.append(pk, "exec.finished", {"argv": ["ls"], "exit_code": 0})

    def browser(user=None):
        client = Client(enforce_csrf_checks=True)
        if user is not None:
            client.force_login(user)
        client.get("/accounts/login/")  # sets the csrftoken cookie
        return client

    member, stranger = browser(teammate), browser(outsider)
    actors = {
        "anonymous": (browser(), False),
        "anonymous+csrf": (browser(), True),
        "member": (member, False),
        "member+csrf": (member, True),
        "outsider+csrf": (stranger, True),
    }
    return actors, [mine.id, child.id, foreign.id]


def state():
    return Agent.objects.count(), Event.objects.count(), Command.objects.count()


def check_one(client, with_csrf, request, seen):
    method, path, headers, body, content_type = request
    headers = dict(headers)
    if with_csrf:
        headers["X-CSRFToken"] = client.cookies["csrftoken"].value
    with transaction.atomic():
        before = state()
        if method == "GET":
            response = client.get(path, headers=headers)
        elif content_type is None:
            response = client.post(path, body, headers=headers)
        else:
            response = client.generic("POST", path, body, content_type=content_type,
                                      headers=headers)
        status = response.status_code
        seen[status] = seen.get(status, 0) + 1
        assert status < 500, (status, method, path, str(body)[:200], response.content[:300])
        if 400 <= status:
            assert response["Content-Type"].startswith("text/html"), response["Content-Type"]
            assert b"Traceback" not in response.content
        if status >= 400 or method == "GET":
            assert state() == before, (status, method, path, str(body)[:200])
        for agent in Agent.objects.all():  # no partial write
            assert agent.last_seq == Event.objects.filter(agent=agent).count()
        transaction.set_rollback(True)


SETTINGS = hsettings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_no_get_causes_a_5xx_or_a_write(scene):
    actors, ids = scene
    seen: dict[int, int] = {}

    @SETTINGS
    @given(request=get_requests(ids), actor=st.sampled_from([*["member"] * 4, *sorted(actors)]))
    # The findings of "The sandbox is a boundary": a superscript digit as a cursor.
    @example(request=("GET", f"/agents/{ids[0]}/rows?after=%C2%B2", {}, None, None), actor="member")
    @example(request=("GET", f"/agents/{ids[0]}/rows?before=%D9%A3", {}, None, None), actor="member")
    @example(request=("GET", "/tree", {"HX-Current-URL": "http://["}, None, None),
             actor="anonymous")
    # A NUL in an agent id: PostgreSQL refuses it in a query (DataError, a 500).
    @example(request=("GET", "/agents/new?parent=a%00b", {}, None, None), actor="member")
    def check(request, actor):
        check_one(*actors[actor], request, seen)

    check()
    assert seen.get(200) and seen.get(400) and seen.get(404), seen


def test_no_post_causes_a_5xx_or_a_partial_write(scene):
    actors, ids = scene
    seen: dict[int, int] = {}

    @SETTINGS
    @given(request=post_requests(ids),
           actor=st.sampled_from([*["member+csrf"] * 6, *sorted(actors)]))
    # The findings: a deeply nested spec, a 5,000-digit integer in one.
    @example(request=("POST", "/agents/new", {}, {"spec": DEEP[1]}, None), actor="member+csrf")
    @example(request=("POST", "/agents/new", {}, {"spec": NASTY_SPECS[5]}, None),
             actor="member+csrf")
    @example(request=("POST", "/agents/new", {}, {"parent": "a\x00b", "example": "demo"}, None),
             actor="member+csrf")
    def check(request, actor):
        check_one(*actors[actor], request, seen)

    check()
    assert seen.get(400) and seen.get(403), seen


@pytest.mark.parametrize("spec, says", [
    (DEEP[0], "nests deeper than 64 levels"),
    (DEEP[1], "nests deeper than 64 levels"),
    (DEEP[2], "nests deeper than 64 levels"),
    ('{"model": "demo", "limits": {"pids": ' + "9" * 5000 + "}}", "more than 4300 digits"),
    ('{"model": "demo", "limits": {"cpus": 1e999}}', "out of range"),
    ('{"model": NaN}', "NaN is not a JSON number"),
])
def test_the_findings_are_explained_next_to_the_spec(logged_in, spec, says):
    """The spawn form answers 400 with the reason beside the field, and spawns nothing."""
    response = logged_in.post("/agents/new", {"example": "", "spec": spec})
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="id_spec-error"' in html and says in html
    assert not Agent.objects.exists() and not Command.objects.exists()


@pytest.mark.parametrize("query", ["after=%C2%B2", "before=%C2%B2", "after=%D9%A3",
                                   "after=%EF%BC%91", "after=" + "9" * 19, "after=-1", "after="])
def test_an_odd_cursor_gets_the_readable_400_page(logged_in, make_agent, query):
    agent = make_agent()
    response = logged_in.get(f"/agents/{agent.id}/rows?{query}")
    assert response.status_code == 400
    assert response.templates[0].name == "400.html"
    assert "digits 0-9" in response.content.decode()


def test_every_dashboard_route_is_thrown_at():
    """A new dashboard route must join the lists above (else it is never fuzzed)."""
    from django.urls import Resolver404, resolve

    from sessions.urls import urlpatterns

    thrown = set()
    for path in [*GET_PAGES, *(f"/agents/ag_x{t}" for t in GET_TAILS),
                 *(f"/agents/ag_x/{v}" for v in POST_VERBS)]:
        try:
            thrown.add(resolve(path).url_name)
        except Resolver404:
            pass
    assert {p.name for p in urlpatterns} - thrown == set()

