"""The Content-Security-Policy (django-csp, alineo_site/settings.py): every
dashboard page and fragment answers with the header, and its HTML keeps to it
— no inline <script>, no on*= handler, no hx-on, no style= or <style>, no
javascript: URL, no htmx feature that needs eval (hx-trigger filters, js:
values). tests/browser/test_csp.py checks that a real browser reports no
violation while the pages work."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.template.loader import render_to_string
from django.utils import timezone

from sessions import journal
from sessions.models import Checkpoint

pytestmark = pytest.mark.django_db

POLICY = {
    "default-src": "'self'", "script-src": "'self'", "style-src": "'self'", "img-src": "'self'",
    "font-src": "'self'", "connect-src": "'self'", "object-src": "'none'", "base-uri": "'self'",
    "form-action": "'self'", "frame-ancestors": "'none'",
}


class InlineFinder(HTMLParser):
    """Collects what a strict script-src / style-src would refuse."""

    URL_ATTRS = ("href", "src", "action", "formaction", "hx-get", "hx-post", "data")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self.scripts = 0
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name, value in attrs.items():
            value = value or ""
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}=…> (an inline event handler)")
            if name.startswith(("hx-on", "data-hx-on")):
                self.found.append(f"<{tag} {name}=…> (htmx evaluates it)")
            if name == "style":
                self.found.append(f"<{tag} style=…> (an inline style)")
            if name in self.URL_ATTRS and value.strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}=javascript:…>")
            if name in ("hx-trigger", "data-hx-trigger") and "[" in value:
                self.found.append(f"<{tag} hx-trigger={value!r}> (a filter needs eval)")
            if name in ("hx-vals", "hx-vars", "hx-headers") and value.strip().startswith(("js:", "javascript:")):
                self.found.append(f"<{tag} {name}=js:…> (needs eval)")
        if tag == "script":
            self.scripts += 1
            if not attrs.get("src"):
                self.found.append("<script> without src (an inline script)")
            self._in = "script"
        if tag == "style":
            self.found.append("<style> (an inline style sheet)")
            self._in = "style"

    def handle_endtag(self, tag):
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        if self._in == "script" and data.strip():
            self.found.append(f"<script src> with a body: {data.strip()[:40]!r}")


def inline_parts(html: str) -> list[str]:
    finder = InlineFinder()
    finder.feed(html)
    finder.close()
    return finder.found


def policy_of(response) -> dict[str, str]:
    header = response.headers.get("Content-Security-Policy")
    assert header, f"no Content-Security-Policy on {response.request['PATH_INFO']}"
    return dict(part.strip().split(" ", 1) for part in header.split(";") if part.strip())


def assert_clean(response, status=200):
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert policy_of(response) == POLICY
    assert response.headers.get("X-Content-Type-Options") == "nosniff"
    html = response.content.decode()
    assert inline_parts(html) == [], response.request["PATH_INFO"]
    return html


@pytest.fixture
def world(make_agent, owner, workspace):
    """An agent whose page draws every kind of row, a child, a fork and checkpoints."""
    parent = make_agent(facts=[
        ("agent.spawned", {"spec": {"model": "demo", "checkpoint": True}, "by": "olivia"}),
        ("command.prompt", {"text": "say: hi", "by": "olivia"}),
        ("turn.started", {"turn": 1}),
        ("message.user", {"text": "say: hi"}),
        ("tool.dispatched", {"tool_call_id": "c1", "name": "bash", "input": {"cmd": "ls"}}),
        ("tool.result", {"tool_call_id": "c1", "output": "x\n" * 400, "exit_code": 1}),
        ("message.assistant", {"text": "<script>alert(1)</script> hi", "model": "demo"}),
        ("turn.finished", {"turn": 1}),
        ("agent.status", {"status": "paused", "reason": "operator"}),
        ("agent.restored", {"rung": "restore", "reason": "sandbox_missing", "old_sandbox_id": "a",
                            "new_sandbox_id": "b", "checkpoint": 1, "checkpoint_turn": 1}),
        ("command.failed", {"reason": "no turn", "verb": "steer", "code": "no_turn"}),
        ("agent.checkpointed", {"checkpoint": 1, "turn": 1, "bytes": 10, "ms": 3}),
        ("bridge.something", {"onclick": "alert(1)", "style": "x"}),
        ("turn.started", {"turn": 2}),
    ])
    child = make_agent(parent=parent)
    journal.append(parent.id, "agent.child_spawned", {"child": child.id})
    make_agent(facts=[("agent.spawned", {"spec": {"model": "demo"},
                                         "fork": {"agent": parent.id, "checkpoint": 1, "turn": 1}})])
    now = timezone.now()
    Checkpoint.objects.create(agent=parent, sandbox_id="b", turn=1, through_seq=8, bytes=2_000,
                              expires_at=now + timezone.timedelta(days=3))
    return parent


def test_every_page_and_fragment_has_the_policy_and_no_inline_code(logged_in, world):
    pages = {
        "/": 200, "/tree": 200, "/agents/new": 200, f"/agents/new?parent={world.id}": 200,
        f"/agents/{world.id}/": 200, f"/agents/{world.id}/live": 200,
        f"/agents/{world.id}/rows?after=0": 200, f"/agents/{world.id}/rows?before=9": 200,
        f"/agents/{world.id}/rows?after=x": 400, "/agents/ag_missing/": 404, "/nowhere": 404,
        "/accounts/login/": 200,
    }
    for path, status in pages.items():
        assert_clean(logged_in.get(path), status)


def test_the_answers_to_forms_keep_to_it(logged_in, world):
    assert_clean(logged_in.post("/agents/new", {"example": "", "spec": "{"}), 400)
    htmx = {"HTTP_HX_REQUEST": "true"}
    assert_clean(logged_in.post(f"/agents/{world.id}/prompt", {"text": "say: hi"}, **htmx))
    assert_clean(logged_in.post(f"/agents/{world.id}/steer", {"text": ""}, **htmx), 400)
    assert_clean(logged_in.post(f"/agents/{world.id}/pause", {"compact": "1"}, **htmx))


def test_the_pages_anyone_can_reach_keep_to_it(client, owner):
    assert_clean(client.get("/accounts/login/"))
    for _ in range(5):
        client.post("/accounts/login/", {"username": "olivia", "password": "wrong"})
    assert_clean(client.post("/accounts/login/", {"username": "olivia", "password": "x"}), 429)


def test_a_refused_csrf_check_gets_the_sites_403_page(owner, make_agent):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)
    html = assert_clean(browser.post(f"/agents/{make_agent().id}/pause"), 403)
    assert "This request was refused" in html


def test_the_error_templates_keep_to_it():
    for name in ("400.html", "403.html", "404.html", "500.html", "registration/locked_out.html"):
        assert inline_parts(render_to_string(name, {"failures": 5, "wait": "15 minutes"})) == [], name


def test_the_admin_gets_the_policy_and_runs_no_inline_script(admin_client, world):
    for path in ("/admin/", "/admin/agent_sessions/workspace/", "/admin/agent_sessions/checkpoint/"):
        response = admin_client.get(path)
        assert response.status_code == 200 and policy_of(response) == POLICY
        scripts = [p for p in inline_parts(response.content.decode()) if "script" in p or "handler" in p]
        assert scripts == [], path


def test_the_finder_finds_what_the_policy_refuses():
    """The check itself: each of these would be refused by the browser."""
    for html in ("<script>x()</script>", '<a onclick="x()">', '<p style="color:red">', "<style>p{}</style>",
                 '<a href="javascript:x()">', '<div hx-on:click="x()">', '<div hx-trigger="every 2s [x()]">',
                 '<div hx-vals="js:{a: x()}">', '<body onload="x()">', '<script src="/a.js">x()</script>'):
        assert inline_parts(html), html
    assert inline_parts('<script src="/static/a.js"></script><a href="/x" data-on="1">') == []
