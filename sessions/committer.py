"""Group commit for the journal: one daemon thread per process writes what
concurrent callers append, many requests per transaction, so that
``synchronous=FULL`` costs one fsync per batch rather than per fact.
sessions.journal owns the writing; this module owns the hand-over."""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, IntegrityError

log = logging.getLogger("sessions.journal")


class _Request:
    """One caller's facts, waiting for the committer. `lock` is held until the
    request is done (committed or refused): the caller blocks on it alone, so a
    commit wakes exactly the callers it served."""

    __slots__ = ("agent_id", "done", "error", "items", "lock", "result")

    def __init__(self, agent_id: str, items: list):
        self.agent_id = agent_id
        self.items = items
        self.result: list | None = None  # the journal's EventRecords
        self.error: BaseException | None = None
        self.done = False
        self.lock = threading.Lock()
        self.lock.acquire()


class GroupCommitter:
    """Group commit by one daemon thread per process, with its own connection.

    Callers queue a request and block on the request's own lock. The thread
    takes everything queued, writes it in one transaction, and wakes exactly
    the callers it served.

    Measured (bench/append_throughput.py, 8 threads on 2 cores): the costly
    part is not SQLite but the GIL. With a leader elected among the callers,
    handing the lead over (notify_all wakes every waiter, each re-takes the
    condition's lock) cost more than the commit. With a committer thread that
    wakes its callers right after COMMIT, they run their Python while it
    issues BEGIN and the UPDATEs, and it waits for the GIL after each short
    statement (BEGIN alone went from 9 to ~130 µs). So a batch's callers are
    woken later: once the next batch is written, just before its COMMIT,
    whose fsync leaves the GIL to them. Their facts were committed already;
    they return one batch's write later (about 0.1 ms). With nothing queued
    they are woken at once.
    """

    IDLE_CLOSE_S = 1.0  # close the committer's connection after this long without work

    def __init__(self, *, commit_groups, translate, unwritable, committed, close_connection,
                 refused: tuple[type[BaseException], ...]) -> None:
        # The journal's own functions: write a batch in one transaction; turn a
        # database error into a JournalError; note an agent whose facts cannot
        # be written; announce what was committed ({agent_id: records}); drop the thread's connection.
        self._commit_groups = commit_groups
        self._translate = translate
        self._unwritable = unwritable
        self._committed = committed
        self._close_connection = close_connection
        self._refused = refused  # errors that fail a request, not the committer
        #: Called with the number of facts of each batch written (benchmarks count them).
        self.on_batch = None
        self.reset()

    def reset(self) -> None:
        """Start afresh: no queue, no thread (a forked child has no committer thread)."""
        self._mutex = threading.Lock()  # guards _queue, _idle, _thread
        self._queue: list[_Request] = []
        self._idle = False  # the committer sleeps on _wake (and _wake is held)
        self._wake = threading.Lock()
        self._wake.acquire()
        self._thread: threading.Thread | None = None
        # Committer thread only: the batch being written, and requests done
        # whose callers are not woken yet.
        self._inflight: list[_Request] = []
        self._finished: list[_Request] = []

    def submit(self, agent_id: str, items: list) -> list:
        req = _Request(agent_id, items)
        with self._mutex:
            self._queue.append(req)
            if self._idle:
                self._idle = False
                self._wake.release()
            elif self._thread is None:
                self._thread = threading.Thread(target=self._run, name="alineo-journal-committer", daemon=True)
                self._thread.start()
        req.lock.acquire()
        if req.error is not None:
            raise req.error
        return req.result  # type: ignore[return-value]

    def _run(self) -> None:
        while True:
            try:
                self._serve()
            except BaseException as exc:  # never leave a caller waiting, never die
                log.exception("journal committer failed")
                with self._mutex:
                    stranded, self._queue = self._queue, []
                inflight, self._inflight = self._inflight, []
                to_wake, self._finished = self._finished, []
                for req in inflight + stranded:
                    if not req.done:  # done ones were queued for waking or woken already
                        req.result, req.error, req.done = None, self._translate(exc), True
                        to_wake.append(req)
                for req in to_wake:
                    req.lock.release()
                self._close_connection()

    def _serve(self) -> None:
        while True:
            with self._mutex:
                batch, self._queue = self._queue, []
                if not batch and not self._finished:
                    self._idle = True
            if batch:
                self._inflight = batch
                self._commit(batch)
                self._inflight = []
            elif self._finished:
                self._wake_callers()  # nothing to overlap with: wake them now, then look again
            elif not self._wake.acquire(timeout=self.IDLE_CLOSE_S):
                self._close_connection()  # idle: don't hold a connection for nothing
                self._wake.acquire()

    def _wake_callers(self) -> None:
        finished, self._finished = self._finished, []
        for req in finished:
            req.lock.release()

    def _commit(self, batch: list[_Request]) -> None:
        """Write the batch in one transaction; on failure retry its requests one
        by one, so one bad request never fails the others. Sets each request's
        outcome; its caller is woken before the next COMMIT (or when idle)."""
        by_agent: dict[str, list[_Request]] = {}
        for req in batch:  # queue order is kept within each agent
            by_agent.setdefault(req.agent_id, []).append(req)
        groups = [(agent_id, [r.items for r in reqs]) for agent_id, reqs in by_agent.items()]
        if self.on_batch is not None:
            self.on_batch(sum(len(r.items) for r in batch))
        try:
            written = self._commit_groups(groups, self._wake_callers)
        except self._refused as exc:
            self._wake_callers()
            if isinstance(exc, (IntegrityError, DatabaseError)):
                self._close_connection()  # reopen a fresh one for the next transaction
            if len(batch) > 1:
                for req in batch:
                    self._commit([req])
                return
            req = batch[0]
            req.error = self._translate(exc)
            if getattr(req.error, "permanent", True) is False:  # JournalUnavailable
                self._unwritable(req.agent_id, exc)
        else:
            records = {}
            for agent_id, reqs, results in zip(by_agent, by_agent.values(), written):
                for req, result in zip(reqs, results):
                    req.result = result
                records[agent_id] = [rec for result in results for rec in result]
            self._committed(records)
        for req in batch:
            req.done = True
        self._finished.extend(batch)
