"""The backend of a machine that has none: no Docker engine answers and
bubblewrap cannot run (``ALINEO_SANDBOX=auto``). The server still serves —
transcripts, checkpoints, the dashboard — but every sandbox call raises
BackendUnavailable with the reason, spawning is refused (sessions/specs.py
``check_available``) and ``manage.py check`` says why (sessions/checks.py)."""

from __future__ import annotations

from sandboxes.backends.base import SandboxBackend, SandboxStatus
from sandboxes.errors import BackendUnavailable


class UnavailableBackend(SandboxBackend):
    name = "none"

    def __init__(self, reason: str):
        self.reason = reason

    def unavailable_reason(self) -> str | None:
        return self.reason

    def _refuse(self, *args, **kwargs):
        raise BackendUnavailable(self.reason)

    create = start = exec = read_home = write_home = commit = stop = remove = _refuse
    home = remove_image = list = _refuse  # list too: an empty list would read as "all gone"

    def status(self, sandbox_id: str) -> SandboxStatus:
        return SandboxStatus.UNKNOWN

    def image_exists(self, image: str) -> bool:
        return False
