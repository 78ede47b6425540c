"""One HTTP acceptance check, run inside a verifier sandbox (stdlib only).

Usage: python3 -I http_check.py '{"method": "GET", "url": ..., "body": ..., "headers": {...},
"expect_status": 200, "expect_body": "...", "timeout": 10}'

Exit 0 when the product answered with the expected status and (if given) a body
containing `expect_body`; 1 otherwise. One line on stdout says what was seen.
Corral copies this file into the run's tools/ directory; the host never runs it.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request


def main() -> int:
    spec = json.loads(sys.argv[1])
    data = spec["body"].encode() if spec.get("body") is not None else None
    headers = dict(spec.get("headers") or {})
    if data is not None and "content-type" not in {k.lower() for k in headers}:
        headers["content-type"] = "application/json"
    req = urllib.request.Request(spec["url"], data=data, headers=headers, method=spec["method"])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    started = time.monotonic()
    try:
        with opener.open(req, timeout=float(spec.get("timeout") or 10)) as resp:
            status, body = resp.status, resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(1 << 20)
    except (urllib.error.URLError, OSError) as exc:
        print(f"no answer from {spec['method']} {spec['url']}: {exc}")
        return 1
    text = body.decode("utf-8", "replace")
    took = time.monotonic() - started
    if status != int(spec["expect_status"]):
        print(f"status {status}, expected {spec['expect_status']} ({took:.2f}s): {text[:300]!r}")
        return 1
    want = spec.get("expect_body")
    if want is not None and want not in text:
        print(f"status {status} but the body lacks {want!r}: {text[:300]!r}")
        return 1
    print(f"status {status} ({took:.2f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
