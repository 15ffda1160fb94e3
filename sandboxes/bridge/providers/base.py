"""What every provider takes and returns."""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Callable

from ..cancel import CancelToken


class ModelError(Exception):
    """The model call failed (HTTP error, garbage, timeout, stream cut short).
    The message is shown in the transcript: it never holds the API key."""


class ConnectionLost(ModelError):
    """The connection ended before a whole answer came (refused, reset, closed
    mid-stream): through the gateway, the control plane went away."""


class BudgetExceeded(ModelError):
    """The gateway refused the call: the workspace's daily budget is spent."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    input: dict

    def as_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "input": self.input}


@dataclass
class StepRequest:
    messages: list[dict]          # the neutral conversation (conversation.py)
    tools: list[dict]             # [{"name", "description", "input_schema"}]
    system: str = ""
    turn: int = 0                 # for providers that derive ids (demo)
    step: int = 0


@dataclass
class StepResult:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop_reason: str = ""


OnDelta = Callable[[str], None]


class Provider(abc.ABC):
    """One model. ``step`` streams text through ``on_delta`` as it arrives and
    returns the complete step; it raises ModelError on failure and must give up
    promptly when ``cancel`` fires."""

    label: str = ""

    @abc.abstractmethod
    def step(self, request: StepRequest, on_delta: OnDelta, cancel: CancelToken) -> StepResult: ...


class Resent(Provider):
    """A model call through the gateway whose connection was cut before any of
    its text arrived (the control plane died or restarted mid-call) is asked
    again until ``wait_s`` passes: the forwarder waits for the new gateway, and
    the gateway answers a call it had already journaled from its journal
    (model.replayed), so only a call still in flight at the crash reaches the
    upstream twice (docs/DURABILITY.md)."""

    RETRY_S = 0.5

    def __init__(self, inner: Provider, wait_s: float = 300.0):
        self.inner = inner
        self.label = inner.label
        self.wait_s = wait_s

    def step(self, request: StepRequest, on_delta: OnDelta, cancel: CancelToken) -> StepResult:
        deadline = time.monotonic() + self.wait_s
        while True:
            said: list[str] = []

            def delta(text: str) -> None:
                said.append(text)
                on_delta(text)

            try:
                return self.inner.step(request, delta, cancel)
            except ConnectionLost:
                # Text already shown cannot be taken back: asking again would say it twice.
                if said or time.monotonic() >= deadline:
                    raise
            cancel.wait(self.RETRY_S)
            cancel.check()
