"""Killing what a dead bridge left running.

A bash tool runs in its own session, so it survives a `kill -9` of the bridge.
The runner records its pid; a restarted bridge kills that process group, but
only after checking (via /proc) that the pid still belongs to the same tool
call, since pids are reused.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("bridge")


def kill_leftover(process: dict | None) -> bool:
    if not process:
        return False
    pid, call_id = process.get("pid"), process.get("tool_call_id")
    if not isinstance(pid, int) or not _is_tool_call(pid, call_id):
        return False
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        return False
    log.info("killed process group %d left running by tool call %s", pid, call_id)
    return True


def _is_tool_call(pid: int, call_id: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return False
    return f"ALINEO_TOOL_CALL_ID={call_id}".encode() in env
