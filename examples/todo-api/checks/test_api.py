"""Round-trip check for examples/todo-api, run by corral's verifier against $PRODUCT_URL."""

import json
import os
import sys
import urllib.request


def call(method: str, path: str, body: object = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        os.environ["PRODUCT_URL"] + path,
        data=data,
        method=method,
        headers={"content-type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def main() -> int:
    status, created = call("POST", "/todos", {"title": "round trip"})
    if status != 201 or not isinstance(created, dict):
        print(f"POST /todos -> {status} {created!r}")
        return 1
    status, items = call("GET", "/todos")
    if status != 200 or not isinstance(items, list):
        print(f"GET /todos -> {status} {items!r}")
        return 1
    if not any(isinstance(i, dict) and i.get("title") == "round trip" for i in items):
        print(f"the created item is not listed: {items!r}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
