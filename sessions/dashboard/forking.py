"""Fork, and approve or deny held credentials, from where the operator looks: a checkpoint in the side panel, or a
settled turn in the transcript ("fork from here"), each behind a confirmation
with a name field. Through sessions.commands.fork, as the API, with the form's
Idempotency-Key; the new agent's page follows."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from .. import commands
from ..forms import ForkForm
from .common import agent_or_404, bad_request, login_required, open_new_agent


@require_POST
@login_required
def fork(request, agent_id: str):
    agent = agent_or_404(request.user, agent_id)
    form = ForkForm(request.POST)
    if not form.is_valid():
        errors = [e for field in form.errors.values() for e in field]
        return bad_request(request, " ".join(str(e) for e in errors))
    key = request.headers.get("Idempotency-Key") or form.cleaned_data.get("idempotency_key") or None
    try:
        outcome = commands.fork(request.user, agent.id, form.body(), key)
    except commands.CommandRefused as exc:
        response = bad_request(request, exc.message)
        response.status_code = exc.status
        return response
    return open_new_agent(request, outcome, f"Forked {agent.id} as", "Already forked")


@require_POST
@login_required
def approve(request, agent_id: str):
    """Approve the held credentials the agent waits for, with a reason; who
    approved and why are journaled (credential.approved)."""
    return _decide(request, agent_id, commands.approve, lambda body: (
        "Approved: the sandbox starts now." if not body.get("waiting_for")
        else f"Approved; still waiting for {', '.join(body['waiting_for'])}."))


@require_POST
@login_required
def deny(request, agent_id: str):
    """Deny the held credentials the agent waits for, with a reason (required);
    who denied and why are journaled (credential.denied), and the agent ends
    as lost: it cannot start without them."""
    return _decide(request, agent_id, commands.deny, lambda body: (
        f"Denied {', '.join(body.get('bindings') or [])}: the agent cannot start and ends as lost."))


def _decide(request, agent_id: str, command, said) -> HttpResponse:
    agent = agent_or_404(request.user, agent_id)
    reason = request.POST.get("reason", "")
    key = request.headers.get("Idempotency-Key") or request.POST.get("idempotency_key") or None
    try:
        outcome = command(request.user, agent.id, {"reason": reason}, key)
    except commands.CommandRefused as exc:
        response = bad_request(request, exc.message)
        response.status_code = exc.status
        return response
    messages.success(request, said(outcome.body))
    return redirect("dash-agent", agent_id=agent.id)
