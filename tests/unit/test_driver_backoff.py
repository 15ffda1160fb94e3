"""A bridge that answers and drops at once (one that cannot start a thread
under its memory limit did) must not turn the driver's recovery into a busy
loop: quick losses back off 0.1 s, 0.2 s … up to RECOVER_BACKOFF_MAX_S, and a
loss long after the last recovery recovers at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from sessions.worker import driver as driver_mod


@pytest.fixture
def delays(monkeypatch):
    slept: list[float] = []

    async def fake_sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(driver_mod.asyncio, "sleep", fake_sleep)
    return slept


def test_quick_losses_back_off_and_a_late_one_does_not(delays):
    d = driver_mod.AgentDriver.__new__(driver_mod.AgentDriver)
    d.agent_id, d.quick_losses, d.recovered_at = "ag_x", 0, float("-inf")
    run = asyncio.run
    run(d._back_off())
    assert delays == []  # the first loss: recover at once
    for _ in range(8):
        d.recovered_at = time.monotonic()  # recovered, and lost again right away
        run(d._back_off())
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    d.recovered_at = time.monotonic() - driver_mod.QUICK_LOSS_S - 1  # it served a while
    run(d._back_off())
    assert len(delays) == 8 and d.quick_losses == 0
