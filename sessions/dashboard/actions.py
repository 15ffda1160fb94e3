"""Spawn and the agent commands, from the tree and the agent page. They call
sessions.commands exactly as the JSON API does, with the form's
Idempotency-Key (header from alineo.js, or the hidden field without JS), so a
double click or a retried request acts once."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from .. import commands
from ..forms import SpawnForm, TextCommandForm
from .common import agent_or_404, login_required, open_new_agent, summarize

SPEC_CODES = ("spawn.escalation", "quota.limits")

VERB_LABELS = {
    "prompt": "Prompt",
    "steer": "Steer",
    "interrupt": "Interrupt",
    "pause": "Pause",
    "resume": "Resume",
    "stop": "Stop",
}


def action_forms() -> dict:
    return {"prompt_form": TextCommandForm("prompt"), "steer_form": TextCommandForm("steer")}


def _key(request, form) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if not key and form.is_valid():
        key = form.cleaned_data.get("idempotency_key")
    elif not key:
        key = request.POST.get("idempotency_key")
    return key or None


@require_http_methods(["GET", "POST"])
@login_required
def spawn(request):
    parent = None
    parent_id = request.POST.get("parent") or request.GET.get("parent")
    if parent_id:
        parent = agent_or_404(request.user, parent_id)
    status = 200
    if request.method == "POST":
        form = SpawnForm(request.POST)
        if form.is_valid():
            try:
                outcome = commands.spawn(request.user, form.body(), _key(request, form))
            except commands.CommandRefused as exc:
                status = exc.status
                # A spec the workspace or the parent does not allow is shown on
                # the spec; another quota (agents, depth) above the form.
                field = "spec" if exc.code.startswith("spec.") or exc.code in SPEC_CODES else None
                if exc.code == "request.text_too_long" or "prompt" in exc.message[:7]:
                    field = "prompt"
                form.add_error(field, exc.message)
            else:
                return open_new_agent(request, outcome, "Spawned", "Already spawned")
        else:
            status = 400
    else:
        form = SpawnForm(initial={"parent": parent.id if parent else ""})
    return render(request, "sessions/spawn.html", {"form": form, "parent": parent}, status=status)


@require_POST
@login_required
def command(request, agent_id: str, verb: str):
    if verb not in VERB_LABELS:
        raise Http404("No such command.")
    agent = agent_or_404(request.user, agent_id)
    form = TextCommandForm(verb, request.POST)
    status, note, replayed = 200, None, False
    if verb in commands.TEXT_VERBS:
        ok = form.is_valid()
        body = {"text": form.cleaned_data["text"]} if ok else None
    else:
        ok, body = True, {}
    if not ok:
        status = 400
    else:
        try:
            outcome = commands.send(request.user, agent.id, verb, body, _key(request, form))
        except commands.CommandRefused as exc:
            status = exc.status
            if verb in commands.TEXT_VERBS and exc.code.startswith("request."):
                form.add_error("text", exc.message)
            else:
                note = ("error", exc.message)
        else:
            replayed = outcome.replayed
            what = VERB_LABELS[verb]
            text = f"{what} sent (transcript #{outcome.body.get('seq')})."
            if replayed:
                text = f"{what} was already sent by this click (#{outcome.body.get('seq')}); not sent twice."
            if verb == "pause":
                text += " The current step finishes first."
            note = ("success", text)
    agent.refresh_from_db()
    forms = action_forms()
    if status >= 400 and verb in commands.TEXT_VERBS:
        forms[f"{verb}_form"] = form  # errors next to the field, text kept
    compact = request.POST.get("compact") == "1"
    if request.htmx:
        context = {**summarize(agent), **forms, "note": note, "compact": compact,
                   "open_verb": verb if status >= 400 and verb in commands.TEXT_VERBS else None}
        return render(request, "sessions/_actions.html", context, status=status)
    if note:
        getattr(messages, note[0])(request, note[1])
    if status >= 400 and verb in commands.TEXT_VERBS:
        for error in form.errors.get("text", []):
            messages.error(request, error)
    # Only a path on this site; and not through redirect(), which takes a bare
    # word ("²") for a view name and raises NoReverseMatch, a 500.
    back = request.POST.get("next") or ""
    if not back.startswith("/") or not url_has_allowed_host_and_scheme(
            back, {request.get_host()}, require_https=request.is_secure()):
        back = reverse("dash-agent", kwargs={"agent_id": agent.id})
    return HttpResponseRedirect(back)
