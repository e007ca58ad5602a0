// Charts of the insights, the nodes and the job pages, drawn by Chart.js (vendored under
// static/vendor/chartjs, no CDN). The page declares a chart without any inline script
// (the CSP allows none):
//
//   {{ config|json_script:"wait-chart-data" }}
//   <canvas data-chart="wait-chart-data" aria-label="…" role="img"></canvas>
//
// where ``config`` is a whole Chart.js configuration ({type, data, options}). Each canvas
// is drawn once on load and again after an htmx swap brings new ones; a canvas swapped out
// has its chart destroyed. Axis ticks named "percent" or "duration" in the configuration
// ("options.scales.y.ticks.format") are formatted here, as functions cannot travel in JSON.
"use strict";

(function () {
  const charts = new WeakMap();

  function duration(seconds) {
    const s = Number(seconds);
    if (!Number.isFinite(s)) return "";
    if (s < 90) return `${Math.round(s)}s`;
    if (s < 5400) return `${Math.round(s / 60)}m`;
    if (s < 172800) return `${(s / 3600).toFixed(s < 36000 ? 1 : 0)}h`;
    return `${(s / 86400).toFixed(1)}d`;
  }

  const formats = {
    percent: (value) => `${value}%`,
    duration: duration,
  };

  function applyFormats(config) {
    const scales = (config.options && config.options.scales) || {};
    for (const axis of Object.values(scales)) {
      const name = axis.ticks && axis.ticks.format;
      if (name && formats[name]) {
        axis.ticks.callback = formats[name];
        delete axis.ticks.format;
      }
    }
    return config;
  }

  function draw(root) {
    if (typeof window.Chart === "undefined") return;
    for (const canvas of root.querySelectorAll("canvas[data-chart]")) {
      if (charts.has(canvas)) continue;
      const source = document.getElementById(canvas.dataset.chart);
      if (!source) continue;
      const config = applyFormats(JSON.parse(source.textContent));
      config.options = Object.assign({ responsive: true, maintainAspectRatio: false, animation: false }, config.options);
      charts.set(canvas, new window.Chart(canvas, config));
      canvas.dataset.chartDrawn = "1";
    }
  }

  document.addEventListener("DOMContentLoaded", () => draw(document));
  document.addEventListener("htmx:afterSettle", (event) => draw(event.target));
  document.addEventListener("htmx:beforeSwap", (event) => {
    for (const canvas of event.target.querySelectorAll("canvas[data-chart]")) {
      const chart = charts.get(canvas);
      if (chart) chart.destroy();
    }
  });
  window.sluiceDuration = duration;
})();
