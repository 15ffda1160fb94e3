"""Credential bindings: secrets stored per workspace, bound to agents by name.

A spec names bindings `{"name", "env", "approval", "inject"}`; the control
plane holds the values. They are resolved only where a sandbox starts (its
environment, for `inject: env`), where the model gateway calls the upstream
(`inject: gateway`, the default for the model's key and base URL) and where
bridge output is journaled (to redact them). Nothing else reads them.
"""

from __future__ import annotations

from typing import Any

from sandboxes.launch import Secret

from .models import Credential, Workspace
from .specs import SpecError, inject_of

# Shorter values would redact ordinary words; such a "secret" protects nothing anyway.
MIN_REDACT_LEN = 6


def set_secret(workspace: Workspace, name: str, value: str) -> Credential:
    cred, _ = Credential.objects.update_or_create(
        workspace=workspace, name=name, defaults={"secret": value}
    )
    return cred


def check_bindings(workspace: Workspace, bindings: list[dict]) -> None:
    """Every binding must name a credential of the workspace (SpecError otherwise)."""
    names = {b["name"] for b in bindings}
    if not names:
        return
    known = set(Credential.objects.filter(workspace=workspace, name__in=names).values_list("name", flat=True))
    for i, binding in enumerate(bindings):
        if binding["name"] not in known:
            raise SpecError(
                f"credentials[{i}].name",
                f"no credential named {binding['name']!r} in workspace {workspace.name!r}; "
                "an admin adds it with `manage.py set_credential` or in the admin",
            )


def secrets_for(workspace_id: int, bindings: list[dict]) -> list[Secret]:
    """The bound secrets (a binding whose credential was deleted is skipped)."""
    names = {b.get("name") for b in bindings or []}
    values = dict(
        Credential.objects.filter(workspace_id=workspace_id, name__in=names).values_list("name", "secret")
    )
    return [Secret(b["name"], b["env"], values[b["name"]], inject_of(b))
            for b in bindings or [] if b.get("name") in values]


def redact(value: Any, secrets: list[Secret]) -> Any:
    """`value` with every secret's text replaced by `[redacted:<name>]`, recursively."""
    if not secrets:
        return value
    if isinstance(value, str):
        for secret in secrets:
            if len(secret.value) >= MIN_REDACT_LEN and secret.value in value:
                value = value.replace(secret.value, f"[redacted:{secret.name}]")
        return value
    if isinstance(value, dict):
        return {k: redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secrets) for v in value]
    return value


class StreamRedactor:
    """Redaction of what a bridge reports, also when a bound value is split
    across the ``message.delta`` chunks of a reply: a delta's tail that could
    be the start of a value is held back and put before the next delta of the
    same turn. What is held back when the step ends is dropped — the step's
    whole text follows in ``message.assistant`` (and the turn's in
    ``turn.finished``/``turn.interrupted``), redacted whole — so a value never
    reaches the transcript in pieces."""

    def __init__(self, secrets: list[Secret] | tuple[Secret, ...] | None):
        self.secrets = [s for s in secrets or () if len(s.value) >= MIN_REDACT_LEN]
        self.carry: dict[Any, str] = {}

    def redact(self, etype: str, data: dict) -> dict:
        turn = data.get("turn")
        if etype != "message.delta" or not isinstance(data.get("text"), str):
            self.carry.pop(turn, None)
            return redact(data, self.secrets)
        text = redact(self.carry.pop(turn, "") + data["text"], self.secrets)
        held = self._held(text)
        if held:
            self.carry[turn] = text[-held:]
            text = text[:-held]
        return {**redact(data, self.secrets), "text": text}

    def _held(self, text: str) -> int:
        """The length of the longest tail of ``text`` that begins a bound value."""
        longest = 0
        for secret in self.secrets:
            for n in range(min(len(secret.value) - 1, len(text)), longest, -1):
                if text.endswith(secret.value[:n]):
                    longest = n
                    break
        return longest
