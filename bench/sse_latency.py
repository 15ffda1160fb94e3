#!/usr/bin/env python
"""SSE: append -> receive latency p50/p99 with 1,000 idle streams open on one
daphne, against the same measurement with no idle stream, and what the idle
streams cost the server (RSS and threads, read from /proc/PID/status).

One real server process (tests/live.py's LiveServer: `manage.py serve`, daphne
and the worker on one loop, 127.0.0.1, a fresh migrated temp data dir), one
client process using raw asyncio sockets (bench/_sse_client.py).

Phases, in one run:
  A. 1 watcher stream, no idle stream: POST /api/agents/{id}/prompt, one at
     a time; for each, the latency until the watcher receives that fact
     (matched by the seq the 202 returns). Baseline latency.
  B. Open 1,000 idle streams on 50 other agents (20 each); server RSS and
     Threads before and after. Same latency loop as A with them open, after
     8 prompts that absorb the one-off re-read of every newly opened stream
     (their max is printed).
  C. Close the idle streams; the latency loop once more (pooled with A as
     the baseline) and RSS/threads after close.
  D. (reference) a commit from another process (`manage.py note`) reaching
     the watcher through the data_version watcher.

Latency "append -> receive" is receive wall-clock time minus the fact's `ts`
(the server's clock when the journal wrote the row, before its commit), so it
covers commit, wake-up, the stream's re-read and delivery; the same machine
gives both clocks. POST -> receive (client clock only) is printed too.

Targets: p99 <= 50 ms with 1,000 idle streams (p50 is info, its ratio to the
no-idle p50 shown); <= 50 KB RSS per idle stream; no thread per stream
(threads added <= 4, whatever the stream count).

File descriptors: 1,000 streams are ~1,000 sockets in this process and as many
in the server (which inherits the limit); the soft RLIMIT_NOFILE is raised to
the hard limit when it is below 4,096, and the bench refuses to start if even
the hard limit is too low.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _common as C  # noqa: E402
from bench._sse_client import Stream, http_post  # noqa: E402

IDLE = 1000
IDLE_AGENTS = 50
TARGET_P99_MS = 50.0
TARGET_KB = 50.0
TARGET_THREADS = 4
DEADLINE_S = 420.0  # a loaded 2-core machine (load 14) needed more than 240 s


# --- /proc ------------------------------------------------------------------------------

def proc_status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


async def quiesce(pid: int, timeout: float = 15.0) -> float:
    """Wait until the server has gone idle (< 3 CPU ticks in 0.3 s): opening 1,000
    streams queues as many backlog reads, and we measure the idle steady state."""
    t0 = time.time()
    last = cpu_ticks(pid)
    while time.time() - t0 < timeout:
        await asyncio.sleep(0.3)
        now = cpu_ticks(pid)
        if now - last < 3:
            return time.time() - t0
        last = now
    return time.time() - t0


async def settled_status(pid: int, samples: int = 5, gap: float = 0.2) -> dict[str, float]:
    await quiesce(pid)
    rows = []
    for _ in range(samples):
        rows.append(proc_status(pid))
        await asyncio.sleep(gap)
    return {k: C.median([r[k] for r in rows]) for k in rows[0]}


def parse_ts(ts: str) -> float:
    from datetime import datetime, timezone

    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


async def latency_loop(port, token, agent_id, watcher: Stream, n: int, label: str) -> tuple[list, list]:
    """n prompts one at a time; returns (append->receive ms, POST->receive ms)."""
    commit_lat, post_lat = [], []
    latency_loop.acked = getattr(latency_loop, "acked", {})
    acked = latency_loop.acked.setdefault(label, [])
    for i in range(n):
        t_send = time.time()
        status, body = await http_post(port, f"/api/agents/{agent_id}/prompt", token, {"text": f"{label} {i}"})
        if status != 202 or "seq" not in body:
            raise RuntimeError(f"prompt answered {status}: {body}")
        t_resp = time.time()
        t_recv = await asyncio.wait_for(watcher.wait_for(body["seq"]), 10)
        _, data = watcher.received[body["seq"]]
        commit_lat.append((t_recv - parse_ts(data["ts"])) * 1000)
        acked.append((t_resp - parse_ts(data["ts"])) * 1000)
        if os.environ.get("BENCH_DEBUG") and commit_lat[-1] > 50:
            print(f"slow {label} {i}: ts->recv {commit_lat[-1]:.0f} ms, ts->202 {(t_resp - parse_ts(data['ts'])) * 1000:.0f}"
                  f" ms, send->202 {(t_resp - t_send) * 1000:.0f} ms, send->ts {(parse_ts(data['ts']) - t_send) * 1000:.0f} ms",
                  file=sys.stderr)
        post_lat.append((t_recv - t_send) * 1000)
        await asyncio.sleep(random.uniform(0.015, 0.035))
    return commit_lat, post_lat


async def open_many(port, token, agents: list[str], count: int) -> list[Stream]:
    streams = [Stream(port, agents[i % len(agents)], token, after=0) for i in range(count)]
    for k in range(0, count, 25):  # 25 at a time: a burst of opens, not a thundering herd
        await asyncio.gather(*(s.open() for s in streams[k:k + 25]))
    return streams


def cross_process_note(live, agent_id: str, watcher: Stream, n: int) -> list[float]:
    """`manage.py note` from another process; ms from its commit (`ts`) to receipt."""
    out = []
    for i in range(n):
        seq = live.note(agent_id, f"note {i}")
        deadline = time.time() + 10
        while seq not in watcher.received and time.time() < deadline:
            time.sleep(0.005)
        if seq in watcher.received:
            t_recv, data = watcher.received[seq]
            out.append((t_recv - parse_ts(data["ts"])) * 1000)
    return out


@dataclass
class Measured:
    """What phases A-D (the module doc) measured: ms per prompt, /proc readings of the server."""

    n: int  # prompts in phase B
    commit: dict[str, list[float]] = field(default_factory=dict)  # phase -> append->receive ms
    post: dict[str, list[float]] = field(default_factory=dict)  # phase -> POST->receive ms
    cpu: dict[str, tuple[float, float]] = field(default_factory=dict)  # phase -> CPU s per prompt, server/client
    burst: list[float] = field(default_factory=list)  # the first prompts after the idle streams opened
    before: dict[str, float] = field(default_factory=dict)  # settled_status() with no idle stream,
    during: dict[str, float] = field(default_factory=dict)  # with them all open,
    after_close: dict[str, float] = field(default_factory=dict)  # and after they closed
    open_s: float = 0.0
    settle_s: float = 0.0
    alive: int = 0
    notes: list[float] = field(default_factory=list)  # phase D


def make_agents(live, actor) -> list[str]:
    """The watched agent and the idle streams' agents, made in the server's database."""
    return live.django(
        "from django.contrib.auth import get_user_model\n"
        "from sessions.models import Agent, Workspace\n"
        f"user = get_user_model().objects.get(pk={actor.user_id})\n"
        f"ws = Workspace.objects.get(name={actor.workspace!r})\n"
        f"result = [Agent.objects.create(workspace=ws, created_by=user, spec={{'model': 'demo'}}).id "
        f"for _ in range({IDLE_AGENTS + 1})]\n"
    )


class Watched:
    """The watched agent and its watcher stream on one live server, and the idle streams' agents."""

    def __init__(self, live, token: str, ids: list[str]):
        self.pid, self.port, self.token = live.pid, live.port, token
        self.agent, self.idle_agents = ids[0], ids[1:]
        self.watcher = Stream(self.port, self.agent, token, after=0)

    async def prompts(self, count: int, label: str) -> tuple[list, list]:
        return await latency_loop(self.port, self.token, self.agent, self.watcher, count, label)

    async def phase(self, m: Measured, count: int, label: str) -> None:
        """prompts() into m's latencies of phase `label`, with the server's and
        the client's CPU seconds per prompt: where the time goes."""
        s0, c0 = cpu_ticks(self.pid), time.process_time()
        m.commit[label], m.post[label] = await self.prompts(count, label)
        m.cpu[label] = ((cpu_ticks(self.pid) - s0) / os.sysconf("SC_CLK_TCK") / count,
                        (time.process_time() - c0) / count)

    async def warm_up(self) -> None:
        """Code paths, the first DB connections, a few opens and closes."""
        await self.prompts(10, "warm")
        warm = await open_many(self.port, self.token, self.idle_agents, 20)
        await asyncio.sleep(0.3)
        for s in warm:
            await s.close()

    async def with_idle(self, m: Measured) -> None:
        """Phase B: open the idle streams, measure with them open, close them."""
        m.before = await settled_status(self.pid)
        t0 = time.time()
        idle = await open_many(self.port, self.token, self.idle_agents, IDLE)
        m.open_s = time.time() - t0
        m.settle_s = await quiesce(self.pid)
        m.during = await settled_status(self.pid)
        # The first commits after a burst of subscriptions are a one-off: the
        # data_version watcher counts every newly watched agent as moved once, so
        # all the idle streams re-read together. Measured here, kept out of B.
        m.burst, _ = await self.prompts(8, "B-first")
        await quiesce(self.pid)
        await self.phase(m, m.n, "B")
        m.alive = sum(1 for s in idle if s.task and not s.task.done())
        for s in idle:
            await s.close()
        m.after_close = await settled_status(self.pid)


async def run(live, quick: bool) -> list[dict]:
    m = Measured(n=60 if quick else 200)  # 200 samples: p99 is not just the single slowest one
    nb = 30 if quick else 60
    actor = live.create_actor("bencher")
    # IDLE streams of one user: above the default quota
    # (docs/SECURITY.md#children-approvals-and-quotas).
    live.set_quotas(actor, max_streams_per_user=IDLE + 32)
    w = Watched(live, actor.token, make_agents(live, actor))
    await w.watcher.open()
    await w.warm_up()
    await w.phase(m, nb, "A")
    await w.with_idle(m)
    await w.phase(m, nb, "C")
    await asyncio.sleep(0)  # let the watcher drain
    m.notes = await asyncio.get_running_loop().run_in_executor(
        None, cross_process_note, live, w.agent, w.watcher, 3 if quick else 5)
    await w.watcher.close()
    return latency_rows(m) + cost_rows(m) + note_rows(m)


def latency_detail(m: Measured) -> str:
    b_commit, b_post, cpu = m.commit["B"], m.post["B"], m.cpu
    base_commit, base_post = m.commit["A"] + m.commit["C"], m.post["A"] + m.post["C"]
    return (
        f"{m.n} prompts with {IDLE} idle streams open, {len(base_commit)} with none (before and after); "
        f"p90 {C.pct(b_commit, 90):.1f} ms (none: {C.pct(base_commit, 90):.1f}), slowest "
        f"{', '.join(f'{x:.0f}' for x in sorted(b_commit)[-3:])} ms; "
        f"POST->receive p50/p99 {C.pct(b_post, 50):.1f}/{C.pct(b_post, 99):.1f} ms "
        f"(none: {C.pct(base_post, 50):.1f}/{C.pct(base_post, 99):.1f}); the 202 reached the client "
        f"{C.pct(latency_loop.acked['B'], 50):.1f} ms (p50) after `ts`; {m.alive}/{IDLE} idle streams still open "
        f"at the end; the first 8 prompts after the {IDLE} opened (kept out, one-off re-read of every new "
        f"stream): max {max(m.burst):.0f} ms; CPU per prompt, server/client: {cpu['B'][0] * 1000:.1f}/"
        f"{cpu['B'][1] * 1000:.1f} ms with {IDLE} idle, {cpu['A'][0] * 1000:.1f}/{cpu['A'][1] * 1000:.1f} and "
        f"{cpu['C'][0] * 1000:.1f}/{cpu['C'][1] * 1000:.1f} ms with none (before/after); load average "
        f"{os.getloadavg()[0]:.2f} at the end"
    )


def latency_rows(m: Measured) -> list[dict]:
    base_commit = m.commit["A"] + m.commit["C"]
    p50, p99 = C.pct(m.commit["B"], 50), C.pct(m.commit["B"], 99)
    bp50, bp99 = C.pct(base_commit, 50), C.pct(base_commit, 99)
    return [
        C.row(
            f"sse: append->receive p50, {IDLE} idle streams vs none",
            p50, bp50, p50 / bp50 if bp50 else None, "info", "info", "ms",
            "baseline = the same loop with only the watcher stream open",
        ),
        C.row(
            f"sse: append->receive p99, {IDLE} idle streams vs none",
            p99, bp99, p99 / bp99 if bp99 else None, f"<= {TARGET_P99_MS:.0f} ms", p99 <= TARGET_P99_MS, "ms",
            latency_detail(m),
        ),
    ]


def cost_rows(m: Measured) -> list[dict]:
    before, during, after_close = m.before, m.during, m.after_close
    kb = (during["VmRSS"] - before["VmRSS"]) / IDLE
    threads_added = during["Threads"] - before["Threads"]
    fds_added = during["fds"] - before["fds"]
    return [
        C.row(
            f"sse: RSS per idle stream ({IDLE})",
            kb, before["VmRSS"] / 1024, None, f"<= {TARGET_KB:.0f} KB", kb <= TARGET_KB, "",
            f"KB per stream; baseline = server RSS in MB with 1 stream; RSS {before['VmRSS'] / 1024:.1f} -> "
            f"{during['VmRSS'] / 1024:.1f} MB with {IDLE} idle, {after_close['VmRSS'] / 1024:.1f} MB after they "
            f"closed; {IDLE} streams opened in {m.open_s:.2f} s, server busy {m.settle_s:.1f} s more; fds +{fds_added:.0f}",
        ),
        C.row(
            "sse: threads added by idle streams",
            threads_added, before["Threads"], None, f"<= {TARGET_THREADS} (none/stream)",
            threads_added <= TARGET_THREADS, "",
            f"server threads {before['Threads']:.0f} -> {during['Threads']:.0f} with {IDLE} idle streams -> "
            f"{after_close['Threads']:.0f} after close",
        ),
    ]


def note_rows(m: Measured) -> list[dict]:
    if not m.notes:
        return []
    p50 = C.pct(m.commit["B"], 50)
    return [
        C.row(
            "sse: other-process commit -> receive p50",
            C.median(m.notes), p50, C.median(m.notes) / p50 if p50 else None, "info", "info", "ms",
            f"`manage.py note` (a commit by another process, woken by the data_version watcher at "
            f"ALINEO_DATA_VERSION_POLL_S); runs {', '.join(f'{x:.0f}' for x in m.notes)} ms; baseline = "
            f"in-process p50 with {IDLE} idle",
        )
    ]


def raise_fd_limit(need: int) -> str:
    """Soft RLIMIT_NOFILE up to the hard limit (the server inherits it)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(max(need, soft), hard)
        if new < need:
            raise SystemExit(f"sse_latency: needs {need} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        return f"RLIMIT_NOFILE soft {soft} -> {new}"
    return f"RLIMIT_NOFILE soft {soft}"


def with_server(prefix: str, measure, deadline_s: float):
    """asyncio.run(measure(live)) against a fresh LiveServer in a fresh data dir,
    stopped (by PID) and removed afterwards; its log tail on stderr if it fails."""
    data_dir = C.make_data_dir(prefix, sockets=True)
    os.environ["ALINEO_DATA_DIR"] = str(data_dir)  # LiveServer makes its dirs under here
    os.environ.setdefault("ALINEO_LOG_LEVEL", "WARNING")
    os.environ.setdefault("ALINEO_SANDBOX", "local")
    from tests.live import LiveServer

    live = LiveServer(env={"ALINEO_LOG_LEVEL": "WARNING"})
    try:
        live.start()
        return asyncio.run(asyncio.wait_for(measure(live), deadline_s))
    except BaseException:
        sys.stderr.write(live.log()[-4000:])
        raise
    finally:
        live.stop()
        C.cleanup(data_dir)


def main() -> int:
    args = C.parser(__doc__.splitlines()[0]).parse_args()
    fd_note = raise_fd_limit(max(4096, 3 * IDLE + 512))
    rows = with_server("sse", lambda live: run(live, args.quick), DEADLINE_S)
    rows[-1]["note"] += f"; {fd_note}"
    C.emit(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
