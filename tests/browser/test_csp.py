"""The Content-Security-Policy in a real browser: the tree, the agent page with
its live transcript (SSE over fetch), a prompt sent through the form, older
rows, the spawn form and the login page all work, and chromium reports no
`securitypolicyviolation` and no CSP console error while they do.
tests/unit/dashboard/test_csp.py checks the header and the HTML itself."""

from __future__ import annotations

import pytest

from .conftest import assert_contiguous, seqs

pytestmark = pytest.mark.live

# Runs before any page script, outside the page's policy (Playwright's init
# script), so every violation on every page is reported to the console.
WATCH = """
document.addEventListener("securitypolicyviolation", (e) => {
  console.error("CSP-VIOLATION " + e.violatedDirective + " " + (e.blockedURI || "inline") +
                " at " + e.sourceFile + ":" + e.lineNumber + " " + (e.sample || ""));
});
"""


class Watch:
    """Console errors about the policy, and uncaught page errors, on one page."""

    def __init__(self, page):
        self.violations: list[str] = []
        self.errors: list[str] = []
        page.context.add_init_script(WATCH)
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def _console(self, message):
        text = message.text
        if "CSP-VIOLATION" in text or "Content Security Policy" in text:
            self.violations.append(text)


def test_the_dashboard_works_under_the_policy_with_no_violation(server, actor, new_page):
    agent = server.create_agent(actor, [("operator.note", {"text": f"note {i}"}) for i in range(1, 151)])
    page = new_page(actor)
    watch = Watch(page)

    # The tree: its header, and live over SSE (a commit from another process shows).
    response = page.goto(f"{server.url}/")
    policy = response.headers.get("content-security-policy", "")
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    page.locator(f"#node-{agent}").wait_for()
    page.locator(".ws-tree[data-state=live]").wait_for()
    seq = server.note(agent, "noted while the tree is open")
    page.locator(f"#node-{agent} .node-main:has-text('{seq} events')").wait_for()

    # The agent page: live over SSE, a commit from another process streams in.
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#transcript[data-state=live]").wait_for()
    seq = server.note(agent, "streamed while watching")
    page.locator(f"#row-{seq}").wait_for()
    assert "streamed while watching" in page.locator(f"#row-{seq}").inner_text()

    # A prompt through the form (htmx POST, swapped answer), then its row streams in.
    page.click(f"#prompt-open-{agent}")
    page.fill(f"#prompt-text-{agent}", "say: hello under a strict policy")
    page.click(f"#prompt-send-{agent}")
    page.locator(f"#actions-{agent} .note-success").wait_for()
    assert page.input_value(f"#prompt-text-{agent}") == "", "a sent prompt is not kept as a draft"
    page.locator("#rows > li[data-type='command.prompt']").first.wait_for(state="attached")

    # Older rows on demand. Scrolled into view, the button also trips the scroll-up
    # loader, whose rows can land under the pointer mid-click: press it from script.
    page.locator("#load-older").evaluate("b => b.click()")
    page.locator("#row-1").wait_for()
    assert_contiguous(seqs(page))

    # The spawn form refuses bad JSON (a full-page form POST), and the login page.
    page.goto(f"{server.url}/agents/new")
    page.select_option("#id_example", "")
    page.fill("#id_spec", "[" * 5000)
    page.click("#spawn-submit")
    assert "nests deeper than 64 levels" in page.locator("#id_spec-error").inner_text()
    page.goto(f"{server.url}/agents/{agent}/rows?after=%C2%B2")
    assert "digits 0-9" in page.locator("main").inner_text()

    anonymous = new_page()
    anonymous_watch = Watch(anonymous)
    anonymous.goto(f"{server.url}/accounts/login/")
    anonymous.fill("#id_username", actor.username)
    anonymous.fill("#id_password", f"{actor.username}-password-123")
    anonymous.click("button[type=submit]")
    anonymous.wait_for_url(f"{server.url}/")

    assert watch.violations == [] and anonymous_watch.violations == []
    assert watch.errors == [] and anonymous_watch.errors == []


def test_the_watch_sees_a_violation_when_there_is_one(server, actor, new_page):
    """The check itself: an inline handler and eval are refused and reported."""
    page = new_page(actor)
    watch = Watch(page)
    page.goto(f"{server.url}/")
    page.evaluate("""() => {
        document.body.insertAdjacentHTML("beforeend", '<img src="/static/favicon.svg" onload="window.ran = 1">');
        try { eval("1"); } catch (e) {}
    }""")
    page.wait_for_function("() => document.querySelector('img[onload]').complete")
    page.wait_for_timeout(300)
    assert page.evaluate("window.ran") is None
    assert any("script-src" in v for v in watch.violations), watch.violations
