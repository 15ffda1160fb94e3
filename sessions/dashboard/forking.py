"""Fork, and approve held credentials, from where the operator looks: a checkpoint in the side panel, or a
settled turn in the transcript ("fork from here"), each behind a confirmation
with a name field. Through sessions.commands.fork, as the API, with the form's
Idempotency-Key; the new agent's page follows."""

from __future__ import annotations

from django.contrib import messages
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
    agent = agent_or_404(request.user, agent_id)
    reason = request.POST.get("reason", "")
    key = request.headers.get("Idempotency-Key") or request.POST.get("idempotency_key") or None
    try:
        outcome = commands.approve(request.user, agent.id, {"reason": reason}, key)
    except commands.CommandRefused as exc:
        response = bad_request(request, exc.message)
        response.status_code = exc.status
        return response
    waiting = outcome.body.get("waiting_for") or []
    messages.success(request, "Approved: the sandbox starts now." if not waiting
                     else f"Approved; still waiting for {', '.join(waiting)}.")
    return redirect("dash-agent", agent_id=agent.id)
