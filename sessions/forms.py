"""Dashboard forms. They only shape and check what the operator typed; the
commands (sessions.commands) remain the one place that decides, exactly as for
the JSON API."""

from __future__ import annotations

import uuid

from django import forms

from . import inputs, specs

# Saved example specs an operator can start from (the demo model needs no API key).
EXAMPLE_SPECS: dict[str, tuple[str, dict]] = {
    "demo": ("Demo model (offline)", {"model": "demo"}),
    "demo-checkpoint": ("Demo model with turn checkpoints", {"model": "demo", "checkpoint": True}),
    "demo-readonly": ("Demo model, read-only tools", {"model": "demo", "tools": ["read", "memory"]}),
}


def new_key() -> str:
    return str(uuid.uuid4())


class KeyedForm(forms.Form):
    """Carries an Idempotency-Key made when the form is drawn: a double click
    sends the same key twice, so the command acts once."""

    idempotency_key = forms.CharField(widget=forms.HiddenInput, required=False, max_length=255)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            self.initial.setdefault("idempotency_key", new_key())


class SpawnForm(KeyedForm):
    example = forms.ChoiceField(
        label="Saved spec",
        choices=[(k, label) for k, (label, _) in EXAMPLE_SPECS.items()] + [("", "Pasted JSON below")],
        required=False,
        initial="demo",
    )
    spec = forms.CharField(
        label="Spec (JSON)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "class": "mono",
                                     "placeholder": '{"model": "demo", "checkpoint": true}'}),
        help_text="Pasted JSON wins over the saved spec. Unknown keys are refused.",
    )
    parent = forms.CharField(widget=forms.HiddenInput, required=False, max_length=32)
    prompt = forms.CharField(
        label="First prompt",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "say: hello"}),
        help_text="Optional. The demo model reads directives such as say:, run:, sleep:, spawn:.",
    )

    def clean_spec(self):
        raw = self.cleaned_data.get("spec", "").strip()
        if not raw:
            return None
        try:
            value = inputs.loads(raw)
        except inputs.InputError as exc:
            if exc.code == "malformed_json":
                raise forms.ValidationError(f"This is not valid JSON: {exc}.")
            raise forms.ValidationError(f"This spec is refused: {exc}.")
        if not isinstance(value, dict):
            raise forms.ValidationError("The spec must be a JSON object, e.g. {\"model\": \"demo\"}.")
        try:
            specs.validate_for_spawn(value)
        except (specs.SpecError, specs.SandboxUnavailable) as exc:
            raise forms.ValidationError(str(exc))
        return value

    def clean(self):
        data = super().clean()
        if data.get("spec") is None and "spec" not in self.errors:
            example = data.get("example")
            if not example:
                self.add_error("spec", "Paste a spec, or choose a saved one.")
            else:
                data["spec"] = dict(EXAMPLE_SPECS[example][1])
        return data

    def body(self) -> dict:
        """The request body, as the JSON API would receive it."""
        data = self.cleaned_data
        body = {"spec": data["spec"]}
        if data.get("parent"):
            body["parent"] = data["parent"]
        if data.get("prompt", "").strip():
            body["prompt"] = data["prompt"]
        return body


class TextCommandForm(KeyedForm):
    """prompt / steer: a text that must not be empty."""

    text = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
    )

    def __init__(self, verb: str, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.verb = verb
        self.fields["text"].label = "Prompt" if verb == "prompt" else "Steer"
        self.fields["text"].widget.attrs["placeholder"] = (
            "say: hello" if verb == "prompt" else "A nudge for the running turn"
        )

    def clean_text(self):
        text = self.cleaned_data.get("text", "")
        if not text.strip():
            what = "prompt" if self.verb == "prompt" else "steer message"
            raise forms.ValidationError(f"Write a {what} first: it cannot be empty.")
        return text


class ForkForm(KeyedForm):
    """Fork from a checkpoint or from an event ("fork from here"), with a name."""

    checkpoint = forms.IntegerField(required=False, min_value=1, max_value=2**62)
    at_event = forms.IntegerField(required=False, min_value=1, max_value=2**62)
    name = forms.CharField(required=False, max_length=100, strip=True)

    def clean(self):
        data = super().clean()
        if (data.get("checkpoint") is None) == (data.get("at_event") is None):
            raise forms.ValidationError("Fork from a checkpoint or from an event: one of them.")
        return data

    def body(self) -> dict:
        data = self.cleaned_data
        origin = ({"checkpoint": data["checkpoint"]} if data.get("checkpoint") is not None
                  else {"at_event": data["at_event"]})
        return {**origin, **({"name": data["name"]} if data.get("name") else {})}
