"""What every provider takes and returns."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable

from ..cancel import CancelToken


class ModelError(Exception):
    """The model call failed (HTTP error, garbage, timeout, stream cut short).
    The message is shown in the transcript: it never holds the API key."""


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
