"""Spec hooks: shell commands run in the home dir at fixed points of a session.

    session_start  when the bridge starts (ALINEO_SESSION_START_SOURCE=startup|resume)
    pre_tool_use   before each tool call (ALINEO_TOOL_NAME, ALINEO_TOOL_INPUT as JSON,
                   ALINEO_TOOL_CALL_ID); a non-zero exit denies the call
    stop           after a turn finishes (ALINEO_TURN)

Each run is journaled as `hook.verdict` {hook, verdict, exit_code, output}.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass

HOOK_TIMEOUT = 60.0
MAX_HOOK_OUTPUT = 2000


@dataclass
class Verdict:
    hook: str
    verdict: str      # allow | deny (pre_tool_use), ok | failed (others)
    exit_code: int
    output: str

    def as_event(self, **extra) -> dict:
        return {"hook": self.hook, "verdict": self.verdict, "exit_code": self.exit_code,
                "output": self.output, **extra}


class Hooks:
    def __init__(self, config: dict, home: str, env: dict):
        self.commands = {k: v for k, v in (config or {}).items()
                         if isinstance(v, str) and v.strip()}
        self.home = home
        self.env = env

    def has(self, name: str) -> bool:
        return name in self.commands

    def run(self, name: str, extra_env: dict) -> Verdict:
        code, output = self._exec(self.commands[name], extra_env)
        if name == "pre_tool_use":
            verdict = "allow" if code == 0 else "deny"
        else:
            verdict = "ok" if code == 0 else "failed"
        return Verdict(name, verdict, code, output)

    def _exec(self, command: str, extra_env: dict) -> tuple[int, str]:
        env = {**self.env, "HOME": self.home, **extra_env}
        try:
            proc = subprocess.Popen(["bash", "-lc", command], cwd=self.home, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            return 127, f"hook could not start: {exc}"
        try:
            out, _ = proc.communicate(timeout=HOOK_TIMEOUT)
        except subprocess.TimeoutExpired:
            # Kill the whole group: the hook's children must not outlive it.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return 124, f"hook timed out after {HOOK_TIMEOUT:g} s"
        return proc.returncode, out.decode("utf-8", "replace")[-MAX_HOOK_OUTPUT:]
