// Live updates of the run page. Every value from the server is placed with
// textContent (never innerHTML): it may be text an agent wrote.
"use strict";
(function () {
  // Actions go through fetch, not a plain form submit: with
  // `Referrer-Policy: no-referrer` the browser sends `Origin: null` on a
  // form's POST navigation, while a fetch (mode "cors") sends the real
  // origin, which the server requires.
  for (const form of document.querySelectorAll("form.action")) {
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const out = document.getElementById("message");
      try {
        const resp = await fetch(form.action, {
          method: "POST",
          mode: "cors",
          credentials: "same-origin",
          body: new URLSearchParams(new FormData(form)),
        });
        const text = resp.ok ? String((await resp.json()).message) : "refused (" + resp.status + ")";
        if (out) { out.textContent = text; }
      } catch (e) {
        if (out) { out.textContent = "request failed"; }
      }
    });
  }
  const live = document.getElementById("live");
  if (!live) { return; }
  const setText = (id, value) => {
    const el = document.getElementById(id);
    if (el) { el.textContent = String(value); }
  };
  const rows = document.getElementById("journal-rows");
  const filter = rows ? rows.dataset.filter : "all";
  const cols = ["id", "time", "session", "env", "kind", "decision", "rule", "target", "reason"];
  const source = new EventSource(live.dataset.events);
  source.onmessage = (ev) => {
    let snap;
    try { snap = JSON.parse(ev.data); } catch (e) { return; }
    setText("run-state", snap.state);
    setText("run-sessions", snap.sessions);
    setText("run-checks", snap.checks);
    setText("run-peak", snap.peak);
    for (const s of snap.sessions_detail || []) {
      const tr = document.getElementById("session-" + Number(s.n));
      if (!tr) { continue; }
      const st = tr.querySelector(".s-state"); if (st) { st.textContent = String(s.state); }
      const ph = tr.querySelector(".s-phase"); if (ph) { ph.textContent = String(s.phase); }
      const ck = tr.querySelector(".s-checks"); if (ck) { ck.textContent = String(s.checks); }
    }
    if (!rows) { return; }
    for (const j of snap.journal || []) {
      if (filter !== "all" && j.decision !== filter) { continue; }
      const tr = document.createElement("tr");
      tr.className = j.decision === "deny" ? "d-deny live" : "d-allow live";
      for (const c of cols) {
        const td = document.createElement("td");
        td.textContent = String(j[c]);
        if (c === "target") { td.className = "target"; }
        tr.appendChild(td);
      }
      rows.appendChild(tr);
    }
    live.dataset.updates = String(Number(live.dataset.updates || "0") + 1);
  };
})();
