"""A real bridge subprocess and a client for its socket (used by conftest and tests).

Nothing here touches Django or the database: the bridge is a standard-library
program that runs inside sandboxes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SANDBOXES = Path(__file__).resolve().parents[3] / "sandboxes"
#: Upper bound for anything a test waits for; never an assertion on duration.
WAIT = 20.0


class BridgeClient:
    """Talks JSON lines to a bridge socket. One connection per call, like a
    control plane that comes and goes."""

    def __init__(self, sock_path: str):
        self.sock_path = sock_path
        self._id = 0

    def call(self, op: str, timeout: float = WAIT, **fields) -> dict:
        self._id += 1
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout + 35)  # events may long-poll up to 30 s
            s.connect(self.sock_path)
            s.sendall(json.dumps({"op": op, "id": self._id, **fields}).encode() + b"\n")
            reply = s.makefile("rb").readline()
        response = json.loads(reply)
        assert response["id"] == self._id
        return response

    def ok(self, op: str, **fields) -> dict:
        response = self.call(op, **fields)
        assert response["ok"], response
        return response

    def events(self, after: int = 0, wait: float = 0, **kw) -> list[dict]:
        return self.ok("events", after=after, wait=wait, **kw)["events"]

    def wait_for(self, predicate, after: int = 0, timeout: float = WAIT) -> list[dict]:
        """All events after ``after`` up to the first one matching ``predicate``."""
        seen: list[dict] = []
        deadline = time.monotonic() + timeout
        cursor = after
        while time.monotonic() < deadline:
            for event in self.events(cursor, wait=1):
                seen.append(event)
                cursor = event["bseq"]
                if predicate(event):
                    return seen
        raise AssertionError(f"timed out; events seen: {[e['type'] for e in seen]}")

    def wait_type(self, type_: str, after: int = 0, **match) -> list[dict]:
        return self.wait_for(lambda e: e["type"] == type_ and all(
            e["data"].get(k) == v for k, v in match.items()), after)

    def run_turn(self, text: str, after: int = 0, command_id: str | None = None) -> list[dict]:
        """Prompt and return the events up to the turn's settled end."""
        turn = self.ok("prompt", text=text, command_id=command_id)["turn"]
        return self.wait_for(lambda e: e["type"] in ("turn.finished", "turn.interrupted")
                             and e["data"]["turn"] == turn, after)


class Bridge:
    """A bridge subprocess on a run dir and a home dir."""

    def __init__(self, run_dir: str, home: str, env: dict | None = None):
        self.run_dir, self.home = run_dir, home
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.client = BridgeClient(os.path.join(run_dir, "bridge.sock"))

    def write_config(self, **config) -> None:
        Path(self.run_dir, "config.json").write_text(json.dumps(config))

    def argv(self, *extra: str) -> list[str]:
        # -S: no site-packages, so the bridge proves it needs the stdlib only.
        return [sys.executable, "-S", "-m", "bridge", "--run-dir", self.run_dir,
                "--home", self.home, *extra]

    def start(self, *extra: str) -> "Bridge":
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.home,
               "LANG": "C.UTF-8", **self.env}
        self.proc = subprocess.Popen(self.argv(*extra), cwd=SANDBOXES, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"bridge exited {self.proc.returncode}: "
                                     f"{self.proc.stderr.read().decode()}")
            try:
                self.client.call("status", timeout=2)
                return
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.05)
        raise AssertionError("bridge did not answer")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.client.call("shutdown", timeout=5)
            self.proc.wait(timeout=15)
        except Exception:  # noqa: BLE001 - fall back to the hard way
            self.proc.kill()
            self.proc.wait(timeout=WAIT)
        finally:
            self.proc.stderr.close()

    @property
    def session_file(self) -> Path:
        return Path(self.home, ".alineo", "session.json")

    def session(self) -> dict:
        return json.loads(self.session_file.read_text())

    def log_text(self) -> str:
        return Path(self.run_dir, "bridge.log").read_text()


def kill_tool_processes(home_root: str) -> None:
    """Kill, by pid, tool processes a killed bridge left behind under this test's dirs."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if cwd.startswith(home_root) and b"ALINEO_TOOL_CALL_ID=" in env:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]
