"""SSE across processes: two web processes (`manage.py serve --role web`) on one
PostgreSQL database and one Redis. A stream opened on one process gets the
commits made through the other — and those made by a third process (this
test's own journal appends) — promptly, in order, with no gap and no duplicate.

The servers' heartbeat (the streams' safety re-read) is set to 300 s, so only
the Redis wake-ups can deliver within the deadline here.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid

import httpx
import pytest

from sessions import journal
from sessions.models import Command
from tests.live import SSEStream

pytestmark = pytest.mark.django_db(transaction=True)

SERVER_ENV = {"ALINEO_SSE_HEARTBEAT_S": "300"}
# A wake-up through Redis takes milliseconds; a missed one waits for the 300 s
# heartbeat. 30 s tells the two apart with a margin for two busy cores.
PROMPT_WITHIN_S = 30.0


class Collector(threading.Thread):
    """Reads one stream in the background, noting when each seq arrived."""

    def __init__(self, url: str, token: str):
        super().__init__(daemon=True)
        self.stream = SSEStream(url, {"Authorization": f"Bearer {token}"}, timeout=60)
        assert self.stream.status == 200, self.stream.body()
        self.seqs: list[int] = []
        self.arrived: dict[int, float] = {}
        self.error: BaseException | None = None
        self.changed = threading.Condition()

    def run(self) -> None:
        try:
            while True:
                event = self.stream.next_event(timeout=60)
                record = event.json()
                assert int(event.id) == record["seq"]
                with self.changed:
                    self.seqs.append(record["seq"])
                    self.arrived[record["seq"]] = time.monotonic()
                    self.changed.notify_all()
        except BaseException as exc:  # noqa: BLE001 - closed by the test, or reported
            self.error = exc

    def wait_for(self, seq: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while seq not in self.arrived:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True

    def close(self) -> None:
        # The reader may stay blocked in recv until the server goes (the
        # fixture stops it); it is a daemon thread and owns nothing else.
        self.stream.close()
        self.join(1)


def _prompt(base: str, agent_id: str, token: str, text: str) -> int:
    """POST a prompt through one web process; returns the seq of its last fact."""
    response = httpx.post(
        f"{base}/api/agents/{agent_id}/prompt", json={"text": text},
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())}, timeout=30,
    )
    assert response.status_code == 202, response.text
    return journal.head(agent_id)


def test_a_stream_on_one_web_process_sees_commits_made_through_another(agent, owner_token, web_server):
    a = web_server(SERVER_ENV)
    b = web_server(SERVER_ENV)
    journal.append(agent.id, "operator.note", {"text": "before the stream"})  # the backlog
    on_a = Collector(f"{a.url}/api/agents/{agent.id}/stream", owner_token)
    on_b = Collector(f"{b.url}/api/agents/{agent.id}/stream?after=0", owner_token)
    on_a.start()
    on_b.start()
    latencies: list[float] = []
    try:
        assert on_a.wait_for(1, 10) and on_b.wait_for(1, 10), "the backlog did not arrive"
        for i in range(12):
            # Alternate: a prompt through web process B, a journal append in this (third) process.
            if i % 2 == 0:
                head = _prompt(b.url, agent.id, owner_token, f"prompt {i}")
            else:
                head = journal.append(agent.id, "operator.note", {"text": f"note {i}"}).seq
            committed = time.monotonic()
            assert on_a.wait_for(head, PROMPT_WITHIN_S), (
                f"seq {head} did not reach the stream on A within {PROMPT_WITHIN_S} s "
                f"(A got {on_a.seqs[-3:]}); A's log:\n{a.log()[-3000:]}")
            latencies.append(on_a.arrived[head] - committed)
            assert on_b.wait_for(head, PROMPT_WITHIN_S), f"seq {head} did not reach the stream on B"

        # Then everything at once: prompts through B and appends here, concurrently.
        errors: list[BaseException] = []

        def prompts() -> None:
            try:
                for i in range(10):
                    _prompt(b.url, agent.id, owner_token, f"burst {i}")
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        def notes() -> None:
            try:
                for i in range(20):
                    journal.append(agent.id, "operator.note", {"text": f"burst note {i}"})
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                from django.db import connection

                connection.close()

        threads = [threading.Thread(target=prompts), threading.Thread(target=notes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        head = journal.head(agent.id)
        assert on_a.wait_for(head, PROMPT_WITHIN_S) and on_b.wait_for(head, PROMPT_WITHIN_S), (
            f"head {head}: A got up to {on_a.seqs[-1:]}, B up to {on_b.seqs[-1:]}")
    finally:
        on_a.close()
        on_b.close()

    for name, got in (("A", on_a.seqs), ("B", on_b.seqs)):
        assert got == list(range(1, head + 1)), f"stream on {name}: gaps, duplicates or disorder"
    # The web role drives no agent: the prompts wait for a worker.
    assert Command.objects.filter(agent_id=agent.id, verb="prompt", state="pending").count() == 16
    print(f"cross-process delivery: p50 {statistics.median(latencies) * 1000:.1f} ms, "
          f"max {max(latencies) * 1000:.1f} ms over {len(latencies)} commits")
