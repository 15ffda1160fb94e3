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
import shutil
import socket
import subprocess
import tempfile
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _common as C  # noqa: E402
from bench._fan_client import FanClient  # noqa: E402
from bench._sse_client import http_post  # noqa: E402
from bench.sse_latency import cpu_ticks, proc_status, quiesce, raise_fd_limit, with_server  # noqa: E402

SIZES = (200, 1000)
TARGET_P99_MS = 50.0
DEADLINE_S = 420.0
PEERS = Path(os.environ.get("BENCH_PEERS_DIR", ROOT.parent / "shared" / "peers"))
PAD = "x" * 500


# --- ours ---------------------------------------------------------------------------------

def stream_request(agent: str, token: str) -> bytes:
    return (f"GET /api/agents/{agent}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n").encode()


def summarise(client: FanClient, first: int, cpu_before: float, seconds: float, server_cpu: float) -> dict:
    """p50/p99 of commit -> receipt over every (stream, fact) from seq `first` on."""
    per_stream, cpu = client.collect()
    last = min(max((q for q, _ in got), default=0) for got in per_stream)
    lat = [ms for got in per_stream for q, ms in got if first <= q <= last]
    seen = [{q for q, _ in got} for got in per_stream]
    missing = sum(1 for got in seen for q in range(first, last + 1) if q not in got)
    facts = last - first + 1
    return {"n": len(lat), "facts": facts, "p50": C.pct(lat, 50), "p99": C.pct(lat, 99),
            "max": max(lat) if lat else float("nan"), "missing": missing,
            "client_cpu_ms": (cpu - cpu_before) * 1000 / max(1, facts),
            "server_cpu_ms": server_cpu * 1000 / max(1, facts), "seconds": seconds}


async def measure(live, token: str, agent: str, client: FanClient, steps: int) -> dict:
    await quiesce(live.pid)
    _, cpu0 = client.collect()
    ticks0, t0 = cpu_ticks(live.pid), time.monotonic()
    seqs = []
    for i in range(steps):
        status, body = await http_post(live.port, f"/api/agents/{agent}/prompt", token, {"text": f"say: {i} {PAD}"})
        if status != 202 or "seq" not in body:
            raise RuntimeError(f"prompt answered {status}: {body}")
        seqs.append(body["seq"])
        if client.wait(f"id: {body['seq']}\n".encode()):
            raise RuntimeError(f"a stream did not get seq {body['seq']} within 20 s")
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # the turns' trailing facts
    server_cpu = (cpu_ticks(live.pid) - ticks0) / os.sysconf("SC_CLK_TCK")
    return summarise(client, seqs[0], cpu0, time.monotonic() - t0, server_cpu)


async def ours(live, steps: int, procs: int) -> dict:
    actor = live.create_actor("fanout")
    live.set_quotas(actor, max_streams_per_user=max(SIZES) + 32)
    agent = live.django(
        "from django.contrib.auth import get_user_model\n"
        "from sessions.models import Agent, Workspace\n"
        f"user = get_user_model().objects.get(pk={actor.user_id})\n"
        f"ws = Workspace.objects.get(name={actor.workspace!r})\n"
        "result = Agent.objects.create(workspace=ws, created_by=user, spec={'model': 'demo'}).id\n")
    out: dict = {}
    client = FanClient(procs)
    try:
        request = stream_request(agent, actor.token)
        client.open(live.port, request, 4, "alineo")
        for i in range(5):
            _, body = await http_post(live.port, f"/api/agents/{agent}/prompt", actor.token, {"text": f"say: {i}"})
            client.wait(f"id: {body['seq']}\n".encode())
        await asyncio.sleep(1.0)
        out["before"] = proc_status(live.pid)
        for size in SIZES:
            client.open(live.port, request, size - client.count, "alineo")
            out[size] = await measure(live, actor.token, agent, client, steps)
            out[f"stat{size}"] = proc_status(live.pid)
    finally:
        client.close()
    return out


# --- the peer, read by the same client --------------------------------------------------------

def peer_python() -> str | None:
    py = os.environ.get("BENCH_ES_PYTHON", "/tmp/es-venv/bin/python")
    return py if Path(py).exists() and (PEERS / "eventstream_project").is_dir() else None


def peer_post(port: int, k: int) -> None:
    body = f"channel=fan&k={k}&pad={len(PAD)}".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(b"POST /send/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded"
                  b"\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        resp = b""
        while data := s.recv(65536):
            resp += data
    if b" 200 " not in resp.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"peer send failed: {resp[:300]!r}")


def peer(steps: int, procs: int) -> dict:
    """django-eventstream (daphne, SQLite) from ../shared/peers/eventstream_project:
    SIZES clients on one channel, one send_event (500 bytes of padding) per step."""
    py, project = peer_python(), PEERS / "eventstream_project"
    tmp = Path(tempfile.mkdtemp(prefix="es-fan-"))
    env = dict(os.environ, ES_DB=str(tmp / "db.sqlite3"), DJANGO_SETTINGS_MODULE="esbench.settings",
               PYTHONPATH=str(project))
    subprocess.run([py, "manage.py", "migrate", "-v", "0"], cwd=project, env=env, check=True, timeout=120)
    port = free_port()
    daphne = str(Path(py).parent / "daphne")
    srv = subprocess.Popen(["timeout", "-s", "TERM", str(int(DEADLINE_S)), daphne, "-b", "127.0.0.1",
                            "-p", str(port), "-v", "0", "esbench.asgi:application"], cwd=project, env=env,
                           stdout=open(tmp / "daphne.log", "w"), stderr=subprocess.STDOUT)
    client = FanClient(procs)
    out: dict = {}
    try:
        wait_port(port)
        pid = server_pid(srv.pid)
        request = b"GET /events/fan/ HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
        k = 0
        for size in SIZES:
            client.open(port, request, size - client.count, "peer")
            time.sleep(1.0)
            _, cpu0 = client.collect()
            ticks0, t0 = cpu_ticks(pid), time.monotonic()
            first = k + 1
            for _ in range(2 * steps):
                k += 1
                peer_post(port, k)
                if client.wait(f'"k": {k},'.encode()):
                    raise RuntimeError(f"a peer client did not get k={k} within 20 s")
                time.sleep(0.05)
            server_cpu = (cpu_ticks(pid) - ticks0) / os.sysconf("SC_CLK_TCK")
            r = summarise(client, first, cpu0, time.monotonic() - t0, server_cpu)
            r.update(proc_status(pid))
            out[size] = r
    finally:
        client.close()
        srv.terminate()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int) -> None:
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the peer's daphne did not answer")


def server_pid(pid: int) -> int:
    """daphne under `timeout`: the child's pid."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(kids[0]) if kids else pid


# --- rows -------------------------------------------------------------------------------------

def detail(r: dict, size: int) -> str:
    return (f"{r['n']} receipts ({r['facts']} facts x {size} streams), missing {r['missing']}, max "
            f"{r['max']:.0f} ms, CPU per fact server {r['server_cpu_ms']:.1f} / client {r['client_cpu_ms']:.1f} ms")


def rows(m: dict, peers: dict[int, dict], skipped: str) -> list[dict]:
    out = []
    for size in SIZES:
        r, p = m[size], peers.get(size)
        note = f"ours: {detail(r, size)}; " + (f"peer: {detail(p, size)}" if p else skipped)
        target = f"<= peer{' and <= 50 ms' if size == 1000 else ''}"
        ok = p is not None and r["p99"] <= p["p99"] and (size != 1000 or r["p99"] <= TARGET_P99_MS)
        out.append(C.row(f"sse fan-out: {size} streams on one agent, p99 vs django-eventstream",
                         r["p99"], p["p99"] if p else None, r["p99"] / p["p99"] if p else None,
                         target, ok if p else "skipped", "ms", note))
        out.append(C.row(f"sse fan-out: {size} streams on one agent, p50 vs django-eventstream",
                         r["p50"], p["p50"] if p else None, r["p50"] / p["p50"] if p else None,
                         "info", "info", "ms", ""))
    before, during = m["before"], m["stat1000"]
    kb = (during["VmRSS"] - before["VmRSS"]) / 1000
    threads = during["Threads"] - before["Threads"]
    p = peers.get(1000, {})
    out.append(C.row("sse fan-out: RSS per stream (1,000 on one agent)", kb, before["VmRSS"] / 1024, None,
                     "<= 50 KB", kb <= 50, "",
                     f"KB per stream; baseline = server RSS in MB with 4 streams; threads +{threads:.0f} "
                     f"({before['Threads']} -> {during['Threads']}); fds +{during['fds'] - before['fds']}"
                     + (f"; the peer with 1,000: {p['VmRSS'] / 1024:.0f} MiB RSS, {p['Threads']} threads, "
                        f"{p['fds']} fds" if "VmRSS" in p else "")))
    return out


def main() -> int:
    ap = C.parser(__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2, help="client worker processes (default 2)")
    ap.add_argument("--no-peer", action="store_true", help="skip the peer")
    args = ap.parse_args()
    fd_note = raise_fd_limit(max(4096, 3 * max(SIZES) + 512))
    steps = 10 if args.quick else 25
    peers: dict[int, dict] = {}
    skipped = "peer skipped: no django-eventstream venv (BENCH_ES_PYTHON; peers/README.md)"
    load0 = os.getloadavg()[0]
    if peer_python() and not args.no_peer:
        t0 = time.time()
        peers = peer(steps, args.procs)
        skipped = f"peer run {time.time() - t0:.0f} s"
    m = with_server("fan", lambda live: ours(live, steps, args.procs), DEADLINE_S)
    out = rows(m, peers, skipped)
    out[-1]["note"] += (f"; {fd_note}; client: {args.procs} worker processes (bench/_fan_client.py) for both;"
                        f" load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    C.emit(out, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
