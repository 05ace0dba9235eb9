// Spore's web console (docs/console.md). One module, no framework: a
// hash router over pages built with DOM calls (never innerHTML: every
// value shown is text), calling the REST API with the API key kept in
// session storage (never in a URL, never sent anywhere else).

const KEY = "spore.apiKey";
const main = document.getElementById("main");
const errorBox = document.getElementById("error");
let refreshTimer = null;

// el builds an element: el("a", {href: "#/x"}, "text", child, ...).
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function showError(msg) {
  errorBox.textContent = msg;
  errorBox.hidden = !msg;
}

class APIError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// api calls the REST API with the session's key; errors carry the
// server's {code, message}.
async function api(method, path, body) {
  const key = sessionStorage.getItem(KEY);
  const opts = { method, headers: { "X-API-KEY": key || "" } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
  const text = await resp.text();
  let data = null;
  if (text) { try { data = JSON.parse(text); } catch { data = text; } }
  if (resp.status === 401 && path !== "/v2/sandboxes?limit=1") {
    sessionStorage.removeItem(KEY);
    location.hash = "#/signin";
  }
  if (!resp.ok) throw new APIError(resp.status, (data && data.message) || `${method} ${path}: ${resp.status}`);
  return { data, headers: resp.headers };
}

// envd calls a running sandbox's daemon through the API's proxy, with the
// sandbox's envd access token (never the API key: sandbox traffic carries
// the sandbox's own credentials).
async function envd(sb, path, init = {}) {
  const headers = { "E2b-Sandbox-Id": sb.sandboxID, ...(init.headers || {}) }; // envd: the default port
  if (sb.envdAccessToken) headers["X-Access-Token"] = sb.envdAccessToken;
  const resp = await fetch(path, { ...init, headers });
  if (!resp.ok) {
    let msg = `${resp.status}`;
    try { const b = await resp.json(); msg = b.message || msg; } catch { /* not JSON */ }
    throw new APIError(resp.status, `the sandbox's daemon: ${msg}`);
  }
  return resp;
}

// rpc calls an envd Connect method with JSON.
async function rpc(sb, method, body) {
  const resp = await envd(sb, `/${method}`, { method: "POST", headers: { "Content-Type": "application/json", "Connect-Protocol-Version": "1" },
    body: JSON.stringify(body) });
  return resp.json();
}

const b64 = (bytes) => btoa(Array.from(bytes, (b) => String.fromCharCode(b)).join(""));
const unb64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));

// openTerminal runs an interactive shell in a PTY of the sandbox (envd's
// Process.Start, a Connect server stream read frame by frame) in an
// xterm.js terminal; keys go back with SendInput, size with Update.
async function openTerminal(sb, box) {
  const { Terminal } = await import("/console/xterm.mjs");
  const host = el("div", { class: "term", id: "terminal" });
  box.replaceChildren(host);
  const term = new Terminal({ cols: 100, rows: 24, cursorBlink: true });
  term.open(host);
  term.focus();
  const enc = new TextEncoder();
  const json = enc.encode(JSON.stringify({ process: { cmd: "/bin/bash", args: ["-i", "-l"], envs: { TERM: "xterm-256color" } },
    pty: { size: { cols: term.cols, rows: term.rows } } }));
  const frame = new Uint8Array(5 + json.length); // a Connect envelope: flags, length, message
  new DataView(frame.buffer).setUint32(1, json.length);
  frame.set(json, 5);
  const ctrl = new AbortController();
  const resp = await envd(sb, "/process.Process/Start", { method: "POST", signal: ctrl.signal, body: frame,
    headers: { "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1", Authorization: `Basic ${btoa("user:")}` } });
  // Keys go one SendInput at a time, in order (requests in parallel may
  // arrive out of order); what is typed meanwhile goes together in the
  // next one.
  let pid = 0, sending = false;
  const input = [];
  async function flush() {
    if (sending || !pid || !input.length) return;
    sending = true;
    try {
      while (input.length) {
        const parts = input.splice(0);
        const bytes = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
        let at = 0;
        for (const p of parts) { bytes.set(p, at); at += p.length; }
        await rpc(sb, "process.Process/SendInput", { process: { pid }, input: { pty: b64(bytes) } });
      }
    } catch (e) {
      showError(e.message);
    } finally {
      sending = false;
    }
  }
  term.onData((d) => { input.push(enc.encode(d)); flush(); });
  term.onResize(({ cols, rows }) => pid && rpc(sb, "process.Process/Update", { process: { pid }, pty: { size: { cols, rows } } }).catch(() => {}));
  // The stream ends with the page: leaving it kills nothing (the shell
  // ends when its PTY's reader goes), but the reader is stopped.
  window.addEventListener("hashchange", () => ctrl.abort(), { once: true });
  const reader = resp.body.getReader();
  let buf = new Uint8Array(0);
  for (;;) {
    let chunk;
    try { chunk = await reader.read(); } catch { return; }
    if (chunk.done) break;
    const joined = new Uint8Array(buf.length + chunk.value.length);
    joined.set(buf);
    joined.set(chunk.value, buf.length);
    buf = joined;
    while (buf.length >= 5) {
      const n = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
      if (buf.length < 5 + n) break;
      const flags = buf[0];
      const msg = JSON.parse(new TextDecoder().decode(buf.subarray(5, 5 + n)));
      buf = buf.slice(5 + n);
      if (flags & 2) { // end of stream
        if (msg.error) term.write(`\r\n[${msg.error.message || msg.error.code}]\r\n`);
        return;
      }
      const ev = msg.event || {};
      if (ev.start) {
        pid = ev.start.pid;
        flush();
      }
      if (ev.data && ev.data.pty) term.write(unb64(ev.data.pty));
      if (ev.end) term.write("\r\n[the shell ended]\r\n");
    }
  }
}

// all follows X-Next-Token pages of a list.
async function all(path) {
  let out = [], token = "";
  for (;;) {
    const sep = path.includes("?") ? "&" : "?";
    const { data, headers } = await api("GET", token ? `${path}${sep}nextToken=${encodeURIComponent(token)}` : path);
    out = out.concat(data || []);
    token = headers.get("X-Next-Token");
    if (!token) return out;
  }
}

// act runs a button's action: disabled while it runs, errors shown.
async function act(button, fn) {
  button.disabled = true;
  showError("");
  try { await fn(); } catch (e) { showError(e.message); } finally { button.disabled = false; }
}

function ago(iso) {
  if (!iso) return "";
  const s = Math.round((Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  return `${Math.round(s / 3600)}h ago`;
}

function mib(bytes) { return `${(bytes / 1048576).toFixed(1)} MiB`; }

function stateOf(sb) { return sb.sporeState || sb.state; }

// routeGen counts navigations: a page whose data came after the user
// moved on must not replace the newer one (page throws Stale instead).
let routeGen = 0;
class Stale extends Error {}

function page(gen, title, ...children) {
  if (gen !== routeGen) throw new Stale();
  main.replaceChildren(el("h1", {}, title), ...children);
  document.title = `${title} · Spore`;
}

// --- sign in ---------------------------------------------------------

function signIn() {
  document.getElementById("nav").hidden = true;
  const input = el("input", { type: "password", id: "apikey", autocomplete: "off", required: true, "aria-label": "API key" });
  const go = el("button", { type: "submit", id: "signin" }, "Sign in");
  const form = el("form", { class: "signin", onsubmit: (ev) => {
    ev.preventDefault();
    act(go, async () => {
      sessionStorage.setItem(KEY, input.value.trim());
      try {
        await api("GET", "/v2/sandboxes?limit=1");
      } catch (e) {
        sessionStorage.removeItem(KEY);
        throw new Error(e.status === 401 ? "That API key is not valid." : e.message);
      }
      location.hash = "#/sandboxes";
    });
  } }, el("label", { for: "apikey" }, "API key"), input, go,
  el("p", { class: "muted" }, "The key stays in this browser tab's session storage and goes only to this server, in a header."));
  page(routeGen, "Sign in", form);
  input.focus();
}

// --- sandboxes -------------------------------------------------------

async function sandboxes(gen) {
  const filters = { state: el("select", { id: "f-state", "aria-label": "State" },
      el("option", { value: "" }, "running and paused"), el("option", { value: "running" }, "running"), el("option", { value: "paused" }, "paused or hibernated")),
    template: el("input", { id: "f-template", placeholder: "template", "aria-label": "Template" }),
    metadata: el("input", { id: "f-metadata", placeholder: "metadata key=value", "aria-label": "Metadata" }),
    node: el("input", { id: "f-node", placeholder: "node", "aria-label": "Node" }) };
  const body = el("tbody", { id: "sandboxes" });
  const selected = new Set();
  const bulk = (label, fn, cls) => el("button", { type: "button", class: cls, onclick: (ev) => act(ev.target, async () => {
    for (const id of selected) await fn(id);
    selected.clear();
    await load();
  }) }, label);
  async function load() {
    const q = new URLSearchParams();
    q.set("state", filters.state.value || "running,paused");
    if (filters.metadata.value.trim()) q.set("metadata", filters.metadata.value.trim());
    if (filters.template.value.trim()) q.set("template", filters.template.value.trim());
    let list = await all(`/v2/sandboxes?${q}`);
    const node = filters.node.value.trim();
    if (node) list = list.filter((s) => s.clientID === node);
    body.replaceChildren(...list.map((s) => el("tr", { "data-id": s.sandboxID },
      el("td", {}, el("input", { type: "checkbox", "aria-label": `select ${s.sandboxID}`, checked: selected.has(s.sandboxID),
        onchange: (ev) => ev.target.checked ? selected.add(s.sandboxID) : selected.delete(s.sandboxID) })),
      el("td", {}, el("a", { href: `#/sandboxes/${s.sandboxID}` }, s.sandboxID)),
      el("td", {}, s.templateID),
      el("td", { class: `state-${stateOf(s)}` }, stateOf(s)),
      el("td", { class: "opt" }, s.clientID),
      el("td", { class: "opt" }, `${s.cpuCount} vCPU, ${s.memoryMB} MiB`),
      el("td", { class: "opt" }, ago(s.startedAt)),
      el("td", { class: "opt" }, Object.entries(s.metadata || {}).map(([k, v]) => `${k}=${v}`).join(" ")))));
    if (!list.length) body.replaceChildren(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "No sandboxes.")));
  }
  for (const f of Object.values(filters)) f.addEventListener("change", () => load().catch((e) => showError(e.message)));
  page(gen, "Sandboxes",
    el("div", { class: "bar" }, filters.state, filters.template, filters.metadata, filters.node,
      bulk("Pause selected", (id) => api("POST", `/sandboxes/${id}/pause`)),
      bulk("Kill selected", (id) => api("DELETE", `/sandboxes/${id}`), "danger")),
    el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, "Sandbox"), el("th", {}, "Template"),
      el("th", {}, "State"), el("th", { class: "opt" }, "Node"), el("th", { class: "opt" }, "Size"), el("th", { class: "opt" }, "Started"),
      el("th", { class: "opt" }, "Metadata"))), body)));
  await load();
  if (gen !== routeGen) return;
  // Live: the list is read again every 2 s while it is shown.
  refreshTimer = setInterval(() => { if (!document.hidden) load().catch(() => {}); }, 2000);
}

// --- one sandbox -----------------------------------------------------

async function sandbox(id, gen) {
  const { data: sb } = await api("GET", `/sandboxes/${id}`);
  const st = stateOf(sb);
  const forkN = el("input", { type: "number", min: 1, max: 100, value: 2, id: "fork-n", class: "narrow", "aria-label": "Copies" });
  const button = (label, idAttr, fn, cls) => el("button", { type: "button", id: idAttr, class: cls, onclick: (ev) => act(ev.target, fn) }, label);
  const reload = () => route();
  const actions = el("div", { class: "bar" },
    button("Snapshot", "do-snapshot", async () => { await api("POST", `/sandboxes/${id}/snapshots`, {}); await reload(); }),
    forkN, button("Fork", "do-fork", async () => {
      await api("POST", `/sandboxes/${id}/fork`, { count: Number(forkN.value) });
      await reload();
    }),
    st === "running" && button("Pause", "do-pause", async () => { await api("POST", `/sandboxes/${id}/pause`); await reload(); }),
    st === "running" && button("Hibernate", "do-hibernate", async () => { await api("POST", `/sandboxes/${id}/hibernate`); await reload(); }),
    st !== "running" && button("Resume", "do-resume", async () => { await api("POST", `/sandboxes/${id}/connect`, { timeout: 300 }); await reload(); }),
    button("Kill", "do-kill", async () => {
      if (!confirm(`Kill ${id}?`)) return;
      await api("DELETE", `/sandboxes/${id}`);
      location.hash = "#/sandboxes";
    }, "danger"));
  const info = el("dl", { class: "info" },
    ...[["State", st], ["Template", sb.templateID], ["Node", sb.clientID], ["Forked from", sb.sporeForkedFrom],
      ["vCPUs", sb.cpuCount], ["Memory", `${sb.memoryMB} MiB`], ["Disk", `${sb.diskSizeMB} MiB`], ["Started", sb.startedAt],
      ["Ends", sb.endAt], ["Internet", sb.allowInternetAccess ? "allowed" : "off"],
      ["Metadata", Object.entries(sb.metadata || {}).map(([k, v]) => `${k}=${v}`).join(" ")]]
      .filter(([, v]) => v !== undefined && v !== "")
      .flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k }, String(v))]));
  const chart = el("div", {}, el("p", { class: "muted" }, "Loading metrics…"));
  const snaps = el("div", { id: "snapshots" });
  const diffOut = el("div", { id: "diff" });
  const lineage = el("div", { id: "lineage" });
  const events = el("div", { id: "events" });
  const files = el("div", { id: "files" });
  const terminal = el("div", {}, st === "running"
    ? el("button", { type: "button", id: "open-terminal", onclick: (ev) => act(ev.target, () => openTerminal(sb, terminal)) }, "Open a terminal")
    : el("p", { class: "muted" }, "Resume the sandbox to open a terminal."));
  page(gen, `Sandbox ${id}`, actions, info, el("h2", {}, "Terminal"), terminal, el("h2", {}, "Resources"), chart, el("h2", {}, "Files"), files, el("h2", {}, "Snapshots"), snaps, diffOut,
    el("h2", {}, "Lineage"), lineage, el("h2", {}, "Events"), events);
  if (st === "running") fileBrowser(sb, files, "/home/user").catch((e) => files.replaceChildren(el("p", { class: "muted" }, e.message)));
  else files.replaceChildren(el("p", { class: "muted" }, "Resume the sandbox to browse its files."));
  await Promise.all([
    metricsChart(id, chart).catch((e) => chart.replaceChildren(el("p", { class: "muted" }, e.message))),
    snapshotTable(id, snaps, diffOut),
    lineageTree(id, lineage),
    lifecycle(id, events).catch((e) => events.replaceChildren(el("p", { class: "muted" }, e.message))),
  ]);
}

// fileBrowser lists a directory of a running sandbox (envd's ListDir),
// opens directories, downloads files and uploads into the directory.
async function fileBrowser(sb, box, dir) {
  const { entries = [] } = await rpc(sb, "filesystem.Filesystem/ListDir", { path: dir, depth: 1 });
  entries.sort((a, b) => (a.type === b.type ? a.name.localeCompare(b.name) : a.type === "FILE_TYPE_DIRECTORY" ? -1 : 1));
  const open = (p) => fileBrowser(sb, box, p).catch((e) => showError(e.message));
  const parent = dir === "/" ? null : dir.replace(/\/[^/]+\/?$/, "") || "/";
  const upload = el("input", { type: "file", id: "upload", "aria-label": `Upload into ${dir}`, onchange: (ev) => act(ev.target, async () => {
    for (const f of ev.target.files) {
      const form = new FormData();
      form.append("file", f, f.name);
      await envd(sb, `/files?path=${encodeURIComponent(`${dir.replace(/\/$/, "")}/${f.name}`)}&username=user`, { method: "POST", body: form });
    }
    await open(dir);
  }) });
  const rows = entries.map((e) => {
    const isDir = e.type === "FILE_TYPE_DIRECTORY";
    const name = isDir ? el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); open(e.path); } }, `${e.name}/`) : e.name;
    const get = !isDir && el("button", { type: "button", class: "download", "data-path": e.path, onclick: (ev) => act(ev.target, async () => {
      const resp = await envd(sb, `/files?path=${encodeURIComponent(e.path)}&username=user`);
      const url = URL.createObjectURL(await resp.blob());
      const a = el("a", { href: url, download: e.name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    }) }, "Download");
    return el("tr", { "data-path": e.path }, el("td", {}, name), el("td", { class: "opt" }, e.permissions || ""),
      el("td", {}, isDir ? "" : String(e.size)), el("td", { class: "actions" }, get || ""));
  });
  box.replaceChildren(el("div", { class: "bar" }, el("strong", { id: "cwd" }, dir),
    parent && el("button", { type: "button", onclick: () => open(parent) }, "Up"), el("label", { for: "upload" }, "Upload:"), upload),
  el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "Name"), el("th", { class: "opt" }, "Mode"),
    el("th", {}, "Bytes"), el("th", {}, ""))), el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 4, class: "muted" }, "Empty."))))));
}

async function metricsChart(id, box) {
  const { data } = await api("GET", `/sandboxes/${id}/metrics`);
  if (!data || !data.length) { box.replaceChildren(el("p", { class: "muted" }, "No samples yet.")); return; }
  const W = 640, H = 140;
  const t0 = data[0].timestampUnix, t1 = data[data.length - 1].timestampUnix || t0 + 1;
  const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * (W - 10) + 5;
  const y = (v) => H - 5 - v * (H - 10);
  const line = (f) => data.map((s) => `${x(s.timestampUnix).toFixed(1)},${y(Math.min(1, Math.max(0, f(s)))).toFixed(1)}`).join(" ");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  const last = data[data.length - 1];
  svg.setAttribute("aria-label", `CPU ${last.cpuUsedPct.toFixed(1)}%, memory ${mib(last.memUsed)} of ${mib(last.memTotal)}`);
  for (const [cls, f] of [["cpu", (s) => s.cpuUsedPct / 100], ["mem", (s) => s.memTotal ? s.memUsed / s.memTotal : 0]]) {
    const p = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    p.setAttribute("class", cls);
    p.setAttribute("points", line(f));
    svg.append(p);
  }
  box.replaceChildren(svg, el("p", { class: "muted" },
    `CPU ${last.cpuUsedPct.toFixed(1)}% (blue), memory ${mib(last.memUsed)} of ${mib(last.memTotal)} (amber), disk ${mib(last.diskUsed)}; ${data.length} samples`));
}

async function snapshotTable(id, box, diffOut) {
  const list = await all(`/snapshots?sandboxID=${encodeURIComponent(id)}`);
  if (!list.length) { box.replaceChildren(el("p", { class: "muted" }, "No snapshots of this sandbox yet.")); return; }
  const pick = { from: null, to: null };
  const diffBtn = el("button", { type: "button", id: "do-diff", disabled: true, onclick: (ev) => act(ev.target, async () => {
    const { data } = await api("GET", `/snapshots/${pick.from}/diff/${pick.to}`);
    showDiff(diffOut, data);
  }) }, "Diff from → to");
  const rows = list.map((s) => el("tr", { "data-id": s.snapshotID },
    el("td", {}, el("input", { type: "radio", name: "from", "aria-label": `diff from ${s.snapshotID}`, onchange: () => { pick.from = s.snapshotID; diffBtn.disabled = !(pick.from && pick.to); } })),
    el("td", {}, el("input", { type: "radio", name: "to", "aria-label": `diff to ${s.snapshotID}`, onchange: () => { pick.to = s.snapshotID; diffBtn.disabled = !(pick.from && pick.to); } })),
    el("td", {}, s.snapshotID), el("td", {}, (s.names || []).join(", ")), el("td", { class: "opt" }, ago(s.createdAt)),
    el("td", { class: "opt" }, mib(s.sizeBytes)), el("td", { class: "opt" }, s.storage),
    el("td", { class: "actions" }, el("button", { type: "button", class: "rollback", onclick: (ev) => act(ev.target, async () => {
      await api("POST", `/sandboxes/${id}/rollback`, { snapshotID: s.snapshotID });
      await route();
    }) }, "Roll back here"), " ",
    el("button", { type: "button", onclick: (ev) => act(ev.target, async () => {
      const { data } = await api("POST", "/v2/sandboxes", { templateID: s.snapshotID });
      location.hash = `#/sandboxes/${data.sandboxID}`;
    }) }, "Start from"))));
  box.replaceChildren(el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "From"), el("th", {}, "To"),
    el("th", {}, "Snapshot"), el("th", {}, "Names"), el("th", { class: "opt" }, "Taken"), el("th", { class: "opt" }, "Size"),
    el("th", { class: "opt" }, "Storage"), el("th", {}, ""))), el("tbody", {}, rows))), el("div", { class: "bar" }, diffBtn));
}

function showDiff(box, d) {
  const lines = [];
  for (const c of d.changes) lines.push(el("li", {}, `${{ added: "A", removed: "D" }[c.change] || "M"} ${c.path}${c.binary ? " (binary)" : ""}`));
  const texts = d.changes.filter((c) => c.diff).map((c) => el("pre", {}, ...c.diff.split("\n").map((l) =>
    el("span", { class: l.startsWith("@@") || l.startsWith("--- ") || l.startsWith("+++ ") ? "hunk" : l.startsWith("+") ? "add" : l.startsWith("-") ? "del" : null }, l + "\n"))));
  box.replaceChildren(el("h2", {}, `Diff ${d.from} → ${d.to}`),
    el("p", {}, `${d.added} added, ${d.removed} removed, ${d.changed} changed${d.truncated ? " (list truncated)" : ""}`),
    el("ul", { id: "diff-list" }, lines), ...texts);
}

// lineageTree shows the family of a sandbox: up to the sandbox it all
// started from, then each snapshot taken of a sandbox, the sandboxes
// started from a snapshot and the forks of a sandbox. Children past ten
// are folded.
async function lineageTree(id, box) {
  const [sbs, snaps] = await Promise.all([all("/v2/sandboxes?state=running,paused"), all("/snapshots")]);
  const byID = new Map(sbs.map((s) => [s.sandboxID, s]));
  const snapByID = new Map(snaps.map((s) => [s.snapshotID, s]));
  // Up: forked from, or started from a snapshot of another sandbox.
  let root = id;
  for (let i = 0; i < 100; i++) {
    const s = byID.get(root);
    if (!s) break;
    if (s.sporeForkedFrom && byID.has(s.sporeForkedFrom)) { root = s.sporeForkedFrom; continue; }
    const sn = snapByID.get(s.templateID);
    if (sn && sn.originSandboxID && byID.has(sn.originSandboxID) && sn.originSandboxID !== root) { root = sn.originSandboxID; continue; }
    break;
  }
  const seen = new Set();
  function sandboxNode(sid) {
    if (seen.has(sid)) return null;
    seen.add(sid);
    const s = byID.get(sid);
    const kids = [];
    for (const sn of snaps.filter((x) => x.originSandboxID === sid)) kids.push(snapshotNode(sn));
    for (const f of sbs.filter((x) => x.sporeForkedFrom === sid)) kids.push(sandboxNode(f.sandboxID, "fork"));
    return item(el("span", {}, el("span", { class: "node-kind" }, s && s.sporeForkedFrom ? "fork" : "sandbox"),
      el("a", { href: `#/sandboxes/${sid}`, class: sid === id ? "current" : null }, sid), s ? ` ${stateOf(s)}, started ${ago(s.startedAt)}` : ""), kids);
  }
  function snapshotNode(sn) {
    const kids = sbs.filter((x) => x.templateID === sn.snapshotID && !x.sporeForkedFrom).map((x) => sandboxNode(x.sandboxID));
    return item(el("span", {}, el("span", { class: "node-kind" }, "snapshot"), sn.snapshotID,
      (sn.names || []).length ? ` (${sn.names.join(", ")})` : "", ` taken ${ago(sn.createdAt)}`), kids);
  }
  function item(label, kids) {
    kids = kids.filter(Boolean);
    if (!kids.length) return el("li", {}, label);
    const list = el("ul", {}, kids);
    if (kids.length <= 10) return el("li", {}, label, list);
    return el("li", {}, el("details", {}, el("summary", {}, label, ` (${kids.length})`), list));
  }
  box.replaceChildren(el("ul", { class: "lineage" }, sandboxNode(root)));
}

async function lifecycle(id, box) {
  const { data } = await api("GET", `/v2/sandboxes/${id}/logs?limit=50&direction=backward`);
  const logs = (data && data.logs) || [];
  if (!logs.length) { box.replaceChildren(el("p", { class: "muted" }, "Nothing recorded yet.")); return; }
  box.replaceChildren(el("ul", {}, logs.map((l) => el("li", {}, `${l.timestamp} ${l.message}`))));
}

// --- lists -----------------------------------------------------------

async function snapshotsPage(gen) {
  const list = await all("/snapshots");
  page(gen, "Snapshots", el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {}, ...["Snapshot", "Names", "From sandbox", "Taken", "Size", "Storage", "Stored"].map((h) => el("th", {}, h)))),
    el("tbody", {}, list.map((s) => el("tr", {}, el("td", {}, s.snapshotID), el("td", {}, (s.names || []).join(", ")),
      el("td", {}, s.originSandboxID ? el("a", { href: `#/sandboxes/${s.originSandboxID}` }, s.originSandboxID) : ""),
      el("td", {}, ago(s.createdAt)), el("td", {}, mib(s.sizeBytes)), el("td", {}, s.storage), el("td", {}, mib(s.storedBytes))))))));
}

async function templatesPage(gen) {
  const { data } = await api("GET", "/templates");
  page(gen, "Templates", el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {}, ...["Template", "Names", "Build", "Status", "Size", "Public"].map((h) => el("th", {}, h)))),
    el("tbody", {}, (data || []).map((t) => el("tr", {}, el("td", {}, t.key || t.templateID), el("td", {}, (t.aliases || t.names || []).join(", ")),
      el("td", {}, t.buildID || ""), el("td", {}, t.buildStatus || ""), el("td", {}, `${t.cpuCount} vCPU, ${t.memoryMB} MiB`), el("td", {}, t.public ? "yes" : "no")))))));
}

async function nodesPage(gen) {
  let data;
  try {
    ({ data } = await api("GET", "/nodes"));
  } catch (e) {
    page(gen, "Nodes", el("p", { class: "muted" }, e.status === 403 ? "Nodes are shown to operator keys only." : e.message));
    return;
  }
  page(gen, "Nodes", el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {}, ...["Node", "State", "Draining", "Sandboxes", "Memory used / allocatable", "vCPUs"].map((h) => el("th", {}, h)))),
    el("tbody", {}, (data || []).map((n) => el("tr", {}, el("td", {}, n.nodeID), el("td", {}, n.state), el("td", {}, n.draining ? "yes" : "no"),
      el("td", {}, n.sandboxes), el("td", {}, `${n.memoryUsedMB} / ${n.memoryAllocatableMB} MiB`), el("td", {}, n.vcpus)))))));
}

// --- router ----------------------------------------------------------

async function route() {
  const gen = ++routeGen;
  clearInterval(refreshTimer);
  refreshTimer = null;
  showError("");
  const h = location.hash.replace(/^#/, "") || "/sandboxes";
  if (!sessionStorage.getItem(KEY) || h === "/signin") { signIn(); return; }
  document.getElementById("nav").hidden = false;
  const m = h.match(/^\/sandboxes\/([a-z0-9]+)$/);
  try {
    if (m) await sandbox(m[1], gen);
    else if (h === "/snapshots") await snapshotsPage(gen);
    else if (h === "/templates") await templatesPage(gen);
    else if (h === "/nodes") await nodesPage(gen);
    else await sandboxes(gen);
  } catch (e) {
    if (e instanceof Stale) return; // the user moved on
    if (gen === routeGen) showError(e.message);
    return;
  }
  main.focus({ preventScroll: true });
}

document.getElementById("signout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  location.hash = "#/signin";
});
window.addEventListener("hashchange", route);
route();
