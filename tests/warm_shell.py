"""A warm `manage.py shell` for a LiveServer's database (tests/live.py).

Each ``LiveServer.django()`` call used to start ``manage.py shell``: a new
Python and a new Django, ~1.5 s of CPU each, a few hundred times a run. A
WarmShell starts that process once per server and hands it each snippet over
a pipe. It is still another process than the server (a commit there is one the
server must notice, as before), and it closes its database connections after
every snippet: a test may swap, restore or break the database file between
two calls, and a kept connection would go on reading the old one.
"""

from __future__ import annotations

import json
import select
import subprocess
import threading
from pathlib import Path

#: Runs in the shell's process: one JSON request a line on stdin, one JSON
#: answer a line on the real stdout; what a snippet prints goes to a buffer.
LOOP = r"""
import contextlib, io, json, os, sys, traceback
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alineo_site.settings")
import django
django.setup()
from django.db import connections
answers = sys.stdout
for line in sys.stdin:
    request = json.loads(line)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            scope = {"__name__": "__warm_shell__"}
            exec(request["code"], scope)
        answer = {"result": scope.get("result"), "printed": printed.getvalue()}
    except BaseException:
        answer = {"error": traceback.format_exc(), "printed": printed.getvalue()}
    finally:
        connections.close_all()
    answers.write(json.dumps(answer) + "\n")
    answers.flush()
"""


class ShellError(RuntimeError):
    """The snippet raised in the shell (its traceback is the message)."""


class WarmShell:
    """One long-lived shell process; :meth:`run` is serialised by a lock."""

    def __init__(self, python: str, root: Path, env: dict[str, str]):
        self.key = (str(root), tuple(sorted(env.items())))
        self.proc = subprocess.Popen(
            [python, "-c", LOOP], cwd=root, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, code: str, timeout: float = 120):
        """``code``'s ``result`` (JSON-able); :class:`ShellError` when it raised,
        or gave no answer within ``timeout`` (then the process is ended)."""
        with self.lock:
            if not self.alive():
                raise ShellError(f"the warm shell exited with {self.proc.returncode}")
            self.proc.stdin.write(json.dumps({"code": code}) + "\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise ShellError(f"the warm shell gave no answer (exit status {self.proc.poll()})")
        answer = json.loads(line)
        if "error" in answer:
            raise ShellError(answer["error"])
        return answer["result"]

    def close(self) -> None:
        """End the process (ours, by its PID: closing stdin ends its loop)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
