"""Running a coroutine at once, without a task, when it does not wait.

An SSE write under daphne never waits (daphne hands the bytes to Twisted at
once), so a stream writes a commit's rows inline (:func:`step_at_once`) and
needs a task only when the write really waits (a test's slow client, another
server): measured here, 1,000 tasks cost 60-100 ms against 0.4 ms inline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Stepped:
    """A coroutine stepped by hand that stopped on `waiting_on`; `finish()` goes on with it."""

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting_on: Any):
        self.coro, self.waiting_on = coro, waiting_on

    async def finish(self) -> None:
        try:
            while True:
                await self._wait()
                try:
                    self.waiting_on = self.coro.send(None)
                except StopIteration:
                    return
        finally:
            self.coro.close()

    async def _wait(self) -> None:
        fut = self.waiting_on
        if fut is None:  # a bare yield (asyncio.sleep(0)): one turn of the loop
            await asyncio.sleep(0)
            return
        # The coroutine awaited this future itself: it takes the result (or the
        # exception) when resumed, so only wait for it to be done here.
        fut._asyncio_future_blocking = False
        await asyncio.wait([fut])


def step_at_once(coro: Coroutine[Any, Any, Any]) -> Stepped | None:
    """Run `coro` until it first waits. None: it has finished (its exception,
    if any, is raised here). Else the :class:`Stepped` rest, to finish in a task."""
    try:
        waiting_on = coro.send(None)
    except StopIteration:
        return None
    except BaseException:
        coro.close()
        raise
    return Stepped(coro, waiting_on)
