"""GET /agents/{id}/files: the agent's home as of each turn checkpoint —
directories, files (the first VIEW_LIMIT bytes; binary shown as such) and
what each turn changed (the checkpoint against the one before it, file by
file, with a text diff per file) — read from the checkpoint files, never from
the sandbox (reading wakes nothing). Checkpoints came from inside a sandbox:
sandboxes/home_files.py reads them bounded and never follows a name out.

Query: ``checkpoint`` (its id; default the newest), ``path`` (a directory or a
file of the home), ``changes=1`` (what its turn changed), ``diff=1`` with a
file's path (that file's change), ``live=1`` (the live home instead: see
sessions/dashboard/live_files.py; its changes are against the newest
checkpoint). Bad input is a readable 400 or 404 page."""

from __future__ import annotations

import difflib
from typing import NamedTuple

from django.http import Http404
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from sandboxes import home_files
from sandboxes.errors import UnsafeArchive
from sandboxes.tar_rules import clean_name

from ..models import Checkpoint, LiveHome
from . import live_files
from .common import agent_or_404, bad_request, login_required

DIFF_LINES = 2000
CHANGES_SHOWN = 500


class Source(NamedTuple):
    """What the page reads: a checkpoint, or a live home (never both)."""

    path: str  # the zstd tar
    query: str  # how links name it: "checkpoint=<id>" or "live=1"
    cp: Checkpoint | None
    live: LiveHome | None
    previous: Checkpoint | None  # what "changes" compares with


def _checkpoints(agent) -> list[Checkpoint]:
    """Its checkpoints still on disk and not expired under its workspace's policy, newest turn first."""
    now, days = timezone.now(), agent.workspace.checkpoint_max_age_days
    rows = agent.checkpoints.filter(deleted_at=None).exclude(path="").order_by("-turn", "-created_at")
    return [c for c in rows[:50] if c.expires_under(days) > now]


def _chosen(rows: list[Checkpoint], raw: str | None) -> Checkpoint | None:
    if raw in (None, ""):
        return rows[0] if rows else None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise Http404("No such checkpoint.")
    found = next((c for c in rows if c.pk == int(raw)), None)
    if found is None:
        raise Http404("No such checkpoint of this agent (it may have expired).")
    return found


def _previous(rows: list[Checkpoint], cp: Checkpoint) -> Checkpoint | None:
    older = [c for c in rows if (c.turn, c.created_at) < (cp.turn, cp.created_at)]
    return older[0] if older else None


def _children(listing: home_files.Listing, path: str) -> list[home_files.Entry]:
    prefix = path + "/" if path else ""
    kids = [e for name, e in listing.entries.items()
            if name.startswith(prefix) and "/" not in name[len(prefix):]]
    return sorted(kids, key=lambda e: (e.kind != "dir", e.name))


def _text(view: home_files.FileView | None) -> list[str]:
    if view is None or view.binary:
        return []
    return view.data.decode("utf-8", errors="replace").splitlines()


def _diff(before_path, after_path, name: str) -> dict:
    before = home_files.read_file(before_path, name) if before_path else None
    after = home_files.read_file(after_path, name)
    if (before and before.binary) or (after and after.binary):
        return {"binary": True, "lines": []}
    lines = list(difflib.unified_diff(_text(before), _text(after), "before/" + name,
                                      "after/" + name, lineterm="", n=3))
    return {"binary": False, "lines": lines[:DIFF_LINES], "cut": len(lines) > DIFF_LINES,
            "partial": bool((before and before.truncated) or (after and after.truncated))}


@require_GET
@login_required
def files(request, agent_id: str):
    agent = agent_or_404(request.user, agent_id)
    rows = _checkpoints(agent)
    try:
        path = clean_name(request.GET.get("path", "")[:home_files.NAME_MAX])
    except UnsafeArchive:
        return bad_request(request, "That path leaves the agent's home (absolute, '..' or a NUL).")
    live = live_files.newest(agent)
    if request.GET.get("live") == "1":
        src = Source(live.path, "live=1", None, live, rows[0] if rows else None) if live else None
    else:
        cp = _chosen(rows, request.GET.get("checkpoint"))
        src = Source(cp.path, f"checkpoint={cp.pk}", cp, None, _previous(rows, cp)) if cp else None
    context = {"agent": agent, "checkpoints": rows, "src": src, "cp": src and src.cp,
               "path": path, "crumbs": _crumbs(path), "limit": home_files.VIEW_LIMIT,
               "live_view": request.GET.get("live") == "1", "has_live": live is not None,
               **live_files.look(request, agent)}
    if src is None:
        return render(request, "sessions/files.html", context)
    try:
        context.update(_page(request, src, path))
    except home_files.HomeUnreadable as exc:
        context["unreadable"] = str(exc)
    return render(request, "sessions/files.html", context)


def _page(request, src: Source, path: str) -> dict:
    listing = home_files.listing(src.path)
    previous = src.previous
    out = {"previous": previous, "skipped": listing.skipped, "truncated": listing.truncated}
    if request.GET.get("changes") == "1":
        before = _readable(previous)
        found = home_files.changes(before, listing)
        return {**out, "mode": "changes", "changes": found[:CHANGES_SHOWN],
                "more_changes": max(0, len(found) - CHANGES_SHOWN), "since_start": before is None}
    entry = listing.entries.get(path) if path else None
    if path and entry is None:
        raise Http404("No such file or directory in this " + ("live home." if src.live else "checkpoint."))
    if entry is not None and entry.kind == "file":
        if request.GET.get("diff") == "1":
            before = previous.path if _readable(previous) is not None else None
            return {**out, "mode": "diff", "entry": entry, "diff": _diff(before, src.path, path)}
        view = home_files.read_file(src.path, path)
        return {**out, "mode": "file", "entry": entry, "view": view,
                "text": None if view is None or view.binary else view.data.decode("utf-8", "replace")}
    if entry is not None and entry.kind != "dir":
        return {**out, "mode": "other", "entry": entry}
    return {**out, "mode": "dir", "entries": _children(listing, path)}


def _readable(cp: Checkpoint | None) -> home_files.Listing | None:
    if cp is None:
        return None
    try:
        return home_files.listing(cp.path)
    except home_files.HomeUnreadable:
        return None


def _crumbs(path: str) -> list[tuple[str, str]]:
    parts = path.split("/") if path else []
    return [(p, "/".join(parts[:i + 1])) for i, p in enumerate(parts)]
