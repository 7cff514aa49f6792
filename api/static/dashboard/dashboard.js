/* Live pipeline: renders the overview JSON and refreshes it every few seconds.
   Data goes into the page with textContent only, never innerHTML. */
"use strict";
(function () {
  var body = document.body;
  var refreshMs = Number(body.dataset.refreshMs) || 3000;
  var overviewUrl = body.dataset.overviewUrl;
  var SVG = "http://www.w3.org/2000/svg";
  var refreshes = 0;

  function byId(id) { return document.getElementById(id); }
  function setText(id, value) { var node = byId(id); if (node) { node.textContent = value === null || value === undefined ? "–" : String(value); } }
  function cell(tag, text, cls) {
    var node = document.createElement(tag);
    node.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) { node.className = cls; }
    return node;
  }
  function row(cells) { var tr = document.createElement("tr"); cells.forEach(function (c) { tr.appendChild(c); }); return tr; }
  function fill(id, rows, emptyText, columns) {
    var tbody = byId(id);
    if (!rows.length) { var td = cell("td", emptyText, "muted"); td.colSpan = columns; rows = [row([td])]; }
    tbody.replaceChildren.apply(tbody, rows);
  }
  function secs(value) {
    if (value === null || value === undefined) { return "–"; }
    return value < 1 ? (value * 1000).toFixed(0) + " ms" : value.toFixed(2) + " s";
  }

  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) { node.textContent = text; }
    return node;
  }
  var W = 600, H = 180, L = 36, R = 8, T = 10, B = 22;
  function frame(chart, maxValue, label) {
    var nodes = [svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, "class": "axis" }),
                 svg("line", { x1: L, y1: T, x2: L, y2: H - B, "class": "axis" }),
                 svg("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, label(maxValue)),
                 svg("text", { x: L - 4, y: H - B, "text-anchor": "end" }, label(0)),
                 svg("text", { x: L, y: H - 6 }, "-60 min"),
                 svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, "-30 min"),
                 svg("text", { x: W - R, y: H - 6, "text-anchor": "end" }, "now")];
    return nodes;
  }
  function barChart(id, completed, other) {
    var chart = byId(id), n = completed.length, max = 1;
    for (var i = 0; i < n; i++) { max = Math.max(max, completed[i] + other[i]); }
    var nodes = frame(chart, max, function (v) { return String(v); });
    var step = (W - L - R) / n, scale = (H - B - T) / max;
    for (i = 0; i < n; i++) {
      var x = L + i * step + 1, hc = completed[i] * scale, ho = other[i] * scale;
      if (completed[i]) { nodes.push(svg("rect", { x: x, y: H - B - hc, width: step - 2, height: hc, "class": "bar", "data-minute": i, "data-value": completed[i] })); }
      if (other[i]) { nodes.push(svg("rect", { x: x, y: H - B - hc - ho, width: step - 2, height: ho, "class": "bar bad" })); }
    }
    chart.replaceChildren.apply(chart, nodes);
  }
  function lineChart(id, values) {
    var chart = byId(id), n = values.length;
    var nodes = frame(chart, 1, function (v) { return v.toFixed(1); });
    var step = (W - L - R) / n, scale = H - B - T, points = [];
    function flush() { if (points.length > 1) { nodes.push(svg("polyline", { points: points.join(" "), "class": "line" })); } points = []; }
    for (var i = 0; i < n; i++) {
      if (values[i] === null) { flush(); continue; }
      var x = L + (i + 0.5) * step, y = H - B - Math.max(0, Math.min(1, values[i])) * scale;
      points.push(x.toFixed(1) + "," + y.toFixed(1));
      nodes.push(svg("circle", { cx: x, cy: y, r: 2.5, "class": "dot" }));
    }
    flush();
    chart.replaceChildren.apply(chart, nodes);
  }

  function render(data) {
    var status = data.status;
    var state = byId("state");
    state.textContent = status.state;
    state.className = "badge " + status.state;
    ["init", "run", "eval"].forEach(function (stage) {
      var s = status.stages[stage] || {};
      setText("stage-" + stage + "-queued", s.queued);
      setText("stage-" + stage + "-active", s.active);
      setText("stage-" + stage + "-broker", s.broker_depth);
      var d = data.durations[stage] || {};
      setText("stage-" + stage + "-durations", d.count ? "p50 " + secs(d.p50) + " · p90 " + secs(d.p90) + " · p99 " + secs(d.p99) : "no stage finished yet");
    });
    var jobs = status.jobs, ended = ["completed", "failed", "cancelled", "timeout"];
    setText("ended-completed", jobs.completed);
    setText("ended-failed", jobs.failed);
    setText("ended-other", (jobs.cancelled || 0) + (jobs.timeout || 0));
    fill("jobs-by-status", Object.keys(jobs).map(function (name) {
      var link = document.createElement("a");
      link.href = body.dataset.jobsUrl + "?status=" + encodeURIComponent(name);
      link.textContent = name;
      var name_td = document.createElement("td"); name_td.appendChild(link);
      var count = cell("td", jobs[name], "num"); count.id = "job-count-" + name;
      return row([name_td, count]);
    }), "no jobs", 2);
    var outcomes = status.outcomes || {};
    fill("jobs-by-outcome", Object.keys(outcomes).map(function (name) {
      var count = cell("td", outcomes[name], "num"); count.id = "outcome-count-" + name;
      return row([cell("td", name), count]);
    }), "no jobs ended", 2);
    fill("durations", ["init", "run", "eval"].map(function (stage) {
      var d = data.durations[stage] || {};
      return row([cell("td", stage), cell("td", d.count || 0, "num"), cell("td", secs(d.p50), "num"),
                  cell("td", secs(d.p90), "num"), cell("td", secs(d.p99), "num"), cell("td", secs(d.mean), "num")]);
    }), "", 6);
    setText("generation", status.generation);
    fill("backends", status.backends.map(function (b) {
      return row([cell("td", b.address, "mono"), cell("td", b.protocol), cell("td", b.assigned, "num"), cell("td", b.in_flight, "num")]);
    }), "No LLM backend registered (POST /add_llm_server).", 4);
    fill("nodes", (status.nodes || []).map(function (n) {
      var state = cell("td", n.state); state.className = "node-" + n.state;
      return row([cell("td", n.node, "node-name"), state, cell("td", n.last_seen_s.toFixed(1) + " s ago", "num"),
                  cell("td", n.busy, "num"), cell("td", n.sandboxes, "num")]);
    }), "no node has sent a heartbeat", 5);
    fill("warm-pools", status.workers.filter(function (w) { return w.warm_pool; }).map(function (w) {
      var p = w.warm_pool;
      return row([cell("td", w.name, "mono"), cell("td", p.ready + " / " + p.size, "num"), cell("td", p.hits, "num"),
                  cell("td", p.misses, "num"), cell("td", secs(p.refill_s_p50), "num")]);
    }), "no warm pool (PRORL_WARM_POOL_SIZE)", 5);
    fill("counters", Object.keys(data.counters).map(function (name) {
      return row([cell("td", name.replace(/_/g, " ")), cell("td", data.counters[name], "num")]);
    }), "", 2);
    setText("worker-count", status.workers.length);
    fill("workers", status.workers.map(function (w) {
      return row([cell("td", w.name, "mono"), cell("td", w.node), cell("td", (w.queues || []).join(", ")),
                  cell("td", w.last_seen_s.toFixed(1) + " s ago", "num")]);
    }), "No worker has sent a heartbeat in the last 30 s.", 4);
    var series = data.series;
    barChart("chart-completed", series.completed, series.not_completed);
    lineChart("chart-reward", series.mean_reward);
    var total = series.completed.reduce(function (a, b) { return a + b; }, 0);
    setText("series-note", total + " completed in the last hour (blue), failed/cancelled/timeout in red, per minute " +
            "(the current minute last)");
    var updated = byId("updated");
    updated.textContent = new Date(data.now * 1000).toLocaleTimeString();
    updated.dataset.refreshes = String(refreshes);
  }

  function refresh() {
    fetch(overviewUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (data) { refreshes += 1; byId("refresh-error").hidden = true; render(data); })
      .catch(function (error) { var e = byId("refresh-error"); e.hidden = false; e.textContent = "refresh failed: " + error.message; })
      .finally(function () { window.setTimeout(refresh, refreshMs); });
  }

  render(JSON.parse(byId("initial-data").textContent));
  window.setTimeout(refresh, refreshMs);
})();
