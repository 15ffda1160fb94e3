"""The neutral model call both wire formats are read into and written from."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Api(str, enum.Enum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class Role(str, enum.Enum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Stop(str, enum.Enum):
    END = "end"
    TOOL_USE = "tool_use"
    MAX_TOKENS = "max_tokens"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    schema: dict


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    input: dict


@dataclass(frozen=True)
class Message:
    """One message: a user's text, an assistant's text and tool calls, or one
    tool result (``tool_call_id`` names the call it answers)."""
    role: Role
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    is_error: bool = False


@dataclass(frozen=True)
class ModelRequest:
    api: Api
    model: str
    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    stream: bool = False
    max_tokens: int | None = None
    stream_usage: bool = False        # OpenAI's stream_options.include_usage


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass(frozen=True)
class ModelReply:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    stop: Stop = Stop.END
    usage: Usage = field(default_factory=Usage)
