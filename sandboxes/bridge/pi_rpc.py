"""Pi as a child process: ``pi --mode rpc --session <file>``, JSON lines both ways.

Pi is pointed at the model gateway through its own config dir
(``PI_CODING_AGENT_DIR``, in the home so a turn checkpoint carries it):
``models.json`` names one provider, ``alineo``, whose base URL is the
bridge's forwarder (its port changes with every bridge start, so the file is
written at every start) and whose key is the gateway's placeholder.
``PI_OFFLINE=1`` and ``--provider``/``--model`` always (Pi's default provider
is remote). Framing is LF only (JSON strings may hold U+2028).

Pi's own tool processes lead process groups of their own; closing Pi's
stdin ends Pi at once (also when the bridge is killed: the pipe closes).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger("bridge")

PROVIDER = "alineo"
MODEL_ID = "gateway"   # the gateway ignores the model a harness names: the spec chooses
PI_TOOLS = ("bash", "read", "write", "edit")
#: The directory in the home that holds Pi's config and session file.
PI_DIR = ".alineo/pi"
SESSION_FILE = "session.jsonl"
MAX_LINE = 64 * 1024 * 1024


@dataclass(frozen=True)
class PiCommand:
    node: str
    cli: str
    home: str
    base_url: str          # http://127.0.0.1:<port>/v1, the forwarder
    api_key: str           # the gateway's placeholder, never a credential
    label: str             # the spec's model, for Pi's display only
    tools: tuple[str, ...]
    env: dict

    @property
    def agent_dir(self) -> Path:
        return Path(self.home) / PI_DIR / "agent"

    @property
    def session_path(self) -> Path:
        return Path(self.home) / PI_DIR / SESSION_FILE

    def write_models(self) -> None:
        models = {"providers": {PROVIDER: {
            "baseUrl": self.base_url, "api": "openai-completions", "apiKey": self.api_key,
            "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
            "models": [{"id": MODEL_ID, "name": self.label[:200], "reasoning": False,
                        "input": ["text"], "contextWindow": 128000, "maxTokens": 8192,
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}]}}}
        self.agent_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.agent_dir / ".models.json.tmp"
        tmp.write_text(json.dumps(models, indent=1))
        os.replace(tmp, self.agent_dir / "models.json")

    def argv(self) -> list[str]:
        # Without the trap handler V8 reserves no ~10 GB of address space per
        # WebAssembly instance (undici's HTTP parser): under the local
        # sandbox's RLIMIT_AS (its memory_mb) Pi's first fetch would fail.
        return [self.node, "--disable-wasm-trap-handler", self.cli, "--mode", "rpc", "--provider", PROVIDER, "--model", MODEL_ID,
                "--session", str(self.session_path), "--tools", ",".join(self.tools)]

    def environ(self) -> dict:
        return {**self.env, "HOME": self.home, "PI_OFFLINE": "1",
                "PI_CODING_AGENT_DIR": str(self.agent_dir)}


class PiProcess:
    """One running Pi: write commands, a reader thread hands each event on."""

    def __init__(self, command: PiCommand, log_path: str,
                 on_event: Callable[["PiProcess", dict], None],
                 on_exit: Callable[["PiProcess", int | None], None]):
        command.write_models()
        command.session_path.parent.mkdir(parents=True, exist_ok=True)
        self._write_lock = threading.Lock()
        with open(log_path, "ab") as err:
            self.proc = subprocess.Popen(
                command.argv(), cwd=command.home, env=command.environ(), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        self._on_event, self._on_exit = on_event, on_exit
        self._reader = threading.Thread(target=self._read, name="pi-reader", daemon=True)
        self._reader.start()
        log.info("pi started (pid %d): %s", self.proc.pid, " ".join(command.argv()[3:]))

    def send(self, message: dict) -> bool:
        """Write one command; False when Pi is gone (its exit is reported)."""
        line = json.dumps(message, ensure_ascii=False).encode() + b"\n"
        with self._write_lock:
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, ValueError, OSError):
                return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 5.0) -> None:
        """Close stdin (Pi ends at once), then kill what is left."""
        with self._write_lock:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def _read(self) -> None:
        out = self.proc.stdout
        for raw in iter(lambda: out.readline(MAX_LINE), b""):
            if not raw.endswith(b"\n") and len(raw) >= MAX_LINE:
                log.warning("pi wrote a line over %d bytes: dropped", MAX_LINE)
                continue
            try:
                event = json.loads(raw)
            except ValueError:
                log.warning("pi wrote a line that is not JSON: %r", raw[:200])
                continue
            if isinstance(event, dict):
                try:
                    self._on_event(self, event)
                except Exception:  # noqa: BLE001 - one bad event must not stop the reader
                    log.exception("handling pi's %r event failed", event.get("type"))
        self._on_exit(self, self.proc.wait())


def text_of(content) -> str:
    """The text blocks of a Pi message's content (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(b.get("text", "") for b in content
                   if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))


def tool_calls_of(content) -> list[dict]:
    if not isinstance(content, list):
        return []
    return [{"id": str(b.get("id") or ""), "name": str(b.get("name") or ""),
             "input": b.get("arguments") if isinstance(b.get("arguments"), dict) else {}}
            for b in content if isinstance(b, dict) and b.get("type") == "toolCall"]


def exit_code_of(output: str, is_error: bool) -> int:
    """Pi's bash result ends with "Command exited with code N" when N != 0."""
    marker = "Command exited with code "
    at = output.rfind(marker)
    if at >= 0:
        digits = output[at + len(marker):].strip().split()[0:1]
        if digits and digits[0].lstrip("-").isdigit():
            return int(digits[0])
    return 1 if is_error else 0
