"""A check's HTTP steps and assertions, and what the verifier sandbox is given (pure).

The mission declares them (`[[checks]]` with `http = "GET /x"` and
`expect_*` keys, or `[[checks.steps]]`); this module validates them on the
host, so a bad regex or JSON path is a mission error with its line, and
turns them into the JSON document `corral/_payload/http_check.py` runs
inside the verifier. JSON paths are a subset (`$`, `.name`, `[N]`) that is
parsed, never evaluated. `${VAR}` in a step's path, body or headers is a
value an earlier step captured (`capture = {VAR = "$.id" | "header:NAME" |
"regex:PAT"}`).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "HTTP_RE",
    "MAX_STEPS",
    "RESERVED_ENV",
    "HttpStep",
    "check_env",
    "check_steps",
    "http_payload",
    "is_json_path",
]

HTTP_RE = re.compile(r"^(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (/\S*)$")
#: A step's path may also start with a captured value (`GET ${location}`).
_STEP_HTTP_RE = re.compile(r"^(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) ((?:/|\$\{)\S*)$")
#: Steps of one check; captured values are bounded in the checker itself.
MAX_STEPS = 20
#: Set by corral in every verifier sandbox; a check's `env` may not replace them.
RESERVED_ENV = frozenset(
    {"PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONPATH", "PRODUCT_PORT", "PRODUCT_URL", "PATH"}
)
_JSON_PATH = re.compile(r"^\$(?:\.[A-Za-z_][A-Za-z0-9_-]*|\[\d{1,6}\])*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")
_VAR_REF = re.compile(r"\$\{([^}]*)\}")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")


def is_json_path(path: str) -> bool:
    """Whether `path` is in the supported subset: `$.a.b[0]`."""
    return _JSON_PATH.match(path) is not None


def _regex(pattern: str, what: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{what} is not a regular expression: {exc}") from None
    return pattern


def check_env(env: dict[str, str]) -> dict[str, str]:
    """A check's `env`, refused when a name is malformed or corral's own."""
    for name, value in env.items():
        if _ENV_NAME.match(name) is None:
            raise ValueError(f"env name {name!r} is not a variable name")
        if name in RESERVED_ENV or name.startswith("CORRAL_"):
            raise ValueError(f"env {name} is set by corral and cannot be replaced")
        if "\0" in value:
            raise ValueError(f"env {name} holds a NUL byte")
    return env


class HttpStep(BaseModel):
    """One request and what its answer must be (`[[checks.steps]]`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    http: str
    body: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    expect_status: int = Field(default=200, ge=100, le=599)
    expect_body: str | None = None
    expect_headers: dict[str, str] = Field(default_factory=dict)
    expect_regex: str | None = None
    expect_json: dict[str, Any] = Field(default_factory=dict)
    expect_sha256: str | None = None
    expect_size: int | None = Field(default=None, ge=0)
    capture: dict[str, str] = Field(default_factory=dict)

    @field_validator("http")
    @classmethod
    def _h(cls, value: str) -> str:
        if _STEP_HTTP_RE.match(value) is None:
            raise ValueError(f"http is 'METHOD /path', e.g. 'GET /todos', not {value!r}")
        return value

    @field_validator("headers", "expect_headers")
    @classmethod
    def _hdrs(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if _HEADER.match(name) is None:
                raise ValueError(f"{name!r} is not a header name")
        return value

    @field_validator("expect_regex")
    @classmethod
    def _re(cls, value: str | None) -> str | None:
        return None if value is None else _regex(value, "expect_regex")

    @field_validator("expect_json")
    @classmethod
    def _json(cls, value: dict[str, Any]) -> dict[str, Any]:
        for path in value:
            if not is_json_path(path):
                raise ValueError(f"JSON path {path!r} is not like '$.a.b[0]'")
        return value

    @field_validator("expect_sha256")
    @classmethod
    def _sha(cls, value: str | None) -> str | None:
        if value is not None and _SHA256.match(value) is None:
            raise ValueError("expect_sha256 is 64 hexadecimal digits")
        return value

    @field_validator("capture")
    @classmethod
    def _cap(cls, value: dict[str, str]) -> dict[str, str]:
        for var, spec in value.items():
            if _VAR_NAME.match(var) is None:
                raise ValueError(f"capture name {var!r} is not like 'todo_id'")
            if spec.startswith("$"):
                if not is_json_path(spec):
                    raise ValueError(f"capture {var}: JSON path {spec!r} is not like '$.a[0]'")
            elif spec.startswith("header:"):
                if _HEADER.match(spec[7:]) is None:
                    raise ValueError(f"capture {var}: {spec[7:]!r} is not a header name")
            elif spec.startswith("regex:"):
                _regex(spec[6:], f"capture {var}")
            else:
                raise ValueError(f"capture {var} is '$.path', 'header:NAME' or 'regex:PATTERN'")
        return value

    @model_validator(mode="after")
    def _header_values(self) -> HttpStep:
        for name, pattern in self.expect_headers.items():
            _regex(pattern, f"expect_headers.{name}")
        return self

    def variables(self) -> set[str]:
        """The `${VAR}` names this step uses."""
        parts = [self.http, self.body or "", *self.headers.values()]
        return {m.group(1) for p in parts for m in _VAR_REF.finditer(p)}

    def payload(self) -> dict[str, Any]:
        method, path = self.http.split(" ", 1)
        doc = self.model_dump(exclude={"http"})
        return {"method": method, "path": path, **doc}


def check_steps(steps: tuple[HttpStep, ...]) -> None:
    """Refuse a sequence whose step uses a value no earlier step captures."""
    if len(steps) > MAX_STEPS:
        raise ValueError(f"a check has at most {MAX_STEPS} steps")
    known: set[str] = set()
    for i, step in enumerate(steps):
        missing = sorted(step.variables() - known)
        if missing:
            raise ValueError(f"step {i + 1} uses ${{{missing[0]}}}, which no earlier step captures")
        known |= set(step.capture)


def http_payload(steps: tuple[HttpStep, ...], port: int, timeout: float) -> dict[str, Any]:
    """The document `http_check.py` is given for these steps."""
    return {
        "base": f"http://127.0.0.1:{port}",
        "timeout": timeout,
        "steps": [s.payload() for s in steps],
    }
