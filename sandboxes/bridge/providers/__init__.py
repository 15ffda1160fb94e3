"""Model providers: one step = one model call over the neutral conversation."""

from __future__ import annotations

from .base import ModelError, Provider, StepRequest, StepResult, ToolCall


def make_provider(config: dict, environ) -> Provider:
    """The provider named by config["model"]: "demo", "openai:<model>" or "anthropic:<model>"."""
    model = config.get("model") or "demo"
    kind, _, name = model.partition(":")
    options = config.get("provider") or {}
    if kind == "demo":
        from .demo import DemoProvider
        return DemoProvider()
    if kind == "openai" and name:
        from .openai import OpenAIProvider
        return OpenAIProvider(name, options, environ)
    if kind == "anthropic" and name:
        from .anthropic import AnthropicProvider
        return AnthropicProvider(name, options, environ)
    raise ValueError(f"unknown model {model!r}: use demo, openai:<model> or anthropic:<model>")


__all__ = ["ModelError", "Provider", "StepRequest", "StepResult", "ToolCall", "make_provider"]
