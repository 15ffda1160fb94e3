"""Bug 5 of the operator's console (issue 15): examples/reattach_or_resume.py
with a bad token against a live server says so in one line and exits 1 — no
traceback. (A refused connection and a malformed URL: tests/unit/console/
test_wrong_data_dir.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.live import ROOT

pytestmark = pytest.mark.live


@pytest.mark.parametrize("args", [["--new"], ["ag_0123456789abcdef", "say: hi"]])
def test_example_with_a_bad_token_prints_a_line(alineo_server, args):
    result = subprocess.run(
        [sys.executable, "examples/reattach_or_resume.py", *args, "--url", alineo_server.url,
         "--token", "aln_not-a-token"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr  # one line
    assert f"the server at {alineo_server.url} refused the token (auth.invalid_token)" in result.stderr
    assert "issue_token" in result.stderr and result.stdout == ""
