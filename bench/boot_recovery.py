#!/usr/bin/env python
"""Boot recovery of 50 docker agents: reattach after a control-plane kill -9,
restore after `docker rm -f` of every container.

One real server (tests/live.py's LiveServer: `manage.py serve`) with
ALINEO_SANDBOX=docker. Through the JSON API the bench spawns 50 demo agents
with {"model": "demo", "checkpoint": true} and the first prompt
"write a.txt: x", and waits until every one has finished turn 1 and journaled
its turn checkpoint. Then:

- **reattach (target: all within 10 s):** SIGKILL the server by its PID and
  start it again on the same data dir and port. Measured from the moment the
  new process is launched to each agent's `agent.restored {rung: "reattach"}`
  fact journaled after it (the fact's own `ts`; the host clock is the
  server's). Reported: the slowest agent (all reattached) and the per-agent
  median; the baseline is the time until the new server first answers HTTP.
- **restore (reported, no target):** `docker rm -f` of all 50 containers in
  one CLI call; measured from the moment it is issued to each agent's
  `agent.restored {rung: "restore"}` fact. Reported: the slowest agent and the
  per-agent median.

The bench polls each agent's events page (`?after=<cursor>`) only until it has
the fact it waits for; the figures come from the facts' timestamps, so the
polling cadence does not enter them. The machine's load average and CPU use are
sampled every second and reported per phase.

Bounded: every wait has a deadline and the whole run stops after
ALL_S seconds (an unfinished phase is reported with how many agents made it).
Every container carries the label alineo.bench=<run id> and is removed at the
end, also on failure; the server is stopped by its PID; the data dir removed.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C  # noqa: E402

RUN = uuid.uuid4().hex[:8]
LABEL = f"alineo.bench={RUN}"
SPEC = {"model": "demo", "checkpoint": True}
PROMPT = "write a.txt: x"
ALL_S = 570.0      # the whole run, before cleanup (bench/run gives it 660 s)
SPAWN_S = 300.0    # spawn + turn 1 + checkpoint of all agents
REATTACH_S = 90.0  # after the restart
RESTORE_S = 240.0  # after the docker rm -f
TARGET_S = 10.0


def parse_ts(ts: str) -> float:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


class Load:
    """Samples the 1-min load average and whole-machine CPU busy % every second."""

    def __init__(self):
        self.samples: list[tuple[float, float, float]] = []  # (time, load1, cpu busy %)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _cpu() -> tuple[int, int]:
        with open("/proc/stat") as fh:
            vals = [int(v) for v in fh.readline().split()[1:]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return sum(vals), idle

    def _run(self):
        prev = self._cpu()
        while not self._stop.wait(1.0):
            cur = self._cpu()
            total, idle = cur[0] - prev[0], cur[1] - prev[1]
            prev = cur
            busy = 100.0 * (total - idle) / total if total else 0.0
            self.samples.append((time.time(), os.getloadavg()[0], busy))

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(5)

    def between(self, t0: float, t1: float) -> str:
        s = [x for x in self.samples if t0 <= x[0] <= t1]
        if not s:
            return "no samples"
        loads = [x[1] for x in s]
        busy = [x[2] for x in s]
        return (f"load1 {loads[0]:.1f}->{loads[-1]:.1f} (max {max(loads):.1f}), "
                f"CPU busy {statistics.mean(busy):.0f}% mean / {max(busy):.0f}% max")


class Client:
    def __init__(self, url: str, auth: dict[str, str]):
        import httpx

        self.http = httpx.Client(base_url=url, headers=auth, timeout=30)
        self.cursor: dict[str, int] = {}

    def close(self):
        self.http.close()

    def spawn(self) -> str:
        r = self.http.post("/api/agents", json={"spec": SPEC, "prompt": PROMPT})
        assert r.status_code == 201, r.text
        agent = r.json()["id"]
        self.cursor[agent] = 0
        return agent

    def new_events(self, agent: str) -> list[dict]:
        """Events after the agent's cursor (all pages); the cursor moves on."""
        out = []
        while True:
            r = self.http.get(f"/api/agents/{agent}/events",
                              params={"after": self.cursor[agent], "limit": 500})
            r.raise_for_status()
            page = r.json()
            out.extend(page["events"])
            if page["events"]:
                self.cursor[agent] = page["events"][-1]["seq"]
            if not page["has_more"]:
                return out

    def sandboxes(self) -> dict[str, str | None]:
        r = self.http.get("/api/agents", params={"limit": 1000})
        r.raise_for_status()
        return {a["id"]: a["sandbox_id"] for a in r.json()["agents"]}


def wait_all(client: Client, agents: list[str], done, deadline: float, pool: ThreadPoolExecutor,
             seen: dict[str, list[dict]]) -> dict[str, float]:
    """Poll each agent's new events until done(events so far) says so, or the
    deadline. Returns agent -> host time the poll saw it done."""
    finished: dict[str, float] = {}
    while True:
        todo = [a for a in agents if a not in finished]
        if not todo or time.time() > deadline:
            return finished

        def one(agent):
            try:
                seen[agent].extend(client.new_events(agent))
            except Exception:  # noqa: BLE001 - the server may be busy; poll again
                return agent, False
            return agent, done(seen[agent])

        for agent, ok in pool.map(one, todo):
            if ok:
                finished[agent] = time.time()
        time.sleep(0.5)


def first(events: list[dict], etype: str, **data) -> dict | None:
    for e in events:
        if e["type"] == etype and all(e["data"].get(k) == v for k, v in data.items()):
            return e
    return None


def spread(xs: list[float]) -> str:
    if not xs:
        return "none"
    return (f"min {min(xs):.1f} / median {C.median(xs):.1f} / p90 {C.pct(xs, 90):.1f} / "
            f"max {max(xs):.1f} s")


def remove_labelled() -> int:
    import docker

    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": LABEL})
        for c in found:
            try:
                client.api.remove_container(c["Id"], force=True, v=True)
            except Exception as exc:  # noqa: BLE001 - report it, remove the rest
                sys.stderr.write(f"cannot remove {c['Id'][:12]}: {exc}\n")
        for v in client.api.volumes(filters={"label": LABEL})["Volumes"] or []:
            try:  # homes laid over prepared trees (sandboxes/backends/docker_trees.py)
                client.api.remove_volume(v["Name"], force=True)
            except Exception as exc:  # noqa: BLE001 - report it, remove the rest
                sys.stderr.write(f"cannot remove volume {v['Name']}: {exc}\n")
        return len(found)
    finally:
        client.close()


def trees_ready(data_dir: Path) -> int:
    """How many checkpoints are prepared (sandboxes/backends/trees.py)."""
    top = data_dir / "trees"
    return sum(1 for p in top.iterdir() if not p.name.startswith((".", "seed-"))
               and (p / "root").is_dir()) if top.is_dir() else 0


def over_trees(sids: list[str]) -> int:
    """How many of these containers have a home laid over a tree (a volume at /root)."""
    import docker

    client = docker.from_env()
    try:
        return sum(1 for sid in sids if any(
            m["Type"] == "volume" and m["Destination"] == "/root"
            for m in client.api.inspect_container(sid)["Mounts"]))
    finally:
        client.close()


def ready(evs: list[dict]) -> bool:
    """Turn 1 finished and its checkpoint journaled."""
    return first(evs, "turn.finished") is not None and first(evs, "agent.checkpointed") is not None


def came_back(evs: list[dict]) -> bool:
    """Any rung of the restore ladder taken, or the agent reported lost."""
    return first(evs, "agent.restored") is not None or first(evs, "agent.lost") is not None


def came_back_without_reattach(evs: list[dict]) -> bool:
    """A rung other than reattach taken (the container is gone), or the agent reported lost."""
    return any(e["type"] == "agent.lost" or (e["type"] == "agent.restored" and e["data"].get("rung") != "reattach")
               for e in evs)


def finished_turn(evs: list[dict]) -> bool:
    return first(evs, "turn.finished") is not None


def slowest(times: dict[str, float], n: int) -> tuple[float | None, float | str]:
    """The slowest agent's seconds when all n made it (else None), and what
    the row shows: those seconds, or how many of the n made it."""
    total = max(times.values()) if len(times) == n else None
    return total, total if total is not None else f"{len(times)}/{n}"


def remove_containers(sids: list[str]) -> int:
    """`docker rm -f` of them all in one CLI call; how many it removed."""
    rm = subprocess.run(["docker", "rm", "-f", *sids], capture_output=True, text=True, timeout=180, check=False)
    return len(rm.stdout.split())


def median_row(label: str, times: dict[str, float]) -> dict:
    return C.row(label, C.median(list(times.values())) if times else "none", "-", None, "info", "info", "s")


class Recovery:
    """The phases against one live server, each appending its rows: spawn,
    reattach after kill -9, restore after docker rm -f, a prompt to each."""

    def __init__(self, n: int, load: Load, deadline: float):
        self.n, self.load, self.deadline = n, load, deadline
        self.pool = ThreadPoolExecutor(4)
        self.client: Client | None = None
        self.agents: list[str] = []
        self.seen: dict[str, list[dict]] = {}
        self.sids: dict[str, str | None] = {}
        self.rows: list[dict] = []

    def run(self, live) -> None:
        live.start()
        actor = live.create_actor("bench")
        # n sandboxes at once: above the default quotas
        # (docs/SECURITY.md#children-approvals-and-quotas).
        live.set_quotas(actor, max_agents=self.n + 8, max_sandboxes=self.n + 8)
        self.client = Client(live.url, actor.auth)
        self.spawn()
        self.reattach(live)
        self.restore(live.data_dir)
        self.answer()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def wait(self, done, since: float, bound: float) -> dict[str, float]:
        """wait_all() for every agent, until `bound` seconds after `since` (or the whole run's deadline)."""
        return wait_all(self.client, self.agents, done, min(since + bound, self.deadline), self.pool, self.seen)

    def skip_to_head(self) -> None:
        """Move every cursor to the head: only facts after this point count."""
        for a in self.agents:
            self.client.new_events(a)
            self.seen[a] = []

    def restored_at(self, rung: str, since: float) -> dict[str, float]:
        """agent -> seconds from `since` to its `agent.restored {rung}` fact's ts."""
        return {a: parse_ts(e["ts"]) - since
                for a in self.agents if (e := first(self.seen[a], "agent.restored", rung=rung))}

    def other_facts(self, rung: str) -> list[tuple[str, str, str]]:
        """(type, rung, reason) of every restored/lost fact that is not `rung`."""
        return sorted({(e["type"], e["data"].get("rung", ""), e["data"].get("reason", ""))
                       for a in self.agents for e in self.seen[a] if e["type"] in ("agent.restored", "agent.lost")
                       and e["data"].get("rung") != rung})

    def spawn(self) -> None:
        """Spawn n agents, wait until every one finished turn 1 and checkpointed it."""
        n = self.n
        t_spawn = time.time()
        self.agents = [self.client.spawn() for _ in range(n)]
        for a in self.agents:
            self.seen[a] = []
        t_spawned = time.time()
        done = self.wait(ready, t_spawn, SPAWN_S)
        t_ready = time.time()
        per_spawn = [parse_ts(first(self.seen[a], "agent.checkpointed")["ts"]) - t_spawn for a in done]
        self.rows.append(C.row(
            f"boot: spawn {n} docker agents -> turn 1 + checkpoint", max(per_spawn) if per_spawn else "none",
            "-", None, "info", "info" if len(done) == n else False, "s",
            note=(f"{len(done)}/{n} ready; {n} POSTs took {t_spawned - t_spawn:.1f} s; per agent (POST "
                  f"of the first -> its agent.checkpointed) {spread(per_spawn)}; "
                  f"machine: {self.load.between(t_spawn, t_ready)}")))
        if len(done) < n:
            raise RuntimeError(f"only {len(done)}/{n} agents finished turn 1 within the bound")
        sandboxes = self.client.sandboxes()
        self.sids = {a: sandboxes.get(a) for a in self.agents}
        assert all(self.sids.values()), self.sids

    def reattach(self, live) -> None:
        """kill -9 the control plane, start it again: every agent reattached?"""
        n = self.n
        time.sleep(2)  # let the last checkpoints' facts settle
        self.skip_to_head()
        live.kill()
        t_restart = time.time()
        live.start()
        answers_s = time.time() - t_restart
        recovered = self.wait(came_back, t_restart, REATTACH_S)
        t_end = time.time()
        reattach = self.restored_at("reattach", t_restart)
        total, shown = slowest(reattach, n)
        self.rows.append(C.row(
            f"boot: kill -9 -> all {n} reattached", shown,
            answers_s, (total / answers_s) if total else None,
            f"<= {TARGET_S:.0f} s", total is not None and total <= TARGET_S, "s",
            note=(f"{len(reattach)}/{n} reattached (rung reattach, reason control_plane_restart); "
                  f"per agent (restart -> its fact's ts) {spread(list(reattach.values()))}; "
                  f"baseline = restart -> the server's first HTTP answer; "
                  f"other rungs: {self.other_facts('reattach') or 'none'}; {len(recovered)}/{n} had a fact within "
                  f"{REATTACH_S:.0f} s; machine: {self.load.between(t_restart, t_end)}")))
        self.rows.append(median_row("boot: reattach, per-agent median", reattach))

    def restore(self, data_dir: Path) -> None:
        """docker rm -f every container: every agent restored from its checkpoint?
        First (not timed, at most 120 s) the workers' background preparation of
        the turn-1 checkpoints' trees: the warm state a loss finds."""
        n = self.n
        t_wait = time.time()
        while trees_ready(data_dir) < n and time.time() < t_wait + 120:
            time.sleep(0.5)
        prepared, waited = trees_ready(data_dir), time.time() - t_wait
        time.sleep(2)
        self.skip_to_head()
        t_rm = time.time()
        removed = remove_containers(list(self.sids.values()))
        rm_s = time.time() - t_rm
        restored_any = self.wait(came_back_without_reattach, t_rm, RESTORE_S)
        t_end = time.time()
        restore = self.restored_at("restore", t_rm)
        other = self.other_facts("restore")
        new_sids = self.client.sandboxes()
        moved = sum(1 for a in self.agents if new_sids.get(a) and new_sids[a] != self.sids[a])
        laid = over_trees([new_sids[a] for a in self.agents if new_sids.get(a)])
        total, shown = slowest(restore, n)
        self.rows.append(C.row(
            f"boot: docker rm -f {n} -> all restored", shown,
            "-", None, "reported", "info" if total is not None else False, "s",
            note=(f"{len(restore)}/{n} restored (rung restore) from their turn-1 checkpoint; "
                  f"per agent (rm issued -> its fact's ts) {spread(list(restore.values()))}; "
                  f"`docker rm -f` of {removed} containers took {rm_s:.1f} s; "
                  f"{moved}/{n} agents now on a new sandbox id, {laid}/{n} with the home laid over "
                  f"the checkpoint's prepared tree ({prepared}/{n} trees ready before the rm, waited "
                  f"{waited:.1f} s, not timed); other rungs/facts: {other or 'none'}; "
                  f"{len(restored_any)}/{n} had a fact within {RESTORE_S:.0f} s; "
                  f"machine: {self.load.between(t_rm, t_end)}")))
        self.rows.append(median_row("boot: restore, per-agent median", restore))

    def answer(self) -> None:
        """The restored agents answer: a prompt to each reads a.txt back (not timed as a target)."""
        n = self.n
        self.skip_to_head()
        t_prompt = time.time()
        for a in self.agents:
            r = self.client.http.post(f"/api/agents/{a}/prompt", json={"text": "run: cat a.txt"})
            assert r.status_code == 202, r.text
        answered = self.wait(finished_turn, t_prompt, 120)
        kept = sum(1 for a in answered
                   if any(e["type"] == "tool.result" and str(e["data"].get("output", "")).strip() == "x"
                          for e in self.seen[a]))
        per_turn = [parse_ts(first(self.seen[a], "turn.finished")["ts"]) - t_prompt for a in answered]
        self.rows.append(C.row(
            f"boot: restored agents answer a prompt ({n})", f"{len(answered)}/{n}", "-", None,
            "all", len(answered) == n and kept == n,
            note=(f"prompt 'run: cat a.txt' to each restored agent: {len(answered)}/{n} finished the "
                  f"turn, {kept}/{n} read back the file written before the loss; per agent "
                  f"(prompts issued -> turn.finished) {spread(per_turn)}")))


def error_row(exc: Exception, log_tail: str) -> dict:
    last = " | ".join(line.strip() for line in log_tail.strip().splitlines()[-4:])
    return C.row("boot recovery", "error", "-", None, "-", False,
                 note=f"{type(exc).__name__}: {exc}"[:500] + (f"; server log ends: {last[-600:]}" if last else ""))


def running_containers() -> int:
    return len(subprocess.run(["docker", "ps", "-q"], capture_output=True, text=True, check=False).stdout.split())


def recover(n: int) -> list[dict]:
    """The whole bench on a fresh data dir; its rows (an error is a row too). Cleans up after itself."""
    t_begin = time.time()
    data_dir = C.make_data_dir("boot", sockets=True)
    os.environ["ALINEO_DATA_DIR"] = str(data_dir)  # LiveServer makes its dirs under here
    from tests.live import LiveServer

    live = LiveServer(env={"ALINEO_SANDBOX": "docker", "ALINEO_SANDBOX_LABELS": LABEL,
                           "ALINEO_LOG_LEVEL": "WARNING"}, startup_timeout=120)
    load = Load()
    load.start()
    others = running_containers()
    bench = Recovery(n, load, t_begin + ALL_S)
    log_tail = ""
    try:
        bench.run(live)
    except Exception as exc:  # noqa: BLE001 - reported as a row; cleanup below
        log_tail = live.log()[-3000:]
        bench.rows.append(error_row(exc, log_tail))
    finally:
        t_end = time.time()
        bench.close()
        live.stop()
        left = remove_labelled()
        load.stop()
        bench.rows.append(C.row(
            "boot: machine during the run", f"{len(load.samples)} samples", "-", None, "info", "info",
            note=(f"{os.cpu_count()} CPUs; {others} other containers were running at the start; "
                  f"whole run {t_end - t_begin:.0f} s: {load.between(t_begin, t_end)}; "
                  f"{left} labelled containers removed at the end")))
        C.cleanup(data_dir)
    if log_tail:
        sys.stderr.write(f"--- server log (tail)\n{log_tail}\n")
    return bench.rows


def main() -> int:
    p = C.parser(__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=50, help="how many agents (the recovery bench measures 50)")
    args = p.parse_args()
    from sandboxes.backends import docker_engine_answers

    if not docker_engine_answers():
        C.emit([C.row("boot recovery: docker", "skipped", "-", None, "-", "info",
                      note="no Docker engine answers")], args)
        return 0
    from sandboxes import images

    images.ensure_base_image()
    C.emit(recover(args.agents), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
