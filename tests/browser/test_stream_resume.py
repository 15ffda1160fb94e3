"""Kill -9 and restart the server while rows stream, and reload mid-stream: the
page resumes with no duplicate and no missing row (rows keyed by seq)."""

import subprocess

import pytest

from tests.live import PYTHON, ROOT

from .conftest import assert_contiguous, seqs

pytestmark = pytest.mark.live

ROWS = 120


def start_writer(server, agent_id: str, count: int, pause_s: float = 0.05) -> subprocess.Popen:
    """Another process appends `count` notes, one commit each, while the test runs."""
    code = (
        "import time\nfrom sessions import journal\n"
        f"for i in range({count}):\n"
        f"    journal.append({agent_id!r}, 'operator.note', {{'text': f'streamed {{i}}'}})\n"
        f"    time.sleep({pause_s})\n"
    )
    return subprocess.Popen([PYTHON, "manage.py", "shell", "--no-startup", "-c", code], cwd=ROOT,
                            env=server.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_rows(page, head: int, timeout_ms: int = 30_000) -> None:
    page.wait_for_function(f"() => document.getElementById('row-{head}') !== null", timeout=timeout_ms)


def test_kill_and_restart_while_streaming(server, actor, page):
    agent = server.create_agent(actor, [("operator.note", {"text": "start"})])
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#transcript[data-state=live]").wait_for()
    writer = start_writer(server, agent, ROWS)
    try:
        page.wait_for_function("() => document.querySelectorAll('#rows > li').length >= 20")
        server.restart(hard=True)  # SIGKILL by PID, then the same port and data dir
        writer.wait(timeout=120)
        assert writer.returncode == 0, writer.stderr.read().decode()
    finally:
        if writer.poll() is None:
            writer.kill()
    head = 1 + ROWS
    wait_rows(page, head, timeout_ms=45_000)
    page.locator("#transcript[data-state=live]").wait_for()
    assert page.locator("#stream-banner").is_hidden()
    values = seqs(page)
    assert values[0] == 1 and values[-1] == head
    assert_contiguous(values)


def test_banner_shows_while_the_server_is_down(server, actor, page):
    agent = server.create_agent(actor, [("operator.note", {"text": "one"})])
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#transcript[data-state=live]").wait_for()
    server.kill()
    try:
        page.locator("#stream-banner").wait_for(state="visible")
        assert "Reconnecting" in page.locator("#stream-banner").inner_text()
    finally:
        server.start()
    page.locator("#stream-banner").wait_for(state="hidden", timeout=30_000)
    seq = server.note(agent, "after the restart")
    wait_rows(page, seq)
    assert_contiguous(seqs(page))


def test_reload_mid_stream(server, actor, page):
    agent = server.create_agent(actor, [("operator.note", {"text": "start"})])
    page.goto(f"{server.url}/agents/{agent}/")
    writer = start_writer(server, agent, ROWS, pause_s=0.03)
    try:
        page.wait_for_function("() => document.querySelectorAll('#rows > li').length >= 30")
        page.reload()
        page.locator("#transcript[data-state=live]").wait_for()
        writer.wait(timeout=120)
    finally:
        if writer.poll() is None:
            writer.kill()
    head = 1 + ROWS
    wait_rows(page, head)
    values = seqs(page)
    assert values[-1] == head
    assert_contiguous(values)
