"""A todo product with a page (the shipped todo-api serves JSON only).

The page renders the list with its own script, so what the viewer shows is
the product's JavaScript running in the viewer sandbox. Standard library only.
"""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TODOS: list[dict[str, object]] = [{"id": 1, "title": "buy milk", "done": False}]

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>todo <b>page</b></title>
<style>
body { margin: 0; background: #2060c0; font: 24px sans-serif; color: #fff; }
#new { position: absolute; left: 20px; top: 20px; width: 400px; height: 40px; font-size: 24px; }
.todo { position: absolute; left: 20px; width: 600px; height: 50px; background: #c02020; }
.todo.done { background: #20c040; }
</style></head><body>
<input id="new" autocomplete="off">
<div id="list"></div>
<script>
console.log("before-connect <img src=x onerror=alert(1)>");
async function load() {
  const todos = await (await fetch("/todos")).json();
  const list = document.getElementById("list");
  list.textContent = "";
  todos.forEach((t, i) => {
    const d = document.createElement("div");
    d.className = "todo" + (t.done ? " done" : "");
    d.style.top = (100 + 70 * i) + "px";
    d.textContent = t.title;
    d.onclick = async () => {
      await fetch("/todos/" + t.id + "/toggle", {method: "POST"});
      load();
    };
    list.appendChild(d);
  });
}
document.getElementById("new").addEventListener("keydown", async (e) => {
  if (e.key === "Enter") {
    const title = e.target.value;
    await fetch("/todos", {method: "POST", body: JSON.stringify({title})});
    e.target.value = ""; load();
  }
});
load();
</script></body></html>"""


class Handler(BaseHTTPRequestHandler):
    def _send(self, status: int, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/":
            self._send(200, PAGE, "text/html; charset=utf-8")
        elif self.path == "/health":
            self._send(200, "ok", "text/plain")
        elif self.path == "/todos":
            self._send(200, json.dumps(TODOS))
        else:
            self._send(404, '{"error": "not found"}')

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        if self.path == "/todos":
            title = json.loads(body)["title"]
            item = {"id": len(TODOS) + 1, "title": title, "done": False}
            TODOS.append(item)
            self._send(201, json.dumps(item))
            return
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "todos" and parts[2] == "toggle":
            for t in TODOS:
                if str(t["id"]) == parts[1]:
                    t["done"] = not t["done"]
                    self._send(200, json.dumps(t))
                    return
        self._send(404, '{"error": "not found"}')

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    port = int(os.environ.get("PORT", "8000"))
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
