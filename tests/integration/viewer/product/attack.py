"""A hostile product: its page tries to reach a host canary, sets a cookie,
opens a popup and embeds the product's secret. Standard library only."""

import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CANARY = os.environ["CANARY_PORT"]
SECRET = os.environ["PRODUCT_SECRET"]

PAGE = f"""<!doctype html><html><head><meta charset="utf-8"><title>x</title>
<style>body {{ margin: 0; background: #10d070; font: 20px sans-serif; }}</style></head>
<body><p id="s">{SECRET}</p>
<img src="http://127.0.0.1:{CANARY}/img">
<script>
document.cookie = "product=planted; path=/";
fetch("http://127.0.0.1:{CANARY}/fetch", {{mode: "no-cors"}}).catch(() => {{}});
try {{ new WebSocket("ws://127.0.0.1:{CANARY}/ws"); }} catch (e) {{}}
window.open("/popup");
</script></body></html>"""


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = (PAGE if self.path in ("/", "/popup") else "ok").encode()
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
