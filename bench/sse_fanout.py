#!/usr/bin/env python
"""SSE fan-out: 200 and 1,000 streams on ONE agent, commit (`ts`) -> receipt
p50/p99 over every (stream, fact) pair, against django-eventstream's fan-out
case (200 and 1,000 clients on one channel) run in the same bench.

Ours: one real server (tests/live.py's LiveServer: `manage.py serve`, daphne
and the worker on one loop, 127.0.0.1, a fresh data dir), one client process
on raw asyncio sockets (bench/_sse_client.py). Each step POSTs a prompt
(500 bytes of text, as the peer's 500 bytes of padding) and waits until every
stream has its `command.prompt` fact; the turn the demo model runs adds its
own facts (about five per prompt), all measured. The peer: ../shared/peers/
eventstream_bench.py (django-eventstream 5.3 on daphne, SQLite), started by
this bench with the Python in BENCH_ES_PYTHON (default /tmp/es-venv/bin/python,
set up as peers/README.md says); without it the peer rows are skipped.

Targets (issue 14): p99 <= the peer's at 200 and at 1,000, and <= 50 ms at
1,000. Also: server RSS and threads per fan-out stream at 1,000.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _common as C  # noqa: E402
from bench._sse_client import Stream, http_post  # noqa: E402
from bench.sse_latency import parse_ts, proc_status, quiesce, raise_fd_limit, with_server  # noqa: E402

SIZES = (200, 1000)
TARGET_P99_MS = 50.0
DEADLINE_S = 420.0
PEERS = Path(os.environ.get("BENCH_PEERS_DIR", ROOT.parent / "shared" / "peers"))
PAD = "x" * 500


# --- ours -------------------------------------------------------------------------------

async def step(port: int, token: str, agent: str, streams: list[Stream], i: int) -> int:
    status, body = await http_post(port, f"/api/agents/{agent}/prompt", token, {"text": f"say: {i} {PAD}"})
    if status != 202 or "seq" not in body:
        raise RuntimeError(f"prompt answered {status}: {body}")
    await asyncio.wait_for(asyncio.gather(*(s.wait_for(body["seq"]) for s in streams)), 20)
    return body["seq"]


def latencies(streams: list[Stream], first: int, last: int) -> list[float]:
    out = []
    for s in streams:
        for seq, (t_recv, data) in s.received.items():
            if first <= seq <= last and "ts" in data:
                out.append((t_recv - parse_ts(data["ts"])) * 1000)
    return out


async def measure(live, token: str, agent: str, streams: list[Stream], steps: int) -> dict:
    await quiesce(live.pid)
    seqs = []
    for i in range(steps):
        seqs.append(await step(live.port, token, agent, streams, i))
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # the turns' trailing facts
    last = min(max(s.received) for s in streams)
    lat = latencies(streams, seqs[0], last)
    return {"n": len(lat), "facts": last - seqs[0] + 1, "p50": C.pct(lat, 50), "p99": C.pct(lat, 99),
            "max": max(lat), "missing": sum(1 for s in streams for q in range(seqs[0], last + 1)
                                            if q not in s.received)}


async def open_streams(port: int, token: str, agent: str, count: int) -> list[Stream]:
    streams = [Stream(port, agent, token) for _ in range(count)]
    for k in range(0, count, 25):
        await asyncio.gather(*(s.open() for s in streams[k:k + 25]))
    return streams


async def ours(live, steps: int) -> dict:
    actor = live.create_actor("fanout")
    live.set_quotas(actor, max_streams_per_user=max(SIZES) + 32)
    agent = live.django(
        "from django.contrib.auth import get_user_model\n"
        "from sessions.models import Agent, Workspace\n"
        f"user = get_user_model().objects.get(pk={actor.user_id})\n"
        f"ws = Workspace.objects.get(name={actor.workspace!r})\n"
        "result = Agent.objects.create(workspace=ws, created_by=user, spec={'model': 'demo'}).id\n")
    out: dict = {}
    warm = await open_streams(live.port, actor.token, agent, 5)
    for i in range(5):
        await step(live.port, actor.token, agent, warm, i)
    await asyncio.sleep(1.0)
    out["before"] = proc_status(live.pid)
    streams = warm
    for size in SIZES:
        streams += await open_streams(live.port, actor.token, agent, size - len(streams))
        out[size] = await measure(live, actor.token, agent, streams, steps)
        out[f"stat{size}"] = proc_status(live.pid)
    for s in streams:
        await s.close()
    return out


# --- the peer -------------------------------------------------------------------------------

def peer_python() -> str | None:
    py = os.environ.get("BENCH_ES_PYTHON", "/tmp/es-venv/bin/python")
    return py if Path(py).exists() and (PEERS / "eventstream_bench.py").exists() else None


def peer(clients: int, events: int) -> dict:
    py = peer_python()
    out = subprocess.run(
        [py, "eventstream_bench.py", "--clients", str(clients), "--events", "20", "--fan-events", str(events),
         "--missed", "50", "--deadline", "300"],
        cwd=PEERS, capture_output=True, text=True, timeout=400)
    if out.returncode:
        raise RuntimeError(f"eventstream_bench.py failed: {out.stderr[-2000:]}")
    return parse_peer(out.stdout)


def parse_peer(text: str) -> dict:
    fan = re.search(r"\(1b\) fan-out.*?\n\|---.*?\n\| ([\d.]+) \| ([\d.]+) \|", text, re.S)
    stats = re.search(r"\| \d+ fan-out clients, after \d+ events \| ([\d.]+) \| (\d+) \| (\d+) \|", text)
    if not fan:
        raise RuntimeError(f"cannot read the peer's fan-out row:\n{text[-2000:]}")
    res = {"p50": float(fan.group(1)), "p99": float(fan.group(2))}
    if stats:
        res.update(rss_mib=float(stats.group(1)), threads=int(stats.group(2)), fds=int(stats.group(3)))
    return res


# --- rows -------------------------------------------------------------------------------------

def rows(m: dict, peers: dict[int, dict], skipped: str) -> list[dict]:
    out = []
    for size in SIZES:
        r, p = m[size], peers.get(size)
        detail = (f"{r['n']} receipts ({r['facts']} facts x {size} streams), missing {r['missing']}, max "
                  f"{r['max']:.0f} ms; p50 {r['p50']:.1f} ms (peer {p['p50']:.1f} ms)" if p else skipped)
        target = f"<= peer{' and <= 50 ms' if size == 1000 else ''}"
        ok = p is not None and r["p99"] <= p["p99"] and (size != 1000 or r["p99"] <= TARGET_P99_MS)
        out.append(C.row(f"sse fan-out: {size} streams on one agent, p99 vs django-eventstream",
                         r["p99"], p["p99"] if p else None, r["p99"] / p["p99"] if p else None,
                         target, ok if p else "skipped", "ms", detail))
        out.append(C.row(f"sse fan-out: {size} streams on one agent, p50 vs django-eventstream",
                         r["p50"], p["p50"] if p else None, r["p50"] / p["p50"] if p else None,
                         "info", "info", "ms", ""))
    before, during = m["before"], m["stat1000"]
    kb = (during["VmRSS"] - before["VmRSS"]) / 1000
    threads = during["Threads"] - before["Threads"]
    p = peers.get(1000, {})
    out.append(C.row("sse fan-out: RSS per stream (1,000 on one agent)", kb, before["VmRSS"] / 1024, None,
                     "<= 50 KB", kb <= 50, "",
                     f"KB per stream; baseline = server RSS in MB with 5 streams; threads +{threads:.0f} "
                     f"({before['Threads']} -> {during['Threads']}); fds +{during['fds'] - before['fds']}"
                     + (f"; the peer with 1,000: {p['rss_mib']:.0f} MiB RSS, {p['threads']} threads, "
                        f"{p['fds']} fds" if "rss_mib" in p else "")))
    return out


def main() -> int:
    args = C.parser(__doc__.splitlines()[0]).parse_args()
    fd_note = raise_fd_limit(max(4096, 3 * max(SIZES) + 512))
    steps = 10 if args.quick else 25
    peers: dict[int, dict] = {}
    skipped = "skipped: no django-eventstream venv (BENCH_ES_PYTHON; peers/README.md)"
    if peer_python():
        t0 = time.time()
        for size in SIZES:
            peers[size] = peer(size, 2 * steps)
        skipped = f"peer run {time.time() - t0:.0f} s"
    m = with_server("fan", lambda live: ours(live, steps), DEADLINE_S)
    out = rows(m, peers, skipped)
    out[-1]["note"] += f"; {fd_note}; load average {os.getloadavg()[0]:.2f} at the end"
    C.emit(out, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
