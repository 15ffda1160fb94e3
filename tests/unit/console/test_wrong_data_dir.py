"""Bug 5 of the operator's console (issue 15): issue_token pointed at a data dir
with no database, and the example's --new with a bad URL, say what is wrong in a
sentence — no traceback, and no empty ./var left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "ALINEO_DB_PATH", "DJANGO_SETTINGS_MODULE")}
    env.update(extra)
    return env


def test_issue_token_without_the_servers_data_dir_explains_and_leaves_nothing(tmp_path):
    missing = tmp_path / "not-the-server"
    result = subprocess.run([sys.executable, "manage.py", "issue_token", "admin"], cwd=ROOT,
                            env=_env(ALINEO_DATA_DIR=str(missing)), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and "no such table" not in result.stderr
    assert "ALINEO_DATA_DIR" in result.stderr and str(missing) in result.stderr
    assert result.stdout == ""
    assert not missing.exists(), "issue_token made a data dir it then found empty"


def test_issue_token_in_an_unmigrated_existing_dir_keeps_the_dir(tmp_path):
    result = subprocess.run([sys.executable, "manage.py", "issue_token", "admin"], cwd=ROOT,
                            env=_env(ALINEO_DATA_DIR=str(tmp_path)), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "make migrate" in result.stderr
    assert tmp_path.exists()


@pytest.mark.parametrize("url", ["nonsense", "http://[bad", "http://127.0.0.1:99999"])
def test_example_new_with_a_bad_url_prints_a_sentence(url):
    result = subprocess.run(
        [sys.executable, "examples/reattach_or_resume.py", "--new", "--url", url,
         "--token", "aln_bad"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert "not an http(s) URL" in result.stderr


def _refused_port() -> int:
    """A port on 127.0.0.1 that nobody listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("args", [["--new"], ["ag_0123456789abcdef"]])
def test_example_against_a_refused_connection_prints_a_line(args):
    url = f"http://127.0.0.1:{_refused_port()}"
    result = subprocess.run(
        [sys.executable, "examples/reattach_or_resume.py", *args, "--url", url, "--token", "aln_bad",
         "--retry-for", "0.5"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr  # one line
    assert f"cannot reach Alineo at {url}" in result.stderr and "Connection refused" in result.stderr


def test_issue_token_help_names_the_data_dir(tmp_path):
    result = subprocess.run([sys.executable, "manage.py", "issue_token", "--help"], cwd=ROOT,
                            env=_env(ALINEO_DATA_DIR=str(tmp_path / "d")), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps the description
    assert "ALINEO_DATA_DIR (default ./var" in text and "server's ALINEO_DATA_DIR" in text
