"""A product whose page leaves its origin: a link and a `location =` to CANARY_URL.

`/` is a page with a big link (orange, top left) to CANARY_URL + "/link";
`/go` assigns `location = CANARY_URL + "/location"`. Standard library only.
"""

import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CANARY = os.environ["CANARY_URL"]

PAGE = f"""<!doctype html><html><head><meta charset="utf-8"><title>off</title>
<style>body {{ margin: 0; background: #3070a0; }}
#l {{ position: absolute; left: 0; top: 0; width: 600px; height: 300px; background: #e0a000; }}
</style></head><body><a id="l" href="{CANARY}/link">away</a></body></html>"""

GO = f"""<!doctype html><html><head><meta charset="utf-8"></head>
<body><script>location = "{CANARY}/location";</script></body></html>"""


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = {"/": PAGE, "/go": GO}.get(self.path, "ok").encode()
        self.send_response(200)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    port = int(os.environ.get("PORT", "8000"))
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
