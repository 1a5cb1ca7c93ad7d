// The pipeline dashboard: reads the admin JSON API and redraws. No framework, no build step.
// Job data is always inserted as text (textContent), never as HTML.
"use strict";

(() => {
  const REFRESH_MS = 5000;
  const STATUSES = ["waiting", "pending", "running", "suspended", "completed", "dead", "cancelled"];
  const INBOX_SCAN = 200;  // suspended jobs read per refresh to find those waiting for a signal (the API's page limit)
  const INBOX_SHOWN = 20;  // of them, shown with their steps (one GET each per refresh)
  const FOREVER = "9999-12-31T23:59:59.999Z";  // a wait without a timeout is due then (backends/base.py)
  const BATCH_PAGE = 100;  // a batch view's jobs per page (and boxes in its graph)
  const FINISHED = ["completed", "dead", "cancelled"];  // the chart's stack, bottom up
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  // open: the job whose view is shown; batch: the batch whose view is shown (one view at a time)
  const state = { status: "", type: "", order: "newest", page: 1, perPage: 50, open: null, batch: null, batchOffset: 0, total: 0 };
  let timer = null;
  let busy = false;
  let again = false;

  // -- the address bar holds the filters, so a view can be shared or reloaded -------------

  function readHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    state.status = STATUSES.includes(p.get("status")) ? p.get("status") : "";
    state.type = p.get("type") || "";
    state.order = p.get("order") === "claim" ? "claim" : "newest";
    state.page = Math.max(1, parseInt(p.get("page") || "1", 10) || 1);
    const pp = parseInt(p.get("per_page") || "50", 10);
    state.perPage = [25, 50, 100, 200].includes(pp) ? pp : 50;
    state.open = p.get("job") || null;
    state.batch = state.open ? null : p.get("batch") || null;
    state.batchOffset = Math.max(0, parseInt(p.get("batch_offset") || "0", 10) || 0);
  }

  function writeHash() {
    const p = new URLSearchParams();
    if (state.status) p.set("status", state.status);
    if (state.type) p.set("type", state.type);
    if (state.order !== "newest") p.set("order", state.order);
    if (state.page > 1) p.set("page", String(state.page));
    if (state.perPage !== 50) p.set("per_page", String(state.perPage));
    if (state.open) p.set("job", state.open);
    if (state.batch) p.set("batch", state.batch);
    if (state.batch && state.batchOffset) p.set("batch_offset", String(state.batchOffset));
    const text = p.toString();
    history.replaceState(null, "", text ? "#" + text : location.pathname);
  }

  // -- talking to the API ------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem("pipeline-admin-token");
    if (token) headers.Authorization = "Bearer " + token;
    if (method !== "GET") headers["Content-Type"] = "application/json";  // the server refuses a POST without it
    const response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store",
    });
    if (response.status === 401) {
      $("auth").hidden = false;
      throw new ApiError(401, "this server needs its admin token");
    }
    if (response.status === 204) return null;
    let data = null;
    try { data = await response.json(); } catch (e) { /* not JSON */ }
    if (!response.ok) {
      const message = data && data.error ? data.error.message : response.status + " " + response.statusText;
      throw new ApiError(response.status, message);
    }
    return data;
  }

  function showProblem(error) {
    const box = $("problem");
    if (!error || error.status === 401) { box.hidden = true; return; }
    box.textContent = "Could not load: " + error.message;
    box.hidden = false;
  }

  // -- drawing -----------------------------------------------------------------------------

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // Every time on the page is UTC and says so, as the API, the CLI and the schedules' next runs are:
  // today's as "15:04:05 UTC", another day's with its date; the stored ISO text is in the cell's title.
  const pad = (n, width = 2) => String(n).padStart(width, "0");

  function utcDate(d) {
    return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}`;
  }

  function utcClock(d, millis) {
    const clock = `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`;
    return millis ? `${clock}.${pad(d.getUTCMilliseconds(), 3)}` : clock;
  }

  // "15:04:05 UTC" today, "2026-12-02 03:00:00 UTC" another day; full: always the date, and milliseconds
  function utcTime(iso, full = false) {
    if (!iso) return "";
    const d = new Date(iso);
    if (isNaN(d)) return iso;
    const day = utcDate(d);
    const clock = utcClock(d, full);
    return (full || day !== utcDate(new Date()) ? `${day} ${clock}` : clock) + " UTC";
  }

  // a table cell showing a time as utcTime does, the stored text (and ``more``) in its title
  function timeCell(iso, empty, more) {
    if (!iso) return el("td", { class: "time muted" }, empty);
    return el("td", { class: "time", title: more ? `${iso}\n${more}` : iso }, utcTime(iso));
  }

  // the wall-clock time of ``iso`` in a schedule's zone, for the tooltip: "03:00:00 in Europe/Paris"
  function inZone(iso, zone) {
    try {
      const text = new Date(iso).toLocaleString("sv-SE", { timeZone: zone, timeZoneName: "short" });
      return `${text} in ${zone}`;
    } catch (e) {
      return "";
    }
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "nothing is waiting";
    if (seconds < 1) return Math.round(seconds * 1000) + " ms";
    if (seconds < 120) return seconds.toFixed(1) + " s";
    if (seconds < 7200) return Math.round(seconds / 60) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  function badge(status) {
    return el("span", { class: "badge " + status }, status);
  }

  function drawCounts(stats) {
    for (const s of STATUSES) $("count-" + s).textContent = stats.by_status[s] ?? 0;
    $("count-total").textContent = stats.total;
    for (const button of document.querySelectorAll("#counts .count")) {
      button.classList.toggle("selected", button.dataset.status === state.status);
      button.setAttribute("aria-pressed", button.dataset.status === state.status ? "true" : "false");
    }
    $("lag").textContent = duration(stats.oldest_due_pending_age_seconds);
  }

  function drawWorkers(answer) {
    const body = $("workers-body");
    body.replaceChildren();
    if (!answer.workers.length) {
      const row = el("tr");
      row.append(el("td", { colspan: "4", class: "muted" }, "none has beaten yet"));
      body.append(row);
    }
    for (const w of answer.workers) {
      const row = el("tr");
      row.append(el("td", {}, w.owner));
      row.append(el("td", {}, w.job_types.join(", ") || "–"));
      row.append(timeCell(w.heartbeat_at, "–"));
      row.append(el("td", { class: w.alive ? "completed" : "dead" }, w.alive ? "alive" : "gone (lease ran out)"));
      body.append(row);
    }
  }

  function drawSchedules(answer) {
    const body = $("schedules-body");
    body.replaceChildren();
    if (!answer.schedules.length) {
      const row = el("tr");
      row.append(el("td", { colspan: "8", class: "muted" }, "no schedules"));
      body.append(row);
    }
    for (const s of answer.schedules) {
      const row = el("tr", { "data-name": s.name });
      row.append(el("td", { class: "name" }, s.name));
      row.append(el("td", { class: "cron" }, s.cron));
      row.append(el("td", { class: "zone" }, s.timezone));
      row.append(el("td", {}, s.job_type));
      row.append(s.enabled ? timeCell(s.next_run, "", inZone(s.next_run, s.timezone)) : el("td", { class: "time muted" }, "–"));
      row.append(timeCell(s.last_run, "never", s.last_run ? inZone(s.last_run, s.timezone) : ""));
      row.append(el("td", { class: "state " + (s.enabled ? "completed" : "dead") }, s.state));
      const actions = el("td", { class: "buttons" });
      const toggle = el("button", {
        type: "button", class: "small " + (s.enabled ? "pause" : "resume"),
        title: s.enabled ? "stop firing; kept, with its history" : "fire again, from its first tick after now",
      }, s.enabled ? "Pause" : "Resume");
      toggle.addEventListener("click", () => actOnSchedule(s.name, s.enabled ? "pause" : "resume"));
      const remove = el("button", {
        type: "button", class: "small danger remove",
        title: s.origin === "code" ? "delete it; it comes back at the next start while the code declares it"
          : "delete this schedule",
      }, "Remove");
      remove.addEventListener("click", () => actOnSchedule(s.name, "remove"));
      actions.append(toggle, remove);
      row.append(actions);
      body.append(row);
    }
  }

  // the job types (GET /admin/types): paused or not, counts, limits, with Pause/Resume and "Retry dead"
  function drawTypes(answer) {
    const body = $("types-body");
    const types = answer.types.map((t) => t.name);
    body.replaceChildren();
    if (!types.length) {
      const row = el("tr");
      row.append(el("td", { colspan: "13", class: "muted" }, "no job types"));
      body.append(row);
    }
    for (const t of answer.types) {
      const row = el("tr", { class: "clickable", "data-type": t.name });
      row.append(el("td", { class: "name" }, t.name));
      const state = t.paused ? "paused" : "active";
      row.append(el("td", {
        class: "state " + (t.paused ? "paused" : "completed"),
        title: t.paused ? "no job of this type starts, in any process; enqueues are still accepted" : "its jobs run",
      }, t.registered ? state : state + " (not in the app)"));
      for (const s of STATUSES) {
        const n = t.counts[s] || 0;
        row.append(el("td", { class: "num " + s + (n ? "" : " zero") }, n));
      }
      for (const limit of [t.concurrency, t.global_limit, t.rate_limit]) {
        row.append(el("td", { class: "num limit" + (limit === null ? " zero" : "") }, limit === null ? "–" : limit));
      }
      const actions = el("td", { class: "buttons" });
      const toggle = el("button", {
        type: "button", class: "small " + (t.paused ? "resume" : "pause"),
        title: t.paused ? "start its jobs again" : "start no new job of this type, in any process (running ones finish)",
      }, t.paused ? "Resume" : "Pause");
      toggle.addEventListener("click", (e) => { e.stopPropagation(); actOnType(t.name, t.paused ? "resume" : "pause"); });
      const dead = t.counts.dead || 0;
      const retry = el("button", {
        type: "button", class: "small retry-dead",
        title: dead ? `every dead ${t.name} job back to pending, attempts reset` : "no dead job of this type",
      }, "Retry dead");
      retry.disabled = !dead;
      retry.addEventListener("click", (e) => { e.stopPropagation(); retryDead(t.name, dead); });
      actions.append(toggle, retry);
      row.append(actions);
      row.addEventListener("click", () => setFilter({ type: t.name }));
      body.append(row);
    }
    // the type filter offers every type the store has, plus the current choice
    const select = $("f-type");
    const wanted = new Set(types);
    if (state.type) wanted.add(state.type);
    const have = Array.from(select.options).slice(1).map((o) => o.value);
    const list = Array.from(wanted).sort();
    if (have.join("\n") !== list.join("\n")) {
      select.replaceChildren(el("option", { value: "" }, "any"), ...list.map((t) => el("option", { value: t }, t)));
    }
    select.value = state.type;
  }

  function drawChart(stats) {
    const svg = $("chart");
    const H = 180, left = 36, bottom = 22, top = 10, right = 6;
    // as wide as the card shows it, so the bars fill the row at any width (the height stays 180)
    const shown = Math.round(svg.getBoundingClientRect().width);
    const W = shown >= 320 ? shown : 640;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const minutes = stats.finished_per_minute;
    const finished = (m) => FINISHED.reduce((sum, s) => sum + (m[s] || 0), 0);
    const max = Math.max(1, ...minutes.map(finished));
    const scale = niceMax(max);
    const plotW = W - left - right, plotH = H - top - bottom;
    const bw = plotW / minutes.length;
    svg.replaceChildren();
    // grid and y labels
    for (const frac of [0, 0.5, 1]) {
      const y = top + plotH - frac * plotH;
      svg.append(svgEl("line", { x1: left, x2: W - right, y1: y, y2: y, class: "grid" }));
      const label = svgEl("text", { x: left - 6, y: y + 4, class: "axis", "text-anchor": "end" });
      const value = frac * scale;
      label.textContent = Number.isInteger(value) ? String(value) : value.toFixed(1);
      svg.append(label);
    }
    let total = 0;
    minutes.forEach((m, i) => {
      total += finished(m);
      const x = left + i * bw + 1;
      const g = svgEl("g", { class: "bar" });
      const title = svgEl("title", {});
      title.textContent = `${utcClock(new Date(m.minute)).slice(0, 5)} UTC: ` +
        FINISHED.map((s) => `${m[s] || 0} ${s}`).join(", ");
      g.append(title);
      // an invisible full-height rect makes thin bars easy to hover
      g.append(svgEl("rect", { x, y: top, width: Math.max(bw - 2, 1), height: plotH, class: "hover" }));
      let base = top + plotH;  // completed at the bottom, then dead, then cancelled
      for (const s of FINISHED) {
        const h = ((m[s] || 0) / scale) * plotH;
        if (h > 0) g.append(svgEl("rect", { x, y: base - h, width: Math.max(bw - 2, 1), height: h, class: s }));
        base -= h;
      }
      svg.append(g);
    });
    for (const [i, text] of [[0, "−60 min"], [30, "−30 min"], [59, "now"]]) {
      const label = svgEl("text", { x: left + i * bw + bw / 2, y: H - 6, class: "axis", "text-anchor": i === 0 ? "start" : i === 59 ? "end" : "middle" });
      label.textContent = text;
      svg.append(label);
    }
    $("finished-hour").textContent = `${total} in the last hour`;
  }

  function niceMax(n) {
    const steps = [1, 2, 5, 10];
    let base = 1;
    while (true) {
      for (const s of steps) if (s * base >= n) return s * base;
      base *= 10;
    }
  }

  function svgEl(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  function drawJobs(list) {
    state.total = list.total;
    const body = $("job-rows");
    body.replaceChildren();
    if (!list.items.length) {
      const row = el("tr");
      row.append(el("td", { colspan: "8", class: "muted empty" }, "no jobs match"));
      body.append(row);
    }
    for (const job of list.items) {
      const row = el("tr", { class: "clickable", "data-id": job.id, tabindex: "0" });
      row.append(el("td", { class: "id" }, job.id));
      row.append(el("td", {}, job.job_type));
      const statusCell = el("td", { class: "status" });
      statusCell.append(badge(job.status));
      if (job.status === "running" && job.progress) {
        const bar = el("progress", { max: "1", class: "list-progress", title: progressText(job.progress) });
        bar.value = job.progress.fraction;
        statusCell.append(bar);
      }
      row.append(statusCell);
      row.append(el("td", { class: "num" }, `${job.attempts}/${job.max_attempts}`));
      row.append(el("td", { class: "num priority" }, String(job.priority)));
      row.append(timeCell(job.run_after, ""));
      row.append(timeCell(job.updated_at, ""));
      row.append(el("td", { class: "error-cell", title: job.error || "" }, (job.error || "").split("\n")[0]));
      row.addEventListener("click", () => openJob(job.id));
      row.addEventListener("keydown", (e) => { if (e.key === "Enter") openJob(job.id); });
      body.append(row);
    }
    const pages = Math.max(1, Math.ceil(list.total / list.per_page));
    const first = list.total ? (list.page - 1) * list.per_page + 1 : 0;
    const last = Math.min(list.total, list.page * list.per_page);
    $("page-info").textContent = `${first}–${last} of ${list.total} · page ${list.page} of ${pages}`;
    $("prev").disabled = list.page <= 1;
    $("next").disabled = list.page >= pages;
    $("f-status").value = state.status;
    $("f-order").value = state.order;
    $("jobs-order").textContent = state.order === "claim" ? "in claim order: priority, then due time" : "newest first";
    $("f-per-page").value = String(state.perPage);
  }

  function progressText(progress) {
    const percent = Math.round(progress.fraction * 100) + "%";
    return progress.message ? `${percent} · ${progress.message}` : percent;
  }

  // An answer that comes back after the operator moved on (another job or a batch opened, the view
  // closed) is dropped: drawn, it would reopen a view over the one now shown.
  function drawDetail(job) {
    if (state.open !== job.id) return;
    $("d-id").textContent = job.id;
    const status = $("d-status");
    status.textContent = job.status;
    status.className = "badge " + job.status;
    $("d-type").textContent = job.job_type;
    $("d-attempts").textContent = `${job.attempts} of ${job.max_attempts}`;
    $("d-snoozes").textContent = job.snoozes;
    $("d-cancel-requested").hidden = !job.cancel_requested;
    const progress = job.progress;
    for (const id of ["d-progress-label", "d-progress-row"]) $(id).hidden = !progress;
    if (progress) {
      $("d-progress").value = progress.fraction;
      $("d-progress-text").textContent = progressText(progress);
    }
    $("d-expires").textContent = job.expires_at ? utcTime(job.expires_at, true) : "never";
    $("d-expires").title = job.expires_at || "";
    $("d-priority").textContent = job.priority;
    $("d-unique-key").textContent = job.unique_key ?? "—";
    for (const [id, iso] of [["d-run-after", job.run_after], ["d-created", job.created_at], ["d-updated", job.updated_at]]) {
      $(id).textContent = utcTime(iso, true);
      $(id).title = iso;
    }
    if (job.run_after === FOREVER) $("d-run-after").textContent = "when its signal comes (no timeout)";
    for (const id of ["d-awaiting-label", "d-awaiting"]) $(id).hidden = !job.awaiting_signal;
    $("d-awaiting").textContent = job.awaiting_signal || "";
    const steps = job.steps || [];
    $("d-steps-box").hidden = !steps.length;
    $("d-steps").replaceChildren(...stepRows(steps));
    $("d-payload").textContent = JSON.stringify(job.payload, null, 2);
    const hasResult = job.status === "completed" || (job.result !== null && job.result !== undefined);
    $("d-result-box").hidden = !hasResult;
    $("d-result").textContent = job.result === null || job.result === undefined ? "—" : JSON.stringify(job.result, null, 2);
    $("d-error").textContent = job.error || "—";
    drawFlow(job);
    const retryable = job.status === "dead" || job.status === "cancelled";
    $("d-retry").disabled = !retryable;
    $("d-retry").title = retryable ? "back to pending, attempts reset, due now" : "only dead or cancelled jobs can be retried";
    const cancellable = ["waiting", "pending", "running", "suspended"].includes(job.status) && !job.cancel_requested;
    $("d-cancel").disabled = !cancellable;
    $("d-cancel").title = job.cancel_requested ? "its cancel was requested: its worker stops it"
      : job.status === "running" ? "ask its worker to stop it: it ends cancelled, never retried"
      : job.status === "pending" ? "cancel it now: it never runs"
      : job.status === "waiting" ? "cancel it now: it never runs (nor do the jobs waiting for it)"
      : job.status === "suspended" ? "cancel it now: it does not resume"
      : "only waiting, pending, suspended or running jobs can be cancelled";
    $("d-delete").disabled = job.status === "running";
    $("d-delete").title = job.status === "running" ? "a running job cannot be deleted" : "delete this job record";
    $("detail").hidden = false;
    $("backdrop").hidden = false;
  }

  // a durable job's steps as table rows: name, status, times, stored value (whole in the cell's title)
  function stepRows(steps) {
    return steps.map((step) => {
      const row = el("tr", { "data-step": step.name });
      row.append(el("td", { class: "name" }, step.name));
      row.append(el("td", { class: "state " + (step.status === "completed" ? "completed" : "suspended") }, step.status));
      row.append(timeCell(step.started_at, "–"));
      row.append(timeCell(step.ended_at, "–"));
      const value = step.value === null || step.value === undefined ? "–" : JSON.stringify(step.value);
      row.append(el("td", { class: "value", title: value }, value.length > 200 ? value.slice(0, 200) + "…" : value));
      return row;
    });
  }

  // -- the inbox: jobs suspended in ctx.wait_for, with buttons that send the signal they wait for -------

  // One node per job, kept across refreshes so that what the operator typed in its JSON field stays.
  const inboxNodes = new Map();

  function drawInbox(waiting, details, scanned) {
    $("inbox-count").textContent = waiting.length;
    $("inbox-empty").hidden = waiting.length > 0;
    const box = $("inbox-items");
    const shown = waiting.slice(0, INBOX_SHOWN).map((job) => details.get(job.id) || job);
    const keep = new Set(shown.map((job) => job.id));
    for (const [id, node] of inboxNodes) if (!keep.has(id)) { node.remove(); inboxNodes.delete(id); }
    for (const job of shown) {
      let node = inboxNodes.get(job.id);
      if (!node || node.dataset.signal !== job.awaiting_signal) {
        const fresh = inboxItem(job);
        if (node) node.replaceWith(fresh); else box.append(fresh);
        node = fresh;
        inboxNodes.set(job.id, node);
      }
      fillInboxItem(node, job);
      box.append(node);  // (moved into the list's order; the same node, so its field keeps its text)
    }
    const more = $("inbox-more");
    const left = waiting.length - shown.length;
    more.hidden = !left && !scanned.truncated;
    more.textContent = (left ? `… and ${left} more waiting. ` : "") +
      (scanned.truncated ? `Only the ${INBOX_SCAN} newest of the ${scanned.total} suspended jobs were looked at: ` +
        "filter the job list by suspended to see them all." : "");
  }

  function inboxItem(job) {
    const node = el("article", { class: "inbox-item", "data-id": job.id, "data-signal": job.awaiting_signal });
    const head = el("header");
    head.append(viewLink("job", job.id), " ", el("span", { class: "type" }), " waits for ",
      el("code", { class: "signal" }, job.awaiting_signal), " ", el("span", { class: "muted timeout" }));
    const payload = el("div", { class: "inbox-payload" });
    payload.append(el("h3", {}, "Payload"), el("pre", { class: "payload" }));
    const steps = el("div", { class: "inbox-steps" });
    const table = el("table", { class: "steps" });
    const thead = el("thead");
    const headRow = el("tr");
    for (const name of ["name", "status", "started", "ended", "value"]) headRow.append(el("th", {}, name));
    thead.append(headRow);
    table.append(thead, el("tbody"));
    const scroll = el("div", { class: "scroll" });
    scroll.append(table);
    steps.append(el("h3", {}, "Steps"), scroll);
    const actions = el("div", { class: "inbox-actions" });
    const approve = el("button", { type: "button", class: "primary approve", title: "send the signal with the payload true" }, "Approve");
    const reject = el("button", { type: "button", class: "danger reject", title: "send the signal with the payload false" }, "Reject");
    const field = el("input", { type: "text", class: "signal-json", "aria-label": `payload of ${job.awaiting_signal} as JSON`,
      placeholder: 'or any JSON: {"approved": true, "note": "…"}', spellcheck: "false" });
    const send = el("button", { type: "button", class: "send", title: "send the signal with the JSON typed here (empty: no payload)" }, "Send");
    const said = el("span", { class: "item-message muted", role: "status" });
    approve.addEventListener("click", () => sendSignal(job.id, node.dataset.signal, true, "approve"));
    reject.addEventListener("click", () => sendSignal(job.id, node.dataset.signal, false, "reject"));
    const sendTyped = () => {
      const text = field.value.trim();
      let payload;
      if (text) {
        try { payload = JSON.parse(text); } catch (e) { said.textContent = "not JSON: " + e.message; return; }
      }
      sendSignal(job.id, node.dataset.signal, payload, "payload");
    };
    send.addEventListener("click", sendTyped);
    field.addEventListener("keydown", (e) => { if (e.key === "Enter") sendTyped(); });
    actions.append(approve, reject, field, send, said);
    const body = el("div", { class: "inbox-body" });
    body.append(payload, steps);
    node.append(head, body, actions);
    return node;
  }

  function fillInboxItem(node, job) {
    node.querySelector(".type").textContent = job.job_type;
    node.querySelector(".timeout").textContent = job.run_after === FOREVER ? "· no timeout"
      : `· times out at ${utcTime(job.run_after, true)}`;
    node.querySelector(".payload").textContent = JSON.stringify(job.payload, null, 2);
    const steps = job.steps || [];
    node.querySelector(".inbox-steps").hidden = !steps.length;
    node.querySelector(".inbox-steps tbody").replaceChildren(...stepRows(steps));
  }

  async function sendSignal(id, name, payload, label) {
    const message = $("inbox-message");
    message.textContent = `sending ${name} to ${id}…`;
    try {
      const done = await api("POST", `/admin/jobs/${encodeURIComponent(id)}/signals/${encodeURIComponent(name)}`, payload);
      message.textContent = `${name} sent to ${id} (${label}): ` +
        (done.outcome === "woken" ? "woken, it resumes" : "kept for its wait");
    } catch (error) {
      message.textContent = `${id}: ${error.message}`;
    }
    await refresh();
  }

  // the inbox's jobs (those of the suspended list that wait for a signal), the first INBOX_SHOWN read whole
  // (the list leaves the steps out); one woken, cancelled or deleted since the list was read is left out
  async function inboxDetails(list) {
    const listed = list.items.filter((job) => job.awaiting_signal);
    const head = listed.slice(0, INBOX_SHOWN);
    const found = await Promise.all(head.map((job) =>
      api("GET", "/admin/jobs/" + encodeURIComponent(job.id)).catch((error) => {
        if (error.status === 404) return null;
        throw error;
      })));
    const details = new Map(), gone = new Set();
    head.forEach((job, i) => {
      const now = found[i];
      if (now && now.status === "suspended" && now.awaiting_signal) details.set(job.id, now);
      else gone.add(job.id);
    });
    return { waiting: listed.filter((job) => !gone.has(job.id)), details };
  }

  // a link to a job's view (or a batch's): a real link (it can be opened in a new tab), opened here on a click
  function viewLink(kind, id, text) {
    const hash = new URLSearchParams();
    hash.set(kind, id);
    const link = el("a", { href: "#" + hash, class: kind + "-link", ["data-" + kind]: id }, text ?? id);
    link.addEventListener("click", (e) => {
      if (e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;  // a new tab or window: the browser's
      e.preventDefault();
      if (kind === "job") openJob(id); else openBatch(id);
    });
    return link;
  }

  // the job's place in a workflow (GET /admin/jobs/{id}: parents, children, batch); hidden for a plain job
  function drawFlow(job) {
    const parents = job.parents || [], children = job.children || [];
    const show = (name, visible) => { for (const id of [`d-${name}-label`, `d-${name}`]) $(id).hidden = !visible; };
    $("d-flow").hidden = !(job.parent_count || job.child_count || job.batch);
    show("waiting", job.status === "waiting");
    $("d-waiting").textContent = `${job.waiting_for} of its ${job.parent_count} parents`;
    show("parents", job.parent_count > 0);
    show("on-failure", job.parent_count > 0);
    $("d-on-failure").textContent = job.on_parent_failure === "run" ? "run it anyway, once every parent has ended"
      : "cancel it (and the jobs waiting for it)";
    show("children", job.child_count > 0);
    for (const [name, ids, count] of [["parents", parents, job.parent_count], ["children", children, job.child_count]]) {
      const box = $("d-" + name);
      box.replaceChildren(...ids.map((id) => viewLink("job", id)));
      if (count > ids.length) box.append(el("span", { class: "muted" }, `… and ${count - ids.length} more`));
    }
    show("batch", Boolean(job.batch));
    $("d-batch").replaceChildren(...(job.batch ? [viewLink("batch", job.batch)] : []));
  }

  // -- a batch's view ------------------------------------------------------------------------

  function drawBatch(batch) {
    if (state.batch !== batch.id || state.batchOffset !== batch.offset) return;  // as drawDetail
    $("b-id").textContent = batch.id;
    $("b-total").textContent = `${batch.total}, ${batch.finished} finished`;
    const counts = $("b-counts");
    counts.replaceChildren();
    for (const s of STATUSES) {
      const n = batch.counts[s] || 0;
      if (!n) continue;
      const item = el("span", { class: "count-item", "data-status": s });
      item.append(el("strong", {}, n), " ", badge(s));
      counts.append(item);
    }
    const callback = $("b-callback");
    callback.replaceChildren();
    if (batch.callback_id) {
      callback.append(viewLink("job", batch.callback_id), " ", badge(batch.callback_status || "deleted"));
    } else {
      callback.append(el("span", { class: "muted" }, "none"));
    }
    $("b-created").textContent = utcTime(batch.created_at, true);
    $("b-created").title = batch.created_at;
    drawBatchGraph(batch);
    const body = $("b-rows");
    body.replaceChildren();
    for (const job of batch.jobs) {
      const row = el("tr", { "data-id": job.id });
      const id = el("td", { class: "id" });
      id.append(viewLink("job", job.id));
      const status = el("td", { class: "status" });
      status.append(badge(job.status));
      row.append(id, el("td", {}, job.job_type), status,
        el("td", { class: "error-cell", title: job.error || "" }, (job.error || "").split("\n")[0]));
      body.append(row);
    }
    const first = batch.jobs.length ? batch.offset + 1 : 0;
    $("b-page-info").textContent = `${first}–${batch.offset + batch.jobs.length} of ${batch.total} jobs, in the order enqueued`;
    $("b-prev").disabled = batch.offset <= 0;
    $("b-next").disabled = batch.offset + batch.jobs.length >= batch.total;
    $("batch-view").hidden = false;
    $("backdrop").hidden = false;
  }

  // the page's jobs as boxes coloured by status, a line down from each column to a bar, and an arrow from
  // the bar to the callback: the callback waits for every one of them
  function drawBatchGraph(batch) {
    const svg = $("b-graph");
    svg.replaceChildren();
    const W = 520, S = 18, G = 6, top = 8;
    const n = batch.jobs.length;
    const cols = Math.max(1, Math.min(n, 20));
    const rows = Math.ceil(n / cols);
    const gridW = cols * S + (cols - 1) * G;
    const left = (W - gridW) / 2;
    const gridBottom = top + rows * (S + G) - G;
    const busY = gridBottom + 14, boxY = busY + 30, boxW = 220, boxH = 30;
    const H = batch.callback_id ? boxY + boxH + 8 : gridBottom + 8;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.style.height = H + "px";
    const defs = svgEl("defs", {});
    const marker = svgEl("marker", { id: "b-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" });
    marker.append(svgEl("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow-head" }));
    defs.append(marker);
    svg.append(defs);
    if (batch.callback_id && n) {
      for (let c = 0; c < Math.min(cols, n); c++) {  // each column's line runs behind its boxes, down to the bar
        const x = left + c * (S + G) + S / 2;
        svg.append(svgEl("line", { x1: x, x2: x, y1: top + S / 2, y2: busY, class: "edge" }));
      }
      svg.append(svgEl("line", { x1: left + S / 2, x2: left + (Math.min(cols, n) - 1) * (S + G) + S / 2, y1: busY, y2: busY, class: "edge" }));
      svg.append(svgEl("line", { x1: W / 2, x2: W / 2, y1: busY, y2: boxY - 1, class: "edge", "marker-end": "url(#b-arrow)" }));
    }
    batch.jobs.forEach((job, i) => {
      const x = left + (i % cols) * (S + G), y = top + Math.floor(i / cols) * (S + G);
      const node = svgEl("g", { class: "node member", "data-id": job.id, tabindex: "0", role: "link" });
      const title = svgEl("title", {});
      title.textContent = `${job.id} · ${job.job_type} · ${job.status}`;
      node.append(title, svgEl("rect", { x, y, width: S, height: S, rx: 3, class: job.status }));
      node.addEventListener("click", () => openJob(job.id));
      node.addEventListener("keydown", (e) => { if (e.key === "Enter") openJob(job.id); });
      svg.append(node);
    });
    if (batch.callback_id) {
      const status = batch.callback_status || "deleted";
      const node = svgEl("g", { class: "node callback", "data-id": batch.callback_id, tabindex: "0", role: "link" });
      const title = svgEl("title", {});
      title.textContent = `the callback ${batch.callback_id} · ${status}`;
      const label = svgEl("text", { x: W / 2, y: boxY + boxH / 2 + 4, "text-anchor": "middle" });
      label.textContent = `callback · ${status}`;
      node.append(title, svgEl("rect", { x: (W - boxW) / 2, y: boxY, width: boxW, height: boxH, rx: 6, class: status }), label);
      node.addEventListener("click", () => openJob(batch.callback_id));
      node.addEventListener("keydown", (e) => { if (e.key === "Enter") openJob(batch.callback_id); });
      svg.append(node);
    }
    $("b-graph-note").textContent = batch.total > n ? `jobs ${n ? batch.offset + 1 : 0}–${batch.offset + n} of ${batch.total}` : "";
  }

  function batchQuery() {
    return `/admin/batches/${encodeURIComponent(state.batch)}?limit=${BATCH_PAGE}&offset=${state.batchOffset}`;
  }

  async function openBatch(id, offset = 0) {
    $("detail").hidden = true;
    state.open = null;
    state.batch = id;
    state.batchOffset = offset;
    writeHash();
    try {
      drawBatch(await api("GET", batchQuery()));
    } catch (error) {
      showProblem(error);
      if (state.batch === id) closeBatch();  // (not a view opened since)
    }
  }

  async function reloadBatch() {
    const id = state.batch;
    try {
      drawBatch(await api("GET", batchQuery()));
    } catch (error) {
      if (error.status === 404) { if (state.batch === id) closeBatch(); }
      else throw error;
    }
  }

  function closeBatch() {
    state.batch = null;
    state.batchOffset = 0;
    writeHash();
    $("batch-view").hidden = true;
    $("backdrop").hidden = true;
  }

  function closeViews() {
    if (!$("detail").hidden) closeDetail();
    if (!$("batch-view").hidden) closeBatch();
  }

  // -- actions -------------------------------------------------------------------------------

  function jobsQuery() {
    const q = new URLSearchParams({ page: String(state.page), per_page: String(state.perPage) });
    if (state.status) q.set("status", state.status);
    if (state.type) q.set("job_type", state.type);
    if (state.order !== "newest") q.set("order", state.order);
    return "/admin/jobs?" + q;
  }

  // One refresh at a time; a request for another while one runs (a filter changed) is
  // remembered and run right after, so no change waits for the next tick.
  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      do {
        again = false;
        await refreshOnce();
      } while (again);
    } finally {
      busy = false;
    }
  }

  async function refreshOnce() {
    try {
      const [stats, first, workers, schedules, types, suspended] = await Promise.all(
        [api("GET", "/admin/stats"), api("GET", jobsQuery()), api("GET", "/admin/workers"), api("GET", "/admin/schedules"),
          api("GET", "/admin/types"), api("GET", `/admin/jobs?status=suspended&per_page=${INBOX_SCAN}`)]);
      const inbox = await inboxDetails(suspended);
      let list = first;
      if (list.page > 1 && !list.items.length && list.total) {  // the page emptied under us
        state.page = Math.max(1, Math.ceil(list.total / list.per_page));
        writeHash();
        list = await api("GET", jobsQuery());
      }
      drawCounts(stats);
      drawTypes(types);
      drawWorkers(workers);
      drawSchedules(schedules);
      drawChart(stats);
      drawJobs(list);
      drawInbox(inbox.waiting, inbox.details, { truncated: suspended.total > suspended.items.length, total: suspended.total });
      if (state.open && !$("detail").hidden) await reloadDetail();
      if (state.batch && !$("batch-view").hidden) await reloadBatch();
      $("refreshed").textContent = "updated " + utcTime(new Date().toISOString());
      showProblem(null);
      $("auth").hidden = true;
    } catch (error) {
      showProblem(error);
    }
  }

  async function reloadDetail() {
    const id = state.open;
    try {
      drawDetail(await api("GET", "/admin/jobs/" + encodeURIComponent(id)));
    } catch (error) {
      if (error.status === 404) { if (state.open === id) { $("d-message").textContent = "this job no longer exists"; closeDetail(); } }
      else throw error;
    }
  }

  async function openJob(id) {
    $("batch-view").hidden = true;
    state.batch = null;
    state.open = id;
    writeHash();
    $("d-message").textContent = "";
    try {
      drawDetail(await api("GET", "/admin/jobs/" + encodeURIComponent(id)));
    } catch (error) {
      showProblem(error);
      if (state.open === id) closeDetail();  // (not a view opened since)
    }
  }

  function closeDetail() {
    state.open = null;
    writeHash();
    $("detail").hidden = true;
    $("backdrop").hidden = true;
  }

  async function act(kind) {
    const id = state.open;
    if (!id) return;
    if (kind === "delete" && !confirm(`Delete job ${id}? This cannot be undone.`)) return;
    if (kind === "cancel" && !confirm(`Cancel job ${id}? A pending job never runs; a suspended one does not resume; a running one is stopped.`)) return;
    const message = $("d-message");
    message.textContent = { retry: "retrying…", cancel: "cancelling…", delete: "deleting…" }[kind];
    try {
      if (kind === "retry") {
        const job = await api("POST", `/admin/jobs/${encodeURIComponent(id)}/retry`);
        drawDetail(job);
        message.textContent = "back to pending";
      } else if (kind === "cancel") {
        const job = await api("POST", `/admin/jobs/${encodeURIComponent(id)}/cancel`);
        drawDetail(job);
        message.textContent = job.status === "cancelled" ? "cancelled" : "cancel requested: its worker stops it";
      } else {
        await api("DELETE", "/admin/jobs/" + encodeURIComponent(id));
        closeDetail();
      }
    } catch (error) {
      message.textContent = error.message;
    }
    await refresh();
  }

  async function actOnSchedule(name, kind) {
    if (kind === "remove" && !confirm(`Remove schedule ${name}? Its next runs will not be enqueued.`)) return;
    const message = $("schedules-message");
    const path = "/admin/schedules/" + encodeURIComponent(name);
    message.textContent = { pause: "pausing…", resume: "resuming…", remove: "removing…" }[kind] + " " + name;
    try {
      if (kind === "remove") await api("DELETE", path);
      else await api("POST", `${path}/${kind}`);
      message.textContent = `${name} ${{ pause: "paused", resume: "resumed", remove: "removed" }[kind]}`;
    } catch (error) {
      message.textContent = `${name}: ${error.message}`;
    }
    await refresh();
  }

  async function actOnType(name, kind) {
    const message = $("types-message");
    message.textContent = `${kind === "pause" ? "pausing" : "resuming"}… ${name}`;
    try {
      await api("POST", `/admin/types/${encodeURIComponent(name)}/${kind}`);
      message.textContent = `${name} ${kind === "pause" ? "paused" : "resumed"}`;
    } catch (error) {
      message.textContent = `${name}: ${error.message}`;
    }
    await refresh();
  }

  async function retryDead(name, count) {
    if (!confirm(`Retry every dead ${name} job (${count} now)? They go back to pending, attempts reset.`)) return;
    const message = $("types-message");
    message.textContent = `retrying the dead ${name} jobs…`;
    try {
      const done = await api("POST", "/admin/jobs/retry", { status: "dead", job_type: name });
      const skipped = done.skipped ? `; ${done.skipped} skipped (${done.reasons.join("; ")})` : "";
      message.textContent = `${name}: ${done.retried} dead ${done.retried === 1 ? "job" : "jobs"} back to pending${skipped}`;
    } catch (error) {
      message.textContent = `${name}: ${error.message}`;
    }
    await refresh();
  }

  function setFilter(changes) {
    Object.assign(state, changes);
    if (!("page" in changes)) state.page = 1;
    writeHash();
    refresh();
  }

  function schedule() {
    clearInterval(timer);
    timer = null;
    if ($("auto").checked) {
      timer = setInterval(() => { if (document.visibilityState === "visible") refresh(); }, REFRESH_MS);
    }
  }

  // -- wiring ----------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    readHash();
    for (const button of document.querySelectorAll("#counts .count")) {
      button.addEventListener("click", () => setFilter({ status: button.dataset.status }));
    }
    $("f-status").addEventListener("change", (e) => setFilter({ status: e.target.value }));
    $("f-type").addEventListener("change", (e) => setFilter({ type: e.target.value }));
    $("f-order").addEventListener("change", (e) => setFilter({ order: e.target.value }));
    $("f-per-page").addEventListener("change", (e) => setFilter({ perPage: parseInt(e.target.value, 10) }));
    $("filters").addEventListener("submit", (e) => e.preventDefault());
    $("prev").addEventListener("click", () => setFilter({ page: Math.max(1, state.page - 1) }));
    $("next").addEventListener("click", () => setFilter({ page: state.page + 1 }));
    $("refresh").addEventListener("click", refresh);
    $("auto").addEventListener("change", schedule);
    $("d-close").addEventListener("click", closeDetail);
    $("b-close").addEventListener("click", closeBatch);
    $("b-prev").addEventListener("click", () => openBatch(state.batch, Math.max(0, state.batchOffset - BATCH_PAGE)));
    $("b-next").addEventListener("click", () => openBatch(state.batch, state.batchOffset + BATCH_PAGE));
    $("backdrop").addEventListener("click", closeViews);
    document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeViews(); });
    $("d-retry").addEventListener("click", () => act("retry"));
    $("d-cancel").addEventListener("click", () => act("cancel"));
    $("d-delete").addEventListener("click", () => act("delete"));
    $("auth").addEventListener("submit", (e) => {
      e.preventDefault();
      sessionStorage.setItem("pipeline-admin-token", $("token").value);
      $("token").value = "";
      refresh();
    });
    document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible") refresh(); });
    window.addEventListener("hashchange", () => {
      readHash();
      refresh();
      if (state.open) openJob(state.open);
      else if (state.batch) openBatch(state.batch, state.batchOffset);
    });
    schedule();
    refresh();
    if (state.open) openJob(state.open);
    else if (state.batch) openBatch(state.batch, state.batchOffset);
  });
})();
