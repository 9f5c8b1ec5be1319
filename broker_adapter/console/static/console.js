// The console's live parts: the #live block of each page is asked for again (?live=1) and the charts'
// series (/api/series) every data-refresh ms. No inline script (the Content-Security-Policy forbids it).
(function () {
  "use strict";
  const live = document.getElementById("live");
  const charts = Array.from(document.querySelectorAll(".chart"));
  const plots = new Map();
  const palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

  function liveUrl() {
    const u = new URL(window.location.href);
    u.searchParams.set("live", "1");
    return u.toString();
  }

  async function refreshLive() {
    if (!live) return;
    try {
      const r = await fetch(liveUrl(), { credentials: "same-origin", cache: "no-store" });
      if (r.status === 401) { window.location.href = "/login"; return; }
      if (r.ok) {
        live.innerHTML = await r.text();
        live.classList.remove("stale");
      } else {
        live.classList.add("stale");  // the console failed this round: what shows is older
      }
    } catch (e) {
      live.classList.add("stale");  // the console is restarting: next round
    }
  }

  function draw(el, data) {
    const names = Object.keys(data.series);
    const key = names.join("\u0000");
    const rows = [data.x].concat(names.map((n) => data.series[n]));
    let p = plots.get(el);
    if (p && p.key !== key) { p.plot.destroy(); p = null; }
    if (!p) {
      el.innerHTML = "";
      const points = el.dataset.kind === "points";
      const opts = {
        width: Math.max(300, el.clientWidth || 800),
        height: 220,
        series: [{}].concat(names.map((n, i) => ({
          label: n,
          stroke: palette[i % palette.length],
          width: points ? 0 : 2,
          points: { show: points || data.x.length < 3, size: points ? 9 : 5, fill: palette[i % palette.length] },
          spanGaps: true,
        }))),
        axes: [{}, { label: el.dataset.unit || "" }],
        scales: { x: { time: true } },
      };
      p = { key: key, plot: new uPlot(opts, rows, el) };
      plots.set(el, p);
    } else {
      p.plot.setData(rows);
    }
    el.dataset.points = String(data.x.length);
  }

  async function refreshCharts() {
    if (!charts.length || typeof uPlot === "undefined") return;
    try {
      const r = await fetch("/api/series", { credentials: "same-origin", cache: "no-store" });
      if (!r.ok) return;
      const all = await r.json();
      for (const el of charts) {
        const data = all[el.dataset.series];
        if (data) draw(el, data);
      }
    } catch (e) { /* next round */ }
  }

  const period = live ? parseInt(live.dataset.refresh || "1000", 10) : 1000;
  refreshCharts();
  if (live || charts.length) {
    window.setInterval(function () { refreshLive(); refreshCharts(); }, Math.max(250, period));
  }
})();
