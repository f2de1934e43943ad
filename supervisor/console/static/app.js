// The CodeSDK console: one framework-free module, served by the supervisor with the page (docs/console.md).
// It speaks only to the API of the origin it came from, authenticated by the console session's cookie; every
// request that changes something carries the session's CSRF token. Text from the API is only ever set as text
// (textContent), never parsed as HTML.

const state = { who: null, csrf: null, stream: null, refresh: null, poll: null, waiting: "" };
// How often an open console asks what is waiting, on every page (supervisor/console POLL_S): while it does, the
// supervisor counts it as someone who can answer its namespaces' approvals and questions (docs/console.md).
const POLL_MS = 10_000;

// -- small DOM helpers --------------------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function resultText(content) {
  return typeof content === "string" ? content : JSON.stringify(content);
}

function badge(text) {
  return h("span", { class: `state ${text}` }, text);
}

function when(value) {
  if (!value) return "";
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

// Replace the page's content; a part left out (null, undefined, false) is nothing, not the text "null".
function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes.filter((node) => node !== undefined && node !== null && node !== false));
}

function notice(text, error = false) {
  const el = document.getElementById("notice");
  if (!text) { el.hidden = true; return; }
  el.textContent = text;
  el.className = error ? "error" : "";
  el.hidden = false;
}

// -- the API ------------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = state.csrf || "";
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, credentials: "same-origin", cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 204) return null;
  let data = null;
  try { data = await response.json(); } catch { data = null; }
  if (!response.ok) {
    const error = (data && data.error) || {};
    if (response.status === 401 && path !== "/console/session") loggedOut(error.message);
    throw new ApiError(response.status, error.code || "http_error",
                       error.message || `${method} ${path} answered ${response.status}`);
  }
  return data;
}

// Run an action, showing what went wrong (the API's own message) instead of failing silently.
async function attempt(what, action) {
  try {
    const result = await action();
    notice("");
    return result;
  } catch (error) {
    notice(`${what}: ${error.message}`, true);
    return undefined;
  }
}

// -- login --------------------------------------------------------------------------------------------------

function loggedIn(who) {
  state.who = who.principal;
  state.csrf = who.csrf_token;
  document.body.classList.toggle("admin", who.principal.admin);
  document.getElementById("nav").hidden = false;
  document.getElementById("logout").hidden = false;
  const scope = who.principal.admin ? "admin" : who.principal.namespaces.join(", ");
  document.getElementById("who").textContent = `${who.principal.name} (${scope})`;
  startPolling();
}

function loggedOut(message) {
  closeStream();
  stopPolling();
  state.who = null;
  state.csrf = null;
  document.body.classList.remove("admin");
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  loginPage(message);
}

function loginPage(message) {
  const token = h("input", { id: "token", type: "password", autocomplete: "off", placeholder: "csk_…",
                             required: true });
  const form = h("form", { class: "login", id: "login-form" },
    h("h1", {}, "Log in"),
    h("p", { class: "muted" }, "Paste an API token: the admin's (<data_dir>/admin.token) or a tenant's. ",
      "It is exchanged for a console session; the page never keeps the token."),
    message ? h("p", { class: "error" }, message) : null,
    h("label", { for: "token" }, "Token"), token,
    h("button", { type: "submit", id: "login" }, "Log in"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const who = await attempt("Log in", () => api("POST", "/console/session", { token: token.value }));
    if (who) {
      loggedIn(who);
      if (!location.hash || location.hash === "#/login") location.hash = "#/sessions";
      else route();
    }
  });
  show(form);
  token.focus();
}

async function logout() {
  await attempt("Log out", () => api("DELETE", "/console/session"));
  loggedOut("Logged out.");
}

// -- sessions -----------------------------------------------------------------------------------------------

async function sessionsPage(params) {
  const stateSel = h("select", { id: "filter-state", name: "state" },
    ["live", "idle", "busy", "archived", "all"].map((s) => h("option", { value: s, selected: params.get("state") === s }, s)));
  const nsSel = h("select", { id: "filter-namespace", name: "namespace" }, h("option", { value: "" }, "every namespace"));
  const search = h("input", { id: "filter-q", name: "q", type: "search", placeholder: "title or prompt",
                              value: params.get("q") || "" });
  const form = h("form", { class: "filters", id: "session-filters" }, "State", stateSel, "Namespace", nsSel, search,
                 h("button", { type: "submit" }, "Filter"));
  const body = h("tbody", { id: "sessions" });
  const more = h("button", { type: "button", hidden: true }, "More");
  show(h("h1", {}, "Sessions"), form,
       h("table", {}, h("thead", {}, h("tr", {}, ["Title", "Namespace", "Runtime", "State", "Created", "Events"]
         .map((t) => h("th", {}, t)))), body), more);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    if (stateSel.value !== "live") query.set("state", stateSel.value);
    if (nsSel.value) query.set("namespace", nsSel.value);
    if (search.value.trim()) query.set("q", search.value.trim());
    location.hash = `#/sessions?${query}`;
  });
  const namespaces = await attempt("Namespaces", () => api("GET", "/v1/namespaces"));
  for (const ns of namespaces ? namespaces.namespaces : []) {
    nsSel.append(h("option", { value: ns.namespace, selected: params.get("namespace") === ns.namespace }, ns.namespace));
  }
  const query = new URLSearchParams();
  for (const key of ["state", "namespace", "q"]) if (params.get(key)) query.set(key, params.get(key));
  async function page(after) {
    if (after) query.set("after", after);
    const list = await attempt("Sessions", () => api("GET", `/v1/sessions?${query}`));
    if (!list) return;
    for (const s of list.sessions) {
      body.append(h("tr", { class: "session", "data-session": s.session_id },
        h("td", {}, h("a", { href: `#/session/${encodeURIComponent(s.session_id)}` }, s.title || s.session_id)),
        h("td", {}, s.namespace), h("td", {}, s.runtime), h("td", {}, badge(s.state)),
        h("td", {}, when(s.created_at)), h("td", {}, String(s.last_seq))));
    }
    if (!body.children.length) body.append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No sessions.")));
    more.hidden = !list.has_more;
    more.onclick = () => page(list.next_after);
  }
  await page(null);
}

// -- one session --------------------------------------------------------------------------------------------

function closeStream() {
  if (state.stream) state.stream.close();
  state.stream = null;
}

const TERMINAL = new Set(["task.completed", "task.failed", "task.stopped"]);

function summary(event) {
  const p = event.payload || {};
  if (p.tool_name) return `${p.tool_name} ${p.tool_call_id || ""} ${p.decision || ""}`.trim();
  if (typeof p.delta === "string") return p.delta;
  if (typeof p.text === "string") return p.text;
  if (p.reason) return p.reason;
  if (p.error && p.error.message) return p.error.message;
  return "";
}

// Events that end a model turn: the calls requested after one of them, up to the next, are one turn's calls,
// which its runtime asked for together (parallel calls), whatever order they then ran and completed in.
const TURN_BOUNDARIES = new Set(["runtime.request.started", "runtime.request.completed", "model.output.completed",
                                 "model.input.appended"]);

// The tool calls of one task as a graph: each call a lane (requested -> decided -> started -> completed); the
// calls of one turn side by side, one turn under the other.
function toolGraph(events) {
  const calls = new Map();
  const batches = [];
  let open = null;
  for (const event of events) {
    const p = event.payload || {};
    if (TURN_BOUNDARIES.has(event.type)) open = null;
    if (!p.tool_call_id) continue;
    let call = calls.get(p.tool_call_id);
    if (event.type === "tool.call.requested") {
      if (!call) {
        call = { id: p.tool_call_id, name: p.tool_name, stages: {} };
        calls.set(p.tool_call_id, call);
        if (!open) { open = []; batches.push(open); }
        open.push(call);
      }
      call.stages.requested = { cls: "done", text: "requested" };
    }
    if (!call) continue;
    if (event.type === "tool.call.policy_evaluated") {
      if (p.decision === "abstain") continue;  // another source decides
      const waiting = p.decision === "ask";
      call.stages.decided = { cls: waiting ? "waiting" : p.decision === "deny" ? "bad" : "done",
                              text: waiting ? "waiting for a decision" : `${p.decision} (${p.source})` };
    } else if (event.type === "approval.requested") {
      call.stages.decided = { cls: "waiting", text: "waiting for a decision" };
    } else if (event.type === "tool.call.approved") {
      call.stages.decided = { cls: "done", text: "approved" };
    } else if (event.type === "tool.call.denied") {
      call.stages.decided = { cls: "bad", text: "denied" };
    } else if (event.type === "tool.call.started") {
      call.stages.started = { cls: "done", text: "started" };
    } else if (event.type === "tool.call.completed") {
      call.stages.completed = { cls: p.is_error ? "bad" : "done", text: p.is_error ? "failed" : "completed" };
    }
  }
  const stages = ["requested", "decided", "started", "completed"];
  if (!batches.length) return h("p", { class: "muted" }, "No tool calls.");
  return h("div", { class: "graph" }, batches.map((batch) => h("div", { class: "batch" }, batch.map((call) =>
    h("div", { class: "lane", "data-call": call.id },
      h("div", { class: "title" }, `${call.name} · ${call.id}`),
      stages.map((stage, i) => [i ? h("div", { class: "arrow" }, "↓") : null,
        h("div", { class: `node ${(call.stages[stage] || {}).cls || ""}`, "data-stage": stage },
          (call.stages[stage] || {}).text || stage)]))))));
}

function approvalCard(approval, after) {
  const scope = h("select", { class: "scope", name: "scope" },
    [["once", "this call only"], ["task", "this tool for the rest of the task"],
     ["session", "this tool for the session"], ["rule", "this tool where the pattern matches"]]
      .map(([value, label]) => h("option", { value }, label)));
  const kind = h("select", { class: "pattern-kind", hidden: true },
    ["path", "command", "host"].map((k) => h("option", { value: k }, k)));
  const value = h("input", { class: "pattern-value", hidden: true, placeholder: "src · git status · docs.python.org" });
  const reason = h("input", { class: "reason", placeholder: "reason (optional)" });
  scope.addEventListener("change", () => { kind.hidden = value.hidden = scope.value !== "rule"; });
  async function decide(allow) {
    const body = { allow, reason: reason.value, scope: scope.value };
    if (scope.value === "rule") {
      const text = value.value.trim();
      body.pattern = kind.value === "path" ? { kind: "path", prefix: text }
        : kind.value === "command" ? { kind: "command", argv: text.split(/\s+/).filter(Boolean) }
          : { kind: "host", host: text };
    }
    const done = await attempt(allow ? "Allow" : "Deny",
                               () => api("POST", `/v1/approvals/${encodeURIComponent(approval.approval_id)}`, body));
    if (done) after();
  }
  return h("div", { class: "card approval", "data-approval": approval.approval_id },
    h("div", {}, h("strong", {}, approval.tool_name), " ", badge(approval.state), " ",
      h("span", { class: "muted" },
        `${approval.tool_class} · task ${approval.task_id} · expires ${when(approval.expires_at)}`)),
    approval.reason ? h("div", { class: "muted" }, approval.reason) : null,
    h("pre", {}, JSON.stringify(approval.input, null, 2)),
    h("div", { class: "filters" }, scope, kind, value, reason,
      h("button", { type: "button", class: "allow", onclick: () => decide(true) }, "Allow"),
      h("button", { type: "button", class: "deny", onclick: () => decide(false) }, "Deny")));
}

function questionCard(asked, after) {
  const inputs = asked.questions.map((q) => {
    let field;
    if (q.options && q.options.length) {
      field = h("select", { multiple: q.multi_select, "data-question": q.id },
        q.options.map((o) => h("option", { value: o.label }, o.description ? `${o.label} — ${o.description}` : o.label)));
    } else {
      field = h("input", { type: q.secret ? "password" : "text", "data-question": q.id, autocomplete: "off" });
    }
    return [q, h("div", {}, h("div", {}, q.header ? h("strong", {}, `${q.header}: `) : null, q.text), field)];
  });
  const reason = h("input", { class: "reason", placeholder: "reason (to decline)" });
  async function answer(decline) {
    const body = decline ? { decline: true, reason: reason.value } : { answers: {} };
    if (!decline) {
      for (const [q, row] of inputs) {
        const field = row.querySelector("[data-question]");
        let value = field.multiple ? [...field.selectedOptions].map((o) => o.value) : field.value;
        const type = q.answer_schema && q.answer_schema.type;
        if (type === "number" || type === "integer") value = Number(value);
        if (type === "boolean") value = value === "true";
        body.answers[q.id] = value;
      }
    }
    const done = await attempt("Answer", () => api("POST", `/v1/questions/${encodeURIComponent(asked.question_id)}`, body));
    if (done) after();
  }
  return h("div", { class: "card question", "data-question-id": asked.question_id },
    h("div", {}, h("strong", {}, "Question"), " ", badge(asked.state), " ",
      h("span", { class: "muted" }, `task ${asked.task_id} · expires ${when(asked.expires_at)}`)),
    asked.message ? h("p", {}, asked.message) : null,
    inputs.map(([, row]) => row),
    h("div", { class: "filters" }, reason,
      h("button", { type: "button", class: "allow", onclick: () => answer(false) }, "Answer"),
      h("button", { type: "button", class: "deny", onclick: () => answer(true) }, "Decline")));
}

async function pendingInto(box, sessionId) {
  const [approvals, questions] = await Promise.all([
    attempt("Approvals", () => api("GET", "/v1/approvals")),
    attempt("Questions", () => api("GET", "/v1/questions")),
  ]);
  const refresh = () => pendingInto(box, sessionId);
  const cards = [];
  for (const a of approvals ? approvals.approvals : []) {
    if (!sessionId || a.session_id === sessionId) cards.push(approvalCard(a, refresh));
  }
  for (const q of questions ? questions.questions : []) {
    if (!sessionId || q.session_id === sessionId) cards.push(questionCard(q, refresh));
  }
  box.replaceChildren(...(cards.length ? cards : [h("p", { class: "muted" }, "Nothing is waiting for you.")]));
}

async function sessionPage(sessionId) {
  const session = await attempt("Session", () => api("GET", `/v1/sessions/${encodeURIComponent(sessionId)}`));
  if (!session) { show(h("h1", {}, "No such session"), h("p", {}, `No session ${sessionId} is yours to see.`)); return; }
  const base = `/v1/sessions/${encodeURIComponent(sessionId)}`;
  const head = h("div", { class: "card", id: "session-head" });
  const pending = h("div", { id: "pending" });
  const graphs = h("div", { id: "graphs" });
  const transcript = h("div", { id: "transcript" });
  const log = h("div", { id: "events" });
  const live = h("span", { id: "live", class: "muted" }, "connecting…");
  const events = [];

  async function renderHead() {
    const now = await attempt("Session", () => api("GET", base));
    if (!now) return;
    const stop = now.active_task_id ? h("button", { type: "button", class: "danger", id: "stop", onclick: async () => {
      const stopped = await attempt("Stop", () => api("POST", `/v1/tasks/${encodeURIComponent(now.active_task_id)}/stop`,
                                                     { reason: "stopped from the console" }));
      if (stopped) renderHead();
    } }, "Stop task") : null;
    head.replaceChildren(
      h("h1", {}, now.title || now.session_id),
      h("div", {}, badge(now.state), " ", h("span", { class: "muted" },
        `${now.session_id} · ${now.namespace} · ${now.runtime} · created ${when(now.created_at)}`)),
      h("div", { class: "filters" },
        now.active_task_id ? h("span", {}, "Running task ", h("code", { id: "active-task" }, now.active_task_id)) : null,
        stop, h("a", { href: `${base}/bundle`, download: `codesdk-bundle-${now.session_id}.tar.gz`, id: "bundle" },
          "Download support bundle")));
  }

  async function renderTranscript() {
    const t = await attempt("Transcript", () => api("GET", `${base}/transcript`));
    if (!t) return;
    transcript.replaceChildren(...t.messages.map((m) => h("div", { class: "message" },
      h("span", { class: "role" }, m.role), m.blocks.map((b) =>
        b.type === "text" || b.type === "thinking" ? h("div", { class: b.type }, b.text)
          : b.type === "code" ? h("pre", {}, b.code)
            : b.type === "tool_use" ? h("pre", {}, `→ ${b.name} ${JSON.stringify(b.input)}`)
              : b.type === "tool_result" ? h("pre", {}, `← ${b.denied ? "denied " : ""}${resultText(b.content)}`)
                : h("pre", {}, JSON.stringify(b))))));
    if (!t.messages.length) transcript.append(h("p", { class: "muted" }, "No messages yet."));
  }

  function renderGraphs() {
    const byTask = new Map();
    for (const e of events) {
      const task = e.trace && e.trace.task_id;
      if (!task) continue;
      if (!byTask.has(task)) byTask.set(task, []);
      byTask.get(task).push(e);
    }
    graphs.replaceChildren(...[...byTask].map(([task, list]) => {
      const end = list.find((e) => TERMINAL.has(e.type));
      return h("div", { class: "card task", "data-task": task },
        h("h3", {}, `Task ${task} `, badge(end ? end.type.slice(5) : "running")), toolGraph(list));
    }));
  }

  let redraw = null;
  function changed(event) {
    if (redraw === null) {  // once for a burst of events (a streamed answer is many deltas)
      redraw = setTimeout(() => { redraw = null; renderGraphs(); }, 50);
    }
    if (event.type.startsWith("approval.") || event.type.startsWith("question.")
        || event.type === "tool.call.approved" || event.type === "tool.call.denied") pendingInto(pending, sessionId);
    if (event.type === "task.started" || TERMINAL.has(event.type)) { renderHead(); renderTranscript(); }
  }

  show(head, h("div", { class: "grid2" },
    h("div", {}, h("h2", {}, "Waiting for you"), pending, h("h2", {}, "Tool calls"), graphs,
      h("h2", {}, "Events ", live), log),
    h("div", {}, h("h2", {}, "Transcript"), transcript)));
  await Promise.all([renderHead(), renderTranscript(), pendingInto(pending, sessionId)]);

  closeStream();
  const stream = new EventSource(`${base}/events/stream`);
  state.stream = stream;
  stream.onopen = () => { live.textContent = "live"; };
  stream.onerror = (message) => {
    // A frame named "error" is the service's last word (the token was revoked, the store fails): said, and for a
    // revoked token not retried — the page's next request asks to log in again.
    let failure = null;
    try { failure = message.data ? JSON.parse(message.data).error : null; } catch { failure = null; }
    if (failure && failure.code === "token_revoked") { stream.close(); live.textContent = `ended: ${failure.message}`; return; }
    live.textContent = "reconnecting…";
  };
  stream.onmessage = null;
  const seen = new Set();
  const receive = (message) => {
    let event;
    try { event = JSON.parse(message.data); } catch { return; }
    if (seen.has(event.seq)) return;
    seen.add(event.seq);
    events.push(event);
    log.append(h("div", { class: "event", "data-seq": event.seq, "data-type": event.type },
      h("span", {}, String(event.seq)), h("span", { class: "type" }, event.type),
      h("span", { class: "summary" }, summary(event))));
    while (log.children.length > 1000) log.firstChild.remove();
    log.scrollTop = log.scrollHeight;
    changed(event);
  };
  // SSE frames are named by event type: listen to every type the page may meet, and to unnamed ones.
  for (const type of EVENT_TYPES) stream.addEventListener(type, receive);
  stream.addEventListener("message", receive);
}

const EVENT_TYPES = ["session.created", "task.started", "model.input", "runtime.request.started",
  "runtime.request.completed", "model.output.delta", "model.output.completed", "tool.call.requested",
  "tool.call.policy_evaluated", "approval.requested", "tool.call.approved", "tool.call.denied", "tool.call.started",
  "tool.output.delta", "tool.output.completed", "tool.call.completed", "usage.reported", "task.completed",
  "task.failed", "task.stopped", "model.input.appended", "question.requested", "question.answered",
  "budget.reached", "budget.raised", "grant.created", "grant.revoked", "approval.escalated", "question.escalated"];

// -- what is waiting, polled ----------------------------------------------------------------------------------

function startPolling() {
  stopPolling();
  state.poll = setInterval(pollWaiting, POLL_MS);
  pollWaiting();
}

function stopPolling() {
  if (state.poll) clearInterval(state.poll);
  state.poll = null;
  state.waiting = "";
}

// The count of what is waiting, in the nav and the tab's title; the pending page redrawn when that changed (not
// otherwise: an answer being typed is kept).
async function pollWaiting() {
  let approvals, questions;
  try {
    [approvals, questions] = await Promise.all([api("GET", "/v1/approvals"), api("GET", "/v1/questions")]);
  } catch {
    return;  // logged out (api() showed the login) or unreachable: the next poll tries again
  }
  if (!state.who) return;
  const ids = [...approvals.approvals.map((a) => a.approval_id), ...questions.questions.map((q) => q.question_id)];
  const link = document.querySelector('#nav a[href="#/pending"]');
  if (link) link.textContent = ids.length ? `Pending (${ids.length})` : "Pending";
  document.title = ids.length ? `(${ids.length}) CodeSDK console` : "CodeSDK console";
  const key = ids.join(" ");
  if (key === state.waiting) return;
  state.waiting = key;
  const box = document.getElementById("pending");
  if (box && document.body.dataset.page === "pending") pendingInto(box, null);
}

async function pendingPage() {
  const box = h("div", { id: "pending" });
  show(h("h1", {}, "Waiting for a decision"), box);
  await pendingInto(box, null);
}

// -- admin --------------------------------------------------------------------------------------------------

async function namespacesPage() {
  const list = await attempt("Namespaces", () => api("GET", "/v1/namespaces"));
  show(h("h1", {}, "Namespaces"), h("table", { id: "namespaces" },
    h("thead", {}, h("tr", {}, h("th", {}, "Namespace"), h("th", {}, "Sessions"))),
    h("tbody", {}, (list ? list.namespaces : []).map((ns) => h("tr", {},
      h("td", {}, h("a", { href: `#/sessions?namespace=${encodeURIComponent(ns.namespace)}&state=all` }, ns.namespace)),
      h("td", {}, String(ns.sessions)))))));
}

async function workersPage() {
  const [workers, ready] = await Promise.all([
    attempt("Workers", () => api("GET", "/v1/workers")),
    fetch("/readyz", { cache: "no-store" }).then((r) => r.json()).catch(() => null),
  ]);
  const health = ready && ready.status === "ready" ? badge("ready")
    : h("span", {}, badge("failed"), " ", ready && ready.error ? ready.error.message : "not ready");
  show(h("h1", {}, "Workers and health"),
    h("div", { class: "card", id: "health" }, "Service: ", health),
    h("p", { class: "muted" }, workers ? `Worker template: ${workers.template}` : ""),
    h("table", { id: "workers" }, h("thead", {}, h("tr", {}, ["Namespace", "State", "PID", "Active tasks", "Started",
      "Recent crashes", "Last error", "Quarantine", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, (workers ? workers.workers : []).map((w) => h("tr", { "data-namespace": w.namespace },
        h("td", {}, w.namespace + (w.session_id ? ` (${w.session_id})` : "")), h("td", {}, badge(w.state)),
        h("td", {}, w.pid ?? ""), h("td", {}, String(w.active_tasks)), h("td", {}, String(w.workers_started)),
        h("td", {}, String(w.recent_crashes)), h("td", {}, w.last_error || w.last_exit || ""),
        h("td", {}, w.quarantined_until ? `until ${when(w.quarantined_until)}: ${w.quarantine_reason || ""}` : ""),
        h("td", {}, w.quarantined_until ? h("button", { type: "button", class: "lift", onclick: async () => {
          const lifted = await attempt("Lift quarantine", () =>
            api("DELETE", `/v1/namespaces/${encodeURIComponent(w.namespace)}/quarantine`));
          if (lifted) workersPage();
        } }, "Lift quarantine") : ""))))));
}

function secretBox(label, secret) {
  return h("div", { class: "card", id: "secret" }, h("strong", {}, label), " (shown once; copy it now): ",
           h("span", { class: "secret" }, secret));
}

async function tokensPage(shown) {
  const list = await attempt("Tokens", () => api("GET", "/v1/tokens"));
  const name = h("input", { name: "name", placeholder: "name", required: true });
  const namespaces = h("input", { name: "namespaces", placeholder: "namespaces, comma-separated (user:alice)" });
  const form = h("form", { class: "inline", id: "token-add" }, name, namespaces, h("button", { type: "submit" }, "Add token"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const made = await attempt("Add token", () => api("POST", "/v1/tokens", {
      name: name.value.trim(), namespaces: namespaces.value.split(",").map((s) => s.trim()).filter(Boolean) }));
    if (made) tokensPage(secretBox(`Token ${made.token.name}`, made.secret));
  });
  show(h("h1", {}, "Tokens"), shown || null, form,
    h("table", { id: "tokens" }, h("thead", {}, h("tr", {}, ["Id", "Name", "Namespaces", "Kind", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, (list ? list.tokens : []).map((t) => h("tr", { "data-token": t.id },
        h("td", {}, t.id), h("td", {}, t.name), h("td", {}, t.namespaces.join(", ")),
        h("td", {}, t.admin ? "admin" : t.metrics ? "metrics" : "tenant"),
        h("td", {}, h("button", { type: "button", onclick: async () => {
          const rotated = await attempt("Rotate", () => api("POST", `/v1/tokens/${encodeURIComponent(t.id)}/rotate`));
          if (rotated) tokensPage(secretBox(`New token for ${t.name}`, rotated.secret));
        } }, "Rotate"), " ", h("button", { type: "button", class: "danger", onclick: async () => {
          if (!confirm(`Revoke token ${t.name} (${t.id})? It stops working at once.`)) return;
          if (await attempt("Revoke", () => api("DELETE", `/v1/tokens/${encodeURIComponent(t.id)}`)) !== undefined) tokensPage();
        } }, "Revoke")))))));
}

const WEBHOOK_KINDS = ["*", "task.completed", "task.failed", "task.stopped", "approval.requested",
  "question.requested", "approval.escalated", "question.escalated", "budget.reached", "worker.quarantined",
  "lease.moved"];

async function webhooksPage(shown) {
  let list;
  try {
    list = await api("GET", "/v1/webhooks");
  } catch (error) {
    if (error.status === 404 || error.code === "webhooks_unavailable") {
      show(h("h1", {}, "Webhooks"), h("p", { id: "webhooks-unavailable" },
        `Webhooks are not available here: ${error.status === 404 ? "this API has no /v1/webhooks" : error.message}`));
      return;
    }
    notice(`Webhooks: ${error.message}`, true);
    return;
  }
  notice("");
  const url = h("input", { name: "url", type: "url", placeholder: "https://hooks.example.com/codesdk", required: true });
  const kinds = h("select", { name: "kinds", multiple: true, size: 5 },
    WEBHOOK_KINDS.map((k) => h("option", { value: k, selected: k === "*" }, k)));
  const namespace = h("input", { name: "namespace", placeholder: state.who.admin ? "namespace (empty: all)" : "namespace" });
  const description = h("input", { name: "description", placeholder: "description" });
  const form = h("form", { class: "inline", id: "webhook-add" }, url, kinds, namespace, description,
                 h("button", { type: "submit" }, "Add webhook"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { url: url.value.trim(), kinds: [...kinds.selectedOptions].map((o) => o.value) };
    if (namespace.value.trim()) body.namespace = namespace.value.trim();
    if (description.value.trim()) body.description = description.value.trim();
    const made = await attempt("Add webhook", () => api("POST", "/v1/webhooks", body));
    if (made) webhooksPage(secretBox(`Secret of ${made.webhook.id}`, made.secret));
  });
  const deliveries = h("div", { id: "deliveries" });
  const path = (w) => `/v1/webhooks/${encodeURIComponent(w.id)}`;
  async function showDeliveries(w, which) {
    const query = which ? `?state=${which}` : "";
    const got = await attempt("Deliveries", () => api("GET", `${path(w)}/deliveries${query}`));
    if (!got) return;
    const filter = h("select", {}, ["", "pending", "delivered", "dead"].map((s) =>
      h("option", { value: s, selected: s === (which || "") }, s || "every state")));
    filter.addEventListener("change", () => showDeliveries(w, filter.value));
    deliveries.replaceChildren(h("h2", {}, `Deliveries of ${w.id} `), filter,
      h("table", {}, h("thead", {}, h("tr", {}, ["Id", "Kind", "State", "Attempts", "Next attempt", "Last error", ""]
        .map((t) => h("th", {}, t)))),
        h("tbody", {}, got.deliveries.map((d) => h("tr", {},
          h("td", {}, d.id), h("td", {}, d.kind), h("td", {}, badge(d.state)), h("td", {}, String(d.attempts)),
          h("td", {}, when(d.next_attempt_at)), h("td", {}, d.last_error || ""),
          h("td", {}, h("button", { type: "button", onclick: async () => {
            const one = await attempt("Attempts", () => api("GET", `${path(w)}/deliveries/${encodeURIComponent(d.id)}`));
            if (one) deliveries.append(h("div", { class: "card" }, h("h3", {}, `Attempts of ${d.id}`),
              h("table", {}, h("tbody", {}, (one.attempts || []).map((a) => h("tr", {}, h("td", {}, when(a.at)),
                h("td", {}, a.status ?? ""), h("td", {}, a.error || ""), h("td", {}, `${a.duration_ms} ms`)))))));
          } }, "Attempts"), " ", h("button", { type: "button", onclick: async () => {
            if (await attempt("Redeliver", () => api("POST", `${path(w)}/deliveries/${encodeURIComponent(d.id)}/redeliver`)))
              showDeliveries(w, which);
          } }, "Redeliver")))))));
  }
  show(h("h1", {}, "Webhooks"), shown || null, form,
    h("table", { id: "webhooks" }, h("thead", {}, h("tr", {}, ["Id", "URL", "Kinds", "Namespace", "Description", ""]
      .map((t) => h("th", {}, t)))),
      h("tbody", {}, list.webhooks.map((w) => h("tr", { "data-webhook": w.id },
        h("td", {}, w.id, w.disabled ? " (disabled)" : ""), h("td", {}, w.url), h("td", {}, w.kinds.join(", ")),
        h("td", {}, w.namespace ?? "every namespace"), h("td", {}, w.description || ""),
        h("td", {},
          h("button", { type: "button", onclick: () => showDeliveries(w, "") }, "Deliveries"), " ",
          h("button", { type: "button", onclick: async () => {
            if (await attempt("Test", () => api("POST", `${path(w)}/test`))) showDeliveries(w, "");
          } }, "Send test"), " ",
          h("button", { type: "button", onclick: async () => {
            let rotated;
            try {
              rotated = await api("POST", `${path(w)}/rotate`);
            } catch (error) {
              // A rotation while the previous one's overlap runs is refused: the operator may end that overlap now.
              if (error.code !== "rotation_overlaps" || !confirm(`${error.message}\n\nEnd that overlap now?`)) {
                notice(`Rotate: ${error.message}`, true);
                return;
              }
              rotated = await attempt("Rotate", () => api("POST", `${path(w)}/rotate`, { end_overlap: true }));
            }
            const until = when(rotated && rotated.previous_valid_until);
            if (rotated) webhooksPage(secretBox(`New secret of ${w.id} (the old one works until ${until})`, rotated.secret));
          } }, "Rotate secret"), " ",
          h("button", { type: "button", class: "danger", onclick: async () => {
            if (!confirm(`Remove webhook ${w.id}?`)) return;
            if (await attempt("Remove", () => api("DELETE", path(w))) !== undefined) webhooksPage();
          } }, "Remove")))))), deliveries);
}

// -- routing ------------------------------------------------------------------------------------------------

async function route() {
  if (!state.who) return;
  closeStream();
  const [path, query] = (location.hash.slice(1) || "/sessions").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("current", a.getAttribute("href") === `#/${parts[0]}`);
  }
  document.body.dataset.page = parts[0] || "sessions";
  if (parts[0] === "session" && parts[1]) await sessionPage(decodeURIComponent(parts[1]));
  else if (parts[0] === "pending") await pendingPage();
  else if (parts[0] === "namespaces") await namespacesPage();
  else if (parts[0] === "workers") await workersPage();
  else if (parts[0] === "tokens") await tokensPage();
  else if (parts[0] === "webhooks") await webhooksPage();
  else await sessionsPage(params);
  document.body.dataset.ready = location.hash;
}

async function start() {
  document.getElementById("logout").addEventListener("click", logout);
  window.addEventListener("hashchange", route);
  try {
    loggedIn(await api("GET", "/console/session"));
    await route();
  } catch {
    loggedOut();
  }
}

start();
