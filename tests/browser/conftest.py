"""Browser tests: Playwright driving Debian's chromium (no browser download)
against a real server process (tests/live.py).

Without chromium or playwright these tests FAIL under CI=true (CI must run
them; `make test` installs chromium as root through .ci/browser-up) and are
skipped loudly elsewhere. Screenshots go to $ALINEO_SCREENSHOTS_DIR when set
(e.g. docs/screenshots), else nowhere.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.integration.conftest import (  # noqa: F401 - a fixture, by name
    remove_sandboxes_made_by_live_servers,  # the worker's real sandboxes go at the end
)
from tests.live import LiveServer

CHROMIUM = os.environ.get("ALINEO_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
TIMEOUT_MS = 15_000
_missing: list[str] = []


def _why_missing() -> str | None:
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"chromium not found at {CHROMIUM} (apt-get install -y chromium, or run .ci/browser-up)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    return None


# Module scope, not session: Playwright's sync API keeps an event loop running
# in the main thread while it is open, and tests collected after the browser
# tests (asyncio.run in unit tests) would then fail.
@pytest.fixture(scope="module")
def browser():
    why = _why_missing()
    if why:
        _missing.append(why)
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"browser tests cannot run under CI: {why}", pytrace=False)
        pytest.skip(f"BROWSER TESTS SKIPPED: {why}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
        yield browser
        browser.close()


def pytest_terminal_summary(terminalreporter):
    if _missing:
        terminalreporter.write_sep("!", "BROWSER TESTS DID NOT RUN", red=True, bold=True)
        terminalreporter.write_line(_missing[0], red=True)


@pytest.fixture(scope="module")
def server():
    with LiveServer(env={"ALINEO_SSE_HEARTBEAT_S": "5"}) as live:
        yield live


@pytest.fixture
def actor(server, request):
    name = "u" + str(abs(hash(request.node.nodeid)) % 10**8)
    return server.create_actor(name)


def _context(browser, server, actor=None, width=1280, height=900):
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(TIMEOUT_MS)
    if actor is not None:
        context.add_cookies([{"name": "sessionid", "value": server.session_cookie(actor),
                              "url": server.url}])
    return context


@pytest.fixture
def page(browser, server, actor):
    context = _context(browser, server, actor)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def new_page(browser, server):
    contexts = []

    def make(actor=None, **size):
        context = _context(browser, server, actor, **size)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


def screenshot(page, name: str) -> None:
    target = os.environ.get("ALINEO_SCREENSHOTS_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=False)


def seqs(page) -> list[int]:
    return page.eval_on_selector_all("#rows > li", "els => els.map(e => +e.dataset.seq)")


def assert_contiguous(values: list[int]) -> None:
    assert values == list(range(values[0], values[0] + len(values))), (
        f"rows are not contiguous or repeat: {values[:5]}…{values[-5:]} ({len(values)} rows)"
    )
