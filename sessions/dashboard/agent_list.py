"""GET /agents/: every agent the user may see, as a list that scales to
thousands — search by name or id, filter by status (ended agents archived
out of the way: the default shows the active ones), sort by last activity or
creation, the last message's first line, and pages of PAGE_SIZE.

A page costs a fixed number of queries whatever the number of agents: the
count, the page's rows (last activity is the row's updated_at, which the
journal bumps with every fact; the last message is a subquery per row of the
page only) and one GROUP BY for the filter's counts. No transcript is
replayed and no sandbox is woken. The tree page (live, sessions/dashboard/
tree.py and its stream) is unchanged; this list links to each agent's page."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.paginator import Paginator
from django.db.models import Count, JSONField, OuterRef, Q, Subquery
from django.shortcuts import render
from django.views.decorators.http import require_GET

from ..models import ENDED, AgentStatus, Event
from .common import login_required, visible_agents

PAGE_SIZE = 50
QUERY_MAX = 100
LINE_MAX = 140
MESSAGE_TYPES = ("message.user", "message.assistant")
#: Filters: the active agents (the default), the archived (ended) ones, all, or one status.
SHOWS = {"active": ~Q(status__in=ENDED), "archived": Q(status__in=ENDED), "all": Q()}
SORTS = {"activity": ("-updated_at", "-id"), "created": ("-created_at", "-id"),
         "oldest": ("created_at", "id")}
SORT_LABELS = {"activity": "Last activity", "created": "Newest first", "oldest": "Oldest first"}


@dataclass(frozen=True)
class ListQuery:
    """What the operator asked for, each part checked (a bad value falls back, and is said)."""

    q: str
    show: str
    sort: str
    page: str
    notes: tuple[str, ...]


def read_query(params) -> ListQuery:
    notes = []
    q = params.get("q", "").replace("\x00", "").strip()
    if len(q) > QUERY_MAX:
        q, _ = q[:QUERY_MAX], notes.append(f"The search was cut to its first {QUERY_MAX} characters.")
    show = params.get("status", "active")
    if show not in SHOWS and show not in AgentStatus.values:
        notes.append(f"There is no status {show[:40]!r}: showing the active agents.")
        show = "active"
    sort = params.get("sort", "activity")
    if sort not in SORTS:
        notes.append(f"Cannot sort by {sort[:40]!r}: sorted by last activity.")
        sort = "activity"
    return ListQuery(q, show, sort, params.get("page", "1"), tuple(notes))


def _filtered(user, query: ListQuery):
    agents = visible_agents(user)
    if query.q:
        agents = agents.filter(Q(id__icontains=query.q) | Q(spec__name__icontains=query.q))
    counts = dict(agents.order_by().values_list("status").annotate(n=Count("id")))
    shown = agents.filter(SHOWS[query.show] if query.show in SHOWS else Q(status=query.show))
    return shown, counts


def last_messages(agents):
    newest = (Event.objects.filter(agent=OuterRef("pk"), type__in=MESSAGE_TYPES)
              .order_by("-seq").values("data")[:1])
    return agents.annotate(last_message=Subquery(newest, output_field=JSONField()))


def first_line(data) -> str:
    text = data.get("text") if isinstance(data, dict) else None
    if not isinstance(text, str):
        return ""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= LINE_MAX else line[:LINE_MAX - 1] + "…"


@require_GET
@login_required
def agent_list(request):
    query = read_query(request.GET)
    shown, counts = _filtered(request.user, query)
    ordered = last_messages(shown.order_by(*SORTS[query.sort]).select_related("workspace"))
    page = Paginator(ordered, PAGE_SIZE).get_page(query.page)  # a bad page number: the nearest
    rows = [{"agent": a, "line": first_line(a.last_message),
             "ended": a.status in ENDED} for a in page.object_list]
    ended = sum(n for s, n in counts.items() if s in ENDED)
    context = {"rows": rows, "page": page, "query": query, "sort_labels": SORT_LABELS,
               "statuses": AgentStatus.values, "active_count": sum(counts.values()) - ended,
               "archived_count": ended, "total": sum(counts.values())}
    template = "sessions/_agent_results.html" if getattr(request, "htmx", False) else "sessions/agents.html"
    return render(request, template, context)
