"""The transcript as the operator reads it, by turns (sessions/_event_rows.html).

Every fact stays one row keyed by its seq (``id="row-<seq>"``), so paging and
reconnects work as before; on top of that each row says what it belongs to:

- a *run*: the ``message.delta`` chunks of one step and the ``message.assistant``
  that ends it share ``data-run=<seq of the run's first delta>``. The first run
  row on the page shows the whole message; the others are folded into it
  (here for what one fragment holds, in alineo.js across fragments: live rows
  and older pages). The final text replaces the streamed one, so it shows once;
- a tool call: ``tool.result`` names its ``tool.dispatched`` (``data-result-of``),
  and alineo.js shows the result inside the call;
- the control plane's own facts (bridge, worker, command echoes, checkpoints)
  are ``sys`` rows, behind the "system events" toggle.

A run can begin before the first row of a fragment (a live fragment continues
the one on screen; a page may start mid-step): a short look back in the journal
finds its first delta, so every fragment names a run the same way."""

from __future__ import annotations

from ..models import Event

# Facts that end a streaming step (message.assistant ends it with the final text).
BOUNDARY = frozenset({"message.assistant", "turn.started", "turn.finished", "turn.interrupted",
                      "tool.dispatched", "tool.result", "message.user", "steer.delivered"})
LOOKBACK = 2000  # facts; a longer step is shown from where the look back stopped
SYSTEM_PREFIXES = ("bridge.", "command.", "session.", "model.")
SYSTEM_TYPES = frozenset({"agent.worker", "agent.status", "agent.sandbox", "agent.checkpointed",
                          "agent.checkpoint_deleted", "agent.checkpoint_expired", "turn.held",
                          "hook.verdict", "agent.home_snapshot", "agent.home_snapshot_failed"})
NOT_SYSTEM = frozenset({"command.failed", "bridge.error", "model.error"})


def is_system(etype: str) -> bool:
    if etype in NOT_SYSTEM:
        return False
    return etype in SYSTEM_TYPES or etype.startswith(SYSTEM_PREFIXES)


def _turn(data) -> object:
    return data.get("turn") if isinstance(data, dict) else None


def open_run_before(agent_id: str, seq: int, turn) -> int | None:
    """The first delta of the step still streaming just before ``seq``, if any."""
    first = None
    rows = (Event.objects.filter(agent_id=agent_id, seq__lt=seq, seq__gte=max(1, seq - LOOKBACK))
            .order_by("-seq").values_list("seq", "type", "data__turn"))
    for s, etype, t in rows.iterator(chunk_size=200):
        if etype in BOUNDARY or (etype == "message.delta" and t != turn):
            break
        if etype == "message.delta":
            first = s
    return first


def runs(agent_id: str, events) -> dict[int, int]:
    """seq → run id (the seq of the run's first delta) for delta and assistant rows."""
    out: dict[int, int] = {}
    current: tuple[int, object] | None = None
    looked = False
    for ev in events:
        etype, turn = ev.type, _turn(ev.data)
        if etype in ("message.delta", "message.assistant") and not looked and current is None:
            looked = True  # only the first run can have begun before this fragment
            start = open_run_before(agent_id, ev.seq, turn)
            if start is not None:
                current = (start, turn)
        if etype == "message.delta":
            if current is None or current[1] != turn:
                current = (ev.seq, turn)
            out[ev.seq] = current[0]
        elif etype == "message.assistant":
            out[ev.seq] = current[0] if current is not None and current[1] == turn else ev.seq
            current = None
        elif etype in BOUNDARY:
            looked = True
            current = None
    return out


def rows(agent_id: str, events, view_of, after_screen: bool = False) -> list[dict]:
    """The rows of one fragment: ``{"ev", "v"}`` with ``v`` the display view
    (``view_of(event)``) plus run, chunk, head text, tool pairing and sys.
    ``after_screen``: the fragment follows rows on screen (a live one), so a run
    that began before it already has its head there."""
    events = list(events)
    run_of = runs(agent_id, events)
    out, heads = [], {}
    if after_screen and events:
        heads = {run: {"has_final": False, "text": ""} for run in set(run_of.values())
                 if run < events[0].seq}
    for ev in events:
        v = dict(view_of(ev), seq=ev.seq, ts=ev.ts)
        v["sys"] = is_system(ev.type)
        v["turn"] = _turn(ev.data)
        data = ev.data if isinstance(ev.data, dict) else {}
        run = run_of.get(ev.seq)
        if run is not None:
            v.update(run=run, chunk=str(data.get("text", "")), final=ev.type == "message.assistant",
                     title="Assistant", text="")
            head = heads.get(run)
            if head is None:
                heads[run] = v
                v["head"] = True
                v["text"] = v["chunk"]
            elif not head.get("has_final"):
                head["text"] = v["chunk"] if v["final"] else head["text"] + v["chunk"]
            if v["final"]:
                heads[run]["has_final"] = True
        v["fork_here"] = ev.type in ("turn.finished", "turn.interrupted")
        if ev.type == "tool.dispatched":
            v["call"] = str(data.get("tool_call_id", ""))
        elif ev.type == "tool.result":
            v["result_of"] = str(data.get("tool_call_id", ""))
        if "call" in v or "result_of" in v:
            v["bridge_ts"] = data.get("bridge_ts")  # its duration (sessions/worker/relay.py)
        out.append({"ev": ev, "v": v})
    return out
