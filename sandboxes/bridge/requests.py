"""Questions the bridge asks the control plane (spawn a child, read/write memory).

A tool emits `request.spawn` / `request.memory` with a request id and blocks
until the control plane answers with the `reply` op, the wait times out, or
the turn is aborted. Pending requests live in memory only: after a restart
their tool calls are closed as interrupted and a late reply is refused.
"""

from __future__ import annotations

import threading
from typing import Callable

from .cancel import CancelToken


class RequestFailed(Exception):
    """The control plane answered with an error, or did not answer in time."""


class _Slot:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result = None
        self.error = None


class Requests:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}

    def ask(self, request_id: str, emit: Callable[[], None], *, cancel: CancelToken,
            timeout: float):
        """Register, emit (through ``emit``), and wait for the reply's result."""
        slot = _Slot()
        with self._lock:
            self._slots[request_id] = slot
        unregister = cancel.on_cancel(slot.done.set)
        try:
            emit()
            if not slot.done.wait(timeout):
                raise RequestFailed(f"no reply from the control plane within {timeout:g} s")
            cancel.check()
            if slot.error is not None:
                raise RequestFailed(_message(slot.error))
            return slot.result
        finally:
            unregister()
            with self._lock:
                self._slots.pop(request_id, None)

    def reply(self, request_id: str, result=None, error=None) -> bool:
        """Deliver an answer; False when no tool waits for this request id."""
        with self._lock:
            slot = self._slots.get(request_id)
        if slot is None or slot.done.is_set():
            return False
        slot.result, slot.error = result, error
        slot.done.set()
        return True

    def pending(self) -> list[str]:
        with self._lock:
            return sorted(self._slots)


def _message(error) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or error)
    return str(error)

