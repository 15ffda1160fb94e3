"""Only the control plane reaches what it keeps: the data dir is private
(0700, files 0600) — also one an older release left readable — and a bridge's
socket answers no other local user. Each finding tried as the attack it was:
another local user reading the database (credential values in clear) or
driving a bridge (`{"op": "prompt", "text": "run: …"}`)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.worlds import events_of
from tests.live import LiveServer

NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _as_nobody(code: str) -> subprocess.CompletedProcess:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another local user (CI runs as root)")
    # The host's own python: the test's may live where that user cannot go.
    return subprocess.run(["/usr/bin/python3", "-S", "-c", code], user=NOBODY, group=NOBODY,
                          capture_output=True, text=True, timeout=30, cwd="/")


def test_the_data_dir_and_what_it_holds_are_private(world):
    agent = world.spawn({"model": "demo", "checkpoint": True}, "write notes.txt: hello")
    events = world.wait_for(agent, lambda evs: events_of(evs, "agent.checkpointed"), "a checkpoint")
    data = world.server.data_dir
    assert _mode(data) == 0o700
    for name in ("alineo.sqlite3", "secret_key"):
        assert _mode(data / name) & 0o077 == 0, name
    checkpoint = next((data / "checkpoints" / agent).glob("*.tar.zst"))
    assert _mode(checkpoint) & 0o077 == 0
    assert events[-1]["type"] in ("agent.checkpointed", "turn.finished", "hook.verdict") or events


def test_another_local_user_can_neither_read_the_database_nor_drive_a_bridge(world):
    agent = world.spawn({"model": "demo"}, "say: ready")
    world.wait_turns(agent, 1)
    data = world.server.data_dir
    sock = data / "run" / agent / "bridge.sock"
    assert sock.exists()
    if os.geteuid() == 0:  # the control plane and the bridge share a uid: the socket is 0600
        assert _mode(sock) == 0o600 and _mode(sock.parent) == 0o700
    read = _as_nobody(f"open({str(data / 'alineo.sqlite3')!r}, 'rb').read(16)")
    assert read.returncode != 0 and "PermissionError" in read.stderr, read
    drive = _as_nobody(
        "import socket\ns = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({str(sock)!r})\n"
        "s.sendall(b'{\"op\": \"prompt\", \"id\": 1, \"text\": \"run: id\"}\\n')\n"
        "print(s.recv(1000))\n")
    assert drive.returncode != 0 and "PermissionError" in drive.stderr, drive
    assert world.events(agent)[-1]["type"] != "turn.started"  # nothing was prompted


def test_a_data_dir_an_older_release_left_readable_is_made_private_at_start(tmp_path):
    server = LiveServer()
    server.migrate()
    data = server.data_dir
    data.chmod(0o755)
    for name in ("alineo.sqlite3", "secret_key"):
        if (data / name).exists():
            (data / name).chmod(0o644)
    old = data / "checkpoints" / "ag_old"
    old.mkdir(parents=True)
    (old / "sb-turn-1.tar.zst").write_bytes(b"x")
    (old / "sb-turn-1.tar.zst").chmod(0o644)
    with server:
        assert _mode(data) == 0o700
        assert _mode(old / "sb-turn-1.tar.zst") == 0o600 and _mode(old) == 0o700
        assert _mode(data / "alineo.sqlite3") == 0o600
