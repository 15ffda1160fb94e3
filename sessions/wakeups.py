"""Wake-ups: payload-less "re-read after your cursor" messages to an agent's group.

A wake-up carries no rows: the database is the only source of events, so a
lost or duplicated wake-up can delay a stream but never corrupt it.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

WAKE_TYPE = "transcript.append"

# The event loop that serves streams in this process (daphne's). The in-memory
# channel layer is bound to it, so wake-ups from other threads are scheduled there.
_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def group_name(agent_id: str) -> str:
    return f"agent.{agent_id}"


def bind_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _loop
    with _lock:
        _loop = loop


def notify(agent_ids) -> None:
    """Wake every stream watching these agents. Call after commit; never raises."""
    layer = get_channel_layer()
    if layer is None:
        return
    ids = list(agent_ids)
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    loop = _loop
    if running is not None:
        running.create_task(_send(layer, ids))
    elif loop is not None and loop.is_running():
        asyncio.run_coroutine_threadsafe(_send(layer, ids), loop)
    elif not _is_in_memory(layer):
        from asgiref.sync import async_to_sync

        try:
            async_to_sync(_send)(layer, ids)
        except Exception:  # pragma: no cover - a wake-up is best effort
            log.exception("wake-up failed")


def _is_in_memory(layer) -> bool:
    return type(layer).__name__ == "InMemoryChannelLayer"


async def _send(layer, ids) -> None:
    for agent_id in ids:
        try:
            await layer.group_send(group_name(agent_id), {"type": WAKE_TYPE})
        except Exception:  # ChannelFull and friends: the stream's safety re-read covers it
            log.warning("wake-up for %s dropped", agent_id, exc_info=True)
