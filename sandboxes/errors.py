"""The one exception root of the sandbox layer.

Every failure a backend reports is a :class:`SandboxError`. ``permanent`` tells
the caller whether trying the same thing again can help: a missing sandbox will
stay missing (climb the restore ladder instead), while an engine that does not
answer may answer in a moment (retry with backoff).
"""

from __future__ import annotations


class SandboxError(Exception):
    """Root of every sandbox failure. ``permanent=True``: retrying cannot help."""

    permanent_default = False

    def __init__(self, message: str, permanent: bool | None = None):
        super().__init__(message)
        self.message = message
        self.permanent = self.permanent_default if permanent is None else permanent

    def __str__(self) -> str:
        return self.message


class SandboxNotFound(SandboxError):
    """The sandbox (container or directory) does not exist (any more)."""

    permanent_default = True


class SandboxNotRunning(SandboxError):
    """The sandbox exists but is not running, so it cannot exec (start it first)."""

    permanent_default = False


class ImageMissing(SandboxError):
    """The image or snapshot to create a sandbox from does not exist."""

    permanent_default = True


class BackendUnavailable(SandboxError):
    """The backend cannot be reached (no Docker engine answers, ...)."""

    permanent_default = False


class ExecFailed(SandboxError):
    """A one-shot command could not be run, timed out, or failed where success was required."""

    permanent_default = False

    def __init__(self, message: str, permanent: bool | None = None, *, exit_code=None,
                 stderr: bytes = b""):
        super().__init__(message, permanent)
        self.exit_code = exit_code
        self.stderr = stderr


class UnsafeArchive(SandboxError):
    """A tar stream holds an entry that would escape its destination, or a device file."""

    permanent_default = True


class ExecTimeout(ExecFailed):
    """A one-shot command ran past its timeout and was killed; ``result`` holds
    what it printed until then."""

    def __init__(self, message: str, *, result=None):
        super().__init__(message, exit_code=getattr(result, "exit_code", None),
                         stderr=getattr(result, "stderr", b""))
        self.result = result
