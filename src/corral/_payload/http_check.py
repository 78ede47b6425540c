"""HTTP acceptance checks, run inside a verifier sandbox (stdlib only).

Usage: python3 -I http_check.py '{"base": "http://127.0.0.1:8000", "timeout": 10,
"steps": [{"method": "GET", "path": "/todos", "body": ..., "headers": {...},
"expect_status": 200, "expect_body": "...", "expect_headers": {NAME: REGEX},
"expect_regex": "...", "expect_json": {"$.a[0]": VALUE}, "expect_sha256": HEX,
"expect_size": N, "capture": {VAR: "$.id" | "header:NAME" | "regex:PAT"}}, ...]}'

A one-step spec may also give the step's keys at the top level with `url`
(the format of corral before steps). Steps run in order; `${VAR}` in a later
step's path, body or header values is a value captured earlier (bounded:
at most `MAX_CAPTURES` values of `MAX_CAPTURE` characters each). Exit 0 when
every step passed, 1 at the first that did not; one line on stdout says
what was seen. JSON paths are a small subset parsed here, never evaluated:
`$`, `.name` and `[N]`. Corral copies this file into the run's tools/
directory; the host never runs it.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

MAX_BODY = 1 << 20
MAX_BINARY = 64 << 20
MAX_CAPTURE = 1024
MAX_CAPTURES = 32
_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\[(\d{1,6})\]")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]{0,40})\}")
_MISSING = object()

Step = dict[str, Any]


class Failed(Exception):
    """A step's expectation was not met; the message is the reason line."""


def json_path(doc: object, path: str) -> object:
    """The value at `path` (`$.a.b[0]`) in `doc`, or `_MISSING`."""
    if not path.startswith("$"):
        raise Failed(f"bad JSON path {path!r}")
    pos, cur = 1, doc
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if m is None:
            raise Failed(f"bad JSON path {path!r}")
        pos = m.end()
        if m.group(1) is not None:
            if not isinstance(cur, dict) or m.group(1) not in cur:
                return _MISSING
            cur = cur[m.group(1)]
        else:
            idx = int(m.group(2))
            if not isinstance(cur, list) or idx >= len(cur):
                return _MISSING
            cur = cur[idx]
    return cur


def _short(value: object, n: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text[:n] + ("..." if len(text) > n else ""))


def _subst(text: str, values: dict[str, str], quote: bool = False) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise Failed(f"${{{m.group(1)}}} was not captured by an earlier step")
        v = values[m.group(1)]
        return urllib.parse.quote(v, safe="/") if quote else v

    return _VAR.sub(one, text)


def _fetch(
    step: Step, url: str, headers: dict[str, str], timeout: float
) -> tuple[int, dict[str, str], bytes]:
    body = step.get("body")
    data = body.encode() if body is not None else None
    if data is not None and "content-type" not in {k.lower() for k in headers}:
        headers["content-type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers, method=step["method"])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    binary = step.get("expect_sha256") is not None or step.get("expect_size") is not None
    limit = MAX_BINARY if binary else MAX_BODY
    try:
        resp = opener.open(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        resp = exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise Failed(f"no answer from {step['method']} {step['path']}: {exc}") from None
    with resp:
        payload = resp.read(limit + 1)
        hdrs = {k.lower(): v for k, v in resp.headers.items()}
        return int(resp.status), hdrs, payload


def _capture(spec: str, hdrs: dict[str, str], text: str, doc: object) -> str:
    if spec.startswith("$"):
        value = json_path(doc, spec)
        if value is _MISSING:
            raise Failed(f"capture {spec}: no such value in the body")
        got = value if isinstance(value, str) else json.dumps(value)
    elif spec.startswith("header:"):
        header = hdrs.get(spec[7:].lower())
        if header is None:
            raise Failed(f"capture {spec}: no such header")
        got = header
    elif spec.startswith("regex:"):
        m = re.search(spec[6:], text)
        if m is None:
            raise Failed(f"capture {spec}: body did not match")
        got = m.group(1) if m.groups() else m.group(0)
    else:
        raise Failed(f"bad capture {spec!r}")
    if len(got) > MAX_CAPTURE:
        raise Failed(f"capture {spec}: value longer than {MAX_CAPTURE} characters")
    return got


def run_step(step: Step, base: str, timeout: float, values: dict[str, str]) -> str:
    """Run one step; returns what was seen, raises Failed with the reason."""
    path = _subst(step["path"], values, quote=True)
    if not path.startswith("/"):
        # A captured value must not turn into another host ("@evil/") or scheme.
        raise Failed(f"{step['method']} {path[:80]!r}: the path does not start with '/'")
    step = {**step, "path": path}
    if step.get("body") is not None:
        step["body"] = _subst(step["body"], values)
    headers = {k: _subst(v, values) for k, v in (step.get("headers") or {}).items()}
    started = time.monotonic()
    status, hdrs, payload = _fetch(step, base + path, headers, timeout)
    took = time.monotonic() - started
    what = f"{step['method']} {path}"
    want = int(step.get("expect_status", 200))
    binary = step.get("expect_sha256") is not None or step.get("expect_size") is not None
    if len(payload) > (MAX_BINARY if binary else MAX_BODY):
        raise Failed(f"{what}: body larger than the checker reads")
    text = payload.decode("utf-8", "replace")
    if status != want:
        raise Failed(f"{what}: status {status}, expected {want}: {_short(text)}")
    for name, pattern in (step.get("expect_headers") or {}).items():
        got = hdrs.get(name.lower())
        if got is None:
            raise Failed(f"{what}: no {name} header")
        if re.search(pattern, got) is None:
            raise Failed(f"{what}: header {name} {_short(got)} did not match /{pattern}/")
    sub = step.get("expect_body")
    if sub is not None and sub not in text:
        raise Failed(f"{what}: body lacks {_short(sub)}: {_short(text)}")
    pattern = step.get("expect_regex")
    if pattern is not None and re.search(pattern, text) is None:
        raise Failed(f"{what}: body did not match /{pattern}/: {_short(text)}")
    doc: object = _MISSING
    needs_json = step.get("expect_json") or any(
        c.startswith("$") for c in (step.get("capture") or {}).values()
    )
    if needs_json:
        try:
            doc = json.loads(text)
        except ValueError:
            raise Failed(f"{what}: body is not JSON: {_short(text)}") from None
    for jpath, expected in (step.get("expect_json") or {}).items():
        found = json_path(doc, jpath)
        if found is _MISSING:
            raise Failed(f"{what}: {jpath} is missing in {_short(text)}")
        if found != expected or type(found) is not type(expected):
            raise Failed(f"{what}: {jpath} is {_short(found)}, expected {_short(expected)}")
    size = step.get("expect_size")
    if size is not None and len(payload) != int(size):
        raise Failed(f"{what}: body is {len(payload)} bytes, expected {size}")
    digest = step.get("expect_sha256")
    if digest is not None:
        got_digest = hashlib.sha256(payload).hexdigest()
        if got_digest != digest.lower():
            raise Failed(f"{what}: body sha256 {got_digest[:16]}..., expected {digest[:16]}...")
    for var, cspec in (step.get("capture") or {}).items():
        if var not in values and len(values) >= MAX_CAPTURES:
            raise Failed(f"more than {MAX_CAPTURES} captured values")
        values[var] = _capture(cspec, hdrs, text, doc)
    return f"{what}: status {status} ({took:.2f}s)"


def _steps(spec: Step) -> tuple[str, list[Step]]:
    if "steps" in spec:
        return spec["base"], list(spec["steps"])
    # The one-step format: {"method", "url", ...}.
    parts = urllib.parse.urlsplit(spec["url"])
    base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return base, [{**spec, "path": path or "/"}]


def main() -> int:
    spec = json.loads(sys.argv[1])
    base, steps = _steps(spec)
    timeout = float(spec.get("timeout") or 10)
    values: dict[str, str] = {}
    seen = ""
    for i, step in enumerate(steps):
        try:
            seen = run_step(step, base, timeout, values)
        except Failed as exc:
            where = f"step {i + 1}/{len(steps)}: " if len(steps) > 1 else ""
            print(f"{where}{exc}", flush=True)
            return 1
    print(seen if len(steps) == 1 else f"{len(steps)} steps passed; last {seen}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
