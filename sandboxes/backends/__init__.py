"""Sandbox backends: docker (containers) and local (directory + process group)."""

from sandboxes.backends.base import (  # noqa: F401
    ExecResult,
    Limits,
    SandboxBackend,
    SandboxHandle,
    SandboxStatus,
    get_backend,
)
