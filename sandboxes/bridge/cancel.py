"""A cancel token shared by a turn, its model call and its tools.

`abort` must end a turn *now*, while the runner thread may be blocked in a
socket read or a subprocess wait: whoever blocks registers how to unblock
itself (close the connection, kill the process group) and `cancel()` runs it.
"""

from __future__ import annotations

import threading
from typing import Callable


class Cancelled(Exception):
    """The turn was aborted (or the bridge is shutting down)."""


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.reason = ""

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            _quietly(cb)

    def on_cancel(self, cb: Callable[[], None]) -> Callable[[], None]:
        """Run ``cb`` on cancel (at once if already cancelled). Returns an
        unregister function, to call when the blocking operation is over."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(cb)
                return lambda: self._discard(cb)
        _quietly(cb)
        return lambda: None

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled(self.reason)

    def _discard(self, cb) -> None:
        with self._lock:
            if cb in self._callbacks:
                self._callbacks.remove(cb)


def _quietly(cb) -> None:
    # A callback racing a finished operation (socket already closed, process
    # already reaped) fails harmlessly; cancellation itself must not fail.
    try:
        cb()
    except Exception:  # noqa: BLE001
        pass
