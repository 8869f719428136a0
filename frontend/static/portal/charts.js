// Deployment page panels that read JSON from the REST API: per-stage latency, throughput, usage by key,
// conformance and PD health. Charts use the vendored Chart.js; nothing here is needed for the rest of the page.
(function () {
  "use strict";
  var STAGES = {
    queue: ["Queue", "#98a2b3"], prefill: ["Prefill", "#7c3aed"], ttft: ["TTFT", "#4338ca"],
    kv_transfer: ["KV transfer", "#0891b2"], decode: ["Decode", "#059669"], itl: ["Inter-token", "#d97706"],
    e2e: ["End-to-end", "#dc2626"]
  };
  var charts = window.tandemCharts = {};

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function message(box, text) { box.replaceChildren(el("p", { "class": "panel-msg" }, text)); }
  function timeLabel(t) {
    var d = new Date(typeof t === "number" ? t * 1000 : t);
    return isNaN(d) ? String(t) : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });
  }
  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (r.status === 404) { var e = new Error("missing"); e.missing = true; throw e; }
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    });
  }
  function humanize(k) { return String(k).replace(/_/g, " ").replace(/^./, function (c) { return c.toUpperCase(); }); }
  function fmt(v) { return typeof v === "number" ? v.toLocaleString(undefined, { maximumFractionDigits: 2 }) : String(v); }

  // Latency and throughput -------------------------------------------------------------------------
  function setupLatency(panel) {
    var state = { window: panel.dataset.window || "1h", pct: "p95", data: null };
    var msg = panel.querySelector("[data-latency-msg]");
    var canvases = panel.querySelector("[data-latency-charts]");

    function press(attr, value) {
      panel.querySelectorAll("[" + attr + "]").forEach(function (b) {
        b.setAttribute("aria-pressed", b.getAttribute(attr) === value ? "true" : "false");
      });
    }
    function draw() {
      var data = state.data, stages = (data.stages || []).filter(function (s) { return (s.points || []).length; });
      var labels = [];
      stages.forEach(function (s) { s.points.forEach(function (p) { if (labels.indexOf(p.t) < 0) labels.push(p.t); }); });
      (data.throughput || []).forEach(function (p) { if (labels.indexOf(p.t) < 0) labels.push(p.t); });
      labels.sort();
      var hasData = stages.some(function (s) { return s.points.some(function (p) { return p.count > 0; }); }) ||
        (data.throughput || []).some(function (p) { return p.requests > 0; });
      if (!hasData) {
        canvases.hidden = true;
        panel.setAttribute("data-rendered", "empty");
        message(msg, "No requests in the last " + state.window + ". Send one through the endpoint above and it shows here within a minute.");
        return;
      }
      canvases.hidden = false; msg.replaceChildren();
      stages = stages.filter(function (s) { return s.points.some(function (p) { return p.count > 0; }); });
      var datasets = stages.map(function (s) {
        var byT = {}; s.points.forEach(function (p) { byT[p.t] = p; });
        var meta = STAGES[s.stage] || [s.stage, "#475467"];
        return {
          label: meta[0] + (s.source ? " (" + s.source + ")" : ""), borderColor: meta[1], backgroundColor: meta[1],
          data: labels.map(function (t) { var p = byT[t]; var v = p && p[state.pct]; return v > 0 ? v : null; }),
          spanGaps: true, tension: 0.25, pointRadius: 2, borderWidth: 2
        };
      });
      var xLabels = labels.map(timeLabel);
      if (charts.latency) charts.latency.destroy();
      charts.latency = new Chart(panel.querySelector("#latency-chart"), {
        type: "line", data: { labels: xLabels, datasets: datasets },
        options: {
          maintainAspectRatio: false, animation: false, interaction: { mode: "index", intersect: false },
          scales: { x: { ticks: { maxTicksLimit: 12, maxRotation: 0 } },
                    y: { type: "logarithmic", title: { display: true, text: state.pct + " latency (ms, log scale)" } } },
          plugins: { legend: { position: "bottom", labels: { boxWidth: 10, boxHeight: 10 } },
                     tooltip: { callbacks: { label: function (c) { return c.dataset.label + ": " + fmt(c.parsed.y) + " ms"; } } } }
        }
      });
      var tp = data.throughput || [], byT = {};
      tp.forEach(function (p) { byT[p.t] = p; });
      function series(key) { return labels.map(function (t) { return byT[t] ? byT[t][key] : null; }); }
      if (charts.throughput) charts.throughput.destroy();
      charts.throughput = new Chart(panel.querySelector("#throughput-chart"), {
        data: { labels: xLabels, datasets: [
          { type: "bar", label: "Requests", data: series("requests"), backgroundColor: "#c7d2fe", yAxisID: "req" },
          { type: "line", label: "Prompt tokens", data: series("prompt_tokens"), borderColor: "#7c3aed", backgroundColor: "#7c3aed", yAxisID: "tok", pointRadius: 1.5, tension: 0.25 },
          { type: "line", label: "Completion tokens", data: series("completion_tokens"), borderColor: "#059669", backgroundColor: "#059669", yAxisID: "tok", pointRadius: 1.5, tension: 0.25 }
        ] },
        options: {
          maintainAspectRatio: false, animation: false, interaction: { mode: "index", intersect: false },
          scales: { x: { ticks: { maxTicksLimit: 12, maxRotation: 0 } }, req: { position: "left", beginAtZero: true, title: { display: true, text: "requests / bucket" } },
                    tok: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false }, title: { display: true, text: "tokens / bucket" } } },
          plugins: { legend: { position: "bottom", labels: { boxWidth: 10, boxHeight: 10 } } }
        }
      });
      panel.setAttribute("data-rendered", "true");
    }
    function load() {
      press("data-window", state.window); press("data-pct", state.pct);
      message(msg, "Loading…");
      getJSON(panel.dataset.url + "?window=" + encodeURIComponent(state.window)).then(function (data) {
        state.data = data; draw();
      }).catch(function (e) {
        canvases.hidden = true;
        message(msg, e.missing ? "Latency series are not available for this deployment yet."
                               : "Could not load latency (" + e.message + ").");
      });
    }
    panel.addEventListener("click", function (ev) {
      var w = ev.target.closest("[data-window]"), p = ev.target.closest("[data-pct]");
      if (w) { ev.preventDefault(); state.window = w.getAttribute("data-window"); load(); }
      if (p) { ev.preventDefault(); state.pct = p.getAttribute("data-pct"); press("data-pct", state.pct); if (state.data) draw(); }
    });
    load();
  }

  // Usage by key -----------------------------------------------------------------------------------
  function setupUsage(panel) {
    var box = panel.querySelector("[data-usage-body]");
    getJSON(panel.dataset.url).then(function (data) {
      var rows = Array.isArray(data) ? data : (data.results || []);
      if (!rows.length) { message(box, "No usage yet. Requests made with this team's API keys are counted here."); return; }
      var table = el("table"), head = el("tr");
      ["Key", "Requests", "Prompt tokens", "Completion tokens"].forEach(function (h, i) { head.appendChild(el("th", i ? { "class": "num" } : {}, h)); });
      table.appendChild(el("thead")).appendChild(head);
      var body = table.appendChild(el("tbody"));
      rows.forEach(function (r) {
        var tr = body.appendChild(el("tr")), name = el("td");
        name.appendChild(el("div", { "class": "row-title" }, r.name || "—"));
        name.appendChild(el("div", { "class": "secondary mono" }, r.api_key ? String(r.api_key) : ""));
        if (r.partial) name.appendChild(el("div", { "class": "secondary" }, "includes " + fmt(r.partial) + " partial (interrupted) requests"));
        tr.appendChild(name);
        [r.requests, r.prompt_tokens, r.completion_tokens].forEach(function (v) { tr.appendChild(el("td", { "class": "num" }, fmt(v || 0))); });
      });
      box.replaceChildren(el("div", { "class": "table-wrap" }));
      box.firstChild.appendChild(table);
      panel.setAttribute("data-rendered", "true");
    }).catch(function (e) {
      message(box, e.missing ? "Usage by key is not available yet." : "Could not load usage (" + e.message + ").");
    });
  }

  // Conformance and PD health: rendered generically from whatever the API reports ------------------
  function passed(item) {
    var v = item.passed !== undefined ? item.passed : (item.ok !== undefined ? item.ok : item.status);
    if (v === true || v === "passed" || v === "pass" || v === "ok") return "ok";
    if (v === false || v === "failed" || v === "fail" || v === "error") return "bad";
    return v === "warning" || v === "warn" ? "wait" : "mute";
  }
  function renderValue(value) {
    if (Array.isArray(value) && value.length && typeof value[0] === "object") {
      var ul = el("ul", { "class": "check-list" });
      value.forEach(function (item) {
        var li = ul.appendChild(el("li")), tone = passed(item);
        li.appendChild(el("span", { "class": "badge " + tone }, tone === "ok" ? "pass" : tone === "bad" ? "fail" : tone === "wait" ? "warn" : "info"));
        var body = li.appendChild(el("div"));
        body.appendChild(el("div", { "class": "row-title" }, item.name || item.check || item.title || ""));
        var ev = item.message || item.evidence || item.detail || item.reason;
        if (ev) body.appendChild(el("div", { "class": "ev" }, typeof ev === "string" ? ev : JSON.stringify(ev)));
      });
      return ul;
    }
    if (value && typeof value === "object" && !Array.isArray(value)) {
      var dl = el("dl", { "class": "kv" });
      Object.keys(value).forEach(function (k) {
        var row = dl.appendChild(el("div"));
        row.appendChild(el("dt", {}, humanize(k)));
        var dd = row.appendChild(el("dd"));
        var v = value[k];
        if (v && typeof v === "object") { row.className = "kv-block"; dd.appendChild(renderValue(v)); }
        else dd.textContent = v === null ? "—" : fmt(v);
      });
      return dl;
    }
    return el("span", {}, Array.isArray(value) ? value.join(", ") : fmt(value));
  }
  function setupConformance(panel) {
    var box = panel.querySelector("[data-conformance-body]");
    getJSON(panel.dataset.url).then(function (data) {
      var run = data && data.run;
      if (!run) { message(box, "No conformance run yet: the suite runs through the gateway once Serve is running."); return; }
      var head = el("div", { "class": "status-line" });
      head.appendChild(el("span", { "class": "badge " + (run.passed ? "ok" : "bad") }, run.passed ? "All checks passed" : "Checks failed"));
      head.appendChild(el("span", { "class": "secondary" }, "run " + new Date(run.started_at).toLocaleString()));
      var parts = [head];
      if (run.summary) parts.push(el("p", { "class": "secondary mt-8" }, run.summary));
      if (run.pd_health) {
        var h = run.pd_health;
        parts.push(el("h3", { "class": "mt-14" }, "PD health"));
        var line = el("div", { "class": "status-line" });
        line.appendChild(el("span", { "class": "badge " + (h.ok ? "ok" : "wait") }, humanize(h.verdict || (h.ok ? "healthy" : "warning"))));
        if (h.throughput_gbps !== null && h.throughput_gbps !== undefined)
          line.appendChild(el("span", { "class": "secondary" }, "KV transfer " + fmt(h.throughput_gbps) + " Gbit/s" + (h.link_gbps ? " of " + fmt(h.link_gbps) + " link" : "")));
        parts.push(line);
        (h.messages || []).forEach(function (m) { parts.push(el("div", { "class": "notice warning tight" }, m)); });
        var rest = {};
        Object.keys(h).forEach(function (k) { if (["verdict", "ok", "messages"].indexOf(k) < 0) rest[k] = h[k]; });
        var details = el("details", { "class": "more mt-8" });
        details.appendChild(el("summary", {}, "Measurements"));
        details.appendChild(renderValue(rest));
        parts.push(details);
      }
      if ((run.checks || []).length) {
        parts.push(el("h3", { "class": "mt-14" }, "Checks"));
        parts.push(renderValue(run.checks));
      }
      box.replaceChildren.apply(box, parts);
      panel.setAttribute("data-rendered", "true");
    }).catch(function (e) {
      message(box, e.missing ? "Conformance and PD-health results are not available yet."
                             : "Could not load conformance results (" + e.message + ").");
    });
  }

  function init(root) {
    (root || document).querySelectorAll("[data-latency-panel]").forEach(function (p) { if (window.Chart) setupLatency(p); });
    (root || document).querySelectorAll("[data-usage-panel]").forEach(setupUsage);
    (root || document).querySelectorAll("[data-conformance-panel]").forEach(setupConformance);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", function () { init(); });
  else init();
})();
