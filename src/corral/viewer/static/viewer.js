"use strict";
(function () {
  const canvas = document.getElementById("screen");
  const ctx = canvas.getContext("2d");
  const events = document.getElementById("events");
  const status = document.getElementById("status");
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(proto + "//" + location.host + "/viewer/ws");
  ws.binaryType = "arraybuffer";
  window.corralViewer = { frames: 0 };
  const send = (obj) => { if (ws.readyState === 1) ws.send(JSON.stringify(obj)); };
  ws.onopen = () => { status.textContent = "connected"; };
  ws.onclose = () => { status.textContent = "disconnected"; };
  ws.onmessage = (msg) => {
    if (typeof msg.data !== "string") {
      const blob = new Blob([msg.data], { type: "image/jpeg" });
      createImageBitmap(blob).then((bmp) => {
        if (canvas.width !== bmp.width || canvas.height !== bmp.height) {
          canvas.width = bmp.width; canvas.height = bmp.height;
        }
        ctx.drawImage(bmp, 0, 0);
        window.corralViewer.frames += 1;
      }).catch(() => {});
      return;
    }
    let ev;
    try { ev = JSON.parse(msg.data); } catch (e) { return; }
    const li = document.createElement("li");
    li.className = ev.level === "error" ? "error" : "";
    // Product text is only ever text: textContent, never markup.
    li.textContent = "[" + String(ev.kind) + "] " + String(ev.text);
    events.appendChild(li);
    while (events.children.length > 500) events.removeChild(events.firstChild);
  };
  const pos = (e) => {
    const r = canvas.getBoundingClientRect();
    const x = Math.round((e.clientX - r.left) * canvas.width / r.width);
    const y = Math.round((e.clientY - r.top) * canvas.height / r.height);
    return { x: Math.max(0, Math.min(canvas.width, x)), y: Math.max(0, Math.min(canvas.height, y)) };
  };
  const buttons = ["left", "middle", "right"];
  canvas.addEventListener("mousedown", (e) => {
    canvas.focus();
    send(Object.assign({ kind: "mouse", type: "mousePressed", button: buttons[e.button] || "none", clickCount: 1 }, pos(e)));
    e.preventDefault();
  });
  canvas.addEventListener("mouseup", (e) => {
    send(Object.assign({ kind: "mouse", type: "mouseReleased", button: buttons[e.button] || "none", clickCount: 1 }, pos(e)));
  });
  let lastMove = 0;
  canvas.addEventListener("mousemove", (e) => {
    const now = Date.now();
    if (now - lastMove < 30) return;
    lastMove = now;
    send(Object.assign({ kind: "mouse", type: "mouseMoved", button: "none" }, pos(e)));
  });
  canvas.addEventListener("wheel", (e) => {
    send(Object.assign({ kind: "wheel", dx: Math.round(e.deltaX), dy: Math.round(e.deltaY) }, pos(e)));
    e.preventDefault();
  }, { passive: false });
  canvas.addEventListener("contextmenu", (e) => e.preventDefault());
  canvas.addEventListener("keydown", (e) => {
    if (e.key.length === 1 && !e.ctrlKey && !e.metaKey && !e.altKey) {
      send({ kind: "text", text: e.key });
    } else if (e.key.length <= 32) {
      send({ kind: "key", type: "keyDown", key: e.key, code: e.code });
    }
    e.preventDefault();
  });
  canvas.addEventListener("keyup", (e) => {
    if (e.key.length > 1 && e.key.length <= 32) send({ kind: "key", type: "keyUp", key: e.key, code: e.code });
  });
  canvas.addEventListener("paste", (e) => {
    const text = (e.clipboardData && e.clipboardData.getData("text")) || "";
    if (text) send({ kind: "text", text: text.slice(0, 1000) });
  });
  document.getElementById("back").onclick = () => send({ kind: "nav", action: "back" });
  document.getElementById("forward").onclick = () => send({ kind: "nav", action: "forward" });
  document.getElementById("reload").onclick = () => send({ kind: "nav", action: "reload" });
  // A resized window resizes the product's view (Emulation.setDeviceMetricsOverride
  // on the server); the next frames come at the new size. Bounds as inputs.py.
  let resizeTimer = 0;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      const head = document.querySelector("header").offsetHeight;
      const w = Math.floor(Math.min(window.innerWidth * 0.75, window.innerWidth - 220));
      const h = Math.floor(window.innerHeight - head - 12);
      send({ kind: "resize", width: Math.max(200, Math.min(2560, w)), height: Math.max(150, Math.min(1600, h)) });
    }, 150);
  });
  document.getElementById("addr").onsubmit = (e) => {
    e.preventDefault();
    send({ kind: "nav", action: "go", path: document.getElementById("path").value });
  };
})();
