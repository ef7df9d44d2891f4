/* The Deck's small script: theme, connection indicator, toasts and console, the live row inbox,
 * progress bars, the throughput chart, selection and typed confirmations, the editor's JSON check.
 * Everything else is htmx attributes in the templates. No framework, no build step. */
(function () {
  "use strict";

  var MAX_ROWS = 100;
  var MAX_CONSOLE = 500;
  var TOAST_MS = 4000;
  var RECONNECT_CODES = [1006, 1011, 1012, 1013];
  var RECONNECT_FIRST_MS = 250;
  var RECONNECT_CAP_MS = 1500;
  var progress = {};
  var plot = null;
  var historyPlot = null;
  var everOpened = false;
  var retries = 0;
  var socket = null;
  var armed = null;

  function $(id) { return document.getElementById(id); }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function clock() { var d = new Date(); return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()); }

  /* ------------------------------------------------------------------ theme */
  function initTheme() {
    var select = $("theme-select");
    if (!select) return;
    select.value = document.documentElement.dataset.theme || "blueprint";
    select.addEventListener("change", function () {
      document.documentElement.dataset.theme = select.value;
      try { localStorage.setItem("deck-theme", select.value); } catch (e) { /* private mode */ }
      plot = null;
      historyPlot = null;
      refreshChart();
      refreshHistory();
    });
  }

  /* ------------------------------------------------------------------ toasts and console */
  function toast(level, message) {
    var el = makeToast(level, message);
    if (el) setTimeout(function () { el.remove(); }, TOAST_MS);
  }

  function makeToast(level, message) {
    var box = $("toasts");
    if (!box) return null;
    var el = document.createElement("div");
    el.className = "toast level-" + level;
    el.setAttribute("role", level === "error" ? "alert" : "status");
    var text = document.createElement("span");
    text.textContent = message;
    var close = document.createElement("button");
    close.type = "button";
    close.className = "toast-close";
    close.textContent = "×";
    close.addEventListener("click", function () { el.remove(); });
    el.appendChild(text);
    el.appendChild(close);
    box.appendChild(el);
    return el;
  }

  /* a bulk run's progress ("Cancelled 12,500 / 27,000 …"): one toast per run, updated in place until the run
   * ends; its end goes to the console too and the panels reconcile */
  var runToasts = {};

  function showRuns(inbox) {
    Array.prototype.forEach.call(inbox.querySelectorAll("[data-bulk-run]"), function (el) {
      var id = el.dataset.bulkRun;
      var box = runToasts[id];
      if (el.dataset.finished) {
        if (box) box.remove();
        delete runToasts[id];
        log(el.dataset.level || "info", el.textContent);
        htmx.trigger(document.body, "deck:changed");
        return;
      }
      if (!box || !document.body.contains(box)) {
        box = runToasts[id] = makeToast("info", "");
        if (!box) return;
        box.classList.add("run");
        box.dataset.run = id;
      }
      box.querySelector("span").textContent = el.textContent;
    });
  }

  function consoleLine(level, message) {
    var logEl = $("console-log");
    if (!logEl) return;
    var line = document.createElement("div");
    line.className = "line level-" + level;
    var t = document.createElement("time");
    t.textContent = clock();
    var m = document.createElement("span");
    m.className = "msg";
    m.textContent = message;
    line.appendChild(t);
    line.appendChild(document.createTextNode(" "));
    line.appendChild(m);
    logEl.appendChild(line);
    trimConsole();
  }

  function trimConsole() {
    var logEl = $("console-log");
    if (!logEl) return;
    while (logEl.children.length > MAX_CONSOLE) logEl.removeChild(logEl.firstElementChild);
    logEl.scrollTop = logEl.scrollHeight;
  }

  /** A client-side entry: console line plus toast (spec 04 §9). */
  function log(level, message) { consoleLine(level, message); toast(level, message); }

  /* ------------------------------------------------------------------ connection */
  /** The wait before the n-th reconnect attempt: doubling from 250 ms, capped at 1.5 s (with jitter so many
   * tabs do not knock in step), so the page is live again within 2 s of the server answering. */
  function reconnectDelay(n) {
    var base = Math.min(RECONNECT_CAP_MS, RECONNECT_FIRST_MS * Math.pow(2, Math.min(n, 10)));
    return base * (0.5 + Math.random() / 2);
  }

  function setConn(state) {
    var el = $("conn");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = state.toUpperCase();
    document.documentElement.dataset.conn = state;  // while not online the numbers on the page are dimmed
    var retry = $("conn-retry");
    if (retry) retry.hidden = state === "online";
  }

  function retryNow() {
    if (!socket) { location.reload(); return; }
    setConn("reconnecting");
    socket.reconnect();
  }

  function onOpen(evt) {
    if (evt.detail && evt.detail.socketWrapper) socket = evt.detail.socketWrapper;
    setConn("online");
    retries = 0;
    announceFollow(true);  // a new socket knows nothing yet
    if (everOpened) {
      htmx.trigger(document.body, "deck:resync");
      log("info", "Reconnected: panels re-synced from the database");
    } else {
      consoleLine("success", "System connected");
    }
    everOpened = true;
  }

  function onClose(evt) {
    var code = evt.detail && evt.detail.event ? evt.detail.event.code : 0;
    if (evt.detail && evt.detail.socketWrapper) socket = evt.detail.socketWrapper;
    if (code === 4401 || code === 4403) {
      setConn("offline");
      log("error", code === 4401 ? "Live updates refused: log in again" : "Live updates refused: no Deck view permission");
      return;
    }
    if (code === 1000) { setConn("offline"); return; }
    setConn("reconnecting");
    // 1005: this page closed the socket itself to open a new one (RETRY NOW): that one reports on its own
    if (code !== 1005 && RECONNECT_CODES.indexOf(code) < 0 && evt.detail && evt.detail.socketWrapper) {
      // the ws extension only retries 1006/1011/1012/1013 itself; retry the others too, with the same backoff
      var wrapper = evt.detail.socketWrapper;
      setTimeout(function () { wrapper.reconnect(); }, reconnectDelay(retries++));
    }
  }

  /* ------------------------------------------------------------------ live rows */
  function matches(tr, tbody) {
    var f = tbody.dataset;
    if (f.status && tr.dataset.status !== f.status) return false;
    if (f.queue && tr.dataset.queue !== f.queue) return false;
    if (f.type && tr.dataset.type !== f.type) return false;
    if (f.search) {
      var text = [tr.dataset.jobId, tr.dataset.type, tr.dataset.tags || ""].join(" ").toLowerCase();
      if (text.indexOf(f.search) < 0) return false;
    }
    return true;
  }

  function retire(tr) {
    tr.classList.add("leaving");
    setTimeout(function () { tr.remove(); }, TOAST_MS);
  }

  /* ------------------------------------------------------------------ the open inspector follows its job */
  var FOLLOW_MIN_MS = 250;  // at most 4 re-fetches a second per open inspector
  var follow = { id: null, last: 0, timer: null, busy: false, again: false };

  /** The job the open inspector shows (none for an editor, an empty panel or a job that is gone): the socket
   * is told, so the server also locates it on every read and names it when it moves. */
  function announceFollow(force) {
    var el = $("inspector");
    var id = el && el.dataset.where !== "gone" ? el.dataset.jobId || null : null;
    if (id === follow.id && !force) return;
    follow.id = id;
    if (socket) socket.send(JSON.stringify({ type: "follow", jobId: id }));
  }

  /** Did this push name the inspected job: an event or a move of it, its row, or progress while the
   * inspector shows no progress bar (it started running)? */
  function namesInspected(inbox, el) {
    var id = el.dataset.jobId;
    var nodes = inbox.querySelectorAll("[data-touched], tr[data-job-id], [data-progress-for]");
    for (var i = 0; i < nodes.length; i++) {
      var d = nodes[i].dataset;
      if (d.touched === id || d.jobId === id) return true;
      if (d.progressFor === id && !el.querySelector(".progress")) return true;
    }
    return false;
  }

  /** Re-fetch the open inspector: single flight, at most once per FOLLOW_MIN_MS, and a trailing re-fetch
   * when more news arrived meanwhile (so the last state always shows). */
  function refreshInspector() {
    var el = $("inspector");
    if (!el || !el.dataset.jobId || !window.htmx) return;
    if (follow.busy) { follow.again = true; return; }
    var wait = follow.last + FOLLOW_MIN_MS - Date.now();
    if (wait > 0) {
      if (!follow.timer) follow.timer = setTimeout(function () { follow.timer = null; refreshInspector(); }, wait);
      return;
    }
    follow.busy = true;
    follow.last = Date.now();
    var done = function () {
      follow.busy = false;
      if (follow.again) { follow.again = false; refreshInspector(); }
    };
    htmx.ajax("GET", el.getAttribute("hx-get"), { source: el, target: el, swap: "outerHTML" }).then(done, done);
  }

  function processInbox() {
    var inbox = $("row-inbox");
    if (!inbox || !inbox.firstChild) return;
    var inspected = $("inspector");
    if (inspected && inspected.dataset.where !== "gone" && namesInspected(inbox, inspected)) refreshInspector();
    showRuns(inbox);
    var tbody = $("active-rows");
    var rows = Array.prototype.slice.call(inbox.querySelectorAll("tr[data-job-id]"));
    // rows arrive newest first: insert from the oldest so the newest ends on top
    rows.reverse().forEach(function (tr) {
      var existing = $("job-" + tr.dataset.jobId);
      if (existing && !(tbody && tbody.contains(existing))) existing = null;
      if (tr.dataset.gone) {
        if (existing) { existing.replaceWith(tr); htmx.process(tr); retire(tr); }
        return;
      }
      if (!tbody) return;
      if (!matches(tr, tbody)) { if (existing) existing.remove(); return; }
      if (existing) {
        var box = existing.querySelector(".row-check");
        if (box && box.checked) { var nb = tr.querySelector(".row-check"); if (nb) nb.checked = true; }
        existing.replaceWith(tr);
      } else {
        tbody.insertBefore(tr, tbody.firstChild);
        var empty = tbody.querySelector(".empty-row");
        if (empty) empty.remove();
      }
      htmx.process(tr);
    });
    if (tbody) {
      var live = tbody.querySelectorAll("tr.job-row:not(.gone)");
      for (var i = MAX_ROWS; i < live.length; i++) live[i].remove();
    }
    Array.prototype.forEach.call(inbox.querySelectorAll("[data-progress-for]"), function (el) {
      progress[el.dataset.progressFor] = parseInt(el.dataset.pct, 10) || 0;
    });
    inbox.innerHTML = "";
    applyProgress();
    updateSelection();
  }

  function applyProgress() {
    Array.prototype.forEach.call(document.querySelectorAll(".progress[data-progress-for]"), function (el) {
      var pct = progress[el.dataset.progressFor];
      if (pct === undefined) return;
      var bar = el.querySelector("span");
      var label = el.querySelector("em");
      if (bar) bar.style.width = pct + "%";
      if (label) label.textContent = pct + "%";
    });
  }

  function formatDuration(ms) {
    if (ms < 1000) return Math.floor(ms) + "ms";
    if (ms < 60000) return Math.floor(ms / 1000) + "s " + Math.floor(ms % 1000) + "ms";
    var s = Math.floor(ms / 1000);
    return Math.floor(s / 60) + "m " + (s % 60) + "s";
  }

  function tickDurations() {
    var now = Date.now();
    Array.prototype.forEach.call(document.querySelectorAll("#active-rows tr[data-started]"), function (tr) {
      var cell = tr.querySelector(".duration");
      var started = Date.parse(tr.dataset.started);
      if (cell && !isNaN(started)) cell.textContent = formatDuration(Math.max(0, now - started));
    });
  }

  /* ------------------------------------------------------------------ chart */
  function cssVar(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }

  function refreshChart() {
    var holder = $("chart");
    var dataEl = $("chart-data");
    if (!holder || !dataEl || !window.uPlot) return;
    var d;
    try { d = JSON.parse(dataEl.dataset.points); } catch (e) { return; }
    var data = [d.t, d.ok, d.fail];
    if (plot && holder.contains(plot.root)) { plot.setData(data); return; }
    holder.innerHTML = "";
    var axis = { stroke: cssVar("--muted"), grid: { stroke: cssVar("--grid"), width: 1 }, ticks: { stroke: cssVar("--grid") } };
    plot = new uPlot({
      width: Math.max(200, holder.clientWidth), height: 150, legend: { show: false }, cursor: { y: false },
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
      axes: [axis, Object.assign({ size: 40 }, axis)],
      series: [{}, { label: "succeeded/s", stroke: cssVar("--success"), fill: cssVar("--success-fill"), width: 1.5 },
               { label: "failed/s", stroke: cssVar("--danger"), fill: cssVar("--danger-fill"), width: 1.5 }]
    }, data, holder);
  }

  /* The 1h / 24h / 7d views: outcomes per bucket (left axis) and the successes' p95 in ms (right axis). */
  function refreshHistory() {
    var holder = $("history-chart");
    var dataEl = $("history-data");
    if (!holder || !dataEl || !window.uPlot) return;
    var d;
    try { d = JSON.parse(dataEl.dataset.points); } catch (e) { return; }
    var data = [d.t, d.ok, d.fail, d.p95];
    if (historyPlot && holder.contains(historyPlot.root)) { historyPlot.setData(data); return; }
    holder.innerHTML = "";
    var axis = { stroke: cssVar("--muted"), grid: { stroke: cssVar("--grid"), width: 1 }, ticks: { stroke: cssVar("--grid") } };
    historyPlot = new uPlot({
      width: Math.max(200, holder.clientWidth), height: 150, legend: { show: false }, cursor: { y: false },
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } },
                ms: { range: function (u, min, max) { return [0, Math.max(1, max || 0)]; } } },
      axes: [axis, Object.assign({ size: 44 }, axis),
             Object.assign({ scale: "ms", side: 1, size: 50, grid: { show: false } }, { stroke: cssVar("--muted") })],
      series: [{}, { label: "succeeded", stroke: cssVar("--success"), fill: cssVar("--success-fill"), width: 1.5 },
               { label: "failed", stroke: cssVar("--danger"), fill: cssVar("--danger-fill"), width: 1.5 },
               { label: "p95 ms", scale: "ms", stroke: cssVar("--warning"), width: 1, dash: [4, 3], spanGaps: false }]
    }, data, holder);
  }

  /* ------------------------------------------------------------------ selection and confirmations */
  function selected() { return Array.prototype.slice.call(document.querySelectorAll("#job-matrix .row-check:checked")); }

  function disarm() {
    if (!armed) return;
    armed.textContent = armed.dataset.label;
    armed.classList.remove("armed");
    armed = null;
    var token = $("bulk-token"), back = $("bulk-back");
    if (token) { token.hidden = true; token.value = ""; }
    if (back) back.hidden = true;
  }

  function updateSelection() {
    var count = $("selected-count");
    if (count) count.textContent = selected().length + " selected";
  }

  function onConfirm(evt) {
    var elt = evt.detail.elt;
    if (elt.dataset.jsonCheck) {
      var problem = checkJson();
      var box = $("editor-error");
      if (box) { box.hidden = !problem; box.textContent = problem || ""; }
      if (problem) { evt.preventDefault(); toast("error", problem); return; }
    }
    if (!elt.dataset.arm) return;
    var n = selected().length;
    if (!n) { evt.preventDefault(); toast("warning", "Select at least one job first"); return; }
    var needsToken = !!elt.dataset.alwaysToken || n >= 25;
    if (armed !== elt) {
      evt.preventDefault();
      disarm();
      armed = elt;
      elt.dataset.label = elt.dataset.label || elt.textContent;
      elt.textContent = "CONFIRM: " + elt.dataset.arm.replace("{n}", n);
      elt.classList.add("armed");
      var token = $("bulk-token"), back = $("bulk-back");
      if (token && needsToken) { token.hidden = false; token.placeholder = "type " + elt.dataset.token; token.focus(); }
      if (back) back.hidden = false;
      return;
    }
    var input = $("bulk-token");
    if (needsToken && (!input || input.value !== elt.dataset.token)) {
      evt.preventDefault();
      toast("warning", "Type " + elt.dataset.token + " to confirm");
      return;
    }
    consoleLine("info", elt.dataset.arm.replace("{n}", n) + ": request sent");
    disarm();
  }

  function checkJson() {
    var area = $("editor-payload");
    if (!area) return null;
    if (!area.value.trim()) return "Payload is empty";
    var value;
    try {
      value = JSON.parse(area.value);
      if (value === null || typeof value !== "object" || Array.isArray(value)) return "Invalid JSON: the payload must be a JSON object";
    } catch (e) {
      return "Invalid JSON: " + e.message;
    }
    var limit = parseInt(area.dataset.maxBytes, 10);
    var size = new TextEncoder().encode(JSON.stringify(value)).length;
    if (limit && size > limit) return "Payload is " + size + " bytes of JSON; the limit is " + limit + " bytes";
    return null;
  }

  /* ------------------------------------------------------------------ side panel and addresses */
  var listUrl = null;  // the address of the list the open inspector was reached from

  function emptySide() {
    var panel = $("side-panel");
    if (panel) panel.innerHTML = '<div id="side-empty" class="side-empty"><p class="muted">No active panel.</p></div>';
    announceFollow(false);
  }

  /** Close the inspector/editor: the address goes back to the list's (a new history entry, so Back reopens it). */
  function closeSide() {
    emptySide();
    var root = document.body.dataset.deckRoot;
    var target = listUrl || root;
    if (target && window.history && location.pathname + location.search !== target) {
      history.pushState({ htmx: true }, "", target);
    }
  }

  function onBeforeHistoryUpdate(evt) {
    var d = evt.detail;
    if (d.target && d.target.id !== "side-panel" && d.history && d.history.path) listUrl = d.history.path;
  }

  /* ------------------------------------------------------------------ what may be swapped in */
  var SIDE_PANEL_ROOTS = ["inspector", "editor", "side-empty"];

  /** Only HTML fragments are swapped, and the side panel takes only the inspector/editor partials: a response
   * that is JSON, metrics text or any other page (however its URL was reached) never lands in the page. */
  function onBeforeSwap(evt) {
    var d = evt.detail;
    var type = (d.xhr.getResponseHeader("Content-Type") || "").toLowerCase();
    var target = d.target;
    var side = target && (target.id === "side-panel" || target.id === "inspector" || target.id === "editor");
    if (side && d.xhr.status === 404 && type.indexOf("text/html") === 0) {
      d.shouldSwap = true;  // the inspector of a job that is gone: the panel says so
      d.isError = false;
    }
    if (side && target.id === "inspector" && !document.body.contains(target)) {
      d.shouldSwap = false;  // a live re-fetch answered after the operator opened something else
      return;
    }
    if (!d.shouldSwap) return;
    var ok = type.indexOf("text/html") === 0 || (!side && !d.xhr.responseText);
    if (ok && side) {
      var holder = document.createElement("template");
      holder.innerHTML = d.xhr.responseText;
      var root = holder.content.firstElementChild;
      ok = !!root && holder.content.children.length === 1 && SIDE_PANEL_ROOTS.indexOf(root.id) >= 0;
    }
    if (!ok) {
      d.shouldSwap = false;
      log("error", "Refused to show an unexpected response" + (side ? " in the side panel" : ""));
    }
  }

  /* an htmx extension: the editor posts its fields as one JSON object (a form encoding of a 1 MB payload can
   * grow sixfold past the server's form cap) */
  function defineJsonExtension() {
    if (!window.htmx || !htmx.defineExtension) return;
    htmx.defineExtension("deck-json", {
      onEvent: function (name, evt) {
        if (name === "htmx:configRequest") evt.detail.headers["Content-Type"] = "application/json";
      },
      encodeParameters: function (xhr, parameters) {
        var fields = {};
        parameters.forEach(function (value, key) { fields[key] = value; });
        return JSON.stringify(fields);
      }
    });
  }

  /* ------------------------------------------------------------------ wiring */
  function onResponseError(evt) {
    var xhr = evt.detail.xhr;
    var message = "Request failed (" + xhr.status + ")";
    try {
      var body = JSON.parse(xhr.responseText);
      if (body && body.error) message = body.error;
    } catch (e) {
      if (xhr.status === 403) message = "Permission denied";
    }
    log(xhr.status >= 500 ? "error" : "warning", message);
  }

  // Rate cells (a queue's row, a type's row in the history table) follow the rate-limits panel, whose rows carry
  // their use (data-use): a pushed queues panel or a re-fetched chart has empty cells, and the rate-limits
  // panel's own 2 s refresh brings the newest use. A cell links to its limit's row (its id is a counter).
  function syncRates() {
    var limits = $("rate-limits-panel");
    if (!limits) return;
    var rows = {};
    Array.prototype.forEach.call(limits.querySelectorAll("tr[data-limit]"), function (tr) {
      rows[tr.getAttribute("data-limit")] = tr;
    });
    Array.prototype.forEach.call(document.querySelectorAll("td[data-rate-for]"), function (td) {
      var name = td.getAttribute("data-rate-for");
      var row = Object.prototype.hasOwnProperty.call(rows, name) ? rows[name] : null;
      var text = row ? row.getAttribute("data-use") : "";
      var a = td.querySelector("a.rate-badge");
      if (!text) { if (td.textContent !== "\u2014") td.textContent = "\u2014"; return; }
      if (!a) { td.textContent = ""; a = document.createElement("a"); td.appendChild(a); }
      if (a.getAttribute("href") !== "#" + row.id) a.setAttribute("href", "#" + row.id);
      a.title = "Rate limit " + name + " (change it under RATE LIMITS)";
      a.className = "badge " + (text === "paused" ? "badge-warning" : "badge-muted") + " rate-badge";
      if (a.textContent !== text) a.textContent = text;
    });
  }

  function init() {
    if (window.htmx) htmx.config.wsReconnectDelay = reconnectDelay;
    initTheme();
    defineJsonExtension();
    var body = document.body;
    body.addEventListener("htmx:wsOpen", onOpen);
    body.addEventListener("htmx:wsClose", onClose);
    body.addEventListener("htmx:wsAfterMessage", function () { processInbox(); refreshChart(); trimConsole(); syncRates(); });
    body.addEventListener("htmx:afterSettle", function () {
      refreshChart(); refreshHistory(); applyProgress(); updateSelection(); announceFollow(false); syncRates();
    });
    body.addEventListener("htmx:responseError", onResponseError);
    body.addEventListener("htmx:beforeSwap", onBeforeSwap);
    body.addEventListener("htmx:beforeHistoryUpdate", onBeforeHistoryUpdate);
    if (!$("inspector") && !$("editor")) listUrl = location.pathname + location.search;
    body.addEventListener("htmx:sendError", function () { log("error", "Network error: the server did not answer"); });
    body.addEventListener("htmx:confirm", onConfirm);
    body.addEventListener("deck:toast", function (evt) {
      var d = evt.detail || {};
      toast(d.level || "info", d.message || "Done");
    });
    body.addEventListener("htmx:oobBeforeSwap", function (evt) {
      // never clobber a queue setting the operator is typing
      var target = evt.detail.target;
      if (target && target.id === "queues-panel" && target.contains(document.activeElement)) evt.detail.shouldSwap = false;
    });
    body.addEventListener("input", function (evt) {
      if (evt.target.id === "editor-payload") { var box = $("editor-error"); if (box) box.hidden = true; }
    });
    body.addEventListener("change", function (evt) {
      var t = evt.target;
      if (t.id === "check-all") {
        Array.prototype.forEach.call(document.querySelectorAll("#job-matrix .row-check"), function (b) { b.checked = t.checked; });
      }
      if (t.id === "check-all" || t.classList.contains("row-check")) { disarm(); updateSelection(); }
      if (t.id === "show-hidden") {
        var section = $("queues-section");
        if (section) section.classList.toggle("show-hidden", t.checked);
        try { localStorage.setItem("deck-show-hidden", t.checked ? "1" : ""); } catch (e) { /* ignore */ }
      }
    });
    // Content-Security-Policy (no inline handlers, no eval): the editor form never submits itself (its htmx
    // buttons save), and a click on a job row outside its checkbox/buttons/links opens the inspector.
    body.addEventListener("submit", function (evt) { if (evt.target.id === "editor") evt.preventDefault(); });
    body.addEventListener("click", function (evt) {
      var t = evt.target;
      var row = t.closest && t.closest("tr.job-row");
      if (row && !t.closest("input,button,a")) {  // the row's id link opens the inspector (and its address)
        var jobLink = row.querySelector("a.job-link");
        if (jobLink) jobLink.click();
      }
      if (t.id === "conn-retry") retryNow();
      if (t.id === "bulk-back") disarm();
      if (t.id === "console-clear") { var l = $("console-log"); if (l) l.innerHTML = ""; }
      if (t.classList.contains("side-close")) { closeSide(); }
      if (t.closest && t.closest(".tab")) emptySide();
      var link = t.closest && t.closest("[data-log]");
      if (link) consoleLine("info", link.dataset.log);
    });
    var showHidden = $("show-hidden");
    try {
      if (showHidden && localStorage.getItem("deck-show-hidden")) {
        showHidden.checked = true;
        $("queues-section").classList.add("show-hidden");
      }
    } catch (e) { /* ignore */ }
    window.addEventListener("resize", function () {
      var holder = $("chart");
      if (plot && holder) plot.setSize({ width: Math.max(200, holder.clientWidth), height: 150 });
      var history = $("history-chart");
      if (historyPlot && history) historyPlot.setSize({ width: Math.max(200, history.clientWidth), height: 150 });
    });
    setInterval(tickDurations, 1000);
    refreshChart();
    refreshHistory();
    trimConsole();
  }

  window.Deck = { toast: toast, log: log, processInbox: processInbox, progress: progress, follow: follow };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
