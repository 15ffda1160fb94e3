"""Shared helpers for the benches: a throwaway data dir, Django setup, a
realistic fact generator, medians, and the one result format `bench/run` reads.

Each bench is a standalone script. With `--json PATH` it also writes its rows
there as a JSON list of {"bench", "measured", "baseline", "ratio", "target",
"ok", "unit", "note"} so `bench/run` can print one table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# The sandbox runtime reads the deployment's settings (sandboxes/config.py):
# benches that drive it directly, before or without setup_django(), need them too.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alineo_site.settings")

PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable


# $ALINEO_DATA_DIR as the bench was started with: setup_django() points the
# variable at the bench's own temp dir afterwards.
PARENT_DATA_DIR = os.environ.get("ALINEO_DATA_DIR") or None


# What a live server adds below its data dir to reach a bridge socket
# (tests/live.py's live/srv-XXXXXXXX, then run/<agent id>/bridge.sock).
SOCKET_TAIL = len("/live/srv-xxxxxxxx/run/ag_0123456789abcdef/bridge.sock")
from sandboxes.bridge.protocol import MAX_SOCKET_PATH as AF_UNIX_MAX  # noqa: E402


def make_data_dir(prefix: str, sockets: bool = False) -> Path:
    """A fresh temp data dir: under $ALINEO_DATA_DIR when set (make bench sets a
    throwaway one), else under the system temp dir. Never the real ./var.

    sockets=True: a live server will put bridge sockets below it, so if that
    parent would make their paths longer than AF_UNIX allows, a short dir
    under /tmp is used instead (and said so on stderr)."""
    parent = PARENT_DATA_DIR
    if parent:
        Path(parent).mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"alineo-bench-{prefix}-", dir=parent))
    if sockets and len(str(path)) + SOCKET_TAIL > AF_UNIX_MAX:
        path.rmdir()
        path = Path(tempfile.mkdtemp(prefix=f"ab-{prefix[:4]}-", dir="/tmp"))
        sys.stderr.write(f"bench: {parent} is too long a parent for bridge sockets; using {path}\n")
    return path


def setup_django(data_dir: Path, database_url: str | None = None) -> None:
    """Point Django at a temp SQLite file (or at `database_url`, a scratch
    PostgreSQL database from bench/_pg.py), set it up and migrate it (quietly)."""
    os.environ["ALINEO_DATA_DIR"] = str(data_dir)
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    os.environ.pop("ALINEO_DB_PATH", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "alineo_site.settings"
    os.environ.setdefault("ALINEO_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def cleanup(data_dir: Path) -> None:
    shutil.rmtree(data_dir, ignore_errors=True)


def make_agents(n: int, workspace_name: str = "bench") -> list[str]:
    from sessions.models import Agent, Workspace

    ws, _ = Workspace.objects.get_or_create(name=workspace_name)
    return [Agent.objects.create(workspace=ws, spec={"model": "demo"}).id for _ in range(n)]


# A turn as the bridge reports it: ~170-byte JSON rows on average.
_TURN = [
    ("turn.started", {"turn": 0}),
    ("message.user", {"text": "run: pytest -q tests/unit and fix whatever fails in the journal module"}),
    ("message.assistant", {"text": "Running the unit tests first to see what fails before touching anything."}),
    ("tool.dispatched", {"tool_call_id": "", "name": "shell", "input": {"cmd": "pytest -q tests/unit"}}),
    ("tool.result", {"tool_call_id": "", "output": "12 passed in 0.84s", "exit_code": 0}),
    ("message.assistant", {"text": "All twelve unit tests pass; nothing in the journal module needs fixing."}),
    ("turn.finished", {"turn": 0}),
]


def facts(start_seq: int, n: int) -> list[tuple[str, dict]]:
    """n facts that continue a well-formed conversation from seq start_seq + 1."""
    out = []
    for i in range(start_seq, start_seq + n):
        etype, data = _TURN[i % len(_TURN)]
        data = dict(data)
        if "tool_call_id" in data:
            data["tool_call_id"] = f"call_{i // len(_TURN)}"
        if "turn" in data:
            data["turn"] = i // len(_TURN) + 1
        out.append((etype, data))
    return out


def median(xs) -> float:
    return statistics.median(xs)


def pct(xs, p: float) -> float:
    """The p-th percentile of xs, linearly interpolated between ranks."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = p / 100.0 * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def now() -> float:
    return time.perf_counter()


def row(bench, measured, baseline, ratio, target, ok, unit="", note=""):
    return {
        "bench": bench,
        "measured": measured,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        "ok": ok,
        "unit": unit,
        "note": note,
    }


def fmt_num(v) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def print_table(rows, out=sys.stdout) -> None:
    head = ["row", "measured", "baseline", "ratio", "target", "result"]
    body = []
    for r in rows:
        unit = f" {r['unit']}" if r.get("unit") else ""
        ratio = r.get("ratio")
        body.append(
            [
                r["bench"],
                fmt_num(r["measured"]) + (unit if not isinstance(r["measured"], str) else ""),
                fmt_num(r["baseline"]) + (unit if isinstance(r["baseline"], (int, float)) else ""),
                "-" if ratio is None else (ratio if isinstance(ratio, str) else f"{ratio:.2f}x"),
                r["target"],
                "pass" if r["ok"] is True else ("FAIL" if r["ok"] is False else
                                                ("skipped" if r["measured"] == "skipped" else str(r["ok"]))),
            ]
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |"
    out.write(line + "\n")
    out.write("|" + "|".join("-" * (w + 2) for w in widths) + "|\n")
    for b in body:
        out.write("| " + " | ".join(c.ljust(w) for c, w in zip(b, widths)) + " |\n")
    for r in rows:
        if r.get("note"):
            out.write(f"  {r['bench']}: {r['note']}\n")
    out.flush()


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", help="also write the result rows to this file (bench/run uses it)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run, numbers are noisier)")
    p.add_argument("--pg-child", metavar="URL", help=argparse.SUPPRESS)  # bench/_pg.py: the PostgreSQL half
    return p


def emit(rows, args) -> None:
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def json_text(data: dict) -> str:
    """Data encoded exactly as sessions.journal stores it."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
