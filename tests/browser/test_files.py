"""Files (issue 15, Build 6), in a browser: from the agent page's side panel
to its home as of a checkpoint, into a directory and a file, then what the
turn changed and one file's diff — all read from checkpoint files (the agent
here has no sandbox at all)."""

import pytest

from tests.browser.conftest import screenshot
from tests.unit.test_home_files import make_checkpoint

pytestmark = pytest.mark.live


def add_checkpoint(server, agent: str, turn: int, path) -> int:
    return server.django(
        "from django.utils import timezone\nfrom sessions.models import Checkpoint\n"
        f"result = Checkpoint.objects.create(agent_id={agent!r}, sandbox_id='sb', turn={turn}, "
        f"through_seq={turn}, path={str(path)!r}, bytes=1, "
        "expires_at=timezone.now() + timezone.timedelta(days=3)).pk\n")


def test_browse_a_checkpoint_and_what_its_turn_changed(server, actor, page, tmp_path):
    agent = server.create_agent(actor, [("agent.spawned", {"spec": {"model": "demo"}})])
    add_checkpoint(server, agent, 1, make_checkpoint(tmp_path / "1.tar.zst", {
        "./src": None, "./src/app.py": "print('v1')\n", "./README": "hello\n"}))
    add_checkpoint(server, agent, 2, make_checkpoint(tmp_path / "2.tar.zst", {
        "./src": None, "./src/app.py": "print('v2')\n", "./README": "hello\n",
        "./data.bin": b"\x00\xff" * 100}))
    page.goto(f"{server.url}/agents/{agent}/")
    page.click("#files-link")
    page.locator("#dir-list", has_text="src/").wait_for()
    page.click("#dir-list >> text=src/")
    page.click("#dir-list >> text=app.py")
    assert page.locator("#file-view").inner_text().strip() == "print('v2')"
    page.click("#file-crumbs >> text=~")
    page.click("#dir-list >> text=data.bin")
    page.locator("#binary").wait_for()
    page.click("#changes-link")
    changes = page.locator("#changes")
    assert "src/app.py" in changes.inner_text() and "data.bin" in changes.inner_text()
    assert "README" not in changes.inner_text()
    page.click("#changes >> text=src/app.py")
    diff = page.locator("#file-diff")
    assert "-print('v1')" in diff.inner_text() and "+print('v2')" in diff.inner_text()
    screenshot(page, "files-diff")
