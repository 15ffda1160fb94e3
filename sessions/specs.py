"""Spec validation: a spec is the JSON that describes an agent.

Every field has a working default, so `{}` and `{"model": "demo"}` are valid
specs. `validate()` returns a normalized copy with every default filled in, so
the rest of the system (and the transcript's `agent.spawned` fact) never has to
guess what a missing field meant. Specs hold no secrets: a credential is bound
by name, and its value lives outside the spec.

`validate()` is pure (no engine, no database). `check_available()` adds what
needs the sandbox backend — an `image` other than "default" must exist there —
and `validate_for_spawn()` does both: call it where an agent is about to be
created, before anything is written.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any, Callable

from sandboxes import harnesses, images
from sandboxes.backends import get_backend
from sandboxes.backends.base import NETWORKS
from sandboxes.errors import SandboxError

TOOLS = ("bash", "read", "write", "edit", "spawn", "memory")
HOOKS = ("session_start", "pre_tool_use", "stop")
APPROVALS = ("auto", "hold")
# Where a bound value goes: the sandbox's environment, or only the model
# gateway, which adds it to the upstream request (docs/GATEWAY.md). The
# model's key and base URL go to the gateway unless a binding says "env".
INJECTS = ("env", "gateway")
GATEWAY_ENVS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")
PROVIDERS = ("openai", "anthropic")
DEFAULT_IMAGE = images.DEFAULT_IMAGE  # the project's base image (sandboxes/images.py)
#: The env variable a provider's key is read from (sandboxes/bridge/config.py).
PROVIDER_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}

# Upper bounds keep a typo (memory_mb: 10**20) from reaching a backend as an
# integer no database column or container runtime can hold.
LIMIT_MAX = {"memory_mb": 1 << 20, "pids": 1 << 22, "cpus": 1024}

DEFAULTS: dict[str, Any] = {
    "model": "demo",
    "image": DEFAULT_IMAGE,
    "packages": [],
    "setup": [],
    "tools": list(TOOLS),
    "checkpoint": False,
    "credentials": [],
    "network": "none",
    "limits": {"memory_mb": 2048, "pids": 512, "cpus": 1.0},
    "hooks": {},
    "run_as": "root",
    "name": "",
    "harness": harnesses.BUILTIN,  # or "pi" (docs/HARNESSES.md)
}

_PACKAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+._:=~<>-]{0,199}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
_SECRETISH = {"value", "secret", "token", "key", "password", "api_key"}


class SpecError(ValueError):
    """A spec field is wrong. `field` names it (e.g. "limits.memory_mb")."""

    def __init__(self, field: str, message: str):
        super().__init__(f"spec.{field}: {message}" if field else f"spec: {message}")
        self.field, self.message = field, message


def validate(spec: Any) -> dict[str, Any]:
    """Return `spec` normalized, with defaults filled in; raise SpecError if it is wrong."""
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise SpecError("", "must be a JSON object")
    unknown = sorted(set(spec) - set(DEFAULTS))
    if unknown:
        raise SpecError(
            unknown[0],
            f"unknown key(s): {', '.join(unknown)}; known keys are {', '.join(DEFAULTS)}",
        )
    out = copy.deepcopy(DEFAULTS)
    for key, check in _CHECKS.items():
        if key in spec:
            out[key] = check(key, spec[key])
    out["limits"] = {**DEFAULTS["limits"], **out["limits"]}
    _check_together(out)
    return out


def _check_together(spec: dict[str, Any]) -> None:
    """Checks that involve more than one field."""
    if spec["packages"] and spec["network"] != "host":
        raise SpecError(
            "packages",
            'packages need network: host (they are installed from the Debian mirror at '
            'setup); set "network": "host" or install nothing',
        )
    if spec["harness"] == harnesses.PI and spec["hooks"].get("pre_tool_use"):
        raise SpecError(
            "hooks.pre_tool_use",
            "the pi harness runs its tools itself and has no pre_tool_use hook; "
            "use session_start and stop, or the built-in harness (docs/HARNESSES.md)",
        )
    provider = spec["model"].partition(":")[0]
    key_env = PROVIDER_KEY_ENV.get(provider)
    if key_env and key_env not in {b["env"] for b in spec["credentials"]}:
        raise SpecError(
            "credentials",
            f"the model {spec['model']!r} needs a credential binding that provides "
            f'{key_env}, e.g. {{"name": "{provider}", "env": "{key_env}"}}',
        )


class SandboxUnavailable(Exception):
    """No sandbox can be created on this server at all (no Docker, no
    bubblewrap: sandboxes/backends/unavailable.py): not the spec's fault, and
    not worth a retry until an operator acts (the API's 409 sandbox.unavailable)."""


def require_backend(backend=None) -> None:
    """Raises SandboxUnavailable when this server's backend cannot create sandboxes."""
    backend = get_backend() if backend is None else backend
    reason = backend.unavailable_reason()
    if reason:
        raise SandboxUnavailable(f"This server cannot create sandboxes: {reason}.")


def check_available(spec: dict[str, Any], backend=None) -> None:
    """Checks against the sandbox backend (a normalized spec): the backend can
    create sandboxes at all (else SandboxUnavailable), an `image` other than
    "default" must exist there, and packages need a backend that installs
    them (else SpecError). A backend that cannot answer now is not the spec's
    fault: it is let through (the worker reports it when it creates the sandbox)."""
    backend = get_backend() if backend is None else backend
    require_backend(backend)
    if spec.get("packages") and not backend.installs_packages:
        raise SpecError("packages", f"packages need the docker backend (this server runs "
                                    f"agents with the {backend.name} backend, which installs nothing)")
    image = spec.get("image") or DEFAULT_IMAGE
    if image == DEFAULT_IMAGE:
        return
    try:
        exists = backend.image_exists(image)
    except SandboxError as exc:
        if exc.permanent:
            raise SpecError("image", f"{image!r} cannot be used: {exc}") from exc
        return
    if not exists:
        raise SpecError("image", f"image {image!r} does not exist {backend.image_hint}")


def validate_for_spawn(spec: Any, backend=None) -> dict[str, Any]:
    """`validate()` then `check_available()`: what POST /api/agents runs."""
    out = validate(spec)
    check_available(out, backend)
    return out


# --- field checks: each takes (field name, value) and returns the normalized value


def _str(field: str, value: Any, *, max_len: int = 200, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise SpecError(field, f"must be a string, not {_type(value)}")
    if not empty and not value.strip():
        raise SpecError(field, "must not be empty")
    if len(value) > max_len:
        raise SpecError(field, f"must be at most {max_len} characters")
    return value


def _model(field: str, value: Any) -> str:
    value = _str(field, value)
    if value == "demo":
        return value
    provider, _, name = value.partition(":")
    if provider not in PROVIDERS or not name.strip():
        raise SpecError(field, 'must be "demo", "openai:<model name>" or "anthropic:<model name>"')
    return value


def _image(field: str, value: Any) -> str:
    value = _str(field, value, max_len=255)
    if not _IMAGE.match(value):
        raise SpecError(field, "must be an image reference such as debian:bookworm (no spaces)")
    return value


def _str_list(
    field: str, value: Any, *, max_items: int, item: Callable[[str, Any], str]
) -> list[str]:
    if not isinstance(value, list):
        raise SpecError(field, f"must be a list of strings, not {_type(value)}")
    if len(value) > max_items:
        raise SpecError(field, f"must have at most {max_items} items")
    return [item(f"{field}[{i}]", v) for i, v in enumerate(value)]


def _packages(field: str, value: Any) -> list[str]:
    def package(name: str, v: Any) -> str:
        v = _str(name, v)
        if not _PACKAGE.match(v):
            # Package names reach a package manager's command line: refuse anything shell-like.
            raise SpecError(name, f"{v!r} is not a package name")
        return v

    return _str_list(field, value, max_items=200, item=package)


def _setup(field: str, value: Any) -> list[str]:
    return _str_list(field, value, max_items=100, item=lambda n, v: _str(n, v, max_len=10_000))


def _tools(field: str, value: Any) -> list[str]:
    def tool(name: str, v: Any) -> str:
        if v not in TOOLS:
            raise SpecError(name, f"unknown tool {v!r}; tools are {', '.join(TOOLS)}")
        return v

    names = _str_list(field, value, max_items=len(TOOLS) * 4, item=tool)
    return list(dict.fromkeys(names))  # a repeated tool is harmless: keep the first


def _bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(field, f"must be true or false, not {_type(value)}")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def check(field: str, value: Any) -> str:
        if value not in choices or not isinstance(value, str):
            raise SpecError(field, f"must be one of {', '.join(repr(c) for c in choices)}")
        return value

    return check


def _credentials(field: str, value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise SpecError(field, f"must be a list of credential bindings, not {_type(value)}")
    if len(value) > 50:
        raise SpecError(field, "must have at most 50 bindings")
    bindings = [_binding(f"{field}[{i}]", v) for i, v in enumerate(value)]
    envs = [b["env"] for b in bindings]
    dupes = sorted({e for e in envs if envs.count(e) > 1})
    if dupes:
        raise SpecError(field, f"two bindings set the same env variable: {', '.join(dupes)}")
    return bindings


def _binding(field: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise SpecError(field, 'must be an object {"name", "env", "approval"}')
    unknown = sorted(set(value) - {"name", "env", "approval", "inject"})
    if set(unknown) & _SECRETISH:
        raise SpecError(
            field, "never put a secret value in a spec: bind a stored credential by name"
        )
    if unknown:
        raise SpecError(
            field, f"unknown key(s): {', '.join(unknown)}; known keys are name, env, approval, "
            "inject"
        )
    for required in ("name", "env"):
        if required not in value:
            raise SpecError(f"{field}.{required}", "is required")
    env = _str(f"{field}.env", value["env"], max_len=128)
    if not _ENV.match(env):
        raise SpecError(f"{field}.env", "must be an environment variable name like OPENAI_API_KEY")
    binding = {
        "name": _str(f"{field}.name", value["name"], max_len=100),
        "env": env,
        "approval": _choice(APPROVALS)(f"{field}.approval", value.get("approval", "auto")),
    }
    if "inject" in value:  # absent means inject_of's default, so older specs read alike
        binding["inject"] = _choice(INJECTS)(f"{field}.inject", value["inject"])
        if binding["inject"] == "gateway" and env not in GATEWAY_ENVS:
            raise SpecError(f"{field}.inject", "the gateway injects only the model's key and "
                            f"base URL ({', '.join(GATEWAY_ENVS)}); bind {env} with "
                            '"inject": "env"')
    return binding


def inject_of(binding: dict) -> str:
    """Where a binding's value goes: "gateway" (never into the sandbox) or "env"."""
    return binding.get("inject") or ("gateway" if binding.get("env") in GATEWAY_ENVS else "env")


def _limits(field: str, value: Any) -> dict[str, int | float]:
    if not isinstance(value, dict):
        raise SpecError(field, f"must be an object, not {_type(value)}")
    unknown = sorted(set(value) - set(LIMIT_MAX))
    if unknown:
        raise SpecError(
            f"{field}.{unknown[0]}", f"unknown limit; limits are {', '.join(LIMIT_MAX)}"
        )
    out: dict[str, int | float] = {}
    for key, number in value.items():
        name = f"{field}.{key}"
        whole = key != "cpus"
        if isinstance(number, bool) or not isinstance(number, int if whole else (int, float)):
            raise SpecError(
                name, f"must be {'an integer' if whole else 'a number'}, not {_type(number)}"
            )
        if isinstance(number, float) and not math.isfinite(number):
            raise SpecError(name, "must be a finite number")
        if number <= 0:
            raise SpecError(name, "must be greater than 0")
        if number > LIMIT_MAX[key]:
            raise SpecError(name, f"must be at most {LIMIT_MAX[key]}")
        out[key] = number
    return out


def _hooks(field: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise SpecError(field, f"must be an object, not {_type(value)}")
    unknown = sorted(set(value) - set(HOOKS))
    if unknown:
        raise SpecError(f"{field}.{unknown[0]}", f"unknown hook; hooks are {', '.join(HOOKS)}")
    return {k: _str(f"{field}.{k}", v, max_len=10_000) for k, v in value.items()}


def _run_as(field: str, value: Any) -> str:
    value = _str(field, value, max_len=32)
    if not _USER.match(value):
        raise SpecError(field, "must be a unix user name (lowercase letters, digits, _ and -)")
    return value


def _name(field: str, value: Any) -> str:
    return _str(field, value, max_len=100, empty=True)


def _type(value: Any) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
    }
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "model": _model,
    "image": _image,
    "packages": _packages,
    "setup": _setup,
    "tools": _tools,
    "checkpoint": _bool,
    "credentials": _credentials,
    "network": _choice(NETWORKS),
    "limits": _limits,
    "hooks": _hooks,
    "run_as": _run_as,
    "name": _name,
    "harness": _choice(harnesses.HARNESSES),
}
