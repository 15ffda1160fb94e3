"""The one invariant checker every fault scenario uses.

It reads the transcript through the JSON API (and Command rows, read-only,
from the server's SQLite file) and returns a list of violations — strings,
each naming the agent — so a scenario can count them. An empty list means:

1. **contiguous**: seq is 1..N with no gap and no repeat;
2. **no fact twice**: each bridge event (``bseq``) once per bridge incarnation
   (a new one starts at ``bridge.session_changed``, ``bridge.cursor_reset`` or
   a fresh-sandbox ``agent.restored``), the bseqs of one incarnation
   consecutive; each ``command.*`` / ``agent.spawned`` fact once per Command id;
   ``bridge.events_lost`` never appears;
3. **every turn settles exactly once**: each ``turn.started`` number once, then
   exactly one ``turn.finished`` or ``turn.interrupted`` with the same number
   (and none without a start); every dispatched tool call has one result;
4. **every acknowledged command acted on exactly once**: its Command row is
   done/failed, its fact is in the transcript once, a prompt started exactly one
   turn (``turn.started.command_id``), a failed one has one ``command.failed``,
   a done steer was delivered (or reported undelivered) once;
5. **the agent answers**: a demo ``say:`` prompt reaches ``turn.finished``;
6. **tree edges intact**: every ``agent.child_spawned`` child is listed under
   its parent by GET /api/agents and names it as parent, and no child twice;
7. **files survive**: every file a ``write`` call wrote, up to the newest
   checkpoint TAKEN before the last fresh sandbox (from the
   ``agent.checkpointed`` facts; none: nothing), is in the home with its
   content (``run: cat <file>``); and each fresh sandbox came from that newest
   live checkpoint (rung restore with its id), or was rebuilt when there was none.

The checker never sleeps on a clock for correctness; it only waits (bounded)
for the agent to settle, and a wait that runs out is itself a violation.
"""

from __future__ import annotations

import shlex
import time
import uuid
from collections import Counter, defaultdict

from tests.bseqs import FRESH_RUNGS, bseq_trouble

SETTLE = ("turn.finished", "turn.interrupted")
ENDED = ("stopped", "lost", "unrecoverable")
WAIT_SETTLE = 60.0


def check(world, agents: list[str] | None = None, *, probe: bool = True, files: bool = True,
          settle_timeout: float = 60.0, probe_timeout: float = 60.0) -> list[str]:
    """All invariants for `agents` (default: every agent the actor sees)."""
    if agents is None:
        agents = [a["id"] for a in world.agents()]
    violations: list[str] = []
    violations += settle(world, agents, settle_timeout)
    if probe:
        status = {a["id"]: a["status"] for a in world.agents()}
        alive = [a for a in agents if status.get(a) not in ENDED]
        violations += answers(world, alive, files=files, timeout=probe_timeout)
    events_of = {agent: world.events(agent) for agent in agents}
    for agent in agents:
        violations += transcript(world, agent, events_of[agent])
        violations += restores(agent, events_of[agent])
    violations += acknowledged(world, agents, events_of)
    violations += tree(world, agents, events_of)
    return violations


# --- waiting (bounded) until the agents are quiet -------------------------------------------------


def quiet(world, agent: str, events: list[dict]) -> str | None:
    """Why `agent` is not settled yet, or None."""
    open_turns = unsettled_turns(events)
    if open_turns:
        return f"turn(s) {open_turns} not settled"
    acks = [a for a in world.acks if a.agent == agent]
    pending = world.pending_commands(agent)
    if pending:
        return f"command(s) {pending} still pending"
    started = {str(e["data"].get("command_id")) for e in events if e["type"] == "turn.started"}
    failed = {e["data"].get("command") for e in events if e["type"] == "command.failed"}
    waiting = [a.command for a in acks if a.verb == "prompt" and str(a.command) not in started
               and a.command not in failed]
    if waiting:
        return f"prompt command(s) {waiting} acknowledged but no turn started"
    return None


def settle(world, agents: list[str], timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    out = []
    for agent in agents:
        while True:
            events = world.events(agent)
            why = quiet(world, agent, events)
            if why is None:
                break
            if not unsettled_turns(events) and world.agent(agent)["status"] in ENDED:
                break
            if time.monotonic() > deadline:
                out.append(f"{agent}: did not settle within {timeout:.0f} s: {why}")
                break
            time.sleep(0.25)
    return out


def unsettled_turns(events: list[dict]) -> list[int]:
    open_ = {}
    for e in events:
        if e["type"] == "turn.started":
            open_[e["data"].get("turn")] = e["seq"]
        elif e["type"] in SETTLE:
            open_.pop(e["data"].get("turn"), None)
    return sorted(open_, key=lambda t: (t is None, t))


# --- 5 + 7: the agent answers, and its files are there -------------------------------------------


REMOVED_CHECKPOINT = ("agent.checkpoint_expired", "agent.checkpoint_deleted")


def newest_checkpoint(taken: list[dict], removed: set) -> dict | None:
    """The newest checkpoint the transcript says was taken and not removed."""
    live = [c for c in taken if c.get("checkpoint") not in removed]
    return live[-1] if live else None


def expected_files(events: list[dict]) -> dict[str, str]:
    """path → content of every successful `write`, as the last fresh sandbox
    must have them: as of the turn of the newest checkpoint actually TAKEN
    before it (the `agent.checkpointed` facts, not the restore's own account of
    what it restored: a stale checkpoint, or a rebuild reported instead of a
    restore, must not shrink what is expected); none when no checkpoint was live."""
    files: dict[str, str] = {}
    by_turn: dict[int, dict[str, str]] = {}
    calls: dict[str, dict] = {}
    taken: list[dict] = []
    removed: set = set()
    for e in events:
        t, d = e["type"], e["data"]
        if t == "tool.dispatched" and d.get("name") == "write":
            calls[str(d.get("tool_call_id"))] = d.get("input") or {}
        elif t == "tool.result" and str(d.get("tool_call_id")) in calls:
            call = calls.pop(str(d.get("tool_call_id")))
            if d.get("exit_code") == 0 and not d.get("is_error") and not d.get("interrupted"):
                files[str(call.get("path"))] = str(call.get("content"))
        elif t in SETTLE:
            by_turn[int(d.get("turn") or 0)] = dict(files)
        elif t == "agent.checkpointed":
            taken.append(d)
        elif t in REMOVED_CHECKPOINT:
            removed.add(d.get("checkpoint"))
        elif t == "agent.restored" and d.get("rung") in FRESH_RUNGS:
            newest = newest_checkpoint(taken, removed)
            files = dict(by_turn.get(int(newest.get("turn") or 0), {})) if newest else {}
    return files


def restores(agent: str, events: list[dict]) -> list[str]:
    """Each fresh sandbox came from the newest live checkpoint taken before it
    (rung restore, that checkpoint's id), or was rebuilt when there was none."""
    out = []
    taken: list[dict] = []
    removed: set = set()
    for e in events:
        t, d = e["type"], e["data"]
        if t == "agent.checkpointed":
            taken.append(d)
        elif t in REMOVED_CHECKPOINT:
            removed.add(d.get("checkpoint"))
        elif t == "agent.restored" and d.get("rung") in FRESH_RUNGS:
            newest = newest_checkpoint(taken, removed)
            if newest is None and d.get("rung") == "restore":
                out.append(f"{agent}: seq {e['seq']} restored checkpoint {d.get('checkpoint')} "
                           "but no checkpoint was taken (and kept) before it")
            elif newest is not None and (d.get("rung") != "restore"
                                         or d.get("checkpoint") != newest.get("checkpoint")):
                out.append(f"{agent}: seq {e['seq']} {d.get('rung')} from checkpoint "
                           f"{d.get('checkpoint')} (turn {d.get('checkpoint_turn')}), but the "
                           f"newest taken was {newest.get('checkpoint')} (turn {newest.get('turn')})")
    return out


def answers(world, agents: list[str], *, files: bool = True, timeout: float = 60.0) -> list[str]:
    """Prompt each agent `say: <token>` (and `run: cat` of its expected files);
    every one must reach turn.finished, with the token and the files' contents.
    All agents are prompted first, then awaited together."""
    out = []
    asked = {}
    for agent in agents:
        expected = expected_files(world.events(agent)) if files else {}
        token = f"alive-{uuid.uuid4().hex[:8]}"
        say = world.send(agent, "prompt", f"say: {token}")
        cat = None
        if expected:
            paths = " ".join(shlex.quote(p) for p in sorted(expected))
            cat = world.send(agent, "prompt", f"run: cat -- {paths}")
        asked[agent] = (token, say, cat, expected)
    deadline = time.monotonic() + timeout
    for agent, (token, say, cat, expected) in asked.items():
        wanted = [a for a in (say, cat) if a is not None]
        answered = False
        while True:
            events = world.events(agent)
            done = {str(e["data"].get("command_id")): e["data"].get("turn")
                    for e in events if e["type"] == "turn.started"}
            settled = {e["data"].get("turn"): e for e in events if e["type"] in SETTLE}
            if all(str(a.command) in done and done[str(a.command)] in settled for a in wanted):
                answered = True
                break
            if time.monotonic() > deadline:
                out.append(f"{agent}: the next prompt was not answered within {timeout:.0f} s "
                           f"(status {world.agent(agent)['status']!r}; tail "
                           f"{[e['type'] for e in events[-12:]]})")
                break
            time.sleep(0.25)
        if not answered:
            continue
        end = settled[done[str(say.command)]]
        if end["type"] != "turn.finished" or token not in str(end["data"].get("text")):
            out.append(f"{agent}: `say: {token}` did not finish with the token: {end}")
        if cat is not None:
            turn = done[str(cat.command)]
            end = settled[turn]
            results = [e["data"] for e in events if e["type"] == "tool.result"
                       and e["data"].get("turn") == turn]
            text = "\n".join(str(r.get("output")) for r in results)
            missing = [p for p, c in sorted(expected.items()) if c not in text]
            if (end["type"] != "turn.finished" or missing or not results
                    or results[-1].get("exit_code") != 0):
                out.append(f"{agent}: files written before the fault are missing or wrong: "
                           f"{missing} (cat said {text[:600]!r})")
    return out


# --- 1-3: the transcript itself -------------------------------------------------------------------


def transcript(world, agent: str, events: list[dict]) -> list[str]:
    out = []
    seqs = [e["seq"] for e in events]
    if seqs != list(range(1, len(seqs) + 1)):
        gaps = [(a, b) for a, b in zip([0, *seqs], seqs) if b != a + 1][:5]
        out.append(f"{agent}: seq is not contiguous 1..{len(seqs)}: jumps {gaps}")

    # Bridge events: once per incarnation, consecutive within it (tests/bseqs.py).
    out += [f"{agent}: {why}" for why in bseq_trouble(events)]
    for e in events:
        if e["type"] in ("bridge.refused", "bridge.event_refused"):  # our own bridge never is
            out.append(f"{agent}: a bridge event was refused: seq {e['seq']} {e['data']}")

    # Command facts: once per Command id.
    per_command = Counter()
    for e in events:
        t, d = e["type"], e["data"]
        if (t.startswith("command.") or t == "agent.spawned") and "command" in d:
            per_command[(t, d["command"])] += 1
    for (t, cmd), n in per_command.items():
        if n > 1:
            out.append(f"{agent}: {t} for command {cmd} journaled {n} times")

    # Turns: each started once, settled exactly once, after its start.
    started, settled = Counter(), Counter()
    start_seq = {}
    calls: dict[str, int] = {}
    for e in events:
        t, d = e["type"], e["data"]
        if t == "turn.started":
            started[d.get("turn")] += 1
            start_seq[d.get("turn")] = e["seq"]
        elif t in SETTLE:
            n = d.get("turn")
            settled[n] += 1
            if n not in start_seq:
                out.append(f"{agent}: {t} of turn {n} (seq {e['seq']}) with no turn.started before it")
        elif t == "tool.dispatched":
            calls[str(d.get("tool_call_id"))] = calls.get(str(d.get("tool_call_id")), 0)
        elif t == "tool.result":
            cid = str(d.get("tool_call_id"))
            if cid not in calls:
                out.append(f"{agent}: tool.result for {cid} with no tool.dispatched (seq {e['seq']})")
            else:
                calls[cid] += 1
    for n, k in started.items():
        if k > 1:
            out.append(f"{agent}: turn {n} started {k} times")
        if settled[n] != 1:
            out.append(f"{agent}: turn {n} settled {settled[n]} times")
    for n, k in settled.items():
        if n not in started:
            continue
        if k > 1 and started[n] == 1:
            pass  # reported above
    for cid, k in calls.items():
        if k != 1:
            out.append(f"{agent}: tool call {cid} has {k} results")
    return out


# --- 4: acknowledged commands, acted on exactly once ------------------------------------------------


def acknowledged(world, agents: list[str], events_of: dict | None = None) -> list[str]:
    out = []
    wanted = set(agents)
    acks = [a for a in world.acks if a.agent in wanted]
    states = world.command_states([a.command for a in acks])
    events_of = events_of or {a: world.events(a) for a in wanted}
    by_key = defaultdict(set)
    for a in acks:
        by_key[(a.key, a.verb)].add(a.command)
    for (key, verb), cmds in by_key.items():
        if len(cmds) > 1:
            out.append(f"the same Idempotency-Key {key} ({verb}) acknowledged as commands {sorted(cmds)}")
    steers_done = Counter()
    for a in {(x.agent, x.command): x for x in acks}.values():
        events = events_of[a.agent]
        state = states.get(a.command)
        if state not in ("done", "failed"):
            out.append(f"{a.agent}: acknowledged {a.verb} command {a.command} is {state!r}, not acted on")
            continue
        fact = "agent.spawned" if a.verb == "spawn" else f"command.{a.verb}"
        n = sum(1 for e in events if e["type"] == fact and e["data"].get("command") == a.command)
        if n != 1:
            out.append(f"{a.agent}: acknowledged {a.verb} command {a.command} has {n} {fact} facts")
        failed = sum(1 for e in events if e["type"] == "command.failed"
                     and e["data"].get("command") == a.command)
        if state == "failed" and failed != 1:
            out.append(f"{a.agent}: failed command {a.command} has {failed} command.failed facts")
        if state == "done" and failed:
            out.append(f"{a.agent}: done command {a.command} also has a command.failed fact")
        if a.verb == "prompt":
            turns = sum(1 for e in events if e["type"] == "turn.started"
                        and str(e["data"].get("command_id")) == str(a.command))
            if turns != (1 if state == "done" else 0):
                out.append(f"{a.agent}: prompt command {a.command} ({state}) started {turns} turns")
        if a.verb == "steer" and state == "done":
            steers_done[(a.agent, a.text)] += 1
    for (agent, text), n in steers_done.items():
        events = events_of[agent]
        delivered = sum(1 for e in events if e["type"] == "steer.delivered"
                        and e["data"].get("text") == text)
        undelivered = sum(1 for e in events if e["type"] == "turn.interrupted"
                          for s in (e["data"].get("undelivered_steers") or [])
                          if (s.get("text") if isinstance(s, dict) else s) == text)
        if delivered + undelivered != n:
            out.append(f"{agent}: {n} acknowledged steer(s) {text!r} were delivered {delivered} "
                       f"times and reported undelivered {undelivered} times")
    return out


# --- 6: the tree ------------------------------------------------------------------------------------


def tree(world, agents: list[str], events_of: dict | None = None) -> list[str]:
    out = []
    listed = {a["id"]: a for a in world.agents()}
    for agent in agents:
        events = events_of[agent] if events_of else world.events(agent)
        kids = [e["data"].get("child") for e in events if e["type"] == "agent.child_spawned"]
        for kid, n in Counter(kids).items():
            if n > 1:
                out.append(f"{agent}: child {kid} spawned {n} times")
        me = listed.get(agent)
        if me is None:
            out.append(f"{agent}: missing from GET /api/agents")
            continue
        if sorted(set(kids)) != sorted(me["children"]):
            out.append(f"{agent}: children {sorted(me['children'])} but the transcript spawned "
                       f"{sorted(set(kids))}")
        for kid in set(kids):
            if kid not in listed:
                out.append(f"{agent}: child {kid} missing from GET /api/agents")
            elif listed[kid]["parent"] != agent:
                out.append(f"{agent}: child {kid} names {listed[kid]['parent']} as parent")
    return out
