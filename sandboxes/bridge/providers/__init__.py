"""Model providers: one step = one model call over the neutral conversation."""

from __future__ import annotations

from .base import BudgetExceeded, ConnectionLost, ModelError, Provider, Resent, StepRequest, StepResult, ToolCall


def make_provider(config: dict, environ) -> Provider:
    """The provider named by config["model"]: "demo", "openai:<model>" or "anthropic:<model>"."""
    model = config.get("model") or "demo"
    kind, _, name = model.partition(":")
    options = config.get("provider") or {}
    if config.get("gateway"):
        return _through_gateway(model, kind, name, options, environ)
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


def _through_gateway(model: str, kind: str, name: str, options: dict, environ) -> Provider:
    """Every model through the control plane's gateway (environ has its base
    URLs and the placeholder key, config.gateway_env): the demo and OpenAI
    models speak chat completions to it, Anthropic models the Messages API."""
    kept = {k: v for k, v in options.items() if k in ("timeout", "max_tokens")}
    if kind == "anthropic" and name:
        from .anthropic import AnthropicProvider
        provider: Provider = AnthropicProvider(name, kept, environ)
    elif kind == "demo" or (kind == "openai" and name):
        from .openai import OpenAIProvider
        provider = OpenAIProvider(name or "demo", kept, environ)
    else:
        raise ValueError(f"unknown model {model!r}: use demo, openai:<model> or anthropic:<model>")
    provider.label = model
    return Resent(provider)


__all__ = ["BudgetExceeded", "ConnectionLost", "ModelError", "Provider", "StepRequest", "StepResult", "ToolCall", "make_provider"]
