// The codebox console. It asks the server's own routes (/v1, /metrics, /healthz) with the
// token typed in once; the token lives in this closure only (never a cookie, storage or URL).
"use strict";
(() => {
  let token = "";
  let catalog = null;
  let samples = {};
  let current = null; // the playground's run id while it runs
  let session = null; // the open session shown

  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs = {}, ...children) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c);
    return e;
  };

  async function api(method, path, body) {
    const init = { method, headers: { Authorization: `Bearer ${token}` } };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    const text = await r.text();
    let data = text;
    try { data = JSON.parse(text); } catch (_) { /* text */ }
    if (!r.ok) {
      const message = data && data.error ? data.error.message : (typeof data === "string" ? data : r.statusText);
      throw new Error(`${r.status}: ${message}`);
    }
    return data;
  }

  // ---- words for reports
  const ms = (n) => (n == null ? "?" : n < 1000 ? `${n} ms` : `${(n / 1000).toFixed(2)} s`);
  const kb = (n) => (n == null ? "?" : n < 1024 ? `${n} KB` : `${(n / 1024).toFixed(1)} MB`);
  const STATUS = {
    succeeded: "Succeeded", failed: "Failed", compile_error: "Compile error", timed_out: "Timed out",
    out_of_memory: "Out of memory", stopped: "Stopped", sandbox_error: "Sandbox error",
    queued: "Queued", running: "Running",
  };
  function describe(r) {
    const parts = [];
    const status = el("span", { class: `status ${r.status === "succeeded" ? "good" : "bad"}`, text: STATUS[r.status] || r.status });
    const p = el("p", {}, status, `: ${r.message || ""}`);
    parts.push(p);
    const u = r.usage || {};
    if (r.stage === "compile" && r.status !== "succeeded") {
      parts.push(el("p", { text: `The program did not run: the run ended at the compile stage after ${ms(r.duration_ms)} (${ms(r.queued_ms)} in the queue).` }));
    } else {
      parts.push(el("p", { text: `Ran for ${ms(r.duration_ms)} after ${ms(r.queued_ms)} in the queue; CPU time ${ms(u.cpu_time_ms)}, peak memory ${kb(u.peak_memory_kb)}.` }));
    }
    if (r.compile) {
      const c = r.compile;
      const cu = c.usage || {};
      parts.push(el("p", { text: `Compiling: ${STATUS[c.status] || c.status} in ${ms(c.duration_ms)}${c.cached ? " (from the compile cache)" : `; CPU time ${ms(cu.cpu_time_ms)}, peak memory ${kb(cu.peak_memory_kb)}`}.` }));
    }
    if (r.limits) {
      parts.push(el("p", { class: "hint", text: `Limits: ${r.limits.memory_mb} MB of memory, ${r.limits.timeout_seconds} s, ${r.limits.cpus} CPU.` }));
    }
    if (r.stdout_truncated || r.stderr_truncated) parts.push(el("p", { class: "error", text: "Output was cut at the output cap." }));
    const details = el("details", {}, el("summary", { text: "The whole report (JSON)" }), el("pre", { text: JSON.stringify(r, null, 2) }));
    parts.push(details);
    return parts;
  }

  function fileViews(files) {
    const out = [];
    for (const f of files || []) {
      if (!f.content_base64) {
        out.push(el("p", { class: "hint", text: `${f.path}: ${f.omitted_reason || "not sent"}` }));
        continue;
      }
      if ((f.mime_type || "").startsWith("image/")) {
        out.push(el("figure", {}, el("img", { src: `data:${f.mime_type};base64,${f.content_base64}`, alt: f.path }), el("figcaption", { text: `${f.path} (${f.size_bytes} bytes)` })));
      } else {
        out.push(el("p", {}, download(f.path, f.content_base64, f.mime_type), ` (${f.size_bytes} bytes)`));
      }
    }
    return out;
  }

  function download(path, b64, mime) {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const url = URL.createObjectURL(new Blob([bytes], { type: mime || "application/octet-stream" }));
    return el("a", { href: url, download: path.split("/").pop(), text: `Download ${path}` });
  }

  // ---- live events: fetch, not EventSource (which cannot send the token as a header)
  async function follow(runId, onEvent) {
    let last = null;
    for (let attempt = 0; attempt < 5; attempt++) {
      const headers = { Authorization: `Bearer ${token}` };
      if (last) headers["Last-Event-ID"] = last;
      try {
        const r = await fetch(`/v1/runs/${runId}/events`, { headers });
        if (!r.ok) throw new Error(`${r.status}`);
        const reader = r.body.getReader();
        const decoder = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += decoder.decode(value, { stream: true });
          let end;
          while ((end = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, end);
            buf = buf.slice(end + 2);
            let id = null, name = null, data = "";
            for (const line of block.split("\n")) {
              if (line.startsWith("id:")) id = line.slice(3).trim();
              else if (line.startsWith("event:")) name = line.slice(6).trim();
              else if (line.startsWith("data:")) data += line.slice(5).replace(/^ /, "");
            }
            if (!name) continue;
            if (id) last = id;
            const payload = JSON.parse(data);
            onEvent(name, payload);
            if (name === "report") return payload;
          }
        }
      } catch (e) {
        if (attempt === 4) throw e;
      }
      await new Promise((ok) => setTimeout(ok, 500));
    }
    return api("GET", `/v1/runs/${runId}?wait_seconds=1`);
  }

  // What a run's events write into `pre`; at the report, the report's own output when no
  // output event came (a run that had ended before the events were asked for).
  function writer(pre) {
    let heard = false;
    return (name, payload) => {
      if (name === "report") {
        if (!heard) {
          if (payload.stdout) pre.append(el("span", { class: "stdout", text: payload.stdout }));
          if (payload.stderr) pre.append(el("span", { class: "stderr", text: payload.stderr }));
        }
        return;
      }
      if (name === "stdout" || name === "stderr") {
        heard = true;
        pre.append(el("span", { class: name, text: payload.data }));
        pre.scrollTop = pre.scrollHeight;
      } else if (name === "started") {
        pre.append(el("span", { class: "note", text: `[${payload.stage} stage started]\n` }));
      } else if (name === "truncated") {
        pre.append(el("span", { class: "note", text: `\n[${payload.stream}: ${payload.reason}]\n` }));
      }
    };
  }

  // ---- tabs
  const TABS = ["play", "sessions", "server"];
  function show(which) {
    for (const t of TABS) {
      $(t).hidden = t !== which;
      $(`tab-${t}`).setAttribute("aria-selected", String(t === which));
    }
    if (which === "sessions") listSessions();
    if (which === "server") refreshServer();
  }
  for (const t of TABS) $(`tab-${t}`).addEventListener("click", () => show(t));

  // ---- login
  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    token = $("token").value.trim();
    $("token").value = "";
    $("login-error").textContent = "";
    try {
      catalog = await api("GET", "/v1/languages");
      samples = await api("GET", "/console/samples.json");
    } catch (e) {
      token = "";
      $("login-error").textContent = `Cannot connect: ${e.message}. Check the token.`;
      return;
    }
    $("login").hidden = true;
    $("tabs").hidden = false;
    fillLanguages();
    show("play");
    $("language").focus();
  });

  function fillLanguages() {
    const ready = catalog.languages.filter((l) => l.image_present);
    for (const id of ["language", "session-language", "history-language"]) {
      const sel = $(id);
      for (const l of id === "history-language" ? catalog.languages : ready) {
        sel.append(el("option", { value: l.language, text: l.display_name }));
      }
    }
    const py = ready.find((l) => l.language === "python");
    if (py) { $("language").value = "python"; $("session-language").value = "python"; }
    const { defaults, ceilings } = catalog.limits;
    $("memory").value = defaults.memory_mb; $("memory").max = ceilings.memory_mb;
    $("timeout").value = defaults.timeout_seconds; $("timeout").max = ceilings.timeout_seconds;
    $("cpus").value = defaults.cpus; $("cpus").max = ceilings.cpus;
    $("ceilings").textContent = `At most ${ceilings.memory_mb} MB, ${ceilings.timeout_seconds} s and ${ceilings.cpus} CPUs on this server.`;
    loadSample();
  }

  function loadSample() {
    const s = samples[$("language").value];
    $("code").value = s ? s.code : "";
    $("stdin").value = s ? s.stdin : "";
  }
  $("language").addEventListener("change", loadSample);

  // ---- playground
  const ctrlEnter = (area, form) => area.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); form.requestSubmit(); }
  });
  ctrlEnter($("code"), $("play-form"));
  ctrlEnter($("cell"), $("cell-form"));

  $("play-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (current) return;
    const out = $("output");
    out.textContent = "";
    $("summary").textContent = "";
    $("files").textContent = "";
    const body = {
      language: $("language").value, code: $("code").value, stdin: $("stdin").value, wait: false,
      limits: { memory_mb: Number($("memory").value), timeout_seconds: Number($("timeout").value), cpus: Number($("cpus").value) },
    };
    $("run").disabled = true;
    $("play-state").textContent = "Submitting…";
    try {
      const accepted = await api("POST", "/v1/runs", body);
      current = accepted.run_id;
      $("stop").disabled = false;
      $("play-state").textContent = `Run ${current}: ${accepted.status}`;
      const write = writer(out);
      const report = await follow(current, (name, payload) => {
        if (name === "started") $("play-state").textContent = `Run ${current}: ${payload.stage} stage running`;
        write(name, payload);
      });
      showReport(report, out);
    } catch (e) {
      $("summary").replaceChildren(el("p", { class: "error", text: e.message }));
    } finally {
      current = null;
      $("run").disabled = false;
      $("stop").disabled = true;
    }
  });

  function showReport(report, out) {
    $("play-state").textContent = `Run ${report.run_id}: ${STATUS[report.status] || report.status}`;
    if (report.status === "compile_error" && report.compile) {
      out.append(el("span", { class: "note", text: "[compiler output]\n" }), el("span", { class: "stderr", text: report.compile.stderr + report.compile.stdout }));
    }
    $("summary").replaceChildren(...describe(report));
    $("files").replaceChildren(...fileViews(report.files));
  }

  $("stop").addEventListener("click", async () => {
    if (!current) return;
    $("stop").disabled = true;
    try { await api("DELETE", `/v1/runs/${current}`); } catch (e) { $("play-state").textContent = e.message; }
  });

  // ---- sessions
  async function listSessions() {
    const list = $("session-list");
    try {
      const { sessions } = await api("GET", "/v1/sessions");
      list.replaceChildren(...sessions.map((s) => el("li", {},
        el("span", { text: `${s.session_id} · ${s.language} · last used ${s.last_used_at}` }),
        button("Use", () => useSession(s)),
      )));
      if (!sessions.length) list.replaceChildren(el("li", { class: "hint", text: "No session is open." }));
    } catch (e) {
      list.replaceChildren(el("li", { class: "error", text: e.message }));
    }
  }

  function button(text, onClick) {
    const b = el("button", { type: "button", text });
    b.addEventListener("click", onClick);
    return b;
  }

  $("open-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    $("session-state").textContent = "Opening…";
    try {
      const s = await api("POST", "/v1/sessions", { language: $("session-language").value });
      $("session-state").textContent = `Opened ${s.session_id}`;
      useSession(s);
      listSessions();
    } catch (e) {
      $("session-state").textContent = e.message;
    }
  });

  function useSession(s) {
    session = s;
    $("session-view").hidden = false;
    $("session-title").textContent = `Session ${s.session_id} (${s.language})`;
    $("cells").textContent = "";
    refreshFiles();
    $("cell").focus();
  }

  $("cell-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (!session) return;
    const code = $("cell").value;
    const pre = el("pre", { class: "output", tabindex: "0" });
    const words = el("div", { class: "summary" });
    const cell = el("div", { class: "cell" }, el("div", { class: "code", text: code }), pre, words);
    $("cells").append(cell);
    $("run-cell").disabled = true;
    try {
      const accepted = await api("POST", "/v1/runs", { session_id: session.session_id, code, wait: false });
      const report = await follow(accepted.run_id, writer(pre));
      if (report.result != null) pre.append(el("span", { class: "note", text: `→ ${report.result}\n` }));
      if (report.status === "compile_error" && report.compile) pre.append(el("span", { class: "stderr", text: report.compile.stderr }));
      const n = report.session ? `Cell ${report.session.execution_count}` : "Cell";
      words.replaceChildren(el("p", {}, el("span", { class: `status ${report.status === "succeeded" ? "good" : "bad"}`, text: `${n}: ${STATUS[report.status] || report.status}` }), ` in ${ms(report.duration_ms)}`), ...fileViews(report.files));
      $("cell").value = "";
      refreshFiles();
    } catch (e) {
      words.replaceChildren(el("p", { class: "error", text: e.message }));
    } finally {
      $("run-cell").disabled = false;
    }
  });

  async function refreshFiles() {
    if (!session) return;
    const list = $("session-files");
    try {
      const folder = await api("GET", `/v1/sessions/${session.session_id}/files/`);
      const entries = folder.entries || [];
      list.replaceChildren(...entries.map((f) => el("li", {},
        el("span", { text: `${f.path} (${f.kind}, ${f.size_bytes} bytes)` }),
        f.kind === "file" ? button("Download", () => fetchFile(f.path, list)) : "",
      )));
      if (!entries.length) list.replaceChildren(el("li", { class: "hint", text: "The working directory is empty." }));
    } catch (e) {
      list.replaceChildren(el("li", { class: "error", text: e.message }));
    }
  }
  $("refresh-files").addEventListener("click", refreshFiles);

  async function fetchFile(path, list) {
    try {
      const f = await api("GET", `/v1/sessions/${session.session_id}/files/${path.split("/").map(encodeURIComponent).join("/")}`);
      const a = download(path, f.content_base64 || "", f.mime_type);
      list.append(el("li", {}, a));
      a.click();
    } catch (e) {
      list.append(el("li", { class: "error", text: e.message }));
    }
  }

  $("close-session").addEventListener("click", async () => {
    if (!session) return;
    try {
      await api("DELETE", `/v1/sessions/${session.session_id}`);
      $("session-state").textContent = `Closed ${session.session_id}`;
    } catch (e) {
      $("session-state").textContent = e.message;
    }
    session = null;
    $("session-view").hidden = true;
    listSessions();
  });

  // ---- server
  function metric(text, name) {
    let sum = null;
    for (const line of text.split("\n")) {
      if (line.startsWith(name + " ") || line.startsWith(name + "{")) {
        sum = (sum || 0) + Number(line.slice(line.lastIndexOf(" ") + 1));
      }
    }
    return sum;
  }

  async function refreshServer() {
    $("server-state").textContent = "Loading…";
    try {
      const [health, metrics, sessions] = await Promise.all([
        api("GET", "/healthz"), api("GET", "/metrics"), api("GET", "/v1/sessions"),
      ]);
      const numbers = [
        ["Runs executing", health.active], ["Runs queued", health.queued],
        ["Pool: containers ready", metric(metrics, "codebox_pool_idle")],
        ["Pool: memory (MB)", metric(metrics, "codebox_pool_memory_mb")],
        ["Sessions open", metric(metrics, "codebox_sessions_open")],
        ["Sessions ready ahead", metric(metrics, "codebox_sessions_ready")],
        ["Open sessions listed", sessions.sessions.length],
        ["Live readers", metric(metrics, "codebox_live_readers")],
      ];
      $("numbers").replaceChildren(...numbers.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: v == null ? "–" : String(v) }))));
      const flying = [];
      for (const status of ["running", "queued"]) {
        try {
          const h = await api("GET", `/v1/history?status=${status}&limit=50`);
          flying.push(...h.runs);
        } catch (_) { /* no history kept */ }
      }
      $("in-flight").replaceChildren(...(flying.length ? flying.map((r) => el("li", {},
        el("span", { text: `${r.run_id} · ${r.language} · ${r.status} since ${r.started_at || r.created_at}` }),
        button("Stop", async () => { await api("DELETE", `/v1/runs/${r.run_id}`); refreshServer(); }),
      )) : [el("li", { class: "hint", text: "Nothing is running or waiting." })]));
      await history();
      $("server-state").textContent = `Updated ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      $("server-state").textContent = e.message;
    }
  }
  $("refresh-server").addEventListener("click", refreshServer);

  async function history() {
    const q = new URLSearchParams({ limit: "25" });
    if ($("history-language").value) q.set("language", $("history-language").value);
    if ($("history-status").value) q.set("status", $("history-status").value);
    const body = $("history").tBodies[0];
    try {
      const h = await api("GET", `/v1/history?${q}`);
      body.replaceChildren(...h.runs.map((r) => el("tr", {},
        el("td", { text: r.created_at }), el("td", { text: r.language }),
        el("td", { text: STATUS[r.status] || r.status }), el("td", { text: ms(r.duration_ms) }),
        el("td", {}, button("Open", () => openReport(r.run_id))),
      )));
      if (!h.runs.length) body.replaceChildren(el("tr", {}, el("td", { colspan: "5", class: "hint", text: "No runs match." })));
    } catch (e) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: "5", class: "error", text: e.message })));
    }
  }
  $("history-form").addEventListener("submit", (ev) => { ev.preventDefault(); history(); });

  async function openReport(id) {
    const view = $("report-view");
    try {
      const r = await api("GET", `/v1/runs/${id}`);
      view.replaceChildren(el("h3", { text: `Run ${id}` }), ...describe(r), ...fileViews(r.files));
      view.querySelector("details").open = true;
      view.scrollIntoView();
    } catch (e) {
      view.replaceChildren(el("p", { class: "error", text: `Run ${id}: ${e.message}` }));
    }
  }
})();
